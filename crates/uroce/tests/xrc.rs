//! XRC (IBA Annex A14) between two devices in one process over loopback:
//! one XRC_SEND QP reaching several SRQs of the target's XRC domain through
//! one XRC_RECV QP, RDMA checked against the named SRQ's PD, the errors of a
//! request naming an SRQ it may not, and the XRC domain's open/close rules.

mod common;

use common::*;
use uroce::ib::Errno;
use uroce::verbs::*;

const RW: Access =
    Access::LOCAL_WRITE.union(Access::REMOTE_WRITE).union(Access::REMOTE_READ).union(Access::REMOTE_ATOMIC);

/// The initiator: an XRC_SEND QP in its PD, completions on `cq`.
struct Initiator {
    pd: ProtectionDomain,
    cq: CompletionQueue,
    qp: QueuePair,
}

/// The target: an XRC domain with an XRC_RECV QP.
struct Target {
    ctx: Context,
    xrcd: Xrcd,
    qp: QueuePair,
}

fn xrc_pair() -> (Initiator, Target) {
    let (a, b) = pair_with(None);
    let pd = a.alloc_pd().unwrap();
    let cq = a.create_cq(256, None).unwrap();
    let qp = pd.create_qp(&QpInitAttr::xrc_send(&cq)).unwrap();
    assert_eq!(qp.qp_type(), QpType::XrcSend);
    let xrcd = b.open_xrcd().unwrap();
    let tgt = xrcd.create_recv_qp().unwrap();
    assert_eq!(tgt.qp_type(), QpType::XrcRecv);
    qp.connect_rc(&b.query_gid(0).unwrap(), tgt.qp_num(), 10, 20).unwrap();
    tgt.connect_rc(&a.query_gid(0).unwrap(), qp.qp_num(), 20, 10).unwrap();
    assert_eq!((qp.state(), tgt.state()), (QpState::Rts, QpState::Rts));
    (Initiator { pd, cq, qp }, Target { ctx: b, xrcd, qp: tgt })
}

fn to(srqn: u32, mut w: SendWr) -> SendWr {
    w.remote_srqn = srqn;
    w
}

#[test]
fn sends_reach_the_srq_they_name_and_complete_on_its_cq() {
    let (a, b) = xrc_pair();
    let b_pd = b.ctx.alloc_pd().unwrap();
    let (cq1, cq2) = (b.ctx.create_cq(16, None).unwrap(), b.ctx.create_cq(16, None).unwrap());
    let srq1 = b.xrcd.create_srq(&b_pd, &cq1, 16, 1, 0).unwrap();
    let srq2 = b.xrcd.create_srq(&b_pd, &cq2, 16, 1, 0).unwrap();
    let (n1, n2) = (srq1.srq_num().unwrap(), srq2.srq_num().unwrap());
    assert_ne!(n1, n2);
    let rx1 = b_pd.register(vec![0u8; 64], RW).unwrap();
    let rx2 = b_pd.register(vec![0u8; 20_000], RW).unwrap();
    srq1.post_recv(&RecvWr { wr_id: 11, sg_list: uroce::sgl![rx1.sge(0, 64)] }).unwrap();
    srq2.post_recv(&RecvWr { wr_id: 22, sg_list: uroce::sgl![rx2.sge(0, 20_000)] }).unwrap();

    let msg: Vec<u8> = (0..20_000u32).map(|i| (i * 13) as u8).collect();
    let tx = a.pd.register(msg.clone(), RW).unwrap();
    a.qp.post_send(&to(n1, wr(1, WrOpcode::Send, tx.sge(0, 40)))).unwrap();
    // Several packets at the path MTU, with an immediate, to the other SRQ.
    let mut big = to(n2, wr(2, WrOpcode::SendImm, tx.sge(0, 20_000)));
    big.imm_data = 0x1234_5678;
    a.qp.post_send(&big).unwrap();

    let sent = a.cq.wait(2, T).unwrap();
    assert_eq!(
        sent.iter().map(|w| (w.wr_id, w.status, w.opcode)).collect::<Vec<_>>(),
        [(1, WcStatus::Success, WcOpcode::Send), (2, WcStatus::Success, WcOpcode::Send)]
    );
    let r1 = cq1.wait(1, T).unwrap()[0];
    assert_eq!((r1.wr_id, r1.status, r1.opcode, r1.byte_len), (11, WcStatus::Success, WcOpcode::Recv, 40));
    assert_eq!(r1.src_qp, a.qp.qp_num());
    assert_eq!(&rx1.to_vec()[..40], &msg[..40]);
    let r2 = cq2.wait(1, T).unwrap()[0];
    assert_eq!((r2.wr_id, r2.status, r2.byte_len), (22, WcStatus::Success, 20_000));
    assert!(r2.wc_flags.contains(WcFlags::WITH_IMM));
    assert_eq!(r2.imm_data, 0x1234_5678);
    assert_eq!(rx2.to_vec(), msg);
    assert!(cq1.poll_one().is_none() && cq2.poll_one().is_none(), "each receive completes on its SRQ's CQ only");

    // An empty SRQ is receiver-not-ready: the SEND waits for a receive.
    let rnr = b.ctx.stats().rnr_naks_sent;
    a.qp.post_send(&to(n1, wr(3, WrOpcode::Send, tx.sge(0, 8)))).unwrap();
    wait_until("an RNR NAK for the SEND to an empty SRQ", || b.ctx.stats().rnr_naks_sent > rnr);
    assert!(a.cq.poll_one().is_none());
    srq1.post_recv(&RecvWr { wr_id: 12, sg_list: uroce::sgl![rx1.sge(0, 64)] }).unwrap();
    assert_eq!(a.cq.wait(1, T).unwrap()[0].status, WcStatus::Success);
    assert_eq!(cq1.wait(1, T).unwrap()[0].wr_id, 12);
}

