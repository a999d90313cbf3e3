//! Device memory (`ibv_alloc_dm`, `ibv_memcpy_to/from_dm`, `ibv_reg_dm_mr`):
//! the user-space stand-in for a NIC's on-chip memory. An allocation is a
//! zeroed, 8-byte-aligned buffer owned by the library, reachable by the host
//! only through the copy functions (4-byte granularity, as mlx5's MEMIC) and
//! by the device through zero-based memory regions registered over it. The
//! `ibv_dm` that allocated it and the copies `ibv_import_dm` makes of it
//! (`import.rs`) share the allocation.

use crate::dm_memory::{Allocation, DmRef, UDm, DM_ALIGN, MAX_DM_SIZE};
use crate::errno::{fail, null};
use crate::ffi::*;
use crate::handles::{UMr, UPd};
use std::ffi::c_int;
use std::sync::Arc;
use uroce::ib::Access;

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
    unsafe { crate::share::publish_dm(ctx, alloc) }
}

/// `verbs_context.free_dm`: EBUSY while memory regions use it. Freeing
/// through any `ibv_dm` naming the allocation (an imported copy too) frees
/// the object (`import.rs`).
pub unsafe extern "C" fn free_dm(dm: *mut ibv_dm) -> c_int {
    if dm.is_null() {
        return libc::EINVAL;
    }
    // SAFETY: a DM from alloc_dm or ibv_import_dm.
    if let Some(rc) = unsafe { crate::share::free_dm(dm) } {
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
    if off.checked_add(len as u64).is_none_or(|e| e > d.alloc.len()) {
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
            unsafe { crate::share::publish_mr(UMr { mr: raw, inner: Some(mr), dm: Some(DmRef::new(&d.alloc)) }) }
        }
        Err(e) => null(fail(&e)),
    }
}
