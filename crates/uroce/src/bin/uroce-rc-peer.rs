//! A two-process RC test peer: `--server PORT` or `--client HOST:PORT`.
//! The two exchange GID, QPN, PSN, rkey and address over TCP (as
//! ibv_rc_pingpong does), then the client RDMA-WRITEs a pattern into the
//! server, READs it back, SENDs a message, and both verify. Exit 0 on
//! success. Used by the multi-process and network-namespace tests.
//!
//! Environment: `UROCE_PEER_OPS=N` makes the client then run N more
//! verified operations (WRITEs of 1 B..16 KiB to 64 slots, each READ back
//! and compared, and per batch a FETCH_ADD on a counter whose returned
//! values must run 0, 1, 2, … however often the fabric made it resend); `UROCE_PEER_TIMEOUT` / `UROCE_PEER_RETRY` set the QP's ACK
//! timeout exponent and retry count (default 14 / 7: seven retries of 67 ms);
//! `UROCE_PEER_BW_MS=N` makes the client then stream 64 KiB RDMA WRITEs
//! (16 in flight) for N ms and print their bandwidth. At the end each side
//! prints, per peer, the medium (shared-memory link or UDP) and its
//! packet counters.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::time::Duration;
use uroce::verbs::*;

const LEN: usize = 1 << 20;
const T: Duration = Duration::from_secs(20);

fn pattern() -> Vec<u8> {
    (0..LEN).map(|i| (i as u32).wrapping_mul(2654435761).to_be_bytes()[0]).collect()
}

struct Info {
    gid: Gid,
    qpn: u32,
    psn: u32,
    rkey: u32,
    addr: u64,
}

impl Info {
    fn to_bytes(&self) -> [u8; 40] {
        let mut b = [0u8; 40];
        b[..16].copy_from_slice(&self.gid.0);
        b[16..20].copy_from_slice(&self.qpn.to_be_bytes());
        b[20..24].copy_from_slice(&self.psn.to_be_bytes());
        b[24..28].copy_from_slice(&self.rkey.to_be_bytes());
        b[28..36].copy_from_slice(&self.addr.to_be_bytes());
        b
    }
    fn from_bytes(b: &[u8; 40]) -> Info {
        let u32at = |i: usize| u32::from_be_bytes(b[i..i + 4].try_into().unwrap());
        Info {
            gid: Gid(b[..16].try_into().unwrap()),
            qpn: u32at(16),
            psn: u32at(20),
            rkey: u32at(24),
            addr: u64::from_be_bytes(b[28..36].try_into().unwrap()),
        }
    }
}

fn exchange(s: &mut TcpStream, mine: &Info) -> std::io::Result<Info> {
    s.write_all(&mine.to_bytes())?;
    let mut b = [0u8; 40];
    s.read_exact(&mut b)?;
    Ok(Info::from_bytes(&b))
}

