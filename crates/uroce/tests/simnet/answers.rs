//! Applications that answer what they receive, late, never, or not at
//! all because they exit: a seeded ping-pong over the fabric that checks
//! the responder's delayed-ACK policy (`proto::ack`) from the wire.
//!
//! Per pair, a requester application sends `n` SENDs one at a time; the
//! responder application answers each (a SEND back on the same QP) after a
//! delay its [`Answer`] draws, or never, or destroys its QP right after the
//! last receive. The requester sends its next message once its previous
//! send completed and the answer it waits for (if any) arrived. Every
//! packet is watched: each request with AckReq that a node executed (or
//! took as a duplicate) is owed an acknowledgement, and the owing is
//! settled by the first packet with an AETH of that QP whose PSN covers it.

use super::buf::Buf;
use super::conn::{Conn, ConnParams};
use super::node::{Node, PORT};
use super::{Fabric, Faults, Rng};
use std::collections::HashMap;
use std::net::SocketAddr;
use std::time::{Duration, Instant};
use uroce::ib::{Access, Mtu, Sge, WcOpcode, WcStatus};
use uroce::proto::wr::{SendWr, WrOpcode};
use uroce::proto::{ack_hold_limit, psn, Stats};
use uroce::wire::{AethKind, OpFlags, Opcode, Packet};

/// How a responder application answers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Answer {
    /// Within half the hold limit.
    Prompt,
    /// After the hold limit (up to 20 times it).
    Late,
    Never,
    /// Prompt for `k` messages, then never (it stopped polling).
    Stops(u32),
    /// Prompt, but destroys its QP right after the last receive.
    Exits,
}

#[derive(Debug)]
pub struct PairPlan {
    pub answer: Answer,
    /// Which node the requester is on.
    pub req: usize,
    pub messages: u32,
    /// Largest message (bytes); each draws 1..=this.
    pub max_len: u32,
}

#[derive(Debug)]
pub struct Plan {
    pub seed: u64,
    pub clean: bool,
    pub faults: Faults,
    /// The ACK timeout exponent of every QP.
    pub timeout: u8,
    pub pairs: Vec<PairPlan>,
}

impl Plan {
    pub fn draw(seed: u64) -> Plan {
        let mut r = Rng::new(seed ^ 0xACC0_57A7);
        let clean = r.chance(0.5);
        // A clean fabric keeps the order (one delay for every packet), a
        // lossy one varies it.
        let mut faults = Faults::none();
        faults.min_delay = Duration::from_micros(1 + r.below(5));
        faults.max_delay = faults.min_delay;
        if !clean {
            faults.min_delay = Duration::from_micros(1);
            faults.max_delay = Duration::from_micros(5);
            faults.loss = 0.03;
            faults.duplicate = 0.02;
            faults.reorder = 0.05;
            faults.corrupt = 0.01;
        }
        // 16 µs (hold 2 µs: twice the longest round trip fits) to 4 ms
        // (hold 20 µs).
        let timeout = 2 + r.below(9) as u8;
        let pairs = (0..1 + r.below(4))
            .map(|_| {
                let answer = match r.below(6) {
                    0 | 1 => Answer::Prompt,
                    2 => Answer::Late,
                    3 => Answer::Never,
                    4 => Answer::Stops(1 + r.below(5) as u32),
                    _ => Answer::Exits,
                };
                PairPlan {
                    answer,
                    req: r.below(2) as usize,
                    messages: 2 + r.below(20) as u32,
                    max_len: [8, 64, 1024, 3000][r.below(4) as usize],
                }
            })
            .collect();
        Plan { seed, clean, faults, timeout, pairs }
    }
}

/// What a pair's acknowledgements did, seen from the wire.
#[derive(Debug, Default, Clone, Copy)]
pub struct AckTally {
    /// ACKs of the responder's QP that left right after a request of it,
    /// in the same engine pass (with the answer).
    pub with_answer: u64,
    /// ACKs that left on their own, later than the request they settled.
    pub held_alone: u64,
    /// ACKs that left on their own in the pass that executed it.
    pub at_once: u64,
}

