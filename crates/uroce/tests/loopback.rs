//! Two devices in one process over real UDP sockets on loopback, through the
//! safe Rust API: every operation, errors, and a packet capture.

mod common;
#[macro_use]
mod skip;

use common::*;
use std::time::Duration;
use uroce::verbs::*;

/// Once the two devices reach each other by their lasting medium: with the
/// same-host link on (`UROCE_LINK` not `udp`), once each has read packets
/// from its ring (the first ones went by UDP while the link was made; the
/// switch may cost one sequence NAK on a busy machine, see
/// docs/architecture.md, "Same-host link").
fn settle(a: &End, b: &End) {
    if !a.ctx.medium_counters().iter().any(|(m, _)| *m == "shm") {
        return;
    }
    let from_ring = |x: &End, y: &End| {
        x.ctx.link_stats().into_iter().find(|s| s.peer == y.ctx.local_addr()).is_some_and(|s| {
            s.medium == uroce::verbs::LinkMedium::Shm && s.counters.iter().any(|&(k, v)| k == "shm_rx_packets" && v > 0)
        })
    };
    let rw = Access::LOCAL_WRITE | Access::REMOTE_WRITE;
    let (am, bm) = (a.pd.register(vec![1u8; 8], rw).unwrap(), b.pd.register(vec![0u8; 8], rw).unwrap());
    let t = std::time::Instant::now();
    while !from_ring(a, b) || !from_ring(b, a) {
        assert!(t.elapsed() < Duration::from_secs(60), "no link within 60 s: {:?}", a.ctx.link_stats());
        let mut w = wr(0, WrOpcode::RdmaWrite, am.sge(0, 8));
        w.remote_addr = bm.iova();
        w.rkey = bm.rkey();
        a.qp.post_send(&w).unwrap();
        assert_eq!(a.cq.wait(1, T).unwrap()[0].status, WcStatus::Success);
        std::thread::sleep(Duration::from_millis(1));
    }
}

