//! Error paths over real sockets: every failed operation completes with the
//! IBA status real devices use, and invalid calls return the verbs errno.

mod common;

use common::*;
use std::time::Duration;
use uroce::ib::Errno;
use uroce::verbs::*;

fn to_rts(qp: &QueuePair, peer: &Context, peer_qpn: u32, timeout: u8, retry: u8, rnr_retry: u8) {
    let mut a = QpAttr {
        qp_state: QpState::Init,
        port_num: 1,
        qp_access_flags: Access::LOCAL_WRITE | Access::REMOTE_WRITE,
        ..QpAttr::default()
    };
    qp.modify(&a, QpAttrMask::STATE | QpAttrMask::PKEY_INDEX | QpAttrMask::PORT | QpAttrMask::ACCESS_FLAGS).unwrap();
    a.qp_state = QpState::Rtr;
    a.path_mtu = Mtu::Mtu1024;
    a.dest_qp_num = peer_qpn;
    a.max_dest_rd_atomic = 1;
    a.min_rnr_timer = 1;
    a.ah_attr = AddressVector {
        dgid: peer.query_gid(0).unwrap(),
        is_global: true,
        hop_limit: 64,
        port_num: 1,
        ..Default::default()
    };
    let m = QpAttrMask::STATE
        | QpAttrMask::AV
        | QpAttrMask::PATH_MTU
        | QpAttrMask::DEST_QPN
        | QpAttrMask::RQ_PSN
        | QpAttrMask::MAX_DEST_RD_ATOMIC
        | QpAttrMask::MIN_RNR_TIMER;
    qp.modify(&a, m).unwrap();
    a.qp_state = QpState::Rts;
    a.timeout = timeout;
    a.retry_cnt = retry;
    a.rnr_retry = rnr_retry;
    a.max_rd_atomic = 1;
    let m = QpAttrMask::STATE
        | QpAttrMask::TIMEOUT
        | QpAttrMask::RETRY_CNT
        | QpAttrMask::RNR_RETRY
        | QpAttrMask::SQ_PSN
        | QpAttrMask::MAX_QP_RD_ATOMIC;
    qp.modify(&a, m).unwrap();
}

#[test]
fn retry_exhausted_when_peer_qp_is_gone() {
    let (a, b) = pair_with(None);
    let a = end(a);
    // No QP 0xabcd on b: packets are dropped, the requester times out.
    to_rts(&a.qp, &b, 0xabcd, 10, 2, 7); // 4 ms timeout, 2 retries
    let m = a.pd.register(vec![0u8; 64], Access::LOCAL_WRITE).unwrap();
    a.qp.post_send(&wr(1, WrOpcode::Send, m.sge(0, 64))).unwrap();
    a.qp.post_send(&wr(2, WrOpcode::Send, m.sge(0, 64))).unwrap();
    let wcs = a.cq.wait(2, Duration::from_secs(10)).unwrap();
    assert_eq!(wcs[0].status, WcStatus::RetryExcErr);
    assert_eq!(wcs[1].status, WcStatus::WrFlushErr);
    assert_eq!(a.ctx.stats().timeouts, 3, "first try + 2 retries");
    assert_eq!(a.qp.state(), QpState::Err);
    assert!(b.stats().rx_drop_no_qp >= 3);
}

/// `retry_cnt = 7` is seven retries, as in the IBA and on hardware (rxe
/// reads it as "forever"): an application whose peer died gets
/// RETRY_EXC_ERR. perftest always sets 7.
#[test]
fn retry_cnt_seven_is_seven_retries() {
    let (a, b) = pair_with(None);
    let a = end(a);
    to_rts(&a.qp, &b, 0xabcd, 8, 7, 7); // 1 ms timeout, 7 retries
    let m = a.pd.register(vec![0u8; 64], Access::LOCAL_WRITE).unwrap();
    a.qp.post_send(&wr(1, WrOpcode::Send, m.sge(0, 64))).unwrap();
    let wcs = a.cq.wait(1, Duration::from_secs(10)).unwrap();
    assert_eq!(wcs[0].status, WcStatus::RetryExcErr);
    assert_eq!(a.ctx.stats().timeouts, 8, "first try + 7 retries");
}

