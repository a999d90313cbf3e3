//! What the kernel's UDP path allows a RoCEv2 device on loopback, without
//! uroce (issue #8): the raw baselines of `uroce bench` next to the same
//! traffic sent the way RoCE packets must be sent, with no transport work at
//! all. The gap between the two is a floor no user-space RoCE device can go
//! below on this kernel; `docs/benchmarks.md` explains the rows.
//!
//! - Ping-pong (64-byte payload, half round trip): `uroce bench`'s baseline
//!   uses connected sockets and `send`/`recv`. A RoCE device sends IPv4 from
//!   an unconnected socket (a connected one numbers its IP IDs from a random
//!   start, which the ICRC covers; see `io::socket`), a 96-byte WRITE in
//!   three pieces (headers, registered memory, ICRC) with `sendmmsg`, and
//!   receives with `recvmsg` for the sender's address and GRO's segment
//!   size; its peer also acknowledges (a 20-byte ACK after its answer, in
//!   the same GSO send, as uroce sends it: see `io::runtime::gso_runs`).
//! - Stream (64 KiB messages at PMTU 4096): the baseline sends 15 equal
//!   4112-byte datagrams from one buffer per GSO send. A 64 KiB RDMA WRITE is
//!   a 4128-byte FIRST packet (its RETH) that cannot share the GSO send of
//!   the 15 packets after it, each of them in three pieces, sent unconnected.
//!   The last row adds one CRC-32 pass over every packet (the ICRC's work).
//!
//! Run: `cargo bench -p uroce --bench udp_floor`

use std::net::{SocketAddr, UdpSocket};
use std::os::fd::AsRawFd;
use std::time::{Duration, Instant};
use uroce::io::set_udp_segment;

const ROUNDS: usize = 3;

fn setopt(s: &UdpSocket, level: i32, name: i32, v: i32) {
    // SAFETY: setsockopt reads one c_int from a valid pointer.
    unsafe { libc::setsockopt(s.as_raw_fd(), level, name, (&v as *const i32).cast(), 4) };
}

fn sockaddr(a: SocketAddr) -> libc::sockaddr_in {
    let SocketAddr::V4(a) = a else { panic!("IPv4 only") };
    // SAFETY: sockaddr_in is plain old data; all zero is valid.
    let mut s: libc::sockaddr_in = unsafe { std::mem::zeroed() };
    s.sin_family = libc::AF_INET as _;
    s.sin_port = a.port().to_be();
    s.sin_addr.s_addr = u32::from(*a.ip()).to_be();
    s
}

fn iov(b: &[u8]) -> libc::iovec {
    libc::iovec { iov_base: b.as_ptr() as *mut libc::c_void, iov_len: b.len() }
}

// ---------------------------------------------------------------- ping-pong

#[derive(Clone, Copy, PartialEq)]
enum Ping {
    /// `uroce bench`'s baseline: connected, `send` and `recv`.
    Baseline,
    /// A WRITE's datagram the RoCE way, no ACK.
    Roce,
    /// The same, each answer followed by a 20-byte ACK in the same GSO send.
    RoceAck,
}

struct PingEnd {
    s: UdpSocket,
    dst: libc::sockaddr_in,
    name: libc::sockaddr_storage,
    ctl: [u64; 8],
    buf: Vec<u8>,
}

impl PingEnd {
    fn new(s: UdpSocket, peer: SocketAddr) -> PingEnd {
        // SAFETY: plain old data; all zero is valid.
        let name = unsafe { std::mem::zeroed() };
        PingEnd { s, dst: sockaddr(peer), name, ctl: [0; 8], buf: vec![0; 2048] }
    }

    fn send(&mut self, mode: Ping, pkt: &[u8], ack: &[u8]) {
        let fd = self.s.as_raw_fd();
        if mode == Ping::Baseline {
            // SAFETY: a valid buffer of the length passed.
            unsafe { libc::send(fd, pkt.as_ptr().cast(), 64, 0) };
            return;
        }
        let mut parts = [iov(&pkt[..28]), iov(&pkt[28..92]), iov(&pkt[92..96]), iov(ack)];
        let mut ctl = [0u64; 4];
        // SAFETY: plain old data; all zero is valid.
        let mut h: libc::mmsghdr = unsafe { std::mem::zeroed() };
        h.msg_hdr.msg_name = (&mut self.dst as *mut libc::sockaddr_in).cast();
        h.msg_hdr.msg_namelen = std::mem::size_of::<libc::sockaddr_in>() as _;
        h.msg_hdr.msg_iov = parts.as_mut_ptr();
        h.msg_hdr.msg_iovlen = 3;
        if mode == Ping::RoceAck {
            h.msg_hdr.msg_iovlen = 4;
            // SAFETY: `ctl` outlives the call below.
            unsafe { set_udp_segment(&mut h.msg_hdr, &mut ctl, 96) };
        }
        // SAFETY: the header points at live iovecs, address and control data.
        let r = unsafe { libc::sendmmsg(fd, &mut h, 1, 0) };
        assert_eq!(r, 1, "sendmmsg: {}", std::io::Error::last_os_error());
    }

