//! Registered memory: protection of keys, the kinds of memory behind them,
//! and the one interface through which the transport copies bytes.
//!
//! Every access, local (lkey) or remote (rkey), goes through
//! [`Memory::resolve`] (or [`Memory::resolve_remote`], which adds memory
//! windows). It applies the checks of the IBA and of rxe in one place — the
//! key exists and its 8-bit variant matches, the region is valid, it belongs
//! to the queue pair's protection domain, the access rights cover the
//! operation, the range lies inside the region — and returns a [`Span`]
//! that copies bytes by the path the memory needs: pinned host memory
//! (`mr`; its mapping checked at registration by `maps`, every access
//! fault-tolerant through `safe`, so that memory the application unmaps or
//! protects later fails the access instead of crashing), on-demand paging ([`odp`]), a peer-memory client ([`peer`]), or
//! the pieces of an indirect key (`indirect`). Nothing reaches registered
//! memory any other way, so every operation works on every kind of key.
//!
//! The transport does not call this module directly: it sees memory through
//! `proto::MemoryAccess`, which `Memory` implements (`proto/memory.rs`).

mod error;
mod indirect;
mod keys;
mod maps;
mod mr;
mod mw;
mod notifier;
mod own;
pub mod odp;
pub mod peer;
mod pin;
mod rangeset;
pub(crate) mod safe;
mod span;
mod stacks;

pub use error::AccessError;
pub use indirect::{IndirectKey, InterleavedEntry, Layout, LayoutKind, MAX_DEPTH};
pub use keys::{os_random_u64, KeyRng, KeyTable};
pub use mr::{Backing, MemoryRegion};
pub use mw::{inc_rkey, BindError, BindRequest, MemoryWindow, MwType, MW_INDEX_BASE};
pub use odp::{Advice, OdpCounters, OdpStats};
pub use pin::PinTable;
pub use span::{HostBytes, Span};

use crate::ib::{Access, Errno, Error, Result, Sge};
use std::sync::{Arc, Mutex, RwLock};

/// What an access wants to do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Want {
    /// Local read (always allowed by a valid lkey).
    LocalRead,
    LocalWrite,
    RemoteRead,
    RemoteWrite,
    RemoteAtomic,
}

impl Want {
    fn required(self) -> Access {
        match self {
            Want::LocalRead => Access::empty(),
            Want::LocalWrite => Access::LOCAL_WRITE,
            Want::RemoteRead => Access::REMOTE_READ,
            Want::RemoteWrite => Access::REMOTE_WRITE,
            Want::RemoteAtomic => Access::REMOTE_ATOMIC,
        }
    }
}

/// `length` of an implicit ODP registration (`SIZE_MAX`).
pub const IMPLICIT_ODP_LEN: u64 = u64::MAX;

/// What `uroce stat` shows of a registered region.
#[derive(Debug, Clone)]
pub struct RegionSummary {
    pub key: u32,
    pub pd: u32,
    pub length: u64,
    /// ODP counters, for on-demand paged regions.
    pub odp: Option<OdpStats>,
}

/// The memory of one device: its keys, pinned pages and ODP counters.
#[derive(Debug, Default)]
pub struct Memory {
    keys: RwLock<KeyTable>,
    pins: Mutex<PinTable>,
    windows: RwLock<Vec<Option<Arc<MemoryWindow>>>>,
    odp: Arc<OdpCounters>,
}

impl Memory {
    /// A device's memory; key variants are random (see [`keys`]).
    pub fn new() -> Arc<Memory> {
        Arc::new(Memory::default())
    }

    #[cfg(feature = "unstable")]
    /// A device's memory whose key variants come from `seed`, for
    /// deterministic simulations.
    pub fn with_key_seed(seed: u64) -> Arc<Memory> {
        Arc::new(Memory { keys: RwLock::new(KeyTable::with_seed(seed)), ..Memory::default() })
    }

    /// Registers `len` bytes at `addr`, addressed by the device as
    /// `iova..iova+len`: `ibv_reg_mr`. The memory is, in this order,
    /// on-demand paged (`Access::ON_DEMAND`; `addr = 0, len = SIZE_MAX,
    /// iova = 0` is implicit ODP over the whole address space), owned by a
    /// peer-memory client that claims it, or pinned host memory.
    ///
    /// # Safety
    /// For pinned host memory, `addr..addr+len` must stay valid memory of
    /// this process until the region is deregistered (the verbs contract of
    /// `ibv_reg_mr`). ODP and peer memory need no such promise.
    pub unsafe fn register(
        &self,
        pd: u32,
        addr: usize,
        len: u64,
        iova: u64,
        access: Access,
        owner: Option<Box<dyn std::any::Any + Send + Sync>>,
    ) -> Result<Arc<MemoryRegion>> {
        check_access_flags(access)?;
        // Pinned and ODP memory are reached through the fault-tolerant
        // routines of `safe`, which need their fault handler.
        safe::install();
        if access.contains(Access::ON_DEMAND) {
            return self.register_odp(pd, addr, len, iova, access);
        }
        if len == 0 && addr == 0 {
            return Err(Error::inval("reg_mr: NULL address"));
        }
        if (addr as u64).checked_add(len).is_none() || iova.checked_add(len).is_none() {
            return Err(Error::inval("reg_mr: range wraps the address space"));
        }
        if len > 0 && peer::any_client() {
            if let Some(mapping) = peer::acquire(addr as u64, len, access.contains(Access::LOCAL_WRITE))? {
                let backing = Backing::Peer(mapping);
                return Ok(self
                    .keys
                    .write()
                    .unwrap()
                    .insert(|key| MemoryRegion::new(pd, key, iova, len, access, backing)));
            }
        }
        let (host, pages) = self.pin(addr, len, access)?;
        let mr = self.keys.write().unwrap().insert(|key| {
            MemoryRegion::new(pd, key, iova, len, access, Backing::Host { addr: host, owner: owner.map(Arc::from), pages })
        });
        Ok(mr)
    }

