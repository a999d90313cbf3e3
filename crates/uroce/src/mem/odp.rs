//! On-Demand Paging: regions whose pages are neither pinned nor required to
//! be mapped.
//!
//! # Mechanism
//!
//! A real ODP NIC keeps its own page table for the region, fills it on a
//! device page fault, and drops entries when the kernel's MMU notifier says
//! the process unmapped them. uroce does the same in user space:
//!
//! * **Access** never dereferences ODP memory directly. Copies go through
//!   `process_vm_readv`/`process_vm_writev` on this very process: the kernel
//!   faults pages in on the way (a never-touched page is allocated, a
//!   swapped one read back) and answers `EFAULT` for an address that is not
//!   mapped or not writable, which becomes an access error (remote:
//!   `REM_ACCESS_ERR`; local: `LOC_PROT_ERR`), never a crash. Because every
//!   access goes through the current page tables, RDMA after `munmap` +
//!   `mmap` at the same address sees the new memory, never the old pages.
//! * **The device's translation** is modelled as the set of pages the device
//!   has touched (`RangeSet` of page numbers). A page entering it is a
//!   page fault (`page_faults`, one `page_faults_handled` per access that
//!   added pages) or a prefetch (`page_prefetch`).
//! * **Invalidation** comes from a process-wide userfaultfd registered in
//!   write-protect mode over the pages the device touched (see
//!   `mem::notifier`): `munmap`, `mremap`, `MADV_DONTNEED`/`MADV_FREE` and
//!   `mmap(MAP_FIXED)` over them produce events that drop the pages from the
//!   translation (`page_invalidations`, `page_invalidations_handled`).
//! * **Atomics** need the 8 bytes in place: the page is populated writable
//!   with `madvise(MADV_POPULATE_WRITE)` (which fails cleanly on an unmapped
//!   or read-only page) and the atomic then runs on it.
//!
//! # Limits
//!
//! * An application that unmaps a page between the populate and the atomic
//!   instruction (a window of nanoseconds) gets an access error, not a
//!   crash: the atomic is one of the fault-tolerant routines of `mem::safe`
//!   (x86_64 Linux; elsewhere it may still fault).
//! * Without userfaultfd (a kernel built without it, or a seccomp policy
//!   that forbids it) data stays correct but `page_invalidations` stays 0;
//!   [`notifier_available`] tells which.
//! * `mprotect` and `fork` produce no event (as with the kernel notifier, a
//!   later access simply fails or succeeds under the new protection).

use super::notifier;
use super::rangeset::RangeSet;
use super::error::AccessError;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

#[cfg(feature = "unstable")]
pub use notifier::available as notifier_available;

/// The system page size.
pub fn page_size() -> u64 {
    static PAGE: OnceLock<u64> = OnceLock::new();
    // SAFETY: sysconf has no memory-safety preconditions.
    *PAGE.get_or_init(|| unsafe { libc::sysconf(libc::_SC_PAGESIZE) }.max(4096) as u64)
}

/// Page numbers covering `addr..addr+len`.
pub(crate) fn pages(addr: u64, len: u64) -> (u64, u64) {
    let p = page_size();
    (addr / p, (addr.saturating_add(len)).div_ceil(p))
}

/// ODP counters, with the names and meanings of mlx5's `rdma stat mr`.
#[derive(Debug, Default)]
pub struct OdpCounters {
    page_faults: AtomicU64,
    page_faults_handled: AtomicU64,
    page_invalidations: AtomicU64,
    page_invalidations_handled: AtomicU64,
    page_prefetch: AtomicU64,
}

/// A snapshot of the region's ODP counters.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct OdpStats {
    /// Pages mapped by page-fault events.
    pub page_faults: u64,
    /// Page-fault events (accesses that mapped at least one page).
    pub page_faults_handled: u64,
    /// Pages unmapped by invalidations.
    pub page_invalidations: u64,
    /// Invalidation events that unmapped at least one page.
    pub page_invalidations_handled: u64,
    /// Pages mapped by `ibv_advise_mr`.
    pub page_prefetch: u64,
}