const MTU: Mtu = Mtu::Mtu1024;
/// Bytes of each pair's buffers per direction.
const SLOT: usize = 4096;
const MAX_STEPS: u64 = 2_000_000;

struct Pair {
    plan: PairPlan,
    conn: Conn,
    lens: Vec<u32>,
    /// Messages posted by the requester, its completed sends, receives at
    /// the responder; answers posted, completed, received.
    sent: u32,
    send_done: u32,
    received: u32,
    answered: u32,
    answer_done: u32,
    answers_received: u32,
    exited: bool,
    /// Exited on a lossy fabric that then lost its last ACK.
    lost_last_ack: bool,
    /// Answers due: (when, message).
    due: Vec<(Instant, u32)>,
    ack: AckTally,
}

impl Pair {
    /// Whether the requester application sends its next message now.
    fn may_send(&self) -> bool {
        let waits_answer = self.sent > 0 && self.answers(self.sent - 1) && self.answers_received < self.sent;
        self.sent < self.plan.messages && self.send_done == self.sent && !waits_answer
    }

    fn answers(&self, msg: u32) -> bool {
        match self.plan.answer {
            Answer::Prompt | Answer::Late => true,
            Answer::Never => false,
            Answer::Stops(k) => msg < k,
            Answer::Exits => msg + 1 < self.plan.messages,
        }
    }
}

/// An owed acknowledgement: a node executed `psn` (AckReq) on its QP.
struct Owed {
    node: usize,
    qpn: u32,
    psn: u32,
    since: Instant,
}

pub struct Outcome {
    pub stats: [Stats; 2],
    pub tallies: Vec<(Answer, AckTally)>,
}

