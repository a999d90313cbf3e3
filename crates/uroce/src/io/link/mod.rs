//! The same-host link: when both ends of a packet's path are uroce devices
//! of this host, network namespace and user, packets travel through a pair
//! of shared-memory rings instead of a UDP socket. The packets are exactly
//! those the engine makes for UDP (headers, PSNs, ACKs, ICRC); only the
//! medium changes, so every transport rule and check applies unchanged.
//!
//! This module owns the per-device link hub ([`Links`]): the advertised
//! Unix socket and the thread that accepts links, makes the links senders
//! ask for, and watches their sockets ([`discovery`]), the table of peers
//! (by UDP address: linked, being linked, or UDP), the rings ([`ring`]),
//! the doorbells and the counters. The runtime drives it as one medium
//! among others (`io::medium`): sending a run of packets for one
//! destination ([`Links::send`]: false means "not mine, send it by UDP"),
//! receiving ([`Links::drain`]) and going to sleep ([`Links::sleep`] /
//! [`Links::woke`], with [`Links::poll_fd`] in the sleep's poll set).
//!
//! Nothing a peer controls can hold a uroce thread: setup runs on the hub
//! thread only, never on the data path (a sender finds a new destination
//! "unknown", asks the hub, and sends by UDP until the link is up), and
//! every step of it is bounded (a connect that would wait is refused, a
//! hello or answer must come within [`SETUP_TIMEOUT`] /
//! [`CONNECT_TIMEOUT`]). A peer's claimed UDP address is proved before a
//! link carries its traffic ([`discovery::owns_udp`]). Doorbells are
//! Unix datagram sockets rung with `MSG_DONTWAIT` (a full queue means "the
//! peer is awake"); no thread writes to a descriptor the peer could make
//! blocking. Links per device are capped (`UROCE_MAX_LINKS`, default
//! [`DEFAULT_MAX_LINKS`], at most [`PER_PEER`] per peer address); the rest
//! are refused and counted ([`LinkTotals`]).
//!
//! Choice per peer (`UROCE_LINK`): `udp` never links; `auto` (the default)
//! links to every peer that advertises itself in this user's runtime
//! directory and answers, and uses UDP for every other (another host,
//! user or namespace, rxe, a raw socket), quietly; `shm` does the same but
//! refuses to start a device whose socket cannot be advertised and says on
//! stderr when linking to an advertising peer fails. A link whose peer
//! closes its socket (exits, is killed) or breaks the ring's rules is
//! dropped at once; its traffic goes back to UDP, where a dead peer's QPs
//! time out as they would have.

pub mod discovery;
mod medium;
pub mod ring;

use crate::lock_order::{Ordered, Rank};
use crate::proto::Transmit;
use discovery::Mapping;
use ring::{Consumer, Geometry, Producer, RingMem};
use rustc_hash::{FxHashMap, FxHashSet};
use smallvec::SmallVec;
use std::io;
use std::net::SocketAddr;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

/// Which medium same-host peers use (`UROCE_LINK`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    Udp,
    Auto,
    Shm,
}

impl Mode {
    /// `UROCE_LINK`: `udp`, `shm` or `auto` (unset or empty: auto).
    pub fn from_env() -> io::Result<Mode> {
        match std::env::var("UROCE_LINK").unwrap_or_default().as_str() {
            "" | "auto" => Ok(Mode::Auto),
            "udp" | "off" => Ok(Mode::Udp),
            "shm" | "on" => Ok(Mode::Shm),
            v => {
                Err(io::Error::new(io::ErrorKind::InvalidInput, format!("UROCE_LINK={v:?}: expected udp, shm or auto")))
            }
        }
    }
}

/// How long a peer found not to advertise (or refusing) stays on UDP
/// before it is looked up again.
const RETRY: Duration = Duration::from_secs(1);
/// Longest an accepted connection may take to send its hello (it waits
/// in the hub's poll set meanwhile, costing nobody a wait).
pub const SETUP_TIMEOUT: Duration = Duration::from_secs(1);
/// Longest the hub waits for a peer's answer when it links (a stopped
/// peer costs the hub, never a sender, this once per RETRY).
pub const CONNECT_TIMEOUT: Duration = Duration::from_millis(200);
/// Accepted connections waiting for their hello at most (beyond: closed,
/// counted as refused).
const MAX_PENDING: usize = 16;
/// Destinations waiting for the hub to link them at most (beyond: UDP
/// until RETRY).
const MAX_WANTED: usize = 64;
/// Links of one device at most, unless `UROCE_MAX_LINKS` says otherwise.
pub const DEFAULT_MAX_LINKS: usize = 64;
/// Links with one peer address at most (two devices that link to each
/// other at once make two).
pub const PER_PEER: usize = 2;
/// Longest a closed link waits to be read out (its consumer may be gone).
const CLOSE_DRAIN: Duration = Duration::from_millis(500);
/// Peers tracked at most (beyond: UDP, uncounted).
const MAX_PEERS: usize = 4096;
/// After packets came by memory, the progress thread looks for more this
/// long before it sleeps ...
const SPIN: Duration = Duration::from_micros(30);
/// ... if they came this recently.
const SPIN_AFTER_RX: Duration = Duration::from_micros(200);
/// Longest a new link's ring with packets waits for the peer's marker
/// (see `Link::mark`): a marker is lost only if its send failed.
const MARK_WAIT: Duration = Duration::from_millis(100);
/// Packets taken out of the rings per receive pass at most.
pub const RX_MAX: usize = 256;
const HELLO: &[u8; 8] = b"UROCELK2";
const OK: &[u8; 8] = b"UROCEOK1";

/// Per-peer traffic counters.
#[derive(Debug, Default)]
struct Counters {
    shm_tx_packets: AtomicU64,
    shm_tx_bytes: AtomicU64,
    shm_rx_packets: AtomicU64,
    shm_rx_bytes: AtomicU64,
    udp_tx_packets: AtomicU64,
    udp_tx_bytes: AtomicU64,
    udp_rx_packets: AtomicU64,
    udp_rx_bytes: AtomicU64,
    /// Packets dropped because the peer's ring was full (a slow or stopped
    /// peer); the transport retransmits them as after a UDP drop.
    ring_full_drops: AtomicU64,
    /// Links made with this peer (a new one after a peer restarted).
    links_made: AtomicU64,
}

fn add(c: &AtomicU64, n: u64) {
    c.fetch_add(n, Ordering::Relaxed);
}

/// One peer's link state and counters, as `uroce stat --links` shows them.
pub type LinkStats = super::medium::PeerStats;
use super::medium::LinkMedium;

/// Device-wide link counters, as `uroce stat --links` shows them.
#[derive(Debug, Default)]
struct TotalCounters {
    refused_cap: AtomicU64,
    refused_claim: AtomicU64,
    refused_bad: AtomicU64,
}

/// A device's links at a glance: how many are up, the cap, and the
/// attempts refused (over the cap, a claimed address not proved, or a
/// malformed, slow or otherwise broken setup).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct LinkTotals {
    pub links: usize,
    pub max_links: usize,
    pub refused_cap: u64,
    pub refused_claim: u64,
    pub refused_bad: u64,
}

/// `UROCE_MAX_LINKS`: a count (0: no links at all); unset or empty:
/// [`DEFAULT_MAX_LINKS`].
pub fn max_links_from_env() -> io::Result<usize> {
    match std::env::var("UROCE_MAX_LINKS").unwrap_or_default().as_str() {
        "" => Ok(DEFAULT_MAX_LINKS),
        v => v.parse().map_err(|_| {
            io::Error::new(io::ErrorKind::InvalidInput, format!("UROCE_MAX_LINKS={v:?}: expected a number of links"))
        }),
    }
}

