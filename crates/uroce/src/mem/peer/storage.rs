//! A storage peer: device memory backed by a file or block device.
//!
//! Seed 000 names SSD storage as a PeerDirect client. [`StoragePeer`]
//! models such a device: [`StoragePeer::alloc`] hands out *device
//! addresses* inside a reserved, inaccessible (`PROT_NONE`) range of the
//! address space — the CPU cannot dereference them, exactly like GPU
//! pointers — and each device address is a byte of the backing file. An RDMA
//! WRITE into a region registered over such an address lands in the file
//! (`pwrite`), an RDMA READ comes from it (`pread`). [`StoragePeer::free`]
//! releases an allocation and calls the invalidate callback of every region
//! still registered over it.

use super::{Invalidator, PeerMemory, PeerMemoryClient, PeerResult};
use std::collections::BTreeMap;
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::sync::{Arc, Mutex};

/// The client version the storage peer reports.
pub const VERSION: &str = "1.0";

/// The page size the storage peer maps in.
pub const STORAGE_PAGE: u64 = 4096;

#[derive(Debug)]
struct Alloc {
    len: u64,
    /// Registrations over this allocation: (core context, callback).
    registered: Vec<Invalidator>,
}

#[derive(Debug)]
struct Inner {
    name: String,
    file: File,
    base: u64,
    capacity: u64,
    allocs: Mutex<BTreeMap<u64, Alloc>>,
}

impl Drop for Inner {
    fn drop(&mut self) {
        // SAFETY: unmaps the reservation made in `open`, which nothing
        // dereferences (it is PROT_NONE).
        unsafe { libc::munmap(self.base as *mut libc::c_void, self.capacity as usize) };
    }
}

/// A file-backed peer device (see the module docs). Cloning shares it.
#[derive(Debug, Clone)]
pub struct StoragePeer {
    inner: Arc<Inner>,
}

impl StoragePeer {
    /// Opens (creating if needed) `path` as a device of `capacity` bytes.
    pub fn open(name: &str, path: &Path, capacity: u64) -> std::io::Result<StoragePeer> {
        let capacity = capacity.div_ceil(STORAGE_PAGE) * STORAGE_PAGE;
        let file = std::fs::OpenOptions::new().read(true).write(true).create(true).truncate(false).open(path)?;
        if file.metadata()?.len() < capacity && file.metadata()?.file_type().is_file() {
            file.set_len(capacity)?;
        }
        // SAFETY: reserves address space only: PROT_NONE, no backing, no
        // access possible; the result is checked.
        let base = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                capacity as usize,
                libc::PROT_NONE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
                -1,
                0,
            )
        };
        if base == libc::MAP_FAILED {
            return Err(std::io::Error::last_os_error());
        }
        Ok(StoragePeer {
            inner: Arc::new(Inner {
                name: name.to_string(),
                file,
                base: base as u64,
                capacity,
                allocs: Mutex::new(BTreeMap::new()),
            }),
        })
    }

    /// Allocates `len` bytes of device memory (page aligned); returns its
    /// device address. ENOMEM when full.
    pub fn alloc(&self, len: u64) -> PeerResult<u64> {
        if len == 0 {
            return Err(libc::EINVAL);
        }
        let len = len.div_ceil(STORAGE_PAGE) * STORAGE_PAGE;
        let mut allocs = self.inner.allocs.lock().unwrap();
        let mut at = 0u64;
        for (&off, a) in allocs.iter() {
            if off - at >= len {
                break;
            }
            at = off + a.len;
        }
        if at + len > self.inner.capacity {
            return Err(libc::ENOMEM);
        }
        allocs.insert(at, Alloc { len, registered: Vec::new() });
        Ok(self.inner.base + at)
    }

    /// Frees an allocation; regions registered over it are invalidated.
    /// EINVAL if `addr` is not an allocation's start.
    pub fn free(&self, addr: u64) -> PeerResult<()> {
        let off = addr.checked_sub(self.inner.base).ok_or(libc::EINVAL)?;
        let a = self.inner.allocs.lock().unwrap().remove(&off).ok_or(libc::EINVAL)?;
        for inv in a.registered {
            inv.invalidate();
        }
        Ok(())
    }

    /// The allocation (offset, length) containing `addr..addr+len`.
    fn find(&self, addr: u64, len: u64) -> Option<(u64, u64)> {
        let off = addr.checked_sub(self.inner.base)?;
        let allocs = self.inner.allocs.lock().unwrap();
        let (&start, a) = allocs.range(..=off).next_back()?;
        (off.checked_add(len)? <= start + a.len).then_some((start, a.len))
    }

    /// Host access to device memory (what `cudaMemcpy` is for a GPU).
    pub fn read(&self, addr: u64, out: &mut [u8]) -> PeerResult<()> {
        let (_, _) = self.find(addr, out.len() as u64).ok_or(libc::EFAULT)?;
        self.inner.file.read_exact_at(out, addr - self.inner.base).map_err(|e| e.raw_os_error().unwrap_or(libc::EIO))
    }

    /// Host writes into device memory.
    pub fn write(&self, addr: u64, data: &[u8]) -> PeerResult<()> {
        let (_, _) = self.find(addr, data.len() as u64).ok_or(libc::EFAULT)?;
        self.inner.file.write_all_at(data, addr - self.inner.base).map_err(|e| e.raw_os_error().unwrap_or(libc::EIO))
    }

    /// Live allocations.
    pub fn allocations(&self) -> usize {
        self.inner.allocs.lock().unwrap().len()
    }
}