impl OdpStats {
    /// (name, value) pairs in mlx5's order.
    pub fn fields(&self) -> [(&'static str, u64); 5] {
        [
            ("page_faults", self.page_faults),
            ("page_faults_handled", self.page_faults_handled),
            ("page_invalidations", self.page_invalidations),
            ("page_invalidations_handled", self.page_invalidations_handled),
            ("page_prefetch", self.page_prefetch),
        ]
    }
}

impl OdpCounters {
    pub fn snapshot(&self) -> OdpStats {
        OdpStats {
            page_faults: self.page_faults.load(Ordering::Relaxed),
            page_faults_handled: self.page_faults_handled.load(Ordering::Relaxed),
            page_invalidations: self.page_invalidations.load(Ordering::Relaxed),
            page_invalidations_handled: self.page_invalidations_handled.load(Ordering::Relaxed),
            page_prefetch: self.page_prefetch.load(Ordering::Relaxed),
        }
    }
}

/// What `ibv_advise_mr` asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Advice {
    /// Make pages present, readable.
    Prefetch,
    /// Make pages present and writable.
    PrefetchWrite,
    /// Map only pages the CPU already has; fault nothing.
    PrefetchNoFault,
}

/// The ODP state of one region.
#[derive(Debug)]
pub struct OdpRegion {
    pub implicit: bool,
    /// Host range of an explicit region.
    range: Option<(u64, u64)>,
    /// The whole explicit range is watched for invalidations.
    watched_all: std::sync::atomic::AtomicBool,
    /// Pages the device has translated (page numbers).
    mapped: Mutex<RangeSet>,
    counters: OdpCounters,
    /// The device's totals.
    device: Arc<OdpCounters>,
}

impl OdpRegion {
    /// `range`: the host range of an explicit region; `None` for implicit ODP.
    pub(crate) fn new(range: Option<(u64, u64)>, device: Arc<OdpCounters>) -> Arc<OdpRegion> {
        let r = Arc::new(OdpRegion {
            implicit: range.is_none(),
            range,
            watched_all: Default::default(),
            mapped: Mutex::new(RangeSet::new()),
            counters: OdpCounters::default(),
            device,
        });
        notifier::subscribe(Arc::downgrade(&r) as std::sync::Weak<dyn notifier::Subscriber>);
        r
    }

    pub fn stats(&self) -> OdpStats {
        notifier::drain();
        self.counters.snapshot()
    }

    #[cfg(feature = "unstable")]
    /// Pages currently in the device's translation.
    pub fn mapped_pages(&self) -> u64 {
        notifier::drain();
        self.mapped.lock().unwrap().total()
    }

    /// Whether the device translates every page of `addr..addr+len` (faulted
    /// in and not invalidated since): a copy there will not wait for the
    /// kernel to fault pages in.
    pub(crate) fn translated(&self, addr: u64, len: u64) -> bool {
        let (first, end) = pages(addr, len);
        notifier::drain();
        self.mapped.lock().unwrap().contains(first, end)
    }

    fn add(&self, c: impl Fn(&OdpCounters) -> &AtomicU64, n: u64) {
        c(&self.counters).fetch_add(n, Ordering::Relaxed);
        c(&self.device).fetch_add(n, Ordering::Relaxed);
    }

    /// Records that the device now translates `addr..addr+len`.
    fn map(&self, addr: u64, len: u64, prefetch: bool) {
        let (first, end) = pages(addr, len);
        // Apply pending invalidations first: a page unmapped and mapped again
        // since the last access must count as a new fault.
        notifier::drain();
        let added = self.mapped.lock().unwrap().insert(first, end);
        if added > 0 {
            if prefetch {
                self.add(|c| &c.page_prefetch, added);
            } else {
                self.add(|c| &c.page_faults, added);
                self.add(|c| &c.page_faults_handled, 1);
            }
            self.watch(first, end);
        }
    }

