//! Device memory (`ibv_alloc_dm`, `ibv_memcpy_to/from_dm`, `ibv_reg_dm_mr`):
//! the user-space stand-in for a NIC's on-chip memory. An allocation is a
//! zeroed, 8-byte-aligned buffer owned by the library, reachable by the host
//! only through the copy functions (4-byte granularity, as mlx5's MEMIC) and
//! by the device through zero-based memory regions registered over it. The
//! `ibv_dm` that allocated it and the copies `ibv_import_dm` makes of it
//! (`import.rs`) share the allocation.

use crate::errno::{fail, null};
use crate::ffi::*;
use crate::objects::{UMr, UPd};
use std::ffi::c_int;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use uroce::ib::Access;

/// Largest allocation (reported as `max_dm_size`).
pub const MAX_DM_SIZE: u64 = 256 * 1024;
/// Copy granularity.
const DM_ALIGN: u64 = 4;

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

impl Allocation {
    fn new(len: u64) -> Allocation {
        let words = len.div_ceil(8) as usize;
        let mem: Box<[u64]> = vec![0u64; words].into_boxed_slice();
        // SAFETY: Box::into_raw never returns NULL.
        let base = unsafe { NonNull::new_unchecked(Box::into_raw(mem) as *mut u64) };
        Allocation { base, words, len, regs: AtomicUsize::new(0) }
    }

    fn ptr(&self) -> *mut u8 {
        self.base.as_ptr() as *mut u8
    }

    /// Whether `off..off+len` is an aligned range inside the allocation.
    fn check(&self, off: u64, len: usize) -> bool {
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

#[repr(C)]
pub struct UDm {
    pub dm: ibv_dm,
    pub alloc: Arc<Allocation>,
}

/// Held by a DM memory region: keeps the allocation alive and busy.
pub struct DmRef(Arc<Allocation>);

impl DmRef {
    fn new(alloc: &Arc<Allocation>) -> DmRef {
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

/// `verbs_context.alloc_dm`.
pub unsafe extern "C" fn alloc_dm(ctx: *mut ibv_context, attr: *mut ibv_alloc_dm_attr) -> *mut ibv_dm {
    if ctx.is_null() || attr.is_null() {
        return null(libc::EINVAL);
    }
    // SAFETY: the caller's attributes.
    let a = unsafe { &*attr };
    if a.comp_mask != 0 || a.log_align_req > 12 {
        return null(libc::EINVAL);
    }
    if a.length == 0 || a.length as u64 > MAX_DM_SIZE {
        return null(libc::ENOMEM);
    }
    let len = (a.length as u64).div_ceil(DM_ALIGN) * DM_ALIGN;
    let alloc = Arc::new(Allocation::new(len));
    // SAFETY: `ctx` is a context of this library.
    unsafe { crate::import::publish_dm(ctx, alloc) }
}

/// `verbs_context.free_dm`: EBUSY while memory regions use it. Freeing
/// through any `ibv_dm` naming the allocation (an imported copy too) frees
/// the object (`import.rs`).
pub unsafe extern "C" fn free_dm(dm: *mut ibv_dm) -> c_int {
    if dm.is_null() {
        return libc::EINVAL;
    }
    // SAFETY: a DM from alloc_dm or ibv_import_dm.
    if let Some(rc) = unsafe { crate::import::free_dm(dm) } {
        return rc;
    }
    // SAFETY: as above.
    let d = unsafe { &*(dm as *const UDm) };
    if d.alloc.in_use() {
        return libc::EBUSY;
    }
    // SAFETY: no region uses it; freed once.
    drop(unsafe { Box::from_raw(dm as *mut UDm) });
    0
}

/// `verbs_context.reg_dm_mr`: a zero-based region over `off..off+len` of the
/// allocation (mlx5 requires IBV_ACCESS_ZERO_BASED).
pub unsafe extern "C" fn reg_dm_mr(pd: *mut ibv_pd, dm: *mut ibv_dm, off: u64, len: usize, access: u32) -> *mut ibv_mr {
    if pd.is_null() || dm.is_null() {
        return null(libc::EINVAL);
    }
    let access = Access::from_bits_retain(access);
    let allowed =
        Access::LOCAL_WRITE | Access::REMOTE_WRITE | Access::REMOTE_READ | Access::REMOTE_ATOMIC | Access::ZERO_BASED;
    if !access.contains(Access::ZERO_BASED) || !allowed.contains(access) {
        return null(libc::EINVAL);
    }
    // SAFETY: a PD from ibv_alloc_pd and a DM from alloc_dm.
    let (p, d) = unsafe { (&*(pd as *const UPd), &*(dm as *const UDm)) };
    if off.checked_add(len as u64).is_none_or(|e| e > d.alloc.len) {
        return null(libc::EINVAL);
    }
    let Some(inner) = p.inner.as_ref() else { return null(libc::EINVAL) };
    // SAFETY: the allocation outlives the region, which holds it (DmRef).
    let r = unsafe { inner.register_raw(d.alloc.ptr().add(off as usize), len, 0, access - Access::ZERO_BASED) };
    match r {
        Ok(mr) => {
            let raw = ibv_mr {
                context: p.pd.context,
                pd,
                addr: off as usize as *mut libc::c_void,
                length: len,
                handle: 0, // named by publish_mr
                lkey: mr.lkey(),
                rkey: mr.rkey(),
            };
            // SAFETY: the PD's context is ours.
            unsafe { crate::import::publish_mr(UMr { mr: raw, inner: Some(mr), dm: Some(DmRef::new(&d.alloc)) }) }
        }
        Err(e) => null(fail(&e)),
    }
}
