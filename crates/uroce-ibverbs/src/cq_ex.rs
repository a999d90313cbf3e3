//! The extended CQ (`struct ibv_cq_ex`): the `create_cq_ex` op behind
//! verbs.h's inline `ibv_create_cq_ex`, and the polling functions behind
//! `ibv_start_poll`, `ibv_next_poll`, `ibv_end_poll` and `ibv_wc_read_*`.
//!
//! Every CQ of this library is an `ibv_cq_ex` (`objects::UCq`), so
//! `ibv_cq_ex_to_cq`, `ibv_poll_cq`, completion channels, `ibv_req_notify_cq`
//! and `ibv_destroy_cq` work on these CQs as on any other. `start_poll` and
//! `next_poll` take one completion off the queue (driving the device when it
//! is empty, as `ibv_poll_cq` does), keep it for the `read_*` functions and
//! set the CQ's `status` and `wr_id`. As in rxe, the supported `wc_flags` are
//! BYTE_LEN, IMM, QP_NUM, SRC_QP, SLID, SL and DLID_PATH_BITS; uroce has no
//! completion clock, so timestamps (and CVLAN, flow tag, TM info) are
//! refused with EOPNOTSUPP.

use crate::errno::null;
use crate::ffi::*;
use crate::handles::UCq;
use std::ffi::c_int;
use uroce::ib::{Wc, WcFlags};

const SUP_WC_FLAGS: u64 = (ibv_create_cq_wc_flags_IBV_WC_EX_WITH_BYTE_LEN
    | ibv_create_cq_wc_flags_IBV_WC_EX_WITH_IMM
    | ibv_create_cq_wc_flags_IBV_WC_EX_WITH_QP_NUM
    | ibv_create_cq_wc_flags_IBV_WC_EX_WITH_SRC_QP
    | ibv_create_cq_wc_flags_IBV_WC_EX_WITH_SLID
    | ibv_create_cq_wc_flags_IBV_WC_EX_WITH_SL
    | ibv_create_cq_wc_flags_IBV_WC_EX_WITH_DLID_PATH_BITS) as u64;

const MASK_FLAGS: u32 = ibv_cq_init_attr_mask_IBV_CQ_INIT_ATTR_MASK_FLAGS;
const MASK_PD: u32 = ibv_cq_init_attr_mask_IBV_CQ_INIT_ATTR_MASK_PD;

/// `verbs_context.create_cq_ex`.
pub unsafe extern "C" fn create_cq_ex(ctx: *mut ibv_context, attr: *mut ibv_cq_init_attr_ex) -> *mut ibv_cq_ex {
    if ctx.is_null() || attr.is_null() {
        return null(libc::EINVAL);
    }
    // SAFETY: the caller's attributes.
    let a = unsafe { &*attr };
    if a.comp_mask & !(MASK_FLAGS | MASK_PD) != 0 {
        return null(libc::EINVAL);
    }
    if a.wc_flags & !SUP_WC_FLAGS != 0 {
        return null(libc::EOPNOTSUPP);
    }
    // Single-threaded use needs nothing; rxe refuses IGNORE_OVERRUN.
    if a.comp_mask & MASK_FLAGS != 0 && a.flags & !ibv_create_cq_attr_flags_IBV_CREATE_CQ_ATTR_SINGLE_THREADED != 0 {
        return null(libc::EOPNOTSUPP);
    }
    let Ok(cqe) = c_int::try_from(a.cqe) else { return null(libc::EINVAL) };
    // SAFETY: our context, and the caller's channel (or NULL).
    let cq = unsafe { crate::objects::ibv_create_cq(ctx, cqe, a.cq_context, a.channel, a.comp_vector as c_int) };
    if cq.is_null() {
        return std::ptr::null_mut();
    }
    let cx = cq as *mut ibv_cq_ex;
    // SAFETY: a fresh CQ of ibv_create_cq (a UCq, whose first field is an
    // ibv_cq_ex), not yet known to the caller.
    unsafe {
        (*cx).start_poll = Some(start_poll);
        (*cx).next_poll = Some(next_poll);
        (*cx).end_poll = Some(end_poll);
        (*cx).read_opcode = Some(read_opcode);
        (*cx).read_vendor_err = Some(read_vendor_err);
        (*cx).read_byte_len = Some(read_byte_len);
        (*cx).read_imm_data = Some(read_imm_data);
        (*cx).read_qp_num = Some(read_qp_num);
        (*cx).read_src_qp = Some(read_src_qp);
        (*cx).read_wc_flags = Some(read_wc_flags);
        (*cx).read_slid = Some(read_slid);
        (*cx).read_sl = Some(read_sl);
        (*cx).read_dlid_path_bits = Some(read_dlid_path_bits);
    }
    cx
}

