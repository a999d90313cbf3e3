//! Seed 003's non-contiguous memory registration verbs ("verbs: Introduce
//! non-contiguous memory registration"): `ibv_rereg_mr_interleaved` and
//! `ibv_rereg_mr_sg` give an existing `ibv_mr` a compact layout description
//! in place of its translation (declared in include/uroce.h, documented in
//! include/man/). The MR becomes a zero-based indirect key of the core
//! (`uroce::mem::indirect`): its new lkey/rkey serve SEND, RECV, RDMA
//! WRITE/READ and atomics at offsets `0..mr->length`.

use crate::errno::ret;
use crate::ffi::*;
use crate::handles::UMr;
use std::ffi::{c_int, c_uint};
use uroce::ib::{Access, Sge};
use uroce::verbs::{InterleavedEntry, Layout};

/// `struct ibv_mr_interleaved` of uroce.h: one strided entry.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct IbvMrInterleaved {
    pub addr: u64,
    pub bytes_count: u64,
    pub stride: u64,
    pub lkey: u32,
}

/// Most entries of one layout (the indirect key's slots).
const MAX_ENTRIES: c_uint = 4096;

fn apply(mr: *mut ibv_mr, layout: Layout) -> c_int {
    // SAFETY: an MR from ibv_reg_mr (ibv_mr is the first member of UMr).
    let m = unsafe { &mut *(mr as *mut UMr) };
    if m.dm.is_some() {
        return ret(libc::EOPNOTSUPP);
    }
    let Some(inner) = m.inner.as_mut() else { return ret(libc::EINVAL) };
    if let Err(e) = inner.rereg_layout(layout) {
        return ret(e.errno.0);
    }
    m.mr.addr = std::ptr::null_mut();
    m.mr.length = inner.len();
    m.mr.lkey = inner.lkey();
    m.mr.rkey = inner.rkey();
    0
}

/// Refuses unknown or non-layout access bits before anything is read.
fn layout_access(access: c_int) -> Option<Access> {
    let allowed = Access::LOCAL_WRITE | Access::REMOTE_WRITE | Access::REMOTE_READ | Access::REMOTE_ATOMIC;
    let a = Access::from_bits(access as u32)?;
    allowed.contains(a).then_some(a)
}

#[no_mangle]
pub unsafe extern "C" fn ibv_rereg_mr_sg(
    mr: *mut ibv_mr,
    access: c_int,
    num_sge: c_uint,
    sg_list: *const ibv_sge,
) -> c_int {
    if mr.is_null() || sg_list.is_null() || num_sge == 0 {
        return ret(libc::EINVAL);
    }
    if num_sge > MAX_ENTRIES {
        return ret(libc::ENOMEM);
    }
    let Some(access) = layout_access(access) else { return ret(libc::EINVAL) };
    // SAFETY: the caller's array of `num_sge` SGEs.
    let sges: Vec<Sge> = unsafe { std::slice::from_raw_parts(sg_list, num_sge as usize) }
        .iter()
        .map(|s| Sge { addr: s.addr, length: s.length, lkey: s.lkey })
        .collect();
    apply(mr, Layout::list(access, &sges))
}

#[no_mangle]
pub unsafe extern "C" fn ibv_rereg_mr_interleaved(
    mr: *mut ibv_mr,
    access: c_int,
    repeat_count: u32,
    num_entries: c_uint,
    entries: *const IbvMrInterleaved,
) -> c_int {
    if mr.is_null() || entries.is_null() || num_entries == 0 || repeat_count == 0 {
        return ret(libc::EINVAL);
    }
    if num_entries >= MAX_ENTRIES {
        return ret(libc::ENOMEM);
    }
    let Some(access) = layout_access(access) else { return ret(libc::EINVAL) };
    // SAFETY: the caller's array of `num_entries` entries.
    let raw = unsafe { std::slice::from_raw_parts(entries, num_entries as usize) };
    let mut v = Vec::with_capacity(raw.len());
    for e in raw {
        let (Ok(bytes_count), Some(Ok(bytes_skip))) =
            (u32::try_from(e.bytes_count), e.stride.checked_sub(e.bytes_count).map(u32::try_from))
        else {
            // A stride shorter than the cell, or either beyond 32 bits.
            return ret(libc::EINVAL);
        };
        v.push(InterleavedEntry { addr: e.addr, bytes_count, bytes_skip, lkey: e.lkey });
    }
    apply(mr, Layout::interleaved(access, repeat_count, &v))
}
