//! Queue pairs (`ibv_qp`): RC, UC and UD QPs and the XRC_SEND half of XRC
//! are created in a protection domain, the XRC_RECV half in an XRC domain
//! ([`super::Xrcd::create_recv_qp`]).

use super::context::Context;
use super::cq::CompletionQueue;
use super::pd::{PdInner, ProtectionDomain};
use super::srq::SharedReceiveQueue;
use super::xrcd::{Xrcd, XrcdInner};
use crate::ib::{Error, QpAttrMask, QpState, QpType, Result};
use crate::proto::cq::CompletionQueue as Ring;
use crate::proto::qp::QpInit;
use crate::proto::srq::SharedRecvQueue;
use crate::proto::wr::{QpAttr, QpCap, QueueLimits, RecvWr, SendWr};
use std::sync::Arc;

/// Creation attributes (`ibv_qp_init_attr`).
pub struct QpInitAttr<'a> {
    /// The transport type.
    pub qp_type: QpType,
    /// The CQ that gets the send queue's completions.
    pub send_cq: &'a CompletionQueue,
    /// The CQ that gets the receive queue's completions (ignored for
    /// XRC_SEND).
    pub recv_cq: &'a CompletionQueue,
    /// An SRQ to take receive WQEs from instead of the QP's own receive
    /// queue.
    pub srq: Option<&'a SharedReceiveQueue>,
    /// The queues' sizes requested.
    pub cap: QpCap,
    /// Whether every send WR completes with a work completion, whatever its
    /// `SIGNALED` flag.
    pub sq_sig_all: bool,
    /// Inline receive for this QP (None: the device's default, on unless
    /// `UROCE_SCATTER_TO_CQE=0`), like mlx5dv's DISABLE/ALLOW_SCATTER_TO_CQE.
    pub scatter_to_cqe: Option<bool>,
}

impl<'a> QpInitAttr<'a> {
    /// An RC QP with room for 256 WRs of 4 SGEs each way and 64 inline bytes.
    pub fn rc(send_cq: &'a CompletionQueue, recv_cq: &'a CompletionQueue) -> Self {
        QpInitAttr {
            qp_type: QpType::Rc,
            send_cq,
            recv_cq,
            srq: None,
            cap: QpCap { max_send_wr: 256, max_recv_wr: 256, max_send_sge: 4, max_recv_sge: 4, max_inline_data: 64 },
            sq_sig_all: false,
            scatter_to_cqe: None,
        }
    }

    /// The same for a UD QP.
    pub fn ud(send_cq: &'a CompletionQueue, recv_cq: &'a CompletionQueue) -> Self {
        QpInitAttr { qp_type: QpType::Ud, ..Self::rc(send_cq, recv_cq) }
    }

    /// An XRC_SEND QP: a send queue as [`QpInitAttr::rc`]'s, no receive side
    /// (`recv_cq` is ignored for this type).
    pub fn xrc_send(send_cq: &'a CompletionQueue) -> Self {
        let rc = Self::rc(send_cq, send_cq);
        QpInitAttr { qp_type: QpType::XrcSend, cap: QpCap { max_recv_wr: 0, max_recv_sge: 0, ..rc.cap }, ..rc }
    }
}

/// What a QP was created in, and keeps alive.
enum Owner {
    Pd(Arc<PdInner>),
    Xrcd(Arc<XrcdInner>),
}

impl Owner {
    fn ctx(&self) -> &Context {
        match self {
            Owner::Pd(pd) => &pd.ctx,
            Owner::Xrcd(xrcd) => &xrcd.ctx,
        }
    }
}

/// A queue pair (`ibv_qp`), destroyed on drop.
pub struct QueuePair {
    owner: Owner,
    qpn: u32,
    qp_type: QpType,
    cap: QpCap,
    _send_cq: Option<Arc<Ring>>,
    _recv_cq: Option<Arc<Ring>>,
    _srq: Option<Arc<SharedRecvQueue>>,
}

impl ProtectionDomain {
    /// `ibv_create_qp`.
    pub fn create_qp(&self, attr: &QpInitAttr) -> Result<QueuePair> {
        QueuePair::new(self, attr)
    }

