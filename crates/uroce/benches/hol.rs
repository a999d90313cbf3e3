//! Head-of-line blocking between queue pairs (issue #19): in one process,
//! the latency of 64-byte RDMA WRITEs on QP A (post, then busy-poll for the
//! completion: the WRITE and its ACK) while QP B streams 64 KiB WRITEs to
//! the same peer device, against A's latency with B idle. Prints A's
//! median and p99 under load divided by A's idle median.
//!
//! A and B are created until their QP numbers fall in different shards of
//! the runtime (QPN mod 64), as two busy QPs of an application mostly do;
//! with one device-wide engine lock (before the shards) this changes
//! nothing. Uses only the public verbs API, so the same file measures any
//! version of the runtime.
//!
//! Run: `cargo bench -p uroce --bench hol [-- SAMPLES]`

use std::net::{IpAddr, Ipv4Addr};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use uroce::verbs::*;

const WINDOW: u64 = 8;
const BULK: usize = 65536;

fn open(port: u16) -> (Context, Context) {
    let a = DeviceConfig::at(&format!("hol-a-{port}"), IpAddr::V4(Ipv4Addr::new(127, 0, 0, 1)), port);
    let b = DeviceConfig::at(&format!("hol-b-{port}"), IpAddr::V4(Ipv4Addr::new(127, 0, 0, 2)), port);
    (Context::open(&a).expect("device a"), Context::open(&b).expect("device b"))
}

struct Qp {
    cq: CompletionQueue,
    qp: QueuePair,
    _peer: (CompletionQueue, QueuePair),
}

fn connect(a: &Context, pa: &ProtectionDomain, b: &Context, pb: &ProtectionDomain, psn: u32) -> Qp {
    let cq = a.create_cq(256, None).unwrap();
    let qp = pa.create_qp(&QpInitAttr::rc(&cq, &cq)).unwrap();
    let cqb = b.create_cq(256, None).unwrap();
    let peer = pb.create_qp(&QpInitAttr::rc(&cqb, &cqb)).unwrap();
    qp.connect_rc(&b.query_gid(0).unwrap(), peer.qp_num(), psn, psn + 1000).unwrap();
    peer.connect_rc(&a.query_gid(0).unwrap(), qp.qp_num(), psn + 1000, psn).unwrap();
    Qp { cq, qp, _peer: (cqb, peer) }
}

fn write(id: u64, sge: Sge, dst: &MemoryRegion, off: u64) -> SendWr {
    let mut w = SendWr::new(id, WrOpcode::RdmaWrite);
    w.sg_list = uroce::sgl![sge];
    w.remote_addr = dst.addr() + off;
    w.rkey = dst.rkey();
    w
}

/// `n` latencies of 64-byte WRITEs on `q`, in ns, sorted.
fn latencies(q: &Qp, src: &MemoryRegion, dst: &MemoryRegion, n: usize) -> Vec<u64> {
    let mut v = Vec::with_capacity(n);
    for i in 0..n as u64 {
        let t = Instant::now();
        q.qp.post_send(&write(i, src.sge(0, 64), dst, 0)).unwrap();
        loop {
            if let Some(wc) = q.cq.poll_one() {
                assert_eq!(wc.status, WcStatus::Success);
                break;
            }
            assert!(t.elapsed() < Duration::from_secs(10), "a WRITE on A did not complete");
        }
        v.push(t.elapsed().as_nanos() as u64);
    }
    v.sort_unstable();
    v
}

fn pct(v: &[u64], p: f64) -> f64 {
    v[((v.len() - 1) as f64 * p).round() as usize] as f64 / 1000.0
}

fn main() {
    let samples: usize = std::env::args().skip(1).find_map(|a| a.parse().ok()).unwrap_or(3000);
    let port = 24000 + (std::process::id() % 1000) as u16;
    let (a, b) = open(port);
    let (pa, pb) = (a.alloc_pd().unwrap(), b.alloc_pd().unwrap());
    let src = pa.register(vec![1u8; BULK], Access::LOCAL_WRITE).unwrap();
    let dst = Arc::new(pb.register(vec![0u8; 2 * BULK], Access::LOCAL_WRITE | Access::REMOTE_WRITE).unwrap());
    let qa = connect(&a, &pa, &b, &pb, 100);
    let mut qb = connect(&a, &pa, &b, &pb, 5000);
    let mut spare = Vec::new();
    while qb.qp.qp_num() % 64 == qa.qp.qp_num() % 64 && spare.len() < 64 {
        spare.push(std::mem::replace(&mut qb, connect(&a, &pa, &b, &pb, 5000)));
    }
    // Warm up, then A alone.
    latencies(&qa, &src, &dst, 200);
    let idle = latencies(&qa, &src, &dst, samples);
    // B streams 64 KiB WRITEs (a window of WINDOW) while A measures.
    let stop = Arc::new(AtomicBool::new(false));
    let bytes = Arc::new(AtomicU64::new(0));
    let bulk_src = pa.register(vec![2u8; BULK], Access::LOCAL_WRITE).unwrap();
    let streamer = {
        let (stop, bytes, dst) = (stop.clone(), bytes.clone(), dst.clone());
        std::thread::spawn(move || {
            let (mut posted, mut done) = (0u64, 0u64);
            while !stop.load(Ordering::Relaxed) {
                while posted - done < WINDOW {
                    qb.qp.post_send(&write(posted, bulk_src.sge(0, BULK as u32), &dst, BULK as u64)).unwrap();
                    posted += 1;
                }
                while let Some(wc) = qb.cq.poll_one() {
                    assert_eq!(wc.status, WcStatus::Success);
                    done += 1;
                    bytes.fetch_add(BULK as u64, Ordering::Relaxed);
                }
            }
            let t = Instant::now();
            while done < posted && t.elapsed() < Duration::from_secs(10) {
                done += u64::from(qb.cq.poll_one().is_some());
            }
            qb
        })
    };
    std::thread::sleep(Duration::from_millis(100));
    let t = Instant::now();
    let b0 = bytes.load(Ordering::Relaxed);
    let loaded = latencies(&qa, &src, &dst, samples);
    let mbps = (bytes.load(Ordering::Relaxed) - b0) as f64 / t.elapsed().as_secs_f64() / 1e6;
    stop.store(true, Ordering::Relaxed);
    drop(streamer.join().unwrap());
    let base = pct(&idle, 0.5);
    println!("QP A 64 B WRITE latency (post → completion), {samples} samples; QP B streams 64 KiB WRITEs");
    println!("A idle:   median {:8.1} µs  p99 {:8.1} µs", base, pct(&idle, 0.99));
    println!("A loaded: median {:8.1} µs  p99 {:8.1} µs   (B {:.0} MB/s)", pct(&loaded, 0.5), pct(&loaded, 0.99), mbps);
    println!("ratio to idle median: median {:.2}×  p99 {:.2}×", pct(&loaded, 0.5) / base, pct(&loaded, 0.99) / base);
    drop(spare);
}