/// One established link: the mapping of its two rings, this side's ends of
/// them, both doorbells and the socket whose closing says the peer is gone.
struct Link {
    peer: SocketAddr,
    pid: u32,
    sock: OwnedFd,
    tx: Ordered<Mutex<Producer>>,
    rx: Ordered<Mutex<Consumer>>,
    /// The peer's doorbell: rung, never read, never waited on.
    bell: OwnedFd,
    /// Ours (the peer rings it): in the device's poll set while it sleeps.
    my_bell: OwnedFd,
    c: Arc<Counters>,
    /// Broken (the ring was found corrupt); the hub drops it.
    dead: AtomicBool,
    /// The peer closed its end (it exited): nothing more is sent on the
    /// link, and the hub drops it once what the peer wrote before (its last
    /// ACKs, say) has been read.
    closed: AtomicBool,
    closed_since: AtomicInstant,
    /// The ring is not read yet: the peer sent by UDP until the link was up,
    /// and its last UDP packets may still wait in our socket, or on their
    /// way to it. Its first ring packets wait behind them (else they would
    /// overtake them: a UC message lost, an RC sequence NAK, a UD message
    /// out of order) until a receive pass, begun with packets in the ring
    /// and the peer's marker read, reads the socket and finds none of the
    /// peer's (see [`Links::holding`]).
    held: AtomicBool,
    /// While held: the ring had packets, and the marker had come (or was
    /// given up on), when the pass began.
    held_full: AtomicBool,
    /// Our end of the marker path ([`discovery::mark_pair`]). The marker
    /// goes by loopback, as UDP packets do, from the thread that pushes
    /// the first ring packet, just before it: packets queued for the
    /// peer's socket are delivered in the order they were sent from one
    /// CPU, so once the marker is read, the sending thread's last UDP
    /// packets are in the socket even when the kernel deferred their
    /// delivery (to ksoftirqd, on a busy machine) past the send's return.
    mark: OwnedFd,
    /// Our marker was sent (before our first ring packet).
    mark_sent: AtomicBool,
    /// The peer's marker was read.
    mark_seen: AtomicBool,
    /// When a pass first found the held ring with packets (nanoseconds
    /// since the origin of [`AtomicInstant`], plus one; 0: not yet). The
    /// marker is waited for [`MARK_WAIT`] at most from then.
    held_since: AtomicU64,
    /// Last: the rings point into it.
    _map: Mapping,
}

impl Link {
    fn closed_at_least(&self, d: Duration) -> bool {
        self.closed_since.load(Ordering::Relaxed).elapsed() >= d
    }

    /// While held, with packets in the ring: whether the peer's marker
    /// was read (now or before), or waited for [`MARK_WAIT`] in vain (a
    /// send that failed; the peer is only trusted with our ring order).
    fn marked(&self) -> bool {
        if self.mark_seen.load(Ordering::Relaxed) {
            return true;
        }
        if discovery::take_mark(self.mark.as_raw_fd()) {
            self.mark_seen.store(true, Ordering::Relaxed);
            return true;
        }
        let now = Instant::now().saturating_duration_since(AtomicInstant::origin()).as_nanos() as u64 + 1;
        let since = match self.held_since.compare_exchange(0, now, Ordering::Relaxed, Ordering::Relaxed) {
            Ok(_) => now,
            Err(t) => t,
        };
        Duration::from_nanos(now - since) >= MARK_WAIT
    }

    /// Copies the packets into the peer's ring; a packet that finds the
    /// ring full is dropped (counted). Err: the ring is corrupt.
    fn send(&self, pkts: &[Transmit]) -> Result<(), ring::Corrupt> {
        let mut p = self.tx.lock();
        if !self.mark_sent.load(Ordering::Relaxed) {
            discovery::send_mark(self.mark.as_raw_fd());
            self.mark_sent.store(true, Ordering::Relaxed);
        }
        let (mut n, mut bytes, mut dropped) = (0, 0, 0);
        for t in pkts {
            let len = t.len();
            if p.push(len, |dst| write_packet(t, dst))? {
                n += 1;
                bytes += len as u64;
            } else {
                dropped += 1;
            }
        }
        // Counted before the peer can see them: whoever sees an effect of
        // a packet (its ACK, its completion) finds it counted.
        add(&self.c.shm_tx_packets, n);
        add(&self.c.shm_tx_bytes, bytes);
        if dropped > 0 {
            add(&self.c.ring_full_drops, dropped);
        }
        if p.publish() {
            discovery::ring_peer(self.bell.as_raw_fd());
        }
        drop(p);
        Ok(())
    }
}

/// Writes packet `t` (`t.len()` bytes) at `dst`; false if its payload,
/// sent in place from the application's memory, is no longer readable
/// (the packet is dropped, as the kernel refuses to send it over UDP).
fn write_packet(t: &Transmit, dst: *mut u8) -> bool {
    match &t.in_place {
        None => {
            // SAFETY: `dst` has room for t.len() == data.len() bytes.
            unsafe { std::ptr::copy_nonoverlapping(t.data.as_ptr(), dst, t.data.len()) };
            true
        }
        Some(p) => {
            let (at, n) = (p.at(), p.bytes.len());
            // SAFETY: `dst` has room for data.len() + n bytes; the in-place
            // bytes lie in registered memory, read with the fault-tolerant
            // copy (the application may have unmapped them).
            unsafe {
                std::ptr::copy_nonoverlapping(t.data.as_ptr(), dst, at);
                if crate::mem::safe::copy(dst.add(at), p.bytes.addr() as *const u8, n) != 0 {
                    return false;
                }
                std::ptr::copy_nonoverlapping(t.data.as_ptr().add(at), dst.add(at + n), t.data.len() - at);
            }
            true
        }
    }
}

enum State {
    /// Never looked up.
    Unknown,
    /// A sender is setting up a link; UDP meanwhile (other threads).
    Pending,
    /// UDP until then (not advertised, refused, or its link died).
    Udp(Instant),
    Link(Arc<Link>),
}

struct Peer {
    state: Ordered<Mutex<State>>,
    c: Arc<Counters>,
}

struct Inner {
    local: SocketAddr,
    mode: Mode,
    ns: u64,
    dir: crate::runtime::SafeDir,
    name: String,
    listener: OwnedFd,
    /// The runtime's wake eventfd (never given to a peer): wakes our
    /// progress thread to read out a link whose peer went.
    own_wake: OwnedFd,
    /// Every link's own doorbell end, polled as one while the device sleeps.
    epoll: OwnedFd,
    /// Wakes the hub thread (a link wanted or broken, shutdown).
    hub_wake: OwnedFd,
    /// Destinations senders found unlinked, for the hub to link.
    wanted: Mutex<Vec<SocketAddr>>,
    max_links: usize,
    totals: TotalCounters,
    peers: Ordered<RwLock<FxHashMap<SocketAddr, Arc<Peer>>>>,
    links: Ordered<RwLock<Vec<Arc<Link>>>>,
    shutdown: AtomicBool,
    warned: Mutex<FxHashSet<SocketAddr>>,
    /// When a receive pass last found packets in a ring.
    rx_at: AtomicInstant,
    /// The last drain found a held link with packets (see
    /// [`Links::holding`]): kept so that a pass without one costs no lock.
    holding: AtomicBool,
    /// Threads asleep on [`Links::poll_fd`] (between [`Links::sleep`] and
    /// [`Links::woke`]): the progress thread, and an application thread
    /// waiting on a completion channel. A ring's flag is set or cleared
    /// under its lock from this count, so the first to wake never silences
    /// the doorbell for the other.
    sleepers: AtomicUsize,
}

