//! Memory windows through the C ABI: the `alloc_mw`, `bind_mw` and
//! `dealloc_mw` ops behind verbs.h's inline `ibv_alloc_mw`, `ibv_bind_mw`
//! (type 1) and `ibv_dealloc_mw`, and the BIND_MW work request (type 2).

use crate::errno::{null, ret};
use crate::ffi::*;
use crate::handles::{UContext, UMr, UMw, UPd, UQp};
use std::ffi::c_int;
use uroce::ib::{Access, SendFlags};
use uroce::mem::{BindRequest, MwType};
use uroce::verbs::{SendWr, WrOpcode};

pub unsafe extern "C" fn alloc_mw(pd: *mut ibv_pd, ty: ibv_mw_type) -> *mut ibv_mw {
    if pd.is_null() {
        return null(libc::EINVAL);
    }
    let mw_type = match ty {
        1 => MwType::Type1,
        2 => MwType::Type2,
        _ => return null(libc::EINVAL),
    };
    // SAFETY: a PD from ibv_alloc_pd.
    let p = unsafe { &*(pd as *const UPd) };
    match p.inner.as_ref().unwrap().alloc_mw(mw_type) {
        Ok(w) => {
            let raw = ibv_mw { context: p.pd.context, pd, rkey: w.rkey(), handle: w.rkey() >> 8, type_: ty };
            let b = Box::into_raw(Box::new(UMw { mw: raw, inner: Some(w) }));
            // SAFETY: the PD's context is ours.
            unsafe { UContext::from_ctx(p.pd.context) }.mws.lock().unwrap().insert(b as usize);
            b as *mut ibv_mw
        }
        Err(e) => null(crate::errno::fail(&e)),
    }
}

pub unsafe extern "C" fn dealloc_mw(mw: *mut ibv_mw) -> c_int {
    if mw.is_null() {
        return ret(libc::EINVAL);
    }
    // SAFETY: a window from alloc_mw.
    let b = unsafe { Box::from_raw(mw as *mut UMw) };
    // SAFETY: its context outlives it.
    unsafe { UContext::from_ctx(b.mw.context) }.mws.lock().unwrap().remove(&(mw as usize));
    drop(b);
    0
}

/// `ibv_bind_mw` (type 1): posts the bind on the QP; `mw->rkey` gets the new
/// key. A positive errno on failure, also set in errno (as mlx5_bind_mw).
pub unsafe extern "C" fn bind_mw(qp: *mut ibv_qp, mw: *mut ibv_mw, bind: *mut ibv_mw_bind) -> c_int {
    if qp.is_null() || mw.is_null() || bind.is_null() {
        return ret(libc::EINVAL);
    }
    // SAFETY: our QP and window, and the caller's bind description.
    let (q, w, b) = unsafe { (&*(qp as *const UQp), &mut *(mw as *mut UMw), &*bind) };
    let info = &b.bind_info;
    // SAFETY: an MR from ibv_reg_mr, or NULL.
    let mr = unsafe { (info.mr as *const UMr).as_ref() }.and_then(|m| m.inner.as_ref());
    let access = Access::from_bits_retain(info.mw_access_flags);
    let Some(window) = w.inner.as_ref() else { return ret(libc::EINVAL) };
    match q.inner.as_ref().unwrap().bind_mw(
        window,
        b.wr_id,
        SendFlags::from_bits_retain(b.send_flags),
        mr,
        info.addr,
        info.length,
        access,
    ) {
        Ok(k) => {
            w.mw.rkey = k;
            0
        }
        Err(e) => ret(e.errno.0),
    }
}

/// The BIND_MW work request of `ibv_post_send` (type 2 windows).
pub unsafe fn bind_wr(w: &ibv_send_wr, wr: &mut SendWr) -> bool {
    // SAFETY: for IBV_WR_BIND_MW the union holds bind_mw.
    let bm = unsafe { &w.__bindgen_anon_2.bind_mw };
    // SAFETY: a window from alloc_mw, and an MR from ibv_reg_mr or NULL.
    let Some(umw) = (unsafe { (bm.mw as *mut UMw).as_mut() }) else { return false };
    let Some(mw_key) = umw.inner.as_ref().map(|w| w.rkey()) else { return false };
    // SAFETY: as above.
    let mr_key = unsafe { (bm.bind_info.mr as *const UMr).as_ref() }.map_or(0, |m| m.mr.lkey);
    wr.opcode = WrOpcode::BindMw;
    wr.bind = Some(Box::new(BindRequest {
        mw_key,
        new_key: bm.rkey,
        mr_key,
        addr: bm.bind_info.addr,
        len: bm.bind_info.length,
        access: Access::from_bits_retain(bm.bind_info.mw_access_flags),
    }));
    // The consumer reads mw->rkey after the bind completes: it names the
    // window with the requested tag (shared/spec/memory.md §4.1).
    umw.mw.rkey = (mw_key & !0xff) | (bm.rkey & 0xff);
    true
}
