//! A queue pair: its attributes, its state machine (`ibv_modify_qp` with the
//! required/optional attribute masks of the IBA, as the kernel's
//! `ib_modify_qp_is_ok` checks them), its queues, and the glue that the
//! requester, completer and responder (sibling modules, each an `impl Qp`
//! block) share: completions, flushing, and moving to the error state.
//!
//! The XRC halves are queue pairs without some parts: an XRC_SEND QP has no
//! receive queue or receive CQ, an XRC_RECV QP no PD, queues or CQs; its
//! receives come from, and complete on, the XRC SRQ each request names.

use super::cq::{CompletionQueue, InlineRecv, Pushed};
use super::srq::{RecvWqe, SharedRecvQueue};
use super::wr::{QpAttr, QpCap, RecvWr, SendWr, WrOpcode};
use super::{AsyncEvent, Ctx, Event};
use crate::ib::{
    Access, AsyncEventType, Error, Mtu, QpAttrMask as M, QpState, QpType, Result, SendFlags, Wc, WcOpcode, WcStatus,
};
use crate::wire::Opcode;
use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Instant;

/// Creation parameters of a queue pair (`ibv_qp_init_attr`).
#[derive(Debug, Clone)]
pub struct QpInit {
    pub qp_type: QpType,
    pub pd: u32,
    pub send_cq: Arc<CompletionQueue>,
    pub recv_cq: Arc<CompletionQueue>,
    pub srq: Option<Arc<SharedRecvQueue>>,
    pub cap: QpCap,
    pub sq_sig_all: bool,
    /// Small received messages travel in their completions (see `cq`).
    pub scatter_to_cqe: bool,
}

/// Device limits a QP is created against.
pub const MAX_QP_WR: u32 = 16384;
pub const MAX_SGE: u32 = 32;
/// Inline bytes a send WQE may carry (mlx5 RC QPs offer several hundred;
/// pyverbs' mkey tests ask 512 for inline UMR translation entries).
pub const MAX_INLINE: u32 = 1024;
pub const MAX_MSG_SIZE: u64 = 1 << 31;

/// A posted send WQE with its transport progress.
#[derive(Debug)]
pub(crate) struct SendWqe {
    pub wr: SendWr,
    /// Message length in bytes.
    pub len: u64,
    pub signaled: bool,
    /// PSNs assigned when the WQE is first transmitted.
    pub started: bool,
    pub first_psn: u32,
    pub last_psn: u32,
    /// It failed locally (its status) while older requests were still
    /// unacknowledged: it completes with that status once they have
    /// completed, as send completions come in posting order.
    pub failed: Option<WcStatus>,
}

impl SendWqe {
    pub fn wc_opcode(&self) -> WcOpcode {
        match self.wr.opcode {
            WrOpcode::RdmaWrite | WrOpcode::RdmaWriteImm => WcOpcode::RdmaWrite,
            WrOpcode::Send | WrOpcode::SendImm | WrOpcode::SendInv => WcOpcode::Send,
            WrOpcode::RdmaRead => WcOpcode::RdmaRead,
            WrOpcode::AtomicCmpSwp => WcOpcode::CompSwap,
            WrOpcode::AtomicFetchAdd => WcOpcode::FetchAdd,
            WrOpcode::LocalInv => WcOpcode::LocalInv,
            WrOpcode::BindMw => WcOpcode::BindMw,
            WrOpcode::Umr => WcOpcode::Umr,
            WrOpcode::AtomicWrite => WcOpcode::AtomicWrite,
        }
    }
}

pub struct Qp {
    pub qpn: u32,
    pub qp_type: QpType,
    /// The protection domain (0 for an XRC_RECV QP, which has none).
    pub pd: u32,
    /// None for an XRC_RECV QP.
    pub send_cq: Option<Arc<CompletionQueue>>,
    /// None for both XRC halves.
    pub recv_cq: Option<Arc<CompletionQueue>>,
    pub srq: Option<Arc<SharedRecvQueue>>,
    /// The XRC domain of an XRC_RECV QP.
    pub xrcd: Option<u32>,
    pub cap: QpCap,
    pub sq_sig_all: bool,
    pub scatter_to_cqe: bool,
    pub attr: QpAttr,
    pub(crate) sq: VecDeque<SendWqe>,
    pub(crate) rq: VecDeque<RecvWqe>,
    pub(crate) req: super::requester_state::Requester,
    pub(crate) resp: super::responder_state::Responder,
    /// In the engine's list of QPs with something to send.
    pub(crate) queued: bool,
    /// The engine's timer-heap entry of this QP: its deadline and
    /// generation (an entry with another generation is stale).
    pub(crate) timer_key: Option<(Instant, u64)>,
    /// SQD: the drained event is pending.
    pub(crate) sqd_notify_pending: bool,
    /// Unreliable sends' completions that wait for packets to reach the
    /// kernel (see [`super::AfterSend`]); made by the first packet an
    /// unreliable QP sends in place (boxed: other QPs pay one word).
    pub(crate) after_send: Option<Box<super::requester_state::AfterSendState>>,
    /// A receive WQE taken by a packet that then waited for a copy job
    /// (`proto::copy`): that packet's, when it runs again.
    pub(crate) parked_recv: Option<RecvWqe>,
}

