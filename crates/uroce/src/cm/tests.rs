//! Deterministic tests of the CM agent: two agents joined by a fabric that
//! the test controls (drop, duplicate, hold), with time advanced by hand.

use super::mad::{attr, rej_reason, CmMad, CmMsg, MsgRef, TransportType};
use super::park;
use super::*;
use std::net::{IpAddr, SocketAddr};
use std::time::{Duration, Instant};

pub(super) const A_IP: &str = "10.0.0.1";
pub(super) const B_IP: &str = "10.0.0.2";
pub(super) const A_GUID: u64 = 0x0200_00ff_fe0a_0001;
pub(super) const B_GUID: u64 = 0x0200_00ff_fe0a_0002;
pub(super) const PORT: u16 = 7174;

pub(super) struct Net {
    pub(super) a: Cm,
    pub(super) b: Cm,
    pub(super) now: Instant,
    /// MADs taken from the agents, not yet delivered: (to_b, bytes).
    pub(super) wire: Vec<(bool, [u8; 256])>,
}

pub(super) fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

impl Net {
    pub(super) fn new() -> Net {
        Net {
            a: Cm::new(CmConfig::new(ip(A_IP), A_GUID, 1)),
            b: Cm::new(CmConfig::new(ip(B_IP), B_GUID, 2)),
            now: Instant::now(),
            wire: Vec::new(),
        }
    }
    /// Takes what both agents want to send.
    pub(super) fn collect(&mut self) {
        while let Some(o) = self.a.poll_transmit() {
            assert_eq!(o.dst, ip(B_IP));
            self.wire.push((true, o.mad));
        }
        while let Some(o) = self.b.poll_transmit() {
            assert_eq!(o.dst, ip(A_IP));
            self.wire.push((false, o.mad));
        }
    }
    /// The attribute names on the wire, in order.
    fn names(&mut self) -> Vec<&'static str> {
        self.collect();
        self.wire.iter().map(|(_, m)| CmMad::parse(m).unwrap().msg.name()).collect()
    }
    /// Delivers everything on the wire, repeatedly, until quiet.
    pub(super) fn run(&mut self) {
        for _ in 0..50 {
            self.collect();
            if self.wire.is_empty() {
                return;
            }
            for (to_b, m) in std::mem::take(&mut self.wire) {
                if to_b {
                    self.b.handle_mad(self.now, ip(A_IP), &m);
                } else {
                    self.a.handle_mad(self.now, ip(B_IP), &m);
                }
            }
        }
        panic!("fabric never quiet");
    }
    /// Drops everything on the wire.
    pub(super) fn drop_all(&mut self) -> usize {
        self.collect();
        std::mem::take(&mut self.wire).len()
    }
    pub(super) fn advance(&mut self, d: Duration) {
        self.now += d;
        self.a.handle_timeout(self.now);
        self.b.handle_timeout(self.now);
    }
    pub(super) fn listen(&mut self) -> ListenId {
        self.b.listen(ListenParams { ps: PortSpace::Tcp, addr: None, port: PORT, backlog: 0, xrc: false }).unwrap()
    }
    pub(super) fn connect(&mut self) -> ConnId {
        self.a.connect(self.now, connect_params(0x11, b"hello")).unwrap()
    }
}

pub(super) fn connect_params(qpn: u32, private: &[u8]) -> ConnectParams {
    ConnectParams {
        ps: PortSpace::Tcp,
        src_port: 48489,
        dst: SocketAddr::new(ip(B_IP), PORT),
        qpn,
        transport: TransportType::Rc,
        responder_resources: 1,
        initiator_depth: 2,
        flow_control: false,
        retry_count: 7,
        rnr_retry_count: 6,
        srq: false,
        traffic_class: 0,
        private_data: private.to_vec(),
    }
}

pub(super) fn accept_params(qpn: u32) -> AcceptParams {
    AcceptParams {
        qpn,
        responder_resources: 2,
        initiator_depth: 1,
        rnr_retry_count: 5,
        private_data: b"welcome".to_vec(),
        ..Default::default()
    }
}

pub(super) fn events(cm: &mut Cm) -> Vec<CmEvent> {
    std::iter::from_fn(|| cm.poll_event()).collect()
}
pub(super) fn kinds(cm: &mut Cm) -> Vec<(EventKind, i32)> {
    events(cm).into_iter().map(|e| (e.kind, e.status)).collect()
}

/// Connects A (active, QP 0x11) to B (passive, QP 0x22); returns both ids.
pub(super) fn connected(n: &mut Net) -> (ConnId, ConnId) {
    n.listen();
    let a = n.connect();
    n.run();
    let req = events(&mut n.b);
    assert_eq!(req.len(), 1);
    let b = req[0].id;
    n.b.accept(n.now, b, accept_params(0x22)).unwrap();
    n.run();
    assert_eq!(kinds(&mut n.a), [(EventKind::ConnectResponse, 0)]);
    n.a.establish(n.now, a).unwrap();
    n.run();
    assert_eq!(kinds(&mut n.b), [(EventKind::Established, 0)]);
    (a, b)
}

