//! Memory regions: a key's protection domain, range, rights and backing.

use super::indirect::IndirectKey;
use super::odp::OdpRegion;
use super::own::Owned;
use super::peer::PeerMapping;
use crate::ib::Access;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

/// Where a region's bytes live.
pub enum Backing {
    /// Pinned memory of this process at `addr` (the host address of `iova`):
    /// uroce's own mapping of the registered pages when `pages` is set
    /// (see `own`), else the application's address.
    /// `owner`, when set, keeps the buffer alive as long as the region.
    Host { addr: usize, owner: Option<Arc<dyn std::any::Any + Send + Sync>>, pages: Option<Arc<Owned>> },
    /// On-demand paging: memory of this process at `addr`, neither pinned nor
    /// necessarily mapped (implicit ODP: `addr = iova = 0`, the whole space).
    Odp { addr: usize, odp: Arc<OdpRegion> },
    /// Memory owned by a peer-memory client, reached through it.
    Peer(Arc<PeerMapping>),
    /// An indirect key: a layout over other keys, set by UMR or re-registration.
    Indirect(IndirectKey),
}

impl std::fmt::Debug for Backing {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Backing::Host { addr, owner, pages } => f
                .debug_struct("Host")
                .field("addr", &format_args!("{addr:#x}"))
                .field("owned", &owner.is_some())
                .field("pages", pages)
                .finish(),
            Backing::Odp { addr, odp } => f
                .debug_struct("Odp")
                .field("addr", &format_args!("{addr:#x}"))
                .field("implicit", &odp.implicit)
                .finish(),
            Backing::Peer(p) => f.debug_tuple("Peer").field(&p.client_name()).finish(),
            Backing::Indirect(k) => k.fmt(f),
        }
    }
}

/// A registered memory region. `key` serves as both lkey and rkey.
#[derive(Debug)]
pub struct MemoryRegion {
    pub pd: u32,
    pub key: u32,
    pub iova: u64,
    pub length: u64,
    pub access: Access,
    pub backing: Backing,
    /// Spans alive: transfers in progress. Deregistration waits for zero.
    pub(crate) spans: AtomicUsize,
    /// Memory windows bound to this region (deregistration is EBUSY).
    pub(crate) windows: AtomicUsize,
}

impl MemoryRegion {
    pub fn new(pd: u32, key: u32, iova: u64, length: u64, access: Access, backing: Backing) -> MemoryRegion {
        MemoryRegion {
            pd,
            key,
            iova,
            length,
            access,
            backing,
            spans: AtomicUsize::new(0),
            windows: AtomicUsize::new(0),
        }
    }

    /// Number of memory windows bound to the region.
    pub fn bound_windows(&self) -> usize {
        self.windows.load(Ordering::Acquire)
    }

    /// Waits until no transfer uses the region.
    pub(crate) fn wait_unused(&self) {
        let mut spins = 0u32;
        while self.spans.load(Ordering::Acquire) > 0 {
            spins += 1;
            if spins > 64 {
                std::thread::sleep(std::time::Duration::from_micros(50));
            } else {
                std::thread::yield_now();
            }
        }
    }

    /// The ODP state, for ODP regions.
    pub fn odp(&self) -> Option<&Arc<OdpRegion>> {
        match &self.backing {
            Backing::Odp { odp, .. } => Some(odp),
            _ => None,
        }
    }
}
