//! The memory features beyond the core verbs: `ibv_advise_mr` (the
//! verbs_context op behind verbs.h's inline), `ibv_reg_dmabuf_mr`, and the
//! uroce extensions declared in `include/uroce.h`: indirect keys (mkeys) with
//! list and interleaved layouts set directly or by UMR through a send queue,
//! and ODP statistics.

use crate::errno::{fail, null, ret, set_errno};
use crate::ffi::*;
use crate::handles::{UContext, UMkey, UMr, UPd, UQp, UroceMrInterleaved};
use std::ffi::c_int;
use uroce::ib::{Access, Sge};
use uroce::verbs::{Advice, InterleavedEntry, Layout, OdpStats, SendWr, WrOpcode};

/// `enum ibv_advise_mr_advice`.
const PREFETCH: u32 = 0;
const PREFETCH_WRITE: u32 = 1;
const PREFETCH_NO_FAULT: u32 = 2;
const ADVISE_FLAG_FLUSH: u32 = 1;

unsafe fn sge_list(list: *const ibv_sge, n: usize) -> Vec<Sge> {
    if list.is_null() || n == 0 {
        return Vec::new();
    }
    // SAFETY: the caller's array of `n` SGEs.
    unsafe { std::slice::from_raw_parts(list, n) }
        .iter()
        .map(|s| Sge { addr: s.addr, length: s.length, lkey: s.lkey })
        .collect()
}

/// `verbs_context.advise_mr`: 0 or an errno value, also set in errno (as
/// mlx5's, whose `ibv_cmd_advise_mr` returns the ioctl's errno; EOPNOTSUPP
/// for a region that is not ODP).
pub unsafe extern "C" fn advise_mr(
    pd: *mut ibv_pd,
    advice: u32,
    flags: u32,
    sg_list: *mut ibv_sge,
    num_sge: u32,
) -> c_int {
    if pd.is_null() || flags & !ADVISE_FLAG_FLUSH != 0 {
        return ret(libc::EINVAL);
    }
    let advice = match advice {
        PREFETCH => Advice::Prefetch,
        PREFETCH_WRITE => Advice::PrefetchWrite,
        PREFETCH_NO_FAULT => Advice::PrefetchNoFault,
        _ => return ret(libc::EOPNOTSUPP),
    };
    // SAFETY: a PD from ibv_alloc_pd.
    let p = unsafe { &*(pd as *const UPd) };
    let Some(inner) = p.inner.as_ref() else { return ret(libc::EINVAL) };
    // SAFETY: the caller's SGE array.
    let sges = unsafe { sge_list(sg_list, num_sge as usize) };
    match inner.advise_mr(advice, flags & ADVISE_FLAG_FLUSH != 0, &sges) {
        Ok(()) => 0,
        Err(e) => ret(e.errno.0),
    }
}

/// `enum ibv_odp_transport_cap_bits`.
mod odp {
    pub const SEND: u32 = 1;
    pub const RECV: u32 = 1 << 1;
    pub const WRITE: u32 = 1 << 2;
    pub const READ: u32 = 1 << 3;
    pub const ATOMIC: u32 = 1 << 4;
    pub const SRQ_RECV: u32 = 1 << 5;
    pub const ATOMIC_WRITE: u32 = 1 << 7;
}

/// `ibv_device_attr_ex.odp_caps`: what the ODP data path serves, per
/// transport (every operation: ODP memory is copied through the one span
/// interface all operations use).
pub fn odp_caps() -> ibv_odp_caps {
    use odp::*;
    const SUPPORT: u64 = 1;
    const IMPLICIT: u64 = 2;
    // SAFETY: plain old data.
    let mut c: ibv_odp_caps = unsafe { std::mem::zeroed() };
    c.general_caps = SUPPORT | IMPLICIT;
    c.per_transport_caps.rc_odp_caps = SEND | RECV | WRITE | READ | ATOMIC | SRQ_RECV | ATOMIC_WRITE;
    c.per_transport_caps.uc_odp_caps = SEND | RECV | WRITE | SRQ_RECV;
    c.per_transport_caps.ud_odp_caps = SEND | RECV | SRQ_RECV;
    c
}

/// `ibv_device_attr_ex.xrc_odp_caps`: XRC's operations (its receives are
/// SRQ receives; no ATOMIC WRITE on XRC).
pub fn xrc_odp_caps() -> u32 {
    use odp::*;
    SEND | WRITE | READ | ATOMIC | SRQ_RECV
}