/// Takes the next completion: 0, ENOENT when the CQ is empty, or EIO once
/// an overrun CQ is empty (as `ibv_poll_cq`'s -EIO; docs/reliability.md).
unsafe fn take(cq: *mut ibv_cq_ex) -> c_int {
    let got = {
        // SAFETY: every ibv_cq_ex we hand out is the first field of a UCq.
        let Some(c) = (unsafe { (cq as *const UCq).as_ref() }) else { return libc::EINVAL };
        let Some(ring) = c.inner.as_ref() else { return libc::EINVAL };
        let Ok(wc) = ring.poll_one_or_overrun() else {
            c.cur.set(None);
            return libc::EIO;
        };
        c.cur.set(wc);
        wc
    };
    match got {
        Some(wc) => {
            // SAFETY: the caller's CQ; the fields the application reads
            // directly (verbs.h: `cq->status`, `cq->wr_id`).
            unsafe {
                std::ptr::addr_of_mut!((*cq).status).write(wc.status.to_raw());
                std::ptr::addr_of_mut!((*cq).wr_id).write(wc.wr_id);
            }
            0
        }
        None => libc::ENOENT,
    }
}

unsafe extern "C" fn start_poll(cq: *mut ibv_cq_ex, attr: *mut ibv_poll_cq_attr) -> c_int {
    // SAFETY: the caller's attributes, or NULL.
    if unsafe { attr.as_ref() }.is_some_and(|a| a.comp_mask != 0) {
        return libc::EINVAL;
    }
    // SAFETY: the caller's CQ.
    unsafe { take(cq) }
}

unsafe extern "C" fn next_poll(cq: *mut ibv_cq_ex) -> c_int {
    // SAFETY: the caller's CQ.
    unsafe { take(cq) }
}

unsafe extern "C" fn end_poll(cq: *mut ibv_cq_ex) {
    // SAFETY: the caller's CQ.
    if let Some(c) = unsafe { (cq as *const UCq).as_ref() } {
        c.cur.set(None);
    }
}

/// A field of the current completion (0 without one).
unsafe fn read<T: Default>(cq: *mut ibv_cq_ex, f: impl FnOnce(&Wc) -> T) -> T {
    // SAFETY: the caller's CQ.
    match unsafe { (cq as *const UCq).as_ref() }.and_then(|c| c.cur.get()) {
        Some(wc) => f(&wc),
        None => T::default(),
    }
}

unsafe extern "C" fn read_opcode(cq: *mut ibv_cq_ex) -> ibv_wc_opcode {
    // SAFETY: the caller's CQ.
    unsafe { read(cq, |w| w.opcode.to_raw()) }
}

unsafe extern "C" fn read_vendor_err(cq: *mut ibv_cq_ex) -> u32 {
    // SAFETY: the caller's CQ.
    unsafe { read(cq, |w| w.vendor_err) }
}

unsafe extern "C" fn read_byte_len(cq: *mut ibv_cq_ex) -> u32 {
    // SAFETY: the caller's CQ.
    unsafe { read(cq, |w| w.byte_len) }
}

/// The immediate data in network order; for a completion WITH_INV the
/// invalidated rkey, also in network order (verbs.h's
/// `ibv_wc_read_invalidated_rkey` byte-swaps what this returns).
unsafe extern "C" fn read_imm_data(cq: *mut ibv_cq_ex) -> __be32 {
    // SAFETY: the caller's CQ.
    unsafe { read(cq, |w| w.imm_data.to_be()) }
}

unsafe extern "C" fn read_qp_num(cq: *mut ibv_cq_ex) -> u32 {
    // SAFETY: the caller's CQ.
    unsafe { read(cq, |w| w.qp_num) }
}

unsafe extern "C" fn read_src_qp(cq: *mut ibv_cq_ex) -> u32 {
    // SAFETY: the caller's CQ.
    unsafe { read(cq, |w| w.src_qp) }
}

unsafe extern "C" fn read_wc_flags(cq: *mut ibv_cq_ex) -> u32 {
    // SAFETY: the caller's CQ.
    unsafe { read(cq, |w| w.wc_flags.bits()) }
}

unsafe extern "C" fn read_slid(cq: *mut ibv_cq_ex) -> u32 {
    // SAFETY: the caller's CQ.
    unsafe { read(cq, |w| w.slid as u32) }
}

unsafe extern "C" fn read_sl(cq: *mut ibv_cq_ex) -> u8 {
    // SAFETY: the caller's CQ.
    unsafe { read(cq, |w| w.sl) }
}

unsafe extern "C" fn read_dlid_path_bits(cq: *mut ibv_cq_ex) -> u8 {
    // SAFETY: the caller's CQ.
    unsafe { read(cq, |w| w.dlid_path_bits) }
}

// WcFlags are verbs.h's `enum ibv_wc_flags` bit for bit (read_wc_flags and
// datapath::to_c copy them as they are).
const _: () = assert!(WcFlags::WITH_INV.bits() == ibv_wc_flags_IBV_WC_WITH_INV);
