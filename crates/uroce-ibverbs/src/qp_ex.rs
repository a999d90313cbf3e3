//! The extended QP (`struct ibv_qp_ex`) and its work-request builders: the
//! `create_qp_ex` op behind verbs.h's inline `ibv_create_qp_ex`, and the
//! function pointers behind the inline `ibv_wr_*` calls.
//!
//! Semantics follow rdma-core's rxe provider: `wr_start` opens a batch, each
//! builder (`wr_send`, `wr_rdma_write`, …) adds one work request taking
//! `qp->wr_id` and `qp->wr_flags`, the setters (`wr_set_sge`,
//! `wr_set_inline_data`, `wr_set_ud_addr`, …) complete the last one,
//! `wr_complete` posts the batch and `wr_abort` drops it. Errors found while
//! building are latched and returned by `wr_complete`, which then posts
//! nothing. Each work request is converted by the same code as
//! `ibv_post_send`'s (`datapath::send_wr_head`). `wr_set_xrc_srqn` names the
//! target SRQ of an XRC_SEND QP's request; `wr_atomic_write` copies its 8
//! bytes when called, as rxe's provider does.
//!
//! Difference from rxe: the device validates each work request when the
//! batch is posted; one it refuses (for example a full send queue) fails
//! `wr_complete` with its errno, and the requests before it are posted.

use crate::datapath::{gather, send_wr_head, ud_dest};
use crate::ffi::*;
use crate::handles::UQp;
use std::ffi::{c_int, c_void};
use uroce::ib::{QpType, Sge};
use uroce::verbs::SendWr;

const WITH_RDMA_WRITE: u64 = ibv_qp_create_send_ops_flags_IBV_QP_EX_WITH_RDMA_WRITE as u64;
const WITH_RDMA_WRITE_IMM: u64 = ibv_qp_create_send_ops_flags_IBV_QP_EX_WITH_RDMA_WRITE_WITH_IMM as u64;
const WITH_SEND: u64 = ibv_qp_create_send_ops_flags_IBV_QP_EX_WITH_SEND as u64;
const WITH_SEND_IMM: u64 = ibv_qp_create_send_ops_flags_IBV_QP_EX_WITH_SEND_WITH_IMM as u64;
const WITH_RDMA_READ: u64 = ibv_qp_create_send_ops_flags_IBV_QP_EX_WITH_RDMA_READ as u64;
const WITH_CMP_SWP: u64 = ibv_qp_create_send_ops_flags_IBV_QP_EX_WITH_ATOMIC_CMP_AND_SWP as u64;
const WITH_FETCH_ADD: u64 = ibv_qp_create_send_ops_flags_IBV_QP_EX_WITH_ATOMIC_FETCH_AND_ADD as u64;
const WITH_LOCAL_INV: u64 = ibv_qp_create_send_ops_flags_IBV_QP_EX_WITH_LOCAL_INV as u64;
const WITH_BIND_MW: u64 = ibv_qp_create_send_ops_flags_IBV_QP_EX_WITH_BIND_MW as u64;
const WITH_SEND_INV: u64 = ibv_qp_create_send_ops_flags_IBV_QP_EX_WITH_SEND_WITH_INV as u64;
const WITH_ATOMIC_WRITE: u64 = ibv_qp_create_send_ops_flags_IBV_QP_EX_WITH_ATOMIC_WRITE as u64;

/// The send operations of each QP type (rxe's `RXE_SUP_*_QP_SEND_OPS_FLAGS`;
/// XRC_SEND's are RC's but ATOMIC WRITE, which rxe does on RC only).
const RC_OPS: u64 = XRC_OPS | WITH_ATOMIC_WRITE;
const XRC_OPS: u64 = WITH_RDMA_WRITE
    | WITH_RDMA_WRITE_IMM
    | WITH_SEND
    | WITH_SEND_IMM
    | WITH_RDMA_READ
    | WITH_CMP_SWP
    | WITH_FETCH_ADD
    | WITH_LOCAL_INV
    | WITH_BIND_MW
    | WITH_SEND_INV;
