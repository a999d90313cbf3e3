//! Memory windows, type 1 and type 2B: a remote-access grant over part of a
//! memory region, with its own key. Type 1 windows belong to a PD and are
//! bound and unbound (zero-length bind) by `ibv_bind_mw`; type 2B windows are
//! bound through a QP's send queue to that QP, and invalidated by LOCAL_INV,
//! SEND_WITH_INV or deallocation. Window keys use the upper half of the key
//! index space, so they never collide with region keys.
//!
//! Every rule of shared/spec/memory.md §4 is checked here: at bind
//! ([`Memory::bind_mw`](super::Memory::bind_mw)) and at each remote access (`Memory::resolve_remote`).

use super::{AccessError, MemoryRegion, Span};
use crate::ib::Access;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};

/// First key index of the window range.
pub const MW_INDEX_BASE: u32 = 0x80_0000;

/// `enum ibv_mw_type`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MwType {
    /// `IBV_MW_TYPE_1`: belongs to a PD, bound and unbound by `ibv_bind_mw`.
    Type1 = 1,
    /// `IBV_MW_TYPE_2` (2B): bound to one QP by a BIND_MW work request,
    /// invalidated by LOCAL_INV or SEND_WITH_INV.
    Type2 = 2,
}

#[derive(Debug)]
pub(crate) struct Binding {
    pub mr: Arc<MemoryRegion>,
    /// Start of the window in the MR's address space.
    pub addr: u64,
    pub len: u64,
    pub access: Access,
    pub zero_based: bool,
    /// Type 2: the QP it is bound to.
    pub qpn: Option<u32>,
}

#[derive(Debug)]
pub(crate) struct MwState {
    /// The current key (index and tag).
    pub key: u32,
    pub binding: Option<Binding>,
}

/// A memory window.
#[derive(Debug)]
pub struct MemoryWindow {
    /// Handle of the protection domain the window belongs to.
    pub pd: u32,
    /// Type 1 or type 2.
    pub mw_type: MwType,
    pub(crate) state: Mutex<MwState>,
}

impl MemoryWindow {
    /// The current rkey (index and tag).
    pub fn key(&self) -> u32 {
        self.state.lock().unwrap().key
    }

    /// Whether the window is bound to a region.
    pub fn is_bound(&self) -> bool {
        self.state.lock().unwrap().binding.is_some()
    }

    /// Drops the binding (invalidation or deallocation).
    pub(crate) fn unbind(st: &mut MwState) {
        if let Some(b) = st.binding.take() {
            b.mr.windows.fetch_sub(1, Ordering::AcqRel);
        }
    }

    /// Checks a remote access through the window's key.
    pub(crate) fn resolve(
        &self,
        key: u32,
        pd: u32,
        qpn: u32,
        va: u64,
        len: u64,
        need: Access,
    ) -> Result<Span, AccessError> {
        let st = self.state.lock().unwrap();
        if st.key != key {
            return Err(AccessError::BadKey);
        }
        if self.pd != pd {
            return Err(AccessError::WrongPd);
        }
        let b = st.binding.as_ref().ok_or(AccessError::BadKey)?;
        if b.qpn.is_some_and(|q| q != qpn) {
            return Err(AccessError::WrongPd);
        }
        if !b.access.contains(need) {
            return Err(AccessError::Permission);
        }
        let start = if b.zero_based { b.addr.checked_add(va).ok_or(AccessError::Range)? } else { va };
        let end = start.checked_add(len).ok_or(AccessError::Range)?;
        if start < b.addr || end > b.addr + b.len {
            return Err(AccessError::Range);
        }
        b.mr.span(start, len).ok_or(AccessError::Range)
    }
}

/// A bind request (`struct ibv_mw_bind_info` plus the new key).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BindRequest {
    /// The window's key as the WR names it (type 2: the new tag is the low
    /// 8 bits of `new_key`).
    pub mw_key: u32,
    /// The key the window takes once bound: type 1 takes it whole (same
    /// index), type 2 only its low 8 bits.
    pub new_key: u32,
    /// The MR's lkey; ignored for a zero-length (unbind) type-1 bind.
    pub mr_key: u32,
    /// Start of the window, an address in the MR's address space.
    pub addr: u64,
    /// Length of the window in bytes; 0 unbinds a type-1 window.
    pub len: u64,
    /// The remote rights the window grants, plus `ZERO_BASED` (type 2 only).
    pub access: Access,
}

/// Why a bind failed: it completes with IBV_WC_MW_BIND_ERR.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("memory window bind refused: {0}")]
pub struct BindError(pub &'static str);

/// `ibv_inc_rkey`: same index, next tag.
pub fn inc_rkey(k: u32) -> u32 {
    (k & !0xff) | (k.wrapping_add(1) & 0xff)
}