    /// Checks and pins `addr..addr+len` for a pinned registration: uroce's
    /// own mapping of its pages where `own` can make one, else the
    /// application's. Returns the host address of `addr` to access.
    fn pin(&self, addr: usize, len: u64, access: Access) -> Result<(usize, Option<Arc<own::Owned>>)> {
        if len == 0 {
            return Ok((addr, None));
        }
        maps::check(addr, len, writable(access))?;
        // Memory uroce cannot own, or a move that failed (out of mappings:
        // `vm.max_map_count`), is reached by address as before (the pin
        // below reports memory that is not there).
        let pages = match own::take(addr, len) {
            Ok(p) => p.map(Arc::new),
            Err(e) => {
                tracing::warn!(addr, len, error = %e.what, "reg_mr: pages not owned; the region follows the address space");
                None
            }
        };
        if let Some(o) = pages {
            let host = o.host(addr);
            match self.pins.lock().unwrap().pin(host as u64, len) {
                Ok(()) => return Ok((host, Some(o))),
                // uroce's own mapping could not be locked (the process's map
                // count, a memlock limit): the pages are given back (`o`
                // dropped) and the region follows the address space.
                Err(e) => tracing::warn!(addr, len, error = %e.what, "reg_mr: owned pages not lockable; not owned"),
            }
        }
        self.pins.lock().unwrap().pin(addr as u64, len)?;
        Ok((addr, None))
    }

    /// The old name of [`Memory::register`].
    ///
    /// # Safety
    /// As [`Memory::register`].
    pub unsafe fn register_host(
        &self,
        pd: u32,
        addr: usize,
        len: u64,
        iova: u64,
        access: Access,
        owner: Option<Box<dyn std::any::Any + Send + Sync>>,
    ) -> Result<Arc<MemoryRegion>> {
        // SAFETY: the caller's promise, as `register` asks it.
        unsafe { self.register(pd, addr, len, iova, access, owner) }
    }

    fn register_odp(&self, pd: u32, addr: usize, len: u64, iova: u64, access: Access) -> Result<Arc<MemoryRegion>> {
        let implicit = addr == 0 && len == IMPLICIT_ODP_LEN;
        if implicit {
            if iova != 0 {
                return Err(Error::inval("reg_mr: implicit ODP needs iova 0"));
            }
            if access.contains(Access::ZERO_BASED) {
                return Err(Error::inval("reg_mr: implicit ODP cannot be zero based"));
            }
        } else {
            if addr == 0 {
                return Err(Error::inval("reg_mr: NULL address (implicit ODP needs length SIZE_MAX)"));
            }
            if (addr as u64).checked_add(len).is_none() || iova.checked_add(len).is_none() {
                return Err(Error::inval("reg_mr: range wraps the address space"));
            }
        }
        let range = (!implicit).then_some((addr as u64, addr as u64 + len));
        let odp = odp::OdpRegion::new(range, self.odp.clone());
        let backing = Backing::Odp { addr, odp };
        Ok(self.keys.write().unwrap().insert(|key| MemoryRegion::new(pd, key, iova, len, access, backing)))
    }

    /// Creates a free (invalid) indirect key of `max_entries` slots
    /// (`mlx5dv_create_mkey`). Its key serves as lkey and rkey.
    pub fn create_indirect(&self, pd: u32, max_entries: u32) -> Result<Arc<MemoryRegion>> {
        if max_entries == 0 || max_entries > MAX_INDIRECT_ENTRIES {
            return Err(Error::inval("create_mkey: max_entries must be 1..=4096"));
        }
        let k = IndirectKey::new(max_entries);
        Ok(self
            .keys
            .write()
            .unwrap()
            .insert(|key| MemoryRegion::new(pd, key, 0, 0, Access::empty(), Backing::Indirect(k))))
    }

    /// Verbs-style (re)registration of an indirect key's layout: validates
    /// and replaces the layout at once, whatever the key's state.
    pub fn set_layout(&self, key: u32, pd: u32, layout: Option<Layout>) -> Result<()> {
        let mr = self.lookup(key).ok_or_else(|| Error::inval("set_layout: unknown key"))?;
        let Backing::Indirect(k) = &mr.backing else {
            return Err(Error::inval("set_layout: not an indirect key"));
        };
        if mr.pd != pd {
            return Err(Error::new(Errno::EPERM, "set_layout: key of another protection domain"));
        }
        if let Some(l) = &layout {
            l.validate_wide(k.max_entries)?;
            self.check_no_cycle(key, l)?;
        }
        k.set(layout);
        Ok(())
    }

    /// Seed 003's `ibv_rereg_mr_interleaved` / `ibv_rereg_mr_sg`: gives
    /// region `key` a non-contiguous layout over other keys (of its PD), in
    /// place of its translation. The region becomes an indirect key of
    /// [`MAX_INDIRECT_ENTRIES`] slots with a zero-based address space
    /// `0..layout.len()`, under a new key variant (as a new translation
    /// gets): work requests still naming the old key fail. Its memory, if
    /// pinned, is released once no transfer uses it. An indirect region may
    /// be given a new layout again the same way. Everything is checked
    /// before anything changes: EINVAL for an unknown key or a bad layout
    /// (32-bit strides allowed), ENOMEM beyond the slots, EBUSY with memory
    /// windows bound, EOPNOTSUPP for peer memory.
    pub fn rereg_layout(&self, key: u32, layout: Layout) -> Result<Arc<MemoryRegion>> {
        let old = self.lookup(key).ok_or_else(|| Error::inval("rereg_mr_layout: unknown key"))?;
        if matches!(old.backing, Backing::Peer(_)) {
            return Err(Error::new(Errno::EOPNOTSUPP, "rereg_mr_layout: peer-memory regions cannot be re-registered"));
        }
        if old.bound_windows() > 0 {
            return Err(Error::new(Errno::EBUSY, "rereg_mr_layout: memory windows are bound to the region"));
        }
        layout.validate_wide(MAX_INDIRECT_ENTRIES)?;
        self.check_no_cycle(key, &layout)?;
        let (pd, len) = (old.pd, layout.len());
        drop(old);
        let k = IndirectKey::new(MAX_INDIRECT_ENTRIES);
        k.set(Some(layout));
        let replaced = self
            .keys
            .write()
            .unwrap()
            .replace(key, true, |nk| MemoryRegion::new(pd, nk, 0, len, Access::empty(), Backing::Indirect(k)));
        let (old, new) = replaced.ok_or_else(|| Error::inval("rereg_mr_layout: region went away"))?;
        old.wait_unused();
        self.release(&old);
        Ok(new)
    }