#[no_mangle]
pub unsafe extern "C" fn ibv_reg_dmabuf_mr(
    pd: *mut ibv_pd,
    offset: u64,
    length: usize,
    iova: u64,
    fd: c_int,
    access: c_int,
) -> *mut ibv_mr {
    if pd.is_null() {
        return null(libc::EINVAL);
    }
    // SAFETY: a PD from ibv_alloc_pd.
    let p = unsafe { &*(pd as *const UPd) };
    let Some(inner) = p.inner.as_ref() else { return null(libc::EINVAL) };
    match inner.register_dmabuf(offset, length, iova, fd, Access::from_bits_retain(access as u32)) {
        Ok(mr) => {
            // As libibverbs: mr->addr is the offset for a dma-buf MR.
            let raw = ibv_mr {
                context: p.pd.context,
                pd,
                addr: offset as *mut libc::c_void,
                length,
                handle: 0, // named by publish_mr
                lkey: mr.lkey(),
                rkey: mr.rkey(),
            };
            // SAFETY: the PD's context is ours.
            unsafe { crate::share::publish_mr(UMr { mr: raw, inner: Some(mr), dm: None }) }
        }
        Err(e) => null(fail(&e)),
    }
}

/// `struct uroce_odp_stats`.
#[repr(C)]
pub struct UroceOdpStats {
    pub page_faults: u64,
    pub page_faults_handled: u64,
    pub page_invalidations: u64,
    pub page_invalidations_handled: u64,
    pub page_prefetch: u64,
}

impl From<OdpStats> for UroceOdpStats {
    fn from(s: OdpStats) -> Self {
        UroceOdpStats {
            page_faults: s.page_faults,
            page_faults_handled: s.page_faults_handled,
            page_invalidations: s.page_invalidations,
            page_invalidations_handled: s.page_invalidations_handled,
            page_prefetch: s.page_prefetch,
        }
    }
}

#[no_mangle]
pub unsafe extern "C" fn uroce_create_mkey(pd: *mut ibv_pd, max_entries: u16) -> *mut UMkey {
    if pd.is_null() {
        return null(libc::EINVAL);
    }
    // SAFETY: a PD from ibv_alloc_pd.
    let p = unsafe { &*(pd as *const UPd) };
    let Some(inner) = p.inner.as_ref() else { return null(libc::EINVAL) };
    match inner.create_indirect_key(max_entries as u32) {
        Ok(key) => {
            Box::into_raw(Box::new(UMkey { lkey: key.lkey(), rkey: key.rkey(), max_entries: key.max_entries(), key }))
        }
        Err(e) => null(fail(&e)),
    }
}

#[no_mangle]
pub unsafe extern "C" fn uroce_destroy_mkey(mkey: *mut UMkey) -> c_int {
    if mkey.is_null() {
        return libc::EINVAL;
    }
    // SAFETY: an mkey from uroce_create_mkey, destroyed once.
    drop(unsafe { Box::from_raw(mkey) });
    0
}

unsafe fn list_layout(access: u32, n: u16, sge: *const ibv_sge) -> Layout {
    // SAFETY: the caller's array of `n` SGEs.
    Layout::list(Access::from_bits_retain(access), &unsafe { sge_list(sge, n as usize) })
}

unsafe fn interleaved_layout(access: u32, repeat: u32, n: u16, data: *const UroceMrInterleaved) -> Layout {
    let entries: Vec<InterleavedEntry> = if data.is_null() || n == 0 {
        Vec::new()
    } else {
        // SAFETY: the caller's array of `n` entries.
        unsafe { std::slice::from_raw_parts(data, n as usize) }
            .iter()
            .map(|e| InterleavedEntry {
                addr: e.addr,
                bytes_count: e.bytes_count,
                bytes_skip: e.bytes_skip,
                lkey: e.lkey,
            })
            .collect()
    };
    Layout::interleaved(Access::from_bits_retain(access), repeat, &entries)
}

fn set(mkey: *mut UMkey, layout: Option<Layout>) -> c_int {
    // SAFETY: an mkey from uroce_create_mkey (checked non-null by callers).
    let m = unsafe { &*mkey };
    let r = match layout {
        Some(l) => m.key.set_layout(l),
        None => m.key.clear_layout(),
    };
    match r {
        Ok(()) => 0,
        Err(e) => e.errno.0,
    }
}

