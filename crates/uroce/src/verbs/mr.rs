//! Memory regions (`ibv_mr`).

use super::pd::{PdInner, ProtectionDomain};
use crate::ib::{Access, Error, Result, Sge, ACCESS_OPTIONAL_RANGE};
use crate::mem::{AccessError, OdpStats, Rereg, Translation, Want};
use std::sync::Arc;

impl ProtectionDomain {
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

    /// `ibv_reg_dmabuf_mr`: registers `offset..offset+len` of the file
    /// behind `fd` (see [`MemoryRegion`]'s notes on dma-buf regions).
    pub fn register_dmabuf(&self, offset: u64, len: usize, iova: u64, fd: i32, access: Access) -> Result<MemoryRegion> {
        MemoryRegion::register_dmabuf(self, offset, len, iova, fd, access)
    }

    /// Explicit on-demand paging over `addr..addr+len`: nothing is pinned
    /// and the pages need not be mapped (see `mem::odp`).
    pub fn register_odp(&self, addr: u64, len: u64, access: Access) -> Result<MemoryRegion> {
        if addr == 0 {
            return Err(Error::inval("reg_mr: NULL address (use register_implicit_odp)"));
        }
        MemoryRegion::register_odp(self, addr, len, access)
    }

    /// Implicit on-demand paging: one key over the whole address space
    /// (`ibv_reg_mr(pd, NULL, SIZE_MAX, IBV_ACCESS_ON_DEMAND | …)`).
    pub fn register_implicit_odp(&self, access: Access) -> Result<MemoryRegion> {
        MemoryRegion::register_odp(self, 0, crate::mem::IMPLICIT_ODP_LEN, access)
    }
}

/// A registered memory region. Dropping it deregisters; an owned buffer is
/// freed only after the device can no longer touch it.
pub struct MemoryRegion {
    pd: Arc<PdInner>,
    key: u32,
    addr: u64,
    len: usize,
    iova: u64,
    access: Access,
    registered: bool,
}

fn known(access: Access) -> Result<Access> {
    let bits = access.bits() & !ACCESS_OPTIONAL_RANGE;
    let a = Access::from_bits(bits).ok_or_else(|| Error::inval("reg_mr: unknown access flags"))?;
    Ok(a - Access::RELAXED_ORDERING)
}

impl MemoryRegion {
    pub(crate) fn register_owned(pd: &ProtectionDomain, mut buf: Vec<u8>, access: Access) -> Result<MemoryRegion> {
        let access = known(access)?;
        let addr = buf.as_mut_ptr();
        let len = buf.len();
        if len == 0 {
            return Err(Error::inval("reg_mr: empty buffer"));
        }
        let mem = &pd.inner.ctx.dev.mem;
        // SAFETY: the buffer moves into the region as its owner and lives as
        // long as the region; its heap data does not move.
        let mr = unsafe {
            mem.register_host(pd.inner.handle, addr as usize, len as u64, addr as u64, access, Some(Box::new(buf)))
        }?;
        Ok(MemoryRegion {
            pd: pd.inner.clone(),
            key: mr.key,
            addr: addr as u64,
            len,
            iova: addr as u64,
            access,
            registered: true,
        })
    }

    /// # Safety
    /// `addr..addr+len` must stay valid until the region is dropped.
    pub(crate) unsafe fn register_raw(
        pd: &ProtectionDomain,
        addr: *mut u8,
        len: usize,
        iova: u64,
        access: Access,
    ) -> Result<MemoryRegion> {
        let access = known(access)?;
        let mem = &pd.inner.ctx.dev.mem;
        // SAFETY: the caller's contract.
        let mr = unsafe { mem.register_host(pd.inner.handle, addr as usize, len as u64, iova, access, None) }?;
        Ok(MemoryRegion { pd: pd.inner.clone(), key: mr.key, addr: addr as u64, len, iova, access, registered: true })
    }

