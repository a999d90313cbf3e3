//! Memory windows type 1 and 2B over real sockets: access inside and outside
//! a window, invalidation (unbind, LOCAL_INV, SEND_WITH_INV), stale keys,
//! QP binding of type 2, bind-time rules, EBUSY on dereg.

mod common;

use common::*;
use std::time::Duration;
use uroce::ib::Errno;
use uroce::verbs::*;

const T: Duration = Duration::from_secs(5);

/// RDMA WRITE of 8 bytes from `a` to `addr` with `rkey`; the completion status.
fn write(a: &End, src: &MemoryRegion, id: u64, addr: u64, rkey: u32) -> WcStatus {
    let mut w = wr(id, WrOpcode::RdmaWrite, src.sge(0, 8));
    w.remote_addr = addr;
    w.rkey = rkey;
    a.qp.post_send(&w).unwrap();
    a.cq.wait(1, T).unwrap()[0].status
}

#[test]
fn type1_window_grants_and_revokes() {
    let (a, b) = connected(None);
    let src = a.pd.register(vec![5u8; 8], Access::empty()).unwrap();
    // The MR itself grants no remote access: only the window does.
    let mr = b.pd.register(vec![0u8; 4096], Access::LOCAL_WRITE | Access::MW_BIND).unwrap();
    let mw = b.pd.alloc_mw(MwType::Type1).unwrap();
    let old = mw.rkey();
    let k = b.qp.bind_mw(&mw, 7, SendFlags::SIGNALED, Some(&mr), mr.iova() + 1024, 1024, Access::REMOTE_WRITE).unwrap();
    let wc = b.cq.wait(1, T).unwrap()[0];
    assert_eq!((wc.wr_id, wc.status, wc.opcode), (7, WcStatus::Success, WcOpcode::BindMw));
    assert_ne!(k, old);
    assert_eq!(mw.rkey(), k);
    assert_eq!(write(&a, &src, 1, mr.iova() + 1024, k), WcStatus::Success);
    assert_eq!(&mr.to_vec()[1024..1032], &[5u8; 8]);
    // MR still busy while bound.
    let (mr, e) = mr.dereg().unwrap_err();
    assert_eq!(e.errno, Errno::EBUSY);
    // Unbind by zero length: the key dies.
    let k2 = b.qp.bind_mw(&mw, 8, SendFlags::SIGNALED, None, 0, 0, Access::empty()).unwrap();
    assert_eq!(b.cq.wait(1, T).unwrap()[0].status, WcStatus::Success);
    assert_ne!(k2, k);
    assert!(!mw.is_bound());
    assert_eq!(write(&a, &src, 2, mr.iova() + 1024, k), WcStatus::RemAccessErr);
    mr.dereg().unwrap();
}

#[test]
fn type1_window_bounds_and_stale_key() {
    let (a, b) = connected(None);
    let src = a.pd.register(vec![5u8; 8], Access::empty()).unwrap();
    let mr = b.pd.register(vec![0u8; 4096], Access::LOCAL_WRITE | Access::MW_BIND).unwrap();
    let mw = b.pd.alloc_mw(MwType::Type1).unwrap();
    let k = b.qp.bind_mw(&mw, 1, SendFlags::SIGNALED, Some(&mr), mr.iova(), 64, Access::REMOTE_WRITE).unwrap();
    b.cq.wait(1, T).unwrap();
    // Outside the window (but inside the MR): refused, and nothing written.
    assert_eq!(write(&a, &src, 1, mr.iova() + 60, k), WcStatus::RemAccessErr);
    assert_eq!(mr.to_vec(), vec![0u8; 4096]);
    // A stale variant of the key never works (new connection needed after ERR).
    let (a, b2) = connected(None);
    let _ = b2;
    let src = a.pd.register(vec![5u8; 8], Access::empty()).unwrap();
    assert_eq!(write(&a, &src, 2, mr.iova(), k ^ 1), WcStatus::RemAccessErr);
}

#[test]
fn type2_window_bound_to_its_qp_and_invalidated() {
    let (a, b) = connected(None);
    let src = a.pd.register(vec![6u8; 8], Access::empty()).unwrap();
    let mr = b.pd.register(vec![0u8; 4096], Access::LOCAL_WRITE | Access::MW_BIND).unwrap();
    let mw = b.pd.alloc_mw(MwType::Type2).unwrap();
    let bind = mw.bind_wr(3, 0x42, &mr, mr.iova(), 4096, Access::REMOTE_WRITE | Access::REMOTE_READ);
    b.qp.post_send(&bind).unwrap();
    assert_eq!(b.cq.wait(1, T).unwrap()[0].opcode, WcOpcode::BindMw);
    let k = mw.rkey();
    assert_eq!(k & 0xff, 0x42);
    assert_eq!(write(&a, &src, 1, mr.iova(), k), WcStatus::Success);
    // Rebinding a bound type-2 window is an error (MW_BIND_ERR, QP to ERR).
    let (a2, b2) = connected(None);
    let mr2 = b2.pd.register(vec![0u8; 64], Access::LOCAL_WRITE | Access::MW_BIND).unwrap();
    let mw2 = b2.pd.alloc_mw(MwType::Type2).unwrap();
    b2.qp.post_send(&mw2.bind_wr(1, 1, &mr2, mr2.iova(), 64, Access::REMOTE_WRITE)).unwrap();
    b2.cq.wait(1, T).unwrap();
    b2.qp.post_send(&mw2.bind_wr(2, 2, &mr2, mr2.iova(), 64, Access::REMOTE_WRITE)).unwrap();
    assert_eq!(b2.cq.wait(1, T).unwrap()[0].status, WcStatus::MwBindErr);
    drop(a2);
    // LOCAL_INV on its QP revokes.
    let mut inv = SendWr::new(4, WrOpcode::LocalInv);
    inv.imm_data = k;
    b.qp.post_send(&inv).unwrap();
    let wc = b.cq.wait(1, T).unwrap()[0];
    assert_eq!((wc.status, wc.opcode), (WcStatus::Success, WcOpcode::LocalInv));
    assert_eq!(write(&a, &src, 2, mr.iova(), k), WcStatus::RemAccessErr);
}

