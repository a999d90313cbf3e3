//! `uroce bench`: a perftest-like benchmark that also measures the
//! machine's own limits in the same run, so results read as ratios.
//!
//! - `uroce bench [OPTIONS]`: spawns the server as a child process on
//!   loopback (its device on 127.0.0.2, ours on 127.0.0.1, a free UDP port
//!   per run) and runs the client against it: two processes, one command.
//! - `uroce bench server [--addr IP] [--tcp-port P] [--port UDP]` and
//!   `uroce bench client --server IP[:P] [OPTIONS]`: two hosts.
//!
//! The two ends talk over TCP (JSON lines, see `ctrl`): for each point the
//! client sends the test and its QPNs, GID, PSN, rkey and address, the
//! server answers with its own and plays the peer until the client's `end`.
//! The server also hosts the peers of the raw UDP baselines (`udp`): GSO/GRO
//! streaming with the datagram size uroce sends, and a 64-byte busy-poll
//! ping-pong; with `--floor`, also the floor under a 64-byte WRITE's half
//! round trip (`floor`: RoCE-shaped datagrams and their ACK, no transport),
//! so that the latency rows' ratio to it comes from the same run.
//!
//! Bandwidth: `--tx-depth` WRs outstanding per QP, QPs round-robin, one WR
//! in 16 signaled; Gb/s of message payload and M messages/s. Latency:
//! ping-pong; WRITE as perftest (each side writes to the other and polls
//! memory for the last byte), SEND with receives, READ and atomics one-sided;
//! half round trip for WRITE and SEND, full round trip for READ and atomics.
//! By default everything polls the CQ busily, which drives the device in
//! this thread; `--wait event` waits as `ibv_rc_pingpong -e` and qperf do
//! (a completion channel, `ibv_req_notify_cq` after each event), and its
//! latency rows compare with a raw UDP ping-pong whose ends block in
//! `recv` (two kernel wake-ups per round trip). `--transport` runs the
//! points over RC, UC or UD QPs (UC: WRITE and SEND; UD: SEND).

mod ctrl;
mod floor;
mod link;
mod rdma;
mod report;
mod spec;
mod udp;

use ctrl::{Ctrl, Res};
use serde_json::json;
use spec::{percentile, Measured, Metric, Op, Opts, Spec, Wait};
use std::io::BufRead;
use std::net::{IpAddr, Ipv4Addr, SocketAddr, TcpListener, TcpStream, UdpSocket};
use std::process::{Child, Command, ExitCode, Stdio};
use std::time::{Duration, Instant};
use uroce::verbs::*;

/// perftest's port.
const DEFAULT_TCP_PORT: u16 = 18515;
/// Longest wait for one control message.
const CTRL_TIMEOUT: Duration = Duration::from_secs(120);

#[derive(clap::Args)]
#[command(args_conflicts_with_subcommands = true)]
pub struct Args {
    #[command(subcommand)]
    role: Option<Role>,
    #[command(flatten)]
    opts: Opts,
}

#[derive(clap::Subcommand)]
#[allow(clippy::large_enum_variant)] // parsed once: boxing buys nothing
enum Role {
    /// Serve one client: the RDMA peer and the UDP baseline peers.
    Server {
        /// Address of this end's device (default: as `uroce devices`).
        #[arg(long)]
        addr: Option<IpAddr>,
        /// TCP port of the control channel (0: any; printed on stdout).
        #[arg(long, default_value_t = DEFAULT_TCP_PORT)]
        tcp_port: u16,
        /// UDP port of both devices (0: the configured one, 4791).
        #[arg(long, default_value_t = 0)]
        port: u16,
        /// Seconds to wait for the client.
        #[arg(long, default_value_t = 300)]
        wait: u64,
    },
    /// Run the tests against `uroce bench server`.
    Client {
        /// The server: IP or IP:tcp-port.
        #[arg(long)]
        server: String,
        /// Address of this end's device (default: the route's source address
        /// to the server, or a free 127.0.0.x for a loopback server).
        #[arg(long)]
        addr: Option<IpAddr>,
        #[command(flatten)]
        opts: Opts,
    },
}