/// An `Instant` in an atomic (nanoseconds since a process-wide origin).
#[derive(Default)]
struct AtomicInstant(AtomicU64);

impl AtomicInstant {
    fn origin() -> Instant {
        static O: std::sync::OnceLock<Instant> = std::sync::OnceLock::new();
        *O.get_or_init(Instant::now)
    }
    fn store(&self, t: Instant, o: Ordering) {
        self.0.store(t.saturating_duration_since(Self::origin()).as_nanos() as u64, o);
    }
    fn load(&self, o: Ordering) -> Instant {
        Self::origin() + Duration::from_nanos(self.0.load(o))
    }
}

/// The link hub of one device (see the module docs). Its thread accepts
/// links and watches their sockets; a sender links to a new destination
/// itself, before its first packet.
pub struct Links {
    inner: Arc<Inner>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl std::fmt::Debug for Links {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Links").field("local", &self.inner.local).field("mode", &self.inner.mode).finish()
    }
}

/// Packets taken out of the rings by one receive pass: their bytes, one
/// after the other, and (sender, offset, length) of each.
#[derive(Debug, Default)]
pub struct RxBuf {
    data: Vec<u8>,
    pkts: Vec<(SocketAddr, usize, usize)>,
}

impl RxBuf {
    pub fn clear(&mut self) {
        self.data.clear();
        self.pkts.clear();
    }

    #[cfg(any(test, feature = "unstable"))]
    pub fn is_empty(&self) -> bool {
        self.pkts.is_empty()
    }

    #[cfg(any(test, feature = "unstable"))]
    pub fn len(&self) -> usize {
        self.pkts.len()
    }

    #[cfg(any(test, feature = "unstable"))]
    /// The packets with their senders' UDP addresses.
    pub fn iter(&self) -> impl Iterator<Item = (SocketAddr, &[u8])> + '_ {
        self.pkts.iter().map(|&(from, off, len)| (from, &self.data[off..off + len]))
    }
}

fn eventfd() -> io::Result<OwnedFd> {
    // SAFETY: eventfd has no memory preconditions.
    let fd = unsafe { libc::eventfd(0, libc::EFD_NONBLOCK | libc::EFD_CLOEXEC) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: a fresh descriptor nothing else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

fn dup(fd: RawFd) -> io::Result<OwnedFd> {
    // SAFETY: fcntl on a descriptor the caller keeps open for the call.
    let d = unsafe { libc::fcntl(fd, libc::F_DUPFD_CLOEXEC, 0) };
    if d < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: a fresh descriptor nothing else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(d) })
}

impl Links {
    /// Advertises the device at `local` and starts its hub, per
    /// `UROCE_LINK`: `Ok(None)` when links are off (or, in `auto`, cannot
    /// be advertised: said at debug level); `Err` only in `shm` mode or
    /// for a bad `UROCE_LINK` or `UROCE_MAX_LINKS`. `wake` is the
    /// runtime's wake eventfd (the hub rings it; peers never see it).
    pub fn start(local: SocketAddr, wake: RawFd) -> io::Result<Option<Links>> {
        let mode = Mode::from_env()?;
        let max_links = max_links_from_env()?;
        if mode == Mode::Udp || local.ip().is_unspecified() {
            return Ok(None);
        }
        match Self::advertise(local, wake, mode, max_links) {
            Ok(l) => Ok(Some(l)),
            Err(e) if mode == Mode::Shm => {
                Err(io::Error::new(e.kind(), format!("UROCE_LINK=shm: cannot advertise the shared-memory link: {e}")))
            }
            Err(e) => {
                tracing::debug!("shared-memory link off for {local}: {e}");
                Ok(None)
            }
        }
    }

    fn advertise(local: SocketAddr, wake: RawFd, mode: Mode, max_links: usize) -> io::Result<Links> {
        let dir = discovery::links_dir().map_err(io::Error::other)?;
        let ns = discovery::netns();
        let name = discovery::socket_name(ns, local);
        let listener = discovery::listen(&dir, &name)?;
        let inner = Arc::new(Inner {
            local,
            mode,
            ns,
            dir,
            name,
            listener,
            own_wake: dup(wake)?,
            epoll: epoll()?,
            hub_wake: eventfd()?,
            wanted: Mutex::default(),
            max_links,
            totals: TotalCounters::default(),
            peers: Ordered::new(Rank::LinkPeers, RwLock::default()),
            links: Ordered::new(Rank::LinkLinks, RwLock::default()),
            shutdown: AtomicBool::new(false),
            warned: Mutex::default(),
            rx_at: AtomicInstant::default(),
            holding: AtomicBool::new(false),
            sleepers: AtomicUsize::new(0),
        });
        let i = inner.clone();
        let thread = std::thread::Builder::new().name("uroce-link".into()).spawn(move || i.hub_loop());
        match thread {
            Ok(t) => Ok(Links { inner, thread: Some(t) }),
            Err(e) => {
                let _ = inner.dir.remove(&inner.name);
                Err(e)
            }
        }
    }

    /// Sends a run of packets that all go to one destination through its
    /// link, if it has one; false: the caller sends them by UDP (counted
    /// here). A destination seen for the first time (or again RETRY after it
    /// was found on UDP) is handed to the hub to link, and goes by UDP
    /// meanwhile: nothing here waits on a peer.
    pub fn send(&self, pkts: &[Transmit]) -> bool {
        let Some(first) = pkts.first() else { return true };
        let dst = first.dst;
        let Some(peer) = self.inner.peer(dst) else { return false };
        let link = {
            let mut st = peer.state.lock();
            match &*st {
                State::Link(l) if !l.dead.load(Ordering::Relaxed) && !l.closed.load(Ordering::Relaxed) => {
                    Some(l.clone())
                }
                State::Udp(_) | State::Unknown if self.inner.due(&st) => {
                    *st = State::Pending;
                    drop(st);
                    self.inner.want(dst);
                    None
                }
                _ => None,
            }
        };
        if let Some(l) = link {
            match l.send(pkts) {
                Ok(()) => return true,
                Err(e) => self.inner.broken(&l, e),
            }
        }
        add(&peer.c.udp_tx_packets, pkts.len() as u64);
        add(&peer.c.udp_tx_bytes, pkts.iter().map(|t| t.len() as u64).sum());
        false
    }

    /// The descriptor that becomes readable when a peer rings this
    /// device's doorbell (for the sleeping progress thread's poll set).
    pub fn poll_fd(&self) -> RawFd {
        self.inner.epoll.as_raw_fd()
    }

    /// The links at a glance (see [`LinkTotals`]).
    pub fn totals(&self) -> LinkTotals {
        let t = &self.inner.totals;
        LinkTotals {
            links: self.inner.links.read().len(),
            max_links: self.inner.max_links,
            refused_cap: t.refused_cap.load(Ordering::Relaxed),
            refused_claim: t.refused_claim.load(Ordering::Relaxed),
            refused_bad: t.refused_bad.load(Ordering::Relaxed),
        }
    }