impl std::fmt::Debug for Qp {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Qp")
            .field("qpn", &self.qpn)
            .field("type", &self.qp_type)
            .field("state", &self.attr.qp_state)
            .finish_non_exhaustive()
    }
}

impl Qp {
    pub fn new(qpn: u32, init: QpInit) -> Result<Qp> {
        let c = init.cap;
        if c.max_send_wr > MAX_QP_WR || c.max_recv_wr > MAX_QP_WR {
            return Err(Error::inval("create_qp: max_send_wr/max_recv_wr above device limit"));
        }
        if c.max_send_sge > MAX_SGE || c.max_recv_sge > MAX_SGE {
            return Err(Error::inval("create_qp: max_sge above device limit"));
        }
        if c.max_inline_data > MAX_INLINE {
            return Err(Error::inval("create_qp: max_inline_data above device limit"));
        }
        if let Some(srq) = &init.srq {
            if srq.pd != init.pd && init.qp_type != QpType::Ud {
                // rxe accepts an SRQ of another PD; the IBA does too (buffers are
                // checked against the SRQ's PD).
            }
        }
        if init.qp_type == QpType::XrcRecv {
            return Err(Error::inval("create_qp: an XRC_RECV QP is created in an XRC domain"));
        }
        // An XRC initiator has no receive side: its receive CQ, SRQ and
        // receive capacities are ignored, as the kernel's ib_create_qp does.
        let xrc_send = init.qp_type == QpType::XrcSend;
        if !xrc_send && init.srq.as_ref().is_some_and(|s| s.xrc.is_some()) {
            return Err(Error::inval("create_qp: an XRC SRQ serves XRC_RECV QPs only"));
        }
        // As rxe (`rxe_qp_init_req`): a send WQE has room for max_send_sge
        // SGEs of 16 bytes or the inline data, whichever is larger, and
        // inline data may fill that room; the QP reports the rounded limit
        // (create_qp's caps, ibv_query_qp). mlx5 rounds up to its WQE too.
        let c = QpCap { max_inline_data: c.max_inline_data.max(c.max_send_sge * 16).min(MAX_INLINE), ..c };
        let cap = if xrc_send { QpCap { max_recv_wr: 0, max_recv_sge: 0, ..c } } else { c };
        Ok(Qp {
            qpn,
            qp_type: init.qp_type,
            pd: init.pd,
            send_cq: Some(init.send_cq),
            recv_cq: (!xrc_send).then_some(init.recv_cq),
            srq: init.srq.filter(|_| !xrc_send),
            xrcd: None,
            cap,
            sq_sig_all: init.sq_sig_all,
            scatter_to_cqe: init.scatter_to_cqe,
            attr: QpAttr::default(),
            sq: VecDeque::new(),
            rq: VecDeque::new(),
            req: Default::default(),
            resp: Default::default(),
            queued: false,
            timer_key: None,
            sqd_notify_pending: false,
            after_send: None,
            parked_recv: None,
        })
    }

    /// An XRC_RECV QP of XRC domain `xrcd` (`ibv_create_qp_ex` with
    /// IBV_QP_INIT_ATTR_XRCD).
    pub fn new_xrc_recv(qpn: u32, xrcd: u32, scatter_to_cqe: bool) -> Qp {
        Qp {
            qpn,
            qp_type: QpType::XrcRecv,
            pd: 0,
            send_cq: None,
            recv_cq: None,
            srq: None,
            xrcd: Some(xrcd),
            cap: QpCap::default(),
            sq_sig_all: false,
            scatter_to_cqe,
            attr: QpAttr::default(),
            sq: VecDeque::new(),
            rq: VecDeque::new(),
            req: Default::default(),
            resp: Default::default(),
            queued: false,
            timer_key: None,
            sqd_notify_pending: false,
            after_send: None,
            parked_recv: None,
        }
    }

    pub fn state(&self) -> QpState {
        self.attr.qp_state
    }

    pub fn mtu(&self) -> u32 {
        self.attr.path_mtu.bytes()
    }

