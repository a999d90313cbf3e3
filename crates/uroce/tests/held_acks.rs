//! The responder's delayed ACKs (`proto::ack`). At the engine level: a
//! held ACK leaves right after the application's answer, in the same pass;
//! at its deadline (a fraction of the ACK timeout) when no answer comes,
//! after which the QP acknowledges at once; when its QP is destroyed or
//! reset; never behind a READ response or NAK; not at all when the runtime
//! says no application is there to answer. Through the device runtime: an
//! application that stops calling, or closes its device, right after its
//! last receive still has its ACK sent, and the requester retransmits
//! nothing.

mod common;
#[path = "simnet/mod.rs"]
#[allow(dead_code)]
mod simnet;

use common::*;
use simnet::buf::Buf;
use simnet::conn::{Conn, ConnParams};
use simnet::node::{exchange, Node};
use std::time::{Duration, Instant};
use uroce::ib::{Access, Mtu, QpAttrMask, QpState, Sge};
use uroce::proto::wr::{QpAttr, SendWr, WrOpcode};
use uroce::proto::{ack_hold_limit, Transmit};
use uroce::verbs::*;
use uroce::wire::{AethKind, Opcode, Packet};

// ---------------------------------------------------------------------------
// Engine level

/// Two nodes, one RC connection from node 0 to node 1 with ACK timeout
/// exponent `timeout` on both QPs, 4 KiB registered on each node.
struct Two {
    nodes: [Node; 2],
    conn: Conn,
    keys: [u32; 2],
    // Dropped after `nodes` (declared later), whose keys cover them.
    bufs: [Buf; 2],
}

fn two(timeout: u8) -> Two {
    let now = Instant::now();
    let mut nodes = [Node::new([10, 0, 0, 1].into(), Mtu::Mtu1024), Node::new([10, 0, 0, 2].into(), Mtu::Mtu1024)];
    let conn = Conn::new(
        &mut nodes,
        0,
        now,
        ConnParams { xrc: false, psns: (100, 200), mtu: Mtu::Mtu1024, retry: (timeout, 7) },
    );
    let bufs = [Buf::new(4096, |i| i as u8), Buf::new(4096, |_| 0)];
    let access = Access::LOCAL_WRITE | Access::REMOTE_READ | Access::REMOTE_WRITE;
    // SAFETY: the buffers outlive the nodes' use of the keys (see `Two`).
    let keys = [0, 1].map(|k| unsafe { bufs[k].register(&nodes[k].mem, access) });
    for m in 0..4 {
        conn.post_recv(&mut nodes, now, m, Sge { addr: bufs[1].addr(), length: 4096, lkey: keys[1] });
    }
    Two { nodes, conn, keys, bufs }
}

impl Two {
    fn post(&mut self, node: usize, now: Instant, op: WrOpcode, len: u32) {
        let qpn = if node == 0 { self.conn.req_qpn } else { self.conn.resp_qpn };
        let mut wr = SendWr::new(1, op);
        wr.sg_list = uroce::sgl![Sge { addr: self.bufs[node].addr(), length: len, lkey: self.keys[node] }];
        if matches!(op, WrOpcode::RdmaWrite | WrOpcode::RdmaRead) {
            wr.remote_addr = self.bufs[1 - node].addr();
            wr.rkey = self.keys[1 - node];
        }
        self.nodes[node].engine.post_send(now, qpn, wr).unwrap();
    }

    /// Everything node `from` sends now, handed to the other node.
    fn pass(&mut self, from: usize, now: Instant) -> Vec<(Opcode, u32, Option<AethKind>)> {
        exchange(&mut self.nodes, from, now, false).iter().map(describe).collect()
    }
}

fn describe(t: &Transmit) -> (Opcode, u32, Option<AethKind>) {
    let p = Packet::parse(&t.data).expect("a packet the engine built");
    (p.headers.bth.opcode, p.headers.bth.psn, p.headers.aeth.map(|a| a.kind()))
}

fn is_ack(p: &(Opcode, u32, Option<AethKind>), psn: u32) -> bool {
    p.0 == Opcode::RC_ACK && p.1 == psn && matches!(p.2, Some(AethKind::Ack { .. }))
}

