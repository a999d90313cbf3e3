//! The memory of a device-memory allocation (`ibv_alloc_dm`): a zeroed,
//! 8-byte-aligned buffer owned by the library, the host's copies into and
//! out of it (`ibv_memcpy_to_dm`, `ibv_memcpy_from_dm`, 4-byte granularity as
//! mlx5's MEMIC), and the hold a memory region over it keeps. The verbs that
//! allocate, free and register it are in `dm.rs`.

use crate::ffi::*;
use std::ffi::c_int;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

/// Largest allocation (reported as `max_dm_size`).
pub const MAX_DM_SIZE: u64 = 256 * 1024;
/// Copy granularity.
pub(crate) const DM_ALIGN: u64 = 4;

/// The memory of one allocation. It lives as long as an `ibv_dm` naming it
/// or a memory region over it.
pub struct Allocation {
    /// `words` zeroed 8-byte words from a leaked `Box<[u64]>`; accessed only
    /// through raw pointers (the host's copies, the device's accesses).
    base: NonNull<u64>,
    words: usize,
    /// Usable bytes (a multiple of [`DM_ALIGN`]).
    len: u64,
    /// Memory regions registered over the allocation.
    regs: AtomicUsize,
}

// SAFETY: the buffer is owned by the allocation and reached only through raw
// pointers, as device memory: concurrent copies are the application's to
// order, as on a NIC.
unsafe impl Send for Allocation {}

// SAFETY: as above; the counter is atomic.
unsafe impl Sync for Allocation {}

/// An `ibv_dm` followed by its allocation: the one `ibv_alloc_dm` made, or
/// an `ibv_import_dm` copy sharing it.
#[repr(C)]
pub struct UDm {
    pub dm: ibv_dm,
    pub alloc: Arc<Allocation>,
}

/// Held by a DM memory region: keeps the allocation alive and busy.
pub struct DmRef(Arc<Allocation>);

impl Allocation {
    pub(crate) fn new(len: u64) -> Allocation {
        let words = len.div_ceil(8) as usize;
        let mem: Box<[u64]> = vec![0u64; words].into_boxed_slice();
        // SAFETY: Box::into_raw never returns NULL.
        let base = unsafe { NonNull::new_unchecked(Box::into_raw(mem) as *mut u64) };
        Allocation { base, words, len, regs: AtomicUsize::new(0) }
    }

    /// Usable bytes.
    pub(crate) fn len(&self) -> u64 {
        self.len
    }

    pub(crate) fn ptr(&self) -> *mut u8 {
        self.base.as_ptr() as *mut u8
    }

    /// Whether `off..off+len` is an aligned range inside the allocation.
    pub(crate) fn check(&self, off: u64, len: usize) -> bool {
        off % DM_ALIGN == 0 && len as u64 % DM_ALIGN == 0 && off.checked_add(len as u64).is_some_and(|e| e <= self.len)
    }

    /// Whether memory regions are registered over it (`ibv_free_dm`: EBUSY).
    pub fn in_use(&self) -> bool {
        self.regs.load(Ordering::Acquire) > 0
    }
}

impl Drop for Allocation {
    fn drop(&mut self) {
        // SAFETY: `base`/`words` came from a Box<[u64]> leaked in `new`; no
        // ibv_dm and no region refers to it any more.
        drop(unsafe { Box::from_raw(std::ptr::slice_from_raw_parts_mut(self.base.as_ptr(), self.words)) });
    }
}

impl DmRef {
    pub(crate) fn new(alloc: &Arc<Allocation>) -> DmRef {
        alloc.regs.fetch_add(1, Ordering::AcqRel);
        DmRef(alloc.clone())
    }
}

impl Drop for DmRef {
    fn drop(&mut self) {
        self.0.regs.fetch_sub(1, Ordering::AcqRel);
    }
}

impl UDm {
    /// An `ibv_dm` on `ctx` for `alloc`, named `handle`.
    pub fn new(ctx: *mut ibv_context, handle: u32, alloc: Arc<Allocation>) -> UDm {
        // SAFETY: ibv_dm is plain old data; all-zero is valid before we set it.
        let mut dm: ibv_dm = unsafe { std::mem::zeroed() };
        dm.context = ctx;
        dm.memcpy_to_dm = Some(memcpy_to_dm);
        dm.memcpy_from_dm = Some(memcpy_from_dm);
        dm.handle = handle;
        UDm { dm, alloc }
    }
}

unsafe extern "C" fn memcpy_to_dm(dm: *mut ibv_dm, off: u64, host: *const libc::c_void, len: usize) -> c_int {
    // SAFETY: a DM from alloc_dm.
    let d = unsafe { &*(dm as *const UDm) };
    if host.is_null() || !d.alloc.check(off, len) {
        return libc::EINVAL;
    }
    // SAFETY: the range lies inside the allocation (checked); `host` is the
    // caller's buffer of `len` bytes.
    unsafe { std::ptr::copy(host as *const u8, d.alloc.ptr().add(off as usize), len) };
    0
}

unsafe extern "C" fn memcpy_from_dm(host: *mut libc::c_void, dm: *mut ibv_dm, off: u64, len: usize) -> c_int {
    // SAFETY: a DM from alloc_dm.
    let d = unsafe { &*(dm as *const UDm) };
    if host.is_null() || !d.alloc.check(off, len) {
        return libc::EINVAL;
    }
    // SAFETY: as in memcpy_to_dm, in the other direction.
    unsafe { std::ptr::copy(d.alloc.ptr().add(off as usize), host as *mut u8, len) };
    0
}