    /// A UMR work request: sets the layout of a free indirect key of `pd`.
    pub fn umr(&self, key: u32, pd: u32, layout: Layout) -> std::result::Result<(), BindError> {
        let mr = self.lookup(key).ok_or(BindError("UMR: no such key"))?;
        let Backing::Indirect(k) = &mr.backing else { return Err(BindError("UMR: not an indirect key")) };
        if mr.pd != pd {
            return Err(BindError("UMR: key of another protection domain"));
        }
        layout.validate(k.max_entries).map_err(|_| BindError("UMR: invalid layout"))?;
        self.check_no_cycle(key, &layout).map_err(|_| BindError("UMR: layout names its own key"))?;
        if !k.set_if_free(layout) {
            return Err(BindError("UMR: key is valid; invalidate it first"));
        }
        Ok(())
    }

    /// Refuses layouts that reach `key` itself through nested indirect keys.
    fn check_no_cycle(&self, key: u32, layout: &Layout) -> Result<()> {
        let mut stack: Vec<(u32, usize)> = layout.keys().into_iter().map(|k| (k, 1)).collect();
        while let Some((k, depth)) = stack.pop() {
            if k == key {
                return Err(Error::inval("indirect key: layout names the key itself"));
            }
            if depth > MAX_DEPTH {
                return Err(Error::inval("indirect key: nested too deep"));
            }
            if let Some(Backing::Indirect(inner)) = self.lookup(k).as_ref().map(|m| &m.backing) {
                if let Some(l) = inner.layout() {
                    stack.extend(l.keys().into_iter().map(|k| (k, depth + 1)));
                }
            }
        }
        Ok(())
    }

    /// Removes a region's key and releases its memory once no transfer still
    /// uses it. EBUSY while memory windows are bound to it.
    pub fn deregister(&self, key: u32) -> Result<()> {
        if self.lookup(key).is_some_and(|m| m.bound_windows() > 0) {
            return Err(Error::new(Errno::EBUSY, "dereg_mr: memory windows are bound to the region"));
        }
        self.deregister_unchecked(key)
    }

    /// Deregisters even with windows bound: they are invalidated first (the
    /// IBA's orphaned windows). For handles dropped in Rust.
    pub fn deregister_force(&self, key: u32) -> Result<()> {
        if self.lookup(key).is_some_and(|m| m.bound_windows() > 0) {
            for mw in self.windows.read().unwrap().iter().flatten() {
                let mut st = mw.state.lock().unwrap();
                if st.binding.as_ref().is_some_and(|b| b.mr.key == key) {
                    MemoryWindow::unbind(&mut st);
                }
            }
        }
        self.deregister_unchecked(key)
    }

    fn deregister_unchecked(&self, key: u32) -> Result<()> {
        let mr = self.keys.write().unwrap().remove(key).ok_or_else(|| Error::inval("dereg_mr: unknown key"))?;
        // A packet being processed may hold a Span on the region: wait for it,
        // so that the caller may free the memory as soon as we return.
        mr.wait_unused();
        self.release(&mr);
        Ok(())
    }

    /// Undoes what registration did to the memory behind a region, before
    /// deregistration returns (other threads may hold the region a little
    /// longer: a piece that was just dropped, a lookup).
    fn release(&self, mr: &MemoryRegion) {
        match &mr.backing {
            Backing::Host { addr, pages, .. } if mr.length > 0 => {
                self.pins.lock().unwrap().unpin(*addr as u64, mr.length);
                if let Some(p) = pages {
                    p.give_back();
                }
            }
            Backing::Peer(p) => p.release(),
            _ => {}
        }
    }

    /// `ibv_rereg_mr`: changes a region's protection domain, access rights
    /// and/or translation. Everything is validated before anything changes.
    /// PD and access changes keep the key (as mlx5 does in place); a new
    /// translation issues a new key variant, so work requests that still
    /// name the old key and buffer fail instead of reaching the new memory.
    /// ODP regions keep their ODP nature (changing it is EOPNOTSUPP); peer
    /// regions cannot be re-registered (EOPNOTSUPP, as MLNX OFED); indirect
    /// keys take [`Memory::set_layout`] instead (EINVAL).
    ///
    /// # Safety
    /// With a new translation of pinned memory, the new range must stay
    /// valid until the region is deregistered or re-registered again.
    pub unsafe fn rereg(&self, key: u32, change: Rereg) -> Result<Arc<MemoryRegion>> {
        let old = self.lookup(key).ok_or_else(|| Error::inval("rereg_mr: unknown key"))?;
        let (access, old_access) = (change.access.unwrap_or(old.access), old.access);
        check_access_flags(access)?;
        let (old_addr, old_owner, old_odp) = match &old.backing {
            Backing::Host { addr, owner, pages } => (*addr, Some((owner.clone(), pages.clone())), None),
            Backing::Odp { addr, odp } => (*addr, None, Some(odp.clone())),
            Backing::Peer(_) => {
                return Err(Error::new(Errno::EOPNOTSUPP, "rereg_mr: peer-memory regions cannot be re-registered"))
            }
            Backing::Indirect(_) => return Err(Error::inval("rereg_mr: indirect keys take a new layout instead")),
        };
        if access.contains(Access::ON_DEMAND) != old_odp.is_some() {
            return Err(Error::new(Errno::EOPNOTSUPP, "rereg_mr: cannot change whether a region is on-demand paged"));
        }
        if old_odp.as_ref().is_some_and(|o| o.implicit) && change.translation.is_some() {
            return Err(Error::new(Errno::EOPNOTSUPP, "rereg_mr: implicit ODP covers the whole address space"));
        }
        let (addr, len, iova) = match &change.translation {
            Some(t) => {
                if t.addr == 0 || t.len == 0 {
                    return Err(Error::inval("rereg_mr: translation needs an address and a length"));
                }
                (t.addr, t.len, t.iova)
            }
            None => (old_addr, old.length, old.iova),
        };
        let pd = change.pd.unwrap_or(old.pd);
        drop(old);
        let new_translation = change.translation.is_some();
        let pinned = old_odp.is_none();
        let (mut host, mut pages) = (addr, None);
        if new_translation && pinned {
            (host, pages) = self.pin(addr, len, access)?;
        } else if pinned && writable(access) && !writable(old_access) && len > 0 {
            // The pages were checked for reading only (as mlx5 refuses a
            // writable access on a umem pinned read-only, with EPERM).
            maps::check(addr, len, true).map_err(|e| Error::new(Errno::EPERM, e.what))?;
        }
        let backing = match (old_odp, change.translation) {
            (Some(_), Some(_)) => Backing::Odp {
                addr,
                odp: odp::OdpRegion::new(Some((addr as u64, addr as u64 + len)), self.odp.clone()),
            },
            (Some(odp), None) => Backing::Odp { addr, odp },
            // The buffer owner is shared with the new region unless the range changes.
            (None, Some(t)) => Backing::Host { addr: host, owner: t.owner.map(Arc::from), pages },
            (None, None) => {
                let (owner, pages) = old_owner.unwrap_or_default();
                Backing::Host { addr, owner, pages }
            }
        };
        let replaced = self
            .keys
            .write()
            .unwrap()
            .replace(key, new_translation, |k| MemoryRegion::new(pd, k, iova, len, access, backing));
        let Some((old, new)) = replaced else {
            if new_translation && pinned {
                self.pins.lock().unwrap().unpin(host as u64, len);
            }
            return Err(Error::inval("rereg_mr: region went away"));
        };
        old.wait_unused();
        if new_translation && pinned && old.length > 0 {
            self.release(&old);
        }
        Ok(new)
    }