pub fn run(a: Args) -> ExitCode {
    let r = match a.role {
        None if !a.opts.link.is_empty() => link::compare(&a.opts, local),
        None => local(&a.opts).map(drop),
        Some(Role::Client { server, addr, opts }) => {
            link::set_env(&opts);
            parse_server(&server).and_then(|s| client(&opts, s, addr, None)).map(drop)
        }
        Some(Role::Server { addr, tcp_port, port, wait }) => server(addr, tcp_port, port, wait),
    };
    match r {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("uroce bench: {e}");
            ExitCode::FAILURE
        }
    }
}

fn parse_server(s: &str) -> Res<SocketAddr> {
    if let Ok(a) = s.parse::<SocketAddr>() {
        return Ok(a);
    }
    let ip: IpAddr = s.parse().map_err(|_| format!("--server {s}: not IP or IP:port"))?;
    Ok(SocketAddr::new(ip, DEFAULT_TCP_PORT))
}

// ---------------------------------------------------------------- server

fn server(addr: Option<IpAddr>, tcp_port: u16, port: u16, wait: u64) -> Res<()> {
    server_with(addr, tcp_port, port, wait, |_| {})
}

/// The server; `ready` gets the control channel's TCP port once it listens.
fn server_with(addr: Option<IpAddr>, tcp_port: u16, port: u16, wait: u64, ready: impl FnOnce(u16)) -> Res<()> {
    let mut cfg = DeviceConfig::from_env()?;
    if addr.is_some() {
        cfg.addr = addr;
    }
    if port != 0 {
        cfg.port = port;
    }
    let ctx = Context::open(&cfg)?;
    let pd = ctx.alloc_pd()?;
    let ip = ctx.local_addr().ip();
    let l = TcpListener::bind(SocketAddr::new(IpAddr::V4(Ipv4Addr::UNSPECIFIED), tcp_port))?;
    // One line, the port last: `uroce bench` reads it from its child.
    println!("uroce bench server: device {} at {}, tcp port {}", ctx.name(), ctx.local_addr(), l.local_addr()?.port());
    ready(l.local_addr()?.port());
    l.set_nonblocking(true)?;
    let deadline = Instant::now() + Duration::from_secs(wait);
    let stream = loop {
        match l.accept() {
            Ok((s, _)) => break s,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                if Instant::now() > deadline {
                    return Err(format!("no client within {wait} s").into());
                }
                std::thread::sleep(Duration::from_millis(5));
            }
            Err(e) => return Err(e.into()),
        }
    };
    stream.set_nonblocking(false)?;
    let mut ctrl = Ctrl::new(stream, CTRL_TIMEOUT)?;
    ctrl.send(&json!({
        "udp_port": ctx.local_addr().port(),
        "device_ip": ip.to_string(),
        "mtu": ctx.query_port(1)?.active_mtu.bytes(),
        "machine": report::machine(),
    }))?;
    for _ in 0..1_000_000 {
        let msg = ctrl.recv()?;
        let r = match msg["cmd"].as_str().unwrap_or("") {
            "rdma" => rdma::serve(&mut ctrl, &ctx, &pd, &msg),
            "udp_stream" => udp::serve_stream(&mut ctrl, ip),
            "udp_pingpong" => udp::serve_pingpong(&mut ctrl, ip),
            "udp_pingpong_blocking" => udp::serve_pingpong_blocking(&mut ctrl, ip),
            "udp_floor" => floor::serve(&mut ctrl, ip),
            "bye" => return ctrl.send(&json!({ "ok": true })),
            other => Err(format!("unknown command {other:?}").into()),
        };
        if let Err(e) = r {
            let _ = ctrl.send(&json!({ "error": e.to_string() }));
            return Err(e);
        }
    }
    Ok(())
}

// ---------------------------------------------------------------- loopback

/// Kills the spawned server if the client fails.
struct ChildGuard(Child);

