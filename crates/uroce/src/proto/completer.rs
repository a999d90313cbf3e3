//! The completer: consumes ACKs, NAKs, READ responses and atomic ACKs for
//! an RC or XRC_SEND requester, completes send WQEs in order, and decides
//! retries (go-back-N on PSN-sequence NAKs, missing responses and timeouts;
//! RNR waits) and fatal errors (remote NAKs, exhausted retry counters).

use super::copy::{CopyError, Fingerprint, Site};
use super::memory::{sge_spans, Want};
use super::qp::Qp;
use super::requester_state::ack_timeout;
use super::wr::WrOpcode;
use super::{psn, Ctx};
use crate::ib::{QpState, Wc, WcStatus};
use crate::wire::{rnr_timer_usec, AethKind, NakCode, OpFlags, Packet};
use std::time::Duration;

/// What acknowledging up to a PSN found.
enum Acked {
    Fine,
    /// A READ or atomic WQE was passed over without its response.
    MissingResponse,
}

impl Qp {
    /// Handles a response packet (RC only; checked by the engine).
    pub(crate) fn on_response(&mut self, ctx: &mut Ctx, pkt: &Packet) {
        if !matches!(self.attr.qp_state, QpState::Rts | QpState::Sqd) {
            return;
        }
        let p = pkt.headers.bth.psn;
        // Ignore answers to PSNs never sent.
        if psn::diff(p, self.req.psn_max) >= 0 {
            ctx.stats.rx_out_of_sequence += 1;
            return;
        }
        let flags = pkt.headers.bth.opcode.info().map(|i| i.flags).unwrap_or(OpFlags::empty());
        let aeth = pkt.headers.aeth;

        if flags.contains(OpFlags::READ) && !self.answers_atomic_write(p) {
            if aeth.is_some_and(|a| !matches!(a.kind(), AethKind::Ack { .. })) {
                self.complete_head_error(ctx, WcStatus::BadRespErr);
                return;
            }
            self.on_read_response(ctx, pkt);
        } else if flags.contains(OpFlags::ATOMIC_ACK_ETH) {
            self.on_atomic_ack(ctx, p, pkt.headers.atomic_ack.unwrap_or(0));
        } else if let Some(aeth) = aeth {
            match aeth.kind() {
                AethKind::Ack { .. } => {
                    if let Acked::MissingResponse = self.ack_through(ctx, p) {
                        self.retry(ctx);
                    }
                }
                AethKind::RnrNak { timer } => self.on_rnr_nak(ctx, p, timer),
                AethKind::Nak(code) => self.on_nak(ctx, p, code),
                AethKind::Reserved(_) => ctx.stats.rx_drop_malformed += 1,
            }
        }
        self.check_drained(ctx);
    }

    /// Completes the SEND/WRITE WQEs at the head of the send queue whose
    /// packets are all at or before `p`.
    fn ack_through(&mut self, ctx: &mut Ctx, p: u32) -> Acked {
        let mut progress = false;
        let mut result = Acked::Fine;
        while let Some(w) = self.sq.front() {
            if w.failed.is_some() {
                break; // completed by forward_progress, with its status
            }
            if w.wr.opcode.is_local() {
                if !w.started {
                    break;
                }
                self.complete_local_head(ctx);
                continue;
            }
            if !w.started || psn::lt(p, w.first_psn) {
                break;
            }
            if w.wr.opcode.is_read_or_atomic() {
                result = Acked::MissingResponse;
                break;
            }
            if psn::le(w.last_psn, p) {
                let w = self.pop_head().unwrap();
                self.req.comp_psn = psn::add(w.last_psn, 1);
                progress = true;
                if w.signaled {
                    let mut wc = Wc::new(w.wr.wr_id, WcStatus::Success, w.wc_opcode(), self.qpn);
                    wc.byte_len = w.len as u32;
                    self.deliver_send(ctx, wc);
                }
            } else {
                // Partly acknowledged multi-packet message.
                if psn::lt(self.req.comp_psn, psn::add(p, 1)) {
                    self.req.comp_psn = psn::add(p, 1);
                    progress = true;
                }
                break;
            }
        }
        if progress {
            self.forward_progress(ctx);
        }
        result
    }