    /// Watches pages `first..end` for invalidations: the whole explicit
    /// range with one registration when it is all mapped, else the pages
    /// just faulted (registrations must cover mapped memory only).
    fn watch(&self, first: u64, end: u64) {
        let p = page_size();
        if self.watched_all.load(Ordering::Relaxed) {
            return;
        }
        if let Some((s, e)) = self.range {
            if notifier::watch(s / p * p, e.div_ceil(p) * p) {
                self.watched_all.store(true, Ordering::Relaxed);
                return;
            }
        }
        notifier::watch(first * p, end * p);
    }

    /// Drops `start..end` (addresses) from the translation: an invalidation.
    /// `unmapped`: the mapping itself went away (its watch with it).
    pub(crate) fn invalidate(&self, start: u64, end: u64, unmapped: bool) {
        if unmapped && self.range.is_some_and(|(s, e)| start < e && s < end) {
            self.watched_all.store(false, Ordering::Relaxed);
        }
        let (first, last) = (start / page_size(), end.div_ceil(page_size()));
        let removed = self.mapped.lock().unwrap().remove(first, last);
        if removed > 0 {
            self.add(|c| &c.page_invalidations, removed);
            self.add(|c| &c.page_invalidations_handled, 1);
        }
    }

    /// Drops everything (the notifier lost events).
    pub(crate) fn invalidate_all(&self) {
        self.watched_all.store(false, Ordering::Relaxed);
        let removed = self.mapped.lock().unwrap().clear();
        if removed > 0 {
            self.add(|c| &c.page_invalidations, removed);
            self.add(|c| &c.page_invalidations_handled, 1);
        }
    }

    pub(crate) fn write(&self, addr: usize, data: &[u8]) -> Result<(), AccessError> {
        if data.is_empty() {
            return Ok(());
        }
        let local = libc::iovec { iov_base: data.as_ptr() as *mut libc::c_void, iov_len: data.len() };
        let remote = libc::iovec { iov_base: addr as *mut libc::c_void, iov_len: data.len() };
        // SAFETY: process_vm_writev reads `data` (a live slice) and writes
        // this process's memory at `addr` through the kernel, which checks
        // the mapping and its protection page by page and returns EFAULT
        // instead of touching an unmapped or read-only page. No Rust
        // reference covers `addr`.
        let n = unsafe { libc::process_vm_writev(libc::getpid(), &local, 1, &remote, 1, 0) };
        if n != data.len() as isize {
            return Err(AccessError::Fault);
        }
        self.map(addr as u64, data.len() as u64, false);
        Ok(())
    }

    pub(crate) fn read(&self, addr: usize, out: &mut [u8]) -> Result<(), AccessError> {
        if out.is_empty() {
            return Ok(());
        }
        let local = libc::iovec { iov_base: out.as_mut_ptr() as *mut libc::c_void, iov_len: out.len() };
        let remote = libc::iovec { iov_base: addr as *mut libc::c_void, iov_len: out.len() };
        // SAFETY: as in `write`, in the other direction; `out` is an
        // exclusive slice the kernel fills.
        let n = unsafe { libc::process_vm_readv(libc::getpid(), &local, 1, &remote, 1, 0) };
        if n != out.len() as isize {
            return Err(AccessError::Fault);
        }
        self.map(addr as u64, out.len() as u64, false);
        Ok(())
    }

    /// Faults `addr..addr+len` in for the device (writable if `write`), as
    /// the device's own access would page by page: counted as page faults,
    /// one event.
    pub(crate) fn fault_in(&self, addr: u64, len: u64, write: bool) -> Result<(), AccessError> {
        if len == 0 {
            return Ok(());
        }
        populate(addr, len, write).map_err(|_| AccessError::Fault)?;
        self.map(addr, len, false);
        Ok(())
    }

    /// Makes the 8 bytes at `addr` present and writable for an atomic.
    pub(crate) fn prepare_atomic(&self, addr: usize) -> Result<(), AccessError> {
        populate(addr as u64, 8, true).map_err(|_| AccessError::Fault)?;
        self.map(addr as u64, 8, false);
        Ok(())
    }

