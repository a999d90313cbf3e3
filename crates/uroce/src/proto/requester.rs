//! The requester: turns send WQEs into request packets (split at the path
//! MTU), assigns PSNs, sets AckReq, keeps the retransmission and RNR timers,
//! and rewinds for go-back-N. UD and UC WQEs complete when sent: when their
//! packets are built, or, if one was sent in place, when the kernel has it
//! ([`AfterSendState`](super::requester_state::AfterSendState)). An XRC_SEND QP is an RC requester whose requests
//! name the target's SRQ (XRCETH).

use super::copy::{CopyError, Fingerprint, Site};
use super::memory::{for_each_sge_piece, sge_spans, Want};
use super::qp::Qp;
use super::requester_state::{ack_timeout, DEFAULT_PKEY, MAX_PKT_PER_ACK, MAX_UNACKED_PSNS};
pub use super::requester_state::num_packets;
use super::wr::WrOpcode;
use super::{psn, Ctx, Transmit};
use crate::ib::{QpState, QpType, SendFlags, Wc, WcStatus};
use crate::wire::{AtomicEth, Bth, Deth, Headers, Opcode, Reth};

impl Qp {
    /// The next request packet of this QP, if any may be sent now.
    pub(crate) fn poll_request(&mut self, ctx: &mut Ctx) -> Option<Transmit> {
        let state = self.attr.qp_state;
        if !matches!(state, QpState::Rts | QpState::Sqd) || self.req.rnr_timer.is_some() {
            return None;
        }
        let mtu = match self.qp_type {
            QpType::Ud => ctx.cfg.mtu.bytes(),
            _ => self.mtu(),
        };
        // Local operations run when the cursor reaches them; ones already
        // executed (seen again after a rewind) are skipped.
        loop {
            let w = self.sq.get(self.req.cursor)?;
            // A request that failed locally waits for the older ones to
            // complete: nothing at or after it is sent (older ones may
            // still be sent again after a rewind).
            if w.failed.is_some() {
                return None;
            }
            if !w.wr.opcode.is_local() {
                break;
            }
            if !w.started {
                if self.attr.qp_state != QpState::Rts {
                    return None;
                }
                self.execute_local(ctx);
            } else {
                self.req.cursor += 1;
            }
        }
        let cursor = self.req.cursor;
        let wqe = self.sq.get(cursor)?;
        if self.qp_type.is_reliable() && psn::diff(self.req.psn, self.req.comp_psn) >= MAX_UNACKED_PSNS {
            return None;
        }
        if !wqe.started {
            if state == QpState::Sqd {
                return None;
            }
            let op = wqe.wr.opcode;
            if self.qp_type.is_reliable() {
                if wqe.wr.flags.contains(SendFlags::FENCE) && self.req.rd_atomic > 0 {
                    return None;
                }
                if op.uses_rd_atomic() && self.req.rd_atomic >= (self.attr.max_rd_atomic as u32).max(1) {
                    return None;
                }
            }
            // Local buffers are checked before the first packet, so that a
            // bad SGE sends nothing. A one-packet SEND or WRITE needs no
            // separate check: building its packet reads every byte through
            // the same checks, and a failure there sends nothing either.
            let one_packet = !op.is_read_or_atomic() && wqe.len <= mtu as u64;
            if wqe.wr.inline.is_none() && !one_packet {
                let want = if op.is_read_or_atomic() { Want::LocalWrite } else { Want::LocalRead };
                let ok = for_each_sge_piece(ctx.mem, self.pd, &wqe.wr.sg_list, 0, wqe.len, want, |_, _, _| Ok(()));
                if ok.is_err() {
                    self.local_error(ctx, WcStatus::LocProtErr);
                    return None;
                }
            }
            let n = if op.is_atomic() { 1 } else { num_packets(wqe.len, mtu) };
            let first = self.req.psn;
            let wqe = &mut self.sq[cursor];
            wqe.started = true;
            wqe.first_psn = first;
            wqe.last_psn = psn::add(first, n - 1);
            if op.uses_rd_atomic() {
                self.req.rd_atomic += 1;
            }
        }
        let t = self.build_request(ctx, cursor, mtu);
        t.as_ref()?;
        if self.qp_type.is_reliable() {
            if psn::diff(self.req.psn, self.req.psn_max) > 0 {
                self.req.psn_max = self.req.psn;
            }
            if self.req.timer.is_none() {
                self.req.timer = ack_timeout(self.attr.timeout).map(|d| ctx.now + d);
            }
        }
        t
    }