#[test]
fn rdma_and_atomics_use_the_named_srqs_pd() {
    let (a, b) = xrc_pair();
    let (pd1, pd2) = (b.ctx.alloc_pd().unwrap(), b.ctx.alloc_pd().unwrap());
    let cq = b.ctx.create_cq(16, None).unwrap();
    let srq1 = b.xrcd.create_srq(&pd1, &cq, 4, 1, 0).unwrap();
    let srq2 = b.xrcd.create_srq(&pd2, &cq, 4, 1, 0).unwrap();
    let target = pd1.register(vec![0u8; 4096], RW).unwrap();
    let local = a.pd.register(vec![0u8; 4096], RW).unwrap();
    local.write_at(0, b"xrc write").unwrap();
    let n1 = srq1.srq_num().unwrap();

    let mut w = to(n1, wr(1, WrOpcode::RdmaWrite, local.sge(0, 9)));
    (w.remote_addr, w.rkey) = (target.iova() + 100, target.rkey());
    a.qp.post_send(&w).unwrap();
    assert_eq!(a.cq.wait(1, T).unwrap()[0].status, WcStatus::Success);
    assert_eq!(&target.to_vec()[100..109], b"xrc write");

    target.write_at(2000, b"read me").unwrap();
    let mut r = to(n1, wr(2, WrOpcode::RdmaRead, local.sge(512, 7)));
    (r.remote_addr, r.rkey) = (target.iova() + 2000, target.rkey());
    a.qp.post_send(&r).unwrap();
    let wc = a.cq.wait(1, T).unwrap()[0];
    assert_eq!((wc.status, wc.opcode, wc.byte_len), (WcStatus::Success, WcOpcode::RdmaRead, 7));
    assert_eq!(&local.to_vec()[512..519], b"read me");

    target.write_at(8, &40u64.to_ne_bytes()).unwrap();
    let mut fa = to(n1, wr(3, WrOpcode::AtomicFetchAdd, local.sge(1024, 8)));
    (fa.remote_addr, fa.rkey, fa.compare_add) = (target.iova() + 8, target.rkey(), 2);
    let mut cs = to(n1, wr(4, WrOpcode::AtomicCmpSwp, local.sge(1032, 8)));
    (cs.remote_addr, cs.rkey, cs.compare_add, cs.swap) = (target.iova() + 8, target.rkey(), 42, 7);
    a.qp.post_send(&fa).unwrap();
    a.qp.post_send(&cs).unwrap();
    let wcs = a.cq.wait(2, T).unwrap();
    assert_eq!(
        wcs.iter().map(|w| (w.opcode, w.status)).collect::<Vec<_>>(),
        [(WcOpcode::FetchAdd, WcStatus::Success), (WcOpcode::CompSwap, WcStatus::Success)]
    );
    let mut orig = [0u8; 16];
    local.read_at(1024, &mut orig).unwrap();
    assert_eq!(
        (u64::from_ne_bytes(orig[..8].try_into().unwrap()), u64::from_ne_bytes(orig[8..].try_into().unwrap())),
        (40, 42)
    );
    let mut now = [0u8; 8];
    target.read_at(8, &mut now).unwrap();
    assert_eq!(u64::from_ne_bytes(now), 7);

    // The same key through an SRQ of another PD is a remote access error,
    // and ends the connection.
    let mut w = to(srq2.srq_num().unwrap(), wr(5, WrOpcode::RdmaWrite, local.sge(0, 9)));
    (w.remote_addr, w.rkey) = (target.iova(), target.rkey());
    a.qp.post_send(&w).unwrap();
    let wc = a.cq.wait(1, T).unwrap()[0];
    assert_eq!((wc.wr_id, wc.status), (5, WcStatus::RemAccessErr));
    assert_eq!(&target.to_vec()[..8], &[0u8; 8], "nothing written");
    let ev = next_async_event(&b.ctx).unwrap();
    assert_eq!(
        ev,
        AsyncEvent { kind: uroce::ib::AsyncEventType::QpAccessErr, element: EventElement::Qp(b.qp.qp_num()) }
    );
    assert_eq!(b.qp.state(), QpState::Err);
}