const UC_OPS: u64 = WITH_RDMA_WRITE | WITH_RDMA_WRITE_IMM | WITH_SEND | WITH_SEND_IMM | WITH_BIND_MW | WITH_SEND_INV;
const UD_OPS: u64 = WITH_SEND | WITH_SEND_IMM;

/// `ibv_qp_init_attr_ex.comp_mask` bits `create_qp_ex` accepts (rxe's, and
/// the XRC domain of an XRC_RECV QP).
pub(crate) const COMP_MASK_SUP: u32 = ibv_qp_init_attr_mask_IBV_QP_INIT_ATTR_PD
    | ibv_qp_init_attr_mask_IBV_QP_INIT_ATTR_XRCD
    | ibv_qp_init_attr_mask_IBV_QP_INIT_ATTR_CREATE_FLAGS
    | ibv_qp_init_attr_mask_IBV_QP_INIT_ATTR_SEND_OPS_FLAGS;

/// Every send operation a QP type supports.
pub fn all_ops(t: QpType) -> u64 {
    match t {
        QpType::Rc => RC_OPS,
        QpType::XrcSend => XRC_OPS,
        QpType::Uc => UC_OPS,
        QpType::Ud => UD_OPS,
        QpType::XrcRecv => 0,
    }
}

/// Fills the function pointers of an `ibv_qp_ex`: the builders of `ops`
/// (`IBV_QP_EX_WITH_*`), and the setters and batch calls every QP has.
pub fn set_ops(q: &mut ibv_qp_ex, t: QpType, ops: u64) {
    let has = |f: u64| ops & f != 0;
    q.wr_atomic_cmp_swp = if has(WITH_CMP_SWP) { Some(wr_atomic_cmp_swp) } else { None };
    q.wr_atomic_fetch_add = if has(WITH_FETCH_ADD) { Some(wr_atomic_fetch_add) } else { None };
    q.wr_bind_mw = if has(WITH_BIND_MW) { Some(wr_bind_mw) } else { None };
    q.wr_local_inv = if has(WITH_LOCAL_INV) { Some(wr_local_inv) } else { None };
    q.wr_rdma_read = if has(WITH_RDMA_READ) { Some(wr_rdma_read) } else { None };
    q.wr_rdma_write = if has(WITH_RDMA_WRITE) { Some(wr_rdma_write) } else { None };
    q.wr_rdma_write_imm = if has(WITH_RDMA_WRITE_IMM) { Some(wr_rdma_write_imm) } else { None };
    q.wr_send = if has(WITH_SEND) { Some(wr_send) } else { None };
    q.wr_send_imm = if has(WITH_SEND_IMM) { Some(wr_send_imm) } else { None };
    q.wr_send_inv = if has(WITH_SEND_INV) { Some(wr_send_inv) } else { None };
    q.wr_send_tso = None;
    q.wr_atomic_write = if has(WITH_ATOMIC_WRITE) { Some(wr_atomic_write) } else { None };
    q.wr_set_xrc_srqn = if t == QpType::XrcSend { Some(wr_set_xrc_srqn) } else { None };
    q.wr_set_ud_addr = Some(wr_set_ud_addr);
    q.wr_set_inline_data = Some(wr_set_inline_data);
    q.wr_set_inline_data_list = Some(wr_set_inline_data_list);
    q.wr_set_sge = Some(wr_set_sge);
    q.wr_set_sge_list = Some(wr_set_sge_list);
    q.wr_start = Some(wr_start);
    q.wr_complete = Some(wr_complete);
    q.wr_abort = Some(wr_abort);
}

/// The `UQp` of an `ibv_qp_ex` of this library (NULL: None).
unsafe fn uqp<'a>(qp: *mut ibv_qp_ex) -> Option<&'a UQp> {
    // SAFETY: every ibv_qp_ex we hand out is the first field of a UQp.
    unsafe { (qp as *const UQp).as_ref() }
}

