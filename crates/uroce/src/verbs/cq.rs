//! Completion queues (`ibv_cq`).

use super::attr::MAX_CQE;
use super::context::{CompletionChannel, Context};
use super::device::ChannelInner;
use crate::ib::{Errno, Error, Result, Wc};
use crate::proto::cq::CompletionQueue as Ring;
use std::sync::Arc;

/// A completion queue (`ibv_cq`).
pub struct CompletionQueue {
    pub(crate) ctx: Context,
    pub(crate) ring: Arc<Ring>,
    channel: Option<Arc<ChannelInner>>,
}

impl Context {
    /// A completion queue of `cqe` entries, 1 to 2^22 − 1
    /// (`ibv_create_cq`); its events go to `channel`, if given.
    pub fn create_cq(&self, cqe: u32, channel: Option<&CompletionChannel>) -> Result<CompletionQueue> {
        CompletionQueue::new(self.clone(), cqe, channel)
    }
}

impl CompletionQueue {
    pub(crate) fn new(ctx: Context, cqe: u32, channel: Option<&CompletionChannel>) -> Result<CompletionQueue> {
        if cqe == 0 || cqe > MAX_CQE {
            return Err(Error::inval(format!("create_cq: cqe must be 1..={MAX_CQE}")));
        }
        let handle = ctx.dev.next_handle();
        let ring = Arc::new(Ring::with_inline(handle, cqe as usize, Some(ctx.dev.mem.clone()), ctx.dev.inline_recv));
        ctx.dev.track_events(crate::proto::EventElement::Cq(handle));
        let channel = channel.map(|c| c.inner.clone());
        if channel.as_ref().is_some_and(|c| c.is_application()) {
            ring.count_arms_in(ctx.dev.rt.presence().clone());
        }
        if let Some(ch) = &channel {
            ch.cqs.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            ctx.dev.bind_channel(handle, ch);
        }
        Ok(CompletionQueue { ctx, ring, channel })
    }

    /// The device-wide handle (what a completion channel event names).
    pub fn handle(&self) -> u32 {
        self.ring.handle
    }

    /// Number of entries.
    pub fn capacity(&self) -> usize {
        self.ring.capacity()
    }

    /// Polls up to `out.len()` completions (`ibv_poll_cq`).
    /// An empty poll drives the device from the caller's thread (see
    /// `Runtime::try_progress`), so busy-polling applications make progress
    /// without waiting for the progress thread to be scheduled.
    pub fn poll(&self, out: &mut [Wc]) -> Result<usize> {
        let n = self.ring.poll(out)?;
        if n == 0 && !out.is_empty() && self.ctx.dev.rt.try_progress() {
            return self.ring.poll(out);
        }
        Ok(n)
    }

    /// Whether a completion was lost because the queue was full: the CQ is
    /// in error (IBV_EVENT_CQ_ERR was raised) and polls fail with EIO once
    /// the stored completions are taken.
    pub fn is_overrun(&self) -> bool {
        self.ring.is_overrun()
    }

    /// Polls one completion.
    pub fn poll_one(&self) -> Option<Wc> {
        self.ring.poll_one().or_else(|| if self.ctx.dev.rt.try_progress() { self.ring.poll_one() } else { None })
    }

    /// Polls one completion; EIO once the queue is overrun and what it
    /// stored is taken. An empty poll and the overrun are not one atomic
    /// look, so an overrun seen after an empty poll looks once more: the
    /// completions stored just before it still come first (nothing is
    /// stored after an overrun).
    pub fn poll_one_or_overrun(&self) -> Result<Option<Wc>> {
        if let Some(wc) = self.poll_one() {
            return Ok(Some(wc));
        }
        if !self.ring.is_overrun() {
            return Ok(None);
        }
        self.ring.poll_one().map(Some).ok_or_else(|| Error::new(Errno::EIO, "completion queue overrun"))
    }

    /// Arms the CQ for one completion event on its channel
    /// (`ibv_req_notify_cq`).
    pub fn req_notify(&self, solicited_only: bool) -> Result<()> {
        if self.channel.is_none() {
            return Err(Error::inval("req_notify_cq: CQ has no completion channel"));
        }
        let newly = self.ring.arm(solicited_only);
        if newly && self.channel.as_ref().is_some_and(|c| c.is_application()) {
            self.ctx.dev.rt.cq_armed();
        }
        Ok(())
    }

    /// `ibv_resize_cq`.
    pub fn resize(&self, cqe: u32) -> Result<()> {
        if cqe == 0 || cqe > MAX_CQE {
            return Err(Error::inval(format!("resize_cq: cqe must be 1..={MAX_CQE}")));
        }
        self.ring.resize(cqe as usize)
    }

    /// Waits up to `timeout` for `n` completions, polling (for tests and
    /// tools).
    pub fn wait(&self, n: usize, timeout: std::time::Duration) -> Result<Vec<Wc>> {
        let deadline = std::time::Instant::now() + timeout;
        let mut out = Vec::with_capacity(n);
        while out.len() < n {
            if let Some(wc) = self.ring.poll_one() {
                out.push(wc);
                continue;
            }
            if std::time::Instant::now() >= deadline {
                return Err(Error::new(
                    crate::ib::Errno(libc::ETIMEDOUT),
                    format!("waited {timeout:?} for {n} completions, got {}", out.len()),
                ));
            }
            std::thread::sleep(std::time::Duration::from_micros(20));
        }
        Ok(out)
    }

    /// Destroys the CQ, or fails with EBUSY while a QP uses it.
    pub fn destroy(self) -> std::result::Result<(), (Self, Error)> {
        if Arc::strong_count(&self.ring) > 1 {
            return Err((self, Error::new(crate::ib::Errno::EBUSY, "destroy_cq: CQ in use by a QP")));
        }
        Ok(())
    }
}

impl Drop for CompletionQueue {
    fn drop(&mut self) {
        self.ctx.dev.untrack_events(crate::proto::EventElement::Cq(self.ring.handle));
        if let Some(ch) = &self.channel {
            self.ctx.dev.unbind_channel(self.ring.handle);
            ch.discard(self.ring.handle);
            ch.cqs.fetch_sub(1, std::sync::atomic::Ordering::SeqCst);
        }
    }
}

impl std::fmt::Debug for CompletionQueue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CompletionQueue").field("handle", &self.ring.handle).finish()
    }
}