    /// Builds the packet at the cursor and advances it.
    fn build_request(&mut self, ctx: &mut Ctx, cursor: usize, mtu: u32) -> Option<Transmit> {
        let wqe = &self.sq[cursor];
        let op = wqe.wr.opcode;
        let off = self.req.cursor_off;
        let len = wqe.len;
        let first = off == 0;
        let (chunk, last) = if op.is_read_or_atomic() {
            (0u64, true)
        } else {
            let c = (len - off).min(mtu as u64);
            (c, off + c == len)
        };
        let ud = self.qp_type == QpType::Ud;
        let opcode = self.wire_opcode(request_opcode(op, first, last, ud));

        // rxe sets AckReq on the last packet of every message, UC and UD
        // included (their receivers ignore it; CM MADs to QP 1 carry it).
        // (The count is kept once the packet is built: a build that waits
        // for a copy job runs again.)
        let reliable = self.qp_type.is_reliable();
        let noack = self.req.noack + 1;
        let ack_req = last || (reliable && noack > MAX_PKT_PER_ACK);
        let solicited = last
            && wqe.wr.flags.contains(SendFlags::SOLICITED)
            && matches!(op, WrOpcode::Send | WrOpcode::SendImm | WrOpcode::SendInv | WrOpcode::RdmaWriteImm);
        let (dst_ip, dest_qp) = match &wqe.wr.ud {
            Some(d) if ud => (d.av.dgid.to_ip(), d.remote_qpn),
            _ => (self.attr.ah_attr.dgid.to_ip(), self.attr.dest_qp_num),
        };
        let this_psn = self.req.psn;
        let mut h = Headers::new(Bth {
            opcode,
            solicited,
            mig_req: false,
            pad_count: 0,
            tver: 0,
            pkey: DEFAULT_PKEY,
            fecn: false,
            becn: false,
            dest_qp,
            ack_req,
            psn: this_psn,
        });
        let info = opcode.info().expect("request opcodes are in the table");
        use crate::wire::OpFlags as F;
        if info.flags.contains(F::XRCETH) {
            h.xrceth = Some(wqe.wr.remote_srqn);
        }
        if info.flags.contains(F::RETH) {
            let dma_len = if op == WrOpcode::RdmaRead { len - off } else { len };
            h.reth = Some(Reth { va: wqe.wr.remote_addr + off, rkey: wqe.wr.rkey, dma_len: dma_len as u32 });
        }
        if info.flags.contains(F::IMMDT) {
            h.imm = Some(wqe.wr.imm_data);
        }
        if info.flags.contains(F::IETH) {
            h.ieth = Some(wqe.wr.imm_data);
        }
        if info.flags.contains(F::ATOMIC_ETH) {
            h.atomic_eth = Some(AtomicEth {
                va: wqe.wr.remote_addr,
                rkey: wqe.wr.rkey,
                swap_add: if op == WrOpcode::AtomicCmpSwp { wqe.wr.swap } else { wqe.wr.compare_add },
                compare: if op == WrOpcode::AtomicCmpSwp { wqe.wr.compare_add } else { 0 },
            });
        }
        if let (true, Some(d)) = (info.flags.contains(F::DETH), &wqe.wr.ud) {
            // A Q_Key with the high bit set means "use the QP's own Q_Key".
            let qkey = if d.remote_qkey & 0x8000_0000 != 0 { self.attr.qkey } else { d.remote_qkey };
            h.deth = Some(Deth { qkey, src_qp: self.qpn });
        }
        let pd = self.pd;
        let mem = ctx.mem;
        let wr = &wqe.wr;
        let fp = Fingerprint { site: Site::SendPayload, psn: this_psn, len: chunk, addr: off };
        let built = match (&wr.inline, wr.sg_list.as_slice()) {
            // One SGE copied into the packet: checked and read in one call.
            (None, [sge]) if chunk > 0 && !ctx.sends_in_place(chunk) => {
                ctx.build_read_local(dst_ip, &h, sge.lkey, pd, sge.addr + off, chunk as usize, fp)
            }
            // One SGE: its span, sent in place where it can be.
            (None, [sge]) if chunk > 0 => mem
                .resolve(sge.lkey, pd, sge.addr + off, chunk, Want::LocalRead)
                .map_err(CopyError::from)
                .and_then(|span| ctx.build_from(dst_ip, &h, span, fp)),
            (Some(d), _) => ctx.build(dst_ip, &h, chunk as usize, |buf| {
                buf.copy_from_slice(&d[off as usize..(off + chunk) as usize]);
                Ok(())
            }),
            (None, sges) => sge_spans(mem, pd, sges, off, chunk, Want::LocalRead)
                .map_err(CopyError::from)
                .and_then(|spans| ctx.build_copied(dst_ip, &h, spans, fp)),
        };
        let t = match built {
            Ok(t) => t,
            // The payload is being read by a copy job: this runs again.
            Err(CopyError::Deferred) => return None,
            Err(CopyError::Access(_)) => {
                // The region went away between the check and now.
                self.local_error(ctx, WcStatus::LocProtErr);
                return None;
            }
        };
        if reliable {
            self.req.noack = if ack_req { 0 } else { noack };
        }
        // Advance.
        if op.is_read_or_atomic() {
            self.req.psn = psn::add(self.sq[cursor].last_psn, 1);
        } else {
            self.req.psn = psn::add(this_psn, 1);
        }
        if last {
            self.req.cursor += 1;
            self.req.cursor_off = 0;
        } else {
            self.req.cursor_off += chunk;
        }
        if !self.qp_type.is_reliable() {
            // (By value: a `&mut t` would keep RC's packet in memory and
            // copy it once more on its way out.)
            return Some(self.unreliable_sent(ctx, t, last));
        }
        Some(t)
    }