    /// `ibv_modify_qp`.
    pub(crate) fn modify(&mut self, ctx: &mut Ctx, a: &QpAttr, mask: M) -> Result<()> {
        let cur = self.attr.qp_state;
        if mask.contains(M::CUR_STATE) && a.cur_qp_state != cur {
            return Err(Error::inval("modify_qp: cur_qp_state does not match"));
        }
        let next = if mask.contains(M::STATE) { a.qp_state } else { cur };
        let Some((required, optional)) = transition(self.qp_type, cur, next) else {
            return Err(Error::inval(format!("modify_qp: invalid transition {cur:?} -> {next:?}")));
        };
        let given = mask - M::STATE;
        if !given.contains(required) {
            return Err(Error::inval(format!(
                "modify_qp {cur:?} -> {next:?}: missing required attributes {:?}",
                required - given
            )));
        }
        if !(required | optional).contains(given) {
            return Err(Error::inval(format!(
                "modify_qp {cur:?} -> {next:?}: attributes not allowed {:?}",
                given - required - optional
            )));
        }
        self.check_values(ctx, a, mask)?;

        // Apply.
        let t = &mut self.attr;
        if mask.contains(M::ACCESS_FLAGS) {
            t.qp_access_flags = a.qp_access_flags;
        }
        if mask.contains(M::PKEY_INDEX) {
            t.pkey_index = a.pkey_index;
        }
        if mask.contains(M::PORT) {
            t.port_num = a.port_num;
        }
        if mask.contains(M::QKEY) {
            t.qkey = a.qkey;
        }
        if mask.contains(M::AV) {
            t.ah_attr = a.ah_attr;
        }
        if mask.contains(M::PATH_MTU) {
            t.path_mtu = a.path_mtu;
        }
        if mask.contains(M::TIMEOUT) {
            t.timeout = a.timeout;
        }
        if mask.contains(M::RETRY_CNT) {
            t.retry_cnt = a.retry_cnt;
        }
        if mask.contains(M::RNR_RETRY) {
            t.rnr_retry = a.rnr_retry;
        }
        if mask.contains(M::RQ_PSN) {
            t.rq_psn = a.rq_psn & super::psn::PSN_MASK;
        }
        if mask.contains(M::MAX_QP_RD_ATOMIC) {
            t.max_rd_atomic = a.max_rd_atomic;
        }
        if mask.contains(M::MIN_RNR_TIMER) {
            t.min_rnr_timer = a.min_rnr_timer;
        }
        if mask.contains(M::SQ_PSN) {
            t.sq_psn = a.sq_psn & super::psn::PSN_MASK;
        }
        if mask.contains(M::MAX_DEST_RD_ATOMIC) {
            t.max_dest_rd_atomic = a.max_dest_rd_atomic;
        }
        if mask.contains(M::DEST_QPN) {
            t.dest_qp_num = a.dest_qp_num & super::psn::PSN_MASK;
        }
        if mask.contains(M::EN_SQD_ASYNC_NOTIFY) {
            t.en_sqd_async_notify = a.en_sqd_async_notify;
        }

        if next != cur || mask.contains(M::STATE) {
            self.enter(ctx, cur, next, mask);
        }
        Ok(())
    }

    fn check_values(&self, ctx: &Ctx, a: &QpAttr, mask: M) -> Result<()> {
        if mask.contains(M::PORT) && a.port_num != 1 {
            return Err(Error::inval("modify_qp: port_num must be 1"));
        }
        if mask.contains(M::PKEY_INDEX) && a.pkey_index != 0 {
            return Err(Error::inval("modify_qp: pkey_index out of range (table has 1 entry)"));
        }
        if mask.contains(M::TIMEOUT) && a.timeout > 31 {
            return Err(Error::inval("modify_qp: timeout > 31"));
        }
        if mask.contains(M::RETRY_CNT) && a.retry_cnt > 7 {
            return Err(Error::inval("modify_qp: retry_cnt > 7"));
        }
        if mask.contains(M::RNR_RETRY) && a.rnr_retry > 7 {
            return Err(Error::inval("modify_qp: rnr_retry > 7"));
        }
        if mask.contains(M::MIN_RNR_TIMER) && a.min_rnr_timer > 31 {
            return Err(Error::inval("modify_qp: min_rnr_timer > 31"));
        }
        if mask.contains(M::MAX_QP_RD_ATOMIC) && a.max_rd_atomic as u32 > crate::ib::MAX_RD_ATOMIC {
            return Err(Error::inval("modify_qp: max_rd_atomic above device limit"));
        }
        if mask.contains(M::MAX_DEST_RD_ATOMIC) && a.max_dest_rd_atomic as u32 > crate::ib::MAX_RD_ATOMIC {
            return Err(Error::inval("modify_qp: max_dest_rd_atomic above device limit"));
        }
        if mask.contains(M::AV) {
            let av = &a.ah_attr;
            if !av.is_global || av.dgid.is_zero() {
                return Err(Error::inval("modify_qp: RoCE address vectors need a GRH with a destination GID"));
            }
            if let Some(e) = crate::ib::check_sgid_index(av.sgid_index.into(), ctx.cfg.gids.len(), "modify_qp") {
                return Err(e);
            }
            if av.port_num > 1 {
                return Err(Error::inval("modify_qp: ah_attr.port_num must be 1"));
            }
        }
        // Region-only bits (ON_DEMAND, ZERO_BASED, …) are accepted and
        // ignored, as rxe and mlx5 do (pyverbs' ODP tests pass them).
        if mask.contains(M::ACCESS_FLAGS) && !Access::all().contains(a.qp_access_flags) {
            return Err(Error::inval("modify_qp: unknown qp_access_flags"));
        }
        if mask.contains(M::QKEY) && self.qp_type == QpType::Rc {
            return Err(Error::inval("modify_qp: qkey on an RC QP"));
        }
        if mask.contains(M::CAP) {
            return Err(Error::inval("modify_qp: resizing queues is not supported"));
        }
        let _ = Mtu::Mtu256;
        Ok(())
    }