fn run() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().collect();
    let (server, target) = match args.get(1).map(String::as_str) {
        Some("--server") => (true, args.get(2).cloned().unwrap_or_else(|| "18515".into())),
        Some("--client") => (false, args.get(2).cloned().ok_or("--client HOST:PORT")?),
        _ => return Err("usage: uroce-rc-peer --server PORT | --client HOST:PORT".into()),
    };
    let ctx = Context::open(&DeviceConfig::from_env()?)?;
    let pd = ctx.alloc_pd()?;
    let cq = ctx.create_cq(256, None)?;
    let env = |k: &str, d: u64| std::env::var(k).ok().and_then(|v| v.parse().ok()).unwrap_or(d);
    let (ops, timeout, retry) = (env("UROCE_PEER_OPS", 0), env("UROCE_PEER_TIMEOUT", 14), env("UROCE_PEER_RETRY", 7));
    let bw_ms = env("UROCE_PEER_BW_MS", 0);
    let qp = pd.create_qp(&QpInitAttr::rc(&cq, &cq))?;
    let all = Access::LOCAL_WRITE | Access::REMOTE_WRITE | Access::REMOTE_READ | Access::REMOTE_ATOMIC;
    let mr = pd.register(vec![0u8; LEN], all)?;
    let psn = std::process::id() & 0xFFFFFF;
    let mine = Info { gid: ctx.query_gid(0)?, qpn: qp.qp_num(), psn, rkey: mr.rkey(), addr: mr.iova() };
    let mut sock = if server {
        let l = TcpListener::bind(format!("0.0.0.0:{target}"))?;
        println!("server: device {} at {}, waiting on tcp {target}", ctx.name(), ctx.local_addr());
        l.accept()?.0
    } else {
        let mut tries = 0;
        loop {
            match TcpStream::connect(&target) {
                Ok(s) => break s,
                Err(e) if tries < 100 => {
                    tries += 1;
                    let _ = e;
                    std::thread::sleep(Duration::from_millis(50));
                }
                Err(e) => return Err(e.into()),
            }
        }
    };
    let peer = exchange(&mut sock, &mine)?;
    qp.connect_rc_with(&peer.gid, peer.qpn, psn, peer.psn, timeout as u8, retry as u8)?;
    let rx = pd.register(vec![0u8; 64], Access::LOCAL_WRITE)?;
    qp.post_recv(&RecvWr { wr_id: 100, sg_list: uroce::sgl![rx.sge(0, 64)] })?;
    // Both sides are ready: sync.
    sock.write_all(b"R")?;
    sock.read_exact(&mut [0u8; 1])?;
    let data = pattern();
    if server {
        let wc = cq.wait(1, T)?[0];
        if wc.status != WcStatus::Success || wc.wr_id != 100 {
            return Err(format!("server: receive completion {wc:?}").into());
        }
        if &rx.to_vec()[..wc.byte_len as usize] != b"done" {
            return Err("server: wrong message".into());
        }
        if mr.to_vec() != data {
            return Err("server: RDMA WRITE data differs".into());
        }
        println!("server: 1 MiB RDMA WRITE verified, message received; {:?}", ctx.stats().retransmits);
    } else {
        let src = pd.register(data.clone(), all)?;
        let mut w = SendWr::new(1, WrOpcode::RdmaWrite);
        w.sg_list = uroce::sgl![src.sge(0, LEN as u32)];
        w.remote_addr = peer.addr;
        w.rkey = peer.rkey;
        qp.post_send(&w)?;
        let mut r = SendWr::new(2, WrOpcode::RdmaRead);
        r.sg_list = uroce::sgl![mr.sge(0, LEN as u32)];
        r.remote_addr = peer.addr;
        r.rkey = peer.rkey;
        qp.post_send(&r)?;
        let msg = pd.register(b"done".to_vec(), Access::empty())?;
        let mut s = SendWr::new(3, WrOpcode::Send);
        s.sg_list = uroce::sgl![msg.sge(0, 4)];
        qp.post_send(&s)?;
        let wcs = cq.wait(3, T)?;
        for wc in &wcs {
            if wc.status != WcStatus::Success {
                return Err(format!("client: completion {wc:?}").into());
            }
        }
        if mr.to_vec() != data {
            return Err("client: RDMA READ data differs".into());
        }
        println!("client: WRITE + READ of 1 MiB and SEND completed and verified");
        // The verified operations overwrite the server's region: wait
        // until the server has checked the 1 MiB WRITE.
        let mut d = [0u8; 1];
        sock.read_exact(&mut d)?;
        if ops > 0 {
            println!("client: starting {ops} operations, each verified");
            verified_ops(&pd, &qp, &cq, &peer, ops)?;
            let s = ctx.stats();
            println!(
                "client: {ops} verified operations; retransmits {} timeouts {} naks {} icrc drops {}",
                s.retransmits, s.timeouts, s.naks_received, s.rx_drop_icrc
            );
        }
        if bw_ms > 0 {
            stream_writes(&pd, &qp, &cq, &peer, Duration::from_millis(bw_ms))?;
            let s = ctx.stats();
            println!("client: retransmits {} timeouts {} naks {}", s.retransmits, s.timeouts, s.naks_received);
        }
    }
    // Each side prints which medium carried its packets (the same-host
    // link's tests read it) while the other is still there: a link ends
    // with its peer's process, and would then read "udp".
    let print_links = || {
        for l in ctx.link_stats() {
            let c: Vec<String> = l.counters.iter().map(|(k, v)| format!("{k}={v}")).collect();
            let who = if server { "server" } else { "client" };
            println!("{who}: link to {} by {} pid {:?} {}", l.peer, l.medium, l.pid, c.join(" "));
        }
    };
    if server {
        sock.write_all(b"D")?;
        // The client answers when it is done (it may run a verified
        // workload for as long as a soak lasts), or goes away (EOF).
        let mut d = [0u8; 1];
        if !matches!(sock.read(&mut d), Ok(1)) {
            eprintln!("client went away; QP: {}\n  stats: {:?}", qp.debug_state(), ctx.stats());
        }
        if bw_ms > 0 {
            println!("server: stats {:?}", ctx.stats());
        }
        print_links();
        // The client may go now.
        let _ = sock.write_all(b"E");
    } else {
        print_links();
        sock.write_all(b"D")?;
        // Stay until the server has printed (or is gone).
        sock.set_read_timeout(Some(Duration::from_secs(60)))?;
        let _ = sock.read(&mut [0u8; 1]);
    }
    Ok(())
}

