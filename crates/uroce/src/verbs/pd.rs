//! Protection domains (`ibv_pd`) and address handles (`ibv_ah`).

use super::context::Context;
use super::mr::MemoryRegion;
use crate::ib::{Access, Errno, Error, Result};
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

impl ProtectionDomain {
    pub(crate) fn new(ctx: Context) -> Result<ProtectionDomain> {
        let handle = ctx.dev.next_handle();
        Ok(ProtectionDomain { inner: Arc::new(PdInner { ctx, handle }) })
    }

    pub fn handle(&self) -> u32 {
        self.inner.handle
    }

    pub fn context(&self) -> &Context {
        &self.inner.ctx
    }

    /// Registers an owned buffer; the region owns it until dropped.
    pub fn register(&self, buf: Vec<u8>, access: Access) -> Result<MemoryRegion> {
        MemoryRegion::register_owned(self, buf, access)
    }

    /// Registers `len` bytes at `addr`, addressed by the device as `iova`.
    ///
    /// # Safety
    /// The memory must stay valid until the region is dropped.
    pub unsafe fn register_raw(&self, addr: *mut u8, len: usize, iova: u64, access: Access) -> Result<MemoryRegion> {
        // SAFETY: forwarded contract.
        unsafe { MemoryRegion::register_raw(self, addr, len, iova, access) }
    }

    pub fn create_ah(&self, av: AddressVector) -> Result<AddressHandle> {
        if !av.is_global || av.dgid.is_zero() {
            return Err(Error::inval("create_ah: RoCE needs a GRH with a destination GID"));
        }
        if av.sgid_index != 0 {
            return Err(Error::inval("create_ah: sgid_index out of range"));
        }
        if av.port_num > 1 {
            return Err(Error::inval("create_ah: port_num must be 1"));
        }
        Ok(AddressHandle { av, _pd: self.inner.clone() })
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
    pub av: AddressVector,
    _pd: Arc<PdInner>,
}

impl std::fmt::Debug for AddressHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AddressHandle").field("av", &self.av).finish()
    }
}
