//! Shared receive queues through the C ABI: `ibv_create_srq`, and the
//! `create_srq_ex` and `get_srq_num` ops behind verbs.h's inline
//! `ibv_create_srq_ex` (basic and XRC SRQs) and `ibv_get_srq_num`.

use crate::errno::{fail, null};
use crate::ffi::*;
use crate::handles::{UContext, UCq, UPd, USrq, UXrcd};

use std::ffi::c_int;
use uroce::verbs::SharedReceiveQueue;

#[no_mangle]
pub unsafe extern "C" fn ibv_create_srq(pd: *mut ibv_pd, init: *mut ibv_srq_init_attr) -> *mut ibv_srq {
    if pd.is_null() || init.is_null() {
        return null(libc::EINVAL);
    }
    // SAFETY: a PD from ibv_alloc_pd and the caller's attributes.
    let (p, a) = unsafe { (&*(pd as *const UPd), &mut *init) };
    let created = p.inner.as_ref().unwrap().create_srq(a.attr.max_wr, a.attr.max_sge.max(1), a.attr.srq_limit);
    // SAFETY: the caller's PD and attributes.
    unsafe { new_srq(pd, a.srq_context, &mut a.attr, created) }
}

/// The `ibv_srq` of a created SRQ (registered for asynchronous events), or
/// NULL with errno.
unsafe fn new_srq(
    pd: *mut ibv_pd,
    srq_context: *mut libc::c_void,
    attr: &mut ibv_srq_attr,
    created: uroce::ib::Result<SharedReceiveQueue>,
) -> *mut ibv_srq {
    let q = match created {
        Ok(q) => q,
        Err(e) => return null(fail(&e)),
    };
    // SAFETY: ibv_srq is plain old data.
    let mut raw: ibv_srq = unsafe { std::mem::zeroed() };
    // SAFETY: a PD of this library.
    raw.context = unsafe { (*pd).context };
    raw.srq_context = srq_context;
    raw.pd = pd;
    raw.handle = q.handle();
    attr.max_sge = q.max_sge();
    let b = Box::into_raw(Box::new(USrq { srq: raw, inner: Some(q) }));
    // SAFETY: fresh allocation; the context outlives it.
    unsafe {
        libc::pthread_mutex_init(&mut (*b).srq.mutex as *mut _ as *mut libc::pthread_mutex_t, std::ptr::null());
        libc::pthread_cond_init(&mut (*b).srq.cond as *mut _ as *mut libc::pthread_cond_t, std::ptr::null());
        UContext::from_ctx(raw.context).srqs.lock().unwrap().insert(raw.handle, b as usize);
    }
    b as *mut ibv_srq
}

/// `verbs_context.create_srq_ex`: a basic SRQ (as `ibv_create_srq`) or an
/// XRC SRQ, which needs a PD, an XRC domain and a CQ (EINVAL without).
/// Tag-matching SRQs are not supported (EOPNOTSUPP).
pub unsafe extern "C" fn create_srq_ex(ctx: *mut ibv_context, init: *mut ibv_srq_init_attr_ex) -> *mut ibv_srq {
    // SAFETY: the caller's attributes.
    let Some(a) = (unsafe { init.as_mut() }) else { return null(libc::EINVAL) };
    if ctx.is_null() || a.comp_mask >= ibv_srq_init_attr_mask_IBV_SRQ_INIT_ATTR_RESERVED {
        return null(libc::EINVAL);
    }
    let has = |bit: u32| a.comp_mask & bit != 0;
    let srq_type =
        if has(ibv_srq_init_attr_mask_IBV_SRQ_INIT_ATTR_TYPE) { a.srq_type } else { ibv_srq_type_IBV_SRQT_BASIC };
    if !has(ibv_srq_init_attr_mask_IBV_SRQ_INIT_ATTR_PD) || a.pd.is_null() {
        return null(libc::EINVAL);
    }
    // SAFETY: a PD from ibv_alloc_pd.
    let Some(pd) = (unsafe { &*(a.pd as *const UPd) }).inner.as_ref() else { return null(libc::EINVAL) };
    let (max_wr, max_sge, limit) = (a.attr.max_wr, a.attr.max_sge.max(1), a.attr.srq_limit);
    let created = if srq_type == ibv_srq_type_IBV_SRQT_BASIC {
        pd.create_srq(max_wr, max_sge, limit)
    } else if srq_type == ibv_srq_type_IBV_SRQT_XRC {
        // SAFETY: an XRC domain of open_xrcd and a CQ of ibv_create_cq(_ex), or NULL.
        let (xrcd, cq) = unsafe { (UXrcd::from_ptr(a.xrcd), (a.cq as *const UCq).as_ref()) };
        let needed = ibv_srq_init_attr_mask_IBV_SRQ_INIT_ATTR_XRCD | ibv_srq_init_attr_mask_IBV_SRQ_INIT_ATTR_CQ;
        match (xrcd, cq.and_then(|c| c.inner.as_ref())) {
            (Some(x), Some(cq)) if a.comp_mask & needed == needed => x.create_srq(pd, cq, max_wr, max_sge, limit),
            _ => return null(libc::EINVAL),
        }
    } else if srq_type == ibv_srq_type_IBV_SRQT_TM {
        return null(libc::EOPNOTSUPP);
    } else {
        return null(libc::EINVAL);
    };
    // SAFETY: the caller's PD and attributes.
    unsafe { new_srq(a.pd, a.srq_context, &mut a.attr, created) }
}

