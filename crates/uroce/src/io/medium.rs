//! The medium interface: what carries a device's RoCE packets to and from
//! its peers. The packets are the same on every medium (headers, PSNs,
//! ACKs, ICRC); only the path changes, so every transport rule applies
//! unchanged. Two media exist: UDP (`io::udp`, reaches every peer) and
//! the same-host memory link ([`super::link`], reaches uroce devices of
//! this user, host and namespace). A third (io_uring sockets, AF_XDP) is a
//! new file that implements [`Medium`]; the runtime drives its media
//! without knowing which it has.
//!
//! A medium has no transport policy: it sends what it is given, hands up
//! what arrives, wakes the sleeping progress thread, and counts per peer.

use crate::proto::Transmit;
use std::any::Any;
use std::net::SocketAddr;
use std::ops::Range;
use std::os::fd::RawFd;
use std::time::Instant;

/// Runs of packets, each a range of a pass's packets for one destination
/// (see `runtime::gso_runs`).
pub type Runs = smallvec::SmallVec<[Range<usize>; 8]>;

/// How a peer's packets travel now.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum LinkMedium {
    /// The same-host shared-memory link (`io::link`).
    Shm,
    /// UDP datagrams.
    Udp,
}

impl LinkMedium {
    /// The name `uroce stat --links` and `stats.json` show: `shm` or `udp`.
    pub fn as_str(self) -> &'static str {
        match self {
            LinkMedium::Shm => "shm",
            LinkMedium::Udp => "udp",
        }
    }
}

impl std::fmt::Display for LinkMedium {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One peer's state and counters on the media that count per peer, as
/// `uroce stat --links` shows them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PeerStats {
    /// The peer's UDP address (its device's).
    pub peer: SocketAddr,
    /// How its packets travel now: by the link while linked, else by UDP.
    pub medium: LinkMedium,
    /// The peer process (while linked).
    pub pid: Option<u32>,
    /// Packets and bytes each way on each medium, by name
    /// (`shm_tx_packets`, `udp_rx_bytes`, …).
    pub counters: Vec<(&'static str, u64)>,
}

/// Packets a medium received in one pass, kept by the runtime (under its
/// receive lock) between passes so that no pass allocates.
pub trait RxBuffer: Send + Any {
    /// Packets in the buffer.
    fn len(&self) -> usize;
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// The `i`-th packet (`i < len()`) with its sender's UDP address.
    fn get(&self, i: usize) -> (SocketAddr, &[u8]);
    fn as_any_mut(&mut self) -> &mut dyn Any;
}

/// A path for RoCE packets (see the module docs). Called from any thread,
/// under the runtime's locks (a shard's send lock for `send`, the receive
/// lock for `recv`): nothing here may wait on a peer.
pub trait Medium: Send + Sync + std::fmt::Debug {
    /// `udp`, `shm`, ...
    fn name(&self) -> &'static str;

    /// Sends the runs of `pkts` that this medium carries now, in order, and
    /// removes them from `runs`; the last medium carries every run left.
    fn send(&self, pkts: &[Transmit], runs: &mut Runs);

    /// A receive buffer for [`Medium::recv`].
    fn rx_buffer(&self) -> Box<dyn RxBuffer>;

    /// Receives what waits (without waiting) into `buf`, which held the
    /// last pass's packets. `others_active`: another medium delivered
    /// lately (one whose reads cost a system call may read less often).
    fn recv(&self, buf: &mut dyn RxBuffer, now: Instant, others_active: bool);

    /// Whether it delivered packets lately (see [`Medium::recv`]).
    fn active(&self, _now: Instant) -> bool {
        false
    }

    /// Whether packets wait in this medium that must not overtake what a
    /// later medium may still hold (the first packets of a new link, behind
    /// the peer's last UDP packets): the later media then read in this pass
    /// whatever `others_active` says, and [`Medium::count_elsewhere`] sees
    /// all they had.
    fn holding(&self) -> bool {
        false
    }

    /// Packets that came by another medium in this pass: (sender, length),
    /// for this medium's per-peer counters (and its [`Medium::holding`]).
    fn count_elsewhere(&self, _pkts: &mut dyn Iterator<Item = (SocketAddr, usize)>) {}

    /// A descriptor that is readable when this medium has something for
    /// a sleeping thread.
    fn poll_fd(&self) -> RawFd;

    /// Before a thread sleeps on [`Medium::poll_fd`] (the progress thread,
    /// or an application thread waiting on a completion channel; both may
    /// at once): returns whether packets already wait (then it must not
    /// sleep). Always paired with [`Medium::woke`].
    fn sleep(&self) -> bool {
        false
    }

    /// After a sleep; `rung`: its [`Medium::poll_fd`] was readable.
    fn woke(&self, _rung: bool) {}

    /// An application thread polls and finds what arrives: no thread need
    /// be woken for it (unless one sleeps on [`Medium::poll_fd`]).
    fn polled(&self) {}

    /// Per-peer state and counters (empty for a medium that keeps none).
    fn peer_stats(&self) -> Vec<PeerStats> {
        Vec::new()
    }

    /// Device-wide counters by name.
    fn counters(&self) -> Vec<(&'static str, u64)> {
        Vec::new()
    }
}