/// Adds one work request: `opcode`, the QP's `wr_id` and `wr_flags`, and
/// what `fill` writes into the C work request (no SGEs).
unsafe fn build(qp: *mut ibv_qp_ex, opcode: ibv_wr_opcode, fill: impl FnOnce(&mut ibv_send_wr)) {
    // SAFETY: a QP of this library.
    let Some(q) = (unsafe { uqp(qp) }) else { return };
    let mut p = q.batch.lock();
    if p.err != 0 {
        return;
    }
    let Some(inner) = q.inner.as_ref() else {
        p.err = libc::EINVAL;
        return;
    };
    if p.wrs.len() >= inner.cap().max_send_wr as usize {
        p.err = libc::ENOSPC;
        return;
    }
    // SAFETY: ibv_send_wr is plain old data; all-zero is valid.
    let mut w: ibv_send_wr = unsafe { std::mem::zeroed() };
    w.wr_id = q.qp.wr_id;
    w.send_flags = q.qp.wr_flags;
    w.opcode = opcode;
    fill(&mut w);
    // SAFETY: a work request without SGEs, whose pointers (AH, window, MR)
    // are the caller's objects.
    match unsafe { send_wr_head(&w, q.qp.qp_base.qp_type) } {
        Some(wr) => p.wrs.push(wr),
        None => p.err = libc::EINVAL,
    }
}

/// Applies a setter to the last work request built.
unsafe fn set_last(qp: *mut ibv_qp_ex, f: impl FnOnce(&UQp, &mut SendWr) -> Result<(), c_int>) {
    // SAFETY: a QP of this library.
    let Some(q) = (unsafe { uqp(qp) }) else { return };
    let mut p = q.batch.lock();
    if p.err != 0 {
        return;
    }
    let r = match p.wrs.last_mut() {
        Some(wr) => f(q, wr),
        None => Err(libc::EINVAL),
    };
    if let Err(e) = r {
        p.err = e;
    }
}

fn max_inline(q: &UQp) -> usize {
    q.inner.as_ref().map_or(0, |i| i.cap().max_inline_data as usize)
}

fn max_sge(q: &UQp) -> usize {
    q.inner.as_ref().map_or(0, |i| i.cap().max_send_sge as usize)
}

unsafe extern "C" fn wr_atomic_cmp_swp(qp: *mut ibv_qp_ex, rkey: u32, remote_addr: u64, compare: u64, swap: u64) {
    // SAFETY: the caller's QP; the union member of an atomic WR.
    unsafe {
        build(qp, ibv_wr_opcode_IBV_WR_ATOMIC_CMP_AND_SWP, |w| {
            w.wr.atomic.rkey = rkey;
            w.wr.atomic.remote_addr = remote_addr;
            w.wr.atomic.compare_add = compare;
            w.wr.atomic.swap = swap;
        })
    }
}

unsafe extern "C" fn wr_atomic_fetch_add(qp: *mut ibv_qp_ex, rkey: u32, remote_addr: u64, add: u64) {
    // SAFETY: the caller's QP; the union member of an atomic WR.
    unsafe {
        build(qp, ibv_wr_opcode_IBV_WR_ATOMIC_FETCH_AND_ADD, |w| {
            w.wr.atomic.rkey = rkey;
            w.wr.atomic.remote_addr = remote_addr;
            w.wr.atomic.compare_add = add;
        })
    }
}

unsafe extern "C" fn wr_atomic_write(qp: *mut ibv_qp_ex, rkey: u32, remote_addr: u64, atomic_wr: *const c_void) {
    if atomic_wr.is_null() {
        // SAFETY: the caller's QP.
        return unsafe { set_error(qp, libc::EINVAL) };
    }
    // SAFETY: the caller's QP.
    unsafe {
        build(qp, ibv_wr_opcode_IBV_WR_ATOMIC_WRITE, |w| {
            w.wr.rdma.rkey = rkey;
            w.wr.rdma.remote_addr = remote_addr;
        });
        set_last(qp, |_, wr| {
            // SAFETY: verbs' contract: 8 readable bytes at `atomic_wr`.
            wr.inline = Some(gather(&[Sge { addr: atomic_wr as u64, length: 8, lkey: 0 }]));
            Ok(())
        })
    }
}