    fn forward_progress(&mut self, ctx: &mut Ctx) {
        self.complete_local_head(ctx);
        self.req.retry_left = self.attr.retry_cnt;
        self.req.rnr_left = self.attr.rnr_retry;
        self.req.retrying = false;
        let outstanding = self.sq.front().is_some_and(|w| w.started);
        self.req.timer = if outstanding { ack_timeout(self.attr.timeout).map(|d| ctx.now + d) } else { None };
        ctx.mark_ready(self.qpn);
    }

    fn on_read_response(&mut self, ctx: &mut Ctx, pkt: &Packet) {
        let p = pkt.headers.bth.psn;
        if let Acked::MissingResponse = self.ack_through(ctx, psn::add(p, super::psn::PSN_MASK)) {
            // An earlier READ/atomic than this one is unanswered.
            let head_first = self.sq.front().map(|w| w.first_psn);
            if head_first.is_some_and(|f| psn::lt(p, f) || !self.head_contains(p)) {
                self.retry(ctx);
                return;
            }
        }
        let mtu = self.mtu() as u64;
        let Some(head) = self.sq.front() else { return };
        if !head.started
            || head.wr.opcode != WrOpcode::RdmaRead
            || psn::lt(p, head.first_psn)
            || psn::lt(head.last_psn, p)
        {
            ctx.stats.rx_duplicates += 1;
            return;
        }
        if p != self.req.comp_psn {
            if psn::lt(p, self.req.comp_psn) {
                ctx.stats.rx_duplicates += 1;
            } else {
                ctx.stats.rx_out_of_sequence += 1;
                self.retry(ctx);
            }
            return;
        }
        let off = psn::diff(p, head.first_psn) as u64 * mtu;
        let expect = (head.len - off.min(head.len)).min(mtu);
        if pkt.payload.len() as u64 != expect {
            self.complete_head_error(ctx, WcStatus::BadRespErr);
            return;
        }
        let fp = Fingerprint { site: Site::ReadScatter, psn: p, len: expect, addr: off };
        let last = p == head.last_psn;
        if !self.scatter_to_head(ctx, fp, off, pkt.payload) {
            return;
        }
        self.req.comp_psn = psn::add(p, 1);
        if last {
            let w = self.pop_head().unwrap();
            if w.signaled {
                let mut wc = Wc::new(w.wr.wr_id, WcStatus::Success, w.wc_opcode(), self.qpn);
                wc.byte_len = w.len as u32;
                self.deliver_send(ctx, wc);
            }
        }
        self.forward_progress(ctx);
    }

    /// Whether `p` is the PSN of a transmitted ATOMIC WRITE. Its answer is a
    /// zero-length READ RESPONSE ONLY, which acknowledges it and every
    /// request before it like an ACK (rxe's completer does the same).
    fn answers_atomic_write(&self, p: u32) -> bool {
        self.sq.iter().take_while(|w| w.started).any(|w| w.first_psn == p && w.wr.opcode == WrOpcode::AtomicWrite)
    }

    fn head_contains(&self, p: u32) -> bool {
        self.sq.front().is_some_and(|w| w.started && psn::le(w.first_psn, p) && psn::le(p, w.last_psn))
    }

    fn on_atomic_ack(&mut self, ctx: &mut Ctx, p: u32, orig: u64) {
        if let Acked::MissingResponse = self.ack_through(ctx, psn::add(p, super::psn::PSN_MASK)) {
            if !self.head_contains(p) {
                self.retry(ctx);
                return;
            }
        }
        let Some(head) = self.sq.front() else { return };
        if !head.started || !head.wr.opcode.is_atomic() || head.first_psn != p {
            ctx.stats.rx_duplicates += 1;
            return;
        }
        let fp = Fingerprint { site: Site::AtomicResult, psn: p, len: 8, addr: 0 };
        if !self.scatter_to_head(ctx, fp, 0, &orig.to_ne_bytes()) {
            return;
        }
        let w = self.pop_head().unwrap();
        self.req.comp_psn = psn::add(p, 1);
        if w.signaled {
            let mut wc = Wc::new(w.wr.wr_id, WcStatus::Success, w.wc_opcode(), self.qpn);
            wc.byte_len = 8;
            self.deliver_send(ctx, wc);
        }
        self.forward_progress(ctx);
    }

