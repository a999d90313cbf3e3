//! Protection domains (`ibv_pd`) and address handles (`ibv_ah`).

use super::context::Context;
use crate::ib::{Errno, Error, Result};
use crate::proto::wr::AddressVector;
use std::sync::Arc;

pub(crate) struct PdInner {
    pub ctx: Context,
    pub handle: u32,
}

/// A protection domain. MRs, QPs, SRQs and AHs created from it keep it
/// alive; [`ProtectionDomain::dealloc`] reports EBUSY while they exist.
#[derive(Clone)]
pub struct ProtectionDomain {
    pub(crate) inner: Arc<PdInner>,
}

impl Context {
    /// A new protection domain (`ibv_alloc_pd`).
    pub fn alloc_pd(&self) -> Result<ProtectionDomain> {
        ProtectionDomain::new(self.clone())
    }
}

impl ProtectionDomain {
    pub(crate) fn new(ctx: Context) -> Result<ProtectionDomain> {
        let handle = ctx.dev.next_handle();
        Ok(ProtectionDomain { inner: Arc::new(PdInner { ctx, handle }) })
    }

    /// The device-wide handle of the PD.
    pub fn handle(&self) -> u32 {
        self.inner.handle
    }

    /// The context the PD was allocated on.
    pub fn context(&self) -> &Context {
        &self.inner.ctx
    }

    /// `ibv_advise_mr`: prefetches ODP pages named by `sges` (see
    /// `mem::Memory::advise` for the errors). `flush` makes it
    /// synchronous and reports faults.
    pub fn advise_mr(&self, advice: crate::mem::Advice, flush: bool, sges: &[crate::ib::Sge]) -> Result<()> {
        self.inner.ctx.dev.mem.advise(self.inner.handle, advice, flush, sges)
    }

    /// A free indirect key of `max_entries` slots (`mlx5dv_create_mkey`).
    pub fn create_indirect_key(&self, max_entries: u32) -> Result<IndirectKey> {
        let mr = self.inner.ctx.dev.mem.create_indirect(self.inner.handle, max_entries)?;
        let max = match &mr.backing {
            crate::mem::Backing::Indirect(k) => k.max_entries,
            _ => unreachable!(),
        };
        Ok(IndirectKey { pd: self.inner.clone(), key: mr.key, max_entries: max })
    }

    /// An address handle (`ibv_create_ah`). `av` must be global with a
    /// destination GID and `port_num` at most 1 (EINVAL), and `sgid_index`
    /// must name a populated GID entry (ENODATA for an empty one, EINVAL
    /// past the table).
    pub fn create_ah(&self, av: AddressVector) -> Result<AddressHandle> {
        if !av.is_global || av.dgid.is_zero() {
            return Err(Error::inval("create_ah: RoCE needs a GRH with a destination GID"));
        }
        let populated = self.context().dev.rt.config().gids.len();
        if let Some(e) = crate::ib::check_sgid_index(av.sgid_index.into(), populated, "create_ah") {
            return Err(e);
        }
        if av.port_num > 1 {
            return Err(Error::inval("create_ah: port_num must be 1"));
        }
        Ok(AddressHandle { av, _pd: self.inner.clone() })
    }

    /// How many handles hold the PD: its clones (this one included) and the
    /// objects created from it. [`dealloc`](Self::dealloc) needs 1; a caller
    /// that keeps several clones as equal owners (the C library's imported
    /// PDs) compares it with the number of clones it holds.
    pub fn ref_count(&self) -> usize {
        Arc::strong_count(&self.inner)
    }

    /// Deallocates the PD, or fails with EBUSY while objects use it.
    pub fn dealloc(self) -> std::result::Result<(), (Self, Error)> {
        if Arc::strong_count(&self.inner) > 1 {
            return Err((self, Error::new(Errno::EBUSY, "dealloc_pd: PD still has resources")));
        }
        Ok(())
    }
}

impl std::fmt::Debug for ProtectionDomain {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ProtectionDomain").field("handle", &self.inner.handle).finish()
    }
}

/// An address handle for UD sends.
#[derive(Clone)]
pub struct AddressHandle {
    /// The attributes it was created with.
    pub av: AddressVector,
    _pd: Arc<PdInner>,
}

impl std::fmt::Debug for AddressHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AddressHandle").field("av", &self.av).finish()
    }
}

/// An indirect key: one lkey/rkey over a layout of other keys (see
/// [`crate::mem::indirect`](crate::mem::Layout)). Dropping it destroys it.
pub struct IndirectKey {
    pd: Arc<PdInner>,
    key: u32,
    max_entries: u32,
}

impl IndirectKey {
    /// The key as an lkey, for SGEs (the same value as the rkey).
    pub fn lkey(&self) -> u32 {
        self.key
    }

    /// The key as an rkey, for peers' RDMA and atomic operations.
    pub fn rkey(&self) -> u32 {
        self.key
    }

    /// Slots, rounded up to a multiple of 4.
    pub fn max_entries(&self) -> u32 {
        self.max_entries
    }

    /// Verbs-style re-registration: sets (or replaces) the layout now.
    pub fn set_layout(&self, layout: crate::mem::Layout) -> Result<()> {
        self.pd.ctx.dev.mem.set_layout(self.key, self.pd.handle, Some(layout))
    }

    /// Makes the key free (invalid) again.
    pub fn clear_layout(&self) -> Result<()> {
        self.pd.ctx.dev.mem.set_layout(self.key, self.pd.handle, None)
    }

    /// Length of the current layout's address space (0 while free).
    pub fn len(&self) -> u64 {
        self.layout().map_or(0, |l| l.len())
    }

    /// Whether the address space has no bytes (also while free).
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The current layout, `None` while free.
    pub fn layout(&self) -> Option<Arc<crate::mem::Layout>> {
        match &self.pd.ctx.dev.mem.lookup(self.key)?.backing {
            crate::mem::Backing::Indirect(k) => k.layout(),
            _ => None,
        }
    }
}

impl Drop for IndirectKey {
    fn drop(&mut self) {
        let _ = self.pd.ctx.dev.mem.deregister(self.key);
    }
}

impl std::fmt::Debug for IndirectKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("IndirectKey").field("key", &format_args!("{:#x}", self.key)).finish()
    }
}
