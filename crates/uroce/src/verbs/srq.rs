//! Shared receive queues (`ibv_srq`), basic and XRC. An XRC SRQ belongs to
//! an XRC domain, has its own completion queue, and is reachable by its SRQ
//! number from the requests arriving at the domain's XRC_RECV QPs.

use super::cq::CompletionQueue;
use super::pd::{PdInner, ProtectionDomain};
use super::xrcd::{Xrcd, XrcdInner};
use crate::ib::{Errno, Error, Result};
use crate::proto::srq::{RecvWqe, SharedRecvQueue as Queue, XrcSrq};
use crate::proto::wr::{QueueLimits, RecvWr};
use std::sync::Arc;

/// A shared receive queue (`ibv_srq`).
pub struct SharedReceiveQueue {
    pub(crate) queue: Arc<Queue>,
    pd: Arc<PdInner>,
    /// An XRC SRQ keeps its domain handle open.
    _xrcd: Option<Arc<XrcdInner>>,
}

impl SharedReceiveQueue {
    /// `ibv_create_srq`.
    pub fn new(pd: &ProtectionDomain, max_wr: u32, max_sge: u32, limit: u32) -> Result<SharedReceiveQueue> {
        let queue = Self::queue(pd, max_wr, max_sge, limit)?;
        pd.inner.ctx.dev.track_events(crate::proto::EventElement::Srq(queue.handle));
        Ok(SharedReceiveQueue { queue: Arc::new(queue), pd: pd.inner.clone(), _xrcd: None })
    }

    /// `ibv_create_srq_ex` with IBV_SRQT_XRC (see [`Xrcd::create_srq`]).
    pub(crate) fn new_xrc(
        pd: &ProtectionDomain,
        xrcd: &Xrcd,
        cq: &CompletionQueue,
        max_wr: u32,
        max_sge: u32,
        limit: u32,
    ) -> Result<SharedReceiveQueue> {
        let queue = Self::queue(pd, max_wr, max_sge, limit)?;
        if queue.handle > 0x00FF_FFFF {
            return Err(Error::new(Errno::ENOMEM, "create_srq: SRQ numbers (24 bits) exhausted"));
        }
        let queue = Arc::new(queue.with_xrc(XrcSrq { xrcd: xrcd.number(), cq: cq.ring.clone() }));
        pd.inner.ctx.dev.rt.register_xrc_srq(&queue);
        pd.inner.ctx.dev.track_events(crate::proto::EventElement::Srq(queue.handle));
        Ok(SharedReceiveQueue { queue, pd: pd.inner.clone(), _xrcd: Some(xrcd.inner.clone()) })
    }

    fn queue(pd: &ProtectionDomain, max_wr: u32, max_sge: u32, limit: u32) -> Result<Queue> {
        use crate::proto::qp::{MAX_QP_WR, MAX_SGE};
        if max_wr == 0 || max_wr > MAX_QP_WR || max_sge == 0 || max_sge > MAX_SGE {
            return Err(Error::inval("create_srq: max_wr/max_sge out of range"));
        }
        if limit > max_wr {
            return Err(Error::inval("create_srq: srq_limit above max_wr"));
        }
        Ok(Queue::new(pd.inner.ctx.dev.next_handle(), pd.handle(), max_wr, max_sge, limit))
    }

    /// The device-wide handle of the SRQ (its asynchronous events name it).
    pub fn handle(&self) -> u32 {
        self.queue.handle
    }

    /// `ibv_get_srq_num`: the number XRC requests name this SRQ by (None
    /// for a basic SRQ: EOPNOTSUPP).
    pub fn srq_num(&self) -> Option<u32> {
        self.queue.xrc.as_ref().map(|_| self.queue.handle)
    }

    /// `ibv_post_srq_recv`.
    pub fn post_recv(&self, wr: &RecvWr) -> Result<()> {
        let mut one = Some(wr.clone());
        self.post_recv_with(|i, lim| one.take().map(|w| lim.check_room(i).map(|()| w))).map_err(|(_, e)| e)
    }

