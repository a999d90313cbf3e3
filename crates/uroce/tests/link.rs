//! The same-host shared-memory link (`io::link`): devices of one user on
//! one host exchange their packets through shared rings instead of UDP —
//! in one process and between processes — and fall back to UDP for a peer
//! of another user, with `UROCE_LINK=udp`, and when the peer dies (whose
//! QPs then time out as over UDP), and use both media at once: memory to a
//! same-host peer, UDP to a peer in another network namespace.

mod common;
// netns brings its own copy of skip (for the tests that use only it).
#[allow(clippy::duplicate_mod)]
mod netns;
#[macro_use]
mod skip;

use common::*;
use std::collections::BTreeMap;
use std::io::Read;
use std::os::unix::process::CommandExt;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};
use uroce::verbs::*;

const PEER: &str = env!("CARGO_BIN_EXE_uroce-rc-peer");

fn link_off() -> bool {
    std::env::var("UROCE_LINK").is_ok_and(|v| v == "udp" || v == "off")
}

/// `ctx`'s counters for its peer `peer`, and whether it is linked.
fn counters(ctx: &Context, peer: &Context) -> Option<(bool, BTreeMap<&'static str, u64>)> {
    let s = ctx.link_stats().into_iter().find(|s| s.peer == peer.local_addr())?;
    Some((s.medium == uroce::verbs::LinkMedium::Shm, s.counters.into_iter().collect()))
}

/// WRITEs `len` bytes a -> b and checks them.
fn write_and_check(a: &End, b: &End, len: usize, seed: u8) {
    let rw = Access::LOCAL_WRITE | Access::REMOTE_WRITE | Access::REMOTE_READ;
    let src: Vec<u8> = (0..len).map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed)).collect();
    let a_mr = a.pd.register(src.clone(), rw).unwrap();
    let b_mr = b.pd.register(vec![0u8; len], rw).unwrap();
    let mut w = wr(seed as u64, WrOpcode::RdmaWrite, a_mr.sge(0, len as u32));
    w.remote_addr = b_mr.iova();
    w.rkey = b_mr.rkey();
    a.qp.post_send(&w).unwrap();
    let wc = a.cq.wait(1, T).unwrap()[0];
    assert_eq!(wc.status, WcStatus::Success);
    assert_eq!(b_mr.to_vec(), src);
}

#[test]
fn two_devices_of_one_process_link_and_captures_see_every_packet() {
    if link_off() {
        skip!("UROCE_LINK=udp turns the link off");
    }
    let pcap = std::env::temp_dir().join(format!("uroce-link-test-{}.pcap", std::process::id()));
    let _ = std::fs::remove_file(&pcap);
    let (a, b) = connected(Some(pcap.clone()));
    // The first packets to a new peer go by UDP while the link is made.
    write_and_check(&a, &b, 100, 1);
    let t = Instant::now();
    while !counters(&a.ctx, &b.ctx).is_some_and(|(l, _)| l) || !counters(&b.ctx, &a.ctx).is_some_and(|(l, _)| l) {
        assert!(t.elapsed() < Duration::from_secs(60), "no link within 60 s: {:?}", a.ctx.link_stats());
        write_and_check(&a, &b, 100, 2);
        std::thread::sleep(Duration::from_millis(10));
    }
    let (_, before) = counters(&a.ctx, &b.ctx).unwrap();
    write_and_check(&a, &b, 300_000, 3);
    let (linked, after) = counters(&a.ctx, &b.ctx).unwrap();
    assert!(linked);
    let shm = after["shm_tx_packets"] - before["shm_tx_packets"];
    assert!(shm >= 300_000 / 4096, "the WRITE's packets went by memory: {after:?}");
    assert_eq!(after["udp_tx_packets"], before["udp_tx_packets"], "none by UDP once linked");
    let (_, b_side) = counters(&b.ctx, &a.ctx).unwrap();
    assert!(b_side["shm_rx_packets"] >= shm, "b received them from its ring: {b_side:?}");
    assert!(b_side["shm_tx_packets"] > 0, "b's ACKs went back by memory");

    // The capture has every packet a sent and received, by either medium
    // (its writer is a thread of its own: wait for it, however loaded the
    // machine).
    let (_, all) = counters(&a.ctx, &b.ctx).unwrap();
    let sent_received: u64 =
        ["shm_tx_packets", "shm_rx_packets", "udp_tx_packets", "udp_rx_packets"].iter().map(|k| all[k]).sum();
    let t = Instant::now();
    loop {
        a.ctx.flush_capture();
        b.ctx.flush_capture();
        let records = pcap_records(&pcap);
        if records >= sent_received {
            break;
        }
        assert!(t.elapsed() < Duration::from_secs(60), "{records} packets captured, {sent_received} sent and received");
        std::thread::sleep(Duration::from_millis(10));
    }
    drop((a, b));
    let _ = std::fs::remove_file(&pcap);
}

