//! The responder: executes incoming requests in PSN order (SEND into receive
//! WQEs, WRITE, READ, atomics, ATOMIC WRITE), checks opcode sequence,
//! lengths, access rights and keys, answers with ACKs (coalesced), NAKs, RNR
//! NAKs, READ responses, atomic ACKs and (for ATOMIC WRITE, as rxe) empty
//! READ responses, and handles duplicates as the IBA and rxe do: re-ACK
//! SEND/WRITE, replay READ from memory, replay atomics from the saved
//! result, re-acknowledge an ATOMIC WRITE, never execute twice. UD receives and UC's silent drops live here
//! too. An XRC target is an RC responder whose requests each name an SRQ of
//! its XRC domain: receives come from it and complete on its CQ, and its PD
//! guards the memory RDMA requests touch.

use super::ack::ack_hold_limit;
use super::cq::{InlineRecv, MAX_INLINE_RECV};
use super::copy::{CopyError, Fingerprint, Site, AHEAD_MAX};
use super::memory::{sge_spans, Atomic, Want};
use super::qp::Qp;
use super::requester_state::{num_packets, DEFAULT_PKEY};
pub use super::responder_state::GRH_LEN;
use super::responder_state::{Out, RdKind, RdResource, ReadJob, RecvProgress, WriteProgress};
use super::srq::SharedRecvQueue;
use super::{psn, Ctx, Transmit};
use crate::ib::{AsyncEventType, QpState, QpType, Wc, WcFlags, WcOpcode, WcStatus};
use crate::mem::sge_total;
use crate::wire::{Aeth, AethKind, Bth, Headers, IpInfo, NakCode, OpFlags as F, Opcode, Packet};
use std::net::IpAddr;
use std::sync::Arc;

/// Why a request is refused.
enum Refuse {
    Nak(NakCode),
    Rnr,
    /// Silently dropped (UC errors).
    Drop,
    /// Waits for a copy job (`proto::copy`): nothing happened, the packet
    /// runs again when the job is done.
    Defer,
}

impl Qp {
    #[cfg(feature = "unstable")]
    /// The responder's expected PSN. On a reliable QP every request before
    /// it has been executed and none from it on, so a test can tell on which
    /// side of an event (a window invalidated by its owner, say) each
    /// request of the QP fell.
    pub fn expected_psn(&self) -> u32 {
        self.resp.epsn
    }

    /// A retransmission of the request at `psn` arrived while the copy job
    /// of its page fault still runs: true if it was answered with another
    /// RNR NAK (each with sixteen times the wait of the one before, from the
    /// QP's `min_rnr_timer` on: a fault that outlasts the first wait on a
    /// busy host does not use up a small `rnr_retry` at once; with
    /// `min_rnr_timer` 12 and `rnr_retry` 3 the waits are 0.64, 10.24 and
    /// 163.84 ms, where a fault served at once costs one 0.64 ms wait); false if it is not
    /// that request (the engine parks it behind the job).
    pub(crate) fn fault_rnr_again(&mut self, ctx: &mut Ctx, psn: u32) -> bool {
        let Some((p, t)) = self.resp.fault else { return false };
        if p != psn || self.qp_type == QpType::Uc {
            return false;
        }
        // Timer codes step by about 1.4x; eight steps make the wait sixteen
        // times longer (0 is already the longest, 655 ms).
        let t = if t == 0 { 0 } else { (t + 8).min(31) };
        self.resp.fault = Some((p, t));
        ctx.stats.rnr_naks_sent += 1;
        ctx.stats.fault_rnr_naks += 1;
        let msn = self.resp.msn;
        self.resp.out.push_back(Out::Ack { psn: p, aeth: Aeth::rnr_nak(t, msn) });
        ctx.mark_ready(self.qpn);
        true
    }

