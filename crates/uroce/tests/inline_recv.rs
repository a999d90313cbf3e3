//! Inline receive (scatter-to-CQE): small messages travel in their
//! completions and reach the receive buffers when the application polls.
//! The tests see it by looking at the buffer after the sender's ACK and
//! before the poll.

mod common;

use common::*;
use std::time::Duration;
use uroce::verbs::*;

const T: Duration = Duration::from_secs(5);

/// Sends `len` bytes from a to b's receive buffer of `cap` bytes; returns
/// (buffer before b polls, b's completion, buffer after).
fn exchange(a: &End, b: &End, b_qp: &QueuePair, len: usize, cap: usize) -> (Vec<u8>, Wc, Vec<u8>) {
    let rbuf = b.pd.register(vec![0u8; cap], Access::LOCAL_WRITE).unwrap();
    b_qp.post_recv(&RecvWr { wr_id: 7, sg_list: uroce::sgl![rbuf.sge(0, cap as u32)] }).unwrap();
    let src = a.pd.register((1..=len as u8).collect(), Access::empty()).unwrap();
    a.qp.post_send(&wr(1, WrOpcode::Send, src.sge(0, len as u32))).unwrap();
    // The sender's completion means the responder has taken the message.
    a.cq.wait(1, T).unwrap();
    let before = rbuf.to_vec();
    let wc = b.cq.wait(1, T).unwrap()[0];
    (before, wc, rbuf.to_vec())
}

fn pair_with_qp(scatter: Option<bool>) -> (End, End, QueuePair) {
    let (a, b) = pair_with(None);
    let (a, b) = (end(a), end(b));
    let qp = b.pd.create_qp(&QpInitAttr { scatter_to_cqe: scatter, ..QpInitAttr::rc(&b.cq, &b.cq) }).unwrap();
    a.qp.connect_rc(&b.ctx.query_gid(0).unwrap(), qp.qp_num(), 100, 200).unwrap();
    qp.connect_rc(&a.ctx.query_gid(0).unwrap(), a.qp.qp_num(), 200, 100).unwrap();
    (a, b, qp)
}

#[test]
fn small_messages_reach_the_buffer_at_poll_time() {
    let (a, b, qp) = pair_with_qp(None);
    let (before, wc, after) = exchange(&a, &b, &qp, 32, 64);
    assert_eq!((wc.status, wc.byte_len), (WcStatus::Success, 32));
    assert_eq!(before, vec![0u8; 64], "nothing written before the poll");
    assert_eq!(&after[..32], &(1..=32).collect::<Vec<u8>>()[..]);
    assert_eq!(after[32], 0);
}

#[test]
fn larger_messages_and_disabled_qps_are_written_on_arrival() {
    let (a, b, qp) = pair_with_qp(None);
    let (before, wc, _) = exchange(&a, &b, &qp, 33, 64);
    assert_eq!(wc.status, WcStatus::Success);
    assert_eq!(before[32], 33, "33 bytes exceed a 64-byte CQE: written on arrival");
    let (a, b, qp) = pair_with_qp(Some(false));
    let (before, wc, _) = exchange(&a, &b, &qp, 8, 64);
    assert_eq!(wc.status, WcStatus::Success);
    assert_eq!(&before[..8], &[1, 2, 3, 4, 5, 6, 7, 8], "disabled per QP");
}

#[test]
fn buffers_too_small_or_gone_at_poll_time() {
    let (a, b, qp) = pair_with_qp(Some(true));
    let (_, wc, _) = exchange(&a, &b, &qp, 16, 8);
    assert_eq!(wc.status, WcStatus::LocLenErr);
    // A buffer deregistered between arrival and poll.
    let (a, b, qp) = pair_with_qp(Some(true));
    let rbuf = b.pd.register(vec![0u8; 64], Access::LOCAL_WRITE).unwrap();
    qp.post_recv(&RecvWr { wr_id: 7, sg_list: uroce::sgl![rbuf.sge(0, 64)] }).unwrap();
    let src = a.pd.register(vec![9u8; 16], Access::empty()).unwrap();
    a.qp.post_send(&wr(1, WrOpcode::Send, src.sge(0, 16))).unwrap();
    assert_eq!(a.cq.wait(1, T).unwrap()[0].status, WcStatus::Success);
    drop(rbuf);
    assert_eq!(b.cq.wait(1, T).unwrap()[0].status, WcStatus::LocProtErr);
}

/// Inline receives are counted (device and QP, `uroce stat`): a message
/// that fits the CQE counts once with its bytes, a larger one and one to a
/// QP with inline receive disabled do not.
#[test]
fn inline_receives_are_counted() {
    let (a, b, qp) = pair_with_qp(None);
    let s0 = b.ctx.stats();
    exchange(&a, &b, &qp, 32, 64);
    let s1 = b.ctx.stats();
    assert_eq!((s1.rx_inline_recvs - s0.rx_inline_recvs, s1.rx_inline_bytes - s0.rx_inline_bytes), (1, 32));
    exchange(&a, &b, &qp, 33, 64);
    let s2 = b.ctx.stats();
    assert_eq!(
        (s2.rx_inline_recvs, s2.rx_inline_bytes),
        (s1.rx_inline_recvs, s1.rx_inline_bytes),
        "33 bytes: not inline"
    );
    let (a, b, qp) = pair_with_qp(Some(false));
    exchange(&a, &b, &qp, 8, 64);
    assert_eq!(b.ctx.stats().rx_inline_recvs, 0, "disabled per QP");
}
