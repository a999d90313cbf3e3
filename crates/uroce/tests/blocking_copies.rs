//! Copies that block run outside the engine's locks (issue 19 §3,
//! `proto::copy`, `io::copier`): while a peer-memory client holds a copy
//! for as long as it likes (a GPU copy, a slow disk), the device goes on
//! receiving and sending for every other QP, those of the same engine
//! shard included; the blocked QP's own work resumes, in order, once the
//! client returns.

mod common;

use common::*;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use uroce::mem::peer::{self, Invalidator, PeerMemory, PeerMemoryClient, PeerResult};
use uroce::verbs::*;

/// The device addresses the gated client owns.
const BASE: u64 = 0x6a00_0000_0000;
const LEN: u64 = 1 << 20;
/// A copy held by the gate waits at most this long (a failed test does not
/// hang).
const GATE_LIMIT: Duration = Duration::from_secs(20);

const RW: Access = Access::LOCAL_WRITE.union(Access::REMOTE_WRITE).union(Access::REMOTE_READ);

/// Holds the client's copies until opened.
#[derive(Default)]
struct Gate {
    open: AtomicBool,
    /// Copies that reached the gate.
    arrived: AtomicU32,
}

impl Gate {
    fn pass(&self) {
        self.arrived.fetch_add(1, Ordering::SeqCst);
        let t = Instant::now();
        while !self.open.load(Ordering::SeqCst) && t.elapsed() < GATE_LIMIT {
            std::thread::sleep(Duration::from_millis(1));
        }
    }
}

/// A peer-memory client over a host buffer whose copies wait at a gate.
struct GatedPeer {
    name: String,
    bytes: Arc<Mutex<Vec<u8>>>,
    gate: Arc<Gate>,
}

struct GatedRegion {
    bytes: Arc<Mutex<Vec<u8>>>,
    gate: Arc<Gate>,
    pages: u64,
}

impl PeerMemoryClient for GatedPeer {
    fn name(&self) -> &str {
        &self.name
    }
    fn version(&self) -> &str {
        "1.0"
    }
    fn acquire(&self, addr: u64, size: u64) -> Option<Box<dyn PeerMemory>> {
        let inside = addr >= BASE && addr.checked_add(size).is_some_and(|end| end <= BASE + LEN);
        inside.then(|| Box::new(GatedRegion { bytes: self.bytes.clone(), gate: self.gate.clone(), pages: 0 }) as _)
    }
}

impl PeerMemory for GatedRegion {
    fn get_pages(&mut self, _addr: u64, size: u64, _write: bool, _inv: Invalidator) -> PeerResult<()> {
        self.pages = size.div_ceil(4096);
        Ok(())
    }
    fn dma_map(&mut self) -> PeerResult<u64> {
        Ok(self.pages)
    }
    fn dma_unmap(&mut self) {}
    fn put_pages(&mut self) {}
    fn page_size(&self) -> u64 {
        4096
    }
    fn read(&self, addr: u64, out: &mut [u8]) -> PeerResult<()> {
        self.gate.pass();
        let at = (addr - BASE) as usize;
        out.copy_from_slice(&self.bytes.lock().unwrap()[at..at + out.len()]);
        Ok(())
    }
    fn write(&self, addr: u64, data: &[u8]) -> PeerResult<()> {
        self.gate.pass();
        let at = (addr - BASE) as usize;
        self.bytes.lock().unwrap()[at..at + data.len()].copy_from_slice(data);
        Ok(())
    }
}

/// Peer counters are published under a runtime directory of the test's own.
fn runtime_dir() {
    static DIR: std::sync::OnceLock<()> = std::sync::OnceLock::new();
    DIR.get_or_init(|| {
        let d = std::env::temp_dir().join(format!("uroce-blocking-test-{}", std::process::id()));
        std::env::set_var("UROCE_RUNTIME_DIR", &d);
    });
}

/// A connected RC pair between `a` and `b`, the `b` end's QP number
/// chosen by `pick` (QPs are created until one satisfies it).
struct Pair {
    a_cq: CompletionQueue,
    a_qp: QueuePair,
    /// Kept alive with the pair (the `b` end's QP completes into it).
    _b_cq: CompletionQueue,
    b_qp: QueuePair,
}

fn pair(a: &Context, pa: &ProtectionDomain, b: &Context, pb: &ProtectionDomain, pick: impl Fn(u32) -> bool) -> Pair {
    let b_cq = b.create_cq(256, None).unwrap();
    let mut spare = Vec::new();
    let b_qp = loop {
        let q = pb.create_qp(&QpInitAttr::rc(&b_cq, &b_cq)).unwrap();
        if pick(q.qp_num()) {
            break q;
        }
        spare.push(q);
        assert!(spare.len() < 1000, "no QP number as asked");
    };
    let a_cq = a.create_cq(256, None).unwrap();
    let a_qp = pa.create_qp(&QpInitAttr::rc(&a_cq, &a_cq)).unwrap();
    a_qp.connect_rc(&b.query_gid(0).unwrap(), b_qp.qp_num(), 10, 20).unwrap();
    b_qp.connect_rc(&a.query_gid(0).unwrap(), a_qp.qp_num(), 20, 10).unwrap();
    Pair { a_cq, a_qp, _b_cq: b_cq, b_qp }
}

/// The engine shard of a QP (`io::shard`: QPN mod 64).
fn shard(qpn: u32) -> u32 {
    qpn % 64
}

