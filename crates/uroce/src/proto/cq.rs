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
use super::presence::Presence;
use crate::ib::{Errno, Error, Result, Sge, Wc, WcStatus};
use smallvec::SmallVec;
use std::collections::VecDeque;
use std::sync::{Arc, Mutex, OnceLock};

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
    /// Where the queue's arm state is counted (see [`super::presence`]).
    presence: OnceLock<Arc<Presence>>,
}

impl CompletionQueue {
    #[cfg(any(test, feature = "unstable"))]
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
            presence: OnceLock::new(),
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
            if let Some(p) = self.presence.get() {
                p.cq_disarmed();
            }
        }
        Pushed::Stored { notify }
    }

    /// Pops up to `out.len()` completions into `out`; returns how many.
    /// An overrun queue reports EIO.
    ///
    /// An inline-received message is scattered after the queue's lock is
    /// released: the copy may block (an ODP page fault, a peer client) and
    /// the lock is the one every QP completing into this queue needs, under
    /// its shard's locks (see "Locks" in docs/architecture.md).
    pub fn poll(&self, out: &mut [Wc]) -> Result<usize> {
        let mut filled = 0;
        loop {
            let scatter = {
                let mut g = self.inner.lock().unwrap();
                if filled == 0 && g.overrun && g.ring.is_empty() {
                    return Err(Error::new(Errno::EIO, "completion queue overrun"));
                }
                let mut scatter = None;
                while filled < out.len() {
                    let Some(e) = g.ring.pop_front() else { break };
                    if e.inline.is_some() {
                        scatter = Some(e);
                        break;
                    }
                    out[filled] = e.wc;
                    filled += 1;
                }
                scatter
            };
            let Some(e) = scatter else { return Ok(filled) };
            out[filled] = self.deliver(e);
            filled += 1;
        }
    }

    /// Pops one completion, if any (scattered, like [`Self::poll`]'s, with
    /// the lock released).
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
    /// completion) raises an event; completions already waiting raise none
    /// (as on real devices, the application re-polls after arming).
    /// Returns whether the queue was unarmed before (it now counts in its
    /// device's [`Presence`], when it has one).
    pub fn arm(&self, solicited_only: bool) -> bool {
        let mut g = self.inner.lock().unwrap();
        let was = g.arm;
        g.arm = match (g.arm, solicited_only) {
            (Arm::Next, _) | (_, false) => Arm::Next,
            _ => Arm::Solicited,
        };
        let newly = was == Arm::None;
        if let Some(p) = self.presence.get().filter(|_| newly) {
            p.cq_armed();
        }
        newly
    }

    /// Counts this queue's arm state in `p` from now on (once; the queue
    /// must not be armed yet).
    pub fn count_arms_in(&self, p: Arc<Presence>) {
        let _ = self.presence.set(p);
    }

    #[cfg(any(test, feature = "unstable"))]
    pub fn len(&self) -> usize {
        self.inner.lock().unwrap().ring.len()
    }

    #[cfg(any(test, feature = "unstable"))]
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