#[test]
fn write_read_send_and_atomics_over_udp() {
    let (a, b) = connected(None);
    settle(&a, &b);
    let st0 = a.ctx.stats();
    let rw = Access::LOCAL_WRITE | Access::REMOTE_WRITE | Access::REMOTE_READ | Access::REMOTE_ATOMIC;
    let len = 200_000; // many packets at MTU 4096
    let src: Vec<u8> = (0..len).map(|i| (i * 7 + 3) as u8).collect();
    let a_mr = a.pd.register(src.clone(), rw).unwrap();
    let b_mr = b.pd.register(vec![0u8; len], rw).unwrap();

    // RDMA WRITE a -> b.
    let mut w = wr(1, WrOpcode::RdmaWrite, a_mr.sge(0, len as u32));
    w.remote_addr = b_mr.iova();
    w.rkey = b_mr.rkey();
    a.qp.post_send(&w).unwrap();
    let wc = a.cq.wait(1, T).unwrap()[0];
    assert_eq!((wc.wr_id, wc.status, wc.opcode), (1, WcStatus::Success, WcOpcode::RdmaWrite));
    assert_eq!(b_mr.to_vec(), src);

    // RDMA READ b -> a into a fresh region.
    let a_dst = a.pd.register(vec![0u8; len], rw).unwrap();
    let mut r = wr(2, WrOpcode::RdmaRead, a_dst.sge(0, len as u32));
    r.remote_addr = b_mr.iova();
    r.rkey = b_mr.rkey();
    a.qp.post_send(&r).unwrap();
    let wc = a.cq.wait(1, T).unwrap()[0];
    assert_eq!((wc.status, wc.opcode, wc.byte_len), (WcStatus::Success, WcOpcode::RdmaRead, len as u32));
    assert_eq!(a_dst.to_vec(), src);

    // SEND with immediate, multi-SGE on both sides.
    let b_rx = b.pd.register(vec![0u8; 10_000], rw).unwrap();
    b.qp.post_recv(&RecvWr { wr_id: 77, sg_list: uroce::sgl![b_rx.sge(0, 3000), b_rx.sge(5000, 5000)] }).unwrap();
    let mut s = SendWr::new(3, WrOpcode::SendImm);
    s.sg_list = uroce::sgl![a_mr.sge(0, 1000), a_mr.sge(1000, 6000)];
    s.imm_data = 0xdead_beef;
    a.qp.post_send(&s).unwrap();
    let rc = b.cq.wait(1, T).unwrap()[0];
    assert_eq!((rc.wr_id, rc.status, rc.opcode, rc.byte_len), (77, WcStatus::Success, WcOpcode::Recv, 7000));
    assert!(rc.wc_flags.contains(WcFlags::WITH_IMM));
    assert_eq!(rc.imm_data, 0xdead_beef);
    assert_eq!(rc.src_qp, a.qp.qp_num());
    let got = b_rx.to_vec();
    assert_eq!(&got[..3000], &src[..3000]);
    assert_eq!(&got[3000..5000], &[0u8; 2000][..], "gap between SGEs untouched");
    assert_eq!(&got[5000..9000], &src[3000..7000]);
    assert_eq!(a.cq.wait(1, T).unwrap()[0].opcode, WcOpcode::Send);

    // Atomics on an 8-byte-aligned counter.
    let counter = b.pd.register(vec![0u8; 8], rw).unwrap();
    counter.write_at(0, &5u64.to_ne_bytes()).unwrap();
    let res = a.pd.register(vec![0u8; 16], rw).unwrap();
    let mut fa = wr(4, WrOpcode::AtomicFetchAdd, res.sge(0, 8));
    fa.remote_addr = counter.iova();
    fa.rkey = counter.rkey();
    fa.compare_add = 10;
    a.qp.post_send(&fa).unwrap();
    let mut cs = wr(5, WrOpcode::AtomicCmpSwp, res.sge(8, 8));
    cs.remote_addr = counter.iova();
    cs.rkey = counter.rkey();
    cs.compare_add = 15;
    cs.swap = 99;
    a.qp.post_send(&cs).unwrap();
    let wcs = a.cq.wait(2, T).unwrap();
    assert_eq!((wcs[0].opcode, wcs[1].opcode), (WcOpcode::FetchAdd, WcOpcode::CompSwap));
    let r = res.to_vec();
    assert_eq!(u64::from_ne_bytes(r[..8].try_into().unwrap()), 5);
    assert_eq!(u64::from_ne_bytes(r[8..].try_into().unwrap()), 15);
    let mut c = [0u8; 8];
    counter.read_at(0, &mut c).unwrap();
    assert_eq!(u64::from_ne_bytes(c), 99);
    // Nothing was refused or lost on loopback: no NAK of any kind. (A busy
    // machine may delay an ACK past the timeout: a retransmission then
    // comes from a timeout, never from anything else.)
    let st = a.ctx.stats();
    let naks = (st.naks_received - st0.naks_received, st.seq_naks_received - st0.seq_naks_received);
    assert_eq!((naks, st.rnr_naks_received), ((0, 0), 0), "{st:?}");
    assert!(st.retransmits == st0.retransmits || st.timeouts > st0.timeouts, "{st:?}");
}

#[test]
fn bad_rkey_gives_remote_access_error_and_flushes() {
    let (a, b) = connected(None);
    let rw = Access::LOCAL_WRITE | Access::REMOTE_WRITE;
    let a_mr = a.pd.register(vec![1u8; 64], rw).unwrap();
    let b_mr = b.pd.register(vec![0u8; 64], Access::LOCAL_WRITE | Access::REMOTE_READ).unwrap();
    // Writing to a region without REMOTE_WRITE.
    let mut w = wr(1, WrOpcode::RdmaWrite, a_mr.sge(0, 64));
    w.remote_addr = b_mr.iova();
    w.rkey = b_mr.rkey();
    a.qp.post_send(&w).unwrap();
    let mut w2 = wr(2, WrOpcode::RdmaWrite, a_mr.sge(0, 8));
    w2.remote_addr = b_mr.iova();
    w2.rkey = b_mr.rkey();
    a.qp.post_send(&w2).unwrap();
    let wcs = a.cq.wait(2, T).unwrap();
    assert_eq!(wcs[0].status, WcStatus::RemAccessErr);
    assert_eq!(wcs[1].status, WcStatus::WrFlushErr);
    assert_eq!(b_mr.to_vec(), vec![0u8; 64], "no byte changed");
    assert_eq!(a.qp.state(), QpState::Err);
    assert_eq!(b.qp.state(), QpState::Err);
    assert_eq!(next_async_event(&b.ctx).map(|e| e.kind), Some(uroce::ib::AsyncEventType::QpAccessErr));
}