    /// `ibv_advise_mr` on `addr..addr+len`. Errors: EFAULT when a page cannot
    /// be made present as asked.
    pub(crate) fn advise(&self, advice: Advice, addr: u64, len: u64) -> Result<(), libc::c_int> {
        if len == 0 {
            return Ok(());
        }
        match advice {
            Advice::Prefetch | Advice::PrefetchWrite => {
                populate(addr, len, advice == Advice::PrefetchWrite)?;
                self.map(addr, len, true);
            }
            Advice::PrefetchNoFault => {
                for (s, e) in resident_runs(addr, len) {
                    self.map(s, e - s, true);
                }
            }
        }
        Ok(())
    }
}

impl Drop for OdpRegion {
    fn drop(&mut self) {
        // The notifier holds only weak references; nothing to undo. Watched
        // ranges stay registered with the userfaultfd (an unmap of them costs
        // the application one event read, a few microseconds).
    }
}

/// `madvise(MADV_POPULATE_READ/WRITE)` over the pages of `addr..addr+len`.
fn populate(addr: u64, len: u64, write: bool) -> Result<(), libc::c_int> {
    let p = page_size();
    let start = addr / p * p;
    let end = addr.checked_add(len).ok_or(libc::EFAULT)?.div_ceil(p) * p;
    let advice = if write { libc::MADV_POPULATE_WRITE } else { libc::MADV_POPULATE_READ };
    // SAFETY: MADV_POPULATE_* only faults pages in as a CPU access would; it
    // changes no contents and fails with EFAULT/ENOMEM on unmapped or
    // inaccessible ranges instead of raising a signal.
    let r = unsafe { libc::madvise(start as *mut libc::c_void, (end - start) as usize, advice) };
    if r != 0 {
        // ENOMEM is madvise's word for "not mapped".
        return Err(match std::io::Error::last_os_error().raw_os_error() {
            Some(libc::EPERM) => libc::EPERM,
            _ => libc::EFAULT,
        });
    }
    Ok(())
}

/// Runs of pages of `addr..addr+len` that are resident now (mincore),
/// skipping unmapped holes.
pub(super) fn resident_runs(addr: u64, len: u64) -> Vec<(u64, u64)> {
    let p = page_size();
    let (first, end) = pages(addr, len);
    let mut runs: Vec<(u64, u64)> = Vec::new();
    // Query in chunks so a huge range needs no huge vector.
    const CHUNK: u64 = 4096;
    let mut page = first;
    while page < end {
        let n = (end - page).min(CHUNK);
        let mut vec = vec![0u8; n as usize];
        // SAFETY: mincore writes one byte per page into `vec`, which has
        // exactly `n` bytes; it only reads page-table state.
        let r = unsafe { libc::mincore((page * p) as *mut libc::c_void, (n * p) as usize, vec.as_mut_ptr()) };
        if r == 0 {
            for (i, v) in vec.iter().enumerate() {
                if v & 1 == 1 {
                    let a = (page + i as u64) * p;
                    match runs.last_mut() {
                        Some(last) if last.1 == a => last.1 = a + p,
                        _ => runs.push((a, a + p)),
                    }
                }
            }
        } else {
            // ENOMEM: part of the chunk is unmapped; go page by page.
            for i in 0..n {
                let mut v = 0u8;
                let a = (page + i) * p;
                // SAFETY: one page, one byte of output.
                if unsafe { libc::mincore(a as *mut libc::c_void, p as usize, &mut v) } == 0 && v & 1 == 1 {
                    match runs.last_mut() {
                        Some(last) if last.1 == a => last.1 = a + p,
                        _ => runs.push((a, a + p)),
                    }
                }
            }
        }
        page += n;
    }
    runs
}

impl notifier::Subscriber for OdpRegion {
    fn invalidate(&self, start: u64, end: u64, unmapped: bool) {
        OdpRegion::invalidate(self, start, end, unmapped)
    }
    fn invalidate_all(&self) {
        OdpRegion::invalidate_all(self)
    }
}