/// A request naming an SRQ outside the target QP's XRC domain, or no SRQ at
/// all, is refused with a remote access NAK.
fn refused(srqn: impl FnOnce(&Target) -> (u32, Vec<SharedReceiveQueue>)) {
    let (a, b) = xrc_pair();
    let (srqn, _keep) = srqn(&b);
    let tx = a.pd.register(vec![7u8; 8], RW).unwrap();
    a.qp.post_send(&to(srqn, wr(1, WrOpcode::Send, tx.sge(0, 8)))).unwrap();
    a.qp.post_send(&to(srqn, wr(2, WrOpcode::Send, tx.sge(0, 8)))).unwrap();
    let wcs = a.cq.wait(2, T).unwrap();
    assert_eq!((wcs[0].wr_id, wcs[0].status), (1, WcStatus::RemAccessErr));
    assert_eq!((wcs[1].wr_id, wcs[1].status), (2, WcStatus::WrFlushErr));
    assert_eq!(a.qp.state(), QpState::Err);
    assert_eq!(next_async_event(&b.ctx).map(|e| e.kind), Some(uroce::ib::AsyncEventType::QpAccessErr));
}

#[test]
fn an_srq_of_another_xrc_domain_is_refused() {
    refused(|b| {
        let other = b.ctx.open_xrcd().unwrap();
        let pd = b.ctx.alloc_pd().unwrap();
        let cq = b.ctx.create_cq(4, None).unwrap();
        let srq = other.create_srq(&pd, &cq, 4, 1, 0).unwrap();
        let rx = pd.register(vec![0u8; 64], RW).unwrap();
        srq.post_recv(&RecvWr { wr_id: 1, sg_list: uroce::sgl![rx.sge(0, 64)] }).unwrap();
        (srq.srq_num().unwrap(), vec![srq])
    });
}

#[test]
fn an_srq_number_nobody_has_is_refused() {
    refused(|b| {
        let pd = b.ctx.alloc_pd().unwrap();
        let cq = b.ctx.create_cq(4, None).unwrap();
        let gone = b.xrcd.create_srq(&pd, &cq, 4, 1, 0).unwrap();
        let n = gone.srq_num().unwrap();
        gone.destroy().unwrap();
        (n, Vec::new())
    });
}

#[test]
fn xrc_domains_open_close_and_share_by_file() {
    let (ctx, _) = pair_with(None);
    let (d1, d2) = (ctx.open_xrcd().unwrap(), ctx.open_xrcd().unwrap());
    assert_ne!(d1.number(), d2.number(), "without a file every open is a new domain");

    let file = tempfile();
    let fd = std::os::fd::AsRawFd::as_raw_fd(&file);
    assert_eq!(ctx.open_xrcd_file(fd, false, false).unwrap_err().errno, Errno::EAGAIN, "no domain, no O_CREAT");
    let f1 = ctx.open_xrcd_file(fd, true, false).unwrap();
    let f2 = ctx.open_xrcd_file(fd, false, false).unwrap();
    assert_eq!(f1.number(), f2.number(), "one domain per file");
    assert_eq!(ctx.open_xrcd_file(fd, true, true).unwrap_err().errno, Errno::EINVAL, "O_EXCL on an existing domain");
    assert_eq!(ctx.open_xrcd_file(-1, true, false).unwrap_err().errno, Errno(libc::EBADF));

    // Objects of one handle keep that handle busy, not the domain's others.
    let pd = ctx.alloc_pd().unwrap();
    let cq = ctx.create_cq(4, None).unwrap();
    let srq = f2.create_srq(&pd, &cq, 4, 1, 0).unwrap();
    let qp = f1.create_recv_qp().unwrap();
    let (f2, e) = f2.close().unwrap_err();
    assert_eq!(e.errno, Errno::EBUSY);
    let (f1, e) = f1.close().unwrap_err();
    assert_eq!(e.errno, Errno::EBUSY);
    let (cq, e) = cq.destroy().unwrap_err();
    assert_eq!(e.errno, Errno::EBUSY, "an XRC SRQ holds its CQ");
    drop(qp);
    f1.close().unwrap();
    srq.destroy().unwrap();
    f2.close().unwrap();
    cq.destroy().unwrap();
    // The last handle closed, the file has no domain again.
    assert_eq!(ctx.open_xrcd_file(fd, false, false).unwrap_err().errno, Errno::EAGAIN);
    d1.close().unwrap();
    d2.close().unwrap();
}

