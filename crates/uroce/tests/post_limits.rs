//! Work requests checked against the queue before they are taken, and
//! asynchronous events of destroyed objects, through the Rust API (issue 16
//! §3, issue 17 §2; the C ABI's tests are tests/c/post_limits.c and
//! async_destroy.c of uroce-ibverbs): an endless list of WRs stops at the
//! free slots with ENOMEM on send, receive and SRQ queues; a WR whose SGE
//! count is above the queue's maximum stops a list with EINVAL, the ones
//! before it posted; a queued event of a QP goes when the QP is dropped.

mod common;

use common::*;
use uroce::ib::Errno;
use uroce::verbs::*;

#[test]
fn endless_lists_stop_at_the_free_slots() {
    let (a, b) = connected(None);
    let m = b.pd.register(vec![0u8; 4096], Access::LOCAL_WRITE).unwrap();
    // Receive queue of 256: an endless iterator of receives stops there.
    let rwr = RecvWr { wr_id: 1, sg_list: uroce::sgl![m.sge(0, 64)] };
    let (i, e) = b.qp.post_recv_list(std::iter::repeat(rwr.clone())).unwrap_err();
    assert_eq!((i, e.errno), (256, Errno::ENOMEM));
    assert_eq!(b.qp.post_recv(&rwr).unwrap_err().errno, Errno::ENOMEM, "full");
    // Send queue of 256: the same, and 256 SENDs complete.
    let ma = a.pd.register(vec![7u8; 4096], Access::LOCAL_WRITE).unwrap();
    let (i, e) = a.qp.post_send_list(std::iter::repeat(wr(2, WrOpcode::Send, ma.sge(0, 64)))).unwrap_err();
    assert_eq!((i, e.errno), (256, Errno::ENOMEM));
    let mut got = a.cq.wait(256, T).unwrap();
    got.extend(b.cq.wait(256, T).unwrap());
    assert!(got.iter().all(|w| w.status == WcStatus::Success));
}

#[test]
fn a_bad_wr_stops_the_list_and_the_ones_before_it_run() {
    let (a, b) = connected(None);
    let m = a.pd.register(vec![1u8; 4096], Access::LOCAL_WRITE).unwrap();
    let _mb = b.pd.register(vec![0u8; 4096], Access::LOCAL_WRITE | Access::REMOTE_WRITE).unwrap();
    let mut write = wr(1, WrOpcode::RdmaWrite, m.sge(0, 8));
    write.remote_addr = _mb.addr();
    write.rkey = _mb.rkey();
    write.flags = SendFlags::SIGNALED;
    let mut too_many = write.clone();
    too_many.wr_id = 2;
    too_many.sg_list = (0..5).map(|_| m.sge(0, 8)).collect(); // max_send_sge 4
    let mut third = write.clone();
    third.wr_id = 3;
    let (i, e) = a.qp.post_send_list([write, too_many, third]).unwrap_err();
    assert_eq!((i, e.errno), (1, Errno::EINVAL));
    let wc = a.cq.wait(1, T).unwrap();
    assert_eq!((wc[0].wr_id, wc[0].status), (1, WcStatus::Success));
    std::thread::sleep(std::time::Duration::from_millis(50));
    assert!(a.cq.poll_one().is_none(), "the WR after the bad one was not posted");
}

#[test]
fn srq_lists_stop_at_the_free_slots() {
    let (a, _b) = pair_with(None);
    let pd = a.alloc_pd().unwrap();
    let srq = pd.create_srq(8, 1, 0).unwrap();
    let m = pd.register(vec![0u8; 256], Access::LOCAL_WRITE).unwrap();
    let rwr = RecvWr { wr_id: 1, sg_list: uroce::sgl![m.sge(0, 64)] };
    let mut n = 0;
    let (i, e) = srq
        .post_recv_with(|_, lim| {
            n += 1;
            assert!(n < 100, "asked for WRs past the free slots");
            Some(lim.check_room(n - 1).map(|()| rwr.clone()))
        })
        .unwrap_err();
    assert_eq!((i, e.errno), (8, Errno::ENOMEM));
    assert_eq!(srq.len(), 8);
    // An SGE count above max_sge: EINVAL.
    let two = RecvWr { wr_id: 2, sg_list: uroce::sgl![m.sge(0, 8), m.sge(8, 8)] };
    let srq2 = pd.create_srq(8, 1, 0).unwrap();
    assert_eq!(srq2.post_recv(&two).unwrap_err().errno, Errno::EINVAL);
}

#[test]
fn events_of_a_dropped_qp_are_not_delivered() {
    let (a, _b) = pair_with(None);
    let pd = a.alloc_pd().unwrap();
    let cq = a.create_cq(16, None).unwrap();
    let srq = pd.create_srq(4, 1, 0).unwrap();
    let mut attr = QpInitAttr::rc(&cq, &cq);
    attr.srq = Some(&srq);
    let to_err = |qp: &QueuePair| {
        let at = QpAttr { qp_state: QpState::Err, ..QpAttr::default() };
        qp.modify(&at, QpAttrMask::STATE).unwrap();
    };
    // Delivered while the QP lives.
    let qp = pd.create_qp(&attr).unwrap();
    to_err(&qp);
    let ev = next_async_event(&a).expect("LAST_WQE_REACHED");
    assert_eq!(ev.element, EventElement::Qp(qp.qp_num()));
    drop(qp);
    // Queued, then the QP goes: never delivered.
    let qp = pd.create_qp(&attr).unwrap();
    to_err(&qp);
    drop(qp);
    std::thread::sleep(std::time::Duration::from_millis(100));
    assert_eq!(a.try_async_event(), None);
}