/// `n` operations in batches: WRITE distinct data to 64 remote slots, READ
/// each back, compare, and FETCH_ADD 1 to a counter in the last 8 bytes of
/// the peer's region (which the WRITEs never reach): the values it returns
/// must be 0, 1, 2, … — a duplicated or resent atomic executes once. Any
/// error completion or difference fails.
fn verified_ops(
    pd: &ProtectionDomain,
    qp: &QueuePair,
    cq: &CompletionQueue,
    peer: &Info,
    n: u64,
) -> Result<(), Box<dyn std::error::Error>> {
    const SLOTS: usize = 64;
    const SLOT: usize = 16 * 1024;
    const COUNTER: usize = LEN - 8;
    let all = Access::LOCAL_WRITE | Access::REMOTE_WRITE | Access::REMOTE_READ;
    let src = pd.register(vec![0u8; SLOTS * SLOT], all)?;
    let back = pd.register(vec![0u8; SLOTS * SLOT], all)?;
    let old = pd.register(vec![0u8; 8], Access::LOCAL_WRITE)?;
    let source: Vec<u8> = (0..2 * SLOT).map(|i| (i as u32).wrapping_mul(2246822519).to_be_bytes()[1]).collect();
    let fail = |what: String| -> Box<dyn std::error::Error> {
        format!("client: {what}\n  QP: {}\n  stats: {:?}", qp.debug_state(), pd.context().stats()).into()
    };
    // The counter starts at 0.
    src.write_at(0, &[0u8; 8])?;
    let mut z = SendWr::new(9999, WrOpcode::RdmaWrite);
    z.sg_list = uroce::sgl![src.sge(0, 8)];
    z.remote_addr = peer.addr + COUNTER as u64;
    z.rkey = peer.rkey;
    qp.post_send(&z)?;
    let wc = cq.wait(1, T).map_err(|e| fail(e.to_string()))?[0];
    if wc.status != WcStatus::Success {
        return Err(fail(format!("zeroing the counter: {wc:?}")));
    }
    let mut done = 0u64;
    let mut batch = 0u64;
    while done < n {
        let k = (SLOTS as u64).min((n - done).div_ceil(2)) as usize;
        let mut lens = Vec::with_capacity(k);
        for s in 0..k {
            let len = 1 + ((batch * 7919 + s as u64 * 104729) % (SLOT - 8) as u64) as usize;
            let from = ((batch + s as u64) % SLOT as u64) as usize;
            src.write_at(s * SLOT, &source[from..from + len])?;
            let mut w = SendWr::new(s as u64, WrOpcode::RdmaWrite);
            w.flags = SendFlags::empty();
            w.sg_list = uroce::sgl![src.sge(s * SLOT, len as u32)];
            w.remote_addr = peer.addr + (s * SLOT) as u64;
            w.rkey = peer.rkey;
            qp.post_send(&w)?;
            lens.push((len, from));
        }
        for (s, &(len, _)) in lens.iter().enumerate() {
            let mut r = SendWr::new(1000 + s as u64, WrOpcode::RdmaRead);
            r.sg_list = uroce::sgl![back.sge(s * SLOT, len as u32)];
            r.remote_addr = peer.addr + (s * SLOT) as u64;
            r.rkey = peer.rkey;
            qp.post_send(&r)?;
        }
        let mut fa = SendWr::new(5000, WrOpcode::AtomicFetchAdd);
        fa.sg_list = uroce::sgl![old.sge(0, 8)];
        fa.remote_addr = peer.addr + COUNTER as u64;
        fa.rkey = peer.rkey;
        fa.compare_add = 1;
        qp.post_send(&fa)?;
        let wcs = cq.wait(k + 1, T).map_err(|e| fail(e.to_string()))?;
        for wc in &wcs {
            if wc.status != WcStatus::Success {
                return Err(fail(format!("operation failed: {wc:?} (after {done} verified operations)")));
            }
        }
        let was = u64::from_ne_bytes(old.to_vec()[..8].try_into()?);
        if was != batch {
            return Err(fail(format!("FETCH_ADD {batch} returned {was}: an atomic ran twice or not at all")));
        }
        let mut got = vec![0u8; SLOT];
        for (s, &(len, from)) in lens.iter().enumerate() {
            back.read_at(s * SLOT, &mut got[..len])?;
            if got[..len] != source[from..from + len] {
                return Err(format!("client: slot {s} of batch {batch} differs after WRITE + READ").into());
            }
        }
        done += 2 * k as u64 + 1;
        batch += 1;
    }
    Ok(())
}