impl Drop for ChildGuard {
    fn drop(&mut self) {
        let deadline = Instant::now() + Duration::from_secs(5);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.0.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A UDP port free on both loopback addresses.
fn free_port(a: IpAddr, b: IpAddr) -> Res<u16> {
    for _ in 0..50 {
        let s = UdpSocket::bind(SocketAddr::new(a, 0))?;
        let p = s.local_addr()?.port();
        if UdpSocket::bind(SocketAddr::new(b, p)).is_ok() {
            return Ok(p);
        }
    }
    Err("no free UDP port on loopback".into())
}

fn local(opts: &Opts) -> Res<Vec<report::Row>> {
    let (cip, sip) = (IpAddr::V4(Ipv4Addr::new(127, 0, 0, 1)), IpAddr::V4(Ipv4Addr::new(127, 0, 0, 2)));
    points(opts)?; // report bad options before spawning anything
    let port = if opts.port != 0 { opts.port } else { free_port(cip, sip)? };
    if opts.in_process {
        let (tx, rx) = std::sync::mpsc::channel();
        let srv = std::thread::Builder::new().name("bench-server".into()).spawn(move || {
            if let Err(e) = server_with(Some(sip), 0, port, 30, |p| {
                let _ = tx.send(p);
            }) {
                eprintln!("uroce bench: server: {e}");
            }
        })?;
        let tcp = rx.recv_timeout(Duration::from_secs(30)).map_err(|_| "the in-process server did not start")?;
        let r = client(opts, SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), tcp), Some(cip), Some(port));
        let _ = srv.join();
        return r;
    }
    let exe = std::env::current_exe()?;
    let child = Command::new(exe)
        .args(["bench", "server", "--addr", &sip.to_string(), "--port", &port.to_string()])
        .args(["--tcp-port", "0", "--wait", "30"])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()?;
    let mut guard = ChildGuard(child);
    let out = guard.0.stdout.take().ok_or("no server stdout")?;
    let mut line = String::new();
    std::io::BufReader::new(out).read_line(&mut line)?;
    let tcp: u16 = line
        .trim()
        .rsplit(' ')
        .next()
        .and_then(|p| p.parse().ok())
        .ok_or_else(|| format!("the server did not start ({:?})", line.trim()))?;
    client(opts, SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), tcp), Some(cip), Some(port))
}

// ---------------------------------------------------------------- client

fn points(opts: &Opts) -> Res<Vec<Spec>> {
    let mut v = Vec::new();
    for &metric in &opts.metric {
        let sizes: Vec<usize> = if opts.sweep {
            (1..=20).map(|i| 1usize << i).collect()
        } else if let Some(s) = opts.size {
            vec![s]
        } else if !opts.sizes.is_empty() {
            opts.sizes.clone()
        } else {
            vec![if metric == Metric::Bw { 65536 } else { 64 }]
        };
        for &op in &opts.op {
            let sizes = if op == Op::Atomic { vec![8] } else { sizes.clone() };
            for &transport in opts.transport.iter().filter(|t| t.allows(op)) {
                for &wait in &opts.wait {
                    if wait == Wait::Event && (metric != Metric::Lat || op == Op::Write) {
                        continue; // see `Spec::validate`
                    }
                    for &size in &sizes {
                        let qps = if metric == Metric::Lat { 1 } else { opts.qps };
                        let s = Spec { op, transport, wait, metric, size, qps, tx_depth: opts.tx_depth };
                        s.validate()?;
                        v.push(s);
                    }
                }
            }
        }
    }
    if v.is_empty() {
        return Err("bench: no point: --wait event runs latency points of send, read and atomic; \
                    UC runs write and send, UD send"
            .into());
    }
    Ok(v)
}