    /// Effects of entering `next`.
    fn enter(&mut self, ctx: &mut Ctx, cur: QpState, next: QpState, mask: M) {
        self.attr.qp_state = next;
        match next {
            QpState::Reset => {
                self.sq.clear();
                self.rq.clear();
                self.parked_recv = None;
                self.req = Default::default();
                self.resp = Default::default();
                self.attr = QpAttr { port_num: 1, ..QpAttr::default() };
                // Completions not yet polled (flushes of the ERR state) go
                // away with the QP's state, as on mlx5 and rxe.
                for cq in self.send_cq.iter().chain(&self.recv_cq) {
                    cq.purge_qp(self.qpn);
                }
            }
            QpState::Init => {}
            QpState::Rtr => {
                if cur != QpState::Rtr {
                    self.resp.reset(self.attr.rq_psn, self.attr.max_dest_rd_atomic as usize);
                }
            }
            QpState::Rts => {
                if cur == QpState::Rtr || mask.contains(M::SQ_PSN) {
                    self.req.reset(self.attr.sq_psn, &self.attr);
                }
                ctx.mark_ready(self.qpn);
                self.sqd_notify_pending = false;
            }
            QpState::Sqd => {
                self.sqd_notify_pending = self.attr.en_sqd_async_notify;
                self.check_drained(ctx);
            }
            QpState::Sqe => {}
            QpState::Err => self.flush(ctx),
        }
    }

    /// Moves the QP to ERR after a fatal transport error, raising `event` if
    /// given, and flushes both queues.
    pub(crate) fn fail(&mut self, ctx: &mut Ctx, event: Option<AsyncEventType>) {
        if self.attr.qp_state == QpState::Err {
            return;
        }
        tracing::warn!(qpn = self.qpn, peer_qpn = self.attr.dest_qp_num, peer = %self.attr.ah_attr.dgid.to_ip(), ?event, "QP entering ERR");
        ctx.stats.qp_errors += 1;
        self.attr.qp_state = QpState::Err;
        if let Some(kind) = event {
            ctx.events.push_back(Event::Async(AsyncEvent::qp(kind, self.qpn)));
        }
        self.flush(ctx);
    }

    /// Completes every outstanding WQE with WR_FLUSH_ERR.
    pub(crate) fn flush(&mut self, ctx: &mut Ctx) {
        self.req.timer = None;
        self.req.rnr_timer = None;
        while let Some(w) = self.sq.pop_front() {
            let wc = Wc::new(w.wr.wr_id, WcStatus::WrFlushErr, w.wc_opcode(), self.qpn);
            self.deliver_send(ctx, wc);
        }
        // The receive a half-received SEND holds was posted before those
        // still queued: it completes first.
        for cur in [self.resp.take_current_recv(), self.parked_recv.take()].into_iter().flatten() {
            let wc = Wc::new(cur.wr_id, WcStatus::WrFlushErr, WcOpcode::Recv, self.qpn);
            self.deliver_recv(ctx, wc, false);
        }
        while let Some(r) = self.rq.pop_front() {
            let wc = Wc::new(r.wr_id, WcStatus::WrFlushErr, WcOpcode::Recv, self.qpn);
            self.deliver_recv(ctx, wc, false);
        }
        if self.srq.is_some() {
            ctx.events.push_back(Event::Async(AsyncEvent::qp(AsyncEventType::QpLastWqeReached, self.qpn)));
        }
        self.resp.drop_reads();
        // What was executed is acknowledged (an application that tears its
        // connection down moves the QP to ERR first).
        if self.resp.release_held_ack() {
            ctx.mark_ready(self.qpn);
        }
    }

    pub(crate) fn deliver_send(&mut self, ctx: &mut Ctx, wc: Wc) {
        // Behind completions that wait for a packet to reach the kernel:
        // wait with them, in order.
        if let Some(a) = self.after_send.as_deref_mut() {
            if let Some(&(seq, _)) = a.held.back() {
                a.held.push_back((seq, wc));
                return;
            }
        }
        // Only a QP with a send queue has send completions: it has a send CQ.
        // (Borrowed, not cloned: no reference count changes per completion.)
        if let Some(cq) = &self.send_cq {
            let (handle, pushed) = (cq.handle, cq.push(wc, false));
            self.pushed(ctx, handle, pushed);
        }
    }