    /// On-demand paging over `addr..addr+len` (explicit ODP), or over the
    /// whole address space when `addr = 0, len = u64::MAX` (implicit ODP).
    /// Safe: ODP memory need not stay mapped; unmapped pages make accesses
    /// fail with an access error, never a crash.
    pub(crate) fn register_odp(pd: &ProtectionDomain, addr: u64, len: u64, access: Access) -> Result<MemoryRegion> {
        let access = known(access)? | Access::ON_DEMAND;
        let mem = &pd.inner.ctx.dev.mem;
        let iova = addr;
        // SAFETY: ODP regions never dereference their memory directly (see
        // mem::odp); no validity promise is needed.
        let mr = unsafe { mem.register(pd.inner.handle, addr as usize, len, iova, access, None) }?;
        Ok(MemoryRegion {
            pd: pd.inner.clone(),
            key: mr.key,
            addr,
            len: usize::try_from(len).unwrap_or(usize::MAX),
            iova,
            access,
            registered: true,
        })
    }

    /// `ibv_reg_dmabuf_mr`: registers `offset..offset+len` of the memory
    /// behind file descriptor `fd` (a dma-buf, a memfd, any mmap-able file).
    /// uroce maps that range shared into the process and registers the
    /// mapping as pinned memory owned by the region: writes through RDMA
    /// reach the file's pages, and the mapping lives until deregistration
    /// (the caller may close `fd` at once). `iova` must have `offset`'s page
    /// offset (EINVAL); a bad descriptor is EBADF.
    pub(crate) fn register_dmabuf(
        pd: &ProtectionDomain,
        offset: u64,
        len: usize,
        iova: u64,
        fd: i32,
        access: Access,
    ) -> Result<MemoryRegion> {
        let access = known(access)?;
        let allowed = Access::LOCAL_WRITE | Access::REMOTE_WRITE | Access::REMOTE_READ | Access::REMOTE_ATOMIC;
        if !allowed.contains(access) {
            return Err(Error::inval("reg_dmabuf_mr: access beyond LOCAL_WRITE|REMOTE_*"));
        }
        let page = crate::mem::odp::page_size();
        if len == 0 || offset % page != iova % page {
            return Err(Error::inval("reg_dmabuf_mr: empty, or iova and offset differ in page offset"));
        }
        let map = DmabufMapping::new(fd, offset, len)?;
        let addr = map.addr;
        let mem = &pd.inner.ctx.dev.mem;
        // SAFETY: the mapping moves into the region as its owner and is
        // unmapped only when the region is gone.
        let mr = unsafe { mem.register(pd.inner.handle, addr, len as u64, iova, access, Some(Box::new(map))) }?;
        Ok(MemoryRegion { pd: pd.inner.clone(), key: mr.key, addr: offset, len, iova, access, registered: true })
    }

    /// The ODP counters of this region (`None` unless on-demand paged),
    /// with mlx5's names and meanings.
    pub fn odp_stats(&self) -> Option<OdpStats> {
        Some(self.pd.ctx.dev.mem.lookup(self.key)?.odp()?.stats())
    }

    /// `ibv_rereg_mr(IBV_REREG_MR_CHANGE_ACCESS)`: the key stays.
    pub fn rereg_access(&mut self, access: Access) -> Result<()> {
        let access = known(access)?;
        // SAFETY: no new translation.
        unsafe { self.pd.ctx.dev.mem.rereg(self.key, Rereg { access: Some(access), ..Default::default() }) }?;
        self.access = access;
        Ok(())
    }

    /// `ibv_rereg_mr(IBV_REREG_MR_CHANGE_PD)`: the key stays.
    pub fn rereg_pd(&mut self, pd: &ProtectionDomain) -> Result<()> {
        if !Arc::ptr_eq(&pd.inner.ctx.dev, &self.pd.ctx.dev) {
            return Err(Error::inval("rereg_mr: PD of another device"));
        }
        // SAFETY: no new translation.
        unsafe { self.pd.ctx.dev.mem.rereg(self.key, Rereg { pd: Some(pd.handle()), ..Default::default() }) }?;
        self.pd = pd.inner.clone();
        Ok(())
    }

