//! The inline fast paths of verbs.h, reached through the context's ops table:
//! post_send, post_recv, poll_cq, req_notify_cq.

use crate::ffi::*;
use crate::handles::{UCq, UQp};
use std::ffi::c_int;
use uroce::ib::{SendFlags, Sge, Wc};
use uroce::verbs::{QueueLimits, RecvWr, SendWr, SgList, UdDest, WrOpcode};

/// The `n` SGEs at `list` (`n` already checked against the queue's
/// max_sge, so the read and the copy are bounded).
pub(crate) unsafe fn sges(list: *const ibv_sge, n: usize) -> SgList {
    if list.is_null() || n == 0 {
        return SgList::new();
    }
    // SAFETY: the caller's array of `n` SGEs.
    unsafe { std::slice::from_raw_parts(list, n) }
        .iter()
        .map(|s| Sge { addr: s.addr, length: s.length, lkey: s.lkey })
        .collect()
}

/// Converts send WR number `index` of a post after checking it against the
/// queue's limits: room, opcode for the QP type, SGE count, then the inline
/// total; the SGE array is read and inline data copied only after.
unsafe fn send_wr(w: &ibv_send_wr, qp_type: ibv_qp_type, index: usize, lim: &QueueLimits) -> uroce::ib::Result<SendWr> {
    lim.check_room(index)?;
    lim.check_opcode(w.opcode)?;
    let n = lim.check_num_sge(i64::from(w.num_sge))?;
    // SAFETY: the caller's work request.
    let mut wr = unsafe { send_wr_head(w, qp_type) }
        .ok_or_else(|| uroce::ib::Error::inval("post_send: BIND_MW without a window"))?;
    // SAFETY: the caller's SGE array, of `n` ≤ max_send_sge entries.
    wr.sg_list = unsafe { sges(w.sg_list, n) };
    if wr.flags.contains(SendFlags::INLINE) && !wr.opcode.is_read_or_atomic() {
        lim.check_inline(wr.opcode, uroce::mem::sge_total(&wr.sg_list))?;
        // Inline data is copied now, so the buffers may be reused at once.
        // SAFETY: verbs' inline contract: the SGE addresses are readable
        // memory of the caller for the duration of the call.
        wr.inline = Some(unsafe { gather(&wr.sg_list) });
    }
    Ok(wr)
}

/// Everything of a C send WR but its SGEs and inline data: the one
/// conversion behind `ibv_post_send` and the `ibv_wr_*` builders
/// (`qp_ex.rs`, which passes a WR without SGEs). None for an opcode uroce
/// does not execute or a BIND_MW without a window.
pub(crate) unsafe fn send_wr_head(w: &ibv_send_wr, qp_type: ibv_qp_type) -> Option<SendWr> {
    let ud = qp_type == ibv_qp_type_IBV_QPT_UD;
    let opcode = WrOpcode::from_raw(w.opcode)?;
    let mut wr = SendWr::new(w.wr_id, opcode);
    wr.flags = SendFlags::from_bits_retain(w.send_flags);
    // SAFETY: reading plain integers out of the unions is always defined.
    unsafe {
        wr.imm_data = match opcode {
            WrOpcode::SendInv | WrOpcode::LocalInv => w.__bindgen_anon_1.invalidate_rkey,
            _ => u32::from_be(w.__bindgen_anon_1.imm_data),
        };
        if ud {
            // UD: the union holds the address handle and remote QP.
            wr.ud = ud_dest(w.wr.ud.ah, w.wr.ud.remote_qpn, w.wr.ud.remote_qkey);
        } else if opcode.is_atomic() {
            wr.remote_addr = w.wr.atomic.remote_addr;
            wr.rkey = w.wr.atomic.rkey;
            wr.compare_add = w.wr.atomic.compare_add;
            wr.swap = w.wr.atomic.swap;
        } else {
            wr.remote_addr = w.wr.rdma.remote_addr;
            wr.rkey = w.wr.rdma.rkey;
        }
        if qp_type == ibv_qp_type_IBV_QPT_XRC_SEND {
            wr.remote_srqn = w.qp_type.xrc.remote_srqn;
        }
    }
    // SAFETY: the caller's work request, as read above.
    if opcode == WrOpcode::BindMw && !unsafe { crate::mw::bind_wr(w, &mut wr) } {
        return None;
    }
    Some(wr)
}

/// A UD destination from an address handle of `ibv_create_ah` (None for NULL).
pub(crate) unsafe fn ud_dest(ah: *mut ibv_ah, remote_qpn: u32, remote_qkey: u32) -> Option<UdDest> {
    // SAFETY: an AH from ibv_create_ah, or NULL.
    let ah = unsafe { (ah as *const crate::handles::UAh).as_ref() }?;
    Some(UdDest { av: ah.av, remote_qpn, remote_qkey })
}

/// The bytes the SGEs address, concatenated (inline data).
pub(crate) unsafe fn gather(list: &[Sge]) -> Vec<u8> {
    let mut data = Vec::with_capacity(list.iter().map(|s| s.length as usize).sum());
    for s in list {
        if s.length > 0 {
            // SAFETY: the caller's contract: readable memory of the application.
            data.extend_from_slice(unsafe { std::slice::from_raw_parts(s.addr as *const u8, s.length as usize) });
        }
    }
    data
}

