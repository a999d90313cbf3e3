//! Inline receive (issue #6): half round-trip latency of a 16-byte SEND
//! ping-pong between two loopback devices, with scatter-to-CQE on and off,
//! and the 64-byte case with 128-byte CQEs.
//!
//! Run: `cargo bench -p uroce --bench inline_recv`

use std::net::{IpAddr, Ipv4Addr};
use std::time::{Duration, Instant};
use uroce::verbs::*;

const T: Duration = Duration::from_secs(10);

fn pingpong(tag: &str, scatter: bool, cqe_size: u32, size: usize, iters: u32) -> f64 {
    let port = 42000 + (std::process::id() % 1000) as u16;
    let cfg = |n: &str, ip: u8| DeviceConfig {
        cqe_size,
        busy_poll: false,
        ..DeviceConfig::at(&format!("{tag}-{n}"), IpAddr::V4(Ipv4Addr::new(127, 0, 0, ip)), port)
    };
    let (ca, cb) = (Context::open(&cfg("a", 1)).unwrap(), Context::open(&cfg("b", 2)).unwrap());
    let (pa, pb) = (ca.alloc_pd().unwrap(), cb.alloc_pd().unwrap());
    let (qa_cq, qb_cq) = (ca.create_cq(256, None).unwrap(), cb.create_cq(256, None).unwrap());
    let attr = |cq| QpInitAttr { scatter_to_cqe: Some(scatter), ..QpInitAttr::rc(cq, cq) };
    let (qa, qb) = (pa.create_qp(&attr(&qa_cq)).unwrap(), pb.create_qp(&attr(&qb_cq)).unwrap());
    qa.connect_rc(&cb.query_gid(0).unwrap(), qb.qp_num(), 1, 2).unwrap();
    qb.connect_rc(&ca.query_gid(0).unwrap(), qa.qp_num(), 2, 1).unwrap();
    let (ba, bb) = (
        pa.register(vec![1u8; 4096], Access::LOCAL_WRITE).unwrap(),
        pb.register(vec![2u8; 4096], Access::LOCAL_WRITE).unwrap(),
    );
    let send = |mr: &MemoryRegion| {
        let mut w = SendWr::new(1, WrOpcode::Send);
        w.sg_list = uroce::sgl![mr.sge(0, size as u32)];
        w.flags = SendFlags::empty();
        w
    };
    let (sa, sb) = (send(&ba), send(&bb));
    let recv = |mr: &MemoryRegion| RecvWr { wr_id: 2, sg_list: uroce::sgl![mr.sge(2048, size as u32)] };
    let wait_recv = |cq: &CompletionQueue| loop {
        if let Some(wc) = cq.poll_one() {
            if wc.opcode == WcOpcode::Recv {
                assert_eq!(wc.status, WcStatus::Success);
                return;
            }
        }
    };
    let round = || {
        qb.post_recv(&recv(&bb)).unwrap();
        qa.post_recv(&recv(&ba)).unwrap();
        qa.post_send(&sa).unwrap();
        wait_recv(&qb_cq);
        qb.post_send(&sb).unwrap();
        wait_recv(&qa_cq);
    };
    for _ in 0..200 {
        round();
    }
    let _ = T;
    let t = Instant::now();
    for _ in 0..iters {
        round();
    }
    let r = t.elapsed().as_secs_f64() * 1e6 / iters as f64 / 2.0;
    if std::env::var_os("UROCE_BENCH_STATS").is_some() {
        eprintln!("{tag}: A {:?}\n{tag}: B {:?}", ca.stats(), cb.stats());
    }
    r
}

fn main() {
    let n = 5000;
    println!("SEND ping-pong, half round trip (µs), the application polls (progress threads sleep)");
    for (size, cqe) in [(16usize, 64u32), (64, 128)] {
        let on = pingpong(&format!("ir-on-{size}"), true, cqe, size, n);
        let off = pingpong(&format!("ir-off-{size}"), false, cqe, size, n);
        println!(
            "  {size:>3} B, {cqe}-byte CQEs: inline receive {on:7.2}   without {off:7.2}   ({:+.1}%)",
            (on - off) / off * 100.0
        );
    }
}