#[test]
fn connect_accept_rtu_carries_what_rxe_carries() {
    let mut n = Net::new();
    let l = n.listen();
    let a = n.connect();
    n.collect();
    let (_, req) = n.wire[0];
    let m = CmMad::parse(&req).unwrap();
    let CmMsg::Req(r) = &m.msg else { panic!() };
    assert_eq!(m.tid, mad::form_tid(2, a.0));
    assert_eq!(r.local_comm_id, a.0);
    assert_eq!(r.service_id, 0x0106_1c06);
    assert_eq!((r.local_qpn, r.local_ca_guid, r.pkey), (0x11, A_GUID, 0xFFFF));
    assert_eq!((req[67], req[71], req[74], req[75]), (0xA0, 0xA7, 0x36, 0xF0));
    assert_eq!((r.primary.local_lid, r.primary.remote_lid, r.primary.hop_limit), (0xFFFF, 0xFFFF, 64));
    assert_eq!(r.primary.flow_label, service::roce_flow_label(48489, PORT));
    assert_eq!(r.primary.local_ack_timeout, 17);
    assert_eq!(&req[164..168], &[0x00, 0x40, 0xbd, 0x69]);
    assert_eq!(&req[180..184], &[10, 0, 0, 1]);
    assert_eq!(&req[196..200], &[10, 0, 0, 2]);
    assert_eq!(&req[200..205], b"hello");
    n.run();

    let ev = events(&mut n.b);
    assert_eq!(ev.len(), 1);
    let e = &ev[0];
    assert_eq!((e.kind, e.status, e.listen_id), (EventKind::ConnectRequest, 0, Some(l)));
    let Param::Conn(p) = e.param else { panic!() };
    // Swapped: the passive's responder resources are the active's initiator depth.
    assert_eq!((p.responder_resources, p.initiator_depth, p.retry_count, p.rnr_retry_count), (2, 1, 7, 6));
    assert_eq!(p.qp_num, 0x11);
    assert_eq!(e.private_data.len(), 56);
    assert_eq!(&e.private_data[..5], b"hello");
    let b = e.id;
    let bi = n.b.conn_info(b).unwrap().clone();
    assert_eq!(bi.remote, SocketAddr::new(ip(A_IP), 48489));
    assert_eq!(bi.local, SocketAddr::new(ip(B_IP), PORT));

    n.b.accept(n.now, b, accept_params(0x22)).unwrap();
    n.collect();
    let m = CmMad::parse(&n.wire[0].1).unwrap();
    assert_eq!(m.tid, mad::form_tid(2, a.0), "REP reuses the REQ's TID");
    let CmMsg::Rep(r) = &m.msg else { panic!() };
    assert_eq!((r.local_comm_id, r.remote_comm_id, r.local_qpn), (b.0, a.0, 0x22));
    assert_eq!((n.wire[0].1[50], n.wire[0].1[51]), (0x78, 0xA0));
    n.run();

    let ev = events(&mut n.a);
    assert_eq!(ev.len(), 1);
    assert_eq!(ev[0].kind, EventKind::ConnectResponse);
    assert_eq!(ev[0].private_data.len(), 196);
    assert_eq!(&ev[0].private_data[..7], b"welcome");
    let Param::Conn(p) = ev[0].param else { panic!() };
    assert_eq!((p.responder_resources, p.initiator_depth, p.rnr_retry_count, p.qp_num), (1, 2, 5, 0x22));

    // Each side's QP: rq_psn = own Starting PSN, sq_psn = the peer's.
    let ai = n.a.conn_info(a).unwrap().clone();
    assert_eq!((ai.local_qpn, ai.remote_qpn), (0x11, 0x22));
    assert_eq!((bi.local_qpn, bi.remote_qpn), (0, 0x11));
    let bi = n.b.conn_info(b).unwrap().clone();
    assert_eq!(ai.remote_psn, bi.local_psn);
    assert_eq!(bi.remote_psn, ai.local_psn);
    assert_eq!((ai.responder_resources, ai.initiator_depth), (1, 2));
    assert_eq!((bi.responder_resources, bi.initiator_depth), (2, 1));
    assert_eq!((ai.retry_count, ai.rnr_retry_count, bi.retry_count, bi.rnr_retry_count), (7, 5, 7, 6));
    assert_eq!((ai.ack_timeout, bi.ack_timeout), (17, 17));
    assert_eq!(ai.flow_label, bi.flow_label);

    n.a.establish(n.now, a).unwrap();
    assert_eq!(n.names(), ["RTU"]);
    n.run();
    assert_eq!(kinds(&mut n.b), [(EventKind::Established, 0)]);
    assert_eq!(n.a.stats().retransmits + n.b.stats().retransmits, 0);
}