#[test]
fn rnr_retry_exhausted_without_receive() {
    let (ca, cb) = pair_with(None);
    let (a, b) = (end(ca), end(cb));
    to_rts(&a.qp, &b.ctx, b.qp.qp_num(), 14, 7, 1);
    to_rts(&b.qp, &a.ctx, a.qp.qp_num(), 14, 7, 1);
    let m = a.pd.register(vec![0u8; 64], Access::LOCAL_WRITE).unwrap();
    a.qp.post_send(&wr(1, WrOpcode::Send, m.sge(0, 64))).unwrap();
    let wc = a.cq.wait(1, Duration::from_secs(10)).unwrap()[0];
    assert_eq!(wc.status, WcStatus::RnrRetryExcErr);
    assert_eq!(a.ctx.stats().rnr_naks_received, 2, "first try + 1 retry");
}

#[test]
fn bad_lkey_is_a_local_protection_error() {
    let (a, _b) = connected(None);
    let m = a.pd.register(vec![0u8; 64], Access::LOCAL_WRITE).unwrap();
    let mut bad = m.sge(0, 64);
    bad.lkey ^= 0x55;
    let sent = a.ctx.stats().tx_packets;
    a.qp.post_send(&wr(1, WrOpcode::Send, bad)).unwrap();
    let wc = a.cq.wait(1, Duration::from_secs(5)).unwrap()[0];
    assert_eq!((wc.wr_id, wc.status), (1, WcStatus::LocProtErr));
    assert_eq!(a.ctx.stats().tx_packets, sent, "a bad SGE sends nothing");
    assert_eq!(a.qp.state(), QpState::Err);
    // Posting in ERR completes at once with a flush.
    a.qp.post_send(&wr(2, WrOpcode::Send, m.sge(0, 8))).unwrap();
    assert_eq!(a.cq.wait(1, Duration::from_secs(5)).unwrap()[0].status, WcStatus::WrFlushErr);
}

#[test]
fn receive_too_small_is_local_length_error_and_nak() {
    let (a, b) = connected(None);
    let tx = a.pd.register(vec![1u8; 100], Access::empty()).unwrap();
    let rx = b.pd.register(vec![0u8; 100], Access::LOCAL_WRITE).unwrap();
    b.qp.post_recv(&RecvWr { wr_id: 9, sg_list: uroce::sgl![rx.sge(0, 50)] }).unwrap();
    a.qp.post_send(&wr(1, WrOpcode::Send, tx.sge(0, 100))).unwrap();
    assert_eq!(b.cq.wait(1, Duration::from_secs(5)).unwrap()[0].status, WcStatus::LocLenErr);
    assert_eq!(a.cq.wait(1, Duration::from_secs(5)).unwrap()[0].status, WcStatus::RemInvReqErr);
    assert_eq!(&rx.to_vec()[50..], &[0u8; 50][..], "nothing written past the buffer");
}

#[test]
fn post_errors_return_errno() {
    let (ca, _cb) = pair_with(None);
    let a = end(ca);
    let m = a.pd.register(vec![0u8; 64], Access::LOCAL_WRITE).unwrap();
    // RESET: posting a send is EINVAL.
    assert_eq!(a.qp.post_send(&wr(1, WrOpcode::Send, m.sge(0, 8))).unwrap_err().errno, Errno::EINVAL);
    assert_eq!(a.qp.post_recv(&RecvWr { wr_id: 1, sg_list: uroce::sgl![] }).unwrap_err().errno, Errno::EINVAL);
    // Invalid transitions and missing attributes.
    let rtr = QpAttr { qp_state: QpState::Rtr, ..QpAttr::default() };
    assert_eq!(a.qp.modify(&rtr, QpAttrMask::STATE).unwrap_err().errno, Errno::EINVAL);
    let init = QpAttr { qp_state: QpState::Init, port_num: 1, ..QpAttr::default() };
    assert_eq!(
        a.qp.modify(&init, QpAttrMask::STATE | QpAttrMask::PORT).unwrap_err().errno,
        Errno::EINVAL,
        "missing PKEY_INDEX, ACCESS_FLAGS"
    );
    let bad_port = QpAttr { qp_state: QpState::Init, port_num: 2, ..QpAttr::default() };
    let m3 = QpAttrMask::STATE | QpAttrMask::PORT | QpAttrMask::PKEY_INDEX | QpAttrMask::ACCESS_FLAGS;
    assert_eq!(a.qp.modify(&bad_port, m3).unwrap_err().errno, Errno::EINVAL);
    assert_eq!(
        a.qp.modify(&QpAttr { qkey: 1, ..init }, m3 | QpAttrMask::QKEY).unwrap_err().errno,
        Errno::EINVAL,
        "QKEY on RC"
    );
    a.qp.modify(&init, m3).unwrap();
    assert_eq!(a.qp.state(), QpState::Init);
    // Too many SGEs, and a queue overflow.
    a.qp.post_recv(&RecvWr { wr_id: 1, sg_list: uroce::sgl![m.sge(0, 8)] }).unwrap();
    let five = RecvWr { wr_id: 2, sg_list: uroce::sgl![m.sge(0, 8); 5] };
    assert_eq!(a.qp.post_recv(&five).unwrap_err().errno, Errno::EINVAL);
    for i in 0..255 {
        a.qp.post_recv(&RecvWr { wr_id: i, sg_list: uroce::sgl![] }).unwrap();
    }
    assert_eq!(a.qp.post_recv(&RecvWr { wr_id: 0, sg_list: uroce::sgl![] }).unwrap_err().errno, Errno::ENOMEM);
    // Registration rules.
    assert_eq!(a.pd.register(vec![0u8; 8], Access::REMOTE_WRITE).unwrap_err().errno, Errno::EINVAL);
    // CQ bounds; destroying a CQ and a PD in use.
    assert_eq!(a.ctx.create_cq(0, None).unwrap_err().errno, Errno::EINVAL);
    let End { cq, pd, qp, .. } = a;
    let (cq, e) = cq.destroy().unwrap_err();
    assert_eq!(e.errno, Errno::EBUSY);
    let (pd, e) = pd.dealloc().unwrap_err();
    assert_eq!(e.errno, Errno::EBUSY);
    drop(qp);
    drop(m);
    cq.destroy().unwrap();
    pd.dealloc().unwrap();
}

