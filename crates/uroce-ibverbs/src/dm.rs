//! Device memory (`ibv_alloc_dm`, `ibv_memcpy_to/from_dm`, `ibv_reg_dm_mr`):
//! the user-space stand-in for a NIC's on-chip memory. An allocation is a
//! zeroed, 8-byte-aligned buffer owned by the library, reachable by the host
//! only through the copy functions (4-byte granularity, as mlx5's MEMIC) and
//! by the device through zero-based memory regions registered over it.

use crate::errno::{fail, null};
use crate::ffi::*;
use crate::objects::{UMr, UPd};
use std::ffi::c_int;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use uroce::ib::Access;

/// Largest allocation (reported as `max_dm_size`).
pub const MAX_DM_SIZE: u64 = 256 * 1024;
/// Copy granularity.
const DM_ALIGN: u64 = 4;

#[repr(C)]
pub struct UDm {
    pub dm: ibv_dm,
    mem: Box<[u64]>,
    len: u64,
    /// Memory regions registered over the allocation.
    regs: Arc<AtomicUsize>,
}

/// Held by a DM memory region; releases its count on deregistration.
pub struct DmRef(Arc<AtomicUsize>);

impl Drop for DmRef {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

impl UDm {
    fn base(&self) -> *mut u8 {
        self.mem.as_ptr() as *mut u8
    }

    /// Whether `off..off+len` is an aligned range inside the allocation.
    fn check(&self, off: u64, len: usize) -> bool {
        off % DM_ALIGN == 0 && len as u64 % DM_ALIGN == 0 && off.checked_add(len as u64).is_some_and(|e| e <= self.len)
    }
}

unsafe extern "C" fn memcpy_to_dm(dm: *mut ibv_dm, off: u64, host: *const libc::c_void, len: usize) -> c_int {
    // SAFETY: a DM from alloc_dm.
    let d = unsafe { &*(dm as *const UDm) };
    if host.is_null() || !d.check(off, len) {
        return libc::EINVAL;
    }
    // SAFETY: the range lies inside the allocation (checked); `host` is the
    // caller's buffer of `len` bytes.
    unsafe { std::ptr::copy(host as *const u8, d.base().add(off as usize), len) };
    0
}

unsafe extern "C" fn memcpy_from_dm(host: *mut libc::c_void, dm: *mut ibv_dm, off: u64, len: usize) -> c_int {
    // SAFETY: a DM from alloc_dm.
    let d = unsafe { &*(dm as *const UDm) };
    if host.is_null() || !d.check(off, len) {
        return libc::EINVAL;
    }
    // SAFETY: as in memcpy_to_dm, in the other direction.
    unsafe { std::ptr::copy(d.base().add(off as usize), host as *mut u8, len) };
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
    let mem = vec![0u64; len.div_ceil(8) as usize].into_boxed_slice();
    // SAFETY: ibv_dm is plain old data; all-zero is valid before we set it.
    let mut dm: ibv_dm = unsafe { std::mem::zeroed() };
    dm.context = ctx;
    dm.memcpy_to_dm = Some(memcpy_to_dm);
    dm.memcpy_from_dm = Some(memcpy_from_dm);
    let u = Box::new(UDm { dm, mem, len, regs: Arc::new(AtomicUsize::new(0)) });
    let p = Box::into_raw(u);
    // SAFETY: `p` is the fresh allocation.
    unsafe { (*p).dm.handle = p as usize as u32 };
    p as *mut ibv_dm
}

/// `verbs_context.free_dm`: EBUSY while memory regions use it.
pub unsafe extern "C" fn free_dm(dm: *mut ibv_dm) -> c_int {
    if dm.is_null() {
        return libc::EINVAL;
    }
    // SAFETY: a DM from alloc_dm.
    let d = unsafe { &*(dm as *const UDm) };
    if d.regs.load(Ordering::Acquire) > 0 {
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
    if off.checked_add(len as u64).is_none_or(|e| e > d.len) {
        return null(libc::EINVAL);
    }
    let Some(inner) = p.inner.as_ref() else { return null(libc::EINVAL) };
    // SAFETY: the allocation outlives the region: free_dm is EBUSY while
    // the region (holding a DmRef) exists.
    let r = unsafe { inner.register_raw(d.base().add(off as usize), len, 0, access - Access::ZERO_BASED) };
    match r {
        Ok(mr) => {
            d.regs.fetch_add(1, Ordering::AcqRel);
            let raw = ibv_mr {
                context: p.pd.context,
                pd,
                addr: off as usize as *mut libc::c_void,
                length: len,
                handle: mr.lkey(),
                lkey: mr.lkey(),
                rkey: mr.rkey(),
            };
            Box::into_raw(Box::new(UMr { mr: raw, inner: Some(mr), dm: Some(DmRef(d.regs.clone())) })) as *mut ibv_mr
        }
        Err(e) => null(fail(&e)),
    }
}
