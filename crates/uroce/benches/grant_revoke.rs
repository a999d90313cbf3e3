//! Cost of granting and revoking remote access to a 1 MiB range, three ways
//! (issue #4): a type-2 memory window (BIND_MW + LOCAL_INV through the send
//! queue), `rereg_mr` with a new translation, and deregister + register.
//!
//! Run: `cargo bench -p uroce --bench grant_revoke`

use std::time::{Duration, Instant};
use uroce::verbs::*;

fn per_op(n: u32, t: Duration) -> f64 {
    t.as_secs_f64() * 1e6 / n as f64
}

fn main() {
    let ctx = Context::open(&DeviceConfig { name: "bench-gr".into(), ..DeviceConfig::loopback() }).expect("device");
    let pd = ctx.alloc_pd().unwrap();
    let cq = ctx.create_cq(4096, None).unwrap();
    let qp = pd.create_qp(&QpInitAttr::rc(&cq, &cq)).unwrap();
    // A QP in RTS to itself carries the local work requests.
    qp.connect_rc(&ctx.query_gid(0).unwrap(), qp.qp_num(), 1, 1).unwrap();
    const LEN: usize = 1 << 20;
    let mr = pd.register(vec![0u8; LEN], Access::LOCAL_WRITE | Access::MW_BIND).unwrap();
    let mw = pd.alloc_mw(MwType::Type2).unwrap();

    let n = 20_000u32;
    let t = Instant::now();
    for i in 0..n {
        qp.post_send(&mw.bind_wr(i as u64, i as u8, &mr, mr.iova(), LEN as u64, Access::REMOTE_WRITE)).unwrap();
        let mut inv = SendWr::new(i as u64, WrOpcode::LocalInv);
        inv.imm_data = mw.rkey();
        qp.post_send(&inv).unwrap();
        cq.wait(2, Duration::from_secs(5)).unwrap();
    }
    let mw_us = per_op(n, t.elapsed());

    let m = 200u32;
    let mut r = pd.register(vec![0u8; LEN], Access::LOCAL_WRITE | Access::REMOTE_WRITE).unwrap();
    let t = Instant::now();
    for _ in 0..m {
        r.rereg_buffer(vec![1u8; LEN]).unwrap();
    }
    let rereg_us = per_op(m, t.elapsed());

    let t = Instant::now();
    for _ in 0..m {
        let x = pd.register(vec![1u8; LEN], Access::LOCAL_WRITE | Access::REMOTE_WRITE).unwrap();
        drop(x);
    }
    let rereg2_us = per_op(m, t.elapsed());

    println!("grant + revoke remote access to 1 MiB (µs per cycle):");
    println!("  MW type 2 bind + LOCAL_INV        {mw_us:10.2}");
    println!("  rereg_mr(CHANGE_TRANSLATION)      {rereg_us:10.2}   ({:.0}x the MW cycle)", rereg_us / mw_us);
    println!("  dereg_mr + reg_mr                 {rereg2_us:10.2}   ({:.0}x the MW cycle)", rereg2_us / mw_us);
}