/// Runs one seed; Err says which invariant broke.
pub fn run(plan: &Plan) -> Result<Outcome, String> {
    let t0 = Instant::now();
    let mut now = t0;
    let mut rng = Rng::new(plan.seed ^ 0x5EED);
    let hold = ack_hold_limit(plan.timeout);
    let mut nodes = [Node::new([10, 0, 0, 1].into(), MTU), Node::new([10, 0, 0, 2].into(), MTU)];
    let mut fabric = Fabric::new(plan.faults, plan.seed ^ 0xFAB);
    let n = plan.pairs.len();
    // Per node: pair k's send source at 2k·SLOT, its receive area at (2k+1)·SLOT.
    let bufs = [Buf::new(2 * n * SLOT, |i| i as u8), Buf::new(2 * n * SLOT, |i| (i as u8) ^ 0x5A)];
    // SAFETY: `bufs` outlive the keys' use: the nodes go before them.
    let keys: Vec<u32> = (0..2).map(|k| unsafe { bufs[k].register(&nodes[k].mem, Access::LOCAL_WRITE) }).collect();
    let sge = |node: usize, pair: usize, recv: bool, len: u32| Sge {
        addr: bufs[node].addr() + ((2 * pair + recv as usize) * SLOT) as u64,
        length: len,
        lkey: keys[node],
    };
    let mut pairs: Vec<Pair> = Vec::new();
    for (k, pp) in plan.pairs.iter().enumerate() {
        let p = ConnParams {
            xrc: false,
            psns: (rng.below(1 << 24) as u32, rng.below(1 << 24) as u32),
            mtu: MTU,
            retry: (plan.timeout, 7),
        };
        let conn = Conn::new(&mut nodes, pp.req, now, p);
        let lens: Vec<u32> = (0..pp.messages).map(|_| 1 + rng.below(pp.max_len as u64) as u32).collect();
        for m in 0..pp.messages {
            // The responder's receives for the messages, the requester's
            // for the answers.
            conn.post_recv(&mut nodes, now, m as u64, sge(conn.resp, k, true, SLOT as u32));
            let wr =
                uroce::proto::wr::RecvWr { wr_id: m as u64, sg_list: uroce::sgl![sge(conn.req, k, true, SLOT as u32)] };
            nodes[conn.req].engine.post_recv(now, conn.req_qpn, wr).unwrap();
        }
        let plan = PairPlan { ..*pp };
        pairs.push(Pair {
            plan,
            conn,
            lens,
            sent: 0,
            send_done: 0,
            received: 0,
            answered: 0,
            answer_done: 0,
            answers_received: 0,
            exited: false,
            lost_last_ack: false,
            due: Vec::new(),
            ack: AckTally::default(),
        });
    }
    // (node, peer QPN) → (local QPN, pair).
    let mut local: HashMap<(usize, u32), (u32, usize)> = HashMap::new();
    for (k, p) in pairs.iter().enumerate() {
        let c = &p.conn;
        local.insert((c.req, c.resp_qpn), (c.req_qpn, k));
        local.insert((c.resp, c.req_qpn), (c.resp_qpn, k));
    }
    let mut owed: Vec<Owed> = Vec::new();
    let post = |nodes: &mut [Node; 2], now: Instant, node: usize, qpn: u32, id: u64, s: Sge| {
        let mut wr = SendWr::new(id, WrOpcode::Send);
        wr.sg_list = uroce::sgl![s];
        wr.flags = uroce::ib::SendFlags::SIGNALED;
        nodes[node].engine.post_send(now, qpn, wr).map_err(|e| format!("post_send: {e}"))
    };
    let mut steps = 0;
    loop {
        steps += 1;
        if steps > MAX_STEPS || now > t0 + Duration::from_secs(60) {
            return Err(format!("no progress after {steps} steps, {:?}", now - t0));
        }
        // The applications.
        for (k, p) in pairs.iter_mut().enumerate() {
            let (req, resp) = (p.conn.req, p.conn.resp);
            if p.may_send() {
                let len = p.lens[p.sent as usize];
                post(&mut nodes, now, req, p.conn.req_qpn, p.sent as u64, sge(req, k, false, len))?;
                p.sent += 1;
            }
            while let Some(i) = p.due.iter().position(|&(t, _)| t <= now) {
                let (_, m) = p.due.remove(i);
                if !p.exited {
                    post(&mut nodes, now, resp, p.conn.resp_qpn, m as u64, sge(resp, k, false, 16))?;
                    p.answered += 1;
                }
            }
        }
        for (i, node) in nodes.iter_mut().enumerate() {
            node.engine.handle_timeout(now);
            transmit(node, i, now, &mut fabric, &local, &mut owed, &mut pairs)?;
            if node.run_copies(now) {
                transmit(node, i, now, &mut fabric, &local, &mut owed, &mut pairs)?;
            }
        }
        if let Some(o) = owed.iter().find(|o| now - o.since > hold) {
            return Err(format!(
                "node {} QP {:#x}: PSN {} unacknowledged for {:?} (the hold limit is {hold:?})",
                o.node,
                o.qpn,
                o.psn,
                now - o.since
            ));
        }
        // Completions.
        for (node, at) in nodes.iter().enumerate() {
            while let Some(wc) = at.cq.poll_one() {
                let &(_, k) = local
                    .iter()
                    .find(|(&(n, _), &(q, _))| n == node && q == wc.qp_num)
                    .map(|(_, v)| v)
                    .ok_or_else(|| format!("a completion of no QP: {wc:?}"))?;
                let p = &mut pairs[k];
                let is_req = node == p.conn.req;
                let last_send = is_req && wc.opcode == WcOpcode::Send && wc.wr_id + 1 == p.plan.messages as u64;
                if p.exited && !plan.clean && last_send && wc.status == WcStatus::RetryExcErr {
                    // The fabric lost the last ACK of a QP that is gone:
                    // nothing can resend it (as with any device).
                    p.send_done += 1;
                    p.lost_last_ack = true;
                    continue;
                }
                if p.lost_last_ack && wc.status == WcStatus::WrFlushErr && wc.opcode == WcOpcode::Recv {
                    continue; // the answer receives nobody will fill
                }
                if wc.status != WcStatus::Success {
                    return Err(format!("pair {k} ({:?}): {wc:?}", p.plan.answer));
                }
                match (is_req, wc.opcode) {
                    (true, WcOpcode::Send) => {
                        expect(k, "send", wc.wr_id, p.send_done)?;
                        p.send_done += 1;
                    }
                    (true, WcOpcode::Recv) => {
                        expect(k, "answer", wc.wr_id, p.answers_received)?;
                        if wc.byte_len != 16 {
                            return Err(format!("pair {k}: answer of {} bytes", wc.byte_len));
                        }
                        p.answers_received += 1;
                    }
                    (false, WcOpcode::Recv) => {
                        expect(k, "receive", wc.wr_id, p.received)?;
                        let want = p.lens[p.received as usize];
                        if wc.byte_len != want {
                            return Err(format!(
                                "pair {k}: message {} of {} bytes, sent {want}",
                                p.received, wc.byte_len
                            ));
                        }
                        let m = p.received;
                        p.received += 1;
                        let last = p.received == p.plan.messages;
                        if p.answers(m) {
                            let wait = match p.plan.answer {
                                Answer::Late => hold + Duration::from_nanos(1 + rng.below(19 * hold.as_nanos() as u64)),
                                _ => Duration::from_nanos(rng.below(hold.as_nanos() as u64 / 2)),
                            };
                            p.due.push((now + wait, m));
                        }
                        if last && p.plan.answer == Answer::Exits {
                            // Right after its last receive, once its own
                            // answers are through.
                            p.exited = true;
                        }
                    }
                    (false, WcOpcode::Send) => {
                        expect(k, "answer send", wc.wr_id, p.answer_done)?;
                        p.answer_done += 1;
                    }
                    _ => return Err(format!("pair {k}: unexpected {wc:?}")),
                }
            }
        }
        let mut destroyed = false;
        for p in pairs.iter_mut() {
            if p.exited && p.conn.resp_qpn != 0 && p.answer_done == p.answered {
                nodes[p.conn.resp].engine.destroy_qp(p.conn.resp_qpn).map_err(|e| e.to_string())?;
                p.conn.resp_qpn = 0;
                destroyed = true;
            }
        }
        if destroyed {
            // What the destroyed QP acknowledged leaves now.
            for (i, node) in nodes.iter_mut().enumerate() {
                transmit(node, i, now, &mut fabric, &local, &mut owed, &mut pairs)?;
            }
        }
        let done = pairs.iter().all(|p| {
            p.send_done == p.plan.messages
                && p.received == p.plan.messages
                && p.due.is_empty()
                && p.answer_done == p.answered
                && p.answers_received == p.answered
        });
        let timers: Vec<Instant> = nodes.iter().filter_map(|n| n.engine.poll_timeout()).collect();
        if done && fabric.is_empty() && timers.is_empty() {
            break;
        }
        if pairs.iter().any(Pair::may_send) {
            continue;
        }
        let dues = pairs.iter().flat_map(|p| p.due.iter().map(|d| d.0));
        now = match fabric.next_time().into_iter().chain(timers).chain(dues).min() {
            Some(t) if t > now => t,
            Some(_) => now,
            None => return Err("nothing left to happen, and not done".into()),
        };
        for (dst, src, data) in fabric.deliver(now) {
            let i = nodes.iter().position(|n| n.ip == dst).expect("a node at every address");
            receive(&mut nodes[i], i, now, src, &data, &local, &mut owed);
        }
    }
    if let Some(o) = owed.first() {
        return Err(format!("node {} QP {:#x}: PSN {} never acknowledged", o.node, o.qpn, o.psn));
    }
    Ok(Outcome {
        stats: [nodes[0].engine.stats(), nodes[1].engine.stats()],
        tallies: pairs.iter().map(|p| (p.plan.answer, p.ack)).collect(),
    })
}