    /// Posts the receive WRs `next` makes (see
    /// [`super::QueuePair::post_send_with`]): WR `i` is checked against the
    /// SRQ's limits as they stood when the post began before it is made,
    /// and a list longer than the free slots stops there with ENOMEM.
    pub fn post_recv_with(
        &self,
        mut next: impl FnMut(usize, &QueueLimits) -> Option<Result<RecvWr>>,
    ) -> std::result::Result<(), (usize, Error)> {
        let q = &self.queue;
        let lim = QueueLimits {
            free: (q.max_wr as usize).saturating_sub(q.len()),
            max_sge: q.max_sge,
            max_inline: 0,
            qp_type: crate::ib::QpType::Rc,
        };
        for i in 0.. {
            let Some(wr) = next(i, &lim) else { return Ok(()) };
            let wr = wr.map_err(|e| (i, e))?;
            if wr.sg_list.len() > q.max_sge as usize {
                return Err((i, Error::inval("post_srq_recv: num_sge above max_sge")));
            }
            if !q.post(RecvWqe { wr_id: wr.wr_id, sges: wr.sg_list }) {
                return Err((i, Error::new(Errno::ENOMEM, "post_srq_recv: SRQ full")));
            }
        }
        Ok(())
    }

    /// Arms the limit event (`ibv_modify_srq` with IBV_SRQ_LIMIT).
    pub fn set_limit(&self, limit: u32) -> Result<()> {
        if limit > self.queue.max_wr {
            return Err(Error::inval("modify_srq: srq_limit above max_wr"));
        }
        self.queue.set_limit(limit);
        Ok(())
    }

    /// The armed limit (`srq_limit`): the limit event fires when fewer
    /// receives than this remain; 0 when disarmed (it disarms as it fires).
    pub fn limit(&self) -> u32 {
        self.queue.limit()
    }

    /// Most outstanding receive WRs (`max_wr`).
    pub fn max_wr(&self) -> u32 {
        self.queue.max_wr
    }

    /// Most SGEs per receive WR (`max_sge`).
    pub fn max_sge(&self) -> u32 {
        self.queue.max_sge
    }

    /// Posted receives not yet consumed.
    pub fn len(&self) -> usize {
        self.queue.len()
    }

    /// Whether no posted receive is waiting.
    pub fn is_empty(&self) -> bool {
        self.queue.is_empty()
    }

    /// Destroys the SRQ, or fails with EBUSY while a QP uses it. No QP is
    /// attached to an XRC SRQ (requests name it), so that one is never busy.
    pub fn destroy(self) -> std::result::Result<(), (Self, Error)> {
        if self.queue.xrc.is_none() && Arc::strong_count(&self.queue) > 1 {
            return Err((self, Error::new(Errno::EBUSY, "destroy_srq: SRQ in use by a QP")));
        }
        Ok(())
    }
}

impl Drop for SharedReceiveQueue {
    fn drop(&mut self) {
        self.pd.ctx.dev.untrack_events(crate::proto::EventElement::Srq(self.queue.handle));
        if self.queue.xrc.is_some() {
            self.pd.ctx.dev.rt.unregister_xrc_srq(self.queue.handle);
        }
    }
}

impl std::fmt::Debug for SharedReceiveQueue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SharedReceiveQueue").field("handle", &self.queue.handle).finish()
    }
}

impl Xrcd {
    /// `ibv_create_srq_ex` with IBV_SRQT_XRC: an SRQ of this domain whose
    /// buffers are checked against `pd` and whose receives complete on
    /// `cq`. Requests name it by [`SharedReceiveQueue::srq_num`].
    pub fn create_srq(
        &self,
        pd: &ProtectionDomain,
        cq: &CompletionQueue,
        max_wr: u32,
        max_sge: u32,
        limit: u32,
    ) -> Result<SharedReceiveQueue> {
        SharedReceiveQueue::new_xrc(pd, self, cq, max_wr, max_sge, limit)
    }
}