/// XRC as `k/cm.c` carries it: the REQ says transport 3 with extended
/// type 1 and offers no responder resources, retry counts or SRQ; the REP
/// names the target QP in the Local EECN field and says SRQ; each side's
/// QP gets the other's number. A listener takes only its own kind.
#[test]
fn xrc_connects_an_initiator_to_a_target_and_listeners_take_their_kind() {
    let mut n = Net::new();
    n.b.listen(ListenParams { ps: PortSpace::Ib, addr: None, port: PORT, backlog: 0, xrc: true }).unwrap();
    let xrc =
        ConnectParams { ps: PortSpace::Ib, transport: TransportType::Xrc, srq: true, ..connect_params(0x11, b"") };
    let a = n.a.connect(n.now, xrc.clone()).unwrap();
    n.collect();
    let CmMsg::Req(r) = CmMad::parse(&n.wire[0].1).unwrap().msg else { panic!() };
    assert_eq!((r.transport, r.ext_transport, r.local_qpn), (TransportType::Xrc, 1, 0x11));
    assert_eq!(
        (r.responder_resources, r.initiator_depth, r.retry_count, r.rnr_retry_count, r.srq),
        (0, 2, 0, 0, false)
    );
    n.run();
    let ev = events(&mut n.b);
    assert_eq!((ev.len(), ev[0].kind), (1, EventKind::ConnectRequest));
    let b = ev[0].id;
    n.b.accept(n.now, b, AcceptParams { flow_control: true, ..accept_params(0x22) }).unwrap();
    n.collect();
    let CmMsg::Rep(r) = CmMad::parse(&n.wire[0].1).unwrap().msg else { panic!() };
    assert_eq!((r.local_qpn, r.local_eecn, r.srq, r.initiator_depth, r.flow_control), (0, 0x22, true, 0, false));
    n.run();
    let ev = events(&mut n.a);
    assert_eq!(ev[0].kind, EventKind::ConnectResponse);
    let Param::Conn(p) = ev[0].param else { panic!() };
    assert_eq!(p.qp_num, 0x22);
    let (ai, bi) = (n.a.conn_info(a).unwrap().clone(), n.b.conn_info(b).unwrap().clone());
    assert_eq!((ai.xrc, ai.remote_qpn, ai.initiator_depth, ai.retry_count), (true, 0x22, 2, 7));
    assert_eq!((bi.xrc, bi.remote_qpn, bi.responder_resources), (true, 0x11, 2));
    n.a.establish(n.now, a).unwrap();
    n.run();
    assert_eq!(kinds(&mut n.b), [(EventKind::Established, 0)]);

    // An RC REQ to the XRC listener, and an XRC REQ to an RC listener: REJ 28.
    // (Other QPs: a REQ naming the connected QP would be a stale one.)
    n.a.connect(n.now, ConnectParams { transport: TransportType::Rc, qpn: 0x12, ..xrc.clone() }).unwrap();
    n.run();
    assert_eq!(kinds(&mut n.a), [(EventKind::Rejected, 28)]);
    n.b.listen(ListenParams { ps: PortSpace::Tcp, addr: None, port: PORT, backlog: 0, xrc: false }).unwrap();
    n.a.connect(n.now, ConnectParams { ps: PortSpace::Tcp, qpn: 0x13, ..xrc }).unwrap();
    n.run();
    assert_eq!(kinds(&mut n.a), [(EventKind::Rejected, 28)]);
    assert!(events(&mut n.b).is_empty());
}

/// A REQ for a port whose listener closed a moment ago (perftest `-R`'s
/// server listening anew) waits for the new listener instead of a REJ 8.
#[test]
fn a_req_for_a_port_closed_a_moment_ago_waits_for_its_new_listener() {
    let mut n = Net::new();
    let l = n.listen();
    n.b.unlisten(n.now, l).unwrap();
    n.advance(Duration::from_secs(2));
    let a = n.connect();
    n.run();
    assert_eq!(n.b.stats().reqs_parked, 1);
    assert!(events(&mut n.a).is_empty() && events(&mut n.b).is_empty(), "no REJ, no request yet");
    n.advance(Duration::from_millis(300));
    assert_eq!(n.drop_all(), 0);
    n.listen();
    assert!(n.b.poll_timeout().is_some_and(|t| t <= n.now), "due at once");
    n.advance(Duration::ZERO);
    let ev = events(&mut n.b);
    assert_eq!((ev.len(), ev[0].kind), (1, EventKind::ConnectRequest));
    n.b.accept(n.now, ev[0].id, accept_params(0x22)).unwrap();
    n.run();
    assert_eq!(kinds(&mut n.a), [(EventKind::ConnectResponse, 0)]);
    n.a.establish(n.now, a).unwrap();
    n.run();
    assert_eq!(kinds(&mut n.b), [(EventKind::Established, 0)]);
    assert_eq!(n.b.poll_timeout(), None, "nothing waits");
}

/// Without a new listener a waiting REQ gets its REJ 8 when its hold ends;
/// a retransmission meanwhile is not held twice; a port closed longer ago
/// than the grace, or beyond the number held, is refused at once.
#[test]
fn waiting_reqs_are_rejected_after_their_hold_and_bounded() {
    let mut n = Net::new();
    let l = n.listen();
    n.b.unlisten(n.now, l).unwrap();
    n.connect();
    n.collect();
    let req = n.wire[0].1;
    n.run();
    n.b.handle_mad(n.now, ip(A_IP), &req);
    assert_eq!((n.b.stats().reqs_parked, n.drop_all()), (1, 0));
    n.advance(park::HOLD - Duration::from_millis(1));
    assert!(events(&mut n.a).is_empty());
    n.advance(Duration::from_millis(1));
    n.run();
    assert_eq!(kinds(&mut n.a), [(EventKind::Rejected, 8)]);
    assert_eq!(n.b.poll_timeout(), None);

    // More than MAX at once: the rest at once.
    for qpn in 0..park::MAX as u32 + 1 {
        n.a.connect(n.now, connect_params(0x100 + qpn, b"")).unwrap();
    }
    n.run();
    assert_eq!(n.b.stats().reqs_parked, 1 + park::MAX as u64);
    assert_eq!(kinds(&mut n.a), [(EventKind::Rejected, 8)]);
    n.advance(park::HOLD);
    n.run();
    assert_eq!(kinds(&mut n.a).len(), park::MAX);

    // Past the grace: refused at once.
    n.advance(park::GRACE);
    n.a.connect(n.now, connect_params(0x300, b"")).unwrap();
    n.run();
    assert_eq!(kinds(&mut n.a), [(EventKind::Rejected, 8)]);
    assert_eq!(n.b.stats().reqs_parked, 1 + park::MAX as u64);
}