fn expect(k: usize, what: &str, got: u64, want: u32) -> Result<(), String> {
    if got != want as u64 {
        return Err(format!("pair {k}: {what} {got} completed, expected {want}"));
    }
    Ok(())
}

/// Delivers a datagram; a request with AckReq that the node executed, or
/// took as a duplicate, is owed an acknowledgement.
fn receive(
    node: &mut Node,
    i: usize,
    now: Instant,
    src: std::net::IpAddr,
    data: &[u8],
    local: &HashMap<(usize, u32), (u32, usize)>,
    owed: &mut Vec<Owed>,
) {
    let before = node.engine.stats();
    let ip = node.ip;
    node.engine.handle_datagram(now, SocketAddr::new(src, PORT), ip, data);
    let after = node.engine.stats();
    if after.rx_drop_icrc != before.rx_drop_icrc || after.rx_drop_malformed != before.rx_drop_malformed {
        return;
    }
    let Ok(pkt) = Packet::parse(data) else { return };
    let bth = pkt.headers.bth;
    let flags = bth.opcode.info().map_or(OpFlags::empty(), |f| f.flags);
    if flags.contains(OpFlags::RESPONSE) || !bth.ack_req {
        return;
    }
    let Some(qp) = node.engine.qp(bth.dest_qp) else { return };
    if !local.values().any(|&(q, _)| q == bth.dest_qp) {
        return;
    }
    if psn::diff(bth.psn, qp.expected_psn()) < 0 {
        owed.push(Owed { node: i, qpn: bth.dest_qp, psn: bth.psn, since: now });
    }
}