    /// Spins until a datagram arrives; false after a second without one.
    fn recv(&mut self, mode: Ping) -> bool {
        let fd = self.s.as_raw_fd();
        let t = Instant::now();
        loop {
            let r = if mode == Ping::Baseline {
                // SAFETY: a valid buffer of the length passed.
                unsafe { libc::recv(fd, self.buf.as_mut_ptr().cast(), self.buf.len(), libc::MSG_DONTWAIT) }
            } else {
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
                unsafe { libc::recvmsg(fd, &mut m, libc::MSG_DONTWAIT) }
            };
            if r >= 0 {
                return true;
            }
            if t.elapsed() > Duration::from_secs(1) {
                return false;
            }
        }
    }
}

/// Median half round trip in µs over `iters` round trips.
fn pingpong(mode: Ping, iters: usize) -> f64 {
    let a = UdpSocket::bind("127.0.0.1:0").unwrap();
    let b = UdpSocket::bind("127.0.0.2:0").unwrap();
    for s in [&a, &b] {
        s.set_nonblocking(true).unwrap();
        setopt(s, libc::SOL_UDP, libc::UDP_GRO, 1);
    }
    let (aa, ba) = (a.local_addr().unwrap(), b.local_addr().unwrap());
    if mode == Ping::Baseline {
        a.connect(ba).unwrap();
        b.connect(aa).unwrap();
    }
    let pkt = [0x42u8; 96];
    let ack = [0x11u8; 20];
    let echo = std::thread::spawn(move || {
        let mut e = PingEnd::new(b, aa);
        for _ in 0..iters {
            if !e.recv(mode) {
                return;
            }
            e.send(mode, &pkt, &ack);
        }
    });
    let mut e = PingEnd::new(a, ba);
    let mut rtt = Vec::with_capacity(iters);
    for _ in 0..iters {
        let t = Instant::now();
        e.send(mode, &pkt, &ack);
        assert!(e.recv(mode), "ping-pong: no answer within a second");
        rtt.push(t.elapsed().as_secs_f64() * 1e6);
    }
    echo.join().unwrap();
    rtt.sort_by(f64::total_cmp);
    rtt[rtt.len() / 2] / 2.0
}

// ------------------------------------------------------------------- stream

#[derive(Clone, Copy, PartialEq)]
enum Stream {
    /// `uroce bench`'s baseline: 15 × 4112 bytes from one buffer per send.
    Baseline,
    /// 64 KiB WRITEs as RoCE packets: FIRST alone, then 15 in one GSO send.
    Roce,
    /// The same with one CRC-32 pass over each packet.
    RoceCrc,
}

const SEG: usize = 4112;
/// Messages per `sendmmsg` (a 128-packet send window of 16-packet messages).
const MSGS: usize = 7;