#[test]
fn no_listener_is_rej_8_and_the_active_sees_rejected_8() {
    let mut n = Net::new();
    let a = n.connect();
    n.run();
    let ev = events(&mut n.a);
    assert_eq!(ev.len(), 1);
    assert_eq!((ev[0].id, ev[0].kind, ev[0].status), (a, EventKind::Rejected, 8));
    assert_eq!(ev[0].private_data.len(), 148);
    assert_eq!(n.b.stats().rej_sent, 1);
    // No retransmission afterwards.
    n.advance(Duration::from_secs(10));
    assert_eq!(n.drop_all(), 0);
}

#[test]
fn listener_refusals_wrong_address_and_port_space() {
    let mut n = Net::new();
    n.b.listen(ListenParams { ps: PortSpace::Tcp, addr: Some(ip("10.0.0.9")), port: PORT, backlog: 1, xrc: false })
        .unwrap();
    n.connect();
    n.run();
    assert_eq!(kinds(&mut n.a), [(EventKind::Rejected, 28)]);
    assert_eq!(
        n.b.listen(ListenParams { ps: PortSpace::Tcp, addr: None, port: PORT, backlog: 1, xrc: false })
            .unwrap_err()
            .errno,
        crate::ib::Errno::EADDRINUSE
    );
}

#[test]
fn lost_req_is_retransmitted_identically_every_4608_ms() {
    let mut n = Net::new();
    n.listen();
    n.connect();
    n.collect();
    let first = n.wire.clone();
    assert_eq!(n.drop_all(), 1);
    n.advance(Duration::from_millis(4607));
    assert_eq!(n.drop_all(), 0);
    n.advance(Duration::from_millis(1));
    n.collect();
    assert_eq!(n.wire, first, "the same MAD, same TID and bytes");
    n.run();
    assert_eq!(events(&mut n.b).len(), 1);
    assert_eq!(n.a.stats().retransmits, 1);
}

#[test]
fn req_unanswered_16_times_is_unreachable_etimedout() {
    let mut n = Net::new();
    let a = n.connect();
    let mut sends = n.drop_all();
    for _ in 0..20 {
        n.advance(Duration::from_millis(4608));
        sends += n.drop_all();
    }
    assert_eq!(sends, 16);
    let ev = events(&mut n.a);
    assert_eq!(ev.len(), 1);
    assert_eq!((ev[0].id, ev[0].kind, ev[0].status), (a, EventKind::Unreachable, -libc::ETIMEDOUT));
    assert_eq!(n.a.poll_timeout(), None);
}

#[test]
fn duplicate_req_before_accept_gets_an_mra_that_holds_off_the_active() {
    let mut n = Net::new();
    n.listen();
    n.connect();
    n.collect();
    let req = n.wire.clone();
    n.run();
    assert_eq!(events(&mut n.b).len(), 1);
    n.wire = req;
    n.collect();
    // Deliver the duplicate REQ: B answers MRA(REQ, 24) and reports nothing new.
    let (_, dup) = n.wire.pop().unwrap();
    n.b.handle_mad(n.now, ip(A_IP), &dup);
    assert!(events(&mut n.b).is_empty());
    n.collect();
    let m = CmMad::parse(&n.wire[0].1).unwrap();
    let CmMsg::Mra(mra) = &m.msg else { panic!("{m:?}") };
    assert_eq!((mra.msg_mraed, mra.service_timeout), (MsgRef::Req, 24));
    n.run();
    // The active now waits 65536 + 512 ms, not 4608, before its next REQ.
    n.advance(Duration::from_millis(60_000));
    assert_eq!(n.drop_all(), 0);
    n.advance(Duration::from_millis(6_100));
    assert_eq!(n.names(), ["REQ"]);
}

#[test]
fn lost_rep_and_lost_rtu_recover() {
    let mut n = Net::new();
    n.listen();
    let a = n.connect();
    n.run();
    let b = events(&mut n.b)[0].id;
    n.b.accept(n.now, b, accept_params(0x22)).unwrap();
    assert_eq!(n.drop_all(), 1); // REP lost
    n.advance(Duration::from_millis(4096));
    assert_eq!(n.names(), ["REP"]);
    n.run();
    assert_eq!(kinds(&mut n.a), [(EventKind::ConnectResponse, 0)]);
    n.a.establish(n.now, a).unwrap();
    assert_eq!(n.drop_all(), 1); // RTU lost
    n.advance(Duration::from_millis(4096));
    // B retransmits its REP; A, established, answers with the RTU again.
    n.run();
    assert_eq!(kinds(&mut n.b), [(EventKind::Established, 0)]);
    assert!(events(&mut n.a).is_empty());
    assert_eq!(n.a.stats().duplicates, 1);
}

