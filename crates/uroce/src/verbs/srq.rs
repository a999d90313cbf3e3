//! Shared receive queues (`ibv_srq`).

use super::pd::{PdInner, ProtectionDomain};
use crate::ib::{Errno, Error, Result};
use crate::proto::srq::{RecvWqe, SharedRecvQueue as Queue};
use crate::proto::wr::RecvWr;
use std::sync::Arc;

pub struct SharedReceiveQueue {
    pub(crate) queue: Arc<Queue>,
    _pd: Arc<PdInner>,
}

impl SharedReceiveQueue {
    /// `ibv_create_srq`.
    pub fn new(pd: &ProtectionDomain, max_wr: u32, max_sge: u32, limit: u32) -> Result<SharedReceiveQueue> {
        use crate::proto::qp::{MAX_QP_WR, MAX_SGE};
        if max_wr == 0 || max_wr > MAX_QP_WR || max_sge == 0 || max_sge > MAX_SGE {
            return Err(Error::inval("create_srq: max_wr/max_sge out of range"));
        }
        if limit > max_wr {
            return Err(Error::inval("create_srq: srq_limit above max_wr"));
        }
        let handle = pd.inner.ctx.dev.next_handle();
        Ok(SharedReceiveQueue {
            queue: Arc::new(Queue::new(handle, pd.handle(), max_wr, max_sge, limit)),
            _pd: pd.inner.clone(),
        })
    }

    pub fn handle(&self) -> u32 {
        self.queue.handle
    }

    /// `ibv_post_srq_recv`.
    pub fn post_recv(&self, wr: &RecvWr) -> Result<()> {
        if wr.sg_list.len() > self.queue.max_sge as usize {
            return Err(Error::inval("post_srq_recv: num_sge above max_sge"));
        }
        if !self.queue.post(RecvWqe { wr_id: wr.wr_id, sges: wr.sg_list.clone() }) {
            return Err(Error::new(Errno::ENOMEM, "post_srq_recv: SRQ full"));
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

    pub fn limit(&self) -> u32 {
        self.queue.limit()
    }

    pub fn max_wr(&self) -> u32 {
        self.queue.max_wr
    }

    pub fn max_sge(&self) -> u32 {
        self.queue.max_sge
    }

    /// Posted receives not yet consumed.
    pub fn len(&self) -> usize {
        self.queue.len()
    }

    pub fn is_empty(&self) -> bool {
        self.queue.is_empty()
    }

    /// Destroys the SRQ, or fails with EBUSY while a QP uses it.
    pub fn destroy(self) -> std::result::Result<(), (Self, Error)> {
        if Arc::strong_count(&self.queue) > 1 {
            return Err((self, Error::new(Errno::EBUSY, "destroy_srq: SRQ in use by a QP")));
        }
        Ok(())
    }
}

impl std::fmt::Debug for SharedReceiveQueue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SharedReceiveQueue").field("handle", &self.queue.handle).finish()
    }
}