    /// An unreliable QP built packet `t`, the `last` of its message: the
    /// send completes on transmission, once every packet sent in place is
    /// in the kernel (a copied packet's bytes are in its buffer already: it
    /// only keeps the completions' order). Out of line: RC's packet path
    /// stays as small as it was.
    #[inline(never)]
    fn unreliable_sent(&mut self, ctx: &mut Ctx, mut t: Transmit, last: bool) -> Transmit {
        if t.in_place.is_some() {
            let a = self.after_send.get_or_insert_with(Default::default);
            a.seq = a.seq.wrapping_add(1).max(1);
            t.set_after_send(self.qpn, a.seq);
        }
        if !last {
            return t;
        }
        let (wait, seq) = self.after_send.as_ref().map_or((false, 0), |a| (a.seq != a.sent, a.seq));
        let w = self.pop_head().expect("cursor WQE exists");
        if w.signaled {
            let mut wc = Wc::new(w.wr.wr_id, WcStatus::Success, w.wc_opcode(), self.qpn);
            wc.byte_len = w.len as u32;
            match self.after_send.as_deref_mut() {
                Some(a) if wait => a.held.push_back((seq, wc)),
                _ => self.deliver_send(ctx, wc),
            }
        }
        t
    }

    /// Packets up to number `seq` are in the kernel: delivers the
    /// completions that waited for them.
    pub(crate) fn on_sent(&mut self, ctx: &mut Ctx, seq: u32) {
        // Numbers wrap: "after" is within half the space.
        let after = |x: u32, y: u32| (x.wrapping_sub(y) as i32) > 0;
        let Some(a) = self.after_send.as_deref_mut() else { return };
        if after(seq, a.sent) {
            a.sent = seq;
        }
        loop {
            let Some(a) = self.after_send.as_deref_mut() else { return };
            let wc = match a.held.front() {
                Some(&(s, wc)) if !after(s, a.sent) => wc,
                _ => return,
            };
            a.held.pop_front();
            if let Some(cq) = self.send_cq.clone() {
                self.deliver(ctx, &cq, wc, false);
            }
        }
    }