    /// `ibv_rereg_mr(IBV_REREG_MR_CHANGE_TRANSLATION)` onto a new owned
    /// buffer: the region gets a new key; the old buffer is freed.
    pub fn rereg_buffer(&mut self, mut buf: Vec<u8>) -> Result<()> {
        if buf.is_empty() {
            return Err(Error::inval("rereg_mr: empty buffer"));
        }
        let addr = buf.as_mut_ptr() as usize;
        let len = buf.len();
        let t = Translation { addr, len: len as u64, iova: addr as u64, owner: Some(Box::new(buf)) };
        // SAFETY: the buffer moves into the region as its owner.
        let mr = unsafe { self.pd.ctx.dev.mem.rereg(self.key, Rereg { translation: Some(t), ..Default::default() }) }?;
        self.key = mr.key;
        self.addr = addr as u64;
        self.iova = addr as u64;
        self.len = len;
        Ok(())
    }

    /// `ibv_rereg_mr(IBV_REREG_MR_CHANGE_TRANSLATION)` onto caller memory.
    ///
    /// # Safety
    /// `addr..addr+len` must stay valid until the region is dropped or moved
    /// again.
    pub unsafe fn rereg_raw(&mut self, addr: *mut u8, len: usize, iova: u64) -> Result<()> {
        let t = Translation { addr: addr as usize, len: len as u64, iova, owner: None };
        // SAFETY: the caller's contract.
        let mr = unsafe { self.pd.ctx.dev.mem.rereg(self.key, Rereg { translation: Some(t), ..Default::default() }) }?;
        self.key = mr.key;
        self.addr = addr as u64;
        self.iova = iova;
        self.len = len;
        Ok(())
    }

    /// Seed 003's non-contiguous re-registration (`ibv_rereg_mr_sg`,
    /// `ibv_rereg_mr_interleaved`): the region becomes a zero-based indirect
    /// key over `layout`, under a new key; see `mem::Memory::rereg_layout`.
    pub fn rereg_layout(&mut self, layout: crate::mem::Layout) -> Result<()> {
        let access = layout.access;
        let mr = self.pd.ctx.dev.mem.rereg_layout(self.key, layout)?;
        self.key = mr.key;
        self.addr = 0;
        self.iova = 0;
        self.len = usize::try_from(mr.length).unwrap_or(usize::MAX);
        self.access = access;
        Ok(())
    }

    /// The local key, for SGEs (the same value as [`MemoryRegion::rkey`]).
    pub fn lkey(&self) -> u32 {
        self.key
    }

    /// The remote key, for peers' RDMA and atomic operations.
    pub fn rkey(&self) -> u32 {
        self.key
    }

    /// Host address of the first byte.
    pub fn addr(&self) -> u64 {
        self.addr
    }

    /// The address the device uses for the first byte (`iova`).
    pub fn iova(&self) -> u64 {
        self.iova
    }

    /// Length of the region in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the region has no bytes.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The access rights it was registered with.
    pub fn access(&self) -> Access {
        self.access
    }

    /// An SGE over `offset..offset+len` of this region.
    pub fn sge(&self, offset: usize, len: u32) -> Sge {
        Sge { addr: self.iova + offset as u64, length: len, lkey: self.key }
    }

    /// Copies bytes out of the region.
    pub fn read_at(&self, offset: usize, out: &mut [u8]) -> Result<()> {
        let span = self
            .pd
            .ctx
            .dev
            .mem
            .resolve(self.key, self.pd.handle, self.iova + offset as u64, out.len() as u64, Want::LocalRead)
            .map_err(|e| access_error("read_at", e))?;
        span.read(0, out).map_err(|e| access_error("read_at", e))
    }

