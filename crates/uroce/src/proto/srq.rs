//! Receive queues: the per-QP receive queue and the shared receive queue
//! (SRQ) are the same structure; an SRQ is shared by reference and has the
//! limit event of `ibv_modify_srq(IBV_SRQ_LIMIT)`. An XRC SRQ also belongs
//! to an XRC domain and has its own completion queue: XRC target QPs, which
//! have neither, take receives from the SRQ each request names.

use super::cq::CompletionQueue;
use std::collections::VecDeque;
use rustc_hash::FxHashMap;
use std::sync::{Arc, Mutex, Weak};

/// XRC SRQs by SRQ number. Weak: an SRQ lives as long as its owner's
/// handle, and a request naming a destroyed one finds none.
pub type XrcSrqs = FxHashMap<u32, Weak<SharedRecvQueue>>;

/// A posted receive.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RecvWqe {
    pub wr_id: u64,
    pub sges: super::wr::SgList,
}

#[derive(Debug)]
struct Inner {
    queue: VecDeque<RecvWqe>,
    limit: u32,
}

/// What makes an SRQ an XRC SRQ (`IBV_SRQT_XRC`).
#[derive(Debug)]
pub struct XrcSrq {
    /// The XRC domain: only target QPs of this domain may name the SRQ.
    pub xrcd: u32,
    /// Where its receives complete.
    pub cq: Arc<CompletionQueue>,
}

/// A shared receive queue. `handle` is its device-wide number (for an XRC
/// SRQ, the SRQ number requests name); `pd` the protection domain its
/// buffers (and, for XRC, the memory XRC requests access) are checked
/// against.
#[derive(Debug)]
pub struct SharedRecvQueue {
    pub handle: u32,
    pub pd: u32,
    pub max_wr: u32,
    pub max_sge: u32,
    pub xrc: Option<XrcSrq>,
    inner: Mutex<Inner>,
}

impl SharedRecvQueue {
    pub fn new(handle: u32, pd: u32, max_wr: u32, max_sge: u32, limit: u32) -> Self {
        let inner = Mutex::new(Inner { queue: VecDeque::new(), limit });
        SharedRecvQueue { handle, pd, max_wr, max_sge, xrc: None, inner }
    }

    /// The same queue as an XRC SRQ of `xrc.xrcd`.
    pub fn with_xrc(self, xrc: XrcSrq) -> Self {
        SharedRecvQueue { xrc: Some(xrc), ..self }
    }

    /// Posts a receive; false if the queue is full.
    pub fn post(&self, wqe: RecvWqe) -> bool {
        let mut g = self.inner.lock().unwrap();
        if g.queue.len() >= self.max_wr as usize {
            return false;
        }
        g.queue.push_back(wqe);
        true
    }

    /// Takes the next receive. The second value is true when this take
    /// brought the queue below an armed limit (the limit disarms).
    pub fn take(&self) -> (Option<RecvWqe>, bool) {
        let mut g = self.inner.lock().unwrap();
        let w = g.queue.pop_front();
        let mut fire = false;
        if w.is_some() && g.limit > 0 && (g.queue.len() as u32) < g.limit {
            g.limit = 0;
            fire = true;
        }
        (w, fire)
    }

    pub fn set_limit(&self, limit: u32) {
        self.inner.lock().unwrap().limit = limit;
    }

    pub fn limit(&self) -> u32 {
        self.inner.lock().unwrap().limit
    }

    pub fn len(&self) -> usize {
        self.inner.lock().unwrap().queue.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn limit_fires_once_below_threshold() {
        let q = SharedRecvQueue::new(1, 1, 4, 1, 0);
        for i in 0..4 {
            assert!(q.post(RecvWqe { wr_id: i, sges: Default::default() }));
        }
        assert!(!q.post(RecvWqe { wr_id: 9, sges: Default::default() }), "full");
        q.set_limit(2);
        assert_eq!(q.take(), (Some(RecvWqe { wr_id: 0, sges: Default::default() }), false)); // 3 left
        assert!(!q.take().1); // 2 left, not below
        assert!(q.take().1); // 1 left < 2
        assert_eq!(q.limit(), 0);
        assert!(!q.take().1);
        assert_eq!(q.take().0, None);
    }
}