#[no_mangle]
pub unsafe extern "C" fn uroce_mkey_set_list(
    mkey: *mut UMkey,
    access: u32,
    num_sges: u16,
    sge: *const ibv_sge,
) -> c_int {
    if mkey.is_null() || (sge.is_null() && num_sges > 0) {
        return libc::EINVAL;
    }
    // SAFETY: the caller's SGE array.
    set(mkey, Some(unsafe { list_layout(access, num_sges, sge) }))
}

#[no_mangle]
pub unsafe extern "C" fn uroce_mkey_set_interleaved(
    mkey: *mut UMkey,
    access: u32,
    repeat_count: u32,
    num_interleaved: u16,
    data: *const UroceMrInterleaved,
) -> c_int {
    if mkey.is_null() || (data.is_null() && num_interleaved > 0) {
        return libc::EINVAL;
    }
    // SAFETY: the caller's entry array.
    set(mkey, Some(unsafe { interleaved_layout(access, repeat_count, num_interleaved, data) }))
}

#[no_mangle]
pub unsafe extern "C" fn uroce_mkey_clear(mkey: *mut UMkey) -> c_int {
    if mkey.is_null() {
        return libc::EINVAL;
    }
    set(mkey, None)
}

fn post_umr(qp: *mut ibv_qp, wr_id: u64, send_flags: u32, mkey: *mut UMkey, layout: Layout) -> c_int {
    if qp.is_null() || mkey.is_null() {
        return libc::EINVAL;
    }
    // SAFETY: a QP from ibv_create_qp (ibv_qp is the first member of UQp).
    let q = unsafe { &*(qp as *const UQp) };
    let Some(inner) = q.inner.as_ref() else { return libc::EINVAL };
    let mut wr = SendWr::new(wr_id, WrOpcode::Umr);
    wr.flags = uroce::ib::SendFlags::from_bits_retain(send_flags);
    // SAFETY: checked non-null above.
    wr.umr = Some(Box::new(uroce::proto::wr::Umr { key: unsafe { (*mkey).lkey }, layout }));
    match inner.post_send(&wr) {
        Ok(()) => 0,
        Err(e) => e.errno.0,
    }
}

#[no_mangle]
pub unsafe extern "C" fn uroce_post_umr_list(
    qp: *mut ibv_qp,
    wr_id: u64,
    send_flags: u32,
    mkey: *mut UMkey,
    access: u32,
    num_sges: u16,
    sge: *const ibv_sge,
) -> c_int {
    if sge.is_null() && num_sges > 0 {
        return libc::EINVAL;
    }
    // SAFETY: the caller's SGE array.
    post_umr(qp, wr_id, send_flags, mkey, unsafe { list_layout(access, num_sges, sge) })
}

#[no_mangle]
pub unsafe extern "C" fn uroce_post_umr_interleaved(
    qp: *mut ibv_qp,
    wr_id: u64,
    send_flags: u32,
    mkey: *mut UMkey,
    access: u32,
    repeat_count: u32,
    num_interleaved: u16,
    data: *const UroceMrInterleaved,
) -> c_int {
    if data.is_null() && num_interleaved > 0 {
        return libc::EINVAL;
    }
    // SAFETY: the caller's entry array.
    post_umr(qp, wr_id, send_flags, mkey, unsafe { interleaved_layout(access, repeat_count, num_interleaved, data) })
}

#[no_mangle]
pub unsafe extern "C" fn uroce_mr_odp_stats(mr: *mut ibv_mr, out: *mut UroceOdpStats) -> c_int {
    if mr.is_null() || out.is_null() {
        return libc::EINVAL;
    }
    // SAFETY: an MR from ibv_reg_mr; `out` is the caller's struct.
    let m = unsafe { &*(mr as *const UMr) };
    match m.inner.as_ref().and_then(|r| r.odp_stats()) {
        Some(s) => {
            // SAFETY: as above.
            unsafe { *out = s.into() };
            0
        }
        None => libc::EOPNOTSUPP,
    }
}

#[no_mangle]
pub unsafe extern "C" fn uroce_device_odp_stats(ctx: *mut ibv_context, out: *mut UroceOdpStats) -> c_int {
    if ctx.is_null() || out.is_null() {
        set_errno(libc::EINVAL);
        return libc::EINVAL;
    }
    // SAFETY: our context; `out` is the caller's struct.
    unsafe { *out = UContext::from_ctx(ctx).ctx.odp_stats().into() };
    0
}