#[test]
fn rep_unanswered_is_unreachable_on_the_passive() {
    let mut n = Net::new();
    n.listen();
    n.connect();
    n.run();
    let b = events(&mut n.b)[0].id;
    n.b.accept(n.now, b, accept_params(0x22)).unwrap();
    let mut reps = 0;
    for _ in 0..20 {
        reps += n.names().iter().filter(|&&m| m == "REP").count();
        n.drop_all();
        n.advance(Duration::from_millis(4096));
    }
    assert_eq!(reps, 16);
    assert_eq!(kinds(&mut n.b), [(EventKind::Unreachable, -libc::ETIMEDOUT)]);
}

#[test]
fn disconnect_dreq_drep_then_timewait_exit() {
    let mut n = Net::new();
    let (a, b) = connected(&mut n);
    n.a.disconnect(n.now, a).unwrap();
    n.collect();
    let m = CmMad::parse(&n.wire[0].1).unwrap();
    let CmMsg::Dreq(d) = &m.msg else { panic!() };
    assert_eq!(d.remote_qpn, 0x22);
    assert_eq!(m.tid, mad::form_tid(2, a.0), "an active's DREQ has its REQ's TID");
    n.run();
    assert_eq!(kinds(&mut n.b), [(EventKind::Disconnected, 0)]);
    n.b.disconnect(n.now, b).unwrap();
    n.collect();
    assert_eq!(CmMad::parse(&n.wire[0].1).unwrap().tid, m.tid, "the DREP echoes the DREQ's TID");
    n.run();
    assert_eq!(kinds(&mut n.a), [(EventKind::Disconnected, 0)]);
    n.advance(Duration::from_millis(511));
    assert!(events(&mut n.a).is_empty());
    n.advance(Duration::from_millis(1));
    assert_eq!(kinds(&mut n.a), [(EventKind::TimewaitExit, 0)]);
    assert_eq!(kinds(&mut n.b), [(EventKind::TimewaitExit, 0)]);
    n.a.destroy(n.now, a).unwrap();
    n.b.destroy(n.now, b).unwrap();
    assert_eq!(n.drop_all(), 0);
    assert_eq!((n.a.records(), n.b.records()), (0, 0));
}

#[test]
fn dreq_crossing_dreq_reports_disconnected_once_each() {
    let mut n = Net::new();
    let (a, b) = connected(&mut n);
    n.a.disconnect(n.now, a).unwrap();
    n.b.disconnect(n.now, b).unwrap();
    assert_eq!(n.names(), ["DREQ", "DREQ"]);
    n.run();
    assert_eq!(kinds(&mut n.a), [(EventKind::Disconnected, 0)]);
    assert_eq!(kinds(&mut n.b), [(EventKind::Disconnected, 0)]);
    // Neither retransmits its DREQ any more; each app's destroy sends the DREP.
    n.a.destroy(n.now, a).unwrap();
    n.b.destroy(n.now, b).unwrap();
    assert_eq!(n.names(), ["DREP", "DREP"]);
    n.run();
    assert!(events(&mut n.a).is_empty() && events(&mut n.b).is_empty());
    n.advance(Duration::from_secs(1));
    assert_eq!(n.drop_all(), 0);
    assert_eq!((n.a.records(), n.b.records()), (0, 0));
}

#[test]
fn lost_dreq_retransmits_and_lost_drep_is_resent_from_timewait() {
    let mut n = Net::new();
    let (a, b) = connected(&mut n);
    n.a.disconnect(n.now, a).unwrap();
    assert_eq!(n.drop_all(), 1);
    n.advance(Duration::from_millis(4608));
    assert_eq!(n.names(), ["DREQ"]);
    let dreq = n.wire[0].1;
    n.run();
    assert_eq!(kinds(&mut n.b), [(EventKind::Disconnected, 0)]);
    n.b.disconnect(n.now, b).unwrap();
    assert_eq!(n.drop_all(), 1); // DREP lost; B is in timewait
                                 // The DREQ again (duplicated by the network): B in timewait answers with a DREP.
    n.advance(Duration::from_millis(100));
    n.b.handle_mad(n.now, ip(A_IP), &dreq);
    assert_eq!(n.names(), ["DREP"]);
    n.run();
    assert_eq!(kinds(&mut n.a), [(EventKind::Disconnected, 0)]);
    // After B destroyed its id, a late DREQ is still answered (unknown comm ID).
    n.advance(Duration::from_secs(1));
    n.b.destroy(n.now, b).unwrap();
    n.b.handle_mad(n.now, ip(A_IP), &dreq);
    assert_eq!(n.names(), ["DREP"]);
}

#[test]
fn destroy_all_sends_a_dreq_per_connection_and_a_rej_per_request() {
    let mut n = Net::new();
    let (_a, _b) = connected(&mut n);
    n.a.connect(n.now, connect_params(0x12, b"")).unwrap();
    n.run();
    assert_eq!(events(&mut n.b).len(), 1);
    n.b.destroy_all(n.now);
    let mut names = n.names();
    names.sort();
    assert_eq!(names, ["DREQ", "REJ"]);
    n.run();
    let mut k = kinds(&mut n.a);
    k.sort_by_key(|e| e.0 as u32);
    assert_eq!(k, [(EventKind::Rejected, 28), (EventKind::Disconnected, 0)]);
    n.advance(Duration::from_secs(1));
    assert_eq!(n.b.records(), 0);
}