#[test]
fn an_answer_carries_the_held_ack_in_the_same_pass() {
    let t0 = Instant::now();
    let mut w = two(14);
    w.post(0, t0, WrOpcode::RdmaWrite, 64);
    assert_eq!(w.pass(0, t0).len(), 1);
    assert!(w.pass(1, t0).is_empty(), "the ACK is held for the answer");
    let due = w.nodes[1].engine.poll_timeout().expect("the held ACK's deadline is a timer");
    assert_eq!(due, t0 + ack_hold_limit(14));
    let t1 = t0 + Duration::from_micros(3);
    w.post(1, t1, WrOpcode::RdmaWrite, 64);
    let sent = w.pass(1, t1);
    assert_eq!(sent.len(), 2, "{sent:?}");
    assert_eq!(sent[0].0, Opcode::RC_WRITE_ONLY, "the answer first");
    assert!(is_ack(&sent[1], 100), "then the ACK of PSN 100: {sent:?}");
    // The requester has its completion, nothing retransmits.
    assert_eq!(w.nodes[0].cq.poll_one().map(|wc| wc.status), Some(WcStatus::Success));
    assert_eq!(w.nodes[0].engine.stats().retransmits, 0);
}

#[test]
fn a_held_ack_leaves_at_its_deadline_then_the_qp_acknowledges_at_once_until_it_sees_an_answer() {
    let t0 = Instant::now();
    // Exponent 3: 32.8 µs, an eighth of it is held.
    let mut w = two(3);
    let hold = ack_hold_limit(3);
    assert_eq!(hold, Duration::from_nanos(4096));
    w.post(0, t0, WrOpcode::Send, 8);
    w.pass(0, t0);
    assert!(w.pass(1, t0).is_empty());
    assert_eq!(w.nodes[1].engine.poll_timeout(), Some(t0 + hold));
    w.nodes[1].engine.handle_timeout(t0 + hold);
    let sent = w.pass(1, t0 + hold);
    assert!(sent.len() == 1 && is_ack(&sent[0], 100), "{sent:?}");
    assert_eq!(w.nodes[1].engine.poll_timeout(), None);
    // The application did not answer: the next ACK goes at once...
    let t1 = t0 + Duration::from_micros(50);
    w.post(0, t1, WrOpcode::Send, 8);
    w.pass(0, t1);
    let sent = w.pass(1, t1);
    assert!(sent.len() == 1 && is_ack(&sent[0], 101), "{sent:?}");
    // ...and an answer soon after it shows the application answers: the
    // one after that is held again.
    w.post(1, t1 + Duration::from_micros(1), WrOpcode::RdmaWrite, 8);
    w.pass(1, t1 + Duration::from_micros(1));
    let t2 = t1 + Duration::from_micros(20);
    w.pass(0, t2); // the ACK of the answer (held by node 0 until now)
    w.nodes[0].engine.handle_timeout(t2);
    w.pass(0, t2);
    w.post(0, t2, WrOpcode::Send, 8);
    w.pass(0, t2);
    assert!(w.pass(1, t2).is_empty(), "held again");
    assert_eq!(w.nodes[0].engine.stats().retransmits + w.nodes[1].engine.stats().retransmits, 0);
}

#[test]
fn destroying_resetting_or_failing_the_qp_sends_its_held_ack() {
    for to in [None, Some(QpState::Reset), Some(QpState::Err)] {
        let t0 = Instant::now();
        let mut w = two(14);
        w.post(0, t0, WrOpcode::Send, 8);
        w.pass(0, t0);
        assert!(w.pass(1, t0).is_empty());
        let qpn = w.conn.resp_qpn;
        match to {
            Some(state) => {
                let a = QpAttr { qp_state: state, ..QpAttr::default() };
                w.nodes[1].engine.modify_qp(t0, qpn, &a, QpAttrMask::STATE).unwrap();
            }
            None => w.nodes[1].engine.destroy_qp(qpn).unwrap(),
        }
        let sent = w.pass(1, t0);
        assert!(sent.len() == 1 && is_ack(&sent[0], 100), "{to:?}: {sent:?}");
        assert_eq!(w.nodes[0].cq.poll_one().map(|wc| wc.status), Some(uroce::ib::WcStatus::Success), "{to:?}");
        assert_eq!(w.nodes[1].engine.poll_timeout(), None);
    }
}

#[test]
fn read_responses_and_naks_are_not_held_and_a_held_ack_goes_before_them() {
    let t0 = Instant::now();
    let mut w = two(14);
    w.post(0, t0, WrOpcode::Send, 8);
    w.pass(0, t0);
    assert!(w.pass(1, t0).is_empty());
    w.post(0, t0, WrOpcode::RdmaRead, 16);
    w.pass(0, t0);
    let sent = w.pass(1, t0);
    assert_eq!(sent.len(), 2, "{sent:?}");
    assert!(is_ack(&sent[0], 100), "the held ACK first: {sent:?}");
    assert_eq!((sent[1].0, sent[1].1), (Opcode::RC_READ_RESPONSE_ONLY, 101));
    // A request out of sequence: its NAK goes at once.
    w.post(0, t0, WrOpcode::Send, 8);
    let lost: Vec<Transmit> = std::iter::from_fn(|| w.nodes[0].engine.poll_transmit(t0)).collect();
    assert_eq!(lost.len(), 1, "PSN 102, lost");
    w.post(0, t0, WrOpcode::Send, 8);
    w.pass(0, t0);
    let sent = w.pass(1, t0);
    assert!(sent.len() == 1 && matches!(sent[0].2, Some(AethKind::Nak(_))), "{sent:?}");
}