    /// The region a key names, if the key (with its variant) is current.
    pub fn lookup(&self, key: u32) -> Option<Arc<MemoryRegion>> {
        self.keys.read().unwrap().lookup(key).cloned()
    }

    /// Checks an access of `len` bytes at `iova` through `key` on behalf of
    /// protection domain `pd`. A zero-length access needs no valid key.
    pub fn resolve(
        &self,
        key: u32,
        pd: u32,
        iova: u64,
        len: u64,
        want: Want,
    ) -> std::result::Result<Span, AccessError> {
        if len == 0 {
            return Ok(Span::empty());
        }
        self.resolve_at_depth(key, pd, iova, len, want, 0)
    }

    fn resolve_at_depth(
        &self,
        key: u32,
        pd: u32,
        iova: u64,
        len: u64,
        want: Want,
        depth: usize,
    ) -> std::result::Result<Span, AccessError> {
        let mr = {
            // The common case, a plain region, is answered under the read
            // lock: one reference-count increment (the span's), no more.
            let keys = self.keys.read().unwrap();
            let mr = keys.lookup(key).ok_or(AccessError::BadKey)?;
            if mr.pd != pd {
                return Err(AccessError::WrongPd);
            }
            if !matches!(mr.backing, Backing::Indirect(_)) {
                if !mr.access.contains(want.required()) {
                    return Err(AccessError::Permission);
                }
                return mr.span(iova, len).ok_or(AccessError::Range);
            }
            mr.clone()
        };
        // (Plain regions were answered above.)
        let Backing::Indirect(k) = &mr.backing else { return Err(AccessError::BadKey) };
        // A free indirect key is an invalid key.
        let layout = k.layout().ok_or(AccessError::BadKey)?;
        if !layout.access.contains(want.required()) {
            return Err(AccessError::Permission);
        }
        if depth >= MAX_DEPTH {
            return Err(AccessError::BadKey);
        }
        // Zero based: `iova` is the offset.
        if iova.checked_add(len).is_none_or(|end| end > layout.len()) {
            return Err(AccessError::Range);
        }
        let mut span = Span::empty();
        if let LayoutKind::Interleaved { entries, .. } = &layout.kind {
            if let [e] = entries.as_slice() {
                self.resolve_column(e, iova, len, pd, want, depth, &mut span)?;
                return Ok(span);
            }
        }
        layout.for_each(iova, len, |lkey, addr, n| {
            span.append(self.resolve_at_depth(lkey, pd, addr, n, want, depth + 1)?);
            Ok(())
        })?;
        Ok(span)
    }

    /// A single-entry interleaved layout (a matrix column): partial cells at
    /// the ends resolve one by one; the full cells between become one
    /// strided piece over the bounding range, checked once, when the entry
    /// names a plain region (nested keys take the cell-by-cell path).
    #[allow(clippy::too_many_arguments)]
    fn resolve_column(
        &self,
        e: &InterleavedEntry,
        off: u64,
        len: u64,
        pd: u32,
        want: Want,
        depth: usize,
        span: &mut Span,
    ) -> std::result::Result<(), AccessError> {
        let (bc, stride) = (e.bytes_count as u64, e.bytes_count as u64 + e.bytes_skip as u64);
        let (mut pos, end) = (off, off + len);
        let cell_at = |pos: u64| e.addr + pos / bc * stride + pos % bc;
        let one = |span: &mut Span, pos: u64, n: u64| -> std::result::Result<(), AccessError> {
            span.append(self.resolve_at_depth(e.lkey, pd, cell_at(pos), n, want, depth + 1)?);
            Ok(())
        };
        if pos % bc != 0 {
            let n = (bc - pos % bc).min(end - pos);
            one(span, pos, n)?;
            pos += n;
        }
        let full = (end - pos) / bc;
        if full > 1 {
            let bounding = (full - 1) * stride + bc;
            let run = self.resolve_at_depth(e.lkey, pd, cell_at(pos), bounding, want, depth + 1)?;
            match run.into_single() {
                Ok(piece) => span.push(piece.into_cells(bc as usize, stride as usize, full as usize)),
                Err(_) => {
                    for c in 0..full {
                        one(span, pos + c * bc, bc)?;
                    }
                }
            }
            pos += full * bc;
        }
        while pos < end {
            let n = bc.min(end - pos);
            one(span, pos, n)?;
            pos += n;
        }
        Ok(())
    }