    /// Takes what the peers' rings hold (at most [`RX_MAX`] packets) into
    /// `buf`, which the caller cleared.
    pub fn drain(&self, buf: &mut RxBuf) {
        let links = self.inner.links.read();
        let mut holding = false;
        for l in links.iter() {
            let room = RX_MAX.saturating_sub(buf.pkts.len());
            if room == 0 {
                break;
            }
            let Some(mut c) = l.rx.try_lock() else { continue };
            if l.held.load(Ordering::Relaxed) {
                // Noted before this pass reads the socket: a UDP packet the
                // peer sent before these is in our socket once the marker
                // it sent after it was read (see `Link::mark`).
                let full = c.pending().map_or(true, |n| n > 0);
                l.held_full.store(full && l.marked(), Ordering::Relaxed);
                holding |= full;
                continue;
            }
            let RxBuf { data, pkts } = buf;
            let mut at = data.len();
            let (peer, mut bytes) = (l.peer, 0u64);
            let r = c.drain(room, data, |len| {
                pkts.push((peer, at, len));
                at += len;
                bytes += len as u64;
            });
            drop(c);
            match r {
                Ok(0) => {}
                Ok(n) => {
                    self.inner.rx_at.store(Instant::now(), Ordering::Relaxed);
                    add(&l.c.shm_rx_packets, n as u64);
                    add(&l.c.shm_rx_bytes, bytes);
                }
                Err(e) => self.inner.broken(l, e),
            }
        }
        self.inner.holding.store(holding, Ordering::Relaxed);
    }

    /// Whether a ring delivered packets lately (within the spin window
    /// after which the progress thread would sleep).
    pub fn active(&self, now: Instant) -> bool {
        now.saturating_duration_since(self.inner.rx_at.load(Ordering::Relaxed)) < SPIN_AFTER_RX
    }

    /// Whether a new link's ring holds packets that wait behind the
    /// peer's UDP packets: this pass must read the socket (not skip it).
    pub fn holding(&self) -> bool {
        self.inner.holding.load(Ordering::Relaxed)
    }

    /// Counts packets received by UDP from known peers, and lets a held
    /// link's ring be read once a pass that began with packets in it and
    /// the peer's marker read (see `Link::mark`) read the socket and found
    /// none of its peer's. (A socket read is at most
    /// one batch: should it be full of other peers' packets with more of
    /// this peer's behind them, those few are overtaken.)
    pub fn count_udp_rx(&self, pkts: impl Iterator<Item = (SocketAddr, usize)>) {
        let holding = self.inner.holding.swap(false, Ordering::Relaxed);
        let peers = self.inner.peers.read();
        let mut senders = SmallVec::<[SocketAddr; 4]>::new();
        for (from, len) in pkts {
            if let Some(p) = peers.get(&from) {
                add(&p.c.udp_rx_packets, 1);
                add(&p.c.udp_rx_bytes, len as u64);
            }
            if holding && !senders.contains(&from) {
                senders.push(from);
            }
        }
        drop(peers);
        if !holding {
            return;
        }
        for l in self.inner.links.read().iter() {
            if l.held.load(Ordering::Relaxed) && l.held_full.load(Ordering::Relaxed) && !senders.contains(&l.peer) {
                l.held.store(false, Ordering::Relaxed);
            }
        }
    }

    /// Before a thread sleeps on [`Links::poll_fd`] (the progress thread,
    /// or an application thread waiting on a completion channel): marks
    /// this side asleep in every ring (producers then ring the doorbell);
    /// returns whether packets already wait (then it must not sleep).
    /// Always paired with [`Links::woke`].
    pub fn sleep(&self) -> bool {
        self.inner.sleepers.fetch_add(1, Ordering::SeqCst);
        let links = self.inner.links.read();
        if links.is_empty() {
            return false;
        }
        let mut waiting = false;
        if self.inner.rx_at.load(Ordering::Relaxed).elapsed() < SPIN_AFTER_RX {
            // Packets came by memory just now: more are likely within
            // microseconds. Looking for them costs no system call, where
            // sleeping costs the peer a doorbell and us a wake-up each.
            let t = Instant::now();
            while t.elapsed() < SPIN && !waiting {
                waiting = links.iter().any(|l| l.rx.lock().pending().map_or(true, |n| n > 0));
                std::hint::spin_loop();
            }
        }
        for l in links.iter() {
            waiting |= l.rx.lock().sleep();
        }
        waiting
    }

    /// After the sleep: producers stop ringing once no thread sleeps;
    /// `rung`: the doorbells (see [`Links::poll_fd`]) woke us, and are
    /// emptied.
    pub fn woke(&self, rung: bool) {
        self.inner.sleepers.fetch_sub(1, Ordering::SeqCst);
        for l in self.inner.links.read().iter() {
            self.awake_if_nobody_sleeps(l);
            if rung {
                discovery::drain_doorbell(l.my_bell.as_raw_fd());
            }
        }
    }

    /// An application thread polls (it finds the packets): producers stop
    /// ringing, unless a thread sleeps on the doorbells.
    pub fn polled(&self) {
        for l in self.inner.links.read().iter() {
            self.awake_if_nobody_sleeps(l);
        }
    }

    /// Clears `l`'s sleeping flag unless a thread sleeps: decided under the
    /// ring's lock, under which [`Links::sleep`] sets it after counting
    /// itself in.
    fn awake_if_nobody_sleeps(&self, l: &Link) {
        let rx = l.rx.lock();
        if self.inner.sleepers.load(Ordering::SeqCst) == 0 {
            rx.wake();
        }
    }

    /// Per peer: medium, process and counters.
    pub fn stats(&self) -> Vec<LinkStats> {
        // Live links per peer first (the links lock is never held while a
        // peer's state is taken).
        let mut live: FxHashMap<SocketAddr, u64> = FxHashMap::default();
        for l in self.inner.links.read().iter().filter(|l| !l.closed.load(Ordering::Relaxed)) {
            *live.entry(l.peer).or_default() += 1;
        }
        let peers = self.inner.peers.read();
        let mut v: Vec<LinkStats> = peers
            .iter()
            .map(|(a, p)| {
                let (medium, pid) = match &*p.state.lock() {
                    State::Link(l) => (LinkMedium::Shm, Some(l.pid)),
                    _ => (LinkMedium::Udp, None),
                };
                let c = &p.c;
                let f = |x: &AtomicU64| x.load(Ordering::Relaxed);
                LinkStats {
                    peer: *a,
                    medium,
                    pid,
                    counters: vec![
                        ("shm_tx_packets", f(&c.shm_tx_packets)),
                        ("shm_tx_bytes", f(&c.shm_tx_bytes)),
                        ("shm_rx_packets", f(&c.shm_rx_packets)),
                        ("shm_rx_bytes", f(&c.shm_rx_bytes)),
                        ("udp_tx_packets", f(&c.udp_tx_packets)),
                        ("udp_tx_bytes", f(&c.udp_tx_bytes)),
                        ("udp_rx_packets", f(&c.udp_rx_packets)),
                        ("udp_rx_bytes", f(&c.udp_rx_bytes)),
                        ("ring_full_drops", f(&c.ring_full_drops)),
                        ("links_made", f(&c.links_made)),
                        ("links", live.get(a).copied().unwrap_or(0)),
                    ],
                }
            })
            .collect();
        v.sort_by_key(|s| s.peer);
        v
    }
}

impl Drop for Links {
    fn drop(&mut self) {
        self.inner.shutdown.store(true, Ordering::SeqCst);
        discovery::ring(self.inner.hub_wake.as_raw_fd());
        if let Some(t) = self.thread.take() {
            if t.thread().id() != std::thread::current().id() {
                let _ = t.join();
            }
        }
    }
}