    /// The device's GSI QP (QP 1, UD), for its CM agent ([`crate::cm::CmEndpoint`]).
    /// EBUSY if it exists.
    pub fn create_gsi_qp(&self, attr: &QpInitAttr) -> Result<QueuePair> {
        QueuePair::new_in(self, attr, true)
    }

    /// `ibv_create_srq`.
    pub fn create_srq(&self, max_wr: u32, max_sge: u32, limit: u32) -> Result<SharedReceiveQueue> {
        SharedReceiveQueue::new(self, max_wr, max_sge, limit)
    }
}

impl QueuePair {
    fn new(pd: &ProtectionDomain, a: &QpInitAttr) -> Result<QueuePair> {
        Self::new_in(pd, a, false)
    }

    fn new_in(pd: &ProtectionDomain, a: &QpInitAttr, gsi: bool) -> Result<QueuePair> {
        let init = QpInit {
            qp_type: a.qp_type,
            pd: pd.handle(),
            send_cq: a.send_cq.ring.clone(),
            recv_cq: a.recv_cq.ring.clone(),
            srq: a.srq.map(|s| s.queue.clone()),
            cap: a.cap,
            sq_sig_all: a.sq_sig_all,
            scatter_to_cqe: matches!(a.qp_type, QpType::Rc | QpType::Uc)
                && a.scatter_to_cqe.unwrap_or(pd.inner.ctx.dev.scatter_to_cqe),
        };
        // What the QP keeps of the attributes (an XRC_SEND QP has no receive side).
        let (qpn, cap, recv_cq, srq) = {
            let rt = &pd.inner.ctx.dev.rt;
            let qpn = if gsi { rt.create_gsi_qp(init)? } else { rt.create_qp(init)? };
            rt.query(qpn, |e| {
                let q = e.qp(qpn).expect("just created");
                (qpn, q.cap, q.recv_cq.clone(), q.srq.clone())
            })
        };
        pd.inner.ctx.dev.track_events(crate::proto::EventElement::Qp(qpn));
        Ok(QueuePair {
            owner: Owner::Pd(pd.inner.clone()),
            qpn,
            qp_type: a.qp_type,
            cap,
            _send_cq: Some(a.send_cq.ring.clone()),
            _recv_cq: recv_cq,
            _srq: srq,
        })
    }

    pub(crate) fn new_xrc_recv(xrcd: &Xrcd) -> Result<QueuePair> {
        let ctx = &xrcd.inner.ctx;
        let qpn = ctx.dev.rt.create_xrc_recv_qp(xrcd.number(), ctx.dev.scatter_to_cqe)?;
        ctx.dev.track_events(crate::proto::EventElement::Qp(qpn));
        Ok(QueuePair {
            owner: Owner::Xrcd(xrcd.inner.clone()),
            qpn,
            qp_type: QpType::XrcRecv,
            cap: QpCap::default(),
            _send_cq: None,
            _recv_cq: None,
            _srq: None,
        })
    }

    /// The transport state of the QP, for diagnostics (send queue, PSNs,
    /// responder state, timers).
    pub fn debug_state(&self) -> String {
        let rt = &self.owner.ctx().dev.rt;
        let timer = rt.next_timeout().map(|t| t.saturating_duration_since(std::time::Instant::now()));
        let q = rt.query(self.qpn, |e| e.qp(self.qpn).map(|q| q.debug_state()).unwrap_or_default());
        format!("{q} | next timer in {timer:?}")
    }

    /// The QP number.
    pub fn qp_num(&self) -> u32 {
        self.qpn
    }

    /// The transport type.
    pub fn qp_type(&self) -> QpType {
        self.qp_type
    }

    /// The queues' sizes as created: the requested ones, with
    /// `max_inline_data` rounded up (and no receive side for XRC_SEND).
    pub fn cap(&self) -> QpCap {
        self.cap
    }

    /// `ibv_modify_qp`.
    pub fn modify(&self, attr: &QpAttr, mask: QpAttrMask) -> Result<()> {
        self.owner.ctx().dev.rt.pump(self.qpn, |e, now| e.modify_qp(now, self.qpn, attr, mask))
    }

    /// `ibv_query_qp`: the current attributes.
    pub fn query(&self) -> QpAttr {
        self.owner.ctx().dev.rt.query(self.qpn, |e| {
            let qp = e.qp(self.qpn).expect("a live handle has a QP");
            QpAttr { cap: qp.cap, cur_qp_state: qp.attr.qp_state, ..qp.attr }
        })
    }

