//! The UDP medium: a device's RoCE packets as UDP datagrams on its socket
//! ([`RoceSocket`]), sent with GSO in `sendmmsg` batches and received with
//! GRO in `recvmmsg` batches. It reaches every peer, and carries every run
//! of packets that no other medium took.

use super::medium::{Medium, Runs, RxBuffer};
use super::socket::{Datagram, RecvBatch};
use super::RoceSocket;
use crate::proto::Transmit;
use smallvec::SmallVec;
use std::any::Any;
use std::net::SocketAddr;
use std::os::fd::{AsRawFd, RawFd};
use std::time::{Duration, Instant};

/// Receive buffers filled per `recvmmsg` (each may hold a GRO batch).
const RX_BATCH: usize = 64;

/// While packets come by another medium (it delivered within its active
/// window) and the socket was empty when last read, a receive pass reads
/// it again only once this long has passed: an empty `recvmsg` is a
/// system call per pass, and a stream over the link makes many passes (an
/// application that polls its CQ, one each poll). A datagram arriving
/// meanwhile waits at most this long; once one is found, the socket is
/// read every pass until it is empty again.
const UDP_QUIET: Duration = Duration::from_micros(20);

#[derive(Debug)]
pub struct Udp {
    socket: RoceSocket,
}

impl Udp {
    pub fn new(socket: RoceSocket) -> Udp {
        Udp { socket }
    }

    fn send_with_retry(&self, mut groups: &[(SocketAddr, &[Datagram])]) {
        let mut attempt = 0;
        while !groups.is_empty() && attempt < 64 {
            match self.socket.send_groups(groups) {
                Ok(n) => groups = &groups[n..],
                Err(e) if matches!(e.raw_os_error(), Some(libc::EAGAIN) | Some(libc::ENOBUFS)) => {
                    attempt += 1;
                    if attempt > 8 {
                        std::thread::sleep(Duration::from_micros(20));
                    } else {
                        std::thread::yield_now();
                    }
                }
                Err(e) => {
                    // Loss is recovered by the transport; say why once in a
                    // while, and go on with the other destinations.
                    tracing::debug!(dst = %groups[0].0, "send failed: {e}");
                    groups = &groups[1..];
                }
            }
        }
        if !groups.is_empty() {
            tracing::debug!("send buffer full; packets dropped");
        }
    }
}

/// The socket's receive buffers, the datagrams in them (GRO batches split:
/// buffer, offset, length, sender), and when the socket was last read.
struct UdpRx {
    batch: RecvBatch,
    got: Vec<(usize, usize, usize, SocketAddr)>,
    read_at: Instant,
}

impl RxBuffer for UdpRx {
    fn len(&self) -> usize {
        self.got.len()
    }

    fn get(&self, i: usize) -> (SocketAddr, &[u8]) {
        let (b, off, n, from) = self.got[i];
        (from, &self.batch.bytes(b)[off..off + n])
    }

    fn as_any_mut(&mut self) -> &mut dyn Any {
        self
    }
}

impl Medium for Udp {
    fn name(&self) -> &'static str {
        "udp"
    }

    /// Every run, as GSO sends batched into `sendmmsg` calls.
    fn send(&self, pkts: &[Transmit], runs: &mut Runs) {
        if runs.is_empty() {
            return;
        }
        let segs: SmallVec<[Datagram; 8]> = pkts.iter().map(|t| Datagram::new(t.parts())).collect();
        let groups: SmallVec<[(SocketAddr, &[Datagram]); 8]> =
            runs.drain(..).map(|r| (pkts[r.start].dst, &segs[r])).collect();
        self.send_with_retry(&groups);
    }

    fn rx_buffer(&self) -> Box<dyn RxBuffer> {
        Box::new(UdpRx { batch: RecvBatch::new(RX_BATCH, 65536), got: Vec::with_capacity(RX_BATCH), read_at: Instant::now() })
    }

    fn recv(&self, buf: &mut dyn RxBuffer, now: Instant, others_active: bool) {
        let Some(rx) = buf.as_any_mut().downcast_mut::<UdpRx>() else { return };
        rx.got.clear();
        if others_active && rx.batch.was_empty() && now.saturating_duration_since(rx.read_at) < UDP_QUIET {
            rx.batch.skip();
            return;
        }
        rx.read_at = now;
        if let Err(e) = self.socket.recv_batch(&mut rx.batch) {
            tracing::debug!("receive failed: {e}");
        }
        for (b, r) in rx.batch.filled().iter().enumerate() {
            match r.seg {
                None => rx.got.push((b, 0, r.len, r.from)),
                Some(seg) => {
                    // GRO merged datagrams: split them. Each IPv4 segment
                    // carries the ID its sender's GSO send gave it (see
                    // wire::icrc::find_ipv4_id); `check_datagram` finds
                    // which while it checks the ICRC.
                    for off in (0..r.len).step_by(seg) {
                        rx.got.push((b, off, seg.min(r.len - off), r.from));
                    }
                }
            }
        }
    }

    fn poll_fd(&self) -> RawFd {
        self.socket.as_raw_fd()
    }
}
