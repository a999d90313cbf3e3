//! Send completions in posting order when a request fails locally (a bad
//! lkey: LOC_PROT_ERR when its packet is built) while older requests are
//! still unacknowledged. At the engine level, two simulated nodes: the
//! older requests complete first, successfully once acknowledged (or with
//! their own error, their retries exhausted); then the failed one with its
//! status, once it is the oldest; then every later one is flushed. Until
//! then nothing from the failed request on is sent, and a retransmission
//! re-sends only the older ones.

#[path = "simnet/mod.rs"]
#[allow(dead_code)]
mod simnet;

use simnet::buf::Buf;
use simnet::conn::{Conn, ConnParams};
use simnet::node::{exchange, Node};
use std::time::{Duration, Instant};
use uroce::ib::{Access, Mtu, QpState, Sge, WcStatus};
use uroce::proto::ack_hold_limit;
use uroce::proto::wr::{SendWr, WrOpcode};
use uroce::wire::{Opcode, Packet};

/// A key no region has.
const BAD_LKEY: u32 = 0x00de_ad00;
/// ACK timeout exponent of both QPs: 67 ms (simulated time).
const TIMEOUT: u8 = 14;

/// Two nodes, one RC connection from node 0 to node 1, 4 KiB registered
/// on each.
struct Two {
    nodes: [Node; 2],
    conn: Conn,
    keys: [u32; 2],
    // Dropped after `nodes` (declared later), whose keys cover them.
    bufs: [Buf; 2],
}

fn two(now: Instant, retry_cnt: u8) -> Two {
    let mut nodes = [Node::new([10, 0, 0, 1].into(), Mtu::Mtu1024), Node::new([10, 0, 0, 2].into(), Mtu::Mtu1024)];
    let params = ConnParams { xrc: false, psns: (100, 200), mtu: Mtu::Mtu1024, retry: (TIMEOUT, retry_cnt) };
    let conn = Conn::new(&mut nodes, 0, now, params);
    let bufs = [Buf::new(4096, |i| i as u8), Buf::new(4096, |_| 0)];
    let access = Access::LOCAL_WRITE | Access::REMOTE_READ | Access::REMOTE_WRITE;
    // SAFETY: the buffers outlive the nodes' use of the keys (see `Two`).
    let keys = [0, 1].map(|k| unsafe { bufs[k].register(&nodes[k].mem, access) });
    Two { nodes, conn, keys, bufs }
}

impl Two {
    /// Node 0 posts a 64-byte RDMA WRITE `wr_id` from `lkey` to node 1's
    /// buffer at offset `64 * wr_id`.
    fn write(&mut self, now: Instant, wr_id: u64, lkey: u32) {
        let mut wr = SendWr::new(wr_id, WrOpcode::RdmaWrite);
        wr.sg_list = uroce::sgl![Sge { addr: self.bufs[0].addr(), length: 64, lkey }];
        wr.remote_addr = self.bufs[1].addr() + 64 * wr_id;
        wr.rkey = self.keys[1];
        self.nodes[0].engine.post_send(now, self.conn.req_qpn, wr).unwrap();
    }

    /// Everything node `from` sends now: handed to the other node unless
    /// `lose`. Returns the (opcode, PSN) of each packet.
    fn pass(&mut self, from: usize, now: Instant, lose: bool) -> Vec<(Opcode, u32)> {
        exchange(&mut self.nodes, from, now, lose)
            .iter()
            .map(|t| {
                let p = Packet::parse(&t.data).expect("a packet the engine built");
                (p.headers.bth.opcode, p.headers.bth.psn)
            })
            .collect()
    }

    /// Node 1's ACKs, held for an answer, leave at their deadline: the
    /// time then.
    fn acks_at_deadline(&mut self, now: Instant, lose: bool) -> (Instant, Vec<(Opcode, u32)>) {
        let t = now + ack_hold_limit(TIMEOUT);
        self.nodes[1].engine.handle_timeout(t);
        let acks = self.pass(1, t, lose);
        (t, acks)
    }

    /// Node 0's send completions so far: (wr_id, status).
    fn send_wcs(&self) -> Vec<(u64, WcStatus)> {
        std::iter::from_fn(|| self.nodes[0].cq.poll_one()).map(|wc| (wc.wr_id, wc.status)).collect()
    }

    fn requester_state(&self) -> QpState {
        self.nodes[0].qp_state(self.conn.req_qpn)
    }
}

fn writes(psns: std::ops::Range<u32>) -> Vec<(Opcode, u32)> {
    psns.map(|p| (Opcode::RC_WRITE_ONLY, p)).collect()
}