#[test]
fn rnr_then_receive_posted_completes() {
    let (a, b) = connected(None);
    let rw = Access::LOCAL_WRITE;
    let a_mr = a.pd.register(vec![9u8; 100], rw).unwrap();
    let b_mr = b.pd.register(vec![0u8; 100], rw).unwrap();
    a.qp.post_send(&wr(1, WrOpcode::Send, a_mr.sge(0, 100))).unwrap();
    // The receive is posted once the requester has had its RNR NAK (not
    // after a fixed sleep, which a loaded machine can outlast before the
    // SEND even arrives).
    let t = std::time::Instant::now();
    while a.ctx.stats().rnr_naks_received == 0 {
        assert!(t.elapsed() < T, "no RNR NAK for a SEND without a receive");
        std::thread::sleep(Duration::from_millis(1));
    }
    b.qp.post_recv(&RecvWr { wr_id: 5, sg_list: uroce::sgl![b_mr.sge(0, 100)] }).unwrap();
    assert_eq!(b.cq.wait(1, T).unwrap()[0].wr_id, 5);
    assert_eq!(a.cq.wait(1, T).unwrap()[0].status, WcStatus::Success);
    assert!(a.ctx.stats().rnr_naks_received >= 1);
    assert_eq!(b_mr.to_vec(), vec![9u8; 100]);
}

#[test]
fn ud_send_receive_with_grh() {
    let (ca, cb) = pair_with(None);
    let (pa, pb) = (ca.alloc_pd().unwrap(), cb.alloc_pd().unwrap());
    let (qa_cq, qb_cq) = (ca.create_cq(16, None).unwrap(), cb.create_cq(16, None).unwrap());
    let qa = pa.create_qp(&QpInitAttr::ud(&qa_cq, &qa_cq)).unwrap();
    let qb = pb.create_qp(&QpInitAttr::ud(&qb_cq, &qb_cq)).unwrap();
    for q in [&qa, &qb] {
        let mut a = QpAttr { qp_state: QpState::Init, port_num: 1, qkey: 0x1111_1111, ..QpAttr::default() };
        q.modify(&a, QpAttrMask::STATE | QpAttrMask::PKEY_INDEX | QpAttrMask::PORT | QpAttrMask::QKEY).unwrap();
        a.qp_state = QpState::Rtr;
        q.modify(&a, QpAttrMask::STATE).unwrap();
        a.qp_state = QpState::Rts;
        q.modify(&a, QpAttrMask::STATE | QpAttrMask::SQ_PSN).unwrap();
    }
    let rx = pb.register(vec![0u8; 40 + 100], Access::LOCAL_WRITE).unwrap();
    qb.post_recv(&RecvWr { wr_id: 1, sg_list: uroce::sgl![rx.sge(0, 140)] }).unwrap();
    let tx = pa.register(b"hello over UD".to_vec(), Access::empty()).unwrap();
    let ah = pa
        .create_ah(AddressVector {
            dgid: cb.query_gid(0).unwrap(),
            is_global: true,
            hop_limit: 64,
            port_num: 1,
            ..Default::default()
        })
        .unwrap();
    let mut s = wr(9, WrOpcode::Send, tx.sge(0, 13));
    s.ud = Some(UdDest { av: ah.av, remote_qpn: qb.qp_num(), remote_qkey: 0x1111_1111 });
    qa.post_send(&s).unwrap();
    let wc = qb_cq.wait(1, T).unwrap()[0];
    assert_eq!((wc.status, wc.byte_len, wc.src_qp), (WcStatus::Success, 53, qa.qp_num()));
    assert!(wc.wc_flags.contains(WcFlags::GRH));
    assert_eq!(&rx.to_vec()[40..53], b"hello over UD");
    // A wrong Q_Key is dropped: no completion.
    qb.post_recv(&RecvWr { wr_id: 2, sg_list: uroce::sgl![rx.sge(0, 140)] }).unwrap();
    s.ud.as_mut().unwrap().remote_qkey = 0x2222;
    qa.post_send(&s).unwrap();
    wait_until("the packet with the wrong Q_Key", || cb.stats().rx_drop_qkey >= 1);
    assert!(qb_cq.poll_one().is_none());
}