impl PeerMemoryClient for StoragePeer {
    fn name(&self) -> &str {
        &self.inner.name
    }

    fn version(&self) -> &str {
        VERSION
    }

    fn acquire(&self, addr: u64, size: u64) -> Option<Box<dyn PeerMemory>> {
        let (alloc, _) = self.find(addr, size)?;
        Some(Box::new(StorageRange { peer: self.clone(), alloc, pinned: None }))
    }

    fn alloc(&self, len: u64) -> PeerResult<u64> {
        StoragePeer::alloc(self, len)
    }

    fn free(&self, addr: u64) -> PeerResult<()> {
        StoragePeer::free(self, addr)
    }

    fn host_read(&self, addr: u64, out: &mut [u8]) -> PeerResult<()> {
        StoragePeer::read(self, addr, out)
    }

    fn host_write(&self, addr: u64, data: &[u8]) -> PeerResult<()> {
        StoragePeer::write(self, addr, data)
    }
}

/// One acquired range of a [`StoragePeer`].
struct StorageRange {
    peer: StoragePeer,
    alloc: u64,
    /// (core context, first page, end page) while pinned.
    pinned: Option<(u64, u64, u64)>,
}

impl PeerMemory for StorageRange {
    fn get_pages(&mut self, addr: u64, size: u64, _write: bool, invalidator: Invalidator) -> PeerResult<()> {
        let mut allocs = self.peer.inner.allocs.lock().unwrap();
        let a = allocs.get_mut(&self.alloc).ok_or(libc::EFAULT)?;
        self.pinned = Some((invalidator.core_context(), addr / STORAGE_PAGE, (addr + size).div_ceil(STORAGE_PAGE)));
        a.registered.push(invalidator);
        Ok(())
    }

    fn dma_map(&mut self) -> PeerResult<u64> {
        let (_, first, end) = self.pinned.ok_or(libc::EINVAL)?;
        Ok(end - first)
    }

    fn dma_unmap(&mut self) {}

    fn put_pages(&mut self) {
        if let Some((ctx, _, _)) = self.pinned.take() {
            if let Some(a) = self.peer.inner.allocs.lock().unwrap().get_mut(&self.alloc) {
                a.registered.retain(|i| i.core_context() != ctx);
            }
        }
    }

    fn page_size(&self) -> u64 {
        STORAGE_PAGE
    }

    fn read(&self, addr: u64, out: &mut [u8]) -> PeerResult<()> {
        self.peer.read(addr, out)
    }

    fn write(&self, addr: u64, data: &[u8]) -> PeerResult<()> {
        self.peer.write(addr, data)
    }
}