    /// Handles an RC or UC request packet.
    pub(crate) fn on_request(&mut self, ctx: &mut Ctx, pkt: &Packet) {
        if !matches!(self.attr.qp_state, QpState::Rtr | QpState::Rts | QpState::Sqd) || self.resp.failing.is_some() {
            ctx.stats.rx_drop_state += 1;
            return;
        }
        let p = pkt.headers.bth.psn;
        let d = psn::diff(p, self.resp.epsn);
        let uc = self.qp_type == QpType::Uc;
        let flags = pkt.headers.bth.opcode.info().map_or(F::empty(), |i| i.flags);
        if uc {
            if d != 0 {
                // UC: a gap loses the message in progress.
                ctx.stats.rx_out_of_sequence += 1;
                self.resp.write = None;
                if let Some(r) = &mut self.resp.recv {
                    r.off = 0;
                }
                self.resp.uc_resync = true;
                self.resp.epsn = p;
            }
            if self.resp.uc_resync {
                if !flags.contains(F::FIRST) {
                    self.resp.epsn = psn::add(p, 1);
                    return;
                }
                self.resp.uc_resync = false;
            }
        } else if d > 0 {
            ctx.stats.rx_out_of_sequence += 1;
            if !self.resp.nak_sent {
                self.resp.nak_sent = true;
                ctx.stats.naks_sent += 1;
                let epsn = self.resp.epsn;
                let msn = self.resp.msn;
                self.resp.out.push_back(Out::Ack { psn: epsn, aeth: Aeth::nak(NakCode::PsnSequence, msn) });
                ctx.mark_ready(self.qpn);
            }
            return;
        } else if d < 0 {
            ctx.stats.rx_duplicates += 1;
            self.on_duplicate(ctx, pkt, flags);
            return;
        }
        match self.execute(ctx, pkt, flags) {
            Ok(()) => {
                self.resp.nak_sent = false;
                self.resp.fault = None;
            }
            Err(Refuse::Rnr) => {
                ctx.stats.rnr_naks_sent += 1;
                let t = self.attr.min_rnr_timer;
                let msn = self.resp.msn;
                self.resp.out.push_back(Out::Ack { psn: p, aeth: Aeth::rnr_nak(t, msn) });
            }
            Err(Refuse::Nak(code)) => {
                ctx.stats.naks_sent += 1;
                tracing::warn!(qpn = self.qpn, psn = p, ?code, "request refused");
                let msn = self.resp.msn;
                self.resp.out.push_back(Out::Ack { psn: p, aeth: Aeth::nak(code, msn) });
                self.resp.failing = Some(match code {
                    NakCode::RemoteAccess => AsyncEventType::QpAccessErr,
                    _ => AsyncEventType::QpReqErr,
                });
            }
            Err(Refuse::Drop) => {}
            Err(Refuse::Defer) if uc => return,
            Err(Refuse::Defer) => {
                // A page fault (the copy may block: a job faults the pages
                // in): an RNR NAK, so that the requester waits on its RNR
                // budget, not its transport timer, and sends the request
                // again, which then finds the pages in (or the job's
                // result). Later packets of the message are dropped until
                // it comes again (as after a sequence NAK).
                ctx.copy.nakked = true;
                let t = self.attr.min_rnr_timer;
                self.resp.fault = Some((p, t));
                self.resp.nak_sent = true;
                ctx.stats.rnr_naks_sent += 1;
                ctx.stats.fault_rnr_naks += 1;
                let msn = self.resp.msn;
                self.resp.out.push_back(Out::Ack { psn: p, aeth: Aeth::rnr_nak(t, msn) });
            }
        }
        if self.resp.recv.is_none() && self.resp.write.is_none() {
            // Between messages an XRC target holds no SRQ.
            self.resp.xrc_srq = None;
        }
        ctx.mark_ready(self.qpn);
    }

    /// The XRC SRQ an XRC request names, if it exists and belongs to this
    /// target QP's XRC domain.
    fn xrc_srq(&self, ctx: &Ctx, pkt: &Packet) -> Option<Arc<SharedRecvQueue>> {
        let srq = ctx.xrc_srqs.get(&pkt.headers.xrceth?)?.upgrade()?;
        (srq.xrc.as_ref()?.xrcd == self.xrcd?).then_some(srq)
    }

    /// Executes the in-sequence request `pkt`; advances the expected PSN.
    fn execute(&mut self, ctx: &mut Ctx, pkt: &Packet, flags: F) -> Result<(), Refuse> {
        if self.qp_type == QpType::XrcRecv {
            // An SRQ outside the QP's XRC domain is outside its protection
            // domain: the request is refused as an R_Key of another PD is.
            self.resp.xrc_srq = Some(self.xrc_srq(ctx, pkt).ok_or(Refuse::Nak(NakCode::RemoteAccess))?);
        }
        let uc = self.qp_type == QpType::Uc;
        let bad = |code| if uc { Refuse::Drop } else { Refuse::Nak(code) };
        let h = &pkt.headers;
        let p = h.bth.psn;
        let mtu = self.mtu() as usize;
        let len = pkt.payload.len();

        // Opcode sequence.
        let in_send = self.resp.recv.as_ref().is_some_and(|r| r.off > 0);
        let in_write = self.resp.write.is_some();
        let continues = flags.intersects(F::MIDDLE | F::LAST) && !flags.contains(F::FIRST);
        let seq_ok = if continues {
            (flags.contains(F::SEND) && in_send) || (flags.contains(F::WRITE) && in_write)
        } else {
            !in_send && !in_write
        };
        if !seq_ok {
            return Err(bad(NakCode::InvalidRequest));
        }
        // Lengths.
        if flags.contains(F::PAYLOAD) {
            let ok = if flags.contains(F::FIRST) && flags.contains(F::LAST) {
                len <= mtu
            } else if flags.contains(F::LAST) {
                (1..=mtu).contains(&len)
            } else {
                len == mtu && h.bth.pad_count == 0
            };
            if !ok {
                return Err(bad(NakCode::InvalidRequest));
            }
        }
        // QP access rights.
        let qa = self.attr.qp_access_flags;
        use crate::ib::Access as A;
        if (flags.intersects(F::WRITE | F::ATOMIC_WRITE) && !qa.contains(A::REMOTE_WRITE))
            || (flags.contains(F::READ) && !qa.contains(A::REMOTE_READ))
            || (flags.contains(F::ATOMIC) && !qa.contains(A::REMOTE_ATOMIC))
        {
            return Err(bad(NakCode::InvalidRequest));
        }

        if flags.contains(F::SEND) {
            self.exec_send(ctx, pkt, flags)?;
        } else if flags.contains(F::WRITE) {
            self.exec_write(ctx, pkt, flags)?;
        } else if flags.contains(F::READ) {
            return self.exec_read(ctx, pkt);
        } else if flags.contains(F::ATOMIC) {
            return self.exec_atomic(ctx, pkt);
        } else if flags.contains(F::ATOMIC_WRITE) {
            return self.exec_atomic_write(ctx, pkt);
        } else {
            return Err(bad(NakCode::InvalidRequest));
        }
        self.resp.epsn = psn::add(p, 1);
        if flags.contains(F::LAST) {
            self.resp.msn = psn::add(self.resp.msn, 1);
        }
        if h.bth.ack_req && !uc {
            let aeth = Aeth::ack(self.resp.msn);
            let limit = self.ack_hold(ctx, flags);
            if let Some((p, aeth)) = self.resp.ack.offer(ctx.now, limit, p, aeth) {
                self.resp.push_ack(p, aeth);
            }
        }
        Ok(())
    }