#[test]
fn atomic_misaligned_or_short_is_einval() {
    let (a, _b) = connected(None);
    let m = a.pd.register(vec![0u8; 64], Access::LOCAL_WRITE).unwrap();
    let mut f = wr(1, WrOpcode::AtomicFetchAdd, m.sge(0, 8));
    f.remote_addr = 0x1004;
    assert_eq!(a.qp.post_send(&f).unwrap_err().errno, Errno::EINVAL);
    f.remote_addr = 0x1000;
    f.sg_list = uroce::sgl![m.sge(0, 4)];
    assert_eq!(a.qp.post_send(&f).unwrap_err().errno, Errno::EINVAL);
}

#[test]
fn inline_send_and_uc_write() {
    let (a, b) = connected(None);
    let rx = b.pd.register(vec![0u8; 64], Access::LOCAL_WRITE).unwrap();
    b.qp.post_recv(&RecvWr { wr_id: 1, sg_list: uroce::sgl![rx.sge(0, 64)] }).unwrap();
    let mut s = SendWr::new(1, WrOpcode::Send);
    s.inline = Some(b"inline bytes".to_vec());
    a.qp.post_send(&s).unwrap();
    assert_eq!(b.cq.wait(1, Duration::from_secs(5)).unwrap()[0].byte_len, 12);
    assert_eq!(&rx.to_vec()[..12], b"inline bytes");
    s.inline = Some(vec![0u8; 65]);
    assert_eq!(a.qp.post_send(&s).unwrap_err().errno, Errno::EINVAL, "above max_inline_data");

    // UC: a WRITE completes on transmission and lands.
    let uc_a = a.pd.create_qp(&QpInitAttr { qp_type: QpType::Uc, ..QpInitAttr::rc(&a.cq, &a.cq) }).unwrap();
    let uc_b = b.pd.create_qp(&QpInitAttr { qp_type: QpType::Uc, ..QpInitAttr::rc(&b.cq, &b.cq) }).unwrap();
    for (q, peer, pq) in [(&uc_a, &b.ctx, uc_b.qp_num()), (&uc_b, &a.ctx, uc_a.qp_num())] {
        let mut at = QpAttr {
            qp_state: QpState::Init,
            port_num: 1,
            qp_access_flags: Access::LOCAL_WRITE | Access::REMOTE_WRITE,
            ..QpAttr::default()
        };
        q.modify(&at, QpAttrMask::STATE | QpAttrMask::PKEY_INDEX | QpAttrMask::PORT | QpAttrMask::ACCESS_FLAGS)
            .unwrap();
        at.qp_state = QpState::Rtr;
        at.path_mtu = Mtu::Mtu1024;
        at.dest_qp_num = pq;
        at.ah_attr =
            AddressVector { dgid: peer.query_gid(0).unwrap(), is_global: true, port_num: 1, ..Default::default() };
        q.modify(
            &at,
            QpAttrMask::STATE | QpAttrMask::AV | QpAttrMask::PATH_MTU | QpAttrMask::DEST_QPN | QpAttrMask::RQ_PSN,
        )
        .unwrap();
        at.qp_state = QpState::Rts;
        q.modify(&at, QpAttrMask::STATE | QpAttrMask::SQ_PSN).unwrap();
    }
    let src = a.pd.register((0..5000u32).map(|i| i as u8).collect(), Access::empty()).unwrap();
    let dst = b.pd.register(vec![0u8; 5000], Access::LOCAL_WRITE | Access::REMOTE_WRITE).unwrap();
    let mut w = wr(5, WrOpcode::RdmaWrite, src.sge(0, 5000));
    w.remote_addr = dst.iova();
    w.rkey = dst.rkey();
    uc_a.post_send(&w).unwrap();
    assert_eq!(a.cq.wait(1, Duration::from_secs(5)).unwrap()[0].status, WcStatus::Success);
    let t = std::time::Instant::now();
    while dst.to_vec() != src.to_vec() && t.elapsed() < Duration::from_secs(5) {
        std::thread::sleep(Duration::from_millis(1));
    }
    assert_eq!(dst.to_vec(), src.to_vec());
    let mut r = wr(6, WrOpcode::RdmaRead, src.sge(0, 8));
    r.remote_addr = dst.iova();
    assert_eq!(uc_a.post_send(&r).unwrap_err().errno, Errno::EINVAL, "no READ on UC");
}