fn connect(server: SocketAddr) -> Res<TcpStream> {
    let mut last = None;
    for _ in 0..100 {
        match TcpStream::connect_timeout(&server, Duration::from_secs(2)) {
            Ok(s) => return Ok(s),
            Err(e) => last = Some(e),
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    Err(format!("cannot reach the server at {server}: {}", last.map(|e| e.to_string()).unwrap_or_default()).into())
}

/// The datagram uroce sends for one packet of a `size`-byte message:
/// payload up to the MTU, BTH (12) and ICRC (4).
fn segment(size: usize, mtu: usize) -> usize {
    size.min(mtu) + 12 + 4
}

fn client(opts: &Opts, server: SocketAddr, addr: Option<IpAddr>, port: Option<u16>) -> Res<Vec<report::Row>> {
    let specs = points(opts)?;
    let mut ctrl = Ctrl::new(connect(server)?, CTRL_TIMEOUT)?;
    let hello = ctrl.recv()?;
    let udp_port = hello["udp_port"].as_u64().ok_or("bad hello from server")? as u16;
    let sip: IpAddr = hello["device_ip"].as_str().unwrap_or("").parse()?;
    let mut cfg = DeviceConfig::from_env()?;
    cfg.port = port.unwrap_or(udp_port);
    cfg.addr = match addr {
        Some(a) => Some(a),
        None if sip.is_loopback() => cfg.addr,
        None => Some(route_source(sip)?),
    };
    let ctx = Context::open(&cfg)?;
    let pd = ctx.alloc_pd()?;
    let cip = ctx.local_addr().ip();
    let mtu = ctx.query_port(1)?.active_mtu.bytes() as usize;
    println!(
        "uroce bench: client device {} ({}), server device {} ({}), path MTU {mtu}",
        ctx.local_addr(),
        ctx.name(),
        SocketAddr::new(sip, udp_port),
        server
    );

    let mut rep = report::Report::new(hello["machine"].clone(), mtu);
    if !opts.no_baseline {
        let mut segs: Vec<usize> =
            specs.iter().filter(|s| s.metric == Metric::Bw).map(|s| segment(s.size, mtu)).collect();
        segs.sort_unstable();
        segs.dedup();
        for seg in segs {
            let b = udp::stream(&mut ctrl, cip, sip, seg, opts.baseline_secs)?;
            println!(
                "baseline: raw UDP GSO+GRO stream, {seg}-byte datagrams: {:.2} Gb/s ({:.2} M datagrams/s; sender {:.2} Gb/s)",
                b.gbps, b.mpps, b.sent_gbps
            );
            rep.streams.push(b);
        }
        if specs.iter().any(|s| s.metric == Metric::Lat && s.wait == Wait::Poll) {
            let p = udp::pingpong(&mut ctrl, cip, sip, opts.baseline_secs)?;
            println!(
                "baseline: raw UDP {}-byte busy-poll ping-pong: half round trip {:.2} us (p99 {:.2} us)",
                udp::PING_BYTES,
                p.half_median_us(),
                percentile(&p.rtt_us, 99.0) / 2.0
            );
            rep.pingpong = Some(p);
        }
        if specs.iter().any(|s| s.wait == Wait::Event) {
            let p = udp::pingpong_blocking(&mut ctrl, cip, sip, opts.baseline_secs)?;
            println!(
                "baseline: raw UDP {}-byte blocking-recv ping-pong: half round trip {:.2} us (p99 {:.2} us)",
                udp::PING_BYTES,
                p.half_median_us(),
                percentile(&p.rtt_us, 99.0) / 2.0
            );
            rep.pingpong_blocking = Some(p);
        }
    }
    let want_floor = opts.floor && specs.iter().any(|s| s.metric == Metric::Lat && s.op == Op::Write);
    let mut floors = Vec::new();
    if want_floor {
        floors.push(floor_once(&mut ctrl, cip, sip, opts.baseline_secs, "before the points")?);
    }
    report::header();
    let mut rows = Vec::new();
    for spec in &specs {
        let p = point(&mut ctrl, &ctx, &pd, spec, opts.iters)?;
        let row = rep.add(spec, p, segment(spec.size, mtu));
        report::row(&row);
        rows.push(row);
    }
    if want_floor {
        floors.push(floor_once(&mut ctrl, cip, sip, opts.baseline_secs, "after the points")?);
        let f = floors.iter().sum::<f64>() / floors.len() as f64;
        for r in rows.iter().filter(|r| r.metric == "lat" && r.op == "write") {
            println!(
                "floor ratio: {} B WRITE half round trip {:.2} us / floor {:.2} us (mean of {:.2} and {:.2}) = {:.2}x",
                r.size,
                r.result,
                f,
                floors[0],
                floors[1],
                r.result / f
            );
        }
    }
    ctrl.call(&json!({ "cmd": "bye" }))?;
    link::print_media(&ctx);
    if let Some(f) = &opts.csv {
        std::fs::write(f, rep.csv()).map_err(|e| format!("{}: {e}", f.display()))?;
        println!("wrote {}", f.display());
    }
    if let Some(f) = &opts.json {
        let v = rep.json(opts, server, &ctx);
        std::fs::write(f, serde_json::to_string_pretty(&v)? + "\n").map_err(|e| format!("{}: {e}", f.display()))?;
        println!("wrote {}", f.display());
    }
    Ok(rows)
}

/// One `--floor` measurement: the median half round trip in µs, printed.
fn floor_once(ctrl: &mut Ctrl, cip: IpAddr, sip: IpAddr, secs: f64, when: &str) -> Res<f64> {
    let p = floor::pingpong(ctrl, cip, sip, secs)?;
    println!(
        "floor ({when}): RoCE 64 B WRITE datagram + ACK ping-pong over UDP, no transport: half round trip {:.2} us (p99 {:.2} us)",
        p.half_median_us(),
        percentile(&p.rtt_us, 99.0) / 2.0
    );
    Ok(p.half_median_us())
}

/// The local address the kernel would send from to reach `to`.
fn route_source(to: IpAddr) -> Res<IpAddr> {
    let any = if to.is_ipv4() { IpAddr::V4(Ipv4Addr::UNSPECIFIED) } else { "::".parse()? };
    let s = UdpSocket::bind(SocketAddr::new(any, 0))?;
    s.connect(SocketAddr::new(to, 9))?;
    Ok(s.local_addr()?.ip())
}

/// Wall-clock aim of one calibrated point.
const AIM_SECS: f64 = 0.5;

fn point(ctrl: &mut Ctrl, ctx: &Context, pd: &ProtectionDomain, spec: &Spec, iters: Option<u64>) -> Res<Measured> {
    // Write-latency exchanges of this point (the polled byte's value); the
    // server counts from zero for each point too.
    let n = &mut 0u64;
    let ep = rdma::Endpoint::new(ctx, pd, spec)?;
    let reply = ctrl.call(&json!({ "cmd": "rdma", "spec": spec.to_json(), "info": ep.info(ctx)? }))?;
    let peer = rdma::Peer::from_json(&reply["info"])?;
    ep.connect(&peer)?;
    ep.post_receives(spec.size)?;
    let before = ctx.stats();
    let m = match spec.metric {
        Metric::Bw => {
            let iters = match iters {
                Some(i) => i.max(1),
                None => {
                    let probe = ((32 << 20) / spec.size as u64).clamp(64, 20_000);
                    let t = rdma::bw(&ep, &peer, spec, probe)?.as_secs_f64();
                    ((probe as f64 / t.max(1e-6) * AIM_SECS) as u64).clamp(100, 20_000_000)
                }
            };
            let t = rdma::bw(&ep, &peer, spec, iters)?;
            Measured { iters, secs: t.as_secs_f64(), rtt_us: Vec::new(), retransmits: 0, timeouts: 0 }
        }
        Metric::Lat => {
            let warm = rdma::lat(&ep, &peer, spec, 200, n)?;
            let iters = iters.unwrap_or_else(|| {
                let mean = warm.iter().sum::<f64>() / warm.len() as f64;
                ((AIM_SECS * 1e6 / mean.max(0.1)) as u64).clamp(200, 500_000)
            });
            let t = Instant::now();
            let mut rtt = rdma::lat(&ep, &peer, spec, iters, n)?;
            rtt.sort_by(f64::total_cmp);
            Measured { iters, secs: t.elapsed().as_secs_f64(), rtt_us: rtt, retransmits: 0, timeouts: 0 }
        }
    };
    let after = ctx.stats();
    ctrl.call(&json!({ "cmd": "end" }))?;
    Ok(Measured {
        retransmits: after.retransmits - before.retransmits,
        timeouts: after.timeouts - before.timeouts,
        ..m
    })
}
