//! RDMA ATOMIC WRITE (IBA 1.5 A19) between two devices over loopback, as
//! Linux rxe implements it: an RC_ATOMIC_WRITE request (RETH, 8-byte
//! payload) answered by a zero-length READ RESPONSE ONLY, the responder's
//! checks (alignment, key, QP access) and the requester's (8 bytes, RC).

mod common;

use common::*;
use uroce::ib::Errno;
use uroce::verbs::*;
use uroce::wire::pcap::{extract_roce, PcapReader};
use uroce::wire::{Opcode, Packet};

const RW: Access = Access::LOCAL_WRITE.union(Access::REMOTE_WRITE).union(Access::REMOTE_READ);

fn atomic_write(id: u64, src: Sge, dst: &MemoryRegion, offset: u64) -> SendWr {
    let mut w = wr(id, WrOpcode::AtomicWrite, src);
    (w.remote_addr, w.rkey) = (dst.iova() + offset, dst.rkey());
    w
}

#[test]
fn writes_eight_bytes_and_is_answered_by_an_empty_read_response() {
    let path = std::env::temp_dir().join(format!("uroce-atomic-write-{}.pcap", std::process::id()));
    let port;
    {
        let (a, b) = connected(Some(path.clone()));
        port = a.ctx.local_addr().port();
        let src = a.pd.register(b"\x01\x02\x03\x04\x05\x06\x07\x08 and more".to_vec(), RW).unwrap();
        let dst = b.pd.register(vec![0xEEu8; 64], RW).unwrap();
        a.qp.post_send(&atomic_write(1, src.sge(0, 8), &dst, 16)).unwrap();
        let wc = a.cq.wait(1, T).unwrap()[0];
        assert_eq!((wc.wr_id, wc.status, wc.opcode, wc.byte_len), (1, WcStatus::Success, WcOpcode::AtomicWrite, 8));
        let got = dst.to_vec();
        assert_eq!(&got[16..24], b"\x01\x02\x03\x04\x05\x06\x07\x08", "the bytes as sent");
        assert!(got[..16].iter().chain(&got[24..]).all(|&x| x == 0xEE), "nothing around them");

        // Inline: the 8 bytes travel in the work request.
        let mut w = atomic_write(2, src.sge(0, 8), &dst, 40);
        w.inline = Some(0x1122_3344_5566_7788u64.to_be_bytes().to_vec());
        a.qp.post_send(&w).unwrap();
        assert_eq!(a.cq.wait(1, T).unwrap()[0].status, WcStatus::Success);
        assert_eq!(&dst.to_vec()[40..48], &0x1122_3344_5566_7788u64.to_be_bytes());
        a.ctx.flush_capture();
    }
    let r = PcapReader::new(std::fs::File::open(&path).unwrap()).unwrap();
    let lt = r.linktype;
    let mut seen = Vec::new();
    for frame in r {
        let frame = frame.unwrap();
        let Some((_, udp)) = extract_roce(lt, &frame.data, port) else { continue };
        let p = Packet::parse(udp).unwrap();
        let h = p.headers;
        if h.bth.opcode == Opcode::RC_ATOMIC_WRITE {
            let reth = h.reth.unwrap();
            assert_eq!((reth.dma_len, p.payload.len(), h.bth.ack_req), (8, 8, true));
            seen.push((h.bth.psn, "request"));
        } else if h.bth.opcode == Opcode::RC_READ_RESPONSE_ONLY {
            assert!(p.payload.is_empty());
            assert!(matches!(h.aeth.unwrap().kind(), uroce::wire::AethKind::Ack { .. }));
            seen.push((h.bth.psn, "response"));
        }
    }
    let _ = std::fs::remove_file(&path);
    assert_eq!(seen, [(100, "request"), (100, "response"), (101, "request"), (101, "response")]);
}

#[test]
fn takes_rd_atomic_credits_and_completes_in_order_with_other_requests() {
    let (a, b) = connected(None);
    let src = a.pd.register((0..64u8).collect(), RW).unwrap();
    let dst = b.pd.register(vec![0u8; 64], RW).unwrap();
    let rx = b.pd.register(vec![0u8; 16], RW).unwrap();
    // One READ/atomic credit (set through SQD): the ATOMIC WRITEs go one at
    // a time, each released by its response.
    let attr = QpAttr { max_rd_atomic: 1, ..a.qp.query() };
    a.qp.modify(&QpAttr { qp_state: QpState::Sqd, ..attr }, QpAttrMask::STATE).unwrap();
    a.qp.modify(&QpAttr { qp_state: QpState::Sqd, ..attr }, QpAttrMask::STATE | QpAttrMask::MAX_QP_RD_ATOMIC).unwrap();
    a.qp.modify(&QpAttr { qp_state: QpState::Rts, ..attr }, QpAttrMask::STATE).unwrap();
    assert_eq!(a.qp.query().max_rd_atomic, 1);
    b.qp.post_recv(&RecvWr { wr_id: 9, sg_list: uroce::sgl![rx.sge(0, 16)] }).unwrap();
    let mut wrs: Vec<SendWr> = (0..4).map(|i| atomic_write(i, src.sge(i as usize * 8, 8), &dst, i * 8)).collect();
    wrs.insert(2, wr(10, WrOpcode::Send, src.sge(0, 4)));
    a.qp.post_send_list(wrs).unwrap();
    let wcs = a.cq.wait(5, T).unwrap();
    assert_eq!(
        wcs.iter().map(|w| (w.wr_id, w.status)).collect::<Vec<_>>(),
        [
            (0, WcStatus::Success),
            (1, WcStatus::Success),
            (10, WcStatus::Success),
            (2, WcStatus::Success),
            (3, WcStatus::Success)
        ]
    );
    assert_eq!(&dst.to_vec()[..32], &(0..32u8).collect::<Vec<_>>()[..]);
    assert_eq!(b.cq.wait(1, T).unwrap()[0].wr_id, 9);
}

