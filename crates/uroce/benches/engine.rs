//! uroce's own cost per message, without the kernel (issue #8): two sans-IO
//! engines in one thread, joined by handing each one's packets straight to
//! the other, run RDMA WRITEs the way `uroce bench` does (128 outstanding,
//! one in 16 signaled, posted in lists of 16). What is measured is the
//! transport's and the memory subsystem's work at both ends — posting,
//! building and checking packets (ICRC included), executing, acknowledging,
//! completing — everything but system calls and the kernel's copies.
//!
//! Run: `cargo bench -p uroce --bench engine [-- SIZE ...]`

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::{Duration, Instant};
use uroce::ib::{Access, Gid, Mtu, QpAttrMask as M, QpState, QpType, Sge, Wc, WcStatus};
use uroce::mem::Memory;
use uroce::proto::cq::CompletionQueue;
use uroce::proto::qp::{required_attributes, QpInit};
use uroce::proto::wr::{AddressVector, QpAttr, QpCap, SendWr, WrOpcode};
use uroce::proto::{Engine, EngineConfig};

const A: [u8; 4] = [10, 0, 0, 1];
const B: [u8; 4] = [10, 0, 0, 2];
const PORT: u16 = 4791;
const DEPTH: u64 = 128;
const SIGNAL_EVERY: u64 = 16;

struct End {
    e: Engine,
    qpn: u32,
    cq: Arc<CompletionQueue>,
    ip: IpAddr,
}

fn end(ip: [u8; 4], mem: &Arc<Memory>) -> End {
    let mut e = Engine::new(EngineConfig::new(ip.into(), PORT, Mtu::Mtu4096), mem.clone());
    let cq = Arc::new(CompletionQueue::new(1, 4096));
    let cap = QpCap { max_send_wr: 256, max_recv_wr: 16, max_send_sge: 1, max_recv_sge: 1, max_inline_data: 0 };
    let init = QpInit {
        qp_type: QpType::Rc,
        pd: 1,
        send_cq: cq.clone(),
        recv_cq: cq.clone(),
        srq: None,
        cap,
        sq_sig_all: false,
        scatter_to_cqe: false,
    };
    let qpn = e.create_qp(init).unwrap();
    End { e, qpn, cq, ip: ip.into() }
}

fn connect(x: &mut End, peer_ip: IpAddr, peer_qpn: u32, now: Instant) {
    let mut a = QpAttr {
        port_num: 1,
        qp_access_flags: Access::LOCAL_WRITE | Access::REMOTE_WRITE | Access::REMOTE_READ,
        path_mtu: Mtu::Mtu4096,
        dest_qp_num: peer_qpn,
        max_dest_rd_atomic: 16,
        max_rd_atomic: 16,
        min_rnr_timer: 12,
        timeout: 14,
        retry_cnt: 7,
        rnr_retry: 7,
        ah_attr: AddressVector {
            dgid: Gid::from_ip(peer_ip),
            is_global: true,
            hop_limit: 64,
            port_num: 1,
            ..Default::default()
        },
        ..QpAttr::default()
    };
    for (cur, next) in [(QpState::Reset, QpState::Init), (QpState::Init, QpState::Rtr), (QpState::Rtr, QpState::Rts)] {
        a.qp_state = next;
        x.e.modify_qp(now, x.qpn, &a, M::STATE | required_attributes(QpType::Rc, cur, next)).unwrap();
    }
}

/// Moves every packet `from` has to `to`; returns how many.
fn deliver(from: &mut End, to: &mut End, now: Instant) -> usize {
    let src = SocketAddr::new(from.ip, PORT);
    let mut n = 0;
    while let Some(t) = from.e.poll_transmit(now) {
        to.e.handle_datagram(now, src, to.ip, &t.data);
        from.e.recycle(t.data);
        n += 1;
    }
    n
}

/// Runs `iters` WRITEs of `size` bytes; returns the time they took.
fn run(size: usize, iters: u64) -> Duration {
    let mem = Arc::new(Memory::new());
    let src = vec![0x5Au8; size];
    let dst = vec![0u8; size];
    // SAFETY: both buffers outlive `mem`'s use in this function (the
    // engines and the memory are dropped at its end, before the buffers).
    let (smr, dmr) = unsafe {
        (
            mem.register(1, src.as_ptr() as usize, size as u64, src.as_ptr() as u64, Access::LOCAL_WRITE, None)
                .unwrap(),
            mem.register(
                1,
                dst.as_ptr() as usize,
                size as u64,
                dst.as_ptr() as u64,
                Access::LOCAL_WRITE | Access::REMOTE_WRITE,
                None,
            )
            .unwrap(),
        )
    };
    let now = Instant::now();
    let (mut a, mut b) = (end(A, &mem), end(B, &mem));
    let (aq, bq) = (a.qpn, b.qpn);
    connect(&mut a, B.into(), bq, now);
    connect(&mut b, A.into(), aq, now);
    let sge = Sge { addr: src.as_ptr() as u64, length: size as u32, lkey: smr.key };
    let mut wcs = vec![Wc::new(0, WcStatus::Success, uroce::ib::WcOpcode::RdmaWrite, 0); 64];
    let (mut posted, mut done) = (0u64, 0u64);
    let start = Instant::now();
    while done < iters {
        let room = (DEPTH - (posted - done)).min(iters - posted);
        if room >= SIGNAL_EVERY || (room > 0 && posted + room == iters) {
            let wrs = (posted + 1..=posted + room).map(|k| {
                let mut wr = SendWr::new(k, WrOpcode::RdmaWrite);
                wr.sg_list = uroce::sgl![sge];
                wr.remote_addr = dst.as_ptr() as u64;
                wr.rkey = dmr.key;
                if k % SIGNAL_EVERY != 0 && k != iters {
                    wr.flags = uroce::ib::SendFlags::empty();
                }
                wr
            });
            a.e.post_send_list(now, aq, wrs).unwrap();
            posted += room;
        }
        deliver(&mut a, &mut b, now);
        deliver(&mut b, &mut a, now);
        let n = a.cq.poll(&mut wcs).expect("poll");
        for wc in &wcs[..n] {
            assert_eq!(wc.status, WcStatus::Success);
            done = wc.wr_id;
        }
    }
    let t = start.elapsed();
    assert!(dst.iter().all(|&x| x == 0x5A), "the WRITEs landed");
    t
}

fn main() {
    println!("two sans-IO engines in one thread, RDMA WRITE, {DEPTH} outstanding, PMTU 4096");
    println!("{:>8} {:>12} {:>14} {:>12}", "size", "M msg/s", "ns/message", "Gb/s");
    // `cargo bench -p uroce --bench engine -- 64 4096`: only these sizes.
    let only: Vec<usize> = std::env::args().skip(1).filter_map(|a| a.parse().ok()).collect();
    for (size, iters) in [(64usize, 3_000_000u64), (4096, 1_000_000), (65536, 100_000)] {
        if !only.is_empty() && !only.contains(&size) {
            continue;
        }
        run(size, iters / 10); // warm up
        let t = run(size, iters);
        let ns = t.as_secs_f64() * 1e9 / iters as f64;
        println!(
            "{size:>8} {:>12.2} {ns:>14.1} {:>12.1}",
            iters as f64 / t.as_secs_f64() / 1e6,
            (size as u64 * iters) as f64 * 8.0 / t.as_secs_f64() / 1e9
        );
    }
}
