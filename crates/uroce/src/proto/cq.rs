//! Completion queues: a bounded ring of work completions shared between the
//! transport (producer) and the application (consumer), with the arm state of
//! `ibv_req_notify_cq`. Overrunning a queue puts it in error, as on real
//! devices: the completion is lost and an IBV_EVENT_CQ_ERR is raised.
//!
//! **Inline receive** (mlx5's scatter-to-CQE): a small received message
//! (≤ 32 bytes with 64-byte CQEs, ≤ 64 with 128-byte ones) travels inside
//! its completion and is copied to the receive WQE's buffers when the
//! application polls, in the application's thread; the transport skips the
//! buffers' key translation and copy. A buffer that is no longer valid at
//! poll time completes with LOC_PROT_ERR.

use super::memory::{for_each_sge_piece, MemoryAccess, Want};
use crate::ib::{Errno, Error, Result, Sge, Wc, WcStatus};
use smallvec::SmallVec;
use std::collections::VecDeque;
use std::sync::{Arc, Mutex};

/// Largest inline-received payload (128-byte CQEs).
pub const MAX_INLINE_RECV: usize = 64;

/// A received message carried in its completion.
#[derive(Debug, Clone)]
pub struct InlineRecv {
    pub len: u8,
    pub data: [u8; MAX_INLINE_RECV],
    /// The receive WQE's buffers and the PD their keys belong to.
    pub pd: u32,
    pub sges: SmallVec<[Sge; 2]>,
}

#[derive(Debug)]
struct Cqe {
    wc: Wc,
    inline: Option<InlineRecv>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Arm {
    None,
    Next,
    Solicited,
}

#[derive(Debug)]
struct Inner {
    ring: VecDeque<Cqe>,
    capacity: usize,
    arm: Arm,
    overrun: bool,
}

/// Outcome of pushing a completion.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pushed {
    /// Stored; `notify` says a completion event is due (the CQ was armed).
    Stored { notify: bool },
    /// The queue was full: it is now in error.
    Overrun,
}

/// A completion queue. `handle` is the device-wide CQ number.
#[derive(Debug)]
pub struct CompletionQueue {
    pub handle: u32,
    inner: Mutex<Inner>,
    /// Inline-receive size (0: off) and the memory to scatter into at poll.
    inline_limit: usize,
    mem: Option<Arc<dyn MemoryAccess>>,
}

impl CompletionQueue {
    pub fn new(handle: u32, capacity: usize) -> CompletionQueue {
        Self::with_inline(handle, capacity, None, 0)
    }

    /// A queue whose completions may carry up to `inline_limit` bytes of
    /// received data (32 or 64), scattered through `mem` at poll time.
    pub fn with_inline(
        handle: u32,
        capacity: usize,
        mem: Option<Arc<dyn MemoryAccess>>,
        inline_limit: usize,
    ) -> CompletionQueue {
        let inline_limit = if mem.is_some() { inline_limit.min(MAX_INLINE_RECV) } else { 0 };
        CompletionQueue {
            inline_limit,
            mem,
            handle,
            inner: Mutex::new(Inner {
                ring: VecDeque::with_capacity(capacity.min(4096)),
                capacity,
                arm: Arm::None,
                overrun: false,
            }),
        }
    }

    /// Adds a completion; `solicited` marks a receive of a solicited message
    /// (errors also wake a solicited-only arm).
    pub fn push(&self, wc: Wc, solicited: bool) -> Pushed {
        self.push_entry(Cqe { wc, inline: None }, solicited)
    }

    /// Largest payload a completion of this queue may carry (0: none).
    pub fn inline_limit(&self) -> usize {
        self.inline_limit
    }

    /// Adds a receive completion that carries its message.
    pub fn push_inline(&self, wc: Wc, solicited: bool, inline: InlineRecv) -> Pushed {
        self.push_entry(Cqe { wc, inline: Some(inline) }, solicited)
    }

    fn push_entry(&self, e: Cqe, solicited: bool) -> Pushed {
        let wc = e.wc;
        let mut g = self.inner.lock().unwrap();
        if g.overrun || g.ring.len() >= g.capacity {
            g.overrun = true;
            return Pushed::Overrun;
        }
        g.ring.push_back(e);
        let notify = match g.arm {
            Arm::None => false,
            Arm::Next => true,
            Arm::Solicited => solicited || wc.status != WcStatus::Success,
        };
        if notify {
            g.arm = Arm::None;
        }
        Pushed::Stored { notify }
    }