#[test]
fn srq_feeds_two_qps_and_fires_limit() {
    let (a, b) = connected(None);
    let srq = b.pd.create_srq(16, 1, 0).unwrap();
    // A second QP on b sharing the SRQ is what SRQs are for; one suffices here.
    let qp2 = b.pd.create_qp(&QpInitAttr { srq: Some(&srq), ..QpInitAttr::rc(&b.cq, &b.cq) }).unwrap();
    let a2 = a.pd.create_qp(&QpInitAttr::rc(&a.cq, &a.cq)).unwrap();
    a2.connect_rc(&b.ctx.query_gid(0).unwrap(), qp2.qp_num(), 1, 2).unwrap();
    qp2.connect_rc(&a.ctx.query_gid(0).unwrap(), a2.qp_num(), 2, 1).unwrap();
    let rx = b.pd.register(vec![0u8; 64 * 4], Access::LOCAL_WRITE).unwrap();
    for i in 0..4 {
        srq.post_recv(&RecvWr { wr_id: i, sg_list: uroce::sgl![rx.sge(64 * i as usize, 64)] }).unwrap();
    }
    srq.set_limit(3).unwrap();
    let tx = a.pd.register(vec![3u8; 64], Access::empty()).unwrap();
    a2.post_send(&wr(1, WrOpcode::Send, tx.sge(0, 64))).unwrap();
    a2.post_send(&wr(2, WrOpcode::Send, tx.sge(0, 64))).unwrap();
    let wcs = b.cq.wait(2, T).unwrap();
    assert_eq!((wcs[0].wr_id, wcs[1].wr_id), (0, 1));
    assert_eq!(srq.len(), 2);
    let ev = next_async_event(&b.ctx).expect("SRQ limit event");
    assert_eq!(ev.kind, uroce::ib::AsyncEventType::SrqLimitReached);
    assert_eq!(srq.limit(), 0, "limit disarms");
    // Destroying an SRQ in use is refused.
    let (srq, e) = srq.destroy().unwrap_err();
    assert_eq!(e.errno, uroce::ib::Errno::EBUSY);
    drop(qp2);
    srq.destroy().unwrap();
}

#[test]
fn completion_channel_wakes_on_armed_cq() {
    let (a, b) = connected(None);
    let ch = b.ctx.create_comp_channel().unwrap();
    let cq = b.ctx.create_cq(8, Some(&ch)).unwrap();
    let qp = b.pd.create_qp(&QpInitAttr::rc(&cq, &cq)).unwrap();
    let a2 = a.pd.create_qp(&QpInitAttr::rc(&a.cq, &a.cq)).unwrap();
    a2.connect_rc(&b.ctx.query_gid(0).unwrap(), qp.qp_num(), 1, 2).unwrap();
    qp.connect_rc(&a.ctx.query_gid(0).unwrap(), a2.qp_num(), 2, 1).unwrap();
    let rx = b.pd.register(vec![0u8; 8], Access::LOCAL_WRITE).unwrap();
    qp.post_recv(&RecvWr { wr_id: 1, sg_list: uroce::sgl![rx.sge(0, 8)] }).unwrap();
    cq.req_notify(false).unwrap();
    let tx = a.pd.register(vec![1u8; 8], Access::empty()).unwrap();
    a2.post_send(&wr(1, WrOpcode::Send, tx.sge(0, 8))).unwrap();
    assert_eq!(ch.wait(T).unwrap(), Some(cq.handle()));
    assert_eq!(cq.poll_one().unwrap().wr_id, 1);
    // Not armed: no further event.
    qp.post_recv(&RecvWr { wr_id: 2, sg_list: uroce::sgl![rx.sge(0, 8)] }).unwrap();
    a2.post_send(&wr(2, WrOpcode::Send, tx.sge(0, 8))).unwrap();
    let _ = cq.wait(1, T).unwrap();
    assert_eq!(ch.wait(Duration::from_millis(50)).unwrap(), None);
}

