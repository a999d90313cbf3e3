//! The raw UDP baselines, between the same two processes as the RDMA tests:
//! streaming with UDP GSO on send and UDP GRO on receive (the most a UDP
//! transport can move over this path), and a 64-byte busy-poll ping-pong
//! (the least a round trip can take).

use super::ctrl::{Ctrl, Res};
use serde_json::{json, Value};
use std::net::{IpAddr, SocketAddr, UdpSocket};
use std::os::fd::AsRawFd;
use std::time::{Duration, Instant};

/// Largest UDP payload of one GSO send (IPv4: 65535 − 20 − 8).
const GSO_MAX_BYTES: usize = 65507;
/// Most segments per GSO send the kernel accepts (UDP_MAX_SEGMENTS).
const GSO_MAX_SEGS: usize = 64;
/// Ping-pong message size.
pub const PING_BYTES: usize = 64;

fn setsockopt_int(s: &UdpSocket, level: libc::c_int, name: libc::c_int, v: libc::c_int) -> std::io::Result<()> {
    // SAFETY: a valid socket descriptor and a pointer to a c_int of the
    // length passed; the kernel copies the value and keeps no reference.
    let r = unsafe {
        libc::setsockopt(
            s.as_raw_fd(),
            level,
            name,
            (&v as *const libc::c_int).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    if r == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

fn big_buffers(s: &UdpSocket) {
    // Best effort: the kernel caps these at rmem_max / wmem_max unless root.
    for (force, plain) in [(libc::SO_RCVBUFFORCE, libc::SO_RCVBUF), (libc::SO_SNDBUFFORCE, libc::SO_SNDBUF)] {
        if setsockopt_int(s, libc::SOL_SOCKET, force, 8 << 20).is_err() {
            let _ = setsockopt_int(s, libc::SOL_SOCKET, plain, 8 << 20);
        }
    }
}

/// Server side of the stream: receive with GRO until the client's `end`,
/// then report the bytes received and the time from first to last.
pub fn serve_stream(ctrl: &mut Ctrl, ip: IpAddr) -> Res<()> {
    let s = UdpSocket::bind(SocketAddr::new(ip, 0))?;
    setsockopt_int(&s, libc::SOL_UDP, libc::UDP_GRO, 1)?;
    big_buffers(&s);
    s.set_read_timeout(Some(Duration::from_millis(5)))?;
    ctrl.send(&json!({ "port": s.local_addr()?.port() }))?;
    let watch = ctrl.watch_end()?;
    let mut buf = vec![0u8; 1 << 16];
    let (mut bytes, mut recvs) = (0u64, 0u64);
    let (mut first, mut last) = (None::<Instant>, None::<Instant>);
    let limit = Instant::now() + Duration::from_secs(120);
    while !watch.done() && Instant::now() < limit {
        match s.recv(&mut buf) {
            Ok(n) => {
                let now = Instant::now();
                first.get_or_insert(now);
                last = Some(now);
                bytes += n as u64;
                recvs += 1;
            }
            Err(e) if matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut) => {}
            Err(e) => return Err(e.into()),
        }
    }
    watch.join()?;
    let secs = match (first, last) {
        (Some(a), Some(b)) => (b - a).as_secs_f64(),
        _ => 0.0,
    };
    ctrl.send(&json!({ "bytes": bytes, "recvs": recvs, "secs": secs }))
}

/// The stream baseline's result.
#[derive(Debug, Clone, Copy)]
pub struct Stream {
    pub segment: usize,
    pub gbps: f64,
    /// Datagrams per second received (M).
    pub mpps: f64,
    pub sent_gbps: f64,
}

/// Client side: GSO sends of `segment`-byte datagrams for `secs`.
pub fn stream(ctrl: &mut Ctrl, local: IpAddr, server: IpAddr, segment: usize, secs: f64) -> Res<Stream> {
    let r = ctrl.call(&json!({ "cmd": "udp_stream" }))?;
    let port = r["port"].as_u64().ok_or("udp_stream: no port")? as u16;
    let s = UdpSocket::bind(SocketAddr::new(local, 0))?;
    s.connect(SocketAddr::new(server, port))?;
    big_buffers(&s);
    let segs = (GSO_MAX_BYTES / segment).clamp(1, GSO_MAX_SEGS);
    setsockopt_int(&s, libc::SOL_UDP, libc::UDP_SEGMENT, segment as libc::c_int)?;
    let buf = vec![0x5au8; segs * segment];
    let t = Instant::now();
    let dur = Duration::from_secs_f64(secs);
    let mut sent = 0u64;
    let mut i = 0u64;
    loop {
        match s.send(&buf) {
            Ok(n) => sent += n as u64,
            // The receiver's queue is full (ENOBUFS / EAGAIN): the limit.
            Err(e) if e.raw_os_error() == Some(libc::ENOBUFS) || e.kind() == std::io::ErrorKind::WouldBlock => {}
            Err(e) => return Err(format!("udp stream send: {e}").into()),
        }
        i += 1;
        if i % 16 == 0 && t.elapsed() >= dur {
            break;
        }
    }
    let sent_secs = t.elapsed().as_secs_f64();
    // Let the receiver drain what is queued before it stops counting.
    std::thread::sleep(Duration::from_millis(20));
    let r = ctrl.call(&json!({ "cmd": "end" }))?;
    let bytes = r["bytes"].as_f64().unwrap_or(0.0);
    let rsecs = r["secs"].as_f64().unwrap_or(0.0);
    if bytes <= 0.0 || rsecs <= 0.0 {
        return Err("udp stream: nothing received".into());
    }
    Ok(Stream {
        segment,
        gbps: bytes * 8.0 / rsecs / 1e9,
        mpps: bytes / segment as f64 / rsecs / 1e6,
        sent_gbps: sent as f64 * 8.0 / sent_secs / 1e9,
    })
}

/// Server side of the ping-pong: echo every datagram, spinning on a
/// non-blocking socket, until the client's `end`.
pub fn serve_pingpong(ctrl: &mut Ctrl, ip: IpAddr) -> Res<()> {
    let s = UdpSocket::bind(SocketAddr::new(ip, 0))?;
    s.set_nonblocking(true)?;
    ctrl.send(&json!({ "port": s.local_addr()?.port() }))?;
    let watch = ctrl.watch_end()?;
    let mut buf = [0u8; 2048];
    let limit = Instant::now() + Duration::from_secs(120);
    let mut spins = 0u64;
    while !watch.done() {
        match s.recv_from(&mut buf) {
            Ok((n, src)) => {
                s.send_to(&buf[..n], src)?;
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
            Err(e) => return Err(e.into()),
        }
        spins += 1;
        if spins % 4096 == 0 && Instant::now() > limit {
            break;
        }
    }
    watch.join()?;
    ctrl.send(&json!({ "ok": true }))
}

/// Server side of the blocking ping-pong: echo every datagram from a
/// blocking `recv` (a short timeout, to see the client's `end`).
pub fn serve_pingpong_blocking(ctrl: &mut Ctrl, ip: IpAddr) -> Res<()> {
    let s = UdpSocket::bind(SocketAddr::new(ip, 0))?;
    s.set_read_timeout(Some(Duration::from_millis(20)))?;
    ctrl.send(&json!({ "port": s.local_addr()?.port() }))?;
    let watch = ctrl.watch_end()?;
    let mut buf = [0u8; 2048];
    let limit = Instant::now() + Duration::from_secs(120);
    while !watch.done() && Instant::now() < limit {
        match s.recv_from(&mut buf) {
            Ok((n, src)) => {
                s.send_to(&buf[..n], src)?;
            }
            Err(e) if matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut) => {}
            Err(e) => return Err(e.into()),
        }
    }
    watch.join()?;
    ctrl.send(&json!({ "ok": true }))
}

/// The ping-pong baseline's result, in microseconds.
#[derive(Debug, Clone)]
pub struct PingPong {
    pub iters: usize,
    /// Round trips, sorted (µs).
    pub rtt_us: Vec<f64>,
}

impl PingPong {
    pub fn half_median_us(&self) -> f64 {
        super::spec::percentile(&self.rtt_us, 50.0) / 2.0
    }
    pub fn to_json(&self) -> Value {
        let p = |q| super::spec::percentile(&self.rtt_us, q);
        json!({
            "bytes": PING_BYTES,
            "iters": self.iters,
            "half_rtt_median_us": p(50.0) / 2.0,
            "half_rtt_p99_us": p(99.0) / 2.0,
            "rtt_median_us": p(50.0),
            "rtt_p99_us": p(99.0),
        })
    }
}

/// Client side: busy-poll 64-byte ping-pong for about `secs`.
pub fn pingpong(ctrl: &mut Ctrl, local: IpAddr, server: IpAddr, secs: f64) -> Res<PingPong> {
    let r = ctrl.call(&json!({ "cmd": "udp_pingpong" }))?;
    let port = r["port"].as_u64().ok_or("udp_pingpong: no port")? as u16;
    let s = UdpSocket::bind(SocketAddr::new(local, 0))?;
    s.connect(SocketAddr::new(server, port))?;
    s.set_nonblocking(true)?;
    let msg = [0x42u8; PING_BYTES];
    let mut buf = [0u8; 2048];
    let rtt = round_trips(
        secs,
        "udp ping-pong",
        || Ok(s.send(&msg).map(|_| ())?),
        || match s.recv(&mut buf) {
            Ok(_) => Ok(true),
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => Ok(false),
            Err(e) => Err(e.into()),
        },
    )?;
    ctrl.call(&json!({ "cmd": "end" }))?;
    Ok(PingPong { iters: rtt.len(), rtt_us: rtt })
}

/// Client side of the blocking ping-pong: both ends sleep in `recv` (two
/// kernel wake-ups per round trip), the floor of an event-driven wait.
pub fn pingpong_blocking(ctrl: &mut Ctrl, local: IpAddr, server: IpAddr, secs: f64) -> Res<PingPong> {
    let r = ctrl.call(&json!({ "cmd": "udp_pingpong_blocking" }))?;
    let port = r["port"].as_u64().ok_or("udp_pingpong_blocking: no port")? as u16;
    let s = UdpSocket::bind(SocketAddr::new(local, 0))?;
    s.connect(SocketAddr::new(server, port))?;
    // A recv returns after this without an answer (`round_trips` counts
    // such calls: a lost datagram is sent again after about a second).
    s.set_read_timeout(Some(Duration::from_millis(1)))?;
    let msg = [0x42u8; PING_BYTES];
    let mut buf = [0u8; 2048];
    let rtt = round_trips(
        secs,
        "udp blocking ping-pong",
        || Ok(s.send(&msg).map(|_| ())?),
        || match s.recv(&mut buf) {
            Ok(_) => Ok(true),
            Err(e) if matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut) => Ok(false),
            Err(e) => Err(e.into()),
        },
    )?;
    ctrl.call(&json!({ "cmd": "end" }))?;
    Ok(PingPong { iters: rtt.len(), rtt_us: rtt })
}

/// Busy-polled round trips for about `secs` (at least 100 after 500 of
/// warm-up): `send` starts one, `answered` polls until it is complete. A
/// round trip without its answer within 100 ms is lost and sent again (no
/// sample); more than 100 losses fail `what`. The samples, in µs, sorted.
pub fn round_trips(
    secs: f64,
    what: &str,
    mut send: impl FnMut() -> Res<()>,
    mut answered: impl FnMut() -> Res<bool>,
) -> Res<Vec<f64>> {
    let mut rtt = Vec::with_capacity(1 << 16);
    let (start, dur) = (Instant::now(), Duration::from_secs_f64(secs));
    let mut lost = 0;
    for i in 0..1_000_000usize {
        let t0 = Instant::now();
        send()?;
        let mut got = false;
        let mut spins = 0u64;
        while !got {
            got = answered()?;
            spins += 1;
            if spins % 1024 == 0 && t0.elapsed() > Duration::from_millis(100) {
                break; // lost: send again, no sample
            }
        }
        if !got {
            lost += 1;
            if lost > 100 {
                return Err(format!("{what}: too many losses").into());
            }
            continue;
        }
        if i >= 500 {
            rtt.push(t0.elapsed().as_secs_f64() * 1e6);
        }
        if start.elapsed() >= dur && rtt.len() >= 100 {
            break;
        }
    }
    rtt.sort_by(f64::total_cmp);
    Ok(rtt)
}