    /// Executes the BIND_MW, UMR or LOCAL_INV at the cursor, in send-queue order.
    /// A failure completes it with MW_BIND_ERR and moves the QP to ERR.
    fn execute_local(&mut self, ctx: &mut Ctx) {
        let cursor = self.req.cursor;
        let wr = &self.sq[cursor].wr;
        let r = match wr.opcode {
            WrOpcode::BindMw => {
                let req = **wr.bind.as_ref().expect("checked at post");
                ctx.mem.bind_mw(self.pd, self.qpn, &req).map(|_| ())
            }
            WrOpcode::Umr => {
                let umr = *wr.umr.clone().expect("checked at post");
                ctx.mem.umr(umr.key, self.pd, umr.layout)
            }
            _ => ctx.mem.invalidate(wr.imm_data, self.pd, self.qpn),
        };
        if let Err(e) = r {
            tracing::warn!(qpn = self.qpn, "{e}");
            self.local_error(ctx, WcStatus::MwBindErr);
            return;
        }
        self.sq[cursor].started = true;
        self.req.cursor += 1;
        self.complete_local_head(ctx);
    }

    /// Completes executed local WQEs at the head of the send queue, then a
    /// WQE that failed locally if it is the head now.
    pub(crate) fn complete_local_head(&mut self, ctx: &mut Ctx) {
        while self.sq.front().is_some_and(|w| w.wr.opcode.is_local() && w.started) {
            let w = self.pop_head().unwrap();
            if w.signaled {
                let wc = Wc::new(w.wr.wr_id, WcStatus::Success, w.wc_opcode(), self.qpn);
                self.deliver_send(ctx, wc);
            }
        }
        if let Some(status) = self.sq.front().and_then(|w| w.failed) {
            self.complete_head_error(ctx, status);
        }
    }

    /// The WQE at the cursor failed locally (before or while it was sent).
    /// Send completions come in posting order, so it completes with
    /// `status`, and the QP moves to ERR (flushing the rest), once every
    /// older request has completed: at once if none is outstanding, or
    /// when the last older one is acknowledged. Meanwhile nothing from it
    /// on is sent. (rxe up to Linux 6.4 did the same: the requester marks
    /// the WQE in error and its completer reaches it in queue order, after
    /// the ACKs of the older ones; a failure of an older one, its retries
    /// exhausted, say, flushes this one with the rest.)
    pub(crate) fn local_error(&mut self, ctx: &mut Ctx, status: WcStatus) {
        let cursor = self.req.cursor;
        match self.sq.get_mut(cursor) {
            Some(w) => w.failed = Some(status),
            None => return self.fail(ctx, None),
        }
        if cursor > 0 {
            tracing::debug!(qpn = self.qpn, ?status, older = cursor, "local error behind unacknowledged requests");
        }
        self.complete_local_head(ctx);
    }

    /// Go-back-N: resume transmission at the oldest unacknowledged PSN.
    /// A partly acknowledged SEND/WRITE resumes at its first unacknowledged
    /// packet; a partly answered READ is re-requested from the next expected
    /// response (new VA and length); an atomic is resent whole.
    pub(crate) fn rewind(&mut self, ctx: &mut Ctx) {
        let mtu = self.mtu() as u64;
        self.req.psn = self.req.comp_psn;
        self.req.cursor = 0;
        self.req.cursor_off = 0;
        self.req.noack = 0;
        if let Some(head) = self.sq.front().filter(|w| w.started) {
            let npkts = psn::diff(head.last_psn, head.first_psn) + 1;
            let done = psn::diff(self.req.comp_psn, head.first_psn).clamp(0, npkts - 1);
            if !head.wr.opcode.is_atomic() {
                self.req.cursor_off = done as u64 * mtu;
            }
            self.req.psn = psn::add(head.first_psn, done as u32);
        }
        self.req.retrying = true;
        ctx.stats.retransmits += 1;
        ctx.mark_ready(self.qpn);
    }