/// Received Gb/s over `secs` of sending.
fn stream(mode: Stream, secs: f64) -> f64 {
    let a = UdpSocket::bind("127.0.0.1:0").unwrap();
    let b = UdpSocket::bind("127.0.0.2:0").unwrap();
    setopt(&b, libc::SOL_UDP, libc::UDP_GRO, 1);
    setopt(&b, libc::SOL_SOCKET, libc::SO_RCVBUFFORCE, 8 << 20);
    setopt(&a, libc::SOL_SOCKET, libc::SO_SNDBUFFORCE, 8 << 20);
    b.set_read_timeout(Some(Duration::from_millis(100))).unwrap();
    let dst = b.local_addr().unwrap();
    let sink = std::thread::spawn(move || {
        let mut buf = vec![0u8; 1 << 16];
        let mut bytes = 0u64;
        while let Ok(n) = b.recv(&mut buf) {
            bytes += n as u64;
        }
        bytes
    });
    let contiguous = vec![0x5au8; 15 * SEG];
    let payload = vec![0x5au8; 1 << 16];
    // Per packet: headers (28 bytes for FIRST, 12 otherwise) and an ICRC.
    let heads: Vec<[u8; 32]> = vec![[1u8; 32]; 16];
    let mut dst_in = sockaddr(dst);
    let mut iovs: Vec<libc::iovec> = Vec::with_capacity(48);
    for (k, h) in heads.iter().enumerate() {
        let hl = if k == 0 { 28 } else { 12 };
        iovs.extend([iov(&h[..hl]), iov(&payload[k * 4096..(k + 1) * 4096]), iov(&h[28..])]);
    }
    if mode == Stream::Baseline {
        a.connect(dst).unwrap();
        setopt(&a, libc::SOL_UDP, libc::UDP_SEGMENT, SEG as i32);
    }
    let mut ctl = [[0u64; 4]; 2];
    // SAFETY: plain old data; all zero is valid.
    let mut hdrs: Vec<libc::mmsghdr> = (0..2 * MSGS).map(|_| unsafe { std::mem::zeroed() }).collect();
    for (i, m) in hdrs.iter_mut().enumerate() {
        let h = &mut m.msg_hdr;
        h.msg_name = (&mut dst_in as *mut libc::sockaddr_in).cast();
        h.msg_namelen = std::mem::size_of::<libc::sockaddr_in>() as _;
        let first = i % 2 == 0;
        h.msg_iov = if first { iovs.as_mut_ptr() } else { iovs[3..].as_mut_ptr() };
        h.msg_iovlen = if first { 3 } else { 45 };
        // SAFETY: `ctl` lives until the end of this function.
        unsafe { set_udp_segment(h, &mut ctl[i % 2], if first { 0 } else { SEG as u16 }) };
    }
    let start = Instant::now();
    let mut crc = 0u32;
    while start.elapsed().as_secs_f64() < secs {
        if mode == Stream::Baseline {
            // SAFETY: a valid buffer of the length passed.
            unsafe { libc::send(a.as_raw_fd(), contiguous.as_ptr().cast(), contiguous.len(), 0) };
            continue;
        }
        if mode == Stream::RoceCrc {
            for _ in 0..MSGS {
                for (k, h) in heads.iter().enumerate() {
                    let mut c = crc32fast::Hasher::new();
                    c.update(&h[..28]);
                    c.update(&payload[k * 4096..(k + 1) * 4096]);
                    crc ^= c.finalize();
                }
            }
        }
        // SAFETY: the headers point at live iovecs, address and control data.
        unsafe { libc::sendmmsg(a.as_raw_fd(), hdrs.as_mut_ptr(), hdrs.len() as _, 0) };
    }
    std::hint::black_box(crc);
    let elapsed = start.elapsed().as_secs_f64();
    sink.join().unwrap() as f64 * 8.0 / elapsed / 1e9
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// Measures each row `ROUNDS` times, the rows alternating, and prints each
/// row's median and its ratio to the first row's.
fn table<M: Copy>(title: &str, unit: &str, rows: &[(M, &str)], measure: impl Fn(M) -> f64) {
    let mut got = vec![Vec::new(); rows.len()];
    for _ in 0..ROUNDS {
        for (i, &(m, _)) in rows.iter().enumerate() {
            got[i].push(measure(m));
        }
    }
    let medians: Vec<f64> = got.into_iter().map(median).collect();
    println!("\n{title:<70} {unit:>10}   ratio");
    for (&(_, name), v) in rows.iter().zip(&medians) {
        println!("  {name:<68} {v:10.2}   {:5.2}", v / medians[0]);
    }
}

fn main() {
    println!("UDP on loopback, {ROUNDS} alternating rounds, medians; ratios to the baseline of the same run");
    let pings = [
        (Ping::Baseline, "baseline: connected send/recv"),
        (Ping::Roce, "RoCE WRITE datagram: unconnected sendmmsg (3 pieces), recvmsg"),
        (Ping::RoceAck, "the same, each answer followed by an ACK"),
    ];
    table("64-byte ping-pong", "half RTT us", &pings, |m| pingpong(m, 100_000));
    let streams = [
        (Stream::Baseline, "baseline: 15 x 4112 B per GSO send, one buffer, connected"),
        (Stream::Roce, "64 KiB WRITEs: FIRST alone + 15 per GSO send, 3 pieces each"),
        (Stream::RoceCrc, "the same with a CRC-32 pass over every packet (ICRC)"),
    ];
    table("stream", "Gb/s", &streams, |m| stream(m, 0.5));
}