/// The records of a pcap file (as far as they are whole).
fn pcap_records(pcap: &std::path::Path) -> u64 {
    let mut f = Vec::new();
    std::fs::File::open(pcap).unwrap().read_to_end(&mut f).unwrap();
    let (mut records, mut at) = (0, 24);
    while at + 16 <= f.len() {
        let incl = u32::from_le_bytes(f[at + 8..at + 12].try_into().unwrap()) as usize;
        at += 16 + incl;
        records += u64::from(at <= f.len());
    }
    records
}

/// A server and a client `uroce-rc-peer`, each with its own address; the
/// client's `extra` environment, and a `pre_exec` for it.
fn spawn_pair(tag: u16, client_env: &[(&str, &str)], as_nobody: bool) -> (Child, Child, u16) {
    let tcp = 40000 + (std::process::id() % 10000) as u16 + tag * 7;
    let server = Command::new(PEER)
        .args(["--server", &tcp.to_string()])
        .env("UROCE_ADDR", "127.0.0.21")
        .env("UROCE_PORT", (tcp + 1).to_string())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut c = Command::new(PEER);
    c.args(["--client", &format!("127.0.0.1:{tcp}")])
        .env("UROCE_ADDR", "127.0.0.22")
        .env("UROCE_PORT", (tcp + 1).to_string())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    for (k, v) in client_env {
        c.env(k, v);
    }
    if as_nobody {
        c.env("UROCE_RUNTIME_DIR", "/tmp/uroce-65534-link-test").env_remove("XDG_RUNTIME_DIR");
        // SAFETY: only async-signal-safe calls between fork and exec.
        unsafe {
            c.pre_exec(|| {
                if libc::setgid(65534) != 0 || libc::setuid(65534) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
    }
    (server, c.spawn().unwrap(), tcp)
}

/// Waits for `c` (at most `limit`); its exit success, stdout and stderr.
fn finish(mut c: Child, limit: Duration) -> (bool, String, String) {
    let t = Instant::now();
    let ok = loop {
        if let Some(s) = c.try_wait().unwrap() {
            break s.success();
        }
        if t.elapsed() > limit {
            let _ = c.kill();
            let _ = c.wait();
            break false;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let (mut out, mut err) = (String::new(), String::new());
    c.stdout.take().unwrap().read_to_string(&mut out).unwrap();
    c.stderr.take().unwrap().read_to_string(&mut err).unwrap();
    (ok, out, err)
}

/// The counter `key` of the printed link lines (`<who>: link to … by
/// <medium> … key=N`), summed, and whether any says `by shm`.
fn printed(out: &str, key: &str) -> (u64, bool) {
    let mut sum = 0;
    let mut shm = false;
    for l in out.lines().filter(|l| l.contains(": link to ")) {
        shm |= l.contains(" by shm ");
        for w in l.split_whitespace() {
            if let Some(v) = w.strip_prefix(&format!("{key}=")) {
                sum += v.parse::<u64>().unwrap();
            }
        }
    }
    (sum, shm)
}

#[test]
fn two_processes_link_and_verify_their_data() {
    if link_off() {
        skip!("UROCE_LINK=udp turns the link off");
    }
    let (server, client, _) = spawn_pair(0, &[("UROCE_PEER_OPS", "300")], false);
    let (ok, out, err) = finish(client, Duration::from_secs(60));
    let (sok, sout, serr) = finish(server, Duration::from_secs(10));
    assert!(ok && sok, "client:\n{out}{err}\nserver:\n{sout}{serr}");
    let (shm_tx, linked) = printed(&out, "shm_tx_packets");
    assert!(linked && shm_tx > 300, "the client's packets went by memory:\n{out}");
    let (shm_rx, linked) = printed(&sout, "shm_rx_packets");
    assert!(linked && shm_rx > 300, "the server received by memory:\n{sout}");
    let (pid_line, _) = (sout.lines().find(|l| l.contains(": link to ")).unwrap_or(""), ());
    assert!(pid_line.contains("pid Some("), "the peer's pid is recorded: {pid_line}");
}

#[test]
fn uroce_link_udp_turns_the_link_off() {
    let (server, client, _) = spawn_pair(1, &[("UROCE_LINK", "udp")], false);
    let (ok, out, err) = finish(client, Duration::from_secs(60));
    let (sok, sout, serr) = finish(server, Duration::from_secs(10));
    assert!(ok && sok, "client:\n{out}{err}\nserver:\n{sout}{serr}");
    assert!(!out.contains(": link to "), "no link state at all with UROCE_LINK=udp:\n{out}");
    let (shm, linked) = printed(&sout, "shm_rx_packets");
    assert!(!linked && shm == 0, "the server got nothing by memory:\n{sout}");
}

#[test]
fn a_peer_of_another_user_is_not_linked() {
    if link_off() {
        skip!("UROCE_LINK=udp turns the link off");
    }
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        skip!("needs root to run the peer as another uid");
    }
    let (server, client, _) = spawn_pair(2, &[], true);
    let (ok, out, err) = finish(client, Duration::from_secs(60));
    let (sok, sout, serr) = finish(server, Duration::from_secs(10));
    let _ = std::fs::remove_dir_all("/tmp/uroce-65534-link-test");
    if !ok && err.contains("Permission denied") && !err.contains("uroce-rc-peer:") {
        skip!("uid 65534 cannot run the test binary: {err}");
    }
    assert!(ok && sok, "data verified over UDP:\nclient:\n{out}{err}\nserver:\n{sout}{serr}");
    let (shm, linked) = printed(&sout, "shm_rx_packets");
    assert!(!linked && shm == 0, "nothing by memory from another user:\n{sout}");
    let (udp, _) = printed(&sout, "udp_tx_packets");
    assert!(udp > 0, "the server answered by UDP:\n{sout}");
}

/// A linked pair (`spawn_pair` number `n`) streaming 1 MiB WRITEs for 20 s,
/// with a small retry budget (3 retries of 4.096 µs × 2^12 ≈ 17 ms each),
/// returned once the stream runs: the server has verified the first WRITE.
fn streaming_pair(n: u16) -> (Child, Child) {
    let env = [("UROCE_PEER_BW_MS", "20000"), ("UROCE_PEER_TIMEOUT", "12"), ("UROCE_PEER_RETRY", "3")];
    let (mut server, client, _) = spawn_pair(n, &env, false);
    let mut so = server.stdout.take().unwrap();
    let mut seen = Vec::new();
    let t = Instant::now();
    while !String::from_utf8_lossy(&seen).contains("1 MiB RDMA WRITE verified") {
        assert!(t.elapsed() < Duration::from_secs(30), "the server never got the WRITE");
        let mut b = [0u8; 256];
        let n = so.read(&mut b).unwrap();
        assert!(n > 0, "server ended early: {}", String::from_utf8_lossy(&seen));
        seen.extend_from_slice(&b[..n]);
    }
    std::thread::sleep(Duration::from_millis(300));
    (server, client)
}

#[test]
fn kill_9_of_a_linked_peer_mid_transfer_gives_retry_exceeded() {
    if link_off() {
        skip!("UROCE_LINK=udp turns the link off");
    }
    let (mut server, client) = streaming_pair(3);
    // SAFETY: kill of our own child by its pid.
    unsafe { libc::kill(server.id() as i32, libc::SIGKILL) };
    let killed = Instant::now();
    let _ = server.wait();
    let (ok, out, err) = finish(client, Duration::from_secs(30));
    let took = killed.elapsed();
    assert!(!ok, "the client cannot succeed with its peer gone:\n{out}{err}");
    assert!(err.contains("RetryExc"), "the survivor's WRITE failed with RETRY_EXC_ERR:\n{out}{err}");
    assert!(took < Duration::from_secs(5), "within the retry budget (took {took:?})");
}

/// Resident memory of process `pid` in KiB (0 once it is gone).
fn rss_kib(pid: u32) -> u64 {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    s.lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap_or(0)
}

#[test]
fn a_stopped_peer_fills_its_ring_then_the_survivor_times_out_without_growing() {
    if link_off() {
        skip!("UROCE_LINK=udp turns the link off");
    }
    let (mut server, client) = streaming_pair(4);
    // SAFETY: signals to our own child by its pid.
    unsafe { libc::kill(server.id() as i32, libc::SIGSTOP) };
    let stopped = Instant::now();
    let rss_at_stop = rss_kib(client.id());
    let mut peak = rss_at_stop;
    let mut client = client;
    while client.try_wait().unwrap().is_none() && stopped.elapsed() < Duration::from_secs(10) {
        peak = peak.max(rss_kib(client.id()));
        std::thread::sleep(Duration::from_millis(10));
    }
    let took = stopped.elapsed();
    let (ok, out, err) = finish(client, Duration::from_secs(5));
    // SAFETY: as above.
    unsafe { libc::kill(server.id() as i32, libc::SIGKILL) };
    let _ = server.wait();
    assert!(!ok, "the client cannot succeed with its peer stopped:\n{out}{err}");
    assert!(err.contains("RetryExc"), "the survivor's WRITE failed with RETRY_EXC_ERR:\n{out}{err}");
    assert!(took < Duration::from_secs(5), "within the retry budget (took {took:?})");
    assert!(peak < rss_at_stop + 32 * 1024, "no memory growth while the peer is stopped: {rss_at_stop} -> {peak} KiB");
}

/// Runs `f` on a thread that entered the network namespace `ns` (made by
/// `ip netns add`): a device opened there binds its socket in it.
fn in_netns<R: Send + 'static>(ns: &str, f: impl FnOnce() -> R + Send + 'static) -> R {
    let path = format!("/run/netns/{ns}");
    std::thread::spawn(move || {
        let f_ns = std::fs::File::open(&path).unwrap();
        // SAFETY: setns on a descriptor we own; it changes only this
        // thread's network namespace.
        let rc = unsafe { libc::setns(std::os::fd::AsRawFd::as_raw_fd(&f_ns), libc::CLONE_NEWNET) };
        assert_eq!(rc, 0, "setns {path}: {}", std::io::Error::last_os_error());
        f()
    })
    .join()
    .unwrap()
}

/// One QP of `x` connected to `peer`'s QP.
fn qp_to(x: &End, peer: &End, psn: u32) -> QueuePair {
    let qp = x.pd.create_qp(&QpInitAttr::rc(&x.cq, &x.cq)).unwrap();
    qp.connect_rc(&peer.ctx.query_gid(0).unwrap(), peer.qp.qp_num(), psn, psn + 1).unwrap();
    peer.qp.connect_rc(&x.ctx.query_gid(0).unwrap(), qp.qp_num(), psn + 1, psn).unwrap();
    qp
}

#[test]
fn one_device_uses_memory_to_a_same_host_peer_and_udp_to_a_namespace_peer_at_once() {
    if link_off() {
        skip!("UROCE_LINK=udp turns the link off");
    }
    // x (10.77.71.1) and y (10.77.71.3) share namespace a; z (10.77.71.2)
    // is in namespace b, behind the veth pair.
    let Some(p) = netns::Pair::new("mixed", "mx", 71, None) else { return };
    assert!(netns::sh(&["ip", "-n", &p.a, "addr", "add", "10.77.71.3/24", "dev", &p.va]));
    let open = |name: &str, ip: [u8; 4]| {
        let cfg = DeviceConfig::at(name, std::net::IpAddr::from(ip), 4791);
        end(Context::open(&cfg).unwrap())
    };
    let (x, y) = in_netns(&p.a, move || (open("mixed-x", [10, 77, 71, 1]), open("mixed-y", [10, 77, 71, 3])));
    let z = in_netns(&p.b, move || open("mixed-z", [10, 77, 71, 2]));
    let (to_y, to_z) = (qp_to(&x, &y, 1000), qp_to(&x, &z, 2000));

    const LEN: usize = 256 * 1024;
    let rw = Access::LOCAL_WRITE | Access::REMOTE_WRITE | Access::REMOTE_READ;
    let (y_mr, z_mr) = (y.pd.register(vec![0u8; LEN], rw).unwrap(), z.pd.register(vec![0u8; LEN], rw).unwrap());
    let src: Vec<u8> = (0..2 * LEN).map(|i| (i as u32).wrapping_mul(2654435761).to_be_bytes()[1]).collect();
    let x_mr = x.pd.register(src.clone(), rw).unwrap();
    // A WRITE to each peer, both in flight at once; both verified.
    let round = |n: usize| {
        let off = n % LEN;
        for (i, (qp, mr)) in [(&to_y, &y_mr), (&to_z, &z_mr)].into_iter().enumerate() {
            let mut w = wr(i as u64, WrOpcode::RdmaWrite, x_mr.sge(off, LEN as u32));
            w.remote_addr = mr.iova();
            w.rkey = mr.rkey();
            qp.post_send(&w).unwrap();
        }
        let mut got = Vec::new();
        let t = Instant::now();
        while got.len() < 2 {
            assert!(t.elapsed() < T, "round {n}: completions {got:?}");
            got.extend(x.cq.wait(2 - got.len(), T).unwrap());
        }
        assert!(got.iter().all(|wc| wc.status == WcStatus::Success), "round {n}: {got:?}");
        assert!(y_mr.to_vec() == src[off..off + LEN], "round {n}: the same-host peer's data");
        assert!(z_mr.to_vec() == src[off..off + LEN], "round {n}: the namespace peer's data");
    };
    // The first packets to y go by UDP while the link is made.
    round(0);
    let t = Instant::now();
    while !counters(&x.ctx, &y.ctx).is_some_and(|(l, _)| l) {
        assert!(t.elapsed() < Duration::from_secs(5), "no link to y within 5 s: {:?}", x.ctx.link_stats());
        round(1);
        std::thread::sleep(Duration::from_millis(10));
    }
    let (_, y0) = counters(&x.ctx, &y.ctx).unwrap();
    let z0 = counters(&x.ctx, &z.ctx).map(|(_, c)| c).unwrap_or_default();
    for n in 0..16 {
        round(1 + n * 4099);
    }
    let (y_linked, y1) = counters(&x.ctx, &y.ctx).unwrap();
    let (z_linked, z1) = counters(&x.ctx, &z.ctx).expect("x counts its traffic to z");
    assert!(y_linked, "x reaches y by memory: {:?}", x.ctx.link_stats());
    assert!(!z_linked, "x reaches z (another namespace) by UDP: {:?}", x.ctx.link_stats());
    let per_write = (LEN / 1024) as u64;
    assert!(y1["shm_tx_packets"] - y0["shm_tx_packets"] >= 16 * per_write, "to y by memory: {y1:?}");
    assert_eq!(y1["udp_tx_packets"], y0["udp_tx_packets"], "nothing to y by UDP once linked: {y1:?}");
    assert!(z1["udp_tx_packets"] - z0.get("udp_tx_packets").unwrap_or(&0) >= 16 * per_write, "to z by UDP: {z1:?}");
    assert_eq!(z1["shm_tx_packets"], 0, "nothing to z by memory: {z1:?}");
    let (_, z_side) = counters(&z.ctx, &x.ctx).expect("z counts its traffic from x");
    assert!(
        z_side["udp_rx_packets"] >= 16 * per_write && z_side["shm_rx_packets"] == 0,
        "z got x's packets by UDP: {z_side:?}"
    );
    drop((to_y, to_z, x_mr, y_mr, z_mr));
    drop((x, y, z));
}