#[test]
fn post_list_reports_the_first_bad_wr() {
    let (a, b) = connected(None);
    let m = a.pd.register(vec![0u8; 64], Access::LOCAL_WRITE).unwrap();
    let rx = b.pd.register(vec![0u8; 64], Access::LOCAL_WRITE).unwrap();
    b.qp.post_recv_list((0..2).map(|i| RecvWr { wr_id: i, sg_list: uroce::sgl![rx.sge(0, 64)] })).unwrap();
    let good = wr(1, WrOpcode::Send, m.sge(0, 8));
    let mut bad = wr(2, WrOpcode::Send, m.sge(0, 8));
    bad.sg_list = uroce::sgl![m.sge(0, 1); 5]; // above max_send_sge
    let (i, e) = a.qp.post_send_list([good.clone(), bad, good]).unwrap_err();
    assert_eq!((i, e.errno), (1, Errno::EINVAL));
    let wcs = a.cq.wait(1, Duration::from_secs(5)).unwrap();
    assert_eq!(wcs[0].wr_id, 1, "the WR before bad_wr was posted");
    std::thread::sleep(Duration::from_millis(20));
    assert!(a.cq.poll_one().is_none(), "nothing after bad_wr was posted");
}

#[test]
fn rereg_changes_what_the_peer_may_do() {
    let (a, b) = connected(None);
    let src = a.pd.register(vec![7u8; 32], Access::empty()).unwrap();
    let mut target = b.pd.register(vec![0u8; 32], Access::LOCAL_WRITE).unwrap();
    let write = |id: u64, t: &MemoryRegion| {
        let mut w = wr(id, WrOpcode::RdmaWrite, src.sge(0, 32));
        w.remote_addr = t.iova();
        w.rkey = t.rkey();
        w
    };
    let key = target.rkey();
    target.rereg_access(Access::LOCAL_WRITE | Access::REMOTE_WRITE).unwrap();
    assert_eq!(target.rkey(), key, "access change keeps the key");
    a.qp.post_send(&write(1, &target)).unwrap();
    assert_eq!(a.cq.wait(1, Duration::from_secs(5)).unwrap()[0].status, WcStatus::Success);
    assert_eq!(target.to_vec(), vec![7u8; 32]);
    // Moving it to a new buffer gives a new key; the old key is refused.
    let old = write(2, &target);
    target.rereg_buffer(vec![0u8; 64]).unwrap();
    assert_ne!(target.rkey(), key);
    a.qp.post_send(&old).unwrap();
    assert_eq!(a.cq.wait(1, Duration::from_secs(5)).unwrap()[0].status, WcStatus::RemAccessErr);
    assert_eq!(target.to_vec(), vec![0u8; 64]);
}
