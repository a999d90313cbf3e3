//! mlx5 direct verbs on uroce devices: the entry points of rdma-core's
//! libmlx5 that uroce implements (seed 001's per-QP inline-receive switch
//! and the upstream form of UMR), exported from libibverbs.so.1 under
//! private names (`uroce_mlx5dv_*`, node UROCE_MLX5_PRIVATE of
//! libibverbs.map) for the drop-in libmlx5.so.1 (`mlx5/libmlx5.c`), which
//! forwards to them, so both libraries share one uroce instance.
//!
//! * `mlx5dv_is_supported`: true for every device of this library (all are
//!   uroce devices, which implement what is below);
//! * `mlx5dv_create_qp`: `MLX5DV_QP_CREATE_DISABLE_SCATTER_TO_CQE` /
//!   `_ALLOW_SCATTER_TO_CQE` (both: EINVAL) and the UMR send ops
//!   (`MLX5DV_QP_EX_WITH_MR_INTERLEAVED`, `_MR_LIST`, `_MKEY_CONFIGURE`, RC
//!   only); DC, DCI streams and other create flags are EOPNOTSUPP;
//! * `mlx5dv_create_mkey` / `mlx5dv_destroy_mkey`: indirect mkeys;
//! * `mlx5dv_qp_ex_from_ibv_qp_ex`: the `struct mlx5dv_qp_ex` whose function
//!   pointers mlx5dv.h's inline `mlx5dv_wr_*` call (`wr.rs`).

mod wr;

use crate::errno::null;
use crate::ext::{uroce_create_mkey, uroce_destroy_mkey};
use crate::ffi::*;
use crate::handles::{DvQp, Mlx5dvQpEx, UMkey, UQp};
use std::ffi::c_int;

/// `enum mlx5dv_qp_init_attr_mask`.
const MASK_QP_CREATE_FLAGS: u64 = 1;
const MASK_DC: u64 = 1 << 1;
const MASK_SEND_OPS_FLAGS: u64 = 1 << 2;
const MASK_DCI_STREAMS: u64 = 1 << 3;
/// `enum mlx5dv_qp_create_flags`.
const DISABLE_SCATTER_TO_CQE: u32 = 1 << 3;
const ALLOW_SCATTER_TO_CQE: u32 = 1 << 4;
/// `enum mlx5dv_qp_create_send_ops_flags` that uroce implements.
pub(crate) const WITH_MR_INTERLEAVED: u64 = 1;
pub(crate) const WITH_MR_LIST: u64 = 1 << 1;
pub(crate) const WITH_MKEY_CONFIGURE: u64 = 1 << 2;
/// `enum mlx5dv_mkey_init_attr_flags`.
const MKEY_INDIRECT: u32 = 1;
const MKEY_ALL: u32 = 0x1f;

/// `struct mlx5dv_qp_init_attr` (the DC part opaque: DC is refused).
#[repr(C)]
pub struct Mlx5dvQpInitAttr {
    pub comp_mask: u64,
    pub create_flags: u32,
    /// `struct mlx5dv_dc_init_attr`: u32 dc_type, u64 dct_access_key (16 bytes).
    pub dc_init_attr: [u64; 2],
    pub send_ops_flags: u64,
}

/// `struct mlx5dv_mkey_init_attr`.
#[repr(C)]
pub struct Mlx5dvMkeyInitAttr {
    pub pd: *mut ibv_pd,
    pub create_flags: u32,
    pub max_entries: u16,
}

#[no_mangle]
pub extern "C" fn uroce_mlx5dv_is_supported(device: *mut ibv_device) -> bool {
    // Every device this library lists is a uroce device.
    !device.is_null()
}

