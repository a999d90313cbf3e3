//! QP 1 (the General Services Interface) on the wire: the headers of a CM
//! MAD packet (UD SEND_ONLY to QP 1, Q_Key 0x80010000, source QP 1, AckReq
//! set as rxe sets it), and what a device answers when no CM agent runs in
//! its process — the kernel's answers for an agent with no matching state:
//! a REQ gets REJ 8 (invalid Service ID, as with no listener), a SIDR_REQ a
//! SIDR_REP "unsupported", a DREQ a DREP (`k/cm.c` `cm_issue_rej`,
//! `cm_issue_drep`); anything else is dropped.

use crate::wire::mad::{rej_reason, sidr_status, Bytes, CmMad, CmMsg, Drep, MsgRef, Rej, SidrRep, GSI_QKEY, GSI_QPN};
use crate::wire::{Bth, Deth, Headers, Opcode};

/// The headers of a CM MAD packet sent from QP 1 with `psn`.
pub fn mad_headers(psn: u32) -> Headers {
    let mut h = Headers::new(Bth {
        opcode: Opcode::UD_SEND_ONLY,
        solicited: false,
        mig_req: false,
        pad_count: 0,
        tver: 0,
        pkey: 0xFFFF,
        fecn: false,
        becn: false,
        dest_qp: GSI_QPN,
        ack_req: true,
        psn: psn & 0xFF_FFFF,
    });
    h.deth = Some(Deth { qkey: GSI_QKEY, src_qp: GSI_QPN });
    h
}