impl Inner {
    /// The peer entry for `dst`, created if absent (`None` past
    /// [`MAX_PEERS`]).
    fn peer(&self, dst: SocketAddr) -> Option<Arc<Peer>> {
        if let Some(p) = self.peers.read().get(&dst) {
            return Some(p.clone());
        }
        let mut peers = self.peers.write();
        if peers.len() >= MAX_PEERS && !peers.contains_key(&dst) {
            return None;
        }
        Some(
            peers
                .entry(dst)
                .or_insert_with(|| Arc::new(Peer { state: Ordered::new(Rank::LinkPeerState, Mutex::new(State::Unknown)), c: Arc::default() }))
                .clone(),
        )
    }

    /// Whether a peer in state `st` is to be (looked up and) linked now.
    fn due(&self, st: &State) -> bool {
        match st {
            State::Unknown => true,
            State::Udp(at) => Instant::now() >= *at,
            _ => false,
        }
    }

    /// Asks the hub to link `dst` (whose state the caller set Pending).
    fn want(&self, dst: SocketAddr) {
        let mut w = self.wanted.lock().unwrap();
        if w.len() < MAX_WANTED {
            w.push(dst);
            drop(w);
            discovery::ring(self.hub_wake.as_raw_fd());
        } else {
            drop(w);
            self.to_udp_unless_linked(dst);
        }
    }

    /// A ring broke its rules: the link goes (by the hub), UDP meanwhile.
    fn broken(&self, l: &Arc<Link>, e: ring::Corrupt) {
        if !l.dead.swap(true, Ordering::Relaxed) {
            tracing::warn!(peer = %l.peer, pid = l.pid, "dropping the shared-memory link: {e}");
            discovery::ring(self.hub_wake.as_raw_fd());
        }
    }

    /// A setup for `dst` came to nothing: UDP until RETRY, unless a link
    /// with it came up meanwhile (the peer linked to us).
    fn to_udp_unless_linked(&self, dst: SocketAddr) {
        if let Some(p) = self.peer(dst) {
            let mut st = p.state.lock();
            let live = |x: &Link| !x.dead.load(Ordering::Relaxed) && !x.closed.load(Ordering::Relaxed);
            if !matches!(&*st, State::Link(x) if live(x)) {
                *st = State::Udp(Instant::now() + RETRY);
            }
        }
    }

    /// Says once per peer why it is not linked: on stderr when links are
    /// forced on, else at debug level.
    fn not_linked(&self, dst: SocketAddr, why: &str) {
        self.to_udp_unless_linked(dst);
        if self.mode == Mode::Shm && self.warned.lock().unwrap().insert(dst) {
            eprintln!("uroce: UROCE_LINK=shm: no shared-memory link from {} to {dst} (using UDP): {why}", self.local);
        }
        tracing::debug!(peer = %dst, "no shared-memory link: {why}");
    }

    /// Counts a refused setup by its cause.
    fn refused(&self, e: &io::Error) {
        let t = &self.totals;
        let c = match e.kind() {
            io::ErrorKind::PermissionDenied => &t.refused_claim,
            io::ErrorKind::QuotaExceeded => &t.refused_cap,
            _ => &t.refused_bad,
        };
        add(c, 1);
    }

    /// Removes the socket files of this namespace's devices that nobody
    /// listens on any more (left by processes that were killed), at most
    /// [`MAX_PEERS`] looked at; a live one is only connected to and closed
    /// (its hub takes that as a probe, not a refusal).
    fn sweep(&self) {
        let prefix = format!("{}-", self.ns);
        for name in self.dir.entries().into_iter().filter(|n| n.starts_with(&prefix) && *n != self.name).take(MAX_PEERS)
        {
            if discovery::is_stale(&self.dir, &name) {
                tracing::debug!("removing the stale link socket {name}");
                let _ = self.dir.remove(&name);
            }
        }
    }

