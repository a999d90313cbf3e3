//! `struct mlx5dv_qp_ex` and its UMR builders: `mlx5dv_wr_mr_interleaved`,
//! `mlx5dv_wr_mr_list`, `mlx5dv_wr_mkey_configure` and the setters
//! `mlx5dv_wr_set_mkey_access_flags`, `_layout_list`, `_layout_interleaved`
//! (mlx5dv.h's inlines call these through the struct's function pointers).
//! Each adds a UMR work request to the QP's `ibv_wr_start` batch
//! (`qp_ex.rs`), posted in order with the batch by `ibv_wr_complete` and
//! completing with `MLX5DV_WC_UMR` (`IBV_WC_DRIVER1`). Errors are latched
//! and returned by `ibv_wr_complete`, which then drops the batch, as mlx5:
//! no `IBV_SEND_INLINE` in `wr_flags` → EOPNOTSUPP; access beyond
//! LOCAL_WRITE|REMOTE_WRITE|REMOTE_READ|REMOTE_ATOMIC or a 16-bit WQE field
//! overflowed → EINVAL; a setter without configure or twice → EINVAL; more
//! entries than the mkey or the WQE holds → ENOMEM.

use super::{WITH_MKEY_CONFIGURE, WITH_MR_INTERLEAVED, WITH_MR_LIST};
use crate::ffi::*;
use crate::handles::{Conf, DvQp, MkeyConfAttr, Mlx5dvQpEx, Mqp, UMkey, UQp, UroceMrInterleaved};
use crate::qp_ex::{latch, push_wr, with_last};
use std::ffi::{c_int, c_void};
use std::sync::Mutex;
use uroce::ib::{Access, SendFlags, Sge};
use uroce::verbs::{InterleavedEntry, Layout, SendWr, WrOpcode};

impl DvQp {
    pub fn new(qp: *mut ibv_qp_ex, ops: u64) -> Box<DvQp> {
        let none = unsupported as *const c_void;
        Box::new(DvQp {
            dv: Mlx5dvQpEx {
                comp_mask: 0,
                wr_set_dc_addr: none,
                wr_mr_interleaved: Some(wr_mr_interleaved),
                wr_mr_list: Some(wr_mr_list),
                wr_mkey_configure: Some(wr_mkey_configure),
                wr_set_mkey_access_flags: Some(wr_set_mkey_access_flags),
                wr_set_mkey_layout_list: Some(wr_set_mkey_layout_list),
                wr_set_mkey_layout_interleaved: Some(wr_set_mkey_layout_interleaved),
                wr_set_mkey_sig_block: none,
                wr_raw_wqe: none,
                wr_set_dc_addr_stream: none,
                wr_memcpy: none,
                wr_set_mkey_crypto: none,
            },
            qp,
            ops,
            conf: Mutex::new(None),
        })
    }
}

/// A builder uroce lacks: latches EOPNOTSUPP. Its first argument is the
/// `mlx5dv_qp_ex` in every such builder; the C ABI lets it ignore the rest.
unsafe extern "C" fn unsupported(mqp: Mqp) {
    // SAFETY: the caller's mlx5dv_qp_ex.
    if let Some(d) = unsafe { dv(mqp) } {
        // SAFETY: the DvQp's QP.
        unsafe { latch(d.qp, libc::EOPNOTSUPP) };
    }
}

/// The DvQp of `mqp` if it was created with `op`; else EOPNOTSUPP is latched.
unsafe fn with_op<'a>(mqp: Mqp, op: u64) -> Option<&'a DvQp> {
    // SAFETY: the caller's mlx5dv_qp_ex.
    let d = unsafe { dv(mqp) }?;
    if d.ops & op == 0 {
        // SAFETY: the DvQp's QP.
        unsafe { latch(d.qp, libc::EOPNOTSUPP) };
        return None;
    }
    Some(d)
}

/// The DvQp of a callback's `mqp`.
unsafe fn dv<'a>(mqp: Mqp) -> Option<&'a DvQp> {
    // SAFETY: every mlx5dv_qp_ex we hand out is the first field of a DvQp.
    unsafe { (mqp as *const DvQp).as_ref() }
}