#[test]
fn type2_window_refuses_other_qps_and_send_with_inv_revokes() {
    let (a, b) = connected(None);
    let src = a.pd.register(vec![6u8; 8], Access::empty()).unwrap();
    let mr = b.pd.register(vec![0u8; 4096], Access::LOCAL_WRITE | Access::MW_BIND).unwrap();
    let mw = b.pd.alloc_mw(MwType::Type2).unwrap();
    b.qp.post_send(&mw.bind_wr(1, 9, &mr, mr.iova(), 4096, Access::REMOTE_WRITE)).unwrap();
    b.cq.wait(1, T).unwrap();
    let k = mw.rkey();
    // SEND_WITH_INV from the peer invalidates it before the receive completes.
    let rx = b.pd.register(vec![0u8; 16], Access::LOCAL_WRITE).unwrap();
    b.qp.post_recv(&RecvWr { wr_id: 5, sg_list: uroce::sgl![rx.sge(0, 16)] }).unwrap();
    let mut s = wr(2, WrOpcode::SendInv, src.sge(0, 8));
    s.imm_data = k;
    a.qp.post_send(&s).unwrap();
    let rc = b.cq.wait(1, T).unwrap()[0];
    assert_eq!(rc.status, WcStatus::Success);
    assert!(rc.wc_flags.contains(WcFlags::WITH_INV));
    assert_eq!(rc.imm_data, k, "invalidated_rkey");
    assert_eq!(a.cq.wait(1, T).unwrap()[0].status, WcStatus::Success);
    assert!(!mw.is_bound());
    assert_eq!(write(&a, &src, 3, mr.iova(), k), WcStatus::RemAccessErr);

    // A type-2 window bound on one QP is refused to another QP of the PD.
    let (a, b) = connected(None);
    let mr = b.pd.register(vec![0u8; 64], Access::LOCAL_WRITE | Access::MW_BIND).unwrap();
    let other = b.pd.create_qp(&QpInitAttr::rc(&b.cq, &b.cq)).unwrap();
    let mw = b.pd.alloc_mw(MwType::Type2).unwrap();
    let bind = mw.bind_wr(1, 1, &mr, mr.iova(), 64, Access::REMOTE_WRITE);
    // Bind it to `other` (not connected to `a`'s QP): `other` must be in RTS to post.
    let a2 = a.pd.create_qp(&QpInitAttr::rc(&a.cq, &a.cq)).unwrap();
    a2.connect_rc(&b.ctx.query_gid(0).unwrap(), other.qp_num(), 1, 2).unwrap();
    other.connect_rc(&a.ctx.query_gid(0).unwrap(), a2.qp_num(), 2, 1).unwrap();
    other.post_send(&bind).unwrap();
    assert_eq!(b.cq.wait(1, T).unwrap()[0].status, WcStatus::Success);
    let src = a.pd.register(vec![6u8; 8], Access::empty()).unwrap();
    assert_eq!(write(&a, &src, 4, mr.iova(), mw.rkey()), WcStatus::RemAccessErr, "via another QP");
}

#[test]
fn bind_time_rules() {
    let (_a, b) = connected(None);
    // MR without MW_BIND.
    let mr = b.pd.register(vec![0u8; 64], Access::LOCAL_WRITE).unwrap();
    let mw = b.pd.alloc_mw(MwType::Type1).unwrap();
    b.qp.bind_mw(&mw, 1, SendFlags::SIGNALED, Some(&mr), mr.iova(), 8, Access::REMOTE_READ).unwrap();
    assert_eq!(b.cq.wait(1, T).unwrap()[0].status, WcStatus::MwBindErr);
    assert_eq!(b.qp.state(), QpState::Err);
    // Remote write through a window needs local write on the MR; zero-based
    // type 1 is refused; type 2 via ibv_bind_mw is EINVAL.
    for (access, mr_access) in
        [(Access::REMOTE_WRITE, Access::MW_BIND), (Access::REMOTE_READ | Access::ZERO_BASED, Access::MW_BIND)]
    {
        let (_a, b) = connected(None);
        let mr = b.pd.register(vec![0u8; 64], mr_access).unwrap();
        let mw = b.pd.alloc_mw(MwType::Type1).unwrap();
        b.qp.bind_mw(&mw, 1, SendFlags::empty(), Some(&mr), mr.iova(), 8, access).unwrap();
        assert_eq!(
            b.cq.wait(1, T).unwrap()[0].status,
            WcStatus::MwBindErr,
            "{access:?} on {mr_access:?}: error CQE even unsignaled"
        );
    }
    let (_a, b) = connected(None);
    let mw2 = b.pd.alloc_mw(MwType::Type2).unwrap();
    let e = b.qp.bind_mw(&mw2, 1, SendFlags::empty(), None, 0, 0, Access::empty()).unwrap_err();
    assert_eq!(e.errno, Errno::EINVAL);
    // A PD whose only object is a window cannot be deallocated.
    let pd = b.ctx.alloc_pd().unwrap();
    let w = pd.alloc_mw(MwType::Type1).unwrap();
    let (pd, e) = pd.dealloc().unwrap_err();
    assert_eq!(e.errno, Errno::EBUSY);
    drop(w);
    pd.dealloc().unwrap();
}