    fn hub_loop(self: Arc<Self>) {
        self.sweep();
        // Accepted connections whose hello has not come yet.
        let mut pending: Vec<(OwnedFd, Instant)> = Vec::new();
        while !self.shutdown.load(Ordering::SeqCst) {
            let links: Vec<Arc<Link>> = self.links.read().clone();
            let (open, closing): (Vec<&Arc<Link>>, Vec<&Arc<Link>>) =
                links.iter().partition(|l| !l.closed.load(Ordering::Relaxed));
            let np = pending.len();
            let mut fds: Vec<libc::pollfd> = [self.hub_wake.as_raw_fd(), self.listener.as_raw_fd()]
                .into_iter()
                .chain(pending.iter().map(|(s, _)| s.as_raw_fd()))
                .chain(open.iter().map(|l| l.sock.as_raw_fd()))
                .map(|fd| libc::pollfd { fd, events: libc::POLLIN, revents: 0 })
                .collect();
            // Closed links are looked at again soon (dropped once read
            // out), and so are hellos that are late; otherwise the hub
            // sleeps until something happens (a link asked for or broken,
            // shutdown: each rings `hub_wake`; a hello; a peer gone).
            let wait = if closing.is_empty() && pending.is_empty() { -1 } else { 5 };
            // SAFETY: `fds` is a valid array of its length.
            unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, wait) };
            if self.shutdown.load(Ordering::SeqCst) {
                break;
            }
            if fds[0].revents != 0 {
                let mut v = 0u64;
                // SAFETY: reads 8 bytes into a valid u64 from our eventfd.
                unsafe { libc::read(self.hub_wake.as_raw_fd(), (&mut v as *mut u64).cast(), 8) };
            }
            // Links senders asked for (each step bounded: CONNECT_TIMEOUT).
            let wanted = std::mem::take(&mut *self.wanted.lock().unwrap());
            for dst in wanted {
                if self.shutdown.load(Ordering::SeqCst) {
                    break;
                }
                self.connect_to(dst);
            }
            // Hellos that came, or are too late.
            let mut keep = Vec::with_capacity(np);
            for ((s, since), p) in pending.drain(..).zip(&fds[2..2 + np]) {
                if p.revents != 0 {
                    self.accept_from(s);
                } else if since.elapsed() < SETUP_TIMEOUT {
                    keep.push((s, since));
                } else {
                    add(&self.totals.refused_bad, 1);
                    tracing::debug!("refused a shared-memory link: no hello within {SETUP_TIMEOUT:?}");
                }
            }
            pending = keep;
            if fds[1].revents != 0 {
                for _ in 0..64 {
                    match discovery::accept(&self.listener) {
                        Ok(Some(s)) if pending.len() < MAX_PENDING && !self.full() => pending.push((s, Instant::now())),
                        Ok(Some(_)) => add(&self.totals.refused_cap, 1),
                        Ok(None) => break,
                        Err(e) => {
                            tracing::debug!("link accept: {e}");
                            break;
                        }
                    }
                }
            }
            for (l, p) in open.iter().zip(&fds[2 + np..]) {
                if l.dead.load(Ordering::Relaxed) {
                    self.remove(l);
                } else if p.revents != 0 && peer_gone(&l.sock) {
                    self.close(l);
                }
            }
            for l in closing {
                let unread = l.rx.lock().pending().unwrap_or(0);
                if l.dead.load(Ordering::Relaxed) || unread == 0 || l.closed_at_least(CLOSE_DRAIN) {
                    self.remove(l);
                }
            }
        }
        // Unlinked first: no new peer finds a socket nobody accepts on.
        let _ = self.dir.remove(&self.name);
        self.links.write().clear();
        for p in self.peers.read().values() {
            *p.state.lock() = State::Udp(Instant::now() + RETRY);
        }
    }

    /// Whether the device has as many links as it may.
    fn full(&self) -> bool {
        self.links.read().len() >= self.max_links
    }

    /// The peer is gone: nothing more goes on the link; our progress
    /// thread is woken to read what the peer wrote before it went.
    fn close(&self, l: &Arc<Link>) {
        l.closed_since.store(Instant::now(), Ordering::Relaxed);
        l.closed.store(true, Ordering::Relaxed);
        self.to_udp(l);
        discovery::ring(self.own_wake.as_raw_fd());
    }

    /// Its peer's traffic goes by UDP from now on (if `l` carried it).
    fn to_udp(&self, l: &Arc<Link>) {
        if let Some(p) = self.peers.read().get(&l.peer) {
            let mut st = p.state.lock();
            if matches!(&*st, State::Link(x) if Arc::ptr_eq(x, l)) {
                *st = State::Udp(Instant::now() + RETRY);
            }
        }
    }

    /// Drops a link: its traffic goes by UDP from now on; the rings are
    /// unmapped when the last pass using them ends.
    fn remove(&self, l: &Arc<Link>) {
        self.links.write().retain(|x| !Arc::ptr_eq(x, l));
        epoll_ctl(&self.epoll, libc::EPOLL_CTL_DEL, &l.my_bell);
        self.to_udp(l);
        tracing::info!(peer = %l.peer, pid = l.pid, "shared-memory link closed");
    }

    /// Refuses (`QuotaExceeded`) a link beyond the device's cap or
    /// [`PER_PEER`] for its address.
    fn check_room(&self, links: &[Arc<Link>], peer: SocketAddr) -> io::Result<()> {
        let same = links.iter().filter(|x| x.peer == peer && !x.closed.load(Ordering::Relaxed)).count();
        if links.len() >= self.max_links || same >= PER_PEER {
            return Err(io::Error::new(
                io::ErrorKind::QuotaExceeded,
                format!("{} links (at most {}), {same} with {peer} (at most {PER_PEER})", links.len(), self.max_links),
            ));
        }
        Ok(())
    }

    /// Adds a link, if there is room (see [`Inner::check_room`]): its ring
    /// is drained from now on, and it carries what we send to its peer
    /// unless another live link already does (two devices that link to
    /// each other at once get two links; switching rings mid-stream would
    /// reorder packets).
    fn register(&self, l: Arc<Link>) -> io::Result<()> {
        {
            let mut links = self.links.write();
            self.check_room(&links, l.peer)?;
            links.push(l.clone());
        }
        epoll_ctl(&self.epoll, libc::EPOLL_CTL_ADD, &l.my_bell);
        add(&l.c.links_made, 1);
        tracing::info!(peer = %l.peer, pid = l.pid, "shared-memory link up");
        if let Some(p) = self.peer(l.peer) {
            let mut st = p.state.lock();
            let live = |x: &Link| !x.dead.load(Ordering::Relaxed) && !x.closed.load(Ordering::Relaxed);
            if !matches!(&*st, State::Link(x) if live(x)) {
                *st = State::Link(l);
            }
        }
        Ok(())
    }

    /// On the hub thread: links to `dst` if it is a uroce device of this
    /// user, host and namespace that proves it owns `dst`; else (and on
    /// any failure) UDP until RETRY. Never waits longer than
    /// CONNECT_TIMEOUT.
    fn connect_to(&self, dst: SocketAddr) {
        let name = discovery::socket_name(self.ns, dst);
        if dst == self.local || !self.dir.contains(&name) {
            // Not a uroce device of this user, host and namespace.
            self.to_udp_unless_linked(dst);
            return;
        }
        let room = self.check_room(&self.links.read(), dst);
        let r = room
            .and_then(|()| discovery::connect(&self.dir, &name, CONNECT_TIMEOUT))
            .and_then(|s| self.handshake_connect(s, dst))
            .and_then(|l| self.register(l));
        if let Err(e) = r {
            // A socket file left by a device that is gone, one whose backlog
            // is full (stopped, or never accepting), a refusal, a claim
            // that does not hold, or no room.
            let routine = [io::ErrorKind::ConnectionRefused, io::ErrorKind::NotFound, io::ErrorKind::Interrupted];
            if !routine.contains(&e.kind()) {
                self.refused(&e);
            }
            self.not_linked(dst, &e.to_string());
        }
    }

    fn check_cred(&self, s: &OwnedFd) -> io::Result<u32> {
        let (pid, uid) = discovery::peer_cred(s)?;
        let me = crate::runtime::dir::euid();
        if uid != me {
            return Err(io::Error::new(
                io::ErrorKind::PermissionDenied,
                format!("peer process {pid} runs as uid {uid}, not {me}"),
            ));
        }
        Ok(pid)
    }

    fn counters_for(&self, dst: SocketAddr) -> io::Result<Arc<Counters>> {
        self.peer(dst).map(|p| p.c.clone()).ok_or_else(|| io::Error::other("too many peers"))
    }

    /// The connecting side: checks that the process listening owns `dst`,
    /// makes the rings and sends them with its doorbell; the ring `0` is
    /// ours to write.
    fn handshake_connect(&self, s: OwnedFd, dst: SocketAddr) -> io::Result<Arc<Link>> {
        let pid = self.check_cred(&s)?;
        discovery::owns_udp(pid, dst)?;
        let geo = Geometry::LINK;
        let size = 2 * geo.bytes();
        let mfd = discovery::sealed_memfd(size)?;
        let map = Mapping::new(&mfd, size)?;
        let (r0, r1) = rings(&map, geo)?;
        r0.init();
        r1.init();
        let (my_bell, their_bell) = discovery::doorbell_pair()?;
        let (my_mark, their_mark) = discovery::mark_pair(self.local.ip())?;
        send_hello(&s, HELLO, self.local, &[mfd.as_raw_fd(), their_bell.as_raw_fd(), their_mark.as_raw_fd()])?;
        drop((their_bell, their_mark));
        self.await_answer(&s, dst)?;
        let mut buf = [0u8; 64];
        let (n, mut fds) = discovery::recv_with_fds(&s, &mut buf)?;
        if n < OK.len() || buf[..OK.len()] != OK[..] || fds.len() != 1 || !discovery::is_doorbell(&fds[0]) {
            return Err(io::Error::new(io::ErrorKind::InvalidData, "the peer refused or sent a bad answer"));
        }
        discovery::set_nonblocking(&s)?;
        Ok(Arc::new(Link {
            peer: dst,
            pid,
            sock: s,
            tx: Ordered::new(Rank::LinkRing, Mutex::new(Producer::new(r0))),
            rx: Ordered::new(Rank::LinkRing, Mutex::new(Consumer::new(r1))),
            bell: fds.remove(0),
            my_bell,
            c: self.counters_for(dst)?,
            dead: AtomicBool::new(false),
            closed: AtomicBool::new(false),
            closed_since: AtomicInstant::default(),
            held: AtomicBool::new(true),
            held_full: AtomicBool::new(false),
            mark: my_mark,
            mark_sent: AtomicBool::new(false),
            mark_seen: AtomicBool::new(false),
            held_since: AtomicU64::new(0),
            _map: map,
        }))
    }

    /// Waits (at most CONNECT_TIMEOUT) for the answer on `s`. Both ends of
    /// a pair may link at once, each hub then waiting for the other's
    /// answer while the other's hello waits in its own backlog: the end
    /// with the higher address gives its attempt up as soon as a
    /// connection waits to be accepted, and takes the other's (`Interrupted`;
    /// the hub accepts it next).
    fn await_answer(&self, s: &OwnedFd, dst: SocketAddr) -> io::Result<()> {
        let deadline = Instant::now() + CONNECT_TIMEOUT;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(io::Error::new(io::ErrorKind::TimedOut, "no answer to the hello"));
            }
            let mut fds = [
                libc::pollfd { fd: s.as_raw_fd(), events: libc::POLLIN, revents: 0 },
                libc::pollfd { fd: self.listener.as_raw_fd(), events: libc::POLLIN, revents: 0 },
            ];
            let n = if self.local > dst { 2 } else { 1 };
            let ms = left.as_millis().clamp(1, i32::MAX as u128) as libc::c_int;
            // SAFETY: `fds` holds at least `n` valid pollfd.
            let r = unsafe { libc::poll(fds.as_mut_ptr(), n as libc::nfds_t, ms) };
            if r < 0 && io::Error::last_os_error().kind() != io::ErrorKind::Interrupted {
                return Err(io::Error::last_os_error());
            }
            if fds[0].revents != 0 {
                return Ok(());
            }
            if fds[1].revents != 0 {
                return Err(io::Error::new(
                    io::ErrorKind::Interrupted,
                    "both ends linking at once: taking the other's",
                ));
            }
        }
    }

    /// A hello came on an accepted connection (or it closed).
    fn accept_from(&self, s: OwnedFd) {
        let r = self.handshake_accept(s).and_then(|l| self.register(l));
        if let Err(e) = r {
            if e.kind() == io::ErrorKind::UnexpectedEof {
                return; // a probe (another device's sweep) or a peer gone at once
            }
            self.refused(&e);
            tracing::debug!("refused a shared-memory link: {e}");
        }
    }

    /// The accepting side: checks what came (the claimed address first:
    /// the peer must own it) and answers with its doorbell; the ring `1`
    /// is ours to write. The socket does not block: the hello is there.
    fn handshake_accept(&self, s: OwnedFd) -> io::Result<Arc<Link>> {
        let bad = |why: &str| io::Error::new(io::ErrorKind::InvalidData, why.to_string());
        let pid = self.check_cred(&s)?;
        let mut buf = [0u8; 96];
        let (n, mut fds) = discovery::recv_with_fds(&s, &mut buf)?;
        if n == 0 && fds.is_empty() {
            return Err(io::Error::new(io::ErrorKind::UnexpectedEof, "closed without a hello"));
        }
        let from = parse_hello(&buf[..n]).ok_or_else(|| bad("bad hello"))?;
        if fds.len() != 3 || from == self.local {
            return Err(bad("bad hello"));
        }
        // The device-wide cap first (cheap), then the claim's proof, then
        // the cap per peer: a false claim of an address that already has
        // its links is refused (and counted) as a false claim.
        if self.full() {
            return Err(io::Error::new(io::ErrorKind::QuotaExceeded, format!("{} links at most", self.max_links)));
        }
        discovery::owns_udp(pid, from)?;
        let room = self.check_room(&self.links.read(), from);
        room?;
        let geo = Geometry::LINK;
        let size = 2 * geo.bytes();
        discovery::check_memfd(&fds[0], size).map_err(bad)?;
        if !discovery::is_doorbell(&fds[1]) {
            return Err(bad("the doorbell is not a Unix datagram socket"));
        }
        if !discovery::is_mark(&fds[2], from.ip()) {
            return Err(bad("the marker end is not a UDP socket on the peer's address"));
        }
        let map = Mapping::new(&fds[0], size)?;
        let (r0, r1) = rings(&map, geo)?;
        if !r0.has_magic() || !r1.has_magic() {
            return Err(bad("rings not initialised"));
        }
        let (my_bell, their_bell) = discovery::doorbell_pair()?;
        send_hello(&s, OK, self.local, &[their_bell.as_raw_fd()])?;
        Ok(Arc::new(Link {
            peer: from,
            pid,
            sock: s,
            tx: Ordered::new(Rank::LinkRing, Mutex::new(Producer::new(r1))),
            rx: Ordered::new(Rank::LinkRing, Mutex::new(Consumer::new(r0))),
            mark: fds.remove(2),
            bell: fds.remove(1),
            my_bell,
            c: self.counters_for(from)?,
            dead: AtomicBool::new(false),
            closed: AtomicBool::new(false),
            closed_since: AtomicInstant::default(),
            held: AtomicBool::new(true),
            held_full: AtomicBool::new(false),
            mark_sent: AtomicBool::new(false),
            mark_seen: AtomicBool::new(false),
            held_since: AtomicU64::new(0),
            _map: map,
        }))
    }
}