fn access_of(bits: u32) -> Result<Access, c_int> {
    let allowed = Access::LOCAL_WRITE | Access::REMOTE_WRITE | Access::REMOTE_READ | Access::REMOTE_ATOMIC;
    Access::from_bits(bits).filter(|a| allowed.contains(*a)).ok_or(libc::EINVAL)
}

/// Translation slots one UMR WQE holds (mlx5: inline KLMs after the
/// WQE's segments; a default-sized WQE holds 4 list / 3 interleaved entries).
fn wqe_slots(q: &UQp) -> u32 {
    let inline = q.inner.as_ref().map_or(0, |i| i.cap().max_inline_data);
    ((inline + 4) / 16).max(4)
}

unsafe fn sges(n: u16, p: *const ibv_sge) -> Result<Vec<Sge>, c_int> {
    if n == 0 || p.is_null() {
        return Err(libc::EINVAL);
    }
    // SAFETY: the caller's array of `n` SGEs.
    Ok(unsafe { std::slice::from_raw_parts(p, n as usize) }
        .iter()
        .map(|s| Sge { addr: s.addr, length: s.length, lkey: s.lkey })
        .collect())
}

unsafe fn entries(n: u16, p: *const UroceMrInterleaved) -> Result<Vec<InterleavedEntry>, c_int> {
    if n == 0 || p.is_null() {
        return Err(libc::EINVAL);
    }
    // SAFETY: the caller's array of `n` entries.
    Ok(unsafe { std::slice::from_raw_parts(p, n as usize) }
        .iter()
        .map(|e| InterleavedEntry { addr: e.addr, bytes_count: e.bytes_count, bytes_skip: e.bytes_skip, lkey: e.lkey })
        .collect())
}

/// Checks a layout for a UMR WQE into a key of `max_entries` slots.
fn check(q: &UQp, layout: &Layout, max_entries: u32) -> Result<(), c_int> {
    layout.validate(max_entries.min(wqe_slots(q))).map_err(|e| e.errno.0)
}

fn umr_wr(wr_id: u64, flags: u32, key: u32, layout: Layout) -> Result<SendWr, c_int> {
    if flags & ibv_send_flags_IBV_SEND_INLINE == 0 {
        return Err(libc::EOPNOTSUPP);
    }
    let mut wr = SendWr::new(wr_id, WrOpcode::Umr);
    wr.flags = SendFlags::from_bits_retain(flags);
    wr.umr = Some(Box::new(uroce::proto::wr::Umr { key, layout }));
    Ok(wr)
}

/// A whole UMR (mr_list / mr_interleaved).
unsafe fn post_layout(mqp: Mqp, op: u64, mkey: *mut UMkey, make: impl FnOnce() -> Result<Layout, c_int>) {
    // SAFETY: the caller's mlx5dv_qp_ex.
    let Some(d) = (unsafe { with_op(mqp, op) }) else { return };
    // SAFETY: an mkey of mlx5dv_create_mkey, or NULL.
    let Some(mk) = (unsafe { mkey.as_ref() }) else {
        // SAFETY: the DvQp's QP.
        unsafe { latch(d.qp, libc::EINVAL) };
        return;
    };
    // SAFETY: the DvQp's QP.
    unsafe {
        push_wr(d.qp, |q, wr_id, flags| {
            let layout = make()?;
            check(q, &layout, mk.max_entries)?;
            umr_wr(wr_id, flags, mk.lkey, layout)
        })
    };
}

unsafe extern "C" fn wr_mr_interleaved(
    mqp: Mqp,
    mkey: *mut UMkey,
    access: u32,
    repeat_count: u32,
    num_interleaved: u16,
    data: *const UroceMrInterleaved,
) {
    // SAFETY: the caller's objects and array.
    unsafe {
        post_layout(mqp, WITH_MR_INTERLEAVED, mkey, || {
            Ok(Layout::interleaved(access_of(access)?, repeat_count, &entries(num_interleaved, data)?))
        })
    }
}

unsafe extern "C" fn wr_mr_list(mqp: Mqp, mkey: *mut UMkey, access: u32, num_sges: u16, sge: *const ibv_sge) {
    // SAFETY: the caller's objects and array.
    unsafe { post_layout(mqp, WITH_MR_LIST, mkey, || Ok(Layout::list(access_of(access)?, &sges(num_sges, sge)?))) }
}