#[test]
fn lists_on_a_qp_in_error_stop_at_the_free_slots_too() {
    // In ERR, posted WRs complete at once with WR_FLUSH_ERR and took no
    // slot: a long list went on as long as the application's iterator did
    // (an endless one forever). As rxe, the list is bounded by the free
    // slots all the same.
    let (a, _b) = pair_with(None);
    let pd = a.alloc_pd().unwrap();
    let cq = a.create_cq(32767, None).unwrap();
    let qp = pd.create_qp(&QpInitAttr::rc(&cq, &cq)).unwrap();
    qp.modify(&QpAttr { qp_state: QpState::Err, ..QpAttr::default() }, QpAttrMask::STATE).unwrap();
    let m = pd.register(vec![0u8; 256], Access::LOCAL_WRITE).unwrap();
    let rwr = RecvWr { wr_id: 1, sg_list: uroce::sgl![m.sge(0, 64)] };
    let (i, e) = qp.post_recv_list(std::iter::repeat_n(rwr, 10_000)).unwrap_err();
    assert_eq!((i, e.errno), (256, Errno::ENOMEM));
    let (i, e) = qp.post_send_list(std::iter::repeat_n(wr(2, WrOpcode::Send, m.sge(0, 8)), 10_000)).unwrap_err();
    assert_eq!((i, e.errno), (256, Errno::ENOMEM));
    assert_eq!(cq.wait(512, T).unwrap().len(), 512);
}

/// The inline limit is rounded up as rxe does (`rxe_qp_init_req`): to
/// max_send_sge × 16 bytes when that is larger than what was asked, and
/// reported so by create_qp and query_qp; inline data up to the limit of a
/// connected QP is taken, one byte more is EINVAL.
#[test]
fn inline_limit_is_rounded_up_to_the_sges_room() {
    let (a, b) = connected(None);
    let cap = QpCap { max_send_wr: 4, max_recv_wr: 4, max_send_sge: 1, max_recv_sge: 1, max_inline_data: 0 };
    for (sge, asked, got) in [(1, 0, 16), (3, 20, 48), (1, 100, 100)] {
        let cap = QpCap { max_send_sge: sge, max_inline_data: asked, ..cap };
        let qp = a.pd.create_qp(&QpInitAttr { cap, ..QpInitAttr::rc(&a.cq, &a.cq) }).unwrap();
        assert_eq!((qp.cap().max_inline_data, qp.query().cap.max_inline_data), (got, got), "{sge} SGEs, {asked} asked");
    }
    let rx = b.pd.register(vec![0u8; 4096], Access::LOCAL_WRITE).unwrap();
    b.qp.post_recv(&RecvWr { wr_id: 1, sg_list: uroce::sgl![rx.sge(0, 4096)] }).unwrap();
    let limit = a.qp.cap().max_inline_data as usize;
    let mut s = SendWr::new(1, WrOpcode::Send);
    s.inline = Some(vec![5u8; limit]);
    a.qp.post_send(&s).unwrap();
    assert_eq!(b.cq.wait(1, T).unwrap()[0].status, WcStatus::Success);
    s.inline = Some(vec![5u8; limit + 1]);
    assert_eq!(a.qp.post_send(&s).unwrap_err().errno, Errno::EINVAL);
}

/// A CQ that overran gives the completions it stored, then EIO, however
/// the overrun and the application's poll interleave: overrun first, then
/// the first poll (CI saw a poll fail with two completions stored, when the
/// overrun came between its empty look and its check of the overrun).
#[test]
fn an_overrun_cq_gives_what_it_stored_then_eio() {
    let (a, b) = connected(None);
    let small = a.ctx.create_cq(2, None).unwrap();
    let qp = a.pd.create_qp(&QpInitAttr::rc(&small, &a.cq)).unwrap();
    let peer = b.pd.create_qp(&QpInitAttr::rc(&b.cq, &b.cq)).unwrap();
    qp.connect_rc(&b.ctx.query_gid(0).unwrap(), peer.qp_num(), 300, 400).unwrap();
    peer.connect_rc(&a.ctx.query_gid(0).unwrap(), qp.qp_num(), 400, 300).unwrap();
    let m = a.pd.register(vec![3u8; 64], Access::LOCAL_WRITE).unwrap();
    let dst = b.pd.register(vec![0u8; 64], Access::LOCAL_WRITE | Access::REMOTE_WRITE).unwrap();
    let cap = small.capacity();
    for i in 0..=cap as u64 {
        let mut w = wr(i, WrOpcode::RdmaWrite, m.sge(0, 8));
        (w.remote_addr, w.rkey, w.flags) = (dst.addr(), dst.rkey(), SendFlags::SIGNALED);
        qp.post_send(&w).unwrap();
    }
    let t = std::time::Instant::now();
    while !small.is_overrun() {
        assert!(t.elapsed() < T, "the CQ of {cap} never overran");
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
    for i in 0..cap as u64 {
        let wc = small.poll_one_or_overrun().unwrap().expect("a stored completion");
        assert_eq!((wc.wr_id, wc.status), (i, WcStatus::Success));
    }
    assert_eq!(small.poll_one_or_overrun().unwrap_err().errno, Errno::EIO);
    assert_eq!(small.poll_one_or_overrun().unwrap_err().errno, Errno::EIO, "and stays failed");
}