fn epoll() -> io::Result<OwnedFd> {
    // SAFETY: plain epoll_create1.
    let fd = unsafe { libc::epoll_create1(libc::EPOLL_CLOEXEC) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: a fresh descriptor nothing else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// Adds `fd` to (or deletes it from) the doorbells' epoll set; a failure
/// only costs wake-ups (the progress thread also wakes on its timers).
fn epoll_ctl(ep: &OwnedFd, op: libc::c_int, fd: &OwnedFd) {
    let mut ev = libc::epoll_event { events: libc::EPOLLIN as u32, u64: 0 };
    // SAFETY: both descriptors are open; `ev` is a valid epoll_event.
    unsafe { libc::epoll_ctl(ep.as_raw_fd(), op, fd.as_raw_fd(), &mut ev) };
}

/// The two rings of a link's mapping.
fn rings(map: &Mapping, geo: Geometry) -> io::Result<(RingMem, RingMem)> {
    if map.size() < 2 * geo.bytes() {
        return Err(io::Error::other("mapping too small"));
    }
    // SAFETY: the mapping holds both rings (checked above), page-aligned,
    // and outlives them (the Link drops the mapping last).
    let r = unsafe { (RingMem::new(map.base(), geo), RingMem::new(map.base().add(geo.bytes()), geo)) };
    match r {
        (Some(a), Some(b)) => Ok((a, b)),
        _ => Err(io::Error::other("bad ring geometry")),
    }
}

/// `magic`, the geometry, and our UDP address (as text).
fn send_hello(s: &OwnedFd, magic: &[u8; 8], local: SocketAddr, fds: &[RawFd]) -> io::Result<()> {
    let geo = Geometry::LINK;
    let addr = local.to_string();
    let mut m = Vec::with_capacity(80);
    m.extend_from_slice(magic);
    m.extend_from_slice(&(geo.nslots as u32).to_le_bytes());
    m.extend_from_slice(&(geo.slot as u32).to_le_bytes());
    m.push(addr.len() as u8);
    m.extend_from_slice(addr.as_bytes());
    discovery::send_with_fds(s, &m, fds)
}

/// The sender's UDP address from a hello of the expected geometry.
fn parse_hello(m: &[u8]) -> Option<SocketAddr> {
    let geo = Geometry::LINK;
    if m.len() < 17 || m[..8] != HELLO[..] {
        return None;
    }
    let nslots = u32::from_le_bytes(m[8..12].try_into().ok()?) as usize;
    let slot = u32::from_le_bytes(m[12..16].try_into().ok()?) as usize;
    let len = m[16] as usize;
    if nslots != geo.nslots || slot != geo.slot || m.len() != 17 + len {
        return None;
    }
    std::str::from_utf8(&m[17..]).ok()?.parse().ok()
}

/// Whether the peer closed its end (it exited or was killed).
fn peer_gone(s: &OwnedFd) -> bool {
    let mut b = [0u8; 16];
    // SAFETY: reads into a valid buffer; the socket is non-blocking.
    let n = unsafe { libc::recv(s.as_raw_fd(), b.as_mut_ptr().cast(), b.len(), libc::MSG_DONTWAIT) };
    n == 0 || (n < 0 && io::Error::last_os_error().raw_os_error() != Some(libc::EAGAIN))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hello_round_trip_and_refusals() {
        let a: SocketAddr = "127.0.0.7:4791".parse().unwrap();
        let mut m = Vec::new();
        m.extend_from_slice(HELLO);
        m.extend_from_slice(&(Geometry::LINK.nslots as u32).to_le_bytes());
        m.extend_from_slice(&(Geometry::LINK.slot as u32).to_le_bytes());
        let s = a.to_string();
        m.push(s.len() as u8);
        m.extend_from_slice(s.as_bytes());
        assert_eq!(parse_hello(&m), Some(a));
        assert_eq!(parse_hello(&m[..m.len() - 1]), None, "truncated");
        let mut bad = m.clone();
        bad[8] ^= 1;
        assert_eq!(parse_hello(&bad), None, "another geometry");
        assert_eq!(parse_hello(&m[..10]), None);
    }

    /// Two hubs of this process, `a` linked to `b`, and the UDP sockets
    /// that prove their addresses (ports the kernel picks: no other test
    /// or process can hold them).
    fn linked_pair() -> (Links, Links, [std::net::UdpSocket; 2], [OwnedFd; 2]) {
        let bind = || std::net::UdpSocket::bind(SocketAddr::from(([127, 0, 0, 1], 0))).unwrap();
        let udp = [bind(), bind()];
        let (pa, pb) = (udp[0].local_addr().unwrap(), udp[1].local_addr().unwrap());
        let wake = [eventfd().unwrap(), eventfd().unwrap()];
        let a = Links::advertise(pa, wake[0].as_raw_fd(), Mode::Shm, 4).unwrap();
        let b = Links::advertise(pb, wake[1].as_raw_fd(), Mode::Shm, 4).unwrap();
        let t = Instant::now();
        while b.inner.links.read().is_empty() || a.inner.links.read().is_empty() {
            a.send(&[]);
            let _ = a.inner.peer(pb).map(|p| {
                if a.inner.due(&p.state.lock()) {
                    *p.state.lock() = State::Pending;
                    a.inner.want(pb);
                }
            });
            assert!(t.elapsed() < Duration::from_secs(30), "no link");
            std::thread::sleep(Duration::from_millis(1));
        }
        (a, b, udp, wake)
    }

    fn one_packet(dst: SocketAddr) -> Transmit {
        Transmit { dst, data: vec![7u8; 40], in_place: None }
    }

    /// What a receive pass of `b` delivers from the ring, given what its
    /// UDP read found (senders); asserts that the ring, if it delivers
    /// nothing, has the pass read the socket.
    fn pass(b: &Links, udp_from: &[SocketAddr]) -> usize {
        let mut buf = RxBuf::default();
        b.drain(&mut buf);
        assert!(!buf.is_empty() || b.holding(), "a held ring makes the pass read the socket");
        b.count_udp_rx(udp_from.iter().map(|&f| (f, 40)));
        buf.len()
    }

    /// Whether `fd` becomes readable within `limit`.
    fn readable(fd: RawFd, limit: Duration) -> bool {
        let mut p = libc::pollfd { fd, events: libc::POLLIN, revents: 0 };
        // SAFETY: one valid pollfd.
        unsafe { libc::poll(&mut p, 1, limit.as_millis() as i32) == 1 }
    }

    /// The progress thread and an application thread waiting on a
    /// completion channel may sleep on the doorbells at once: the first to
    /// wake must not silence them for the other (it did: the waiter then
    /// slept through the peer's packets until a timer).
    #[test]
    fn the_doorbell_rings_while_any_thread_sleeps() {
        let (a, b, _udp, _wake) = linked_pair();
        let pb = b.inner.local;
        assert!(!b.sleep(), "nothing sent yet");
        b.woke(true);
        assert!(!b.sleep() && !b.sleep(), "two threads go to sleep");
        b.woke(false);
        assert!(a.send(&[one_packet(pb)]));
        assert!(readable(b.poll_fd(), Duration::from_secs(10)), "one still sleeps: rung");
        b.woke(true);
        assert!(!readable(b.poll_fd(), Duration::ZERO), "the doorbell was emptied");
        b.polled();
        assert!(a.send(&[one_packet(pb)]));
        assert!(!readable(b.poll_fd(), Duration::from_millis(50)), "nobody sleeps: not rung");
        assert!(b.sleep(), "two packets wait");
        b.woke(false);
    }

    #[test]
    fn a_new_ring_waits_for_the_marker_then_for_a_socket_read_without_the_peers_packets() {
        let (a, b, _udp, _wake) = linked_pair();
        let (pa, pb) = (a.inner.local, b.inner.local);
        assert!(a.send(&[one_packet(pb)]), "linked: the ring carries it");
        // The marker went before the ring packet; take it out of b's end
        // as if the kernel had not delivered it yet.
        let bl = b.inner.links.read()[0].clone();
        let t = Instant::now();
        while !discovery::take_mark(bl.mark.as_raw_fd()) {
            assert!(t.elapsed() < Duration::from_secs(10), "no marker");
        }
        // No marker: held, though the socket read found none of a's packets.
        for _ in 0..3 {
            assert_eq!(pass(&b, &[]), 0);
        }
        // The marker comes with a's last UDP packets ahead of it.
        discovery::send_mark(a.inner.links.read()[0].mark.as_raw_fd());
        let t = Instant::now();
        while !bl.mark_seen.load(Ordering::Relaxed) {
            assert_eq!(pass(&b, &[pa]), 0, "a's UDP packets came in this pass: still held");
            assert!(t.elapsed() < Duration::from_secs(10), "marker not read");
        }
        assert_eq!(pass(&b, &[pa, SocketAddr::from(([127, 0, 0, 9], 1))]), 0, "still a's packets: held");
        assert_eq!(pass(&b, &[SocketAddr::from(([127, 0, 0, 9], 1))]), 0, "none of a's: released after this pass");
        let mut buf = RxBuf::default();
        b.drain(&mut buf);
        assert_eq!(buf.len(), 1, "then the ring is read");
        assert!(!b.holding());
    }

    #[test]
    fn a_marker_that_never_comes_is_waited_for_a_bounded_time() {
        let (a, b, _udp, _wake) = linked_pair();
        assert!(a.send(&[one_packet(b.inner.local)]));
        let bl = b.inner.links.read()[0].clone();
        let t = Instant::now();
        while !discovery::take_mark(bl.mark.as_raw_fd()) {
            assert!(t.elapsed() < Duration::from_secs(10), "no marker");
        }
        let t = Instant::now();
        let mut got = 0;
        while got == 0 {
            got = pass(&b, &[]);
            assert!(t.elapsed() < Duration::from_secs(10), "held for good");
        }
        assert_eq!(got, 1);
        assert!(t.elapsed() >= MARK_WAIT, "released before the marker wait ran out");
    }
}