/// `verbs_context.get_srq_num`: the number XRC requests name an XRC SRQ
/// by (EOPNOTSUPP for a basic SRQ, which has none).
pub unsafe extern "C" fn get_srq_num(srq: *mut ibv_srq, srq_num: *mut u32) -> c_int {
    if srq.is_null() || srq_num.is_null() {
        return libc::EINVAL;
    }
    // SAFETY: an SRQ of this library.
    let q = unsafe { &*(srq as *const USrq) };
    match q.inner.as_ref().and_then(|i| i.srq_num()) {
        Some(n) => {
            // SAFETY: the caller's out parameter.
            unsafe { *srq_num = n };
            0
        }
        None => libc::EOPNOTSUPP,
    }
}

/// `ibv_modify_srq`: IBV_SRQ_LIMIT arms the limit event; resizing
/// (IBV_SRQ_MAX_WR) is not supported (EINVAL, as the device does not
/// advertise SRQ_RESIZE).
#[no_mangle]
pub unsafe extern "C" fn ibv_modify_srq(srq: *mut ibv_srq, attr: *mut ibv_srq_attr, mask: c_int) -> c_int {
    if srq.is_null() || attr.is_null() {
        return libc::EINVAL;
    }
    const MAX_WR: c_int = 1;
    const LIMIT: c_int = 2;
    if mask & MAX_WR != 0 || mask & !(MAX_WR | LIMIT) != 0 {
        return libc::EINVAL;
    }
    // SAFETY: an SRQ from ibv_create_srq and the caller's attributes.
    let (q, a) = unsafe { (&*(srq as *const USrq), &*attr) };
    if mask & LIMIT != 0 {
        if let Err(e) = q.inner.as_ref().unwrap().set_limit(a.srq_limit) {
            return e.errno.0;
        }
    }
    0
}

#[no_mangle]
pub unsafe extern "C" fn ibv_query_srq(srq: *mut ibv_srq, attr: *mut ibv_srq_attr) -> c_int {
    if srq.is_null() || attr.is_null() {
        return libc::EINVAL;
    }
    // SAFETY: an SRQ from ibv_create_srq and the caller's out struct.
    let (q, a) = unsafe { (&*(srq as *const USrq), &mut *attr) };
    let i = q.inner.as_ref().unwrap();
    *a = ibv_srq_attr { max_wr: i.max_wr(), max_sge: i.max_sge(), srq_limit: i.limit() };
    0
}

#[no_mangle]
pub unsafe extern "C" fn ibv_destroy_srq(srq: *mut ibv_srq) -> c_int {
    if srq.is_null() {
        return libc::EINVAL;
    }
    // SAFETY: an SRQ from ibv_create_srq.
    let q = unsafe { &mut *(srq as *mut USrq) };
    let Some(inner) = q.inner.take() else { return libc::EINVAL };
    match inner.destroy() {
        Ok(()) => {
            // SAFETY: its context outlives it; nothing refers to it any more.
            unsafe {
                let u = UContext::from_ctx(q.srq.context);
                u.srqs.lock().unwrap().remove(&q.srq.handle);
                // The SRQ's own mutex, condition and counter.
                crate::events::wait_acknowledged(
                    u,
                    srq as usize,
                    &mut q.srq.mutex,
                    &mut q.srq.cond,
                    &q.srq.events_completed,
                );
                drop(Box::from_raw(srq as *mut USrq));
            }
            0
        }
        Err((inner, e)) => {
            q.inner = Some(inner);
            e.errno.0
        }
    }
}

pub unsafe extern "C" fn post_srq_recv(srq: *mut ibv_srq, wr: *mut ibv_recv_wr, bad: *mut *mut ibv_recv_wr) -> c_int {
    if srq.is_null() {
        return libc::EINVAL;
    }
    // SAFETY: an SRQ from ibv_create_srq.
    let q = unsafe { &*(srq as *const USrq) };
    let Some(inner) = q.inner.as_ref() else { return libc::EINVAL };
    let (mut cur, mut last) = (wr, wr);
    // SAFETY: the caller's linked list and SGE arrays.
    let r = inner.post_recv_with(|i, lim| unsafe { crate::datapath::next_recv_wr(&mut cur, &mut last, i, lim) });
    match r {
        Ok(()) => 0,
        Err((_, e)) => {
            if !bad.is_null() {
                // SAFETY: the caller's out parameter.
                unsafe { *bad = last };
            }
            e.errno.0
        }
    }
}
