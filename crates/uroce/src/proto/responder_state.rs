//! What a QP's responder keeps between packets: its expected PSN and MSN,
//! the SEND or WRITE being received, the READs and atomics it executed
//! (kept for duplicates), the responses it owes in order, and the ACK it
//! holds. The responder's work on them is `proto::responder`'s; the QP
//! (`proto::qp`) holds them.

use super::ack::DelayedAck;
use super::srq::{RecvWqe, SharedRecvQueue};
use crate::ib::AsyncEventType;
use crate::wire::Aeth;
use std::collections::VecDeque;
use std::sync::Arc;

/// Bytes of the GRH area at the start of a UD receive buffer.
pub const GRH_LEN: usize = 40;

/// A READ or atomic the responder executed, kept for duplicates.
#[derive(Debug, Clone, Copy)]
pub(crate) struct RdResource {
    pub(crate) first_psn: u32,
    pub(crate) last_psn: u32,
    pub(crate) kind: RdKind,
}

#[derive(Debug, Clone, Copy)]
pub(crate) enum RdKind {
    Read,
    Atomic { orig: u64 },
    AtomicWrite,
}

/// A READ being answered, one packet per poll.
#[derive(Debug, Clone, Copy)]
pub(crate) struct ReadJob {
    pub(crate) start_psn: u32,
    pub(crate) psn: u32,
    pub(crate) va: u64,
    /// The PD `rkey` is checked against.
    pub(crate) pd: u32,
    pub(crate) rkey: u32,
    pub(crate) len: u64,
    pub(crate) off: u64,
}

#[derive(Debug, Clone, Copy)]
pub(crate) enum Out {
    Ack {
        psn: u32,
        aeth: Aeth,
    },
    AtomicAck {
        psn: u32,
        orig: u64,
    },
    /// A READ RESPONSE ONLY without payload: the acknowledgement of an
    /// ATOMIC WRITE.
    EmptyReadResponse {
        psn: u32,
    },
    Read(ReadJob),
}

/// A SEND being received into a receive WQE.
#[derive(Debug)]
pub(crate) struct RecvProgress {
    pub(crate) wqe: RecvWqe,
    pub(crate) off: u64,
}

/// A WRITE being received.
#[derive(Debug, Clone, Copy)]
pub(crate) struct WriteProgress {
    pub(crate) va: u64,
    pub(crate) rkey: u32,
    pub(crate) total: u64,
    pub(crate) off: u64,
}

#[derive(Debug, Default)]
pub(crate) struct Responder {
    /// Expected PSN.
    pub(crate) epsn: u32,
    pub(crate) msn: u32,
    /// A PSN-sequence NAK was sent for the current gap.
    pub(crate) nak_sent: bool,
    pub(crate) recv: Option<RecvProgress>,
    pub(crate) write: Option<WriteProgress>,
    pub(crate) resources: VecDeque<RdResource>,
    pub(crate) max_resources: usize,
    pub(crate) out: VecDeque<Out>,
    /// UC: the current message was lost; drop until a FIRST/ONLY.
    pub(crate) uc_resync: bool,
    /// A request was refused with a NAK that ends the connection: the QP
    /// goes to ERR (with this event) once the NAK is sent, after the READ
    /// responses owed for earlier requests, as a responder answers in
    /// order. Later requests are dropped meanwhile.
    pub(crate) failing: Option<AsyncEventType>,
    /// A request met an on-demand-paging fault (a copy job faults its pages
    /// in) and was answered with an RNR NAK, as mlx5 answers a responder
    /// page fault: its PSN and the RNR timer sent. Its retransmissions
    /// that arrive while the job runs get RNR NAKs with a longer wait each
    /// (see [`Qp::fault_rnr_again`](super::qp::Qp::fault_rnr_again)).
    pub(crate) fault: Option<(u32, u8)>,
    /// XRC target: the SRQ the request being executed named.
    pub(crate) xrc_srq: Option<Arc<SharedRecvQueue>>,
    /// The ACK held for the application's answer (see `proto::ack`).
    pub(crate) ack: DelayedAck,
}

impl Responder {
    pub fn reset(&mut self, rq_psn: u32, max_dest_rd_atomic: usize) {
        *self = Responder { epsn: rq_psn, max_resources: max_dest_rd_atomic, ..Default::default() };
    }

    /// Queues the held ACK (if any) ahead of everything else queued: it
    /// is older than what follows it.
    pub(crate) fn release_held_ack(&mut self) -> bool {
        let Some((psn, aeth)) = self.ack.take() else { return false };
        self.out.push_front(Out::Ack { psn, aeth });
        true
    }

    /// Whether responses are queued.
    pub(crate) fn has_out(&self) -> bool {
        !self.out.is_empty()
    }

    pub fn debug_state(&self) -> String {
        let res: Vec<String> = self.resources.iter().map(|r| format!("{}..{}", r.first_psn, r.last_psn)).collect();
        format!("epsn {} msn {} resources [{}] out {}", self.epsn, self.msn, res.join(","), self.out.len())
    }

    pub fn take_current_recv(&mut self) -> Option<RecvWqe> {
        self.recv.take().map(|r| r.wqe)
    }

    pub fn drop_reads(&mut self) {
        self.out.retain(|o| !matches!(o, Out::Read(_)));
    }

    pub(crate) fn push_ack(&mut self, psn: u32, aeth: Aeth) {
        // Coalesce: a newer ACK replaces an older one still queued.
        if let (Some(Out::Ack { psn: p, aeth: a }), crate::wire::AethKind::Ack { .. }) =
            (self.out.back_mut(), aeth.kind())
        {
            if matches!(a.kind(), crate::wire::AethKind::Ack { .. }) {
                *p = psn;
                *a = aeth;
                return;
            }
        }
        self.out.push_back(Out::Ack { psn, aeth });
    }
}