/// Posts one ATOMIC WRITE the responder refuses; the completion status.
fn refused(setup: impl FnOnce(&End, &End) -> (SendWr, [MemoryRegion; 2])) -> WcStatus {
    let (a, b) = connected(None);
    let (w, _regions) = setup(&a, &b);
    a.qp.post_send(&w).unwrap();
    let wc = a.cq.wait(1, T).unwrap()[0];
    assert_eq!(a.qp.state(), QpState::Err);
    assert_eq!(b.qp.state(), QpState::Err);
    wc.status
}

#[test]
fn the_responder_refuses_what_rxe_refuses() {
    // Not 8-byte aligned: NAK invalid request.
    let misaligned = refused(|a, b| {
        let src = a.pd.register(vec![1u8; 8], RW).unwrap();
        let dst = b.pd.register(vec![0u8; 64], RW).unwrap();
        (atomic_write(1, src.sge(0, 8), &dst, 4), [src, dst])
    });
    assert_eq!(misaligned, WcStatus::RemInvReqErr);
    // A region without remote write access: NAK remote access error.
    let read_only = refused(|a, b| {
        let src = a.pd.register(vec![1u8; 8], RW).unwrap();
        let dst = b.pd.register(vec![0u8; 64], Access::LOCAL_WRITE | Access::REMOTE_READ).unwrap();
        (atomic_write(1, src.sge(0, 8), &dst, 8), [src, dst])
    });
    assert_eq!(read_only, WcStatus::RemAccessErr);
    // A QP that does not allow remote writes: NAK invalid request.
    let no_write = refused(|a, b| {
        let attr = QpAttr { qp_access_flags: Access::REMOTE_READ | Access::REMOTE_ATOMIC, ..b.qp.query() };
        b.qp.modify(&attr, QpAttrMask::ACCESS_FLAGS).unwrap();
        let src = a.pd.register(vec![1u8; 8], RW).unwrap();
        let dst = b.pd.register(vec![0u8; 64], RW).unwrap();
        (atomic_write(1, src.sge(0, 8), &dst, 8), [src, dst])
    });
    assert_eq!(no_write, WcStatus::RemInvReqErr);
}

#[test]
fn the_requester_posts_only_eight_bytes_on_rc() {
    let (a, b) = connected(None);
    let caps = a.ctx.query_device().device_cap_flags_ex;
    assert_ne!(caps & uroce::verbs::cap::ATOMIC_WRITE, 0, "IB_UVERBS_DEVICE_ATOMIC_WRITE");
    let src = a.pd.register(vec![1u8; 16], RW).unwrap();
    let dst = b.pd.register(vec![0u8; 64], RW).unwrap();
    for len in [0, 4, 16] {
        let e = a.qp.post_send(&atomic_write(1, src.sge(0, len), &dst, 0)).unwrap_err();
        assert_eq!(e.errno, Errno::EINVAL, "length {len}");
    }
    let uc = a.pd.create_qp(&QpInitAttr { qp_type: QpType::Uc, ..QpInitAttr::rc(&a.cq, &a.cq) }).unwrap();
    let xrc = a.pd.create_qp(&QpInitAttr::xrc_send(&a.cq)).unwrap();
    for qp in [&uc, &xrc] {
        qp.connect_rc(&b.ctx.query_gid(0).unwrap(), b.qp.qp_num(), 1, 1).unwrap();
        let e = qp.post_send(&atomic_write(1, src.sge(0, 8), &dst, 0)).unwrap_err();
        assert_eq!(e.errno, Errno::EINVAL, "{:?}", qp.qp_type());
    }
}

#[test]
fn carries_its_eight_bytes_in_the_wqe_whatever_max_inline_data() {
    // The ibv_wr_atomic_write path: the value is copied into the work
    // request, as rxe's provider copies it into the WQE, not inline data.
    let (a, b) = connected(None);
    let attr =
        |cq| QpInitAttr { cap: QpCap { max_inline_data: 0, ..QpInitAttr::rc(cq, cq).cap }, ..QpInitAttr::rc(cq, cq) };
    let (qa, qb) = (a.pd.create_qp(&attr(&a.cq)).unwrap(), b.pd.create_qp(&attr(&b.cq)).unwrap());
    qa.connect_rc(&b.ctx.query_gid(0).unwrap(), qb.qp_num(), 1, 2).unwrap();
    qb.connect_rc(&a.ctx.query_gid(0).unwrap(), qa.qp_num(), 2, 1).unwrap();
    let dst = b.pd.register(vec![0u8; 8], RW).unwrap();
    let mut w = SendWr::new(1, WrOpcode::AtomicWrite);
    (w.remote_addr, w.rkey, w.inline) = (dst.iova(), dst.rkey(), Some(b"8 bytes!".to_vec()));
    qa.post_send(&w).unwrap();
    assert_eq!(a.cq.wait(1, T).unwrap()[0].status, WcStatus::Success);
    assert_eq!(dst.to_vec(), b"8 bytes!");
    // A SEND's inline data is limited: to the WQE's room, max_send_sge (4)
    // × 16 bytes, as rxe rounds max_inline_data 0 up.
    assert_eq!(qa.cap().max_inline_data, 64);
    let mut send = SendWr::new(2, WrOpcode::Send);
    send.inline = Some(vec![7u8; 65]);
    assert_eq!(qa.post_send(&send).unwrap_err().errno, Errno::EINVAL, "a SEND's inline data is limited");
}