    /// The one-packet fast path of [`Memory::resolve`] followed by a copy:
    /// when `key` names a plain region of pinned host memory, runs
    /// `copy(host address)` under the key table's read lock, after the same
    /// checks in the same order (key, protection domain, access, bounds),
    /// without building a span. The read lock keeps the region registered
    /// for the copy as a span would (deregistration removes the key under
    /// the write lock), at no reference-count traffic. `None`: not such a
    /// region (window, indirect, ODP or peer memory, or an empty access);
    /// the caller resolves a span instead. `copy` must not block or take
    /// this table's lock (it runs a fault-tolerant memory copy).
    #[inline]
    pub(crate) fn with_host_range<R>(
        &self,
        key: u32,
        pd: u32,
        iova: u64,
        len: u64,
        want: Want,
        copy: impl FnOnce(usize) -> std::result::Result<R, AccessError>,
    ) -> Option<std::result::Result<R, AccessError>> {
        if len == 0 || key >> 8 >= MW_INDEX_BASE {
            return None;
        }
        let keys = self.keys.read().unwrap();
        let Some(mr) = keys.lookup(key) else { return Some(Err(AccessError::BadKey)) };
        if mr.pd != pd {
            return Some(Err(AccessError::WrongPd));
        }
        let Backing::Host { addr, .. } = &mr.backing else { return None };
        if !mr.access.contains(want.required()) {
            return Some(Err(AccessError::Permission));
        }
        // As `MemoryRegion::span`: the range lies inside the region.
        let off = match iova.checked_sub(mr.iova) {
            Some(off) if off.checked_add(len).is_some_and(|end| end <= mr.length) => off,
            _ => return Some(Err(AccessError::Range)),
        };
        Some(copy(addr + off as usize))
    }

    /// Checks a remote write of `data` at `iova` through `key` (region or
    /// window) for QP `qpn` of protection domain `pd`, then copies it:
    /// [`Memory::resolve_remote`] and [`Span::write`] in one call, without
    /// a span for a plain host region (see [`Memory::with_host_range`]).
    /// True if copied; false, with nothing copied, when the copy may block
    /// ([`Span::may_block`]).
    pub fn write_remote(
        &self,
        key: u32,
        pd: u32,
        qpn: u32,
        iova: u64,
        data: &[u8],
    ) -> std::result::Result<bool, AccessError> {
        let fast = self.with_host_range(key, pd, iova, data.len() as u64, Want::RemoteWrite, |host| {
            // SAFETY: `host..host + data.len()` lies inside a registered,
            // pinned region (checked above), which stays registered while
            // the key table's read lock is held. The application may have
            // unmapped or protected it since: the copy is fault-tolerant.
            match unsafe { safe::copy(host as *mut u8, data.as_ptr(), data.len()) } {
                0 => Ok(()),
                _ => Err(AccessError::Fault),
            }
        });
        match fast {
            Some(r) => r.map(|()| true),
            None => unless_blocking(self.resolve_remote(key, pd, qpn, iova, data.len() as u64, Want::RemoteWrite)?, |s| {
                s.write(0, data)
            }),
        }
    }

    /// Checks a local read of `out.len()` bytes at `iova` through `key` for
    /// protection domain `pd`, then copies them into `out`:
    /// [`Memory::resolve`] and [`Span::read`] in one call, without a span
    /// for a plain host region (see [`Memory::with_host_range`]). True if
    /// copied; false, with nothing read, when the copy may block.
    pub fn read_local(
        &self,
        key: u32,
        pd: u32,
        iova: u64,
        out: &mut [u8],
    ) -> std::result::Result<bool, AccessError> {
        let len = out.len();
        let fast = self.with_host_range(key, pd, iova, len as u64, Want::LocalRead, |host| {
            // SAFETY: as in `write_remote`; the destination is an exclusive
            // Rust slice.
            match unsafe { safe::copy(out.as_mut_ptr(), host as *const u8, len) } {
                0 => Ok(()),
                _ => Err(AccessError::Fault),
            }
        });
        match fast {
            Some(r) => r.map(|()| true),
            None => unless_blocking(self.resolve(key, pd, iova, len as u64, Want::LocalRead)?, |s| s.read(0, out)),
        }
    }

    /// Checks a remote access (an rkey from the wire) for QP `qpn` of
    /// protection domain `pd`: a region key or a window key.
    pub fn resolve_remote(
        &self,
        key: u32,
        pd: u32,
        qpn: u32,
        iova: u64,
        len: u64,
        want: Want,
    ) -> std::result::Result<Span, AccessError> {
        if key >> 8 < MW_INDEX_BASE {
            return self.resolve(key, pd, iova, len, want);
        }
        if len == 0 {
            return Ok(Span::empty());
        }
        let mw = self.window(key).ok_or(AccessError::BadKey)?;
        mw.resolve(key, pd, qpn, iova, len, want.required())
    }

    fn window(&self, key: u32) -> Option<Arc<MemoryWindow>> {
        let i = (key >> 8).checked_sub(MW_INDEX_BASE)? as usize;
        self.windows.read().unwrap().get(i)?.clone()
    }

    /// `ibv_alloc_mw`.
    pub fn alloc_mw(&self, pd: u32, mw_type: MwType) -> Arc<MemoryWindow> {
        let variant = self.keys.write().unwrap().random_variant();
        let mut ws = self.windows.write().unwrap();
        let i = ws.iter().position(|w| w.is_none()).unwrap_or_else(|| {
            ws.push(None);
            ws.len() - 1
        });
        let key = ((MW_INDEX_BASE + i as u32) << 8) | variant as u32;
        let mw = Arc::new(MemoryWindow { pd, mw_type, state: Mutex::new(mw::MwState { key, binding: None }) });
        ws[i] = Some(mw.clone());
        mw
    }