    /// Copies bytes into the region.
    pub fn write_at(&self, offset: usize, data: &[u8]) -> Result<()> {
        let span = self
            .pd
            .ctx
            .dev
            .mem
            .resolve(self.key, self.pd.handle, self.iova + offset as u64, data.len() as u64, Want::LocalRead)
            .map_err(|e| access_error("write_at", e))?;
        span.write(0, data).map_err(|e| access_error("write_at", e))
    }

    /// The whole region's bytes (a copy).
    pub fn to_vec(&self) -> Vec<u8> {
        let mut v = vec![0u8; self.len];
        self.read_at(0, &mut v).expect("in range");
        v
    }
}

/// A shared mapping of part of a file, unmapped on drop.
struct DmabufMapping {
    base: usize,
    map_len: usize,
    addr: usize,
}

impl DmabufMapping {
    fn new(fd: i32, offset: u64, len: usize) -> Result<DmabufMapping> {
        let page = crate::mem::odp::page_size();
        let start = offset / page * page;
        let delta = (offset - start) as usize;
        let map_len = delta.checked_add(len).ok_or_else(|| Error::inval("reg_dmabuf_mr: length overflows"))?;
        let off = libc::off_t::try_from(start).map_err(|_| Error::inval("reg_dmabuf_mr: offset too large"))?;
        // SAFETY: a new shared mapping chosen by the kernel; checked below.
        let p = unsafe {
            libc::mmap(std::ptr::null_mut(), map_len, libc::PROT_READ | libc::PROT_WRITE, libc::MAP_SHARED, fd, off)
        };
        if p == libc::MAP_FAILED {
            let e = std::io::Error::last_os_error().raw_os_error().unwrap_or(libc::EINVAL);
            let errno = if e == libc::EACCES || e == libc::ENODEV { libc::EINVAL } else { e };
            return Err(Error::new(crate::ib::Errno(errno), "reg_dmabuf_mr: cannot map the descriptor"));
        }
        // Past the end of the file is SIGBUS on access: refuse it now.
        // SAFETY: `stat` is plain old data; all-zero is a valid value.
        let mut st: libc::stat = unsafe { std::mem::zeroed() };
        // SAFETY: fstat fills `st`.
        if unsafe { libc::fstat(fd, &mut st) } == 0
            && (st.st_mode & libc::S_IFMT) == libc::S_IFREG
            && (st.st_size as u64) < offset + len as u64
        {
            // SAFETY: the mapping made above.
            unsafe { libc::munmap(p, map_len) };
            return Err(Error::inval("reg_dmabuf_mr: range beyond the end of the file"));
        }
        Ok(DmabufMapping { base: p as usize, map_len, addr: p as usize + delta })
    }
}

impl Drop for DmabufMapping {
    fn drop(&mut self) {
        // SAFETY: our own mapping; the region that used it is deregistered.
        unsafe { libc::munmap(self.base as *mut libc::c_void, self.map_len) };
    }
}

/// EFAULT for memory that went away, EINVAL for the rest.
fn access_error(op: &str, e: AccessError) -> Error {
    let errno = if e == AccessError::Fault { crate::ib::Errno::EFAULT } else { crate::ib::Errno::EINVAL };
    Error::new(errno, format!("{op}: {e}"))
}

impl MemoryRegion {
    /// `ibv_dereg_mr`: fails with EBUSY while memory windows are bound to it
    /// (dropping the handle instead invalidates them).
    pub fn dereg(mut self) -> std::result::Result<(), (Self, Error)> {
        if let Err(e) = self.pd.ctx.dev.mem.deregister(self.key) {
            return Err((self, e));
        }
        self.registered = false;
        Ok(())
    }
}

impl Drop for MemoryRegion {
    fn drop(&mut self) {
        if self.registered {
            let _ = self.pd.ctx.dev.mem.deregister_force(self.key);
        }
    }
}

impl std::fmt::Debug for MemoryRegion {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MemoryRegion")
            .field("key", &format_args!("{:#x}", self.key))
            .field("addr", &format_args!("{:#x}", self.addr))
            .field("len", &self.len)
            .finish()
    }
}