unsafe extern "C" fn wr_bind_mw(qp: *mut ibv_qp_ex, mw: *mut ibv_mw, rkey: u32, info: *const ibv_mw_bind_info) {
    if info.is_null() {
        // SAFETY: the caller's QP.
        return unsafe { set_error(qp, libc::EINVAL) };
    }
    // SAFETY: the caller's QP, window and bind description.
    unsafe {
        build(qp, ibv_wr_opcode_IBV_WR_BIND_MW, |w| {
            w.__bindgen_anon_2.bind_mw.mw = mw;
            w.__bindgen_anon_2.bind_mw.rkey = rkey;
            w.__bindgen_anon_2.bind_mw.bind_info = *info;
        })
    }
}

unsafe extern "C" fn wr_local_inv(qp: *mut ibv_qp_ex, invalidate_rkey: u32) {
    // SAFETY: the caller's QP.
    unsafe { build(qp, ibv_wr_opcode_IBV_WR_LOCAL_INV, |w| w.__bindgen_anon_1.invalidate_rkey = invalidate_rkey) }
}

unsafe extern "C" fn wr_rdma_read(qp: *mut ibv_qp_ex, rkey: u32, remote_addr: u64) {
    // SAFETY: the caller's QP.
    unsafe {
        build(qp, ibv_wr_opcode_IBV_WR_RDMA_READ, |w| {
            w.wr.rdma.rkey = rkey;
            w.wr.rdma.remote_addr = remote_addr;
        })
    }
}

unsafe extern "C" fn wr_rdma_write(qp: *mut ibv_qp_ex, rkey: u32, remote_addr: u64) {
    // SAFETY: the caller's QP.
    unsafe {
        build(qp, ibv_wr_opcode_IBV_WR_RDMA_WRITE, |w| {
            w.wr.rdma.rkey = rkey;
            w.wr.rdma.remote_addr = remote_addr;
        })
    }
}

unsafe extern "C" fn wr_rdma_write_imm(qp: *mut ibv_qp_ex, rkey: u32, remote_addr: u64, imm_data: __be32) {
    // SAFETY: the caller's QP.
    unsafe {
        build(qp, ibv_wr_opcode_IBV_WR_RDMA_WRITE_WITH_IMM, |w| {
            w.wr.rdma.rkey = rkey;
            w.wr.rdma.remote_addr = remote_addr;
            w.__bindgen_anon_1.imm_data = imm_data;
        })
    }
}

unsafe extern "C" fn wr_send(qp: *mut ibv_qp_ex) {
    // SAFETY: the caller's QP.
    unsafe { build(qp, ibv_wr_opcode_IBV_WR_SEND, |_| ()) }
}

unsafe extern "C" fn wr_send_imm(qp: *mut ibv_qp_ex, imm_data: __be32) {
    // SAFETY: the caller's QP.
    unsafe { build(qp, ibv_wr_opcode_IBV_WR_SEND_WITH_IMM, |w| w.__bindgen_anon_1.imm_data = imm_data) }
}

unsafe extern "C" fn wr_send_inv(qp: *mut ibv_qp_ex, invalidate_rkey: u32) {
    // SAFETY: the caller's QP.
    unsafe { build(qp, ibv_wr_opcode_IBV_WR_SEND_WITH_INV, |w| w.__bindgen_anon_1.invalidate_rkey = invalidate_rkey) }
}

unsafe fn set_error(qp: *mut ibv_qp_ex, e: c_int) {
    // SAFETY: the caller's QP.
    if let Some(q) = unsafe { uqp(qp) } {
        let mut p = q.batch.lock();
        if p.err == 0 {
            p.err = e;
        }
    }
}

unsafe extern "C" fn wr_set_xrc_srqn(qp: *mut ibv_qp_ex, remote_srqn: u32) {
    // SAFETY: the caller's QP.
    unsafe {
        set_last(qp, |_, wr| {
            wr.remote_srqn = remote_srqn;
            Ok(())
        })
    }
}