    pub(crate) fn deliver_recv(&mut self, ctx: &mut Ctx, wc: Wc, solicited: bool) {
        if let Some(cq) = self.recv_cq_now() {
            self.deliver(ctx, &cq, wc, solicited);
        }
    }

    /// A receive completion carrying its (small) message.
    pub(crate) fn deliver_recv_inline(&mut self, ctx: &mut Ctx, wc: Wc, solicited: bool, inline: InlineRecv) {
        if let Some(cq) = self.recv_cq_now() {
            let len = inline.len as u64;
            let pushed = cq.push_inline(wc, solicited, inline);
            if matches!(pushed, Pushed::Stored { .. }) {
                ctx.stats.rx_inline_recvs += 1;
                ctx.stats.rx_inline_bytes += len;
            }
            self.pushed(ctx, cq.handle, pushed);
        }
    }

    /// The SRQ receives come from now: the XRC SRQ the current request
    /// named, else the QP's own SRQ.
    fn shared_rq(&self) -> Option<&Arc<SharedRecvQueue>> {
        self.resp.xrc_srq.as_ref().or(self.srq.as_ref())
    }

    /// Where receive completions go now: an XRC SRQ's CQ, else the QP's
    /// receive CQ.
    pub(crate) fn recv_cq_now(&self) -> Option<Arc<CompletionQueue>> {
        match self.shared_rq().and_then(|s| s.xrc.as_ref()) {
            Some(x) => Some(x.cq.clone()),
            None => self.recv_cq.clone(),
        }
    }

    /// The opcode of RC operation `rc` on this QP's transport.
    pub(crate) fn wire_opcode(&self, rc: Opcode) -> Opcode {
        match self.qp_type {
            QpType::Uc => rc.to_uc(),
            QpType::XrcSend | QpType::XrcRecv => rc.to_xrc(),
            QpType::Rc | QpType::Ud => rc,
        }
    }

    pub(crate) fn deliver(&mut self, ctx: &mut Ctx, cq: &CompletionQueue, wc: Wc, solicited: bool) {
        let pushed = cq.push(wc, solicited);
        self.pushed(ctx, cq.handle, pushed);
    }

    /// What a push to the CQ numbered `cq` did: its event, or the overrun's.
    fn pushed(&mut self, ctx: &mut Ctx, cq: u32, pushed: Pushed) {
        match pushed {
            Pushed::Stored { notify } => {
                if notify {
                    ctx.events.push_back(Event::CompletionNotify(cq));
                }
            }
            Pushed::Overrun => {
                tracing::warn!(qpn = self.qpn, cq, "completion queue overrun");
                ctx.events.push_back(Event::Async(AsyncEvent::cq(AsyncEventType::CqErr, cq)));
                if self.attr.qp_state != QpState::Err {
                    self.attr.qp_state = QpState::Err;
                    ctx.events.push_back(Event::Async(AsyncEvent::qp(AsyncEventType::QpFatal, self.qpn)));
                }
            }
        }
    }

    /// `ibv_post_send` checks, then queues the WQE.
    pub(crate) fn post_send(&mut self, ctx: &mut Ctx, wr: SendWr) -> Result<()> {
        use crate::ib::Errno;
        if self.send_cq.is_none() {
            return Err(Error::inval("post_send: an XRC_RECV QP has no send queue"));
        }
        let state = self.attr.qp_state;
        if matches!(state, QpState::Reset | QpState::Init | QpState::Rtr) {
            return Err(Error::inval("post_send: QP is not in RTS"));
        }
        if wr.sg_list.len() > self.cap.max_send_sge as usize && wr.inline.is_none() {
            return Err(Error::inval("post_send: num_sge above max_send_sge"));
        }
        if self.sq.len() >= self.cap.max_send_wr as usize {
            return Err(Error::new(Errno::ENOMEM, "post_send: send queue full"));
        }
        let allowed = wr.opcode.allowed_on(self.qp_type);
        if !allowed {
            return Err(Error::inval(format!("post_send: {:?} not supported on {:?}", wr.opcode, self.qp_type)));
        }
        let len = match &wr.inline {
            // An ATOMIC WRITE's 8 bytes travel in the WQE itself (rxe's
            // `dma.atomic_wr`), whatever max_inline_data is.
            Some(d) if d.len() > self.cap.max_inline_data as usize && wr.opcode != WrOpcode::AtomicWrite => {
                return Err(Error::inval("post_send: inline data above max_inline_data"));
            }
            Some(d) => d.len() as u64,
            None => crate::mem::sge_total(&wr.sg_list),
        };
        if wr.opcode == WrOpcode::BindMw && wr.bind.is_none() {
            return Err(Error::inval("post_send: BIND_MW without bind information"));
        }
        if wr.opcode == WrOpcode::Umr {
            let umr = wr.umr.as_ref().ok_or_else(|| Error::inval("post_send: UMR without a layout"))?;
            if self.qp_type != QpType::Rc {
                return Err(Error::new(crate::ib::Errno::EOPNOTSUPP, "post_send: UMR needs an RC QP"));
            }
            umr.layout.validate(crate::mem::MAX_INDIRECT_ENTRIES)?;
        }
        if wr.opcode.is_atomic() {
            if len != 8 || wr.inline.is_some() {
                return Err(Error::inval("post_send: atomic needs one 8-byte SGE"));
            }
            if wr.remote_addr % 8 != 0 {
                return Err(Error::inval("post_send: atomic remote address not 8-byte aligned"));
            }
        }
        // The responder checks an ATOMIC WRITE's alignment (NAK invalid
        // request), as rxe; its length is what it is.
        if wr.opcode == WrOpcode::AtomicWrite && len != 8 {
            return Err(Error::inval("post_send: ATOMIC WRITE writes 8 bytes"));
        }
        if len > MAX_MSG_SIZE {
            return Err(Error::inval("post_send: message larger than max_msg_sz"));
        }
        if self.qp_type == QpType::Ud {
            if wr.ud.is_none() {
                return Err(Error::inval("post_send: UD send without address handle"));
            }
            if len > ctx.cfg.mtu.bytes() as u64 {
                return Err(Error::inval("post_send: UD message larger than the port MTU"));
            }
        }
        let signaled = self.sq_sig_all || wr.flags.contains(SendFlags::SIGNALED);
        let wqe = SendWqe { wr, len, signaled, started: false, first_psn: 0, last_psn: 0, failed: None };
        if state == QpState::Err {
            let wc = Wc::new(wqe.wr.wr_id, WcStatus::WrFlushErr, wqe.wc_opcode(), self.qpn);
            self.deliver_send(ctx, wc);
            return Ok(());
        }
        self.sq.push_back(wqe);
        let timeout = self.attr.timeout;
        self.resp.ack.posted(ctx.now, || super::ack::ack_hold_limit(timeout));
        ctx.mark_ready(self.qpn);
        Ok(())
    }

