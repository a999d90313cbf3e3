//! Shared receive queues through the C ABI.

use crate::device::UContext;
use crate::errno::{fail, null};
use crate::ffi::*;
use crate::objects::UPd;
use std::ffi::c_int;
use uroce::ib::Sge;
use uroce::verbs::{RecvWr, SharedReceiveQueue};

#[repr(C)]
pub struct USrq {
    pub srq: ibv_srq,
    pub inner: Option<SharedReceiveQueue>,
}

#[no_mangle]
pub unsafe extern "C" fn ibv_create_srq(pd: *mut ibv_pd, init: *mut ibv_srq_init_attr) -> *mut ibv_srq {
    if pd.is_null() || init.is_null() {
        return null(libc::EINVAL);
    }
    // SAFETY: a PD from ibv_alloc_pd and the caller's attributes.
    let (p, a) = unsafe { (&*(pd as *const UPd), &mut *init) };
    match p.inner.as_ref().unwrap().create_srq(a.attr.max_wr, a.attr.max_sge.max(1), a.attr.srq_limit) {
        Ok(q) => {
            // SAFETY: ibv_srq is plain old data.
            let mut raw: ibv_srq = unsafe { std::mem::zeroed() };
            raw.context = p.pd.context;
            raw.srq_context = a.srq_context;
            raw.pd = pd;
            raw.handle = q.handle();
            a.attr.max_sge = q.max_sge();
            let b = Box::into_raw(Box::new(USrq { srq: raw, inner: Some(q) }));
            // SAFETY: fresh allocation; the context outlives it.
            unsafe {
                libc::pthread_mutex_init(&mut (*b).srq.mutex as *mut _ as *mut libc::pthread_mutex_t, std::ptr::null());
                libc::pthread_cond_init(&mut (*b).srq.cond as *mut _ as *mut libc::pthread_cond_t, std::ptr::null());
                UContext::from_ctx(p.pd.context).srqs.lock().unwrap().insert(raw.handle, b as usize);
            }
            b as *mut ibv_srq
        }
        Err(e) => null(fail(&e)),
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
                UContext::from_ctx(q.srq.context).srqs.lock().unwrap().remove(&q.srq.handle);
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
    let mut cur = wr;
    while !cur.is_null() {
        // SAFETY: the caller's linked list and SGE arrays.
        let w = unsafe { &*cur };
        let sges = if w.sg_list.is_null() || w.num_sge <= 0 {
            Vec::new()
        } else {
            // SAFETY: `num_sge` SGEs at `sg_list`.
            unsafe { std::slice::from_raw_parts(w.sg_list, w.num_sge as usize) }
                .iter()
                .map(|s| Sge { addr: s.addr, length: s.length, lkey: s.lkey })
                .collect()
        };
        if let Err(e) = q.inner.as_ref().unwrap().post_recv(&RecvWr { wr_id: w.wr_id, sg_list: sges }) {
            if !bad.is_null() {
                // SAFETY: the caller's out parameter.
                unsafe { *bad = cur };
            }
            return e.errno.0;
        }
        cur = w.next;
    }
    0
}