/// The answer of a device without a CM agent to a MAD received on QP 1.
pub fn answer_unhandled(mad: &[u8]) -> Option<CmMad> {
    let m = CmMad::parse(mad).ok()?;
    let msg = match m.msg {
        CmMsg::Req(r) => CmMsg::Rej(Box::new(Rej {
            local_comm_id: 0,
            remote_comm_id: r.local_comm_id,
            msg_rejected: MsgRef::Req,
            reject_info_len: 0,
            reason: rej_reason::INVALID_SERVICE_ID,
            ari: Bytes::default(),
            private_data: Bytes::default(),
        })),
        CmMsg::SidrReq(s) => CmMsg::SidrRep(Box::new(SidrRep {
            request_id: s.request_id,
            status: sidr_status::UNSUPPORTED,
            add_info_len: 0,
            qpn: 0,
            service_id: s.service_id,
            qkey: 0,
            add_info: Bytes::default(),
            private_data: Bytes::default(),
        })),
        CmMsg::Dreq(d) => CmMsg::Drep(Box::new(Drep {
            local_comm_id: d.remote_comm_id,
            remote_comm_id: d.local_comm_id,
            ..Drep::default()
        })),
        _ => return None,
    };
    Some(CmMad::new(m.tid, msg))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn req_gets_rej_8_dreq_a_drep_others_nothing() {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../conformance/captures/rxe/rping.pcap");
        let r = crate::wire::pcap::PcapReader::new(std::fs::File::open(path).unwrap()).unwrap();
        let lt = r.linktype;
        let frame = r.into_iter().next().unwrap().unwrap();
        let (_, udp) = crate::wire::pcap::extract_roce(lt, &frame.data, 4791).unwrap();
        let p = crate::wire::Packet::parse(udp).unwrap();
        // The REQ's own headers are what `mad_headers` makes (but the PSN).
        assert_eq!(p.headers, mad_headers(p.headers.bth.psn));
        let ans = answer_unhandled(p.payload).unwrap();
        assert_eq!(ans.tid, 0x0000_0002_6dc5_c06e);
        let CmMsg::Rej(rej) = &ans.msg else { panic!() };
        assert_eq!((rej.local_comm_id, rej.remote_comm_id, rej.reason), (0, 0x6ec0c56d, 8));
        assert_eq!(rej.msg_rejected, MsgRef::Req);

        let rtu = CmMad::new(1, CmMsg::Rtu(Box::default()));
        assert_eq!(answer_unhandled(&rtu.to_bytes()), None);
        assert_eq!(answer_unhandled(&[0u8; 3]), None);
    }

    /// The engine of a device with no QP 1 answers a REQ with REJ 8, in a
    /// UD packet to QP 1 of the sender with a correct ICRC.
    #[test]
    fn an_engine_without_qp1_rejects_a_req() {
        use crate::cm::{service, CmConfig, ConnectParams, PortSpace};
        use crate::ib::Mtu;
        use crate::proto::{Engine, EngineConfig};
        use crate::wire::{build_packet, icrc, IpInfo, Packet};
        use std::net::{IpAddr, SocketAddr};
        use std::time::Instant;

        let (a, b): (IpAddr, IpAddr) = ("127.0.0.1".parse().unwrap(), "127.0.0.2".parse().unwrap());
        let mut e = Engine::new(EngineConfig::new(b, 4791, Mtu::Mtu1024), crate::mem::Memory::new());
        let now = Instant::now();
        let mut cm = crate::cm::Cm::new(CmConfig::new(a, 0x42, 7));
        let id = cm
            .connect(
                now,
                ConnectParams {
                    ps: PortSpace::Tcp,
                    src_port: 5000,
                    dst: SocketAddr::new(b, 7174),
                    qpn: 0x11,
                    transport: crate::cm::mad::TransportType::Rc,
                    responder_resources: 1,
                    initiator_depth: 1,
                    flow_control: false,
                    retry_count: 7,
                    rnr_retry_count: 7,
                    srq: false,
                    traffic_class: 0,
                    private_data: Vec::new(),
                },
            )
            .unwrap();
        let req = cm.poll_transmit().unwrap();
        let ip = IpInfo { src: a, dst: b, sport: 4791, dport: 4791, ipv4_id: 0 };
        let mut pkt = vec![0u8; 400];
        let n = build_packet(&mad_headers(0), &req.mad, &ip, &mut pkt).unwrap();
        // A corrupted copy is not answered.
        let mut bad = pkt[..n].to_vec();
        bad[100] ^= 1;
        e.handle_datagram(now, SocketAddr::new(a, 4791), b, &bad);
        assert!(e.poll_transmit(now).is_none());
        e.handle_datagram(now, SocketAddr::new(a, 4791), b, &pkt[..n]);
        let t = e.poll_transmit(now).unwrap();
        assert_eq!(t.dst, SocketAddr::new(a, 4791));
        let back = IpInfo { src: b, dst: a, sport: 4791, dport: 4791, ipv4_id: 0 };
        assert!(icrc::verify(&back, &t.data));
        let p = Packet::parse(&t.data).unwrap();
        assert_eq!(p.headers.bth.dest_qp, 1);
        assert_eq!(p.headers.deth.map(|d| (d.qkey, d.src_qp)), Some((GSI_QKEY, GSI_QPN)));
        // The active's agent takes it as "no listener".
        cm.handle_mad(now, b, p.payload);
        let ev = cm.poll_event().unwrap();
        assert_eq!((ev.id, ev.kind, ev.status), (id, crate::cm::EventKind::Rejected, 8));
        let _ = service::ip_to_gid(a);

        // With a QP 1, the engine leaves MADs to it; no second QP 1.
        let cq = std::sync::Arc::new(crate::proto::cq::CompletionQueue::new(1, 16));
        let init = || crate::proto::qp::QpInit {
            qp_type: crate::ib::QpType::Ud,
            pd: 1,
            send_cq: cq.clone(),
            recv_cq: cq.clone(),
            srq: None,
            cap: crate::proto::wr::QpCap {
                max_send_wr: 8,
                max_recv_wr: 8,
                max_send_sge: 1,
                max_recv_sge: 1,
                max_inline_data: 0,
            },
            sq_sig_all: false,
            scatter_to_cqe: false,
        };
        assert_eq!(e.create_gsi_qp(init()).unwrap(), 1);
        assert_eq!(e.create_gsi_qp(init()).unwrap_err().errno, crate::ib::Errno::EBUSY);
        // Application QPs never get QPN 1.
        assert!(e.create_qp(init()).unwrap() >= 0x11);
        e.handle_datagram(now, SocketAddr::new(a, 4791), b, &pkt[..n]);
        assert!(e.poll_transmit(now).is_none());
    }

    /// A device without a CM answers a flood of REQs at most at the
    /// budget's rate (not a reflector): a burst, then nothing at one `now`.
    #[test]
    fn an_engine_without_qp1_answers_a_flood_at_a_bounded_rate() {
        use crate::cm::budget::ANSWER_BURST;
        use crate::ib::Mtu;
        use crate::proto::{Engine, EngineConfig};
        use crate::wire::{build_packet, IpInfo};
        use std::net::{IpAddr, SocketAddr};
        use std::time::Instant;

        let (a, b): (IpAddr, IpAddr) = ("127.0.0.1".parse().unwrap(), "127.0.0.2".parse().unwrap());
        let mut e = Engine::new(EngineConfig::new(b, 4791, Mtu::Mtu1024), crate::mem::Memory::new());
        let now = Instant::now();
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../conformance/captures/rxe/rping.pcap");
        let r = crate::wire::pcap::PcapReader::new(std::fs::File::open(path).unwrap()).unwrap();
        let lt = r.linktype;
        let frame = r.into_iter().next().unwrap().unwrap();
        let (_, udp) = crate::wire::pcap::extract_roce(lt, &frame.data, 4791).unwrap();
        let req = crate::wire::Packet::parse(udp).unwrap();
        assert!(matches!(CmMad::parse(req.payload).unwrap().msg, CmMsg::Req(_)));
        let ip = IpInfo { src: a, dst: b, sport: 4791, dport: 4791, ipv4_id: 0 };
        let mut pkt = vec![0u8; 400];
        let n = build_packet(&mad_headers(0), req.payload, &ip, &mut pkt).unwrap();
        let mut answers = 0;
        for _ in 0..2 * ANSWER_BURST {
            e.handle_datagram(now, SocketAddr::new(a, 4791), b, &pkt[..n]);
            while e.poll_transmit(now).is_some() {
                answers += 1;
            }
        }
        assert_eq!(answers, ANSWER_BURST as usize);
    }
}