    /// How long the ACK of `flags`' packet may be held for the application's
    /// answer (see `proto::ack`); None: it goes at once. Only the last
    /// packet of a message is answered; only an RC QP in RTS can answer
    /// (an XRC target has no send queue); and nothing waits behind
    /// queued responses, which the ACK would have to precede.
    fn ack_hold(&self, ctx: &Ctx, flags: F) -> Option<std::time::Duration> {
        let can_answer = ctx.app_active
            && flags.contains(F::LAST)
            && self.qp_type == QpType::Rc
            && self.attr.qp_state == QpState::Rts
            && self.resp.out.is_empty();
        can_answer.then(|| ack_hold_limit(self.attr.timeout))
    }

    /// A held ACK whose deadline has passed goes (see `proto::ack`).
    pub(crate) fn on_ack_timer(&mut self, ctx: &mut Ctx) {
        if let Some((psn, aeth)) = self.resp.ack.expire(ctx.now) {
            self.resp.out.push_front(Out::Ack { psn, aeth });
            ctx.mark_ready(self.qpn);
        }
    }

    /// The held ACK as a packet, now (the QP is about to be destroyed or
    /// reset: what it acknowledged still leaves).
    pub(crate) fn take_held_ack_packet(&mut self, ctx: &mut Ctx) -> Option<Transmit> {
        if !matches!(self.attr.qp_state, QpState::Rtr | QpState::Rts | QpState::Sqd | QpState::Err) {
            self.resp.ack.take();
            return None;
        }
        let (psn, aeth) = self.resp.ack.take()?;
        let mut h = self.response_headers(Opcode::RC_ACK, psn);
        h.aeth = Some(aeth);
        ctx.build(self.attr.ah_attr.dgid.to_ip(), &h, 0, |_| Ok::<(), std::convert::Infallible>(())).ok()
    }

    fn response_headers(&self, opcode: Opcode, psn: u32) -> Headers {
        Headers::new(Bth {
            opcode: self.wire_opcode(opcode),
            solicited: false,
            mig_req: false,
            pad_count: 0,
            tver: 0,
            pkey: DEFAULT_PKEY,
            fecn: false,
            becn: false,
            dest_qp: self.attr.dest_qp_num,
            ack_req: false,
            psn,
        })
    }

    fn exec_send(&mut self, ctx: &mut Ctx, pkt: &Packet, flags: F) -> Result<(), Refuse> {
        let uc = self.qp_type == QpType::Uc;
        if flags.contains(F::FIRST) && self.resp.recv.is_none() {
            match self.take_recv(ctx) {
                Some(wqe) => self.resp.recv = Some(RecvProgress { wqe, off: 0 }),
                None => {
                    ctx.stats.rx_drop_no_recv += 1;
                    return Err(if uc { Refuse::Drop } else { Refuse::Rnr });
                }
            }
        }
        let pd = self.recv_pd();
        let inline_limit = match self.recv_cq_now() {
            Some(cq) if self.scatter_to_cqe => cq.inline_limit(),
            _ => 0,
        };
        let recv = self.resp.recv.as_mut().expect("a receive WQE is open");
        let off = recv.off;
        let data = pkt.payload;
        // A whole small message can travel in its completion (inline receive).
        let inline = flags.contains(F::FIRST | F::LAST) && !data.is_empty() && data.len() <= inline_limit;
        let status = if off + data.len() as u64 > sge_total(&recv.wqe.sges) {
            Some((WcStatus::LocLenErr, NakCode::InvalidRequest))
        } else if inline {
            None
        } else {
            let mem = ctx.mem;
            let fp = Fingerprint { site: Site::RecvScatter, psn: pkt.headers.bth.psn, len: data.len() as u64, addr: off };
            let r = sge_spans(mem, pd, &recv.wqe.sges, off, data.len() as u64, Want::LocalWrite)
                .map_err(CopyError::from)
                .and_then(|spans| ctx.copy.write(mem, fp, spans, data));
            match r {
                Ok(()) => None,
                // The receive WQE stays open (`resp.recv`) for the packet's
                // second run.
                Err(CopyError::Deferred) => return Err(Refuse::Defer),
                Err(CopyError::Access(_)) => Some((WcStatus::LocProtErr, NakCode::RemoteOperational)),
            }
        };
        if let Some((st, code)) = status {
            let recv = self.resp.recv.take().unwrap();
            let wc = Wc::new(recv.wqe.wr_id, st, WcOpcode::Recv, self.qpn);
            self.deliver_recv(ctx, wc, false);
            return Err(if uc { Refuse::Drop } else { Refuse::Nak(code) });
        }
        recv.off += data.len() as u64;
        if flags.contains(F::LAST) {
            let recv = self.resp.recv.take().unwrap();
            let mut wc = Wc::new(recv.wqe.wr_id, WcStatus::Success, WcOpcode::Recv, self.qpn);
            wc.byte_len = recv.off as u32;
            wc.src_qp = self.attr.dest_qp_num;
            if let Some(imm) = pkt.headers.imm {
                wc.imm_data = imm;
                wc.wc_flags |= WcFlags::WITH_IMM;
            }
            if let Some(rkey) = pkt.headers.ieth {
                // The window is invalidated before the receive completes. A
                // bad key fails the receive with REM_INV_REQ_ERR and the QP
                // (rxe sends no NAK: the requester times out).
                if let Err(e) = ctx.mem.invalidate(rkey, self.remote_pd(), self.qpn) {
                    tracing::warn!(qpn = self.qpn, rkey, "SEND_WITH_INV: {e}");
                    wc.status = WcStatus::RemInvReqErr;
                    self.deliver_recv(ctx, wc, false);
                    self.fail(ctx, Some(AsyncEventType::QpReqErr));
                    return Err(Refuse::Drop);
                }
                wc.imm_data = rkey;
                wc.wc_flags |= WcFlags::WITH_INV;
            }
            if inline {
                let mut i =
                    InlineRecv { len: data.len() as u8, data: [0; MAX_INLINE_RECV], pd, sges: Default::default() };
                i.data[..data.len()].copy_from_slice(data);
                i.sges.extend_from_slice(&recv.wqe.sges);
                self.deliver_recv_inline(ctx, wc, pkt.headers.bth.solicited, i);
                return Ok(());
            }
            self.deliver_recv(ctx, wc, pkt.headers.bth.solicited);
        }
        Ok(())
    }