/// `rounds` WRITEs and READs of host memory on `p`, each waited for.
fn host_traffic(p: &Pair, pa: &ProtectionDomain, pb: &ProtectionDomain, rounds: u32) {
    let remote = pb.register(vec![0u8; 4096], RW).unwrap();
    let local = pa.register(vec![0u8; 4096], Access::LOCAL_WRITE).unwrap();
    for i in 0..rounds {
        local.write_at(0, &[i as u8; 256]).unwrap();
        let mut w = wr(u64::from(i), WrOpcode::RdmaWrite, local.sge(0, 256));
        w.remote_addr = remote.addr();
        w.rkey = remote.rkey();
        p.a_qp.post_send(&w).unwrap();
        let wc = p.a_cq.wait(1, Duration::from_secs(5)).unwrap();
        assert_eq!(wc.first().map(|c| c.status), Some(WcStatus::Success), "WRITE {i} beside the blocked copy");
        let mut r = wr(u64::from(i), WrOpcode::RdmaRead, local.sge(1024, 256));
        r.remote_addr = remote.addr();
        r.rkey = remote.rkey();
        p.a_qp.post_send(&r).unwrap();
        let wc = p.a_cq.wait(1, Duration::from_secs(5)).unwrap();
        assert_eq!(wc.first().map(|c| c.status), Some(WcStatus::Success), "READ {i} beside the blocked copy");
        assert_eq!(local.to_vec()[1024..1280], [i as u8; 256]);
    }
}

#[test]
fn a_copy_blocked_in_a_peer_client_stops_only_its_own_qp() {
    runtime_dir();
    let gate = Arc::new(Gate::default());
    let bytes = Arc::new(Mutex::new(vec![0u8; LEN as usize]));
    let name = format!("gated{}", std::process::id() % 10000);
    let client = GatedPeer { name: name.clone(), bytes: bytes.clone(), gate: gate.clone() };
    let _handle = peer::register_client(Arc::new(client)).unwrap();
    let (a, b) = pair_with(None);
    let (pa, pb) = (a.alloc_pd().unwrap(), b.alloc_pd().unwrap());
    let slow = pair(&a, &pa, &b, &pb, |_| true);
    // Another QP of the blocked QP's shard, and one of another shard.
    let same = pair(&a, &pa, &b, &pb, |q| shard(q) == shard(slow.b_qp.qp_num()));
    let other = pair(&a, &pa, &b, &pb, |q| shard(q) != shard(slow.b_qp.qp_num()));
    // SAFETY: a device address the gated client claims; the CPU never
    // dereferences it.
    let dev = unsafe { pb.register_raw(BASE as *mut u8, LEN as usize, BASE, RW) }.unwrap();

    // A WRITE into the client's memory: its copy waits at the gate. A
    // second one is posted behind it.
    let data: Vec<u8> = (0..8192).map(|i| (i % 251) as u8).collect();
    let src = pa.register(data.clone(), Access::empty()).unwrap();
    for (i, off) in [0u32, 4096].into_iter().enumerate() {
        let mut w = wr(i as u64, WrOpcode::RdmaWrite, src.sge(off as usize, 4096));
        w.remote_addr = BASE + u64::from(off);
        w.rkey = dev.rkey();
        slow.a_qp.post_send(&w).unwrap();
    }
    let t = Instant::now();
    while gate.arrived.load(Ordering::SeqCst) == 0 {
        assert!(t.elapsed() < Duration::from_secs(5), "the WRITE's copy never reached the client");
        std::thread::sleep(Duration::from_millis(1));
    }

    // The device goes on for the other QPs, of the same shard too.
    host_traffic(&same, &pa, &pb, 20);
    host_traffic(&other, &pa, &pb, 20);
    assert!(slow.a_cq.poll_one().is_none(), "the blocked WRITE completed before its copy");
    assert_eq!(gate.arrived.load(Ordering::SeqCst), 1, "the second WRITE waits behind the first");
    assert!(b.stats().copies_deferred >= 1, "{:?}", b.stats());

    // Released, the blocked QP finishes its work in order.
    gate.open.store(true, Ordering::SeqCst);
    let mut got = Vec::new();
    let t = Instant::now();
    while got.len() < 2 && t.elapsed() < Duration::from_secs(10) {
        got.extend(slow.a_cq.poll_one());
    }
    let ids: Vec<(u64, WcStatus)> = got.iter().map(|c| (c.wr_id, c.status)).collect();
    assert_eq!(ids, [(0, WcStatus::Success), (1, WcStatus::Success)]);
    assert_eq!(bytes.lock().unwrap()[..8192], data[..]);

    // A READ of the client's memory (the responder's READ response waits
    // at the gate) beside a SEND on the same shard.
    gate.open.store(false, Ordering::SeqCst);
    let before = gate.arrived.load(Ordering::SeqCst);
    let dst = pa.register(vec![0u8; 4096], Access::LOCAL_WRITE).unwrap();
    let mut r = wr(7, WrOpcode::RdmaRead, dst.sge(0, 4096));
    r.remote_addr = BASE + 4096;
    r.rkey = dev.rkey();
    slow.a_qp.post_send(&r).unwrap();
    let t = Instant::now();
    while gate.arrived.load(Ordering::SeqCst) == before {
        assert!(t.elapsed() < Duration::from_secs(5), "the READ's copy never reached the client");
        std::thread::sleep(Duration::from_millis(1));
    }
    host_traffic(&same, &pa, &pb, 5);
    assert!(slow.a_cq.poll_one().is_none(), "the READ completed before its copy");
    gate.open.store(true, Ordering::SeqCst);
    let wc = slow.a_cq.wait(1, Duration::from_secs(10)).unwrap();
    assert_eq!(wc.first().map(|c| (c.wr_id, c.status)), Some((7, WcStatus::Success)));
    assert_eq!(dst.to_vec(), data[4096..]);
    drop(dev);
    peer::unregister_client(&name);
}