    /// `ibv_dealloc_mw`: unbinds and frees; accesses in flight then fail.
    pub fn dealloc_mw(&self, key: u32) -> Result<()> {
        let i = (key >> 8)
            .checked_sub(MW_INDEX_BASE)
            .ok_or_else(|| Error::new(Errno::ENOENT, "dealloc_mw: not a window"))?;
        let mut ws = self.windows.write().unwrap();
        let slot = ws.get_mut(i as usize).ok_or_else(|| Error::new(Errno::ENOENT, "dealloc_mw: no such window"))?;
        let mw = slot.take().ok_or_else(|| Error::new(Errno::ENOENT, "dealloc_mw: no such window"))?;
        MemoryWindow::unbind(&mut mw.state.lock().unwrap());
        Ok(())
    }

    /// Binds a window (BIND_MW work request, or `ibv_bind_mw` for type 1),
    /// on behalf of QP `qpn` of protection domain `qp_pd`. Returns the new key.
    pub fn bind_mw(&self, qp_pd: u32, qpn: u32, r: &BindRequest) -> std::result::Result<u32, BindError> {
        let mw = self.window(r.mw_key).ok_or(BindError("no such window"))?;
        let mut st = mw.state.lock().unwrap();
        if st.key != r.mw_key {
            return Err(BindError("window key does not match"));
        }
        // As rxe: any region access bit may appear (only the remote ones
        // grant anything through a window), plus ZERO_BASED.
        let allowed = Access::LOCAL_WRITE
            | Access::REMOTE_READ
            | Access::REMOTE_WRITE
            | Access::REMOTE_ATOMIC
            | Access::MW_BIND
            | Access::ZERO_BASED;
        if !allowed.contains(r.access) {
            return Err(BindError("unsupported window access flags"));
        }
        let zero_based = r.access.contains(Access::ZERO_BASED);
        let access = r.access & (Access::REMOTE_READ | Access::REMOTE_WRITE | Access::REMOTE_ATOMIC);
        match mw.mw_type {
            MwType::Type1 if zero_based => return Err(BindError("type 1 windows cannot be zero based")),
            MwType::Type2 if st.binding.is_some() => return Err(BindError("type 2 window is already bound")),
            MwType::Type2 if r.len == 0 => return Err(BindError("type 2 windows cannot be bound with length 0")),
            _ => {}
        }
        if qp_pd != mw.pd {
            return Err(BindError("QP and window are in different protection domains"));
        }
        let new_key = match mw.mw_type {
            MwType::Type1 => r.new_key,
            MwType::Type2 => (st.key & !0xff) | (r.new_key & 0xff),
        };
        if new_key >> 8 != st.key >> 8 {
            return Err(BindError("new key names another window"));
        }
        if r.len == 0 {
            // Type 1 unbind.
            MemoryWindow::unbind(&mut st);
            st.key = new_key;
            return Ok(new_key);
        }
        let mr = self.lookup(r.mr_key).ok_or(BindError("no such memory region"))?;
        if mr.pd != mw.pd {
            return Err(BindError("region and window are in different protection domains"));
        }
        if matches!(mr.backing, Backing::Peer(_)) {
            return Err(BindError("memory windows cannot be bound to peer memory"));
        }
        if !mr.access.contains(Access::MW_BIND) {
            return Err(BindError("region was registered without IBV_ACCESS_MW_BIND"));
        }
        if access.intersects(Access::REMOTE_WRITE | Access::REMOTE_ATOMIC) && !mr.access.contains(Access::LOCAL_WRITE) {
            return Err(BindError("remote write/atomic windows need a region with local write"));
        }
        let inside = r.addr >= mr.iova && r.addr.checked_add(r.len).is_some_and(|e| e <= mr.iova + mr.length);
        if !inside {
            return Err(BindError("window outside the region"));
        }
        MemoryWindow::unbind(&mut st);
        mr.windows.fetch_add(1, std::sync::atomic::Ordering::AcqRel);
        st.binding = Some(mw::Binding {
            mr,
            addr: r.addr,
            len: r.len,
            access,
            zero_based,
            qpn: (mw.mw_type == MwType::Type2).then_some(qpn),
        });
        st.key = new_key;
        Ok(new_key)
    }

    /// LOCAL_INV from QP `qpn` (or SEND_WITH_INV arriving on it): frees an
    /// indirect key, or invalidates a type-2 window.
    pub fn invalidate(&self, key: u32, pd: u32, qpn: u32) -> std::result::Result<(), BindError> {
        if key >> 8 < MW_INDEX_BASE {
            let mr = self.lookup(key).ok_or(BindError("no such key"))?;
            let Backing::Indirect(k) = &mr.backing else {
                return Err(BindError("memory regions cannot be invalidated"));
            };
            if mr.pd != pd {
                return Err(BindError("key of another protection domain"));
            }
            k.set(None);
            return Ok(());
        }
        let mw = self.window(key).ok_or(BindError("no such window"))?;
        let mut st = mw.state.lock().unwrap();
        if st.key != key || mw.pd != pd {
            return Err(BindError("stale key or other protection domain"));
        }
        if mw.mw_type == MwType::Type1 {
            return Err(BindError("type 1 windows cannot be invalidated"));
        }
        match &st.binding {
            Some(b) if b.qpn == Some(qpn) => {}
            Some(_) => return Err(BindError("window is bound to another QP")),
            None => return Err(BindError("window is not bound")),
        }
        MemoryWindow::unbind(&mut st);
        Ok(())
    }