    fn exec_write(&mut self, ctx: &mut Ctx, pkt: &Packet, flags: F) -> Result<(), Refuse> {
        let uc = self.qp_type == QpType::Uc;
        let h = &pkt.headers;
        // The whole target range is checked at the FIRST (or ONLY) packet;
        // an ONLY packet then writes through the span that check gave.
        let mut checked = None;
        if flags.contains(F::FIRST) {
            let reth = h.reth.expect("WRITE FIRST/ONLY carries a RETH");
            if reth.dma_len > 1 << 31 {
                return Err(if uc { Refuse::Drop } else { Refuse::Nak(NakCode::InvalidRequest) });
            }
            let pd = self.remote_pd();
            // A whole WRITE ONLY without immediate (nothing else to check
            // before memory): the range is checked and written in one call.
            if flags.contains(F::LAST) && h.imm.is_none() && pkt.payload.len() as u64 == reth.dma_len as u64 {
                self.resp.write = None;
                let mem = ctx.mem;
                let fp = Fingerprint { site: Site::Write, psn: h.bth.psn, len: reth.dma_len as u64, addr: reth.va };
                let copied = match ctx.copy.holds(fp) {
                    false => mem.write_remote(reth.rkey, pd, self.qpn, reth.va, pkt.payload),
                    // A copy job wrote it: the slot has the result.
                    true => Ok(false),
                };
                let r = match copied {
                    Ok(true) => Ok(()),
                    // The copy may block, or a job did it: through the slot.
                    Ok(false) => mem
                        .resolve_remote(reth.rkey, pd, self.qpn, reth.va, reth.dma_len as u64, Want::RemoteWrite)
                        .map_err(CopyError::from)
                        .and_then(|span| ctx.copy.write(mem, fp, smallvec::smallvec![span], pkt.payload)),
                    Err(e) => Err(CopyError::Access(e)),
                };
                return match r {
                    Ok(()) => Ok(()),
                    Err(CopyError::Deferred) => Err(Refuse::Defer),
                    Err(CopyError::Access(_)) => Err(if uc { Refuse::Drop } else { Refuse::Nak(NakCode::RemoteAccess) }),
                };
            }
            match ctx.mem.resolve_remote(reth.rkey, pd, self.qpn, reth.va, reth.dma_len as u64, Want::RemoteWrite) {
                Ok(span) => checked = Some(span),
                Err(_) => return Err(if uc { Refuse::Drop } else { Refuse::Nak(NakCode::RemoteAccess) }),
            }
            self.resp.write = Some(WriteProgress { va: reth.va, rkey: reth.rkey, total: reth.dma_len as u64, off: 0 });
        }
        let w = self.resp.write.expect("a WRITE is open");
        let data = pkt.payload;
        let end = w.off + data.len() as u64;
        let last = flags.contains(F::LAST);
        if end > w.total || (last && end != w.total) {
            self.resp.write = None;
            return Err(if uc { Refuse::Drop } else { Refuse::Nak(NakCode::InvalidRequest) });
        }
        // WRITE with immediate consumes a receive WQE: make sure one exists
        // before touching memory, so an RNR NAK leaves nothing half done.
        let mut recv = None;
        if last && h.imm.is_some() {
            match self.take_recv(ctx) {
                Some(wqe) => recv = Some(wqe),
                None => {
                    ctx.stats.rx_drop_no_recv += 1;
                    return Err(if uc { Refuse::Drop } else { Refuse::Rnr });
                }
            }
        }
        let mem = ctx.mem;
        let fp = Fingerprint { site: Site::Write, psn: h.bth.psn, len: data.len() as u64, addr: w.va + w.off };
        let span = match checked {
            Some(span) if w.off == 0 && data.len() as u64 == w.total => Ok(span),
            _ => mem.resolve_remote(w.rkey, self.remote_pd(), self.qpn, w.va + w.off, data.len() as u64, Want::RemoteWrite),
        };
        let written = span.map_err(CopyError::from).and_then(|s| ctx.copy.write(mem, fp, smallvec::smallvec![s], data));
        match written {
            Ok(()) => {}
            Err(CopyError::Deferred) => {
                // The job faults in the rest of the message too.
                let rest = (w.total - end).min(AHEAD_MAX);
                if rest > 0 {
                    let pd = self.remote_pd();
                    if let Ok(s) = mem.resolve_remote(w.rkey, pd, self.qpn, w.va + end, rest, Want::RemoteWrite) {
                        ctx.copy.ahead(s, true);
                    }
                }
                // Undone for the packet's second run: the WRITE it opens,
                // the receive WQE it took.
                if flags.contains(F::FIRST) {
                    self.resp.write = None;
                }
                self.parked_recv = recv;
                return Err(Refuse::Defer);
            }
            Err(CopyError::Access(_)) => {
                self.resp.write = None;
                return Err(if uc { Refuse::Drop } else { Refuse::Nak(NakCode::RemoteAccess) });
            }
        }
        self.resp.write.as_mut().unwrap().off = end;
        if last {
            self.resp.write = None;
            if let Some(wqe) = recv {
                let mut wc = Wc::new(wqe.wr_id, WcStatus::Success, WcOpcode::RecvRdmaWithImm, self.qpn);
                wc.byte_len = w.total as u32;
                wc.imm_data = h.imm.unwrap_or(0);
                wc.wc_flags = WcFlags::WITH_IMM;
                wc.src_qp = self.attr.dest_qp_num;
                self.deliver_recv(ctx, wc, h.bth.solicited);
            }
        }
        Ok(())
    }