/// RDMA WRITEs of 64 KiB into the peer's region, 16 in flight, for
/// `time`; prints the bandwidth (all completed, none failed).
fn stream_writes(
    pd: &ProtectionDomain,
    qp: &QueuePair,
    cq: &CompletionQueue,
    peer: &Info,
    time: Duration,
) -> Result<(), Box<dyn std::error::Error>> {
    const SIZE: usize = 64 * 1024;
    const DEPTH: u64 = 16;
    let src = pd.register(pattern()[..SIZE].to_vec(), Access::LOCAL_WRITE)?;
    let start = std::time::Instant::now();
    let (mut posted, mut done) = (0u64, 0u64);
    let mut wcs = [Wc::new(0, WcStatus::Success, WcOpcode::RdmaWrite, 0); 16];
    while start.elapsed() < time || done < posted {
        while posted - done < DEPTH && start.elapsed() < time {
            let mut w = SendWr::new(posted, WrOpcode::RdmaWrite);
            w.sg_list = uroce::sgl![src.sge(0, SIZE as u32)];
            w.remote_addr = peer.addr + (posted % (LEN / SIZE) as u64) * SIZE as u64;
            w.rkey = peer.rkey;
            qp.post_send(&w)?;
            posted += 1;
        }
        if start.elapsed() > time + T {
            return Err(format!("client: {} WRITEs of 64 KiB still outstanding after {T:?}", posted - done).into());
        }
        let n = cq.poll(&mut wcs)?;
        for wc in &wcs[..n] {
            if wc.status != WcStatus::Success {
                return Err(format!("client: WRITE failed: {wc:?}").into());
            }
        }
        done += n as u64;
    }
    let secs = start.elapsed().as_secs_f64();
    println!(
        "client: bandwidth {:.1} MB/s ({done} WRITEs of 64 KiB in {secs:.2} s)",
        (done * SIZE as u64) as f64 / secs / 1e6
    );
    Ok(())
}

fn main() {
    if let Err(e) = run() {
        eprintln!("uroce-rc-peer: {e}");
        std::process::exit(1);
    }
}
