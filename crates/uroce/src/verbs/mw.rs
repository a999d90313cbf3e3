//! Memory windows (`ibv_mw`): type 1 bound with [`QueuePair::bind_mw`],
//! type 2B bound with a `WrOpcode::BindMw` work request and invalidated with
//! `WrOpcode::LocalInv` or a peer's SEND_WITH_INV.

use super::mr::MemoryRegion;
use super::pd::{PdInner, ProtectionDomain};
use super::qp::QueuePair;
use crate::ib::{Access, Error, Result, SendFlags};
use crate::mem::{inc_rkey, BindRequest, MwType};
use crate::proto::wr::{SendWr, WrOpcode};
use std::sync::Arc;

/// A memory window (`ibv_mw`), deallocated on drop.
pub struct MemoryWindow {
    pd: Arc<PdInner>,
    mw: Arc<crate::mem::MemoryWindow>,
}

impl ProtectionDomain {
    /// `ibv_alloc_mw`.
    pub fn alloc_mw(&self, mw_type: MwType) -> Result<MemoryWindow> {
        Ok(MemoryWindow { pd: self.inner.clone(), mw: self.inner.ctx.dev.mem.alloc_mw(self.handle(), mw_type) })
    }
}

impl MemoryWindow {
    /// The current rkey.
    pub fn rkey(&self) -> u32 {
        self.mw.key()
    }

    /// Type 1 or type 2.
    pub fn mw_type(&self) -> MwType {
        self.mw.mw_type
    }

    /// Whether the window is bound to a region.
    pub fn is_bound(&self) -> bool {
        self.mw.is_bound()
    }

    /// A BIND_MW work request for a type 2 window: bind `len` bytes at `addr`
    /// of `mr` with `access`, giving the window a key with tag `tag`.
    pub fn bind_wr(&self, wr_id: u64, tag: u8, mr: &MemoryRegion, addr: u64, len: u64, access: Access) -> SendWr {
        let mut wr = SendWr::new(wr_id, WrOpcode::BindMw);
        wr.bind = Some(Box::new(BindRequest {
            mw_key: self.rkey(),
            new_key: (self.rkey() & !0xff) | tag as u32,
            mr_key: mr.lkey(),
            addr,
            len,
            access,
        }));
        wr
    }
}

impl QueuePair {
    /// `ibv_bind_mw` for a type 1 window: posts the bind on this QP's send
    /// queue (it completes there, with `wr_id`) and returns the window's new
    /// rkey, valid once the bind completes. `mr = None` with length 0
    /// unbinds.
    #[allow(clippy::too_many_arguments)] // mirrors ibv_bind_mw's fields
    pub fn bind_mw(
        &self,
        mw: &MemoryWindow,
        wr_id: u64,
        flags: SendFlags,
        mr: Option<&MemoryRegion>,
        addr: u64,
        len: u64,
        access: Access,
    ) -> Result<u32> {
        if mw.mw.mw_type != MwType::Type1 {
            return Err(Error::inval("bind_mw: only type 1 windows are bound with ibv_bind_mw"));
        }
        if mr.is_none() && (addr != 0 || len != 0) {
            return Err(Error::inval("bind_mw: a range needs a memory region"));
        }
        let new_key = inc_rkey(mw.rkey());
        let mut wr = SendWr::new(wr_id, WrOpcode::BindMw);
        wr.flags = flags;
        wr.bind = Some(Box::new(BindRequest {
            mw_key: mw.rkey(),
            new_key,
            mr_key: mr.map_or(0, |m| m.lkey()),
            addr,
            len,
            access,
        }));
        self.post_send(&wr)?;
        Ok(new_key)
    }
}

impl Drop for MemoryWindow {
    fn drop(&mut self) {
        let _ = self.pd.ctx.dev.mem.dealloc_mw(self.mw.key());
    }
}

impl std::fmt::Debug for MemoryWindow {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MemoryWindow").field("rkey", &format_args!("{:#x}", self.rkey())).finish()
    }
}