#[test]
fn dreq_retries_exhausted_is_disconnected_etimedout() {
    let mut n = Net::new();
    let (a, _b) = connected(&mut n);
    n.a.disconnect(n.now, a).unwrap();
    for _ in 0..20 {
        n.drop_all();
        n.advance(Duration::from_millis(4608));
    }
    assert_eq!(kinds(&mut n.a), [(EventKind::Disconnected, -libc::ETIMEDOUT), (EventKind::TimewaitExit, 0)]);
}

#[test]
fn dreq_unknown_id_gets_a_drep_and_wrong_qpn_is_dropped() {
    let mut n = Net::new();
    let (a, b) = connected(&mut n);
    let dreq =
        super::mad::Dreq { local_comm_id: 0x1234, remote_comm_id: 0x5678, remote_qpn: 0x22, ..Default::default() };
    n.b.handle_mad(n.now, ip(A_IP), &CmMad::new(99, CmMsg::Dreq(Box::new(dreq))).to_bytes());
    n.collect();
    let m = CmMad::parse(&n.wire[0].1).unwrap();
    assert_eq!(m.tid, 99);
    let CmMsg::Drep(d) = &m.msg else { panic!() };
    assert_eq!((d.local_comm_id, d.remote_comm_id), (0x5678, 0x1234));
    n.drop_all();
    // The right IDs but the wrong QPN: dropped silently.
    let dreq = super::mad::Dreq { local_comm_id: a.0, remote_comm_id: b.0, remote_qpn: 0x99, ..Default::default() };
    n.b.handle_mad(n.now, ip(A_IP), &CmMad::new(1, CmMsg::Dreq(Box::new(dreq))).to_bytes());
    assert_eq!(n.drop_all(), 0);
    assert!(events(&mut n.b).is_empty());
}

#[test]
fn destroy_before_accept_is_rej_28_and_active_destroy_is_rej_4() {
    let mut n = Net::new();
    n.listen();
    n.connect();
    n.run();
    let b = events(&mut n.b)[0].id;
    n.b.destroy(n.now, b).unwrap();
    n.run();
    assert_eq!(kinds(&mut n.a), [(EventKind::Rejected, 28)]);
    assert_eq!(n.b.records(), 0);

    let a2 = n.connect();
    n.run();
    assert_eq!(events(&mut n.b).len(), 1);
    n.a.destroy(n.now, a2).unwrap();
    n.collect();
    let m = CmMad::parse(&n.wire[0].1).unwrap();
    let CmMsg::Rej(r) = &m.msg else { panic!() };
    assert_eq!((r.reason, r.ari()), (rej_reason::TIMEOUT, &A_GUID.to_be_bytes()[..]));
    n.run();
    assert_eq!(kinds(&mut n.b), [(EventKind::Rejected, 4)]);
    assert!(events(&mut n.a).is_empty(), "a destroyed id reports nothing");
    // Left: A's first id (rejected, idle) and B's second (rejected, idle).
    assert_eq!((n.a.records(), n.b.records()), (1, 1));
}

#[test]
fn reject_sends_consumer_defined_with_private_data() {
    let mut n = Net::new();
    n.listen();
    n.connect();
    n.run();
    let b = events(&mut n.b)[0].id;
    assert!(n.b.reject(n.now, b, 28, &[0u8; 149]).is_err());
    n.b.reject(n.now, b, 28, b"go away").unwrap();
    n.run();
    let ev = events(&mut n.a);
    assert_eq!((ev[0].kind, ev[0].status), (EventKind::Rejected, 28));
    assert_eq!(&ev[0].private_data[..7], b"go away");
    assert_eq!(ev[0].private_data.len(), 148);
}

#[test]
fn stale_qpn_gets_rej_10_and_the_old_connection_a_dreq() {
    let mut n = Net::new();
    let (_a, _b) = connected(&mut n);
    // A reuses QP 0x11 while B still holds it connected.
    n.a.connect(n.now, connect_params(0x11, b"")).unwrap();
    n.collect();
    let (_, req) = n.wire.pop().unwrap();
    n.b.handle_mad(n.now, ip(A_IP), &req);
    assert_eq!(n.names(), ["REJ", "DREQ"]);
    let m = CmMad::parse(&n.wire[0].1).unwrap();
    let CmMsg::Rej(r) = &m.msg else { panic!() };
    assert_eq!(r.reason, rej_reason::STALE_CONN);
    n.run();
    let ka = kinds(&mut n.a);
    assert!(ka.contains(&(EventKind::Rejected, 10)) && ka.contains(&(EventKind::Disconnected, 0)), "{ka:?}");
}

#[test]
fn backlog_full_drops_the_req_without_rej() {
    let mut n = Net::new();
    n.b.listen(ListenParams { ps: PortSpace::Tcp, addr: None, port: PORT, backlog: 1, xrc: false }).unwrap();
    n.connect();
    n.run();
    assert_eq!(events(&mut n.b).len(), 1);
    n.a.connect(n.now, connect_params(0x12, b"")).unwrap();
    n.run();
    assert!(events(&mut n.b).is_empty());
    assert!(events(&mut n.a).is_empty());
    assert_eq!(n.b.stats().backlog_drops, 1);
    assert_eq!(n.b.stats().rej_sent, 0);
}

