//! Memory regions and spans: a validated piece of a region that copies bytes
//! in and out. The direct path for pinned host memory lives here.

use crate::ib::Access;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;

/// Where a region's bytes live.
pub enum Backing {
    /// Pinned memory of this process at `addr` (the host address of `iova`).
    /// `owner`, when set, keeps the buffer alive as long as the region.
    Host { addr: usize, owner: Option<Arc<dyn std::any::Any + Send + Sync>> },
}

impl std::fmt::Debug for Backing {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Backing::Host { addr, owner } => f
                .debug_struct("Host")
                .field("addr", &format_args!("{addr:#x}"))
                .field("owned", &owner.is_some())
                .finish(),
        }
    }
}

/// A registered memory region. `key` serves as both lkey and rkey.
#[derive(Debug)]
pub struct MemoryRegion {
    pub pd: u32,
    pub key: u32,
    pub iova: u64,
    pub length: u64,
    pub access: Access,
    pub backing: Backing,
    /// Spans alive: transfers in progress. Deregistration waits for zero.
    pub(crate) spans: AtomicUsize,
    /// Memory windows bound to this region (deregistration is EBUSY).
    pub(crate) windows: AtomicUsize,
}

impl MemoryRegion {
    pub fn new(pd: u32, key: u32, iova: u64, length: u64, access: Access, backing: Backing) -> MemoryRegion {
        MemoryRegion {
            pd,
            key,
            iova,
            length,
            access,
            backing,
            spans: AtomicUsize::new(0),
            windows: AtomicUsize::new(0),
        }
    }

    /// Number of memory windows bound to the region.
    pub fn bound_windows(&self) -> usize {
        self.windows.load(Ordering::Acquire)
    }

    /// Waits until no transfer uses the region.
    pub(crate) fn wait_unused(&self) {
        let mut spins = 0u32;
        while self.spans.load(Ordering::Acquire) > 0 {
            spins += 1;
            if spins > 64 {
                std::thread::sleep(std::time::Duration::from_micros(50));
            } else {
                std::thread::yield_now();
            }
        }
    }

    /// The span `iova..iova+len`, if it lies inside the region.
    pub fn span(self: &Arc<Self>, iova: u64, len: u64) -> Option<Span> {
        let off = iova.checked_sub(self.iova)?;
        if off.checked_add(len)? > self.length {
            return None;
        }
        let Backing::Host { addr, .. } = self.backing;
        self.spans.fetch_add(1, Ordering::AcqRel);
        Some(Span { host: addr + off as usize, len: len as usize, mr: Some(self.clone()) })
    }
}

/// A checked, in-bounds piece of registered memory. Holding it keeps the
/// region registered (deregistration waits for it).
#[derive(Debug)]
pub struct Span {
    host: usize,
    len: usize,
    mr: Option<Arc<MemoryRegion>>,
}

impl Drop for Span {
    fn drop(&mut self) {
        if let Some(mr) = &self.mr {
            mr.spans.fetch_sub(1, Ordering::AcqRel);
        }
    }
}

impl Span {
    pub(crate) fn empty() -> Span {
        Span { host: 0, len: 0, mr: None }
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Copies `data` to `offset` within the span.
    ///
    /// # Panics
    /// If the copy would leave the span (a bug in the caller, never a
    /// consequence of packet contents, which `Memory::resolve` checked).
    pub fn write(&self, offset: usize, data: &[u8]) {
        assert!(offset.checked_add(data.len()).is_some_and(|e| e <= self.len), "span overrun");
        if data.is_empty() {
            return;
        }
        // SAFETY: [host, host+len) lies inside a registered region whose memory
        // the registrant keeps valid until deregistration, and deregistration
        // waits while this Span (holding the region) exists. The bounds were
        // checked above. The source is a Rust slice, so the ranges cannot
        // overlap unless the application posts overlapping buffers, in which
        // case the bytes are garbage but memory stays in bounds.
        unsafe { std::ptr::copy(data.as_ptr(), (self.host + offset) as *mut u8, data.len()) }
    }

    /// Copies from `offset` within the span into `out`.
    pub fn read(&self, offset: usize, out: &mut [u8]) {
        assert!(offset.checked_add(out.len()).is_some_and(|e| e <= self.len), "span overrun");
        if out.is_empty() {
            return;
        }
        // SAFETY: as in `write`; the destination is an exclusive Rust slice.
        unsafe { std::ptr::copy((self.host + offset) as *const u8, out.as_mut_ptr(), out.len()) }
    }

    fn atomic(&self) -> &AtomicU64 {
        assert!(self.len >= 8 && self.host % 8 == 0, "atomic span must be 8 aligned bytes");
        // SAFETY: 8 in-bounds, 8-byte-aligned bytes of registered memory (see
        // `write`); AtomicU64 has the layout of u64, and concurrent CPU or
        // device accesses through atomics are well defined.
        unsafe { &*(self.host as *const AtomicU64) }
    }

    /// Atomic compare-and-swap of the 8 bytes at the span's start (host
    /// order); returns the original value.
    pub fn compare_swap(&self, compare: u64, swap: u64) -> u64 {
        match self.atomic().compare_exchange(compare, swap, Ordering::SeqCst, Ordering::SeqCst) {
            Ok(v) | Err(v) => v,
        }
    }

    /// Atomic fetch-and-add; returns the original value.
    pub fn fetch_add(&self, add: u64) -> u64 {
        self.atomic().fetch_add(add, Ordering::SeqCst)
    }
}
