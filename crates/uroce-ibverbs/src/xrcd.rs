//! XRC domains through the C ABI: the `open_xrcd` and `close_xrcd` ops
//! behind verbs.h's inline `ibv_open_xrcd` / `ibv_close_xrcd`, with
//! rdma-core's argument checks (`ibv_cmd_open_xrcd`) and the kernel's file
//! semantics (uverbs `open_xrcd`). XRC SRQs are in `srq.rs`, XRC queue
//! pairs in `objects.rs` and `qp_ex.rs`.

use crate::errno::{fail, null};
use crate::ffi::*;
use crate::handles::{UContext, UXrcd};
use std::ffi::c_int;

/// `verbs_context.open_xrcd`. Both IBV_XRCD_INIT_ATTR_FD and _OFLAGS are
/// required (EINVAL), unknown mask bits are EOPNOTSUPP; fd −1 opens a new
/// domain, another fd the domain of its file (O_CREAT, O_EXCL).
pub unsafe extern "C" fn open_xrcd(ctx: *mut ibv_context, attr: *mut ibv_xrcd_init_attr) -> *mut ibv_xrcd {
    // SAFETY: the caller's attributes.
    let Some(a) = (unsafe { attr.as_ref() }) else { return null(libc::EINVAL) };
    if ctx.is_null() {
        return null(libc::EINVAL);
    }
    if a.comp_mask >= ibv_xrcd_init_attr_mask_IBV_XRCD_INIT_ATTR_RESERVED {
        return null(libc::EOPNOTSUPP);
    }
    let both = ibv_xrcd_init_attr_mask_IBV_XRCD_INIT_ATTR_FD | ibv_xrcd_init_attr_mask_IBV_XRCD_INIT_ATTR_OFLAGS;
    if a.comp_mask & both != both {
        return null(libc::EINVAL);
    }
    // SAFETY: our context.
    let u = unsafe { UContext::from_ctx(ctx) };
    let opened = match a.fd {
        -1 => u.ctx.open_xrcd(),
        fd => u.ctx.open_xrcd_file(fd, a.oflags & libc::O_CREAT != 0, a.oflags & libc::O_EXCL != 0),
    };
    match opened {
        Ok(x) => Box::into_raw(Box::new(UXrcd { xrcd: ibv_xrcd { context: ctx }, inner: Some(x) })) as *mut ibv_xrcd,
        Err(e) => null(fail(&e)),
    }
}

/// `verbs_context.close_xrcd`: EBUSY while SRQs or QPs created through this
/// handle exist.
pub unsafe extern "C" fn close_xrcd(xrcd: *mut ibv_xrcd) -> c_int {
    if xrcd.is_null() {
        return libc::EINVAL;
    }
    // SAFETY: an XRCD from open_xrcd.
    let x = unsafe { &mut *(xrcd as *mut UXrcd) };
    let Some(inner) = x.inner.take() else { return libc::EINVAL };
    match inner.close() {
        Ok(()) => {
            // SAFETY: nothing refers to it any more; freed once.
            drop(unsafe { Box::from_raw(xrcd as *mut UXrcd) });
            0
        }
        Err((inner, e)) => {
            x.inner = Some(inner);
            e.errno.0
        }
    }
}