    /// The current state (`qp_state` of [`QueuePair::query`]).
    pub fn state(&self) -> QpState {
        self.query().qp_state
    }

    /// `ibv_post_send`.
    pub fn post_send(&self, wr: &SendWr) -> Result<()> {
        self.post_send_list(std::iter::once(wr.clone())).map_err(|(_, e)| e)
    }

    /// `ibv_post_recv`.
    pub fn post_recv(&self, wr: &RecvWr) -> Result<()> {
        self.post_recv_list(std::iter::once(wr.clone())).map_err(|(_, e)| e)
    }

    /// Posts a list of send WRs with one pass through the device (as one
    /// `ibv_post_send` call with a chained list). On failure, the index of the
    /// first WR not posted (`bad_wr`) and why; the WRs before it are posted.
    /// A list longer than the free slots stops there with ENOMEM, whatever
    /// its length (an endless iterator included).
    pub fn post_send_list(&self, wrs: impl IntoIterator<Item = SendWr>) -> std::result::Result<(), (usize, Error)> {
        let mut wrs = wrs.into_iter();
        self.post_send_with(|i, lim| wrs.next().map(|w| lim.check_room(i).map(|()| w)))
    }

    /// The same for receive WRs.
    pub fn post_recv_list(&self, wrs: impl IntoIterator<Item = RecvWr>) -> std::result::Result<(), (usize, Error)> {
        let mut wrs = wrs.into_iter();
        self.post_recv_with(|i, lim| wrs.next().map(|w| lim.check_room(i).map(|()| w)))
    }

    /// Posts the send WRs `next` makes, under its shard's lock: `next(i,
    /// limits)` returns WR `i` of the list (None at its end) after checking
    /// it against the queue's [`QueueLimits`] as they stand, or the error
    /// that refuses it. The C ABI converts each WR there, so that nothing
    /// of a WR is read before it is known to fit. Stops at the first
    /// refused WR: `Err((i, e))`, the ones before it posted.
    pub fn post_send_with(
        &self,
        mut next: impl FnMut(usize, &QueueLimits) -> Option<Result<SendWr>>,
    ) -> std::result::Result<(), (usize, Error)> {
        let qpn = self.qpn;
        self.owner.ctx().dev.rt.pump(qpn, |e, now| {
            let lim = match e.qp(qpn) {
                Some(q) if q.send_cq.is_some() => QueueLimits {
                    free: (q.cap.max_send_wr as usize).saturating_sub(q.sq.len()),
                    max_sge: q.cap.max_send_sge,
                    max_inline: q.cap.max_inline_data,
                    qp_type: q.qp_type,
                },
                Some(_) => return Err((0, Error::inval("post_send: an XRC_RECV QP has no send queue"))),
                None => return Err((0, Error::inval("post_send: no such QP"))),
            };
            let mut refused = None;
            e.post_send_list(now, qpn, until_refused(&lim, &mut next, &mut refused))?;
            refused.map_or(Ok(()), Err)
        })
    }

    /// [`QueuePair::post_send_with`] for receive WRs (`max_inline` is 0).
    pub fn post_recv_with(
        &self,
        mut next: impl FnMut(usize, &QueueLimits) -> Option<Result<RecvWr>>,
    ) -> std::result::Result<(), (usize, Error)> {
        let qpn = self.qpn;
        self.owner.ctx().dev.rt.pump(qpn, |e, now| {
            let lim = match e.qp(qpn) {
                Some(q) if q.srq.is_none() && q.recv_cq.is_some() => QueueLimits {
                    free: (q.cap.max_recv_wr as usize).saturating_sub(q.rq.len()),
                    max_sge: q.cap.max_recv_sge,
                    max_inline: 0,
                    qp_type: q.qp_type,
                },
                Some(_) => {
                    return Err((0, Error::inval("post_recv: QP has no receive queue (it uses an SRQ, or is XRC)")))
                }
                None => return Err((0, Error::inval("post_recv: no such QP"))),
            };
            let mut refused = None;
            e.post_recv_list(now, qpn, until_refused(&lim, &mut next, &mut refused))?;
            refused.map_or(Ok(()), Err)
        })
    }