    fn exec_read(&mut self, ctx: &mut Ctx, pkt: &Packet) -> Result<(), Refuse> {
        let reth = pkt.headers.reth.expect("READ carries a RETH");
        if self.resp.max_resources == 0 || reth.dma_len > 1 << 31 {
            return Err(Refuse::Nak(NakCode::InvalidRequest));
        }
        let len = reth.dma_len as u64;
        let pd = self.remote_pd();
        if ctx.mem.resolve_remote(reth.rkey, pd, self.qpn, reth.va, len, Want::RemoteRead).is_err() {
            return Err(Refuse::Nak(NakCode::RemoteAccess));
        }
        let p = pkt.headers.bth.psn;
        // A page fault under the READ's first packet: a job faults it (and
        // the rest of the READ) in, and the request is answered with an RNR
        // NAK (see `on_request`), as mlx5 does, rather than accepted and
        // its response left waiting behind the job.
        let chunk = len.min(self.mtu() as u64);
        let fp = Fingerprint { site: Site::ReadResponse, psn: p, len: chunk, addr: reth.va };
        if self.qp_type != QpType::Uc && chunk > 0 && !ctx.copy.holds(fp) {
            let mem = ctx.mem;
            if let Ok(span) = mem.resolve_remote(reth.rkey, pd, self.qpn, reth.va, chunk, Want::RemoteRead) {
                if ctx.copy.wants_job(mem, fp, std::slice::from_ref(&span)) {
                    let mut buf = vec![0u8; chunk as usize];
                    if let Err(CopyError::Deferred) = ctx.copy.read(mem, fp, smallvec::smallvec![span], &mut buf) {
                        let rest = (len - chunk).min(AHEAD_MAX);
                        if rest > 0 {
                            if let Ok(s) = mem.resolve_remote(reth.rkey, pd, self.qpn, reth.va + chunk, rest, Want::RemoteRead) {
                                ctx.copy.ahead(s, false);
                            }
                        }
                        return Err(Refuse::Defer);
                    }
                }
            }
        }
        let n = num_packets(len, self.mtu());
        self.add_resource(RdResource { first_psn: p, last_psn: psn::add(p, n - 1), kind: RdKind::Read });
        self.resp.msn = psn::add(self.resp.msn, 1);
        let job = ReadJob { start_psn: p, psn: p, va: reth.va, pd, rkey: reth.rkey, len, off: 0 };
        self.resp.out.push_back(Out::Read(job));
        self.resp.epsn = psn::add(p, n);
        Ok(())
    }

    fn exec_atomic(&mut self, ctx: &mut Ctx, pkt: &Packet) -> Result<(), Refuse> {
        let a = pkt.headers.atomic_eth.expect("atomics carry an AtomicETH");
        if self.resp.max_resources == 0 || a.va % 8 != 0 {
            return Err(Refuse::Nak(NakCode::InvalidRequest));
        }
        let span = ctx
            .mem
            .resolve_remote(a.rkey, self.remote_pd(), self.qpn, a.va, 8, Want::RemoteAtomic)
            .map_err(|_| Refuse::Nak(NakCode::RemoteAccess))?;
        let op = if pkt.headers.bth.opcode == self.wire_opcode(Opcode::RC_COMPARE_SWAP) {
            Atomic::CompareSwap { compare: a.compare, swap: a.swap_add }
        } else {
            Atomic::FetchAdd(a.swap_add)
        };
        let p = pkt.headers.bth.psn;
        let fp = Fingerprint { site: Site::Atomic, psn: p, len: 8, addr: a.va };
        let orig = match ctx.copy.atomic(ctx.mem, fp, span, op) {
            Ok(orig) => orig,
            Err(CopyError::Deferred) => return Err(Refuse::Defer),
            Err(CopyError::Access(_)) => return Err(Refuse::Nak(NakCode::RemoteAccess)),
        };
        self.add_resource(RdResource { first_psn: p, last_psn: p, kind: RdKind::Atomic { orig } });
        self.resp.msn = psn::add(self.resp.msn, 1);
        self.resp.out.push_back(Out::AtomicAck { psn: p, orig });
        self.resp.epsn = psn::add(p, 1);
        Ok(())
    }

