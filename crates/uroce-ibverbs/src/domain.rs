//! Thread domains and parent domains (`ibv_alloc_td`,
//! `ibv_alloc_parent_domain`). A parent domain is a PD that stands for its
//! parent PD (everything created from it belongs to the parent) and carries
//! a thread domain and custom allocators. uroce keeps no device queue
//! buffers in application memory, so it never needs to call the allocators;
//! rdma-core providers may use them and are not required to.

use crate::errno::null;
use crate::ffi::*;
use crate::handles::UPd;
use std::ffi::c_int;

#[repr(C)]
struct UTd {
    td: ibv_td,
}

/// `verbs_context.alloc_td`.
pub unsafe extern "C" fn alloc_td(ctx: *mut ibv_context, attr: *mut ibv_td_init_attr) -> *mut ibv_td {
    // SAFETY: the caller's attributes, if any.
    if ctx.is_null() || unsafe { attr.as_ref() }.is_some_and(|a| a.comp_mask != 0) {
        return null(libc::EINVAL);
    }
    Box::into_raw(Box::new(UTd { td: ibv_td { context: ctx } })) as *mut ibv_td
}

/// `verbs_context.dealloc_td`.
pub unsafe extern "C" fn dealloc_td(td: *mut ibv_td) -> c_int {
    if td.is_null() {
        return libc::EINVAL;
    }
    // SAFETY: a TD from alloc_td, freed once.
    drop(unsafe { Box::from_raw(td as *mut UTd) });
    0
}

/// `verbs_context.alloc_parent_domain`.
pub unsafe extern "C" fn alloc_parent_domain(
    ctx: *mut ibv_context,
    attr: *mut ibv_parent_domain_init_attr,
) -> *mut ibv_pd {
    // SAFETY: the caller's attributes.
    let Some(a) = (unsafe { attr.as_ref() }) else { return null(libc::EINVAL) };
    let known = ibv_parent_domain_init_attr_mask_IBV_PARENT_DOMAIN_INIT_ATTR_ALLOCATORS
        | ibv_parent_domain_init_attr_mask_IBV_PARENT_DOMAIN_INIT_ATTR_PD_CONTEXT;
    if ctx.is_null() || a.pd.is_null() || a.comp_mask & !known != 0 {
        return null(libc::EINVAL);
    }
    let with_allocators = a.comp_mask & ibv_parent_domain_init_attr_mask_IBV_PARENT_DOMAIN_INIT_ATTR_ALLOCATORS != 0;
    if with_allocators && (a.alloc.is_none() || a.free.is_none()) {
        return null(libc::EINVAL);
    }
    // SAFETY: a PD from ibv_alloc_pd.
    let parent = unsafe { &*(a.pd as *const UPd) };
    let Some(inner) = parent.inner.clone() else { return null(libc::EINVAL) };
    let pd = ibv_pd { context: ctx, handle: parent.pd.handle };
    Box::into_raw(Box::new(UPd { pd, inner: Some(inner), parent_domain: true })) as *mut ibv_pd
}
