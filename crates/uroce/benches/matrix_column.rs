//! Seed 003's motivation (issue #6): send one column of a row-major matrix
//! (N cells of C bytes, row stride 16 cells) three ways, over RC between
//! two loopback devices:
//! * **SGEs**: one SGE per cell (only where N fits in max_send_sge);
//! * **pack**: the CPU copies the cells into a registered bounce buffer,
//!   then one SEND;
//! * **interleaved key**: one SEND through an indirect key whose layout is
//!   one (addr, C, stride − C, lkey) entry repeated N times — O(1) to
//!   describe, registered once.
//!
//! Run: `cargo bench -p uroce --bench matrix_column`

use std::net::{IpAddr, Ipv4Addr};
use std::time::{Duration, Instant};
use uroce::verbs::*;

const COLS: usize = 16;
const T: Duration = Duration::from_secs(30);

struct Side {
    pd: ProtectionDomain,
    cq: CompletionQueue,
    qp: QueuePair,
    _ctx: Context,
}

fn side(name: &str, ip: u8, port: u16) -> Side {
    let ctx = Context::open(&DeviceConfig::at(name, IpAddr::V4(Ipv4Addr::new(127, 0, 0, ip)), port)).unwrap();
    let pd = ctx.alloc_pd().unwrap();
    let cq = ctx.create_cq(1024, None).unwrap();
    let mut a = QpInitAttr::rc(&cq, &cq);
    a.cap.max_send_sge = 32;
    let qp = pd.create_qp(&a).unwrap();
    Side { pd, cq, qp, _ctx: ctx }
}

/// Sends `wr` and waits for both completions, `iters` times; µs per column.
fn run(a: &Side, b: &Side, rbuf: &MemoryRegion, len: usize, iters: u32, mut before: impl FnMut(), wr: &SendWr) -> f64 {
    let t = Instant::now();
    for i in 0..iters {
        b.qp.post_recv(&RecvWr { wr_id: i as u64, sg_list: uroce::sgl![rbuf.sge(0, len as u32)] }).unwrap();
        before();
        a.qp.post_send(wr).unwrap();
        a.cq.wait(1, T).unwrap();
        let wc = b.cq.wait(1, T).unwrap()[0];
        assert_eq!((wc.status, wc.byte_len as usize), (WcStatus::Success, len));
    }
    t.elapsed().as_secs_f64() * 1e6 / iters as f64
}

fn main() {
    let port = 40000 + (std::process::id() % 1000) as u16;
    let (a, b) = (side("mc-a", 1, port), side("mc-b", 2, port));
    a.qp.connect_rc(&b._ctx.query_gid(0).unwrap(), b.qp.qp_num(), 1, 2).unwrap();
    b.qp.connect_rc(&a._ctx.query_gid(0).unwrap(), a.qp.qp_num(), 2, 1).unwrap();
    println!("one column of a row-major matrix ({COLS} cells per row), µs per column (MB/s of column data)");
    println!(
        "{:>8} {:>5} | {:>18} | {:>18} | {:>18} | {:>10} {:>10} {:>8}",
        "N", "C", "SGEs", "pack + send", "interleaved key", "SGE mem", "bounce", "key mem"
    );
    for &n in &[16usize, 32, 64, 1024, 65536, 1 << 20] {
        for &c in &[8usize, 64] {
            let row = COLS * c;
            let matrix: Vec<u8> = (0..n * row).map(|i| (i / c) as u8).collect();
            let m = a.pd.register(matrix, Access::LOCAL_WRITE).unwrap();
            let len = n * c;
            let rbuf = b.pd.register(vec![0u8; len], Access::LOCAL_WRITE).unwrap();
            let iters = ((1 << 24) / len).clamp(3, 2000) as u32;
            let col = 3;
            let mbps = |us: f64| len as f64 / us;
            // SGEs.
            let sges = if n <= 32 {
                let mut w = SendWr::new(1, WrOpcode::Send);
                w.sg_list = (0..n).map(|r| m.sge(r * row + col * c, c as u32)).collect();
                let us = run(&a, &b, &rbuf, len, iters, || {}, &w);
                format!("{us:9.1} ({:6.0})", mbps(us))
            } else {
                format!("{:>18}", "n/a (> max_sge)")
            };
            // Pack into a bounce buffer.
            let bounce = a.pd.register(vec![0u8; len], Access::LOCAL_WRITE).unwrap();
            let mut scratch = vec![0u8; len];
            let mut w = SendWr::new(2, WrOpcode::Send);
            w.sg_list = uroce::sgl![bounce.sge(0, len as u32)];
            let pack_us = run(
                &a,
                &b,
                &rbuf,
                len,
                iters,
                || {
                    let base = m.addr() as *const u8;
                    for r in 0..n {
                        // SAFETY: inside the registered matrix, which lives
                        // (owned by `m`) for the whole benchmark.
                        let cell = unsafe { std::slice::from_raw_parts(base.add(r * row + col * c), c) };
                        scratch[r * c..(r + 1) * c].copy_from_slice(cell);
                    }
                    bounce.write_at(0, &scratch).unwrap();
                },
                &w,
            );
            // Interleaved key.
            let key = a.pd.create_indirect_key(2).unwrap();
            let e = InterleavedEntry {
                addr: m.iova() + (col * c) as u64,
                bytes_count: c as u32,
                bytes_skip: (row - c) as u32,
                lkey: m.lkey(),
            };
            key.set_layout(Layout::interleaved(Access::LOCAL_WRITE, n as u32, &[e])).unwrap();
            let mut w = SendWr::new(3, WrOpcode::Send);
            w.sg_list = uroce::sgl![uroce::ib::Sge { addr: 0, length: len as u32, lkey: key.lkey() }];
            let key_us = run(&a, &b, &rbuf, len, iters, || {}, &w);
            let expect: Vec<u8> =
                (0..n).flat_map(|r| std::iter::repeat_n(((r * row + col * c) / c) as u8, c)).collect();
            assert_eq!(rbuf.to_vec(), expect, "column data");
            println!(
                "{:>8} {:>5} | {} | {:9.1} ({:6.0}) | {:9.1} ({:6.0}) | {:>10} {:>10} {:>8}",
                n,
                c,
                sges,
                pack_us,
                mbps(pack_us),
                key_us,
                mbps(key_us),
                if n <= 32 { format!("{} B", n * 16) } else { "-".into() },
                format!("{} B", len),
                "24 B"
            );
        }
    }
}
