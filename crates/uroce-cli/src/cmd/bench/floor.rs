//! `--floor`: the least a 64-byte RDMA WRITE's half round trip can take over
//! the kernel's UDP path, measured between the same two processes as the
//! RDMA tests (issue 19), so that `uroce bench --op write --metric lat
//! --floor` prints uroce's half round trip divided by it from one run.
//!
//! The same traffic as `benches/udp_floor.rs`'s last ping-pong row, with no
//! transport work: each side sends a 96-byte WRITE datagram (BTH + RETH +
//! 64 B payload + ICRC) the way a RoCE device must — from an unconnected
//! socket, in three pieces (headers, payload, ICRC) with `sendmmsg` —
//! followed in the same GSO send by a 20-byte ACK (as uroce acknowledges the
//! WRITE it answers), and receives with `recvmsg` for the sender's address
//! and GRO's segment size.

use super::ctrl::{Ctrl, Res};
use super::udp::{round_trips, PingPong};
use serde_json::json;
use std::net::{IpAddr, SocketAddr, UdpSocket};
use std::os::fd::AsRawFd;
use std::time::{Duration, Instant};

/// A 64-byte WRITE: BTH (12) + RETH (16) + payload (64) + ICRC (4).
const WRITE_BYTES: usize = 96;
/// An ACK: BTH (12) + AETH (4) + ICRC (4).
const ACK_BYTES: usize = 20;

/// One end: an unconnected, non-blocking UDP socket with GRO on.
struct End {
    s: UdpSocket,
    name: libc::sockaddr_storage,
    ctl: [u64; 8],
    buf: Vec<u8>,
}

fn sockaddr_in(a: SocketAddr) -> Res<libc::sockaddr_in> {
    let SocketAddr::V4(a) = a else { return Err("--floor: IPv4 only".into()) };
    // SAFETY: sockaddr_in is plain old data; all zero is valid.
    let mut s: libc::sockaddr_in = unsafe { std::mem::zeroed() };
    s.sin_family = libc::AF_INET as _;
    s.sin_port = a.port().to_be();
    s.sin_addr.s_addr = u32::from(*a.ip()).to_be();
    Ok(s)
}

fn iov(b: &[u8]) -> libc::iovec {
    libc::iovec { iov_base: b.as_ptr() as *mut libc::c_void, iov_len: b.len() }
}

impl End {
    fn bind(ip: IpAddr) -> Res<End> {
        let s = UdpSocket::bind(SocketAddr::new(ip, 0))?;
        s.set_nonblocking(true)?;
        let on: libc::c_int = 1;
        // SAFETY: a valid socket and a pointer to a c_int of the length passed.
        let r = unsafe {
            libc::setsockopt(s.as_raw_fd(), libc::SOL_UDP, libc::UDP_GRO, (&on as *const libc::c_int).cast(), 4)
        };
        if r != 0 {
            return Err(format!("--floor: UDP_GRO: {}", std::io::Error::last_os_error()).into());
        }
        // SAFETY: plain old data; all zero is valid.
        let name = unsafe { std::mem::zeroed() };
        Ok(End { s, name, ctl: [0; 8], buf: vec![0; 2048] })
    }

    /// The WRITE in three pieces, then the ACK, in one GSO send to `dst`.
    fn send(&self, dst: &libc::sockaddr_in, pkt: &[u8; WRITE_BYTES], ack: &[u8; ACK_BYTES]) -> Res<()> {
        let mut dst = *dst;
        let mut parts = [iov(&pkt[..28]), iov(&pkt[28..92]), iov(&pkt[92..]), iov(ack)];
        let mut ctl: uroce::io::SegmentControl = Default::default();
        // SAFETY: plain old data; all zero is valid.
        let mut h: libc::mmsghdr = unsafe { std::mem::zeroed() };
        h.msg_hdr.msg_name = (&mut dst as *mut libc::sockaddr_in).cast();
        h.msg_hdr.msg_namelen = std::mem::size_of::<libc::sockaddr_in>() as _;
        h.msg_hdr.msg_iov = parts.as_mut_ptr();
        h.msg_hdr.msg_iovlen = parts.len() as _;
        // SAFETY: `ctl` outlives the send below.
        unsafe { uroce::io::set_udp_segment(&mut h.msg_hdr, &mut ctl, WRITE_BYTES as u16) };
        // SAFETY: the header points at live iovecs, address and control data.
        let r = unsafe { libc::sendmmsg(self.s.as_raw_fd(), &mut h, 1, 0) };
        if r != 1 {
            return Err(format!("--floor: sendmmsg: {}", std::io::Error::last_os_error()).into());
        }
        Ok(())
    }

