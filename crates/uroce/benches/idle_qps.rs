//! The cost of idle QPs (issue #8): a ping-pong on one QP pair while each
//! device also holds 1000 connected QPs that carry no traffic. Finding the
//! next timer deadline visits only QPs with a timer running, so idle QPs
//! should cost nothing (they added ≈ 5 µs per half round trip when every
//! engine pass visited every QP).
//!
//! Run: `cargo bench -p uroce --bench idle_qps`

use std::net::{IpAddr, Ipv4Addr};
use std::time::{Duration, Instant};
use uroce::verbs::*;
/// Median SEND half round trip (µs) between two loopback devices that each
/// also hold `extra` idle connected QPs.
fn half_rtt(extra: usize, port: u16) -> f64 {
    let a = Context::open(&DeviceConfig::at("idle-a", IpAddr::V4(Ipv4Addr::new(127, 0, 0, 21)), port)).unwrap();
    let b = Context::open(&DeviceConfig::at("idle-b", IpAddr::V4(Ipv4Addr::new(127, 0, 0, 22)), port)).unwrap();
    let (pa, pb) = (a.alloc_pd().unwrap(), b.alloc_pd().unwrap());
    let (ca, cb) = (a.create_cq(4096, None).unwrap(), b.create_cq(4096, None).unwrap());
    let qa = pa.create_qp(&QpInitAttr::rc(&ca, &ca)).unwrap();
    let qb = pb.create_qp(&QpInitAttr::rc(&cb, &cb)).unwrap();
    qa.connect_rc(&b.query_gid(0).unwrap(), qb.qp_num(), 1, 2).unwrap();
    qb.connect_rc(&a.query_gid(0).unwrap(), qa.qp_num(), 2, 1).unwrap();
    // Idle connected QPs (to QPNs nobody has): RTS, no traffic.
    let mut keep = Vec::new();
    for i in 0..extra {
        for (p, c, g) in [(&pa, &ca, b.query_gid(0).unwrap()), (&pb, &cb, a.query_gid(0).unwrap())] {
            let q = p.create_qp(&QpInitAttr::rc(c, c)).unwrap();
            q.connect_rc(&g, 0x100000 + i as u32, 5, 5).unwrap();
            keep.push(q);
        }
    }
    let ma = pa.register(vec![1u8; 64], Access::LOCAL_WRITE).unwrap();
    let mb = pb.register(vec![0u8; 64], Access::LOCAL_WRITE).unwrap();
    let n = 20000;
    let th = std::thread::spawn(move || {
        for _ in 0..n {
            qb.post_recv(&RecvWr { wr_id: 1, sg_list: uroce::sgl![mb.sge(0, 64)] }).unwrap();
            loop {
                if let Some(wc) = cb.poll_one() {
                    if wc.opcode == WcOpcode::Recv {
                        break;
                    }
                }
            }
            let mut w = SendWr::new(2, WrOpcode::Send);
            w.sg_list = uroce::sgl![mb.sge(0, 64)];
            w.flags = SendFlags::empty();
            qb.post_send(&w).unwrap();
        }
        std::thread::sleep(Duration::from_millis(100));
    });
    let mut rtt = Vec::new();
    let mr = pa.register(vec![0u8; 64], Access::LOCAL_WRITE).unwrap();
    for _ in 0..n {
        qa.post_recv(&RecvWr { wr_id: 3, sg_list: uroce::sgl![mr.sge(0, 64)] }).unwrap();
        let t = Instant::now();
        let mut w = SendWr::new(4, WrOpcode::Send);
        w.sg_list = uroce::sgl![ma.sge(0, 64)];
        w.flags = SendFlags::empty();
        qa.post_send(&w).unwrap();
        loop {
            if let Some(wc) = ca.poll_one() {
                if wc.opcode == WcOpcode::Recv {
                    break;
                }
            }
        }
        rtt.push(t.elapsed().as_secs_f64() * 1e6 / 2.0);
    }
    th.join().unwrap();
    rtt.sort_by(f64::total_cmp);
    rtt[rtt.len() / 2]
}

fn main() {
    println!("64 B SEND ping-pong between two loopback devices, each polling thread busy; median half RTT");
    let mut port = 29911;
    for round in 0..3 {
        for extra in [0, 1000] {
            port += 1;
            println!("round {round}: {extra:>5} idle QPs per device: {:.2} us", half_rtt(extra, port));
        }
    }
}
