//! The CM on real devices over loopback: two uroce devices, each with its
//! CM agent on QP 1, connect an RC QP pair with REQ/REP/RTU, move data over
//! it, and disconnect with DREQ/DREP; a device without a CM agent answers a
//! REQ with REJ 8; uroce's own CM packets, captured, carry what an rxe
//! peer's carry.

#[macro_use]
mod skip;

mod common;

use common::*;
use std::net::SocketAddr;
use std::time::Duration;
use uroce::cm::{CmEndpoint, ConnOptions, EventKind};
use uroce::verbs::*;
use uroce::wire::pcap::{extract_roce, PcapReader};

const PORT: u16 = 7174;
const PORT_AFTER_RESTART: u16 = 7175;

#[test]
fn connect_accept_send_disconnect() {
    connect_send_disconnect(None);
}

fn connect_send_disconnect(capture: Option<std::path::PathBuf>) {
    let (ca, cb) = pair_with(capture);
    let (ea, eb) = (CmEndpoint::open(&ca).unwrap(), CmEndpoint::open(&cb).unwrap());
    assert_eq!(CmEndpoint::open(&ca).unwrap_err().errno, uroce::ib::Errno::EBUSY, "one QP 1 per device");
    let (a, b) = (end(ca), end(cb));
    let listen = eb.listen(PORT, 4).unwrap();
    let rx = b.pd.register(vec![0u8; 64], Access::LOCAL_WRITE).unwrap();
    CmEndpoint::init_qp(&b.qp).unwrap();
    b.qp.post_recv(&RecvWr { wr_id: 1, sg_list: uroce::sgl![rx.sge(0, 64)] }).unwrap();
    let dst = SocketAddr::new(b.ctx.local_addr().ip(), PORT);

    let server = std::thread::scope(|s| {
        let server = s.spawn(|| {
            let req = eb.get_request(listen, T).unwrap();
            assert_eq!(&req.private_data[..5], b"hello");
            assert_eq!(req.private_data.len(), 56);
            assert_eq!(req.param.qp_num, a.qp.qp_num());
            let opts = ConnOptions { private_data: b"welcome".to_vec(), ..ConnOptions::default() };
            eb.accept(req, &b.qp, &opts, T).unwrap()
        });
        let opts = ConnOptions { private_data: b"hello".to_vec(), ..ConnOptions::default() };
        let conn = ea.connect(&a.qp, dst, &opts, T).unwrap();
        assert_eq!(&conn.private_data[..7], b"welcome");
        assert_eq!(conn.info.remote_qpn, b.qp.qp_num());
        assert_eq!(a.qp.state(), QpState::Rts);
        // Data over the QPs the CM connected.
        let tx = a.pd.register(b"over a CM connection".to_vec(), Access::empty()).unwrap();
        let mut w = wr(7, WrOpcode::Send, tx.sge(0, 20));
        w.flags = SendFlags::SIGNALED;
        a.qp.post_send(&w).unwrap();
        assert_eq!(a.cq.wait(1, T).unwrap()[0].status, WcStatus::Success);
        let got = b.cq.wait(1, T).unwrap()[0];
        assert_eq!((got.status, got.byte_len), (WcStatus::Success, 20));
        assert_eq!(&rx.to_vec()[..20], b"over a CM connection");
        (conn, server.join().unwrap())
    });
    let (conn_a, conn_b) = server;
    assert_eq!(conn_b.info.remote_qpn, a.qp.qp_num());
    assert_eq!(conn_a.info.local_psn, conn_b.info.remote_psn);
    assert_eq!(b.qp.state(), QpState::Rts);

    ea.disconnect(&conn_a, &a.qp).unwrap();
    assert_eq!(eb.wait_disconnected(&conn_b, T).unwrap(), 0);
    eb.disconnect(&conn_b, &b.qp).unwrap();
    assert_eq!(ea.wait_disconnected(&conn_a, T).unwrap(), 0);
    // Timewait (512 ms) ends for both.
    ea.wait_event(conn_a.id, &[EventKind::TimewaitExit], T).unwrap();
    eb.wait_event(conn_b.id, &[EventKind::TimewaitExit], T).unwrap();
    drop((conn_a, conn_b));
    let (sa, sb) = (ea.stats(), eb.stats());
    assert_eq!((sa.malformed, sb.malformed, sa.unmatched, sb.unmatched), (0, 0, 0, 0));
    a.ctx.flush_capture();
}