#[test]
fn xrc_queue_pairs_have_only_their_half() {
    let (ctx, _) = pair_with(None);
    let pd = ctx.alloc_pd().unwrap();
    let cq = ctx.create_cq(4, None).unwrap();
    let xrcd = ctx.open_xrcd().unwrap();
    let srq = xrcd.create_srq(&pd, &cq, 4, 1, 0).unwrap();
    let basic = pd.create_srq(4, 1, 0).unwrap();
    assert_eq!(basic.srq_num(), None);

    let err = |r: Result<QueuePair, uroce::ib::Error>| r.unwrap_err().errno;
    assert_eq!(err(pd.create_qp(&QpInitAttr { qp_type: QpType::XrcRecv, ..QpInitAttr::rc(&cq, &cq) })), Errno::EINVAL);
    assert_eq!(err(pd.create_qp(&QpInitAttr { srq: Some(&srq), ..QpInitAttr::rc(&cq, &cq) })), Errno::EINVAL);

    // XRC_SEND: no receive queue, and the attributes of its own transitions.
    let send = pd.create_qp(&QpInitAttr::xrc_send(&cq)).unwrap();
    assert_eq!((send.cap().max_recv_wr, send.cap().max_recv_sge), (0, 0));
    let init = QpAttr { qp_state: QpState::Init, port_num: 1, ..QpAttr::default() };
    send.modify(&init, QpAttrMask::STATE | QpAttrMask::PKEY_INDEX | QpAttrMask::PORT | QpAttrMask::ACCESS_FLAGS)
        .unwrap();
    let rx = pd.register(vec![0u8; 8], RW).unwrap();
    let e = send.post_recv(&RecvWr { wr_id: 1, sg_list: uroce::sgl![rx.sge(0, 8)] }).unwrap_err();
    assert_eq!(e.errno, Errno::EINVAL, "no receive queue");
    let rtr = QpAttr {
        qp_state: QpState::Rtr,
        path_mtu: Mtu::Mtu1024,
        ah_attr: AddressVector { dgid: ctx.query_gid(0).unwrap(), is_global: true, port_num: 1, ..Default::default() },
        ..init
    };
    let rc_rtr = QpAttrMask::STATE
        | QpAttrMask::AV
        | QpAttrMask::PATH_MTU
        | QpAttrMask::DEST_QPN
        | QpAttrMask::RQ_PSN
        | QpAttrMask::MAX_DEST_RD_ATOMIC
        | QpAttrMask::MIN_RNR_TIMER;
    assert_eq!(send.modify(&rtr, rc_rtr).unwrap_err().errno, Errno::EINVAL, "an initiator has no responder resources");
    send.modify(&rtr, rc_rtr - QpAttrMask::MAX_DEST_RD_ATOMIC - QpAttrMask::MIN_RNR_TIMER).unwrap();

    // XRC_RECV: no send queue.
    let recv = xrcd.create_recv_qp().unwrap();
    assert_eq!(recv.cap(), QpCap::default());
    recv.connect_rc(&ctx.query_gid(0).unwrap(), send.qp_num(), 1, 1).unwrap();
    let e = recv.post_send(&wr(1, WrOpcode::Send, rx.sge(0, 8))).unwrap_err();
    assert_eq!(e.errno, Errno::EINVAL, "no send queue");
}

fn tempfile() -> std::fs::File {
    use std::sync::atomic::{AtomicU32, Ordering};
    static N: AtomicU32 = AtomicU32::new(0);
    let path =
        std::env::temp_dir().join(format!("uroce-xrcd-{}-{}", std::process::id(), N.fetch_add(1, Ordering::Relaxed)));
    let f = std::fs::File::create(&path).unwrap();
    std::fs::remove_file(&path).unwrap();
    f
}