#[no_mangle]
pub unsafe extern "C" fn uroce_mlx5dv_create_qp(
    ctx: *mut ibv_context,
    attr: *mut ibv_qp_init_attr_ex,
    dv: *mut Mlx5dvQpInitAttr,
) -> *mut ibv_qp {
    if ctx.is_null() || attr.is_null() {
        return null(libc::EINVAL);
    }
    // SAFETY: the caller's attributes (`dv` may be NULL).
    let (a, d) = unsafe { (&*attr, dv.as_ref()) };
    let (mut scatter, mut ops) = (None, 0u64);
    if let Some(d) = d {
        if d.comp_mask & !(MASK_QP_CREATE_FLAGS | MASK_DC | MASK_SEND_OPS_FLAGS | MASK_DCI_STREAMS) != 0 {
            return null(libc::EINVAL);
        }
        if d.comp_mask & (MASK_DC | MASK_DCI_STREAMS) != 0 {
            return null(libc::EOPNOTSUPP);
        }
        if d.comp_mask & MASK_QP_CREATE_FLAGS != 0 {
            let f = d.create_flags;
            if f & !(DISABLE_SCATTER_TO_CQE | ALLOW_SCATTER_TO_CQE) != 0 {
                return null(libc::EOPNOTSUPP);
            }
            if f & DISABLE_SCATTER_TO_CQE != 0 && f & ALLOW_SCATTER_TO_CQE != 0 {
                return null(libc::EINVAL);
            }
            if f & DISABLE_SCATTER_TO_CQE != 0 {
                scatter = Some(false);
            } else if f & ALLOW_SCATTER_TO_CQE != 0 {
                scatter = Some(true);
            }
        }
        if d.comp_mask & MASK_SEND_OPS_FLAGS != 0 {
            ops = d.send_ops_flags;
            if ops & !(WITH_MR_INTERLEAVED | WITH_MR_LIST | WITH_MKEY_CONFIGURE) != 0 {
                return null(libc::EOPNOTSUPP);
            }
            if ops != 0 && a.qp_type != ibv_qp_type_IBV_QPT_RC {
                return null(libc::EOPNOTSUPP);
            }
        }
    }
    // SAFETY: the caller's context and attributes.
    let qp = crate::objects::with_scatter_to_cqe(scatter, || unsafe { crate::objects::create_qp_ex(ctx, attr) });
    if !qp.is_null() {
        // SAFETY: a fresh QP of this library (ibv_qp_ex first in UQp).
        let q = unsafe { &*(qp as *const UQp) };
        let _ = q.mlx5.set(DvQp::new(qp as *mut ibv_qp_ex, ops));
    }
    qp
}

#[no_mangle]
pub unsafe extern "C" fn uroce_mlx5dv_qp_ex_from_ibv_qp_ex(qp: *mut ibv_qp_ex) -> *mut Mlx5dvQpEx {
    if qp.is_null() {
        return null(libc::EINVAL);
    }
    // SAFETY: a QP of this library.
    let q = unsafe { &*(qp as *const UQp) };
    let dv = q.mlx5.get_or_init(|| DvQp::new(qp, 0));
    &dv.dv as *const Mlx5dvQpEx as *mut Mlx5dvQpEx
}

#[no_mangle]
pub unsafe extern "C" fn uroce_mlx5dv_create_mkey(attr: *mut Mlx5dvMkeyInitAttr) -> *mut UMkey {
    // SAFETY: the caller's attributes, or NULL.
    let Some(a) = (unsafe { attr.as_ref() }) else { return null(libc::EINVAL) };
    if a.create_flags & !MKEY_ALL != 0 {
        return null(libc::EOPNOTSUPP);
    }
    if a.create_flags & MKEY_INDIRECT == 0 {
        return null(libc::EINVAL);
    }
    if a.create_flags != MKEY_INDIRECT {
        // Signature, crypto, tag update, remote invalidation: not on uroce.
        return null(libc::EOPNOTSUPP);
    }
    // SAFETY: the caller's PD (checked there).
    unsafe { uroce_create_mkey(a.pd, a.max_entries) }
}

#[no_mangle]
pub unsafe extern "C" fn uroce_mlx5dv_destroy_mkey(mkey: *mut UMkey) -> c_int {
    // SAFETY: an mkey of uroce_mlx5dv_create_mkey, destroyed once.
    unsafe { uroce_destroy_mkey(mkey) }
}