#[test]
fn private_data_limits_are_einval() {
    let mut n = Net::new();
    assert!(n.a.connect(n.now, connect_params(0x11, &[1; 57])).is_err());
    assert!(n.a.connect(n.now, connect_params(0x11, &[1; 56])).is_ok());
    n.listen();
    n.run();
    let b = events(&mut n.b)[0].id;
    let mut p = accept_params(0x22);
    p.private_data = vec![0; 197];
    assert_eq!(n.b.accept(n.now, b, p).unwrap_err().errno, crate::ib::Errno::EINVAL);
}

#[test]
fn unmatched_and_malformed_mads_are_counted_not_fatal() {
    let mut n = Net::new();
    let rtu = super::mad::Rtu { local_comm_id: 5, remote_comm_id: 6, ..Default::default() };
    n.a.handle_mad(n.now, ip(B_IP), &CmMad::new(1, CmMsg::Rtu(Box::new(rtu))).to_bytes());
    n.a.handle_mad(n.now, ip(B_IP), &[1, 7, 2, 3]);
    let mut lap = [0u8; 256];
    lap[..4].copy_from_slice(&[1, 7, 2, 3]);
    lap[17] = attr::LAP as u8;
    n.a.handle_mad(n.now, ip(B_IP), &lap);
    let s = n.a.stats();
    assert_eq!((s.received, s.unmatched, s.malformed, s.unknown_attr), (3, 1, 1, 1));
    assert_eq!(n.drop_all(), 0);
}

#[test]
fn sidr_resolves_a_ud_listener() {
    let mut n = Net::new();
    n.b.listen(ListenParams { ps: PortSpace::Udp, addr: None, port: 7471, backlog: 0, xrc: false }).unwrap();
    let p = SidrParams {
        ps: PortSpace::Udp,
        src_port: 40000,
        dst: SocketAddr::new(ip(B_IP), 7471),
        private_data: b"ud?".to_vec(),
    };
    let a = n.a.sidr_resolve(n.now, p.clone()).unwrap();
    n.run();
    let ev = events(&mut n.b);
    assert_eq!(ev[0].kind, EventKind::ConnectRequest);
    assert_eq!(ev[0].private_data.len(), 180);
    n.b.accept(n.now, ev[0].id, AcceptParams { qpn: 0x33, qkey: RDMA_UDP_QKEY, ..Default::default() }).unwrap();
    n.run();
    let ev = events(&mut n.a);
    assert_eq!((ev[0].id, ev[0].kind, ev[0].status), (a, EventKind::Established, 0));
    assert_eq!(ev[0].param, Param::Ud(UdParam { qp_num: 0x33, qkey: RDMA_UDP_QKEY }));
    assert_eq!(ev[0].private_data.len(), 136);

    // To a port nobody listens on: status 1 (unsupported SID).
    n.a.sidr_resolve(n.now, SidrParams { dst: SocketAddr::new(ip(B_IP), 1), ..p.clone() }).unwrap();
    n.run();
    assert_eq!(kinds(&mut n.a), [(EventKind::Unreachable, 1)]);
    // Unanswered: 16 sends 4096 ms apart, then UNREACHABLE -110.
    n.a.sidr_resolve(n.now, p).unwrap();
    let mut sends = 0;
    for _ in 0..20 {
        sends += n.drop_all();
        n.advance(Duration::from_millis(4096));
    }
    assert_eq!(sends, 16);
    assert_eq!(kinds(&mut n.a), [(EventKind::Unreachable, -libc::ETIMEDOUT)]);
}

/// A seeded run with loss and duplication both ways: every connection
/// establishes and tears down, the way `UROCE_FAULTS` stresses rping.
#[test]
fn lossy_fabric_connects_and_disconnects_every_time() {
    let mut rng = 0x1234_5678_9abc_def0u64;
    let mut next = move || {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        rng
    };
    let mut n = Net::new();
    n.listen();
    for round in 0..30u32 {
        let qpn = 0x100 + round;
        let a = n.a.connect(n.now, connect_params(qpn, b"")).unwrap();
        let (mut b, mut a_done, mut b_done, mut a_disc, mut b_disc) = (None, false, false, false, false);
        for _step in 0..2000 {
            n.collect();
            for (to_b, m) in std::mem::take(&mut n.wire) {
                let r = next() % 10;
                let copies = if r < 3 {
                    0
                } else if r == 9 {
                    2
                } else {
                    1
                };
                for _ in 0..copies {
                    if to_b {
                        n.b.handle_mad(n.now, ip(A_IP), &m);
                    } else {
                        n.a.handle_mad(n.now, ip(B_IP), &m);
                    }
                }
            }
            for e in events(&mut n.b) {
                match e.kind {
                    EventKind::ConnectRequest => {
                        assert!(b.is_none(), "one CONNECT_REQUEST per connection");
                        b = Some(e.id);
                        n.b.accept(n.now, e.id, accept_params(0x200 + round)).unwrap();
                    }
                    EventKind::Established => b_done = true,
                    EventKind::Disconnected => {
                        assert!(!b_disc);
                        b_disc = true;
                        let _ = n.b.disconnect(n.now, e.id);
                    }
                    EventKind::TimewaitExit => {}
                    k => panic!("round {round}: B got {k:?}"),
                }
            }
            for e in events(&mut n.a) {
                match e.kind {
                    EventKind::ConnectResponse => {
                        n.a.establish(n.now, a).unwrap();
                        a_done = true;
                        n.a.disconnect(n.now, a).unwrap();
                    }
                    EventKind::Disconnected => {
                        assert!(!a_disc);
                        a_disc = true;
                    }
                    EventKind::TimewaitExit => {}
                    k => panic!("round {round}: A got {k:?} {}", e.status),
                }
            }
            if a_disc && b_disc {
                break;
            }
            n.advance(Duration::from_millis(500));
        }
        assert!(a_done && a_disc && b_disc, "round {round}: {a_done} {b_done} {a_disc} {b_disc}");
        n.advance(Duration::from_secs(70));
        n.drop_all();
        n.a.destroy(n.now, a).unwrap();
        if let Some(b) = b {
            n.b.destroy(n.now, b).unwrap();
        }
        n.advance(Duration::from_secs(1));
        n.drop_all();
        events(&mut n.a);
        events(&mut n.b);
    }
    assert!(n.a.stats().retransmits > 0 && n.b.stats().duplicates > 0);
    assert_eq!((n.a.records(), n.b.records()), (0, 0));
}