    /// `ibv_advise_mr` over `sges` (all keys of `pd`, all ODP regions).
    /// Errors as the spec: EINVAL for an unknown key, a range outside its
    /// region or unknown flags; EPERM for a key of another PD or a write
    /// prefetch on a region without local write; EOPNOTSUPP for a region
    /// that is not on-demand paged; EFAULT (with `flush`) when pages cannot
    /// be made present. Without `flush` faults are ignored, as the kernel
    /// drops the errors of an asynchronous prefetch.
    pub fn advise(&self, pd: u32, advice: Advice, flush: bool, sges: &[Sge]) -> Result<()> {
        if sges.is_empty() {
            return Err(Error::inval("advise_mr: no SGEs"));
        }
        let mut work = Vec::with_capacity(sges.len());
        for s in sges {
            let mr = self.lookup(s.lkey).ok_or_else(|| Error::inval("advise_mr: unknown lkey"))?;
            if mr.pd != pd {
                return Err(Error::new(Errno::EPERM, "advise_mr: lkey of another protection domain"));
            }
            let Backing::Odp { addr, odp } = &mr.backing else {
                return Err(Error::new(Errno::EOPNOTSUPP, "advise_mr: not an on-demand-paging region"));
            };
            if advice == Advice::PrefetchWrite && !mr.access.contains(Access::LOCAL_WRITE) {
                return Err(Error::new(Errno::EPERM, "advise_mr: write prefetch on a read-only region"));
            }
            let off = s.addr.checked_sub(mr.iova).filter(|o| o + s.length as u64 <= mr.length);
            let off = off.ok_or_else(|| Error::inval("advise_mr: range outside the region"))?;
            work.push((odp.clone(), *addr as u64 + off, s.length as u64));
        }
        for (odp, host, len) in work {
            if let Err(e) = odp.advise(advice, host, len) {
                if flush {
                    return Err(Error::new(Errno(e), "advise_mr: pages could not be made present"));
                }
            }
        }
        Ok(())
    }

    /// The ODP regions' keys and counters.
    /// Every registered region (`rdma resource show mr`): key, PD, length
    /// and, for ODP regions, their counters.
    pub fn region_summaries(&self) -> Vec<RegionSummary> {
        let regions: Vec<Arc<MemoryRegion>> = self.keys.read().unwrap().regions().cloned().collect();
        regions
            .iter()
            .map(|r| RegionSummary { key: r.key, pd: r.pd, length: r.length, odp: r.odp().map(|o| o.stats()) })
            .collect()
    }

    #[cfg(any(test, feature = "unstable"))]
    pub fn odp_regions(&self) -> Vec<(u32, OdpStats)> {
        let regions: Vec<Arc<MemoryRegion>> = self.keys.read().unwrap().regions().cloned().collect();
        regions.iter().filter_map(|r| Some((r.key, r.odp()?.stats()))).collect()
    }

    /// The device's ODP counters (sums over all its ODP regions, past ones
    /// included).
    pub fn odp_stats(&self) -> OdpStats {
        notifier::drain();
        self.odp.snapshot()
    }

    /// Bytes currently pinned by registrations of this device.
    pub fn pinned_bytes(&self) -> u64 {
        self.pins.lock().unwrap().pinned_bytes()
    }
}

/// What `ibv_rereg_mr` changes.
#[derive(Default)]
pub struct Rereg {
    pub pd: Option<u32>,
    pub access: Option<Access>,
    pub translation: Option<Translation>,
}

/// A new range for a region.
pub struct Translation {
    pub addr: usize,
    pub len: u64,
    pub iova: u64,
    pub owner: Option<Box<dyn std::any::Any + Send + Sync>>,
}

/// Largest `max_entries` of an indirect key.
pub const MAX_INDIRECT_ENTRIES: u32 = 4096;

/// Whether a registration with `access` needs writable memory: the
/// kernel's `ib_access_writable` (pins with FOLL_WRITE).
fn writable(access: Access) -> bool {
    access.intersects(Access::LOCAL_WRITE | Access::REMOTE_WRITE | Access::REMOTE_ATOMIC | Access::MW_BIND)
}

/// The IBA rules on access flags at registration.
pub fn check_access_flags(access: Access) -> Result<()> {
    if access.intersects(Access::REMOTE_WRITE | Access::REMOTE_ATOMIC) && !access.contains(Access::LOCAL_WRITE) {
        return Err(Error::inval("remote write or atomic access requires local write access"));
    }
    if access.contains(Access::HUGETLB) && !access.contains(Access::ON_DEMAND) {
        return Err(Error::inval("IBV_ACCESS_HUGETLB applies to on-demand paging only"));
    }
    Ok(())
}

/// Total length of an SGE list (u64, no overflow).
pub fn sge_total(sges: &[crate::ib::Sge]) -> u64 {
    sges.iter().map(|s| s.length as u64).sum()
}