    fn on_rnr_nak(&mut self, ctx: &mut Ctx, p: u32, timer: u8) {
        ctx.stats.rnr_naks_received += 1;
        if let Acked::MissingResponse = self.ack_through(ctx, psn::add(p, super::psn::PSN_MASK)) {
            self.retry(ctx);
            return;
        }
        if !self.head_contains(p) {
            return; // stale
        }
        if self.req.rnr_left == 0 {
            tracing::warn!(qpn = self.qpn, "RNR retry counter exceeded");
            self.complete_head_error(ctx, WcStatus::RnrRetryExcErr);
            return;
        }
        if self.attr.rnr_retry != 7 {
            self.req.rnr_left -= 1;
        }
        self.req.comp_psn = p;
        self.rewind(ctx);
        self.req.retrying = false;
        self.req.timer = None;
        self.req.rnr_timer = Some(ctx.now + Duration::from_micros(rnr_timer_usec(timer) as u64));
    }

    fn on_nak(&mut self, ctx: &mut Ctx, p: u32, code: NakCode) {
        ctx.stats.naks_received += 1;
        let missing = matches!(self.ack_through(ctx, psn::add(p, super::psn::PSN_MASK)), Acked::MissingResponse);
        match code {
            NakCode::PsnSequence => {
                ctx.stats.seq_naks_received += 1;
                if !missing && psn::lt(self.req.comp_psn, p) {
                    self.req.comp_psn = p;
                }
                if !self.req.retrying {
                    if self.req.retry_left == 0 {
                        self.complete_head_error(ctx, WcStatus::RetryExcErr);
                        return;
                    }
                    self.req.retry_left -= 1;
                    self.rewind(ctx);
                }
            }
            _ if missing => {
                // A READ or atomic before the NAKed request still lacks its
                // response: it was lost, since a responder answers in order.
                // As rxe, re-send from it instead of blaming it for the NAK
                // (a responder that went to ERR then lets it time out).
                self.retry(ctx);
            }
            _ if psn::lt(p, self.req.comp_psn) => {
                // Older than every outstanding request: the answer to a
                // duplicate (a replayed READ that failed, say) of a request
                // that completed long ago. It says nothing about the head;
                // ignore it, as rxe's check_psn does.
                ctx.stats.rx_duplicates += 1;
            }
            _ => {
                let status = match code {
                    NakCode::InvalidRequest => WcStatus::RemInvReqErr,
                    NakCode::RemoteAccess => WcStatus::RemAccessErr,
                    NakCode::RemoteOperational => WcStatus::RemOpErr,
                    _ => WcStatus::RemInvRdReqErr,
                };
                tracing::warn!(qpn = self.qpn, ?code, "NAK received");
                self.complete_head_error(ctx, status);
            }
        }
    }

    /// Go-back-N after a detected loss, unless a retry is already running.
    fn retry(&mut self, ctx: &mut Ctx) {
        if !self.req.retrying {
            self.rewind(ctx);
        }
    }

    /// Writes `data` (a READ response's payload, an atomic's original
    /// value) into the oldest WQE's buffers from message byte `off`, now or
    /// by a copy job (`proto::copy`). False when the response must not go
    /// on: a job writes it (the response is handled again then), or the
    /// buffers failed and so did the WQE (LOC_PROT_ERR).
    fn scatter_to_head(&mut self, ctx: &mut Ctx, fp: Fingerprint, off: u64, data: &[u8]) -> bool {
        let Some(head) = self.sq.front() else { return false };
        let mem = ctx.mem;
        let r = sge_spans(mem, self.pd, &head.wr.sg_list, off, data.len() as u64, Want::LocalWrite)
            .map_err(CopyError::from)
            .and_then(|spans| ctx.copy.write(mem, fp, spans, data));
        match r {
            Ok(()) => true,
            Err(CopyError::Deferred) => false,
            Err(CopyError::Access(_)) => {
                self.complete_head_error(ctx, WcStatus::LocProtErr);
                false
            }
        }
    }

    /// Completes the oldest WQE with an error and moves the QP to ERR
    /// (flushing the rest).
    pub(crate) fn complete_head_error(&mut self, ctx: &mut Ctx, status: WcStatus) {
        if let Some(w) = self.sq.pop_front() {
            let wc = Wc::new(w.wr.wr_id, status, w.wc_opcode(), self.qpn);
            self.deliver_send(ctx, wc);
        }
        self.fail(ctx, None);
    }
}