    /// RDMA ATOMIC WRITE (IBA A19), checked in rxe's order: a responder
    /// resource, the key and range for remote write, a length of 8, then an
    /// 8-byte-aligned address. The payload is stored as one.
    fn exec_atomic_write(&mut self, ctx: &mut Ctx, pkt: &Packet) -> Result<(), Refuse> {
        let reth = pkt.headers.reth.expect("ATOMIC WRITE carries a RETH");
        if self.resp.max_resources == 0 {
            return Err(Refuse::Nak(NakCode::InvalidRequest));
        }
        let span = ctx
            .mem
            .resolve_remote(reth.rkey, self.remote_pd(), self.qpn, reth.va, reth.dma_len as u64, Want::RemoteWrite)
            .map_err(|_| Refuse::Nak(NakCode::RemoteAccess))?;
        let value: [u8; 8] = match pkt.payload.try_into() {
            Ok(v) if reth.dma_len == 8 => v,
            _ => return Err(Refuse::Nak(NakCode::InvalidRequest)),
        };
        if reth.va % 8 != 0 {
            return Err(Refuse::Nak(NakCode::InvalidRequest));
        }
        // The bytes land as they came (rxe stores the payload's u64).
        let p = pkt.headers.bth.psn;
        let fp = Fingerprint { site: Site::Atomic, psn: p, len: 8, addr: reth.va };
        match ctx.copy.atomic(ctx.mem, fp, span, Atomic::Store(u64::from_ne_bytes(value))) {
            Ok(_) => {}
            Err(CopyError::Deferred) => return Err(Refuse::Defer),
            Err(CopyError::Access(_)) => return Err(Refuse::Nak(NakCode::RemoteAccess)),
        }
        self.add_resource(RdResource { first_psn: p, last_psn: p, kind: RdKind::AtomicWrite });
        self.resp.msn = psn::add(self.resp.msn, 1);
        self.resp.out.push_back(Out::EmptyReadResponse { psn: p });
        self.resp.epsn = psn::add(p, 1);
        Ok(())
    }

    fn add_resource(&mut self, r: RdResource) {
        if self.resp.resources.len() >= self.resp.max_resources.max(1) {
            self.resp.resources.pop_front();
        }
        self.resp.resources.push_back(r);
    }

    /// A request with a PSN older than expected.
    fn on_duplicate(&mut self, ctx: &mut Ctx, pkt: &Packet, flags: F) {
        let p = pkt.headers.bth.psn;
        if !self.qp_type.is_reliable() {
            return;
        }
        if flags.intersects(F::SEND | F::WRITE) {
            let last = psn::add(self.resp.epsn, psn::PSN_MASK);
            let msn = self.resp.msn;
            self.resp.push_ack(last, Aeth::ack(msn));
            ctx.mark_ready(self.qpn);
            return;
        }
        let Some(res) =
            self.resp.resources.iter().rev().find(|r| psn::le(r.first_psn, p) && psn::le(p, r.last_psn)).copied()
        else {
            return;
        };
        match (res.kind, flags.contains(F::READ)) {
            (RdKind::Read, true) => {
                let reth = pkt.headers.reth.expect("READ carries a RETH");
                let len = reth.dma_len as u64;
                let pd = match self.qp_type {
                    QpType::XrcRecv => match self.xrc_srq(ctx, pkt) {
                        Some(srq) => srq.pd,
                        None => return,
                    },
                    _ => self.pd,
                };
                if ctx.mem.resolve_remote(reth.rkey, pd, self.qpn, reth.va, len, Want::RemoteRead).is_err() {
                    return;
                }
                // Replace a replay of the same READ still queued.
                self.resp.out.retain(|o| !matches!(o, Out::Read(j) if j.start_psn == p));
                self.resp.out.push_back(Out::Read(ReadJob {
                    start_psn: p,
                    psn: p,
                    va: reth.va,
                    pd,
                    rkey: reth.rkey,
                    len,
                    off: 0,
                }));
            }
            (RdKind::Atomic { orig }, false) if flags.contains(F::ATOMIC) && res.first_psn == p => {
                self.resp.out.push_back(Out::AtomicAck { psn: p, orig });
            }
            (RdKind::AtomicWrite, false) if flags.contains(F::ATOMIC_WRITE) && res.first_psn == p => {
                self.resp.out.push_back(Out::EmptyReadResponse { psn: p });
            }
            _ => return,
        }
        ctx.mark_ready(self.qpn);
    }

