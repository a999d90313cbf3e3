//! Attacks on the same-host link (`io::link`) by a hostile process of the
//! same user, each scripted against a victim device that keeps streaming
//! to a legitimate linked peer throughout: a hello that claims another
//! device's address, a fake socket that answers for one, a doorbell that
//! would block (an eventfd at its maximum, a full datagram queue made
//! blocking), a fake socket that never accepts, a stopped peer, and 1 500
//! link attempts; and a socket file a killed process left is reaped. The attacker is this test binary run again
//! (`attacker`, ignored unless a test starts it).

mod common;
#[macro_use]
mod skip;

use common::*;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};
use uroce::io::link::discovery;
use uroce::io::link::ring::{Geometry, RingMem};
use uroce::verbs::*;

/// Longest one 64 KiB WRITE of the legitimate pair may take while an
/// attack runs (it takes microseconds; before the fixes, forever).
const LIMIT: Duration = Duration::from_secs(3);

fn link_off() -> bool {
    std::env::var("UROCE_LINK").is_ok_and(|v| v == "udp" || v == "off")
}

fn port() -> u16 {
    34000 + (std::process::id() % 3000) as u16
}

fn addr(net: u8, host: u8) -> SocketAddr {
    SocketAddr::new(IpAddr::V4(Ipv4Addr::new(127, 0, net, host)), port())
}

fn open(net: u8, host: u8) -> End {
    let a = addr(net, host);
    end(Context::open(&DeviceConfig::at(&format!("atk-{net}-{host}"), a.ip(), a.port())).unwrap())
}

/// `ctx`'s per-peer view of `peer`: linked (pid) or not, and counters.
fn view(ctx: &Context, peer: SocketAddr) -> Option<(Option<u32>, std::collections::BTreeMap<&'static str, u64>)> {
    let s = ctx.link_stats().into_iter().find(|s| s.peer == peer)?;
    Some((s.pid.filter(|_| s.medium == uroce::verbs::LinkMedium::Shm), s.counters.into_iter().collect()))
}

/// The link's device-wide counter `key` of `ctx`.
fn total(ctx: &Context, key: &str) -> u64 {
    ctx.medium_counters()
        .into_iter()
        .filter(|(m, _)| *m == "shm")
        .flat_map(|(_, c)| c)
        .find(|(k, _)| *k == key)
        .map_or(0, |(_, v)| v)
}

/// Link attempts `ctx` refused, for any reason (a claim refused too: the
/// victim's reads of the UDP table can miss the attacker's bound socket, see
/// `discovery::owns_udp`).
fn refused(ctx: &Context) -> u64 {
    ["links_refused_cap", "links_refused_bad", "links_refused_claim"].iter().map(|k| total(ctx, k)).sum()
}

/// Waits (10 s at most) until `ctx`'s link counter `key` is at least `min`
/// (the victim counts a refusal just after the attacker sees it).
fn wait_total(ctx: &Context, key: &str, min: u64) -> bool {
    let t = Instant::now();
    while total(ctx, key) < min {
        if t.elapsed() > Duration::from_secs(10) {
            return false;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    true
}

/// WRITEs 64 KiB a -> b over `qp` and checks them, within LIMIT.
fn write_and_check(a: &End, qp: &QueuePair, b: &End, seed: u8) {
    const LEN: usize = 64 * 1024;
    let rw = Access::LOCAL_WRITE | Access::REMOTE_WRITE | Access::REMOTE_READ;
    let src: Vec<u8> = (0..LEN).map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed)).collect();
    let a_mr = a.pd.register(src.clone(), rw).unwrap();
    let b_mr = b.pd.register(vec![0u8; LEN], rw).unwrap();
    let mut w = wr(seed as u64, WrOpcode::RdmaWrite, a_mr.sge(0, LEN as u32));
    w.remote_addr = b_mr.iova();
    w.rkey = b_mr.rkey();
    let t = Instant::now();
    qp.post_send(&w).unwrap();
    let wc = a.cq.wait(1, LIMIT).unwrap();
    assert!(!wc.is_empty(), "a WRITE took longer than {LIMIT:?}: the victim stalled");
    assert_eq!(wc[0].status, WcStatus::Success);
    assert!(t.elapsed() < LIMIT, "a WRITE took {:?}", t.elapsed());
    assert_eq!(b_mr.to_vec(), src);
}