    /// `ibv_post_recv` checks, then queues the WQE.
    pub(crate) fn post_recv(&mut self, ctx: &mut Ctx, wr: RecvWr) -> Result<()> {
        use crate::ib::Errno;
        if self.srq.is_some() || self.recv_cq.is_none() {
            return Err(Error::inval("post_recv: QP has no receive queue (it uses an SRQ, or is XRC)"));
        }
        if self.attr.qp_state == QpState::Reset {
            return Err(Error::inval("post_recv: QP is in RESET"));
        }
        if wr.sg_list.len() > self.cap.max_recv_sge as usize {
            return Err(Error::inval("post_recv: num_sge above max_recv_sge"));
        }
        if self.rq.len() >= self.cap.max_recv_wr as usize {
            return Err(Error::new(Errno::ENOMEM, "post_recv: receive queue full"));
        }
        if self.attr.qp_state == QpState::Err {
            let wc = Wc::new(wr.wr_id, WcStatus::WrFlushErr, WcOpcode::Recv, self.qpn);
            self.deliver_recv(ctx, wc, false);
            return Ok(());
        }
        self.rq.push_back(RecvWqe { wr_id: wr.wr_id, sges: wr.sg_list });
        Ok(())
    }

    /// Takes the next receive WQE from the SRQ or the RQ.
    pub(crate) fn take_recv(&mut self, ctx: &mut Ctx) -> Option<RecvWqe> {
        // The one a packet took before it waited for a copy job is its.
        if let Some(w) = self.parked_recv.take() {
            return Some(w);
        }
        match self.shared_rq() {
            Some(srq) => {
                let (w, fire) = srq.take();
                if fire {
                    ctx.events.push_back(Event::Async(AsyncEvent::srq(AsyncEventType::SrqLimitReached, srq.handle)));
                }
                w
            }
            None => self.rq.pop_front(),
        }
    }

    /// The PD receive buffers are checked against.
    pub(crate) fn recv_pd(&self) -> u32 {
        self.shared_rq().map_or(self.pd, |s| s.pd)
    }

    /// The PD the keys of incoming RDMA requests are checked against: an
    /// XRC target's is that of the XRC SRQ the request names (Annex A14).
    pub(crate) fn remote_pd(&self) -> u32 {
        self.resp.xrc_srq.as_ref().map_or(self.pd, |s| s.pd)
    }

    pub(crate) fn check_drained(&mut self, ctx: &mut Ctx) {
        if self.attr.qp_state == QpState::Sqd && self.sqd_notify_pending && self.sq.iter().all(|w| !w.started) {
            self.sqd_notify_pending = false;
            ctx.events.push_back(Event::Async(AsyncEvent::qp(AsyncEventType::SqDrained, self.qpn)));
        }
    }