    /// Handles a UD request packet: `ip` is its IP and UDP facts (IPv4 ID
    /// included), `udp_len` its UDP payload's length.
    pub(crate) fn on_ud(&mut self, ctx: &mut Ctx, pkt: &Packet, ip: &IpInfo, udp_len: usize) {
        if !matches!(self.attr.qp_state, QpState::Rtr | QpState::Rts | QpState::Sqd) {
            ctx.stats.rx_drop_state += 1;
            return;
        }
        let Some(deth) = pkt.headers.deth else { return };
        if deth.qkey != self.attr.qkey {
            ctx.stats.rx_drop_qkey += 1;
            return;
        }
        if pkt.payload.len() > ctx.cfg.mtu.bytes() as usize {
            ctx.stats.rx_drop_malformed += 1;
            return;
        }
        let Some(wqe) = self.take_recv(ctx) else {
            ctx.stats.rx_drop_no_recv += 1;
            return;
        };
        let total = (GRH_LEN + pkt.payload.len()) as u64;
        let mut wc = Wc::new(wqe.wr_id, WcStatus::Success, WcOpcode::Recv, self.qpn);
        if total > sge_total(&wqe.sges) {
            wc.status = WcStatus::LocLenErr;
            self.deliver_recv(ctx, wc, false);
            return;
        }
        // The GRH area as mlx5 fills it: for IPv4 only its last 20 bytes
        // (the first 20 keep what the buffer held), for IPv6 all 40.
        let (g, sl) = grh(ip, udp_len);
        let from = match ip.src {
            IpAddr::V4(_) => GRH_LEN - 20,
            IpAddr::V6(_) => 0,
        };
        let (head, payload) = (&g[from..], pkt.payload);
        let pd = self.recv_pd();
        let mem = ctx.mem;
        let fp = Fingerprint { site: Site::UdRecv, psn: pkt.headers.bth.psn, len: total, addr: wqe.wr_id };
        let r = sge_spans(mem, pd, &wqe.sges, from as u64, total - from as u64, Want::LocalWrite).map_err(CopyError::from);
        let r = r.and_then(|spans| {
            if ctx.copy.wants_job(mem, fp, &spans) {
                // The header bytes and the payload, as one message for a copy job.
                let mut bytes = Vec::with_capacity(head.len() + payload.len());
                bytes.extend_from_slice(head);
                bytes.extend_from_slice(payload);
                return ctx.copy.write(mem, fp, spans, &bytes);
            }
            // One pass over the buffer from `from`: the header bytes, then
            // the payload.
            let mut at = 0;
            for s in &spans {
                let n = s.len();
                let k = head.len().saturating_sub(at).min(n);
                if k > 0 {
                    mem.write(s, 0, &head[at..at + k])?;
                }
                if k < n {
                    let p = at + k - head.len();
                    mem.write(s, k, &payload[p..p + n - k])?;
                }
                at += n;
            }
            Ok(())
        });
        if r == Err(CopyError::Deferred) {
            // The WQE waits with the packet for its second run.
            self.parked_recv = Some(wqe);
            return;
        }
        if r.is_err() {
            wc.status = WcStatus::LocProtErr;
            self.deliver_recv(ctx, wc, false);
            return;
        }
        wc.byte_len = total as u32;
        wc.src_qp = deth.src_qp;
        wc.wc_flags = WcFlags::GRH;
        wc.sl = sl;
        if let Some(imm) = pkt.headers.imm {
            wc.imm_data = imm;
            wc.wc_flags |= WcFlags::WITH_IMM;
        }
        self.deliver_recv(ctx, wc, pkt.headers.bth.solicited);
    }

    /// The next response packet (ACK, NAK, READ response, atomic ACK).
    pub(crate) fn poll_response(&mut self, ctx: &mut Ctx) -> Option<Transmit> {
        let dst = self.attr.ah_attr.dgid.to_ip();
        if self.resp.has_out() {
            // Nothing queued waits behind a held ACK: it goes first.
            self.resp.release_held_ack();
        }
        loop {
            let out = self.resp.out.pop_front()?;
            let (psn, opcode, aeth, atomic_ack, job) = match out {
                Out::Ack { psn, aeth } => (psn, Opcode::RC_ACK, Some(aeth), None, None),
                Out::AtomicAck { psn, orig } => {
                    (psn, Opcode::RC_ATOMIC_ACK, Some(Aeth::ack(self.resp.msn)), Some(orig), None)
                }
                Out::EmptyReadResponse { psn } => {
                    (psn, Opcode::RC_READ_RESPONSE_ONLY, Some(Aeth::ack(self.resp.msn)), None, None)
                }
                Out::Read(j) => {
                    if self.attr.qp_state == QpState::Err {
                        continue;
                    }
                    let mtu = self.mtu() as u64;
                    let only = j.len <= mtu;
                    let last = j.off + mtu >= j.len;
                    let op = match (only, j.off == 0, last) {
                        (true, _, _) => Opcode::RC_READ_RESPONSE_ONLY,
                        (false, true, _) => Opcode::RC_READ_RESPONSE_FIRST,
                        (false, false, true) => Opcode::RC_READ_RESPONSE_LAST,
                        _ => Opcode::RC_READ_RESPONSE_MIDDLE,
                    };
                    let aeth = (op != Opcode::RC_READ_RESPONSE_MIDDLE).then(|| Aeth::ack(self.resp.msn));
                    (j.psn, op, aeth, None, Some(j))
                }
            };
            let mut h = self.response_headers(opcode, psn);
            h.aeth = aeth;
            h.atomic_ack = atomic_ack;
            let Some(j) = job else {
                let t = ctx.build(dst, &h, 0, |_| Ok::<(), std::convert::Infallible>(())).ok();
                if aeth.is_some_and(|a| matches!(a.kind(), AethKind::Nak(_))) {
                    if let Some(ev) = self.resp.failing.take() {
                        self.fail(ctx, Some(ev));
                    }
                }
                return t;
            };
            let mtu = self.mtu() as u64;
            let chunk = (j.len - j.off).min(mtu);
            let qpn = self.qpn;
            let mem = ctx.mem;
            let fp = Fingerprint { site: Site::ReadResponse, psn: j.psn, len: chunk, addr: j.va + j.off };
            // Re-validated per packet, as rxe's rxe_recheck_mr.
            let built = mem
                .resolve_remote(j.rkey, j.pd, qpn, j.va + j.off, chunk, Want::RemoteRead)
                .map_err(CopyError::from)
                .and_then(|span| ctx.build_from(dst, &h, span, fp));
            match built {
                Err(CopyError::Deferred) => {
                    // A copy job reads it, and faults in the rest of the
                    // READ; this packet is built again then.
                    let rest = (j.len - j.off - chunk).min(AHEAD_MAX);
                    if rest > 0 {
                        let va = j.va + j.off + chunk;
                        if let Ok(s) = mem.resolve_remote(j.rkey, j.pd, qpn, va, rest, Want::RemoteRead) {
                            ctx.copy.ahead(s, false);
                        }
                    }
                    self.resp.out.push_front(Out::Read(j));
                    return None;
                }
                Ok(t) => {
                    if j.off + chunk < j.len {
                        let next = ReadJob { psn: psn::add(j.psn, 1), off: j.off + chunk, ..j };
                        self.resp.out.push_front(Out::Read(next));
                    }
                    return Some(t);
                }
                Err(_) => {
                    // The region was invalidated during the READ.
                    let msn = self.resp.msn;
                    self.resp.out.push_front(Out::Ack { psn: j.psn, aeth: Aeth::nak(NakCode::RemoteAccess, msn) });
                    self.fail(ctx, Some(AsyncEventType::QpAccessErr));
                }
            }
        }
    }
}

