//! What a QP's requester keeps between packets (its PSNs, cursor into the
//! send queue, timers and retry counts), the completions an unreliable QP
//! holds for packets sent in place, and the requester's constants and
//! arithmetic. The requester's work on them is `proto::requester`'s; the
//! QP (`proto::qp`) holds them.

use super::wr::QpAttr;
use crate::ib::Wc;
use std::collections::VecDeque;
use std::time::{Duration, Instant};

/// Unacknowledged PSNs allowed in flight (rxe: RXE_MAX_UNACKED_PSNS).
pub const MAX_UNACKED_PSNS: i32 = 128;
/// Packets of one message between AckReqs (rxe: RXE_MAX_PKT_PER_ACK).
pub const MAX_PKT_PER_ACK: u32 = 64;
/// The P_Key uroce sends: the default full-member key.
pub const DEFAULT_PKEY: u16 = 0xFFFF;

#[derive(Debug, Default)]
pub(crate) struct Requester {
    /// Next PSN to transmit.
    pub psn: u32,
    /// One past the highest PSN ever transmitted (survives rewinds).
    pub psn_max: u32,
    /// Oldest PSN not yet acknowledged or answered.
    pub comp_psn: u32,
    /// Index in the send queue of the WQE being transmitted.
    pub cursor: usize,
    /// Bytes of that WQE already transmitted.
    pub cursor_off: u64,
    pub noack: u32,
    pub retry_left: u8,
    pub rnr_left: u8,
    pub timer: Option<Instant>,
    pub rnr_timer: Option<Instant>,
    /// READ and atomic WQEs started and not completed.
    pub rd_atomic: u32,
    /// A retry is in progress (a NAK does not start another one).
    pub retrying: bool,
}

impl Requester {
    pub fn reset(&mut self, sq_psn: u32, attr: &QpAttr) {
        *self = Requester {
            psn: sq_psn,
            psn_max: sq_psn,
            comp_psn: sq_psn,
            retry_left: attr.retry_cnt,
            rnr_left: attr.rnr_retry,
            ..Default::default()
        };
    }
}

/// An unreliable QP's packets sent in place and the completions waiting
/// for them: a UD or UC send completes once each of its packets is in the
/// kernel (a payload sent in place is read by the send call, after the
/// engine's pass), so that an application that reuses the buffer on seeing
/// the completion never changes bytes the kernel has yet to copy.
#[derive(Debug, Default)]
pub(crate) struct AfterSendState {
    /// The number of the last packet sent in place ([`super::AfterSend`]:
    /// wrapping, never 0 once one was).
    pub seq: u32,
    /// The last one reported sent ([`Qp::on_sent`](super::qp::Qp::on_sent)).
    pub sent: u32,
    /// Completions in order, each with the packet it waits for.
    pub held: VecDeque<(u32, Wc)>,
}

/// Number of PSNs a message of `len` bytes takes at path MTU `mtu`.
pub fn num_packets(len: u64, mtu: u32) -> u32 {
    len.div_ceil(mtu as u64).max(1) as u32
}

/// The local ACK timeout: 4.096 µs × 2^timeout; 0 disables it.
pub fn ack_timeout(timeout: u8) -> Option<Duration> {
    (timeout != 0).then(|| Duration::from_nanos(4096u64 << timeout.min(31)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timeouts_and_packet_counts() {
        assert_eq!(ack_timeout(0), None);
        assert_eq!(ack_timeout(14), Some(Duration::from_nanos(4096 << 14)));
        assert_eq!(num_packets(0, 1024), 1);
        assert_eq!(num_packets(1024, 1024), 1);
        assert_eq!(num_packets(1025, 1024), 2);
    }
}