    /// Removes the completed WQE at the head of the send queue, keeping the
    /// transmit cursor consistent: if the cursor was on it (re-sending it
    /// after a rewind), transmission continues at the next WQE and PSN.
    pub(crate) fn pop_head(&mut self) -> Option<SendWqe> {
        let w = self.sq.pop_front()?;
        if w.started && w.wr.opcode.uses_rd_atomic() {
            self.req.rd_atomic -= 1;
        }
        if self.req.cursor == 0 {
            self.req.cursor_off = 0;
            if w.started && !w.wr.opcode.is_local() {
                let next = super::psn::add(w.last_psn, 1);
                if super::psn::lt(self.req.psn, next) {
                    self.req.psn = next;
                }
            }
        } else {
            self.req.cursor -= 1;
        }
        Some(w)
    }

    /// A one-line summary of the transport state, for diagnostics.
    pub fn debug_state(&self) -> String {
        let sq: Vec<String> = self
            .sq
            .iter()
            .map(|w| {
                format!("{:?} len {} psn {}..{} started {}", w.wr.opcode, w.len, w.first_psn, w.last_psn, w.started)
            })
            .collect();
        format!(
            "state {:?} sq [{}] req.psn {} comp_psn {} cursor {}+{} rd_atomic {} retrying {} | {}",
            self.attr.qp_state,
            sq.join("; "),
            self.req.psn,
            self.req.comp_psn,
            self.req.cursor,
            self.req.cursor_off,
            self.req.rd_atomic,
            self.req.retrying,
            self.resp.debug_state()
        )
    }

    /// The earliest timer of this QP.
    pub(crate) fn next_timeout(&self) -> Option<Instant> {
        [self.req.timer, self.req.rnr_timer, self.resp.ack.due()].into_iter().flatten().min()
    }

    /// Hands a received packet (checked against this QP, counted) to the
    /// state machine it is for (`is_response`: its opcode's).
    #[inline]
    pub(crate) fn dispatch(
        &mut self,
        ctx: &mut Ctx,
        pkt: &crate::wire::Packet,
        is_response: bool,
        ip: &crate::wire::IpInfo,
        udp_len: usize,
    ) {
        match self.qp_type {
            QpType::Ud => self.on_ud(ctx, pkt, ip, udp_len),
            _ if is_response => self.on_response(ctx, pkt),
            _ => self.on_request(ctx, pkt),
        }
    }

    /// The next packet of this QP: responses first, then a request; after
    /// a request, the ACK held for it (see `proto::ack`) is queued to go
    /// next (`true`: the engine polls this QP again at once, so that the
    /// two leave together).
    pub(crate) fn poll_packet(&mut self, ctx: &mut Ctx) -> Option<(super::Transmit, bool)> {
        // (With nothing queued `poll_response` has nothing to do: skipped,
        // it costs nothing on a requester's packets.)
        if self.resp.has_out() {
            if let Some(t) = self.poll_response(ctx) {
                return Some((t, false));
            }
        }
        let t = self.poll_request(ctx)?;
        let ack_next = self.resp.release_held_ack();
        if ack_next {
            ctx.mark_ready(self.qpn);
        }
        Some((t, ack_next))
    }
}

/// The attributes `ibv_modify_qp` requires for a valid transition (empty
/// for an invalid one).
pub fn required_attributes(t: QpType, cur: QpState, next: QpState) -> M {
    transition(t, cur, next).map_or(M::empty(), |(required, _)| required)
}