/// Hands the node's packets to the fabric, settling what their AETHs
/// acknowledge and counting how each ACK left.
fn transmit(
    node: &mut Node,
    i: usize,
    now: Instant,
    fabric: &mut Fabric,
    local: &HashMap<(usize, u32), (u32, usize)>,
    owed: &mut Vec<Owed>,
    pairs: &mut [Pair],
) -> Result<(), String> {
    // The previous packet of this pass: (its QP's peer, a request).
    let mut prev: Option<(u32, bool)> = None;
    while let Some(t) = node.engine.poll_transmit(now) {
        if let Ok(pkt) = Packet::parse(&t.data) {
            let bth = pkt.headers.bth;
            let flags = bth.opcode.info().map_or(OpFlags::empty(), |f| f.flags);
            let request = !flags.contains(OpFlags::RESPONSE);
            if let (Some(aeth), Some(&(qpn, k))) = (pkt.headers.aeth, local.get(&(i, bth.dest_qp))) {
                // An ACK of PSN p settles up to p; a NAK of p up to p − 1.
                let upto = match aeth.kind() {
                    AethKind::Ack { .. } => bth.psn,
                    _ => psn::add(bth.psn, psn::PSN_MASK),
                };
                let mut oldest = None;
                owed.retain(|o| {
                    let settled = o.node == i && o.qpn == qpn && psn::diff(o.psn, upto) <= 0;
                    if settled {
                        oldest = Some(oldest.map_or(o.since, |s: Instant| s.min(o.since)));
                    }
                    !settled
                });
                let plain_ack = matches!(aeth.kind(), AethKind::Ack { .. }) && bth.opcode == Opcode::RC_ACK;
                if let (true, Some(p)) = (plain_ack, pairs.get_mut(k)) {
                    if node_is_resp(p, i) {
                        if prev == Some((bth.dest_qp, true)) {
                            p.ack.with_answer += 1;
                        } else if oldest.is_some_and(|s| s < now) {
                            p.ack.held_alone += 1;
                        } else {
                            p.ack.at_once += 1;
                        }
                    }
                }
            }
            prev = Some((bth.dest_qp, request));
        }
        fabric.send(now, node.ip, t.dst.ip(), t.data);
    }
    Ok(())
}

fn node_is_resp(p: &Pair, node: usize) -> bool {
    p.conn.resp == node
}
