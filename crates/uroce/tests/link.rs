//! The same-host shared-memory link (`io::link`): devices of one user on
//! one host exchange their packets through shared rings instead of UDP —
//! in one process and between processes — and fall back to UDP for a peer
//! of another user, with `UROCE_LINK=udp`, and when the peer dies (whose
//! QPs then time out as over UDP).

mod common;
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
    Some((s.medium == "shm", s.counters.into_iter().collect()))
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
        assert!(t.elapsed() < Duration::from_secs(5), "no link within 5 s: {:?}", a.ctx.link_stats());
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

    // The capture has every packet a sent and received, by either medium.
    let (_, all) = counters(&a.ctx, &b.ctx).unwrap();
    drop((a, b));
    let mut f = Vec::new();
    std::fs::File::open(&pcap).unwrap().read_to_end(&mut f).unwrap();
    let mut records = 0u64;
    let mut at = 24;
    while at + 16 <= f.len() {
        let incl = u32::from_le_bytes(f[at + 8..at + 12].try_into().unwrap()) as usize;
        at += 16 + incl;
        records += 1;
    }
    let sent_received: u64 =
        ["shm_tx_packets", "shm_rx_packets", "udp_tx_packets", "udp_rx_packets"].iter().map(|k| all[k]).sum();
    assert!(records >= sent_received, "{records} packets captured, {sent_received} sent and received");
    let _ = std::fs::remove_file(&pcap);
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

#[test]
fn kill_9_of_a_linked_peer_mid_transfer_gives_retry_exceeded() {
    if link_off() {
        skip!("UROCE_LINK=udp turns the link off");
    }
    // Retry budget: 3 retries of 4.096 µs × 2^12 ≈ 17 ms each.
    let env = [("UROCE_PEER_BW_MS", "20000"), ("UROCE_PEER_TIMEOUT", "12"), ("UROCE_PEER_RETRY", "3")];
    let (mut server, client, _) = spawn_pair(3, &env, false);
    // Wait until the stream runs (the server has verified the first WRITE).
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
    let env = [("UROCE_PEER_BW_MS", "20000"), ("UROCE_PEER_TIMEOUT", "12"), ("UROCE_PEER_RETRY", "3")];
    let (mut server, client, _) = spawn_pair(4, &env, false);
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
