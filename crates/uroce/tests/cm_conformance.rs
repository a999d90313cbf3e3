//! CM MADs of real Linux rxe captures (the repository's conformance/captures/rxe, copied from
//! shared/conformance): every UD packet to QP 1 is a CM MAD that parses with
//! the field values shared/spec/cm.md lists for it, re-emits to the exact
//! bytes, carries the GSI Q_Key and source QP, and has a correct ICRC.

use std::net::IpAddr;
use std::path::PathBuf;
use uroce::cm::mad::{attr, CmMad, CmMsg, TransportType};
use uroce::cm::service::{self, CmaHdr, PortSpace};
use uroce::cm::{GSI_QKEY, GSI_QPN};
use uroce::wire::pcap::{extract_roce, PcapReader};
use uroce::wire::{icrc, Packet};

struct Mad {
    frame: usize,
    src: IpAddr,
    sport: u16,
    bytes: Vec<u8>,
    mad: CmMad,
}

fn cm_mads(name: &str) -> Vec<Mad> {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../conformance/captures/rxe").join(name);
    let r = PcapReader::new(std::fs::File::open(&path).unwrap()).unwrap();
    let lt = r.linktype;
    let mut out = Vec::new();
    for (i, frame) in r.enumerate() {
        let frame = frame.unwrap();
        let Some((ip, udp)) = extract_roce(lt, &frame.data, 4791) else { continue };
        let p = Packet::parse(udp).unwrap();
        let Some(deth) = p.headers.deth else { continue };
        let b = p.headers.bth;
        assert_eq!(b.opcode.0, 0x64, "{name}#{}", i + 1);
        assert_eq!((b.dest_qp, b.pkey, b.ack_req, b.pad_count), (GSI_QPN, 0xFFFF, true, 0));
        assert_eq!((deth.qkey, deth.src_qp), (GSI_QKEY, GSI_QPN));
        assert!(icrc::verify(&ip, udp), "{name}#{}: ICRC", i + 1);
        assert_eq!(udp.len(), 12 + 8 + 256 + 4);
        let mad = CmMad::parse(p.payload).unwrap_or_else(|e| panic!("{name}#{}: {e}", i + 1));
        assert_eq!(&mad.to_bytes()[..], p.payload, "{name}#{}: re-emitted MAD differs", i + 1);
        out.push(Mad { frame: i + 1, src: ip.src, sport: ip.sport, bytes: p.payload.to_vec(), mad });
    }
    out
}

const ACTIVE: &str = "10.1.16.62";
const PASSIVE: &str = "10.1.16.61";

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

struct ReqFacts {
    tid: u64,
    comm: u32,
    sid: u64,
    qpn: u32,
    psn: u32,
    rr_id: u8,
    sport: u16,
    flow: u32,
}

fn check_req(m: &Mad, f: &ReqFacts) {
    let CmMsg::Req(r) = &m.mad.msg else { panic!("#{} is not a REQ", m.frame) };
    assert_eq!(m.src, ip(ACTIVE));
    assert_eq!(m.mad.tid, f.tid);
    assert_eq!(m.mad.tid, uroce::cm::mad::form_tid(2, f.comm));
    assert_eq!(m.mad.attr_mod, 0);
    assert_eq!(r.local_comm_id, f.comm);
    assert_eq!(r.vendor_id, 0);
    assert_eq!(r.service_id, f.sid);
    assert_eq!(r.local_ca_guid, 0x025056fffea77d03);
    assert_eq!((r.local_qkey, r.local_qpn, r.local_eecn, r.remote_eecn), (0, f.qpn, 0, 0));
    assert_eq!((r.responder_resources, r.initiator_depth), (f.rr_id, f.rr_id));
    assert_eq!((r.remote_cm_response_timeout, r.transport, r.flow_control), (20, TransportType::Rc, false));
    assert_eq!(r.starting_psn, f.psn);
    assert_eq!((r.local_cm_response_timeout, r.retry_count), (20, 7));
    assert_eq!((r.pkey, r.path_mtu, r.rdc_exists, r.rnr_retry_count), (0xFFFF, 3, false, 7));
    assert_eq!((r.max_cm_retries, r.srq, r.ext_transport), (15, false, 0));
    let p = &r.primary;
    assert_eq!((p.local_lid, p.remote_lid), (0xFFFF, 0xFFFF));
    assert_eq!(p.local_gid, service::ip_to_gid(ip(ACTIVE)));
    assert_eq!(p.remote_gid, service::ip_to_gid(ip(PASSIVE)));
    assert_eq!((p.flow_label, p.packet_rate), (f.flow, 0));
    assert_eq!((p.traffic_class, p.hop_limit, p.sl, p.subnet_local, p.local_ack_timeout), (0, 64, 0, false, 17));
    assert_eq!(r.alternate, Default::default());
    // The raw bytes the spec's checklist names.
    assert_eq!((m.bytes[67], m.bytes[71], m.bytes[74], m.bytes[75]), (0xA0, 0xA7, 0x37, 0xF0));
    // The rdma_cm header and the Service ID scheme.
    let (ps, port) = service::from_service_id(r.service_id).unwrap();
    assert_eq!(ps, PortSpace::Tcp);
    let h = CmaHdr::parse(r.private_data.as_slice()).unwrap();
    assert_eq!(h, CmaHdr { src_port: f.sport, src: ip(ACTIVE), dst: ip(PASSIVE) });
    assert_eq!(service::roce_flow_label(h.src_port, port), f.flow);
    assert!(r.private_data.0[CmaHdr::LEN..].iter().all(|&b| b == 0));
}