/// The one-call copies' slow path: `copy` through the checked span unless
/// it may block (true: copied; false: nothing copied, the caller copies it
/// its way).
fn unless_blocking(
    span: Span,
    copy: impl FnOnce(&Span) -> std::result::Result<(), AccessError>,
) -> std::result::Result<bool, AccessError> {
    if span.may_block() {
        return Ok(false);
    }
    copy(&span).map(|()| true)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reg(mem: &Memory, buf: &mut [u8], access: Access) -> Arc<MemoryRegion> {
        let addr = buf.as_mut_ptr() as usize;
        // SAFETY: the buffers outlive the regions in these tests.
        unsafe { mem.register_host(1, addr, buf.len() as u64, addr as u64, access, None) }.unwrap()
    }

    #[test]
    fn resolve_checks_key_pd_access_range() {
        let mem = Memory::default();
        let mut buf = vec![0u8; 4096];
        let base = buf.as_ptr() as u64;
        let mr = reg(&mem, &mut buf, Access::LOCAL_WRITE | Access::REMOTE_READ);
        let k = mr.key;
        assert!(mem.resolve(k, 1, base, 4096, Want::RemoteRead).is_ok());
        assert_eq!(mem.resolve(k, 2, base, 1, Want::RemoteRead).err(), Some(AccessError::WrongPd));
        assert_eq!(mem.resolve(k, 1, base, 1, Want::RemoteWrite).err(), Some(AccessError::Permission));
        assert_eq!(mem.resolve(k, 1, base + 1, 4096, Want::RemoteRead).err(), Some(AccessError::Range));
        assert_eq!(mem.resolve(k, 1, base - 1, 2, Want::RemoteRead).err(), Some(AccessError::Range));
        assert_eq!(mem.resolve(k ^ 1, 1, base, 1, Want::RemoteRead).err(), Some(AccessError::BadKey));
        assert!(mem.resolve(0xdead_beef, 1, 0, 0, Want::RemoteWrite).is_ok(), "zero length needs no key");
        mem.deregister(k).unwrap();
        assert_eq!(mem.resolve(k, 1, base, 1, Want::RemoteRead).err(), Some(AccessError::BadKey));
        assert!(mem.deregister(k).is_err());
    }

    /// A region another thread still holds after deregistration (a piece
    /// dropped a moment late, a lookup) must not give the application's
    /// range back later: by then the application may have unmapped it and
    /// mapped something else there, which the late give-back would replace
    /// with the old bytes (issue 31's libfabric crash was of this kind).
    #[test]
    fn deregistration_gives_the_range_back_before_it_returns() {
        let n = 2 * 4096;
        // SAFETY: a fresh private mapping, checked.
        let a = unsafe {
            libc::mmap(std::ptr::null_mut(), n, libc::PROT_READ | libc::PROT_WRITE, libc::MAP_PRIVATE | libc::MAP_ANONYMOUS, -1, 0)
        };
        assert_ne!(a, libc::MAP_FAILED);
        // SAFETY: our mapping, the slice dropped before it is unmapped.
        let buf = unsafe { std::slice::from_raw_parts_mut(a.cast::<u8>(), n) };
        buf.fill(0x11);
        let mem = Memory::default();
        let mr = reg(&mem, buf, Access::LOCAL_WRITE | Access::REMOTE_WRITE);
        let moved = |v: &maps::Vma| v.shared && v.name.contains("uroce-mr");
        let v = maps::vmas(a as u64, (a as usize + n) as u64).unwrap();
        assert!(v.iter().all(moved), "private memory is moved into a memfd: {v:?}");
        let late = mem.lookup(mr.key).unwrap();
        mem.deregister(mr.key).unwrap();
        drop(mr);
        let v = maps::vmas(a as u64, (a as usize + n) as u64).unwrap();
        assert!(!v.iter().any(moved), "the range is private again when deregistration returns: {v:?}");
        // SAFETY: our range, mapped again by us at the same address.
        unsafe {
            libc::munmap(a, n);
            let b = libc::mmap(
                a,
                n,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_FIXED,
                -1,
                0,
            );
            assert_eq!(b, a);
            std::ptr::write_bytes(a.cast::<u8>(), 0x22, n);
        }
        drop(late);
        // SAFETY: our new mapping.
        let now = unsafe { std::slice::from_raw_parts(a.cast::<u8>(), n) };
        assert!(now.iter().all(|&b| b == 0x22), "the new mapping is untouched by the last drop");
        let v = maps::vmas(a as u64, (a as usize + n) as u64).unwrap();
        assert!(!v.iter().any(moved), "{v:?}");
        // SAFETY: our mapping.
        unsafe { libc::munmap(a, n) };
    }

    #[test]
    fn registration_flag_rules() {
        let mem = Memory::default();
        let mut buf = vec![0u8; 64];
        let addr = buf.as_mut_ptr() as usize;
        for bad in [Access::REMOTE_WRITE, Access::REMOTE_ATOMIC] {
            // SAFETY: buf outlives the call; it fails anyway.
            let e = unsafe { mem.register_host(1, addr, 64, addr as u64, bad, None) }.unwrap_err();
            assert_eq!(e.errno, Errno::EINVAL);
        }
    }

    #[test]
    fn keys_are_reused_with_a_new_variant() {
        let mem = Memory::default();
        let mut buf = vec![0u8; 64];
        let k1 = reg(&mem, &mut buf, Access::LOCAL_WRITE).key;
        mem.deregister(k1).unwrap();
        let k2 = reg(&mem, &mut buf, Access::LOCAL_WRITE).key;
        assert_eq!(k1 >> 8, k2 >> 8, "index reused");
        assert_ne!(k1, k2, "variant differs so the stale key fails");
        assert_eq!(mem.resolve(k1, 1, buf.as_ptr() as u64, 1, Want::LocalRead).err(), Some(AccessError::BadKey));
    }

    #[test]
    fn rereg_access_pd_and_translation() {
        let mem = Memory::default();
        let mut a = vec![0u8; 4096];
        let mut b = vec![0u8; 8192];
        let (pa, pb) = (a.as_ptr() as u64, b.as_mut_ptr() as usize);
        let k = reg(&mem, &mut a, Access::LOCAL_WRITE).key;
        assert_eq!(mem.resolve(k, 1, pa, 8, Want::RemoteWrite).err(), Some(AccessError::Permission));
        // SAFETY: no translation change.
        let mr = unsafe {
            mem.rereg(k, Rereg { access: Some(Access::LOCAL_WRITE | Access::REMOTE_WRITE), ..Default::default() })
        }
        .unwrap();
        assert_eq!(mr.key, k, "access change keeps the key");
        assert!(mem.resolve(k, 1, pa, 8, Want::RemoteWrite).is_ok());
        // SAFETY: no translation change.
        unsafe { mem.rereg(k, Rereg { pd: Some(7), ..Default::default() }) }.unwrap();
        assert_eq!(mem.resolve(k, 1, pa, 8, Want::RemoteWrite).err(), Some(AccessError::WrongPd));
        // Invalid access is refused and changes nothing.
        // SAFETY: no translation change.
        let e =
            unsafe { mem.rereg(k, Rereg { access: Some(Access::REMOTE_WRITE), ..Default::default() }) }.unwrap_err();
        assert_eq!(e.errno, Errno::EINVAL);
        assert!(mem.resolve(k, 7, pa, 8, Want::RemoteWrite).is_ok());
        // Translation: a new key variant; the old key is dead.
        let t = Translation { addr: pb, len: 8192, iova: pb as u64, owner: None };
        // SAFETY: `b` outlives the region.
        let mr2 = unsafe { mem.rereg(k, Rereg { translation: Some(t), ..Default::default() }) }.unwrap();
        assert_ne!(mr2.key, k);
        assert_eq!(mr2.key >> 8, k >> 8);
        assert_eq!(mem.resolve(k, 7, pa, 8, Want::LocalRead).err(), Some(AccessError::BadKey));
        assert!(mem.resolve(mr2.key, 7, pb as u64 + 8000, 192, Want::RemoteWrite).is_ok());
        mem.deregister(mr2.key).unwrap();
        assert_eq!(mem.pinned_bytes(), 0);
    }
}