    /// One `recvmsg` attempt: the sender's address and the bytes read (a
    /// GRO'd WRITE + ACK arrive as one read) when a datagram was there.
    fn try_recv(&mut self) -> Res<Option<(SocketAddr, usize)>> {
        let mut v = iov(&self.buf);
        // SAFETY: plain old data; all zero is valid.
        let mut m: libc::msghdr = unsafe { std::mem::zeroed() };
        m.msg_name = (&mut self.name as *mut libc::sockaddr_storage).cast();
        m.msg_namelen = std::mem::size_of::<libc::sockaddr_storage>() as _;
        m.msg_iov = &mut v;
        m.msg_iovlen = 1;
        m.msg_control = self.ctl.as_mut_ptr().cast();
        m.msg_controllen = std::mem::size_of_val(&self.ctl) as _;
        // SAFETY: the header points at live buffers of the lengths it states.
        let r = unsafe { libc::recvmsg(self.s.as_raw_fd(), &mut m, libc::MSG_DONTWAIT) };
        if r < 0 {
            let e = std::io::Error::last_os_error();
            return if e.kind() == std::io::ErrorKind::WouldBlock { Ok(None) } else { Err(e.into()) };
        }
        if self.name.ss_family != libc::AF_INET as libc::sa_family_t {
            return Err("--floor: a datagram from a non-IPv4 sender".into());
        }
        // SAFETY: the kernel wrote a sockaddr_in (family checked above).
        let a = unsafe { *(&self.name as *const libc::sockaddr_storage as *const libc::sockaddr_in) };
        let ip = std::net::Ipv4Addr::from(u32::from_be(a.sin_addr.s_addr));
        Ok(Some((SocketAddr::new(IpAddr::V4(ip), u16::from_be(a.sin_port)), r as usize)))
    }
}

/// Server side: answer every WRITE datagram with a WRITE and an ACK,
/// spinning on the socket, until the client's `end`.
pub fn serve(ctrl: &mut Ctrl, ip: IpAddr) -> Res<()> {
    let mut e = End::bind(ip)?;
    ctrl.send(&json!({ "port": e.s.local_addr()?.port() }))?;
    let watch = ctrl.watch_end()?;
    let (pkt, ack) = ([0x42u8; WRITE_BYTES], [0x11u8; ACK_BYTES]);
    let limit = Instant::now() + Duration::from_secs(120);
    let mut spins = 0u64;
    while !watch.done() {
        // Answer each WRITE; an ACK that arrived apart is only read.
        if let Some((src, n)) = e.try_recv()? {
            if n >= WRITE_BYTES {
                e.send(&sockaddr_in(src)?, &pkt, &ack)?;
            }
        }
        spins += 1;
        if spins % 4096 == 0 && Instant::now() > limit {
            break;
        }
    }
    watch.join()?;
    ctrl.send(&json!({ "ok": true }))
}

/// Client side: the WRITE + ACK ping-pong for about `secs`, busy-polling.
pub fn pingpong(ctrl: &mut Ctrl, local: IpAddr, server: IpAddr, secs: f64) -> Res<PingPong> {
    let r = ctrl.call(&json!({ "cmd": "udp_floor" }))?;
    let port = r["port"].as_u64().ok_or("udp_floor: no port")? as u16;
    let e = End::bind(local)?;
    let dst = sockaddr_in(SocketAddr::new(server, port))?;
    let (pkt, ack) = ([0x42u8; WRITE_BYTES], [0x11u8; ACK_BYTES]);
    // The answer is the WRITE and its ACK: one GRO'd read, or two.
    let e = std::cell::RefCell::new(e);
    let bytes = std::cell::Cell::new(0);
    let rtt = round_trips(
        secs,
        "udp floor ping-pong",
        || {
            bytes.set(0);
            e.borrow_mut().send(&dst, &pkt, &ack)
        },
        || {
            bytes.set(bytes.get() + e.borrow_mut().try_recv()?.map_or(0, |(_, n)| n));
            Ok(bytes.get() >= WRITE_BYTES + ACK_BYTES)
        },
    )?;
    ctrl.call(&json!({ "cmd": "end" }))?;
    Ok(PingPong { iters: rtt.len(), rtt_us: rtt })
}