#[test]
fn nothing_is_held_while_the_runtime_says_no_application_is_there() {
    let t0 = Instant::now();
    let mut w = two(14);
    w.nodes[1].engine.set_app_active(false);
    w.post(0, t0, WrOpcode::Send, 8);
    w.pass(0, t0);
    let sent = w.pass(1, t0);
    assert!(sent.len() == 1 && is_ack(&sent[0], 100), "{sent:?}");
    assert_eq!(w.nodes[1].engine.poll_timeout(), None);
}

/// Messages of several packets: only the last packet's ACK is held (an
/// AckReq in the middle of a long message is answered at once).
#[test]
fn only_the_last_packet_of_a_message_is_held() {
    let t0 = Instant::now();
    let mut w = two(14);
    w.post(0, t0, WrOpcode::RdmaWrite, 3000);
    assert_eq!(w.pass(0, t0).len(), 3);
    assert!(w.pass(1, t0).is_empty(), "held: the ACK of the last packet");
    w.nodes[1].engine.handle_timeout(t0 + ack_hold_limit(14));
    let sent = w.pass(1, t0 + ack_hold_limit(14));
    assert!(sent.len() == 1 && is_ack(&sent[0], 102), "one ACK for the message: {sent:?}");
}

// ---------------------------------------------------------------------------
// Through the device runtime

/// `a` (requester) and `b` connected with `a`'s ACK timeout `timeout`
/// (4.096 µs × 2^timeout) and `retry_cnt`; `b` has one receive posted.
fn setup(timeout: u8, retry_cnt: u8) -> (End, End, MemoryRegion, MemoryRegion) {
    let (a, b) = pair_with(None);
    let (a, b) = (end(a), end(b));
    a.qp.connect_rc_with(&b.ctx.query_gid(0).unwrap(), b.qp.qp_num(), 100, 200, timeout, retry_cnt).unwrap();
    b.qp.connect_rc(&a.ctx.query_gid(0).unwrap(), a.qp.qp_num(), 200, 100).unwrap();
    let a_mr = a.pd.register(vec![7u8; 64], Access::LOCAL_WRITE).unwrap();
    let b_mr = b.pd.register(vec![0u8; 64], Access::LOCAL_WRITE).unwrap();
    b.qp.post_recv(&RecvWr { wr_id: 9, sg_list: uroce::sgl![b_mr.sge(0, 64)] }).unwrap();
    (a, b, a_mr, b_mr)
}

/// `b` busy-polls its CQ (receiving in its own thread) while `a` sends,
/// until the receive completes.
fn send_and_poll_until_received(a: &End, b: &End, a_mr: &MemoryRegion) {
    let started = Instant::now();
    // Poll a while first, so that b's progress thread leaves the socket to
    // this thread.
    while started.elapsed() < Duration::from_millis(2) {
        assert!(b.cq.poll_one().is_none());
    }
    a.qp.post_send(&wr(1, WrOpcode::Send, a_mr.sge(0, 64))).unwrap();
    loop {
        if let Some(wc) = b.cq.poll_one() {
            assert_eq!((wc.wr_id, wc.status), (9, WcStatus::Success));
            return;
        }
        assert!(started.elapsed() < T, "the SEND never arrived");
    }
}

#[test]
fn an_application_that_stops_calling_still_acknowledges() {
    // a retransmits after 4.096 µs × 2^17 ≈ 0.54 s without an ACK.
    let (a, b, a_mr, b_mr) = setup(17, 7);
    send_and_poll_until_received(&a, &b, &a_mr);
    // b makes no call from here on.
    let wc = a.cq.wait(1, T).unwrap()[0];
    assert_eq!((wc.wr_id, wc.status), (1, WcStatus::Success));
    assert_eq!(b_mr.to_vec(), vec![7u8; 64]);
    assert_eq!(a.ctx.stats().retransmits, 0, "the ACK waited for a retransmission");
}

#[test]
fn closing_right_after_the_last_receive_still_acknowledges() {
    // Without the ACK, a would give up after 2 retries of ≈ 17 ms each.
    let (a, b, a_mr, b_mr) = setup(12, 2);
    send_and_poll_until_received(&a, &b, &a_mr);
    drop(b_mr);
    drop(b); // the whole device: QP, CQ, PD, context, socket
    let wc = a.cq.wait(1, T).unwrap()[0];
    assert_eq!((wc.wr_id, wc.status), (1, WcStatus::Success));
    assert_eq!(a.ctx.stats().retransmits, 0);
}