    /// Timer expiry: retransmission timeout or the end of an RNR wait.
    pub(crate) fn on_timer(&mut self, ctx: &mut Ctx) {
        let now = ctx.now;
        if self.req.rnr_timer.is_some_and(|t| t <= now) {
            self.req.rnr_timer = None;
            ctx.mark_ready(self.qpn);
        }
        if self.req.timer.is_some_and(|t| t <= now) {
            self.req.timer = None;
            let outstanding = self.sq.front().is_some_and(|w| w.started);
            if !outstanding || self.req.rnr_timer.is_some() {
                return;
            }
            if ctx.copy.waiting.is_some() {
                // A local copy job (an ODP fault on this side) holds the
                // QP's packets, the peer's ACKs among them: not the
                // transport's fault, not counted against `retry_cnt`.
                ctx.stats.timeouts_behind_copies += 1;
                self.req.timer = ack_timeout(self.attr.timeout).map(|d| now + d);
                return;
            }
            ctx.stats.timeouts += 1;
            tracing::warn!(
                qpn = self.qpn,
                peer_qpn = self.attr.dest_qp_num,
                peer = %self.attr.ah_attr.dgid.to_ip(),
                psn = self.req.comp_psn,
                retries_left = self.req.retry_left,
                "retransmission timeout"
            );
            if self.req.retry_left == 0 {
                tracing::warn!(qpn = self.qpn, "transport retry counter exceeded");
                self.complete_head_error(ctx, WcStatus::RetryExcErr);
                return;
            }
            self.req.retry_left -= 1;
            self.rewind(ctx);
            self.req.timer = ack_timeout(self.attr.timeout).map(|d| now + d);
        }
    }
}

/// The opcode of a request packet.
fn request_opcode(op: WrOpcode, first: bool, last: bool, ud: bool) -> Opcode {
    use WrOpcode::*;
    if ud {
        return if op == SendImm { Opcode::UD_SEND_ONLY_IMM } else { Opcode::UD_SEND_ONLY };
    }
    match (op, first, last) {
        (Send, true, true) => Opcode::RC_SEND_ONLY,
        (SendImm, true, true) => Opcode::RC_SEND_ONLY_IMM,
        (SendInv, true, true) => Opcode::RC_SEND_ONLY_INV,
        (Send | SendImm | SendInv, true, false) => Opcode::RC_SEND_FIRST,
        (Send | SendImm | SendInv, false, false) => Opcode::RC_SEND_MIDDLE,
        (Send, false, true) => Opcode::RC_SEND_LAST,
        (SendImm, false, true) => Opcode::RC_SEND_LAST_IMM,
        (SendInv, false, true) => Opcode::RC_SEND_LAST_INV,
        (RdmaWrite, true, true) => Opcode::RC_WRITE_ONLY,
        (RdmaWriteImm, true, true) => Opcode::RC_WRITE_ONLY_IMM,
        (RdmaWrite | RdmaWriteImm, true, false) => Opcode::RC_WRITE_FIRST,
        (RdmaWrite | RdmaWriteImm, false, false) => Opcode::RC_WRITE_MIDDLE,
        (RdmaWrite, false, true) => Opcode::RC_WRITE_LAST,
        (RdmaWriteImm, false, true) => Opcode::RC_WRITE_LAST_IMM,
        (RdmaRead, _, _) => Opcode::RC_READ_REQUEST,
        (AtomicCmpSwp, _, _) => Opcode::RC_COMPARE_SWAP,
        (AtomicFetchAdd, _, _) => Opcode::RC_FETCH_ADD,
        (AtomicWrite, _, _) => Opcode::RC_ATOMIC_WRITE,
        (LocalInv | BindMw | Umr, _, _) => unreachable!("local operations send no packet"),
    }
}