unsafe extern "C" fn wr_set_ud_addr(qp: *mut ibv_qp_ex, ah: *mut ibv_ah, remote_qpn: u32, remote_qkey: u32) {
    // SAFETY: the caller's QP; an AH of ibv_create_ah.
    unsafe {
        set_last(qp, |_, wr| {
            wr.ud = Some(ud_dest(ah, remote_qpn, remote_qkey).ok_or(libc::EINVAL)?);
            Ok(())
        })
    }
}

unsafe extern "C" fn wr_set_inline_data(qp: *mut ibv_qp_ex, addr: *mut c_void, length: usize) {
    if addr.is_null() && length > 0 {
        // SAFETY: the caller's QP.
        return unsafe { set_error(qp, libc::EINVAL) };
    }
    // SAFETY: the caller's QP.
    unsafe {
        set_last(qp, |q, wr| {
            if length > max_inline(q) {
                return Err(libc::ENOSPC);
            }
            // The data is copied now: the buffer may be reused at once.
            // SAFETY: verbs' contract: `length` readable bytes at `addr`.
            wr.inline = Some(gather(&[Sge { addr: addr as u64, length: length as u32, lkey: 0 }]));
            wr.sg_list.clear();
            Ok(())
        })
    }
}

unsafe extern "C" fn wr_set_inline_data_list(qp: *mut ibv_qp_ex, num_buf: usize, buf_list: *const ibv_data_buf) {
    if buf_list.is_null() && num_buf > 0 {
        // SAFETY: the caller's QP.
        return unsafe { set_error(qp, libc::EINVAL) };
    }
    // SAFETY: the caller's QP.
    unsafe {
        set_last(qp, |q, wr| {
            let bufs = if num_buf == 0 {
                &[][..]
            } else {
                // SAFETY: the caller's array of `num_buf` buffers.
                std::slice::from_raw_parts(buf_list, num_buf)
            };
            let total = bufs.iter().try_fold(0usize, |t, b| t.checked_add(b.length));
            if total.is_none_or(|t| t > max_inline(q)) {
                return Err(libc::ENOSPC);
            }
            let list: Vec<Sge> =
                bufs.iter().map(|b| Sge { addr: b.addr as u64, length: b.length as u32, lkey: 0 }).collect();
            // SAFETY: verbs' contract: each buffer is readable.
            wr.inline = Some(gather(&list));
            wr.sg_list.clear();
            Ok(())
        })
    }
}

unsafe extern "C" fn wr_set_sge(qp: *mut ibv_qp_ex, lkey: u32, addr: u64, length: u32) {
    // SAFETY: the caller's QP.
    unsafe {
        set_last(qp, |_, wr| {
            // As rxe: a zero-length SGE is no SGE.
            wr.sg_list = if length > 0 { uroce::sgl![Sge { addr, length, lkey }] } else { Default::default() };
            wr.inline = None;
            Ok(())
        })
    }
}

unsafe extern "C" fn wr_set_sge_list(qp: *mut ibv_qp_ex, num_sge: usize, sg_list: *const ibv_sge) {
    if sg_list.is_null() && num_sge > 0 {
        // SAFETY: the caller's QP.
        return unsafe { set_error(qp, libc::EINVAL) };
    }
    // SAFETY: the caller's QP.
    unsafe {
        set_last(qp, |q, wr| {
            if num_sge > max_sge(q) {
                return Err(libc::ENOSPC);
            }
            // SAFETY: the caller's array of `num_sge` SGEs (checked against
            // the QP's maximum, which fits a c_int).
            wr.sg_list = crate::datapath::sges(sg_list, num_sge);
            wr.inline = None;
            Ok(())
        })
    }
}

unsafe extern "C" fn wr_start(qp: *mut ibv_qp_ex) {
    // SAFETY: the caller's QP.
    if let Some(q) = unsafe { uqp(qp) } {
        let mut p = q.batch.lock();
        p.wrs.clear();
        p.err = 0;
    }
}