/// One QP of `x` connected to `peer`'s QP.
fn qp_to(x: &End, peer: &End, psn: u32) -> QueuePair {
    let qp = x.pd.create_qp(&QpInitAttr::rc(&x.cq, &x.cq)).unwrap();
    qp.connect_rc(&peer.ctx.query_gid(0).unwrap(), peer.qp.qp_num(), psn, psn + 1).unwrap();
    peer.qp.connect_rc(&x.ctx.query_gid(0).unwrap(), qp.qp_num(), psn + 1, psn).unwrap();
    qp
}

/// The victim v (127.0.net.1) and its legitimate peer w (127.0.net.2),
/// linked: v's QP to w is returned.
fn linked_pair(net: u8) -> (End, End, QueuePair) {
    let (v, w) = (open(net, 1), open(net, 2));
    let qp = qp_to(&v, &w, 100);
    let t = Instant::now();
    let mut seed = 0u8;
    while view(&v.ctx, addr(net, 2)).is_none_or(|(pid, _)| pid.is_none()) {
        assert!(t.elapsed() < Duration::from_secs(10), "no legitimate link: {:?}", v.ctx.link_stats());
        seed = seed.wrapping_add(1);
        write_and_check(&v, &qp, &w, seed);
        std::thread::sleep(Duration::from_millis(10));
    }
    (v, w, qp)
}

/// The legitimate pair streams `n` WRITEs, by memory.
fn stream(v: &End, qp: &QueuePair, w: &End, n: usize) {
    let before = view(&v.ctx, w.ctx.local_addr()).unwrap().1["shm_tx_packets"];
    for i in 0..n {
        write_and_check(v, qp, w, i as u8);
    }
    let (pid, c) = view(&v.ctx, w.ctx.local_addr()).unwrap();
    assert_eq!(pid, Some(std::process::id()), "v's link to w is with this process");
    assert!(c["shm_tx_packets"] >= before + n as u64, "the stream went by memory: {c:?}");
}

/// The attacking process: this binary's `attacker` with `spec`; its
/// stdout lines come through a channel.
struct Attacker {
    child: Child,
    lines: mpsc::Receiver<String>,
}

impl Attacker {
    fn start(spec: &str) -> Attacker {
        Attacker::start_in(spec, None)
    }