/// Captured on the active device, every CM packet is a UD SEND to QP 1 as
/// rxe sends it (Q_Key 0x80010000, source QP 1, P_Key 0xFFFF, AckReq, a
/// 256-byte MAD, correct ICRC) whose MAD re-emits byte for byte, and the
/// REQ carries rxe's values (shared/spec/cm.md §7).
#[test]
fn own_cm_packets_look_like_rxe() {
    use uroce::cm::mad::{CmMad, CmMsg};
    use uroce::cm::{service, CmaHdr};
    use uroce::wire::{icrc, Packet};
    let dir = std::env::temp_dir().join(format!("uroce-cm-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("cm.pcap");
    connect_send_disconnect(Some(path.clone()));
    let r = PcapReader::new(std::fs::File::open(&path).unwrap()).unwrap();
    let lt = r.linktype;
    let mut names = Vec::new();
    for f in r {
        let f = f.unwrap();
        let Some((ip, udp)) = extract_roce(lt, &f.data, ip_port(&f.data)) else { continue };
        let p = Packet::parse(udp).unwrap();
        if p.headers.bth.dest_qp != 1 {
            continue;
        }
        assert!(icrc::verify(&ip, udp));
        let b = p.headers.bth;
        assert_eq!((b.opcode.0, b.pkey, b.ack_req, b.pad_count), (0x64, 0xFFFF, true, 0));
        let d = p.headers.deth.unwrap();
        assert_eq!((d.qkey, d.src_qp), (0x8001_0000, 1));
        assert_eq!(p.payload.len(), 256);
        let m = CmMad::parse(p.payload).unwrap();
        assert_eq!(&m.to_bytes()[..], p.payload);
        if let CmMsg::Req(r) = &m.msg {
            let mad = p.payload;
            assert_eq!(r.service_id, 0x0106_0000 + PORT as u64);
            assert_eq!((mad[67], mad[71], mad[75]), (0xA0, 0xA7, 0xF0));
            assert_eq!(mad[74] & 0x07, 7);
            assert_eq!((r.primary.local_lid, r.primary.remote_lid, r.primary.hop_limit), (0xFFFF, 0xFFFF, 64));
            assert_eq!(r.primary.local_ack_timeout, 17);
            assert_eq!(r.primary.local_gid, service::ip_to_gid(ip.src));
            let h = CmaHdr::parse(r.private_data.as_slice()).unwrap();
            assert_eq!((h.src, h.dst), (ip.src, ip.dst));
            assert_eq!(r.primary.flow_label, service::roce_flow_label(h.src_port, PORT));
        }
        names.push(m.msg.name());
    }
    assert_eq!(names, ["REQ", "REP", "RTU", "DREQ", "DREP"]);
    tshark_sees_clean_cm_mads(&path, &names);
    let _ = std::fs::remove_dir_all(&dir);
}

/// tshark decodes each CM packet as a CM MAD with no expert info and
/// nothing malformed.
fn tshark_sees_clean_cm_mads(path: &std::path::Path, names: &[&str]) {
    if std::process::Command::new("tshark").arg("-v").output().is_err() {
        skip::part("tshark check of uroce's CM packets: tshark is not installed (Debian package tshark)");
        return;
    }
    let first = PcapReader::new(std::fs::File::open(path).unwrap()).unwrap().next().unwrap().unwrap();
    let port = ip_port(&first.data);
    let out = std::process::Command::new("tshark")
        .arg("-r")
        .arg(path)
        .args(["-d", &format!("udp.port=={port},infiniband"), "--disable-protocol", "rpcordma"])
        .args(["-Y", "infiniband.mad", "-T", "fields", "-E", "separator=;"])
        .args(["-e", "infiniband.mad.attributeid", "-e", "_ws.expert", "-e", "_ws.malformed"])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    let lines: Vec<&str> = text.lines().collect();
    let ids: Vec<&str> = names
        .iter()
        .map(|n| match *n {
            "REQ" => "0x0010;;",
            "REP" => "0x0013;;",
            "RTU" => "0x0014;;",
            "DREQ" => "0x0015;;",
            _ => "0x0016;;",
        })
        .collect();
    assert_eq!(lines, ids, "tshark: {}", String::from_utf8_lossy(&out.stderr));
}

/// The UDP destination port of a captured IPv4 frame (the test devices use
/// a private port, not 4791).
fn ip_port(frame: &[u8]) -> u16 {
    frame.get(36..38).map_or(4791, |p| u16::from_be_bytes([p[0], p[1]]))
}

#[test]
fn a_device_without_cm_rejects_and_no_listener_rejects() {
    let (ca, cb) = pair_with(None);
    let ea = CmEndpoint::open(&ca).unwrap();
    let a = end(ca);
    let dst = SocketAddr::new(cb.local_addr().ip(), PORT);
    // cb has no CM agent: its engine answers REJ 8 at once.
    let t = std::time::Instant::now();
    let e = ea.connect(&a.qp, dst, &ConnOptions::default(), T).unwrap_err();
    assert_eq!(e.errno.0, libc::ECONNREFUSED);
    assert!(t.elapsed() < Duration::from_secs(2));
    // With an agent but no listener on the port: the same.
    let eb = CmEndpoint::open(&cb).unwrap();
    let qp2 = a.pd.create_qp(&QpInitAttr::rc(&a.cq, &a.cq)).unwrap();
    let e = ea.connect(&qp2, dst, &ConnOptions::default(), T).unwrap_err();
    assert_eq!(e.errno.0, libc::ECONNREFUSED);
    assert_eq!(eb.stats().rej_sent, 1);
}

/// The handles are RAII, as rdma_cm ids are to `rdma_destroy_id`: a
/// request dropped unanswered is rejected (the active side's connect fails
/// ECONNREFUSED at once, no timeout), and a connection dropped while up
/// sends a DREQ (the peer reports DISCONNECTED).
#[test]
fn a_dropped_request_is_rejected_and_a_dropped_connection_disconnects() {
    let (ca, cb) = pair_with(None);
    let (ea, eb) = (CmEndpoint::open(&ca).unwrap(), CmEndpoint::open(&cb).unwrap());
    let (a, b) = (end(ca), end(cb));
    let listen = eb.listen(PORT, 2).unwrap();
    let dst = SocketAddr::new(b.ctx.local_addr().ip(), PORT);
    std::thread::scope(|s| {
        s.spawn(|| drop(eb.get_request(listen, T).unwrap()));
        let t = std::time::Instant::now();
        let e = ea.connect(&a.qp, dst, &ConnOptions::default(), T).unwrap_err();
        assert_eq!(e.errno.0, libc::ECONNREFUSED);
        assert!(t.elapsed() < T, "refused, not timed out");
    });
    assert_eq!(eb.stats().rej_sent, 1);
    let qp2 = a.pd.create_qp(&QpInitAttr::rc(&a.cq, &a.cq)).unwrap();
    let conn = std::thread::scope(|s| {
        let server = s.spawn(|| {
            let req = eb.get_request(listen, T).unwrap();
            eb.accept(req, &b.qp, &ConnOptions::default(), T).unwrap()
        });
        let conn = ea.connect(&qp2, dst, &ConnOptions::default(), T).unwrap();
        drop(server.join().unwrap());
        conn
    });
    assert_eq!(ea.wait_disconnected(&conn, T).unwrap(), 0, "the server's dropped connection sent a DREQ");
}

#[test]
fn rejected_by_the_listener() {
    let (ca, cb) = pair_with(None);
    let (ea, eb) = (CmEndpoint::open(&ca).unwrap(), CmEndpoint::open(&cb).unwrap());
    let a = end(ca);
    let listen = eb.listen(PORT, 1).unwrap();
    let dst = SocketAddr::new(cb.local_addr().ip(), PORT);
    std::thread::scope(|s| {
        s.spawn(|| {
            let req = eb.get_request(listen, T).unwrap();
            eb.reject(req, b"no").unwrap();
        });
        let e = ea.connect(&a.qp, dst, &ConnOptions::default(), T).unwrap_err();
        assert_eq!(e.errno.0, libc::ECONNREFUSED);
    });
}

/// Two devices that lose 10% and duplicate 5% of what they receive
/// (`UROCE_FAULTS`): connections still establish, carry data and tear down
/// every time, by MAD retransmission.
#[test]
fn lossy_devices_connect_and_disconnect_every_time() {
    use std::net::{IpAddr, Ipv4Addr};
    let open = |name: &str, last: u8, port: u16, seed: u32| {
        let mut c = DeviceConfig::at(name, IpAddr::V4(Ipv4Addr::new(127, 0, 0, last)), port);
        c.faults = Some(format!("loss=0.1,dup=0.05,seed={seed}"));
        Context::open(&c)
    };
    let mut pair = None;
    for i in 0..50u16 {
        let port = 40000 + (std::process::id() as u16 % 1000) * 8 + i % 8;
        if let (Ok(a), Ok(b)) =
            (open(&format!("cmf-a-{port}"), 1, port, 11), open(&format!("cmf-b-{port}"), 2, port, 12))
        {
            pair = Some((a, b));
            break;
        }
    }
    let (ca, cb) = pair.expect("a free port pair");
    let (ea, eb) = (CmEndpoint::open(&ca).unwrap(), CmEndpoint::open(&cb).unwrap());
    let (a, b) = (end(ca), end(cb));
    let listen = eb.listen(PORT, 4).unwrap();
    let dst = SocketAddr::new(b.ctx.local_addr().ip(), PORT);
    let long = Duration::from_secs(90);
    let rx = b.pd.register(vec![0u8; 64], Access::LOCAL_WRITE).unwrap();
    let tx = a.pd.register(vec![7u8; 64], Access::empty()).unwrap();
    for round in 0..6 {
        let qa = a.pd.create_qp(&QpInitAttr::rc(&a.cq, &a.cq)).unwrap();
        let qb = b.pd.create_qp(&QpInitAttr::rc(&b.cq, &b.cq)).unwrap();
        CmEndpoint::init_qp(&qb).unwrap();
        qb.post_recv(&RecvWr { wr_id: round, sg_list: uroce::sgl![rx.sge(0, 64)] }).unwrap();
        let (conn_a, conn_b) = std::thread::scope(|s| {
            let server = s.spawn(|| {
                let req = eb.get_request(listen, long).unwrap();
                eb.accept(req, &qb, &ConnOptions::default(), long).unwrap()
            });
            let c = ea.connect(&qa, dst, &ConnOptions::default(), long).unwrap();
            (c, server.join().unwrap())
        });
        let mut w = wr(round, WrOpcode::Send, tx.sge(0, 64));
        w.flags = SendFlags::SIGNALED;
        qa.post_send(&w).unwrap();
        assert_eq!(a.cq.wait(1, long).unwrap()[0].status, WcStatus::Success, "round {round}");
        assert_eq!(b.cq.wait(1, long).unwrap()[0].status, WcStatus::Success, "round {round}");
        ea.disconnect(&conn_a, &qa).unwrap();
        eb.wait_disconnected(&conn_b, long).unwrap();
        eb.disconnect(&conn_b, &qb).unwrap();
        drop(conn_b);
        assert_eq!(ea.wait_disconnected(&conn_a, long).unwrap(), 0, "round {round}");
        drop(conn_a);
    }
    let (sa, sb) = (ea.stats(), eb.stats());
    assert!(sa.retransmits + sb.retransmits > 0 || sa.duplicates + sb.duplicates > 0, "{sa:?} {sb:?}");
}

/// UD: the active side learns the listener's QP number and Q_Key by SIDR,
/// then sends to it; a port nobody listens on is refused.
#[test]
fn sidr_resolves_a_ud_qp() {
    let (ca, cb) = pair_with(None);
    let (ea, eb) = (CmEndpoint::open(&ca).unwrap(), CmEndpoint::open(&cb).unwrap());
    let (pa, pb) = (ca.alloc_pd().unwrap(), cb.alloc_pd().unwrap());
    let (cqa, cqb) = (ca.create_cq(16, None).unwrap(), cb.create_cq(16, None).unwrap());
    let qa = pa.create_qp(&QpInitAttr::ud(&cqa, &cqa)).unwrap();
    let qb = pb.create_qp(&QpInitAttr::ud(&cqb, &cqb)).unwrap();
    for q in [&qa, &qb] {
        let mut a =
            QpAttr { qp_state: QpState::Init, port_num: 1, qkey: uroce::cm::RDMA_UDP_QKEY, ..QpAttr::default() };
        q.modify(&a, QpAttrMask::STATE | QpAttrMask::PKEY_INDEX | QpAttrMask::PORT | QpAttrMask::QKEY).unwrap();
        a.qp_state = QpState::Rtr;
        q.modify(&a, QpAttrMask::STATE).unwrap();
        a.qp_state = QpState::Rts;
        q.modify(&a, QpAttrMask::STATE | QpAttrMask::SQ_PSN).unwrap();
    }
    let listen = eb.listen_ud(7471, 0).unwrap();
    let dst = SocketAddr::new(cb.local_addr().ip(), 7471);
    let peer = std::thread::scope(|s| {
        s.spawn(|| {
            let req = eb.get_request(listen, T).unwrap();
            assert_eq!(req.private_data.len(), 180);
            assert_eq!(&req.private_data[..3], b"ud?");
            eb.accept_ud(req, &qb, b"ud!").unwrap();
        });
        ea.resolve_ud(dst, b"ud?", T).unwrap()
    });
    assert_eq!((peer.qpn, peer.qkey), (qb.qp_num(), uroce::cm::RDMA_UDP_QKEY));
    assert_eq!(&peer.private_data[..3], b"ud!");
    let rx = pb.register(vec![0u8; 40 + 64], Access::LOCAL_WRITE).unwrap();
    qb.post_recv(&RecvWr { wr_id: 1, sg_list: uroce::sgl![rx.sge(0, 104)] }).unwrap();
    let tx = pa.register(b"datagram".to_vec(), Access::empty()).unwrap();
    let ah = pa
        .create_ah(AddressVector {
            dgid: cb.query_gid(0).unwrap(),
            is_global: true,
            hop_limit: 64,
            port_num: 1,
            ..Default::default()
        })
        .unwrap();
    let mut w = wr(1, WrOpcode::Send, tx.sge(0, 8));
    w.ud = Some(UdDest { av: ah.av, remote_qpn: peer.qpn, remote_qkey: peer.qkey });
    qa.post_send(&w).unwrap();
    assert_eq!(cqb.wait(1, T).unwrap()[0].status, WcStatus::Success);
    assert_eq!(&rx.to_vec()[40..48], b"datagram");
    // No UD listener on that port: SIDR_REP "unsupported" → refused.
    let e = ea.resolve_ud(SocketAddr::new(cb.local_addr().ip(), 9), b"", T).unwrap_err();
    assert_eq!(e.errno.0, libc::ECONNREFUSED);
}

/// The server's CM goes away with a connection established (as its process
/// exiting closes it): the client hears a DREQ and reports DISCONNECTED;
/// a later connect to that device is refused by the device itself.
#[test]
fn server_endpoint_gone_disconnects_the_client() {
    let (ca, cb) = pair_with(None);
    let (ea, eb) = (CmEndpoint::open(&ca).unwrap(), CmEndpoint::open(&cb).unwrap());
    let (a, b) = (end(ca), end(cb));
    let listen = eb.listen(PORT, 1).unwrap();
    let dst = SocketAddr::new(b.ctx.local_addr().ip(), PORT);
    let (conn, server_conn) = std::thread::scope(|s| {
        let server = s.spawn(|| {
            let req = eb.get_request(listen, T).unwrap();
            eb.accept(req, &b.qp, &ConnOptions::default(), T).unwrap()
        });
        (ea.connect(&a.qp, dst, &ConnOptions::default(), T).unwrap(), server.join().unwrap())
    });
    // The endpoint goes with its connection up (the handle outlives it).
    drop(eb);
    assert_eq!(ea.wait_disconnected(&conn, T).unwrap(), 0);
    drop(server_conn);
    ea.disconnect(&conn, &a.qp).unwrap();
    drop(conn);
    let qp2 = a.pd.create_qp(&QpInitAttr::rc(&a.cq, &a.cq)).unwrap();
    let e = ea.connect(&qp2, dst, &ConnOptions::default(), T).unwrap_err();
    assert_eq!(e.errno.0, libc::ECONNREFUSED);
}

/// A UC QP pair connects the same way (REQ Transport Service Type 1).
#[test]
fn uc_connects_too() {
    let (ca, cb) = pair_with(None);
    let (ea, eb) = (CmEndpoint::open(&ca).unwrap(), CmEndpoint::open(&cb).unwrap());
    let (a, b) = (end(ca), end(cb));
    let uc = |e: &End| e.pd.create_qp(&QpInitAttr { qp_type: QpType::Uc, ..QpInitAttr::rc(&e.cq, &e.cq) }).unwrap();
    let (qa, qb) = (uc(&a), uc(&b));
    let listen = eb.listen(PORT, 1).unwrap();
    let dst = SocketAddr::new(b.ctx.local_addr().ip(), PORT);
    CmEndpoint::init_qp(&qb).unwrap();
    let rx = b.pd.register(vec![0u8; 16], Access::LOCAL_WRITE).unwrap();
    qb.post_recv(&RecvWr { wr_id: 1, sg_list: uroce::sgl![rx.sge(0, 16)] }).unwrap();
    let _conns = std::thread::scope(|s| {
        let server = s.spawn(|| {
            let req = eb.get_request(listen, T).unwrap();
            eb.accept(req, &qb, &ConnOptions::default(), T).unwrap()
        });
        (ea.connect(&qa, dst, &ConnOptions::default(), T).unwrap(), server.join().unwrap())
    });
    let tx = a.pd.register(b"uc".to_vec(), Access::empty()).unwrap();
    qa.post_send(&wr(1, WrOpcode::Send, tx.sge(0, 2))).unwrap();
    assert_eq!(b.cq.wait(1, T).unwrap()[0].status, WcStatus::Success);
    assert_eq!(&rx.to_vec()[..2], b"uc");
}

/// QP 1 that left RTS (an overrun or a bug; here moved to ERROR on
/// purpose) is brought back to RTS by its endpoint, its receives posted
/// again, and serves the next connection: a broken QP 1 must not end the
/// CM for good (issue 27).
#[test]
fn qp1_moved_to_error_comes_back_and_serves_a_connection() {
    let (ca, cb) = pair_with(None);
    let (ea, eb) = (CmEndpoint::open(&ca).unwrap(), CmEndpoint::open(&cb).unwrap());
    let (a, b) = (end(ca), end(cb));
    let listen = eb.listen(PORT_AFTER_RESTART, 4).unwrap();
    CmEndpoint::init_qp(&b.qp).unwrap();
    eb.gsi_qp().modify(&QpAttr { qp_state: QpState::Err, ..QpAttr::default() }, QpAttrMask::STATE).unwrap();
    // Its flushed receives wake the endpoint, which finds QP 1 out of RTS:
    // well before the agent's 60 s safety-net wake-up.
    let t = std::time::Instant::now();
    while eb.stats().qp1_restarts == 0 || eb.gsi_qp().state() != QpState::Rts {
        assert!(t.elapsed() < Duration::from_secs(30), "QP 1 not back: {:?} {:?}", eb.gsi_qp().state(), eb.stats());
        std::thread::sleep(Duration::from_millis(10));
    }
    let dst = SocketAddr::new(b.ctx.local_addr().ip(), PORT_AFTER_RESTART);
    let (conn, accepted) = std::thread::scope(|s| {
        let server = s.spawn(|| {
            let req = eb.get_request(listen, T).unwrap();
            eb.accept(req, &b.qp, &ConnOptions::default(), T).unwrap()
        });
        let conn = ea.connect(&a.qp, dst, &ConnOptions::default(), T).unwrap();
        (conn, server.join().unwrap())
    });
    assert_eq!((a.qp.state(), b.qp.state()), (QpState::Rts, QpState::Rts));
    assert_eq!(accepted.info.remote_qpn, a.qp.qp_num());
    assert_eq!(eb.stats().qp1_restarts, 1, "{:?}", eb.stats());
    ea.disconnect(&conn, &a.qp).unwrap();
    assert_eq!(eb.wait_disconnected(&accepted, T).unwrap(), 0);
}