unsafe extern "C" fn wr_complete(qp: *mut ibv_qp_ex) -> c_int {
    // SAFETY: the caller's QP.
    let Some(q) = (unsafe { uqp(qp) }) else { return libc::EINVAL };
    let (wrs, err) = {
        let mut p = q.batch.lock();
        (std::mem::take(&mut p.wrs), std::mem::replace(&mut p.err, 0))
    };
    if err != 0 {
        return err;
    }
    if wrs.is_empty() {
        return 0;
    }
    let Some(inner) = q.inner.as_ref() else { return libc::EINVAL };
    let n = wrs.len();
    // The batch goes whole or not at all (rxe's wr_complete drops a batch
    // that did not fit): refused with ENOSPC, as rxe's builders, when the
    // send queue has fewer free slots than it has WRs.
    let mut wrs = wrs.into_iter();
    let posted = inner.post_send_with(|i, lim| {
        if i == 0 && lim.free < n {
            return Some(Err(uroce::ib::Error::new(uroce::ib::Errno(libc::ENOSPC), "wr_complete: send queue full")));
        }
        wrs.next().map(Ok)
    });
    match posted {
        Ok(()) => {
            trace_once(n);
            0
        }
        Err((_, e)) => e.errno.0,
    }
}

unsafe extern "C" fn wr_abort(qp: *mut ibv_qp_ex) {
    // SAFETY: the caller's QP.
    if let Some(q) = unsafe { uqp(qp) } {
        let mut p = q.batch.lock();
        p.wrs.clear();
        p.err = 0;
    }
}

/// With `UROCE_TRACE_WR_API=1`, the first batch posted through the
/// `ibv_wr_*` API writes one line to stderr (the tests use it to see which
/// post-send API a program takes).
fn trace_once(n: usize) {
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::OnceLock;
    static ON: OnceLock<bool> = OnceLock::new();
    static DONE: AtomicBool = AtomicBool::new(false);
    if *ON.get_or_init(|| std::env::var_os("UROCE_TRACE_WR_API").is_some_and(|v| v == "1"))
        && !DONE.swap(true, Ordering::Relaxed)
    {
        use std::io::Write;
        let _ = writeln!(std::io::stderr(), "uroce: ibv_wr_* API: posted a batch of {n} work requests");
    }
}

/// Adds one work request made by `make` (mlx5dv's UMR builders, `mlx5dv/`),
/// with the QP's `wr_id` and `wr_flags`, unless an error is latched; an
/// error of `make` is latched.
pub(crate) unsafe fn push_wr(qp: *mut ibv_qp_ex, make: impl FnOnce(&UQp, u64, u32) -> Result<SendWr, c_int>) {
    // SAFETY: a QP of this library.
    let Some(q) = (unsafe { uqp(qp) }) else { return };
    let mut p = q.batch.lock();
    if p.err != 0 {
        return;
    }
    let Some(inner) = q.inner.as_ref() else {
        p.err = libc::EINVAL;
        return;
    };
    if p.wrs.len() >= inner.cap().max_send_wr as usize {
        p.err = libc::ENOSPC;
        return;
    }
    match make(q, q.qp.wr_id, q.qp.wr_flags) {
        Ok(wr) => p.wrs.push(wr),
        Err(e) => p.err = e,
    }
}

/// Changes the last work request built (mlx5dv's mkey setters), unless an
/// error is latched; an error of `f` is latched.
pub(crate) unsafe fn with_last(qp: *mut ibv_qp_ex, f: impl FnOnce(&UQp, Option<&mut SendWr>) -> Result<(), c_int>) {
    // SAFETY: a QP of this library.
    let Some(q) = (unsafe { uqp(qp) }) else { return };
    let mut p = q.batch.lock();
    if p.err != 0 {
        return;
    }
    if let Err(e) = f(q, p.wrs.last_mut()) {
        p.err = e;
    }
}

/// Latches an error into the batch (mlx5dv's builders).
pub(crate) unsafe fn latch(qp: *mut ibv_qp_ex, e: c_int) {
    // SAFETY: the caller's QP.
    unsafe { set_error(qp, e) }
}