mod fuzz {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

        /// Arbitrary MADs (valid headers, random bodies) and user calls in
        /// any order: no panic, and the agent's tables stay bounded.
        #[test]
        fn random_mads_and_calls_never_panic(
            ops in proptest::collection::vec((0u8..12, 0x10u8..0x19, any::<u32>(), proptest::collection::vec(any::<u8>(), 232)), 1..60)
        ) {
            let mut n = Net::new();
            n.listen();
            let mut ids = Vec::new();
            for (op, attr_lo, x, body) in ops {
                match op {
                    0 => ids.extend(n.a.connect(n.now, connect_params(1 + (x & 0xFF), b"")).ok()),
                    1 => n.advance(Duration::from_millis(x as u64 % 10_000)),
                    2 => n.run(),
                    3..=8 => {
                        let mut m = [0u8; 256];
                        m[..4].copy_from_slice(&[1, 7, 2, 3]);
                        m[17] = attr_lo;
                        m[24..].copy_from_slice(&body);
                        // Sometimes aim at a real connection of B.
                        if x & 1 == 0 {
                            if let Some(e) = n.b.poll_event() {
                                m[28..32].copy_from_slice(&e.id.0.to_be_bytes());
                            }
                        }
                        n.b.handle_mad(n.now, ip(A_IP), &m);
                        n.a.handle_mad(n.now, ip(B_IP), &m);
                    }
                    _ => {
                        if let Some(&id) = ids.get(x as usize % ids.len().max(1)) {
                            let _ = match op {
                                9 => n.a.disconnect(n.now, id),
                                10 => n.a.establish(n.now, id),
                                _ => n.a.destroy(n.now, id),
                            };
                        }
                    }
                }
                n.collect();
                prop_assert!(n.wire.len() < 10_000);
            }
            n.advance(Duration::from_secs(100_000));
            n.drop_all();
            for _ in 0..20 {
                n.advance(Duration::from_secs(100));
                n.drop_all();
            }
            prop_assert!(n.a.records() <= 60 && n.b.records() <= 60);
        }
    }
}

#[test]
fn ipv6_connection_carries_ipv6_header_and_gids() {
    let (ia, ib): (IpAddr, IpAddr) = ("fd00::1".parse().unwrap(), "fd00::2".parse().unwrap());
    let mut a = Cm::new(CmConfig::new(ia, A_GUID, 3));
    let mut b = Cm::new(CmConfig::new(ib, B_GUID, 4));
    let now = Instant::now();
    b.listen(ListenParams { ps: PortSpace::Tcp, addr: Some(ib), port: PORT, backlog: 0, xrc: false }).unwrap();
    let mut p = connect_params(0x11, b"v6");
    p.dst = SocketAddr::new(ib, PORT);
    // An IPv4 destination from an IPv6 device is refused.
    assert!(a.connect(now, connect_params(0x11, b"")).is_err());
    let id = a.connect(now, p).unwrap();
    let req = a.poll_transmit().unwrap();
    assert_eq!(req.dst, ib);
    let m = CmMad::parse(&req.mad).unwrap();
    let CmMsg::Req(r) = &m.msg else { panic!() };
    assert_eq!((r.primary.local_gid, r.primary.remote_gid), (service::ip_to_gid(ia), service::ip_to_gid(ib)));
    assert_eq!(req.mad[165], 0x60);
    assert_eq!(&req.mad[168..184], &service::ip_to_gid(ia));
    b.handle_mad(now, ia, &req.mad);
    let e = b.poll_event().unwrap();
    assert_eq!(e.kind, EventKind::ConnectRequest);
    assert_eq!(b.conn_info(e.id).unwrap().remote, SocketAddr::new(ia, 48489));
    b.accept(now, e.id, accept_params(0x22)).unwrap();
    let rep = b.poll_transmit().unwrap();
    assert_eq!(rep.dst, ia);
    a.handle_mad(now, ib, &rep.mad);
    assert_eq!(a.poll_event().map(|e| (e.id, e.kind)), Some((id, EventKind::ConnectResponse)));
}