impl Drop for CompletionQueue {
    fn drop(&mut self) {
        let armed = self.inner.get_mut().map(|g| g.arm != Arm::None).unwrap_or(false);
        if let Some(p) = self.presence.get().filter(|_| armed) {
            p.cq_disarmed();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ib::WcOpcode;
    use crate::proto::memory::{AccessError, Atomic, BindError, BindRequest, Layout, PayloadHold, Span};
    use std::sync::atomic::Ordering;
    use std::time::{Duration, Instant};

    fn wc(id: u64, status: WcStatus) -> Wc {
        Wc::new(id, status, WcOpcode::Send, 1)
    }

    /// Memory whose writes wait until the test lets them go (a copy that
    /// blocks: an ODP page fault, a peer client).
    #[derive(Debug)]
    struct SlowMemory {
        inner: Arc<crate::mem::Memory>,
        entered: std::sync::atomic::AtomicBool,
        release: std::sync::atomic::AtomicBool,
    }

    impl MemoryAccess for SlowMemory {
        fn resolve(
            &self,
            key: u32,
            pd: u32,
            iova: u64,
            len: u64,
            want: Want,
        ) -> std::result::Result<Span, AccessError> {
            MemoryAccess::resolve(&*self.inner, key, pd, iova, len, want)
        }
        fn resolve_remote(
            &self,
            key: u32,
            pd: u32,
            qpn: u32,
            iova: u64,
            len: u64,
            want: Want,
        ) -> std::result::Result<Span, AccessError> {
            MemoryAccess::resolve_remote(&*self.inner, key, pd, qpn, iova, len, want)
        }
        fn write(&self, span: &Span, offset: usize, data: &[u8]) -> std::result::Result<(), AccessError> {
            self.entered.store(true, Ordering::SeqCst);
            let deadline = Instant::now() + Duration::from_secs(10);
            while !self.release.load(Ordering::SeqCst) && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(1));
            }
            MemoryAccess::write(&*self.inner, span, offset, data)
        }
        fn read(&self, span: &Span, offset: usize, out: &mut [u8]) -> std::result::Result<(), AccessError> {
            MemoryAccess::read(&*self.inner, span, offset, out)
        }
        fn may_block(&self, _: &Span) -> bool {
            true
        }
        fn fault_in(&self, _: &Span, _: bool) {}
        fn atomic(&self, span: &Span, op: Atomic) -> std::result::Result<u64, AccessError> {
            MemoryAccess::atomic(&*self.inner, span, op)
        }
        fn pin_for_send(&self, span: Span) -> std::result::Result<PayloadHold, Span> {
            MemoryAccess::pin_for_send(&*self.inner, span)
        }
        fn bind_mw(&self, qp_pd: u32, qpn: u32, r: &BindRequest) -> std::result::Result<u32, BindError> {
            MemoryAccess::bind_mw(&*self.inner, qp_pd, qpn, r)
        }
        fn umr(&self, key: u32, pd: u32, layout: Layout) -> std::result::Result<(), BindError> {
            MemoryAccess::umr(&*self.inner, key, pd, layout)
        }
        fn invalidate(&self, key: u32, pd: u32, qpn: u32) -> std::result::Result<(), BindError> {
            MemoryAccess::invalidate(&*self.inner, key, pd, qpn)
        }
    }

    #[test]
    fn a_blocking_inline_scatter_does_not_hold_the_queue_lock() {
        let inner = crate::mem::Memory::new();
        let mut buf = Box::new([0u8; 64]);
        let at = buf.as_mut_ptr();
        // SAFETY: `buf` outlives the region (deregistered below).
        let mr = unsafe { inner.register(1, at as usize, 64, 0, crate::ib::Access::LOCAL_WRITE, None) }.unwrap();
        let slow = Arc::new(SlowMemory { inner: inner.clone(), entered: false.into(), release: false.into() });
        let cq = Arc::new(CompletionQueue::with_inline(1, 8, Some(slow.clone() as Arc<dyn MemoryAccess>), 64));
        let mut data = [0u8; MAX_INLINE_RECV];
        data[..4].copy_from_slice(b"uroc");
        let sges: SmallVec<[Sge; 2]> = [Sge { addr: 0, length: 64, lkey: mr.key }].into_iter().collect();
        cq.push_inline(wc(1, WcStatus::Success), false, InlineRecv { len: 4, data, pd: 1, sges });
        let poller = {
            let cq = cq.clone();
            std::thread::spawn(move || {
                let mut out = [wc(0, WcStatus::Success); 1];
                let n = cq.poll(&mut out).unwrap();
                (n, out[0].wr_id, out[0].status)
            })
        };
        let deadline = Instant::now() + Duration::from_secs(5);
        while !slow.entered.load(Ordering::SeqCst) && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(1));
        }
        assert!(slow.entered.load(Ordering::SeqCst), "the poll reached the scatter");
        // Another QP completes into the queue (under its shard's locks, in
        // the device) while the scatter blocks.
        let pushed = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let pusher = {
            let (cq, pushed) = (cq.clone(), pushed.clone());
            std::thread::spawn(move || {
                cq.push(wc(2, WcStatus::Success), false);
                pushed.store(true, Ordering::SeqCst);
            })
        };
        let deadline = Instant::now() + Duration::from_secs(2);
        while !pushed.load(Ordering::SeqCst) && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(1));
        }
        let pushed_while_blocked = pushed.load(Ordering::SeqCst);
        slow.release.store(true, Ordering::SeqCst);
        pusher.join().unwrap();
        assert_eq!(poller.join().unwrap(), (1, 1, WcStatus::Success));
        assert!(pushed_while_blocked, "a completion waited for another poll's blocking scatter");
        // SAFETY: the scatter wrote through `at`, which points into `buf`.
        assert_eq!(unsafe { std::ptr::read(at as *const [u8; 4]) }, *b"uroc");
        let mut out = [wc(0, WcStatus::Success); 4];
        assert_eq!(cq.poll(&mut out).unwrap(), 1);
        assert_eq!(out[0].wr_id, 2);
        let key = mr.key;
        drop(mr);
        inner.deregister(key).unwrap();
        drop(buf);
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