/// Required and optional attributes of a transition, or None if invalid.
fn transition(t: QpType, cur: QpState, next: QpState) -> Option<(M, M)> {
    use QpState::*;
    use QpType::*;
    let none = M::empty();
    let rts_opt = |t| match t {
        Rc | XrcRecv => M::CUR_STATE | M::ACCESS_FLAGS | M::ALT_PATH | M::PATH_MIG_STATE | M::MIN_RNR_TIMER,
        Uc | XrcSend => M::CUR_STATE | M::ACCESS_FLAGS | M::ALT_PATH | M::PATH_MIG_STATE,
        Ud => M::CUR_STATE | M::QKEY,
    };
    Some(match (cur, next) {
        (_, Reset) | (_, Err) => (none, none),
        (Reset, Init) => match t {
            Ud => (M::PKEY_INDEX | M::PORT | M::QKEY, none),
            _ => (M::PKEY_INDEX | M::PORT | M::ACCESS_FLAGS, none),
        },
        (Init, Init) => match t {
            Ud => (none, M::PKEY_INDEX | M::PORT | M::QKEY),
            _ => (none, M::PKEY_INDEX | M::PORT | M::ACCESS_FLAGS),
        },
        (Init, Rtr) => match t {
            Rc | XrcRecv => (
                M::AV | M::PATH_MTU | M::DEST_QPN | M::RQ_PSN | M::MAX_DEST_RD_ATOMIC | M::MIN_RNR_TIMER,
                M::ALT_PATH | M::ACCESS_FLAGS | M::PKEY_INDEX,
            ),
            Uc | XrcSend => {
                (M::AV | M::PATH_MTU | M::DEST_QPN | M::RQ_PSN, M::ALT_PATH | M::ACCESS_FLAGS | M::PKEY_INDEX)
            }
            Ud => (none, M::PKEY_INDEX | M::QKEY),
        },
        (Rtr, Rts) => match t {
            Rc => (
                M::TIMEOUT | M::RETRY_CNT | M::RNR_RETRY | M::SQ_PSN | M::MAX_QP_RD_ATOMIC,
                M::CUR_STATE | M::ALT_PATH | M::ACCESS_FLAGS | M::MIN_RNR_TIMER | M::PATH_MIG_STATE,
            ),
            XrcSend => (
                M::TIMEOUT | M::RETRY_CNT | M::RNR_RETRY | M::SQ_PSN | M::MAX_QP_RD_ATOMIC,
                M::CUR_STATE | M::ALT_PATH | M::ACCESS_FLAGS | M::PATH_MIG_STATE,
            ),
            XrcRecv => (
                M::TIMEOUT | M::SQ_PSN,
                M::CUR_STATE | M::ALT_PATH | M::ACCESS_FLAGS | M::MIN_RNR_TIMER | M::PATH_MIG_STATE,
            ),
            Uc => (M::SQ_PSN, M::CUR_STATE | M::ALT_PATH | M::ACCESS_FLAGS | M::PATH_MIG_STATE),
            Ud => (M::SQ_PSN, M::CUR_STATE | M::QKEY),
        },
        (Rts, Rts) | (Sqd, Rts) => (none, rts_opt(t)),
        (Rts, Sqd) => (none, M::EN_SQD_ASYNC_NOTIFY),
        (Sqd, Sqd) => match t {
            Rc => (
                none,
                M::PORT
                    | M::AV
                    | M::TIMEOUT
                    | M::RETRY_CNT
                    | M::RNR_RETRY
                    | M::MAX_QP_RD_ATOMIC
                    | M::MAX_DEST_RD_ATOMIC
                    | M::ALT_PATH
                    | M::ACCESS_FLAGS
                    | M::PKEY_INDEX
                    | M::MIN_RNR_TIMER
                    | M::PATH_MIG_STATE,
            ),
            XrcSend => (
                none,
                M::PORT
                    | M::AV
                    | M::TIMEOUT
                    | M::RETRY_CNT
                    | M::RNR_RETRY
                    | M::MAX_QP_RD_ATOMIC
                    | M::ALT_PATH
                    | M::ACCESS_FLAGS
                    | M::PKEY_INDEX
                    | M::PATH_MIG_STATE,
            ),
            XrcRecv => (
                none,
                M::PORT
                    | M::AV
                    | M::TIMEOUT
                    | M::MAX_DEST_RD_ATOMIC
                    | M::ALT_PATH
                    | M::ACCESS_FLAGS
                    | M::PKEY_INDEX
                    | M::MIN_RNR_TIMER
                    | M::PATH_MIG_STATE,
            ),
            Uc => (none, M::AV | M::ALT_PATH | M::ACCESS_FLAGS | M::PKEY_INDEX | M::PATH_MIG_STATE),
            Ud => (none, M::PKEY_INDEX | M::QKEY),
        },
        (Sqe, Rts) => match t {
            Rc | XrcSend | XrcRecv => return None,
            Uc => (none, M::CUR_STATE | M::ACCESS_FLAGS),
            Ud => (none, M::CUR_STATE | M::QKEY),
        },
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn transition_table_spot_checks() {
        use QpState::*;
        assert!(transition(QpType::Rc, Reset, Rtr).is_none());
        assert!(transition(QpType::Rc, Sqe, Rts).is_none());
        assert!(transition(QpType::Ud, Sqe, Rts).is_some());
        let (req, _) = transition(QpType::Rc, Init, Rtr).unwrap();
        assert!(req.contains(M::MAX_DEST_RD_ATOMIC | M::MIN_RNR_TIMER | M::AV));
        let (req, opt) = transition(QpType::Ud, Rtr, Rts).unwrap();
        assert_eq!(req, M::SQ_PSN);
        assert!(opt.contains(M::QKEY));
        assert!(transition(QpType::Rc, Err, Reset).is_some());
        assert!(transition(QpType::Rc, Rts, Init).is_none());
        // The kernel's table for the XRC halves (what pyverbs' to_rts sends).
        let (req, _) = transition(QpType::XrcSend, Init, Rtr).unwrap();
        assert_eq!(req, M::AV | M::PATH_MTU | M::DEST_QPN | M::RQ_PSN);
        let (req, opt) = transition(QpType::XrcRecv, Rtr, Rts).unwrap();
        assert_eq!(req, M::TIMEOUT | M::SQ_PSN);
        assert!(opt.contains(M::MIN_RNR_TIMER) && !opt.contains(M::RETRY_CNT));
        let (req, _) = transition(QpType::XrcRecv, Init, Rtr).unwrap();
        assert!(req.contains(M::MAX_DEST_RD_ATOMIC | M::MIN_RNR_TIMER));
        assert!(transition(QpType::XrcSend, Sqe, Rts).is_none());
    }
}