    /// Moves a connected QP (RC, UC or either XRC half) through INIT, RTR
    /// and RTS to a peer (`ibv_rc_pingpong`'s attributes; access flags for
    /// every remote operation), giving each transition the attributes its
    /// type requires.
    pub fn connect_rc(&self, remote: &super::Gid, remote_qpn: u32, local_psn: u32, remote_psn: u32) -> Result<()> {
        self.connect_rc_with(remote, remote_qpn, local_psn, remote_psn, 14, 7)
    }

    /// [`QueuePair::connect_rc`] with the local ACK timeout exponent
    /// (4.096 µs × 2^timeout) and the retry count (0..=7 retries; 7 is seven, as in the IBA and on
    /// hardware, not rxe's "forever").
    pub fn connect_rc_with(
        &self,
        remote: &super::Gid,
        remote_qpn: u32,
        local_psn: u32,
        remote_psn: u32,
        timeout: u8,
        retry_cnt: u8,
    ) -> Result<()> {
        use crate::ib::{Access, Mtu};
        let required = |cur, next| QpAttrMask::STATE | crate::proto::qp::required_attributes(self.qp_type, cur, next);
        let mut a = QpAttr {
            qp_state: QpState::Init,
            pkey_index: 0,
            port_num: 1,
            qp_access_flags: Access::LOCAL_WRITE | Access::REMOTE_WRITE | Access::REMOTE_READ | Access::REMOTE_ATOMIC,
            ..QpAttr::default()
        };
        self.modify(&a, required(QpState::Reset, QpState::Init))?;
        a.qp_state = QpState::Rtr;
        a.path_mtu = Mtu::Mtu4096.min_by_bytes(self.owner.ctx().dev.mtu);
        a.dest_qp_num = remote_qpn;
        a.rq_psn = remote_psn;
        a.max_dest_rd_atomic = 16;
        a.min_rnr_timer = 12;
        a.ah_attr = crate::proto::wr::AddressVector {
            dgid: *remote,
            is_global: true,
            hop_limit: 64,
            port_num: 1,
            ..Default::default()
        };
        self.modify(&a, required(QpState::Init, QpState::Rtr))?;
        a.qp_state = QpState::Rts;
        a.timeout = timeout;
        a.retry_cnt = retry_cnt;
        a.rnr_retry = 7;
        a.sq_psn = local_psn;
        a.max_rd_atomic = 16;
        self.modify(&a, required(QpState::Rtr, QpState::Rts))
    }
}

impl Drop for QueuePair {
    fn drop(&mut self) {
        // No event is delivered for it from now on (those not yet taken go).
        self.owner.ctx().dev.untrack_events(crate::proto::EventElement::Qp(self.qpn));
        // What it acknowledged leaves as it goes (the engine queues the ACK
        // it held; the runtime's pass sends it).
        let _ = self.owner.ctx().dev.rt.destroy_qp(self.qpn);
    }
}

impl std::fmt::Debug for QueuePair {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("QueuePair").field("qpn", &self.qpn).field("type", &self.qp_type).finish()
    }
}

impl crate::ib::Mtu {
    /// The smaller of two MTUs.
    pub fn min_by_bytes(self, other: crate::ib::Mtu) -> crate::ib::Mtu {
        if self.bytes() <= other.bytes() {
            self
        } else {
            other
        }
    }
}

/// The work requests `next` gives for a queue of limits `lim`, up to the
/// first it refuses, whose index and error are left in `refused`.
fn until_refused<'a, W>(
    lim: &'a QueueLimits,
    next: &'a mut impl FnMut(usize, &QueueLimits) -> Option<Result<W>>,
    refused: &'a mut Option<(usize, Error)>,
) -> impl Iterator<Item = W> + 'a {
    let mut i = 0;
    std::iter::from_fn(move || match next(i, lim)? {
        Ok(w) => {
            i += 1;
            Some(w)
        }
        Err(err) => {
            *refused = Some((i, err));
            None
        }
    })
}

impl Xrcd {
    /// `ibv_create_qp_ex` with IBV_QPT_XRC_RECV: an XRC target QP of this
    /// domain. Connect it like an RC QP ([`QueuePair::connect_rc`]).
    pub fn create_recv_qp(&self) -> Result<QueuePair> {
        QueuePair::new_xrc_recv(self)
    }
}