unsafe extern "C" fn wr_mkey_configure(mqp: Mqp, mkey: *mut UMkey, num_setters: u8, attr: *const MkeyConfAttr) {
    // SAFETY: the caller's mlx5dv_qp_ex.
    let Some(d) = (unsafe { with_op(mqp, WITH_MKEY_CONFIGURE) }) else { return };
    // SAFETY: the caller's attributes and mkey, or NULL.
    let (attr, mk) = unsafe { (attr.as_ref(), mkey.as_ref()) };
    let e = match (attr, mk) {
        (None, _) | (_, None) => libc::EINVAL,
        // RESET_SIG_ATTR and extensions: no signature support.
        (Some(a), _) if a.conf_flags != 0 || a.comp_mask != 0 => libc::EOPNOTSUPP,
        _ if num_setters == 0 => libc::EINVAL,
        _ => 0,
    };
    if e != 0 {
        // SAFETY: the DvQp's QP.
        unsafe { latch(d.qp, e) };
        return;
    }
    let mk = mk.unwrap();
    // SAFETY: the DvQp's QP.
    unsafe {
        push_wr(d.qp, |_, wr_id, flags| {
            // The layout comes with the setters; until then an empty list,
            // which fails if posted unset (as an mkey without a layout).
            let wr = umr_wr(wr_id, flags, mk.lkey, Layout::list(Access::empty(), &[]))?;
            *d.conf.lock().unwrap_or_else(|e| e.into_inner()) = Some(Conf {
                key: mk.lkey,
                max_entries: mk.max_entries,
                remaining: num_setters,
                access_set: false,
                layout_set: false,
            });
            Ok(wr)
        })
    };
}

/// Applies one setter to the configuration in progress and its work request.
unsafe fn setter(mqp: Mqp, f: impl FnOnce(&UQp, &mut Conf, &mut Layout) -> Result<(), c_int>) {
    // SAFETY: the caller's mlx5dv_qp_ex.
    let Some(d) = (unsafe { with_op(mqp, WITH_MKEY_CONFIGURE) }) else { return };
    // SAFETY: the DvQp's QP.
    unsafe {
        with_last(d.qp, |q, last| {
            let mut guard = d.conf.lock().unwrap_or_else(|e| e.into_inner());
            let Some(c) = guard.as_mut() else { return Err(libc::EINVAL) };
            let Some(umr) = last.and_then(|w| w.umr.as_mut()).filter(|u| u.key == c.key) else {
                *guard = None;
                return Err(libc::EINVAL);
            };
            let r = f(q, c, &mut umr.layout);
            c.remaining = c.remaining.saturating_sub(1);
            if r.is_err() || c.remaining == 0 {
                *guard = None;
            }
            r
        })
    };
}

unsafe extern "C" fn wr_set_mkey_access_flags(mqp: Mqp, access: u32) {
    // SAFETY: the caller's QP.
    unsafe {
        setter(mqp, |_, c, layout| {
            if std::mem::replace(&mut c.access_set, true) {
                return Err(libc::EINVAL);
            }
            layout.access = access_of(access)?;
            Ok(())
        })
    }
}

unsafe fn set_layout(mqp: Mqp, make: impl FnOnce() -> Result<Layout, c_int>) {
    // SAFETY: the caller's QP.
    unsafe {
        setter(mqp, |q, c, layout| {
            if std::mem::replace(&mut c.layout_set, true) {
                return Err(libc::EINVAL);
            }
            let mut l = make()?;
            l.access = layout.access;
            check(q, &l, c.max_entries)?;
            *layout = l;
            Ok(())
        })
    }
}

unsafe extern "C" fn wr_set_mkey_layout_list(mqp: Mqp, num_sges: u16, sge: *const ibv_sge) {
    // SAFETY: the caller's array.
    unsafe { set_layout(mqp, || Ok(Layout::list(Access::empty(), &sges(num_sges, sge)?))) }
}

unsafe extern "C" fn wr_set_mkey_layout_interleaved(
    mqp: Mqp,
    repeat_count: u32,
    num_interleaved: u16,
    data: *const UroceMrInterleaved,
) {
    // SAFETY: the caller's array.
    unsafe {
        set_layout(mqp, || Ok(Layout::interleaved(Access::empty(), repeat_count, &entries(num_interleaved, data)?)))
    }
}