pub unsafe extern "C" fn post_send(qp: *mut ibv_qp, wr: *mut ibv_send_wr, bad: *mut *mut ibv_send_wr) -> c_int {
    if qp.is_null() {
        return libc::EINVAL;
    }
    // SAFETY: a QP from ibv_create_qp.
    let q = unsafe { &*(qp as *const UQp) };
    let Some(inner) = q.inner.as_ref() else { return libc::EINVAL };
    let qp_type = q.qp.qp_base.qp_type;
    // The WR `next` last handed out (or refused): the one a failure names.
    let (mut cur, mut last) = (wr, wr);
    let r = inner.post_send_with(|i, lim| {
        if cur.is_null() {
            return None;
        }
        last = cur;
        // SAFETY: the caller's linked list.
        let w = unsafe { &*cur };
        cur = w.next;
        // SAFETY: the caller's work request, checked before it is read further.
        Some(unsafe { send_wr(w, qp_type, i, lim) })
    });
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

pub unsafe extern "C" fn post_recv(qp: *mut ibv_qp, wr: *mut ibv_recv_wr, bad: *mut *mut ibv_recv_wr) -> c_int {
    if qp.is_null() {
        return libc::EINVAL;
    }
    // SAFETY: a QP from ibv_create_qp.
    let q = unsafe { &*(qp as *const UQp) };
    let Some(inner) = q.inner.as_ref() else { return libc::EINVAL };
    let (mut cur, mut last) = (wr, wr);
    // SAFETY: the caller's linked list and SGE arrays.
    let r = inner.post_recv_with(|i, lim| unsafe { next_recv_wr(&mut cur, &mut last, i, lim) });
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

/// The next receive WR of a list at `*cur` (None at its end), checked
/// against the queue's limits before its SGE array is read; `*last` names
/// it (for `bad_wr`). Shared by `ibv_post_recv` and `ibv_post_srq_recv`.
pub(crate) unsafe fn next_recv_wr(
    cur: &mut *mut ibv_recv_wr,
    last: &mut *mut ibv_recv_wr,
    index: usize,
    lim: &QueueLimits,
) -> Option<uroce::ib::Result<RecvWr>> {
    if cur.is_null() {
        return None;
    }
    *last = *cur;
    // SAFETY: the caller's linked list.
    let w = unsafe { &**cur };
    *cur = w.next;
    let checked = lim.check_room(index).and_then(|()| lim.check_num_sge(i64::from(w.num_sge)));
    // SAFETY: `n` ≤ max_sge SGEs at `sg_list`.
    Some(checked.map(|n| RecvWr { wr_id: w.wr_id, sg_list: unsafe { sges(w.sg_list, n) } }))
}

pub(crate) fn to_c(wc: &Wc, out: &mut ibv_wc) {
    out.wr_id = wc.wr_id;
    out.status = wc.status.to_raw();
    out.opcode = wc.opcode.to_raw();
    out.vendor_err = wc.vendor_err;
    out.byte_len = wc.byte_len;
    out.__bindgen_anon_1.imm_data =
        if wc.wc_flags.contains(uroce::ib::WcFlags::WITH_INV) { wc.imm_data } else { wc.imm_data.to_be() };
    out.qp_num = wc.qp_num;
    out.src_qp = wc.src_qp;
    out.wc_flags = wc.wc_flags.bits();
    out.pkey_index = wc.pkey_index;
    out.slid = wc.slid;
    out.sl = wc.sl;
    out.dlid_path_bits = wc.dlid_path_bits;
}

pub unsafe extern "C" fn poll_cq(cq: *mut ibv_cq, n: c_int, wc: *mut ibv_wc) -> c_int {
    if cq.is_null() || n < 0 || (wc.is_null() && n > 0) {
        return -libc::EINVAL;
    }
    // SAFETY: a CQ from ibv_create_cq.
    let c = unsafe { &*(cq as *const UCq) };
    let ring = c.inner.as_ref().unwrap();
    let mut got = 0;
    while got < n {
        // The CQ lost a completion (IBV_EVENT_CQ_ERR was raised): once what
        // it stored is taken, polls fail (docs/reliability.md).
        match ring.poll_one_or_overrun() {
            Ok(Some(w)) => {
                // SAFETY: the caller's array of `n` completions.
                to_c(&w, unsafe { &mut *wc.add(got as usize) });
                got += 1;
            }
            Ok(None) => break,
            Err(_) if got == 0 => return -libc::EIO,
            Err(_) => break,
        }
    }
    got
}

pub unsafe extern "C" fn req_notify_cq(cq: *mut ibv_cq, solicited_only: c_int) -> c_int {
    if cq.is_null() {
        return libc::EINVAL;
    }
    // SAFETY: a CQ from ibv_create_cq.
    let c = unsafe { &*(cq as *const UCq) };
    match c.inner.as_ref().unwrap().req_notify(solicited_only != 0) {
        Ok(()) => 0,
        Err(e) => e.errno.0,
    }
}