    /// Pops up to `out.len()` completions into `out`; returns how many.
    /// An overrun queue reports EIO.
    pub fn poll(&self, out: &mut [Wc]) -> Result<usize> {
        let mut g = self.inner.lock().unwrap();
        if g.overrun && g.ring.is_empty() {
            return Err(Error::new(Errno::EIO, "completion queue overrun"));
        }
        let n = out.len().min(g.ring.len());
        for (slot, e) in out.iter_mut().zip(g.ring.drain(..n)) {
            *slot = self.deliver(e);
        }
        Ok(n)
    }

    /// Pops one completion, if any.
    pub fn poll_one(&self) -> Option<Wc> {
        let e = self.inner.lock().unwrap().ring.pop_front()?;
        Some(self.deliver(e))
    }

    /// Scatters an inline-received message into its buffers.
    fn deliver(&self, e: Cqe) -> Wc {
        let mut wc = e.wc;
        if let (Some(i), Some(mem)) = (e.inline, &self.mem) {
            let data = &i.data[..i.len as usize];
            let mem = &**mem;
            let r = for_each_sge_piece(mem, i.pd, &i.sges, 0, data.len() as u64, Want::LocalWrite, |s, at, n| {
                mem.write(s, 0, &data[at as usize..at as usize + n])
            });
            if r.is_err() {
                wc.status = WcStatus::LocProtErr;
            }
        }
        wc
    }

    /// Drops the unpolled completions of QP `qpn` (a QP entering RESET, as
    /// mlx5's `__mlx5_ib_cq_clean`): returns how many.
    pub fn purge_qp(&self, qpn: u32) -> usize {
        let mut g = self.inner.lock().unwrap();
        let before = g.ring.len();
        g.ring.retain(|e| e.wc.qp_num != qpn);
        before - g.ring.len()
    }

    /// Arms the queue: the next completion (or the next solicited or error
    /// completion) raises an event. Returns true when completions are
    /// already waiting that satisfy the arm (the caller may raise the event
    /// at once; verbs leave that to the application's re-poll).
    pub fn arm(&self, solicited_only: bool) {
        let mut g = self.inner.lock().unwrap();
        g.arm = match (g.arm, solicited_only) {
            (Arm::Next, _) | (_, false) => Arm::Next,
            _ => Arm::Solicited,
        };
    }

    pub fn len(&self) -> usize {
        self.inner.lock().unwrap().ring.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub fn capacity(&self) -> usize {
        self.inner.lock().unwrap().capacity
    }

    /// `ibv_resize_cq`: fails with EINVAL if more completions wait than fit.
    pub fn resize(&self, capacity: usize) -> Result<()> {
        let mut g = self.inner.lock().unwrap();
        if capacity < g.ring.len() {
            return Err(Error::inval("resize_cq: fewer entries than completions waiting"));
        }
        g.capacity = capacity;
        Ok(())
    }

    pub fn is_overrun(&self) -> bool {
        self.inner.lock().unwrap().overrun
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ib::WcOpcode;

    fn wc(id: u64, status: WcStatus) -> Wc {
        Wc::new(id, status, WcOpcode::Send, 1)
    }

    #[test]
    fn fifo_overrun_and_arm() {
        let cq = CompletionQueue::new(1, 2);
        assert_eq!(cq.push(wc(1, WcStatus::Success), false), Pushed::Stored { notify: false });
        cq.arm(true);
        assert_eq!(cq.push(wc(2, WcStatus::Success), false), Pushed::Stored { notify: false });
        assert_eq!(cq.push(wc(3, WcStatus::Success), false), Pushed::Overrun);
        let mut out = [wc(0, WcStatus::Success); 4];
        assert_eq!(cq.poll(&mut out).unwrap(), 2);
        assert_eq!((out[0].wr_id, out[1].wr_id), (1, 2));
        assert_eq!(cq.poll(&mut out).unwrap_err().errno, Errno::EIO);
    }

    #[test]
    fn solicited_arm_fires_on_solicited_or_error() {
        let cq = CompletionQueue::new(1, 8);
        cq.arm(true);
        assert_eq!(cq.push(wc(1, WcStatus::Success), false), Pushed::Stored { notify: false });
        assert_eq!(cq.push(wc(2, WcStatus::Success), true), Pushed::Stored { notify: true });
        assert_eq!(cq.push(wc(3, WcStatus::Success), true), Pushed::Stored { notify: false }, "disarmed");
        cq.arm(true);
        assert_eq!(cq.push(wc(4, WcStatus::RemAccessErr), false), Pushed::Stored { notify: true });
        cq.arm(false);
        assert_eq!(cq.push(wc(5, WcStatus::Success), false), Pushed::Stored { notify: true });
    }
}