    /// As `start`, with `UROCE_RUNTIME_DIR` set to `runtime` if given.
    fn start_in(spec: &str, runtime: Option<&std::path::Path>) -> Attacker {
        let mut cmd = Command::new(std::env::current_exe().unwrap());
        if let Some(r) = runtime {
            cmd.env("UROCE_RUNTIME_DIR", r);
        }
        let mut child = cmd
            .args(["--ignored", "--exact", "attacker", "--nocapture", "--test-threads=1"])
            .env("UROCE_TEST_ATTACK", spec)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap();
        let out = child.stdout.take().unwrap();
        let (tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for l in BufReader::new(out).lines() {
                let Ok(l) = l else { break };
                if tx.send(l).is_err() {
                    break;
                }
            }
        });
        Attacker { child, lines }
    }

    /// The first line that has `prefix`, from there on (within 60 s).
    fn said(&self, prefix: &str) -> String {
        let t = Instant::now();
        loop {
            let left = Duration::from_secs(60).saturating_sub(t.elapsed());
            match self.lines.recv_timeout(left) {
                // The harness may print its own words before ours.
                Ok(l) if l.contains(prefix) => return l[l.find(prefix).unwrap()..].to_string(),
                Ok(_) => {}
                Err(e) => panic!("the attacker never said {prefix:?}: {e}"),
            }
        }
    }

    /// Its `attacker-answers` line (within 120 s), running `meanwhile`
    /// (the legitimate pair streams while the attempts come) until it comes.
    fn answers_while(&self, mut meanwhile: impl FnMut()) -> String {
        let t = Instant::now();
        loop {
            meanwhile();
            if let Ok(l) = self.lines.try_recv() {
                if let Some(at) = l.find("attacker-answers") {
                    return l[at..].to_string();
                }
            }
            assert!(t.elapsed() < Duration::from_secs(120), "the attacker never finished");
        }
    }

    fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Lets it exit (it waits for its stdin to close), within 10 s.
    fn finish(mut self) {
        drop(self.child.stdin.take());
        let t = Instant::now();
        while self.child.try_wait().unwrap().is_none() {
            if t.elapsed() > Duration::from_secs(10) {
                let _ = self.child.kill();
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}

impl Drop for Attacker {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A value of a `key=N` word in `line`.
fn field(line: &str, key: &str) -> u64 {
    line.split_whitespace().find_map(|w| w.strip_prefix(&format!("{key}="))?.parse().ok()).unwrap()
}

#[test]
fn a_claim_of_another_devices_address_is_refused_both_ways() {
    if link_off() {
        skip!("UROCE_LINK=udp turns the link off");
    }
    let (v, w, qp) = linked_pair(81);
    // A hello to v claiming w's address, as the attacker: refused, and v's
    // traffic to w stays on the legitimate link.
    let a = Attacker::start(&format!("link,{},{},dgram,0,1", v.ctx.local_addr(), w.ctx.local_addr()));
    let answers = a.said("attacker-answers");
    assert_eq!(field(&answers, "ok"), 0, "the claim was answered: {answers}");
    assert!(wait_total(&v.ctx, "links_refused_claim", 1), "counted: {:?}", v.ctx.medium_counters());
    stream(&v, &qp, &w, 20);
    a.finish();

    // A socket advertised for u's address by the attacker (which answers
    // every hello): v does not link to it; u gets v's traffic by UDP.
    let u_addr = addr(81, 3);
    let a = Attacker::start(&format!("answer,{u_addr}"));
    a.said("attacker-ready");
    let u = open(81, 3); // its own advertisement is taken: UDP only
    let to_u = qp_to(&v, &u, 300);
    let refused = total(&v.ctx, "links_refused_claim");
    for i in 0..10 {
        write_and_check(&v, &to_u, &u, i);
    }
    let t = Instant::now();
    while total(&v.ctx, "links_refused_claim") <= refused {
        assert!(t.elapsed() < Duration::from_secs(10), "v never tried the fake: {:?}", v.ctx.medium_counters());
        write_and_check(&v, &to_u, &u, 7);
    }
    let (pid, c) = view(&v.ctx, u_addr).unwrap();
    assert_eq!(pid, None, "v is not linked to the attacker ({}): {c:?}", a.pid());
    assert_eq!(c["shm_tx_packets"], 0, "nothing for u went to the attacker: {c:?}");
    assert!(c["udp_tx_packets"] > 0, "u got it by UDP: {c:?}");
    stream(&v, &qp, &w, 20);
}

#[test]
fn a_doorbell_that_would_block_does_not_freeze_the_victim() {
    if link_off() {
        skip!("UROCE_LINK=udp turns the link off");
    }
    let (v, w, qp) = linked_pair(82);
    // An eventfd at its maximum counter, blocking: not a doorbell.
    let own = addr(82, 5);
    let a = Attacker::start(&format!("link,{},{own},eventfd-max,1,1", v.ctx.local_addr()));
    let answers = a.said("attacker-answers");
    assert_eq!(field(&answers, "ok"), 0, "an eventfd doorbell was accepted: {answers}");
    assert!(wait_total(&v.ctx, "links_refused_bad", 1), "counted: {:?}", v.ctx.medium_counters());
    a.finish();

    // A datagram doorbell whose queue is full and made blocking, on a
    // link whose consumer sleeps: v rings it on every publish.
    let own = addr(82, 6);
    let a = Attacker::start(&format!("link,{},{own},dgram-full,1,1", v.ctx.local_addr()));
    let answers = a.said("attacker-answers");
    assert_eq!(field(&answers, "ok"), 1, "the attacker's own address links: {answers}");
    // Its own CQ: its WRITE ends in RETRY_EXC_ERR, away from the stream's.
    let fake_cq = v.ctx.create_cq(16, None).unwrap();
    let fake = v.pd.create_qp(&QpInitAttr::rc(&fake_cq, &fake_cq)).unwrap();
    let gid = Gid::from_ip(own.ip());
    fake.connect_rc(&gid, 0x77, 1, 1).unwrap();
    let rw = Access::LOCAL_WRITE | Access::REMOTE_WRITE | Access::REMOTE_READ;
    let mr = v.pd.register(vec![1u8; 256 * 1024], rw).unwrap();
    let mut wr_fake = wr(99, WrOpcode::RdmaWrite, mr.sge(0, 256 * 1024));
    wr_fake.remote_addr = 0x1000;
    wr_fake.rkey = 1;
    fake.post_send(&wr_fake).unwrap();
    let t = Instant::now();
    while view(&v.ctx, own).is_none_or(|(_, c)| c["shm_tx_packets"] == 0) {
        assert!(t.elapsed() < Duration::from_secs(10), "v sent nothing by the link: {:?}", v.ctx.link_stats());
        std::thread::sleep(Duration::from_millis(5));
    }
    let (pid, c) = view(&v.ctx, own).unwrap();
    assert_eq!(pid, Some(a.pid()), "linked to the attacker: {c:?}");
    stream(&v, &qp, &w, 30);
    a.finish();
}

#[test]
fn a_fake_socket_that_never_accepts_and_a_stopped_peer_do_not_stall_traffic() {
    if link_off() {
        skip!("UROCE_LINK=udp turns the link off");
    }
    let (v, w, qp) = linked_pair(83);
    // u's name is taken by a socket that never accepts.
    let u_addr = addr(83, 3);
    let fake = Attacker::start(&format!("listen,{u_addr}"));
    fake.said("attacker-ready");
    let u = open(83, 3);
    let to_u = qp_to(&v, &u, 300);
    // s is a real device whose process is stopped.
    let s_addr = addr(83, 4);
    let s = Attacker::start(&format!("device,{s_addr}"));
    s.said("attacker-ready");
    // SAFETY: a signal to our own child.
    unsafe { libc::kill(s.pid() as i32, libc::SIGSTOP) };
    let t = Instant::now();
    while !std::fs::read_to_string(format!("/proc/{}/status", s.pid())).unwrap_or_default().contains("State:\tT") {
        assert!(t.elapsed() < Duration::from_secs(10), "the peer did not stop");
        std::thread::sleep(Duration::from_millis(5));
    }
    // Its backlog filled (connections nobody accepts), as a stopped peer's
    // fills with time: a connect that waited would wait for good.
    let (dir, s_name) = links_dir_name(s_addr);
    let mut filler = Vec::new();
    while let Ok(c) = discovery::connect(&dir, &s_name, Duration::from_secs(1)) {
        filler.push(c);
        assert!(filler.len() < 1000, "the stopped peer's backlog never filled");
    }
    // Its own CQ: its WRITE ends in RETRY_EXC_ERR, away from the stream's.
    let s_cq = v.ctx.create_cq(16, None).unwrap();
    let to_s = v.pd.create_qp(&QpInitAttr::rc(&s_cq, &s_cq)).unwrap();
    to_s.connect_rc(&Gid::from_ip(s_addr.ip()), 0x55, 1, 1).unwrap();
    let rw = Access::LOCAL_WRITE | Access::REMOTE_WRITE | Access::REMOTE_READ;
    let mr = v.pd.register(vec![1u8; 64 * 1024], rw).unwrap();
    let mut ws = wr(98, WrOpcode::RdmaWrite, mr.sge(0, 64 * 1024));
    ws.remote_addr = 0x1000;
    ws.rkey = 1;
    to_s.post_send(&ws).unwrap();
    let t = Instant::now();
    while t.elapsed() < Duration::from_secs(3) {
        for i in 0..4 {
            write_and_check(&v, &to_u, &u, i);
        }
        stream(&v, &qp, &w, 4);
    }
    let (pid, c) = view(&v.ctx, u_addr).unwrap();
    assert_eq!(pid, None, "not linked to the fake: {c:?}");
    assert!(c["udp_tx_packets"] > 0, "u's traffic went by UDP: {c:?}");
    let s_view = view(&v.ctx, s_addr);
    assert!(s_view.as_ref().is_none_or(|(pid, _)| pid.is_none()), "linked to the stopped peer: {s_view:?}");
    assert!(wait_total(&v.ctx, "links_refused_bad", 1), "the fake's silence counted: {:?}", v.ctx.medium_counters());
    // SAFETY: as above.
    unsafe { libc::kill(s.pid() as i32, libc::SIGKILL) };
}

#[test]
fn link_attempts_beyond_the_cap_are_refused_and_reaped() {
    if link_off() {
        skip!("UROCE_LINK=udp turns the link off");
    }
    let (v, w, qp) = linked_pair(84);
    let max = total(&v.ctx, "max_links");
    let own = addr(84, 5);
    // The victim's live links with the attacker's address (the legitimate
    // pair's own count may still grow: w may link to v as v did to w).
    let links_with = |peer: SocketAddr| view(&v.ctx, peer).map_or(0, |(_, c)| c["links"]);
    let a = Attacker::start(&format!("link,{},{own},dgram,1,1500", v.ctx.local_addr()));
    let mut most = 0;
    let answers = a.answers_while(|| {
        stream(&v, &qp, &w, 2);
        most = most.max(links_with(own));
    });
    eprintln!("attacker: {answers}; victim: {:?}", v.ctx.medium_counters());
    let ok = field(&answers, "ok");
    let per_peer = uroce::io::link::PER_PEER as u64;
    assert!(ok <= per_peer, "at most {per_peer} links for one address: {answers}");
    most = most.max(links_with(own));
    assert!(most <= per_peer, "the victim held {most} links with {own} at once: {answers}");
    // (An answer the attacker stopped waiting for is "silent" to it.)
    let made = || view(&v.ctx, own).map_or(0, |(_, c)| c["links_made"]);
    let silent = field(&answers, "silent");
    assert!(made() <= ok + silent, "the victim made {} links with {own}, the attacker saw {ok}: {answers}", made());
    let links = total(&v.ctx, "links");
    assert!(links <= max && links <= per_peer + ok, "{links} links (cap {max}; {ok} with the attacker)");
    let not_connected = field(&answers, "connect_failed");
    let refused = || refused(&v.ctx);
    // Every attempt that connected was refused or linked by the victim
    // (one the attacker gave up on included).
    let t = Instant::now();
    while refused() + made() + not_connected < 1500 {
        assert!(
            t.elapsed() < Duration::from_secs(10),
            "every attempt linked, refused or never connected: {answers}, {:?}",
            v.ctx.medium_counters()
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    stream(&v, &qp, &w, 20);
    // The attacker goes: its links are reaped.
    a.finish();
    let t = Instant::now();
    while links_with(own) > 0 {
        assert!(t.elapsed() < Duration::from_secs(10), "links of a gone peer kept: {:?}", v.ctx.link_stats());
        std::thread::sleep(Duration::from_millis(10));
    }
    stream(&v, &qp, &w, 10);
}

/// The device-wide cap: an attacker that owns many addresses, two links
/// each (the per-address cap), asks for more links than the device takes.
#[test]
fn links_from_many_owned_addresses_stop_at_the_device_cap() {
    if link_off() {
        skip!("UROCE_LINK=udp turns the link off");
    }
    let (v, w, qp) = linked_pair(86);
    let max = total(&v.ctx, "max_links");
    let per_peer = uroce::io::link::PER_PEER as u64;
    let addrs = (max / per_peer + 8) as u8;
    let a = Attacker::start(&format!("spread,{},{},{addrs},{per_peer}", v.ctx.local_addr(), addr(86, 100)));
    let answers = a.answers_while(|| {
        stream(&v, &qp, &w, 2);
        assert!(total(&v.ctx, "links") <= max, "over the cap: {:?}", v.ctx.medium_counters());
    });
    eprintln!("attacker: {answers}; victim: {:?}", v.ctx.medium_counters());
    let ok = field(&answers, "ok");
    // (The legitimate pair holds one at least.)
    assert!(ok < max, "{ok} links for the attacker, the device's cap is {max}: {answers}");
    assert!(total(&v.ctx, "links") <= max);
    // Every attempt that reached the victim and was not linked was refused.
    let reached = addrs as u64 * per_peer - field(&answers, "connect_failed") - field(&answers, "silent");
    let refused = || refused(&v.ctx);
    let t = Instant::now();
    while refused() + ok < reached {
        assert!(t.elapsed() < Duration::from_secs(10), "{answers}: {:?}", v.ctx.medium_counters());
        std::thread::sleep(Duration::from_millis(5));
    }
    assert!(total(&v.ctx, "links_refused_cap") > 0, "{:?}", v.ctx.medium_counters());
    stream(&v, &qp, &w, 10);
    a.finish();
}

/// In a process of its own with a runtime directory of its own: in the
/// shared one, any other device of the namespace that starts meanwhile
/// sweeps the file too, and the test would pass without the sweep.
#[test]
fn a_socket_file_left_by_a_killed_process_is_reaped() {
    if link_off() {
        skip!("UROCE_LINK=udp turns the link off");
    }
    // A new directory, 0700 from its creation (mkdir fails on anything
    // already at that path in the shared /tmp).
    let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().subsec_nanos();
    let rt = std::env::temp_dir().join(format!("uroce-sweep-test-{}-{nanos}", std::process::id()));
    std::os::unix::fs::DirBuilderExt::mode(&mut std::fs::DirBuilder::new(), 0o700).create(&rt).unwrap();
    let a = Attacker::start_in(&format!("sweep,{},{}", addr(85, 9), addr(85, 1)), Some(&rt));
    let said = a.said("attacker-sweep");
    a.finish();
    let _ = std::fs::remove_dir_all(&rt);
    assert_eq!(said, "attacker-sweep swept", "the stale socket file stays");
}

// ----- the attacking process -----

/// `magic`, the link geometry and `addr`, as `io::link` sends a hello.
fn hello(magic: &[u8; 8], addr: SocketAddr) -> Vec<u8> {
    let g = Geometry::LINK;
    let a = addr.to_string();
    let mut m = magic.to_vec();
    m.extend_from_slice(&(g.nslots as u32).to_le_bytes());
    m.extend_from_slice(&(g.slot as u32).to_le_bytes());
    m.push(a.len() as u8);
    m.extend_from_slice(a.as_bytes());
    m
}

/// A sealed memfd holding two fresh rings (consumers marked asleep).
fn rings_memfd() -> OwnedFd {
    let g = Geometry::LINK;
    let fd = discovery::sealed_memfd(2 * g.bytes()).unwrap();
    let map = discovery::Mapping::new(&fd, 2 * g.bytes()).unwrap();
    // SAFETY: the mapping holds both rings and outlives these uses.
    unsafe {
        RingMem::new(map.base(), g).unwrap().init();
        RingMem::new(map.base().add(g.bytes()), g).unwrap().init();
    }
    fd
}

/// A doorbell of `kind` to hand the victim (and what must stay open).
fn doorbell(kind: &str) -> (OwnedFd, Option<OwnedFd>) {
    match kind {
        "eventfd-max" => {
            // SAFETY: eventfd without flags: a blocking one.
            let fd = unsafe { OwnedFd::from_raw_fd(libc::eventfd(0, 0)) };
            let max: u64 = u64::MAX - 1;
            // SAFETY: writes 8 bytes from a valid u64.
            unsafe { libc::write(fd.as_raw_fd(), (&max as *const u64).cast(), 8) };
            (fd, None)
        }
        "dgram-full" => {
            let (mine, theirs) = discovery::doorbell_pair().unwrap();
            // Fill the queue through the victim's end, then make that end
            // blocking: a plain write by the victim would now wait forever.
            // SAFETY: sends one byte from a valid buffer without waiting.
            while unsafe { libc::send(theirs.as_raw_fd(), [1u8].as_ptr().cast(), 1, libc::MSG_DONTWAIT) } > 0 {}
            // SAFETY: fcntl on our descriptor.
            unsafe { libc::fcntl(theirs.as_raw_fd(), libc::F_SETFL, 0) };
            (theirs, Some(mine))
        }
        _ => {
            let (mine, theirs) = discovery::doorbell_pair().unwrap();
            (theirs, Some(mine))
        }
    }
}

fn wait_for_stdin_eof() {
    let mut b = Vec::new();
    let _ = std::io::stdin().read_to_end(&mut b);
}

fn links_dir_name(a: SocketAddr) -> (uroce::runtime::SafeDir, String) {
    (discovery::links_dir().unwrap(), discovery::socket_name(discovery::netns(), a))
}

/// `link,<victim>,<claimed>,<doorbell>,<bind 0|1>,<count>`: `count` hellos
/// to the victim claiming each of `claims` (bound first if `bind`), `batch`
/// at a time (each batch's answers awaited before the next), then
/// `answers ok=N refused=N silent=N connect_failed=N`.
fn attack_links(victim: SocketAddr, claims: &[SocketAddr], bell: &str, bind: bool, count: usize, batch: usize) {
    let _udp: Vec<_> = claims.iter().filter(|_| bind).map(|&c| std::net::UdpSocket::bind(c).unwrap()).collect();
    let (dir, name) = links_dir_name(victim);
    // Everything of a link the attacker made stays open until it goes.
    let (mut keep, mut held) = (Vec::new(), Vec::new());
    let (mut ok, mut refused, mut silent, mut connect_failed) = (0, 0, 0, 0);
    let all: Vec<SocketAddr> = claims.iter().flat_map(|&c| std::iter::repeat_n(c, count)).collect();
    for part in all.chunks(batch.max(1)) {
        let mut socks = Vec::new();
        for &claimed in part {
            // Made before connecting: the victim waits for a hello only so long.
            let (bell_fd, mine) = doorbell(bell);
            let mfd = rings_memfd();
            let (my_mark, their_mark) = discovery::mark_pair(claimed.ip()).unwrap();
            let Ok(s) = discovery::connect(&dir, &name, Duration::from_secs(1)) else {
                connect_failed += 1;
                continue;
            };
            let fds = [mfd.as_raw_fd(), bell_fd.as_raw_fd(), their_mark.as_raw_fd()];
            if discovery::send_with_fds(&s, &hello(b"UROCELK2", claimed), &fds).is_err() {
                connect_failed += 1;
                continue;
            }
            keep.push((mine, bell_fd, my_mark));
            socks.push(s);
        }
        let (o, r, q) = answers(&socks);
        (ok, refused, silent) = (ok + o, refused + r, silent + q);
        held.extend(socks);
    }
    println!("attacker-answers ok={ok} refused={refused} silent={silent} connect_failed={connect_failed}");
    std::io::stdout().flush().unwrap();
    wait_for_stdin_eof();
    drop((keep, held));
}

/// The victim's answers to the hellos sent on `socks` (10 s at most):
/// (linked, refused, no answer).
fn answers(socks: &[OwnedFd]) -> (usize, usize, usize) {
    let (mut ok, mut refused) = (0, 0);
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut undecided: Vec<&OwnedFd> = socks.iter().collect();
    while !undecided.is_empty() && Instant::now() < deadline {
        let mut fds: Vec<libc::pollfd> =
            undecided.iter().map(|s| libc::pollfd { fd: s.as_raw_fd(), events: libc::POLLIN, revents: 0 }).collect();
        // SAFETY: a valid array of its length.
        unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, 100) };
        let mut next = Vec::new();
        for (s, p) in undecided.into_iter().zip(&fds) {
            if p.revents == 0 {
                next.push(s);
                continue;
            }
            let mut b = [0u8; 96];
            match discovery::recv_with_fds(s, &mut b) {
                Ok((n, _)) if n >= 8 && &b[..8] == b"UROCEOK1" => ok += 1,
                _ => refused += 1,
            }
        }
        undecided = next;
    }
    (ok, refused, undecided.len())
}

#[test]
#[ignore = "the attacking process of the tests above: they start it"]
fn attacker() {
    let Ok(spec) = std::env::var("UROCE_TEST_ATTACK") else { return };
    let p: Vec<&str> = spec.split(',').collect();
    let a = |i: usize| p[i].parse::<SocketAddr>().unwrap();
    // SAFETY: raising our own soft descriptor limit to the hard one.
    unsafe {
        let mut r: libc::rlimit = std::mem::zeroed();
        libc::getrlimit(libc::RLIMIT_NOFILE, &mut r);
        r.rlim_cur = r.rlim_max;
        libc::setrlimit(libc::RLIMIT_NOFILE, &r);
    }
    match p[0] {
        "link" => {
            let n = p[5].parse().unwrap();
            attack_links(a(1), &[a(2)], p[3], p[4] == "1", n, n)
        }
        "listen" => {
            // Advertised, never accepting.
            let (dir, name) = links_dir_name(a(1));
            let _l = discovery::listen(&dir, &name).unwrap();
            println!("attacker-ready");
            wait_for_stdin_eof();
            let _ = dir.remove(&name);
        }
        "answer" => {
            // Advertised; answers every hello with OK and a doorbell.
            let (dir, name) = links_dir_name(a(1));
            let l = discovery::listen(&dir, &name).unwrap();
            println!("attacker-ready");
            std::io::stdout().flush().unwrap();
            let mut keep = Vec::new();
            let t = Instant::now();
            while t.elapsed() < Duration::from_secs(60) {
                match discovery::accept(&l) {
                    Ok(Some(s)) => {
                        let mut fds = [libc::pollfd { fd: s.as_raw_fd(), events: libc::POLLIN, revents: 0 }];
                        // SAFETY: a valid array of one.
                        unsafe { libc::poll(fds.as_mut_ptr(), 1, 1000) };
                        let mut b = [0u8; 96];
                        let _ = discovery::recv_with_fds(&s, &mut b);
                        let (bell, mine) = doorbell("dgram");
                        let _ = discovery::send_with_fds(&s, &hello(b"UROCEOK1", a(1)), &[bell.as_raw_fd()]);
                        keep.push((s, mine));
                    }
                    _ => std::thread::sleep(Duration::from_millis(5)),
                }
            }
            let _ = dir.remove(&name);
        }
        "sweep" => {
            // A socket file nobody listens on (its process was killed),
            // then a device that starts: its hub sweeps the directory.
            let (dir, name) = links_dir_name(a(1));
            drop(discovery::listen(&dir, &name).unwrap());
            assert!(dir.contains(&name));
            let x = a(2);
            let _ctx = Context::open(&DeviceConfig::at("atk-sweep", x.ip(), x.port())).unwrap();
            let t = Instant::now();
            while dir.contains(&name) && t.elapsed() < Duration::from_secs(10) {
                std::thread::sleep(Duration::from_millis(10));
            }
            println!("attacker-sweep {}", if dir.contains(&name) { "stays" } else { "swept" });
            std::io::stdout().flush().unwrap();
            wait_for_stdin_eof();
        }
        "spread" => {
            // `spread,<victim>,<first claimed>,<addresses>,<hellos each>`:
            // the claimed address's last byte counts up.
            let first = a(2);
            let IpAddr::V4(ip) = first.ip() else { panic!("IPv4 only") };
            let claims: Vec<SocketAddr> = (0..p[3].parse::<u8>().unwrap())
                .map(|i| {
                    let [x, y, z, w] = ip.octets();
                    SocketAddr::new(Ipv4Addr::new(x, y, z, w + i).into(), first.port())
                })
                .collect();
            // One address's hellos at a time: the victim takes 16 hellos
            // in flight at most, a bound that would refuse first.
            let each = p[4].parse().unwrap();
            attack_links(a(1), &claims, "dgram", true, each, each);
        }
        "device" => {
            // A real device, advertised (the test stops this process).
            let x = a(1);
            let _ctx = Context::open(&DeviceConfig::at("atk-device", x.ip(), x.port())).unwrap();
            println!("attacker-ready");
            std::io::stdout().flush().unwrap();
            wait_for_stdin_eof();
        }
        other => panic!("unknown attack {other}"),
    }
}
