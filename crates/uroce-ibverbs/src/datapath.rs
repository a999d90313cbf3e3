//! The inline fast paths of verbs.h, reached through the context's ops table:
//! post_send, post_recv, poll_cq, req_notify_cq.

use crate::ffi::*;
use crate::objects::{UCq, UQp};
use std::ffi::c_int;
use uroce::ib::{SendFlags, Sge, Wc};
use uroce::verbs::{RecvWr, SendWr, SgList, UdDest, WrOpcode};

pub(crate) unsafe fn sges(list: *const ibv_sge, n: c_int) -> SgList {
    if list.is_null() || n <= 0 {
        return SgList::new();
    }
    // SAFETY: the caller's array of `n` SGEs.
    unsafe { std::slice::from_raw_parts(list, n as usize) }
        .iter()
        .map(|s| Sge { addr: s.addr, length: s.length, lkey: s.lkey })
        .collect()
}

/// Converts one C send WR for a QP of type `qp_type`; None for an opcode
/// uroce does not execute.
unsafe fn send_wr(w: &ibv_send_wr, qp_type: ibv_qp_type) -> Option<SendWr> {
    // SAFETY: the caller's work request.
    let mut wr = unsafe { send_wr_head(w, qp_type) }?;
    // SAFETY: the caller's SGE array.
    wr.sg_list = unsafe { sges(w.sg_list, w.num_sge) };
    if wr.flags.contains(SendFlags::INLINE) && !wr.opcode.is_read_or_atomic() {
        // Inline data is copied now, so the buffers may be reused at once.
        // SAFETY: verbs' inline contract: the SGE addresses are readable
        // memory of the caller for the duration of the call.
        wr.inline = Some(unsafe { gather(&wr.sg_list) });
    }
    Some(wr)
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
    let ah = unsafe { (ah as *const crate::objects::UAh).as_ref() }?;
    Some(UdDest { av: ah.inner.av, remote_qpn, remote_qkey })
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
    let qp_type = q.qp.qp_base.qp_type;
    let mut ptrs = Vec::new();
    let mut wrs = Vec::new();
    let mut cur = wr;
    while !cur.is_null() {
        // SAFETY: the caller's linked list.
        let w = unsafe { &*cur };
        match unsafe { send_wr(w, qp_type) } {
            Some(x) => wrs.push(x),
            None => break,
        }
        ptrs.push(cur);
        cur = w.next;
    }
    let unconverted = if cur.is_null() { None } else { Some(cur) };
    let r = q.inner.as_ref().unwrap().post_send_list(wrs);
    let (fail_at, rc) = match r {
        Ok(()) => match unconverted {
            None => return 0,
            Some(p) => (p, libc::EINVAL),
        },
        Err((i, e)) => (ptrs[i], e.errno.0),
    };
    if !bad.is_null() {
        // SAFETY: the caller's out parameter.
        unsafe { *bad = fail_at };
    }
    rc
}

pub unsafe extern "C" fn post_recv(qp: *mut ibv_qp, wr: *mut ibv_recv_wr, bad: *mut *mut ibv_recv_wr) -> c_int {
    if qp.is_null() {
        return libc::EINVAL;
    }
    // SAFETY: a QP from ibv_create_qp.
    let q = unsafe { &*(qp as *const UQp) };
    let mut ptrs = Vec::new();
    let mut wrs = Vec::new();
    let mut cur = wr;
    while !cur.is_null() {
        // SAFETY: the caller's linked list.
        let w = unsafe { &*cur };
        wrs.push(RecvWr { wr_id: w.wr_id, sg_list: unsafe { sges(w.sg_list, w.num_sge) } });
        ptrs.push(cur);
        cur = w.next;
    }
    match q.inner.as_ref().unwrap().post_recv_list(wrs) {
        Ok(()) => 0,
        Err((i, e)) => {
            if !bad.is_null() {
                // SAFETY: the caller's out parameter.
                unsafe { *bad = ptrs[i] };
            }
            e.errno.0
        }
    }
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
        let Some(w) = ring.poll_one() else { break };
        // SAFETY: the caller's array of `n` completions.
        to_c(&w, unsafe { &mut *wc.add(got as usize) });
        got += 1;
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