/// `wc.sl` of a RoCE v2 UD receive as mlx5 reports it: the CQE's packet
/// type, bit 3 "has a UDP header" (RoCE v2) and bits 2:0 the L3 header
/// (2 IPv4, 1 IPv6). UCX 1.13 reads `sl & 7 == 2` as IPv4.
pub const SL_ROCE_V2_IPV4: u8 = 0x8 | 0x2;
/// See [`SL_ROCE_V2_IPV4`].
pub const SL_ROCE_V2_IPV6: u8 = 0x8 | 0x1;

/// The 40-byte GRH area of a UD receive as mlx5 fills it for RoCE v2, and
/// the `wc.sl` that goes with it. IPv4: the IPv4 header in the last 20
/// bytes (the first 20 are the caller's to leave alone: mlx5 does not write
/// them, rxe zeroes them); IPv6: the IPv6 header. Fields a UDP socket
/// cannot see are written as uroce sends them: TOS / traffic class 0, flow
/// label 0, TTL / hop limit 64. The IPv4 ID is the one the ICRC matched
/// and the header checksum is valid, so that `ibv_init_ah_from_wc` (which
/// believes an IPv4 header whose checksum holds) reads it as IPv4 whatever
/// the first 20 bytes hold.
pub fn grh(ip: &IpInfo, udp_len: usize) -> ([u8; GRH_LEN], u8) {
    let mut g = [0u8; GRH_LEN];
    let udp_len = (8 + udp_len) as u16;
    match (ip.src, ip.dst) {
        (IpAddr::V4(s), IpAddr::V4(d)) => {
            let h = &mut g[20..];
            h[0] = 0x45;
            h[2..4].copy_from_slice(&(20 + udp_len).to_be_bytes());
            h[4..6].copy_from_slice(&ip.ipv4_id.to_be_bytes());
            h[6] = 0x40; // DF
            h[8] = 64;
            h[9] = 17;
            h[12..16].copy_from_slice(&s.octets());
            h[16..20].copy_from_slice(&d.octets());
            let sum = h.chunks(2).fold(0u32, |a, w| a + u16::from_be_bytes([w[0], w[1]]) as u32);
            let sum = (sum & 0xFFFF) + (sum >> 16);
            let sum = (sum & 0xFFFF) + (sum >> 16);
            h[10..12].copy_from_slice(&(!(sum as u16)).to_be_bytes());
            (g, SL_ROCE_V2_IPV4)
        }
        (s, d) => {
            let to6 = |a: IpAddr| match a {
                IpAddr::V4(v) => v.to_ipv6_mapped(),
                IpAddr::V6(v) => v,
            };
            g[0] = 0x60;
            g[4..6].copy_from_slice(&udp_len.to_be_bytes());
            g[6] = 17;
            g[7] = 64;
            g[8..24].copy_from_slice(&to6(s).octets());
            g[24..40].copy_from_slice(&to6(d).octets());
            (g, SL_ROCE_V2_IPV6)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The IPv4 header a uroce sender's packet had on the wire (TOS 0, TTL
    /// 64, DF, the ID the ICRC matched), with a checksum that holds; the
    /// IPv6 header with the UDP length; `sl` says which.
    #[test]
    fn ipv4_grh_is_the_wire_header_with_a_valid_checksum() {
        // 10.0.0.7 -> 10.0.0.8, ID 0x1234, UDP payload 1052 bytes.
        let ip = IpInfo {
            src: "10.0.0.7".parse().unwrap(),
            dst: "10.0.0.8".parse().unwrap(),
            sport: 49152,
            dport: 4791,
            ipv4_id: 0x1234,
        };
        let (g, sl) = grh(&ip, 1052);
        assert_eq!((sl, sl & 7), (0xA, 2));
        assert_eq!(g[..20], [0u8; 20]);
        let h = &g[20..];
        assert_eq!(h[..10], [0x45, 0, 0x04, 0x38, 0x12, 0x34, 0x40, 0, 64, 17]);
        assert_eq!(h[12..], [10, 0, 0, 7, 10, 0, 0, 8]);
        let sum = h.chunks(2).fold(0u32, |a, w| a + u16::from_be_bytes([w[0], w[1]]) as u32);
        assert_eq!((sum & 0xFFFF) + (sum >> 16), 0xFFFF, "a header whose checksum holds sums to all ones");
        let (g6, sl6) = grh(&IpInfo { src: "fd00::1".parse().unwrap(), dst: "fd00::2".parse().unwrap(), ..ip }, 1052);
        assert_eq!((sl6, sl6 & 7), (0x9, 1));
        assert_eq!(g6[..8], [0x60, 0, 0, 0, 0x04, 0x24, 17, 64]);
    }
}