#[test]
fn capture_decodes_with_correct_icrcs() {
    let dir = std::env::temp_dir().join(format!("uroce-cap-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("loopback.pcap");
    let port;
    {
        let (a, b) = connected(Some(path.clone()));
        port = a.ctx.local_addr().port();
        let m = a.pd.register(vec![5u8; 10_000], Access::LOCAL_WRITE).unwrap();
        let t =
            b.pd.register(vec![0u8; 10_000], Access::LOCAL_WRITE | Access::REMOTE_WRITE | Access::REMOTE_READ).unwrap();
        let mut w = wr(1, WrOpcode::RdmaWrite, m.sge(0, 10_000));
        w.remote_addr = t.iova();
        w.rkey = t.rkey();
        a.qp.post_send(&w).unwrap();
        a.cq.wait(1, T).unwrap();
        let mut r = wr(2, WrOpcode::RdmaRead, m.sge(0, 10_000));
        r.remote_addr = t.iova();
        r.rkey = t.rkey();
        a.qp.post_send(&r).unwrap();
        a.cq.wait(1, T).unwrap();
        a.ctx.flush_capture();
    }
    let f = std::fs::File::open(&path).unwrap();
    let mut out = Vec::new();
    let s = uroce::wire::decode::decode_pcap(f, port, &mut out).unwrap();
    let text = String::from_utf8_lossy(&out);
    assert!(s.roce >= 8, "{text}");
    assert_eq!(s.icrc_bad, 0, "{text}");
    assert_eq!(s.malformed, 0);
    assert!(text.contains("WRITE_FIRST"), "{text}");
    // tshark decodes it as RoCE with no malformed packet and no expert error.
    let out = std::process::Command::new("tshark")
        .args(["-r", path.to_str().unwrap(), "-d", &format!("udp.port=={port},infiniband")])
        .args(["--disable-protocol", "rpcordma", "--disable-protocol", "tftp"])
        .args([
            "-T",
            "fields",
            "-E",
            "separator=,",
            "-e",
            "infiniband.bth.opcode",
            "-e",
            "_ws.malformed",
            "-e",
            "_ws.expert.severity",
        ])
        .output();
    match out {
        Err(_) => skip::part("the tshark check of the capture: tshark is not installed (Debian package tshark)"),
        Ok(o) => {
            let lines = String::from_utf8_lossy(&o.stdout);
            assert!(o.status.success(), "tshark failed: {}", String::from_utf8_lossy(&o.stderr));
            let rows: Vec<&str> = lines.lines().collect();
            assert_eq!(rows.len(), s.roce, "tshark sees every packet");
            for r in rows {
                let f: Vec<&str> = r.split(',').collect();
                assert!(!f[0].is_empty(), "no BTH decoded: {r}");
                assert!(f.get(1).is_none_or(|m| m.is_empty()), "malformed: {r}");
                // Severity 8388608 = error, 6291456 = warning.
                assert!(
                    f.get(2).is_none_or(|e| e.is_empty() || e.parse::<u64>().unwrap_or(0) < 6291456),
                    "expert item: {r}"
                );
            }
        }
    }
}

#[test]
fn busy_poll_devices_work() {
    use std::net::{IpAddr, Ipv4Addr};
    let port = 26000 + (std::process::id() % 1000) as u16;
    let mut ca = DeviceConfig::at("bp-a", IpAddr::V4(Ipv4Addr::new(127, 0, 0, 3)), port);
    let mut cb = DeviceConfig::at("bp-b", IpAddr::V4(Ipv4Addr::new(127, 0, 0, 4)), port);
    ca.busy_poll = true;
    cb.busy_poll = true;
    let (Ok(a), Ok(b)) = (Context::open(&ca), Context::open(&cb)) else {
        skip!("port {port} is in use");
    };
    let (a, b) = (end(a), end(b));
    a.qp.connect_rc(&b.ctx.query_gid(0).unwrap(), b.qp.qp_num(), 1, 2).unwrap();
    b.qp.connect_rc(&a.ctx.query_gid(0).unwrap(), a.qp.qp_num(), 2, 1).unwrap();
    let src = a.pd.register(vec![4u8; 100_000], Access::empty()).unwrap();
    let dst = b.pd.register(vec![0u8; 100_000], Access::LOCAL_WRITE | Access::REMOTE_WRITE).unwrap();
    let mut w = wr(1, WrOpcode::RdmaWrite, src.sge(0, 100_000));
    w.remote_addr = dst.iova();
    w.rkey = dst.rkey();
    a.qp.post_send(&w).unwrap();
    assert_eq!(a.cq.wait(1, T).unwrap()[0].status, WcStatus::Success);
    assert_eq!(dst.to_vec(), vec![4u8; 100_000]);
}

#[test]
fn fence_orders_after_a_read() {
    let (a, b) = connected(None);
    let all = Access::LOCAL_WRITE | Access::REMOTE_WRITE | Access::REMOTE_READ;
    let remote = b.pd.register(vec![1u8; 64], all).unwrap();
    let local = a.pd.register(vec![0u8; 128], all).unwrap();
    // READ the old contents, then (fenced) WRITE new ones: the READ must see the old.
    let mut r = wr(1, WrOpcode::RdmaRead, local.sge(0, 64));
    r.remote_addr = remote.iova();
    r.rkey = remote.rkey();
    local.write_at(64, &[9u8; 64]).unwrap();
    let mut w = wr(2, WrOpcode::RdmaWrite, local.sge(64, 64));
    w.remote_addr = remote.iova();
    w.rkey = remote.rkey();
    w.flags |= SendFlags::FENCE;
    a.qp.post_send_list([r, w]).unwrap();
    let wcs = a.cq.wait(2, T).unwrap();
    assert_eq!((wcs[0].wr_id, wcs[1].wr_id), (1, 2));
    assert_eq!(&local.to_vec()[..64], &[1u8; 64][..]);
    assert_eq!(remote.to_vec(), vec![9u8; 64]);
}

#[test]
fn device_counters_keep_what_a_destroyed_qp_counted() {
    let (a, b) = connected(None);
    let m = a.pd.register(vec![5u8; 4096], Access::LOCAL_WRITE).unwrap();
    let t = b.pd.register(vec![0u8; 4096], Access::LOCAL_WRITE | Access::REMOTE_WRITE).unwrap();
    for i in 0..8 {
        let mut w = wr(i, WrOpcode::RdmaWrite, m.sge(0, 4096));
        w.remote_addr = t.iova();
        w.rkey = t.rkey();
        a.qp.post_send(&w).unwrap();
        a.cq.wait(1, T).unwrap();
    }
    let before = a.ctx.stats();
    assert!(before.tx_packets >= 8 && before.tx_bytes >= 8 * 4096, "{before:?}");
    let End { ctx, pd, cq, qp } = a;
    drop(qp);
    let after = ctx.stats();
    assert!(after.tx_packets >= before.tx_packets && after.tx_bytes >= before.tx_bytes, "{before:?} -> {after:?}");
    assert!(after.rx_packets >= before.rx_packets, "{before:?} -> {after:?}");
    drop((cq, pd));
}