#[test]
fn a_local_error_completes_after_the_older_requests_in_flight_and_before_the_later_ones() {
    let t0 = Instant::now();
    let mut w = two(t0, 7);
    for id in 1..=3 {
        w.write(t0, id, w.keys[0]);
    }
    assert_eq!(w.pass(0, t0, false), writes(100..103));
    // Their ACK is not back yet: WRITE 4 fails to build, WRITE 5 waits.
    w.write(t0, 4, BAD_LKEY);
    w.write(t0, 5, w.keys[0]);
    assert_eq!(w.pass(0, t0, false), vec![], "nothing from the failed request on is sent");
    assert_eq!(w.send_wcs(), vec![], "the failed request waits for the older ones");
    assert_eq!(w.requester_state(), QpState::Rts);
    // The ACK of PSN 102 completes the three, then the failed one, then
    // the QP is in ERR and the later one flushed.
    let (t1, acks) = w.acks_at_deadline(t0, false);
    assert_eq!(acks, vec![(Opcode::RC_ACK, 102)]);
    assert_eq!(
        w.send_wcs(),
        vec![
            (1, WcStatus::Success),
            (2, WcStatus::Success),
            (3, WcStatus::Success),
            (4, WcStatus::LocProtErr),
            (5, WcStatus::WrFlushErr)
        ]
    );
    assert_eq!(w.requester_state(), QpState::Err);
    assert_eq!(w.pass(0, t1, false), vec![]);
    // The three WRITEs reached node 1, the failed one and the flushed one
    // did not.
    let got = w.bufs[1].contents();
    let sent = &w.bufs[0].contents()[..64];
    for id in 1..=3 {
        assert_eq!(&got[64 * id..64 * (id + 1)], sent, "WRITE {id}");
    }
    assert!(got[64 * 4..64 * 6].iter().all(|&b| b == 0), "WRITEs 4 and 5 wrote nothing");
}

#[test]
fn a_retransmission_behind_a_local_error_resends_only_the_older_requests() {
    let t0 = Instant::now();
    let mut w = two(t0, 7);
    w.write(t0, 1, w.keys[0]);
    w.write(t0, 2, w.keys[0]);
    assert_eq!(w.pass(0, t0, false), writes(100..102));
    let (_, lost) = w.acks_at_deadline(t0, true);
    assert_eq!(lost, vec![(Opcode::RC_ACK, 101)], "lost");
    w.write(t0, 3, BAD_LKEY);
    w.write(t0, 4, w.keys[0]);
    assert_eq!(w.pass(0, t0, false), vec![]);
    assert_eq!(w.send_wcs(), vec![]);
    // Node 0's ACK timeout: the two older WRITEs go again, nothing after.
    let t1 = w.nodes[0].engine.poll_timeout().expect("the retransmission timer runs");
    w.nodes[0].engine.handle_timeout(t1);
    assert_eq!(w.pass(0, t1, false), writes(100..102));
    assert_eq!(w.send_wcs(), vec![]);
    // Their duplicates are acknowledged: the completions, in order.
    let acks = w.pass(1, t1, false);
    let acks = if acks.is_empty() { w.acks_at_deadline(t1, false).1 } else { acks };
    assert!(acks.contains(&(Opcode::RC_ACK, 101)), "{acks:?}");
    assert_eq!(
        w.send_wcs(),
        vec![(1, WcStatus::Success), (2, WcStatus::Success), (3, WcStatus::LocProtErr), (4, WcStatus::WrFlushErr)]
    );
    assert_eq!(w.requester_state(), QpState::Err);
}

#[test]
fn an_older_request_that_fails_flushes_the_one_that_failed_locally() {
    // No retries: the unacknowledged WRITE fails at the first timeout.
    let t0 = Instant::now();
    let mut w = two(t0, 0);
    w.write(t0, 1, w.keys[0]);
    assert_eq!(w.pass(0, t0, true), writes(100..101), "lost");
    w.write(t0, 2, BAD_LKEY);
    w.write(t0, 3, w.keys[0]);
    assert_eq!(w.pass(0, t0, false), vec![]);
    assert_eq!(w.send_wcs(), vec![]);
    let t1 = w.nodes[0].engine.poll_timeout().expect("the retransmission timer runs");
    w.nodes[0].engine.handle_timeout(t1);
    // As rxe: the completer reaches the older request first; its error
    // moves the QP to ERR, which flushes the rest, the failed one too.
    assert_eq!(w.send_wcs(), vec![(1, WcStatus::RetryExcErr), (2, WcStatus::WrFlushErr), (3, WcStatus::WrFlushErr)]);
    assert_eq!(w.requester_state(), QpState::Err);
}

#[test]
fn a_local_error_with_nothing_in_flight_completes_at_once() {
    let t0 = Instant::now();
    let mut w = two(t0, 7);
    w.write(t0, 1, w.keys[0]);
    w.pass(0, t0, false);
    w.acks_at_deadline(t0, false);
    assert_eq!(w.send_wcs(), vec![(1, WcStatus::Success)]);
    let t1 = t0 + Duration::from_millis(1);
    w.write(t1, 2, BAD_LKEY);
    w.write(t1, 3, w.keys[0]);
    assert_eq!(w.pass(0, t1, false), vec![]);
    assert_eq!(w.send_wcs(), vec![(2, WcStatus::LocProtErr), (3, WcStatus::WrFlushErr)]);
    assert_eq!(w.requester_state(), QpState::Err);
}