fn check_rep(m: &Mad, tid: u64, local: u32, remote: u32, qpn: u32, psn: u32, rr_id: u8) {
    let CmMsg::Rep(r) = &m.mad.msg else { panic!("#{} is not a REP", m.frame) };
    assert_eq!(m.src, ip(PASSIVE));
    assert_eq!(m.mad.tid, tid);
    assert_eq!((r.local_comm_id, r.remote_comm_id), (local, remote));
    assert_eq!((r.local_qkey, r.local_qpn, r.vendor_id, r.local_eecn), (0, qpn, 0, 0));
    assert_eq!(r.starting_psn, psn);
    assert_eq!((r.responder_resources, r.initiator_depth), (rr_id, rr_id));
    assert_eq!((r.target_ack_delay, r.failover_accepted, r.flow_control), (15, 0, false));
    assert_eq!((r.rnr_retry_count, r.srq), (7, false));
    assert_eq!((m.bytes[50], m.bytes[51]), (0x78, 0xE0));
    assert_eq!(r.local_ca_guid, 0x025056fffea7129f);
    assert_eq!(r.private_data, Default::default());
}

fn check_pair(m: &Mad, want: u16, src: &str, tid: u64, local: u32, remote: u32) {
    assert_eq!(m.mad.msg.attr_id(), want, "#{}", m.frame);
    assert_eq!(m.src, ip(src), "#{}", m.frame);
    assert_eq!(m.mad.tid, tid, "#{}", m.frame);
    let (l, r) = match &m.mad.msg {
        CmMsg::Rtu(x) | CmMsg::Drep(x) => (x.local_comm_id, x.remote_comm_id),
        CmMsg::Dreq(x) => (x.local_comm_id, x.remote_comm_id),
        _ => panic!("#{}", m.frame),
    };
    assert_eq!((l, r), (local, remote), "#{}", m.frame);
}

fn dreq_qpn(m: &Mad) -> u32 {
    let CmMsg::Dreq(d) = &m.mad.msg else { panic!("#{} is not a DREQ", m.frame) };
    d.remote_qpn
}

#[test]
fn rdma_cm_pcap_mads_have_the_rxe_values() {
    let v = cm_mads("rdma_cm.pcap");
    let frames: Vec<usize> = v.iter().map(|m| m.frame).collect();
    assert_eq!(frames, [1, 2, 3, 24, 25, 30, 91, 92, 93, 94, 95, 96]);
    assert!(v.iter().all(|m| m.sport == 55410));
    let (a1, p1, a2, p2) = (0x64c0c56d, 0x8988f456, 0x65c0c56d, 0x8b88f456);
    let (t1, t2) = (0x0000_0002_6dc5_c064, 0x0000_0002_6dc5_c065);
    let (pt1, pt2) = (0x0000_0002_56f4_8889, 0x0000_0002_56f4_888b);
    check_req(
        &v[0],
        &ReqFacts {
            tid: t1,
            comm: a1,
            sid: 0x0106_4853,
            qpn: 0x3d,
            psn: 0x7cc204,
            rr_id: 0,
            sport: 52471,
            flow: 0x91a3c,
        },
    );
    check_rep(&v[1], t1, p1, a1, 0x3b, 0x727d6d, 0);
    check_pair(&v[2], attr::RTU, ACTIVE, t1, a1, p1);
    check_req(
        &v[3],
        &ReqFacts {
            tid: t2,
            comm: a2,
            sid: 0x0106_4853,
            qpn: 0x3e,
            psn: 0xaf834f,
            rr_id: 0,
            sport: 50878,
            flow: 0x85955,
        },
    );
    check_rep(&v[4], t2, p2, a2, 0x3c, 0x7d2388, 0);
    check_pair(&v[5], attr::RTU, ACTIVE, t2, a2, p2);
    // DREQ crossing DREQ, each answered by a DREP echoing its TID.
    check_pair(&v[6], attr::DREQ, ACTIVE, t2, a2, p2);
    assert_eq!(dreq_qpn(&v[6]), 0x3c);
    check_pair(&v[7], attr::DREQ, PASSIVE, pt2, p2, a2);
    assert_eq!(dreq_qpn(&v[7]), 0x3e);
    check_pair(&v[8], attr::DREP, PASSIVE, t2, p2, a2);
    check_pair(&v[9], attr::DREP, ACTIVE, pt2, a2, p2);
    check_pair(&v[10], attr::DREQ, PASSIVE, pt1, p1, a1);
    assert_eq!(dreq_qpn(&v[10]), 0x3d);
    check_pair(&v[11], attr::DREP, ACTIVE, pt1, a1, p1);
}

#[test]
fn rping_pcap_mads_have_the_rxe_values() {
    let v = cm_mads("rping.pcap");
    let frames: Vec<usize> = v.iter().map(|m| m.frame).collect();
    assert_eq!(frames, [1, 2, 3, 64, 65]);
    let (a, p, t) = (0x6ec0c56d, 0x9d88f456, 0x0000_0002_6dc5_c06e);
    check_req(
        &v[0],
        &ReqFacts {
            tid: t,
            comm: a,
            sid: 0x0106_1c06,
            qpn: 0x2c,
            psn: 0x003da6,
            rr_id: 1,
            sport: 48489,
            flow: 0x70bbd,
        },
    );
    check_rep(&v[1], t, p, a, 0x2b, 0xfebd3d, 1);
    check_pair(&v[2], attr::RTU, ACTIVE, t, a, p);
    check_pair(&v[3], attr::DREQ, ACTIVE, t, a, p);
    assert_eq!(dreq_qpn(&v[3]), 0x2b);
    check_pair(&v[4], attr::DREP, PASSIVE, t, p, a);
}
