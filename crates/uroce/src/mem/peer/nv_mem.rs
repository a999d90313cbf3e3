//! `nv_mem`: NVIDIA GPU memory as peer memory, the user-space counterpart of
//! Mellanox's nv_peer_mem (`DRV_NAME "nv_mem"`, version 1.3-0).
//!
//! # Loading CUDA
//!
//! uroce has no build-time CUDA dependency: the CUDA driver API
//! (`libcuda.so.1`, installed with the NVIDIA driver, not the toolkit) is
//! opened at run time with `libloading` and the same binary runs on hosts
//! with and without a GPU; [`load`] says why not where it cannot. The
//! `cudarc` crate (checked at 0.19) offers dynamic loading too, with a
//! `cuda-12020`-style version feature so it builds without a toolkit, but
//! it was not chosen: its loader *panics* when the library or a symbol is
//! missing (each binding resolves lazily on first call), which in the
//! drop-in `libibverbs.so.1` (built with `panic = "abort"`) would kill the
//! host application instead of returning a status; it compiles ~850 KB of
//! generated bindings and ties the build to one CUDA header version, while
//! uroce needs a dozen long-stable entry points (`cuInit`,
//! `cuDeviceGetCount`, `cuDeviceGet`, `cuDevicePrimaryCtxRetain`,
//! `cuCtxGetCurrent`, `cuCtxSetCurrent`, `cuPointerGetAttribute`,
//! `cuPointerSetAttribute`, `cuMemcpyDtoH_v2`, `cuMemcpyHtoD_v2`, and for
//! tests `cuMemAlloc_v2`/`cuMemFree_v2`), resolved all at once in
//! [`cuda::CudaDriver::open`] so that a missing one is an error, not a crash.
//!
//! The driver calls sit behind the [`GpuDriver`] trait; the client logic is
//! unit-tested with a mock GPU.
//!
//! # Behaviour, as nv_peer_mem
//!
//! * `acquire` claims `[addr, addr+size)` only if all of it is device memory
//!   of one allocation: `cuPointerGetAttribute` says MEMORY_TYPE = DEVICE
//!   (and not managed memory, which `nvidia_p2p_get_pages` refuses too) and
//!   RANGE_START_ADDR/RANGE_SIZE cover the range. Anything else (host
//!   memory, a range crossing allocations) is left to the next client or to
//!   host pinning.
//! * Pages are 64 KiB GPU pages (`GPU_PAGE_SHIFT 16`): the range is aligned
//!   down and up to 64 KiB and `dma_map` returns the number of 64 KiB pages
//!   (a 1-byte region is 1 page, 64 KiB + 1 bytes are 2).
//! * `get_pages` sets `CU_POINTER_ATTRIBUTE_SYNC_MEMOPS` on the allocation,
//!   as GPUDirect RDMA requires, so the application's own copies on it are
//!   synchronous with respect to the device's.
//! * The device reads and writes GPU memory with `cuMemcpyDtoH`/`HtoD`
//!   (synchronous; the user-space stand-in for the NIC's PCIe peer DMA).
//! * The client unmaps itself after invalidating (`PEER_MEM_INVALIDATE_UNMAPS`).
//!
//! CUDA calls run in the calling thread's current context when it has one
//! (unified addressing lets any context copy any device pointer of the
//! process); a thread without one — uroce's own threads — gets device 0's
//! primary context for the call only, so the application's context setup is
//! never changed.
//!
//! # Detecting `cudaFree`
//!
//! The kernel client gets a free callback from the NVIDIA driver
//! (`nvidia_p2p_get_pages(..., free_callback)`); user space has none. uroce
//! records the allocation's `CU_POINTER_ATTRIBUTE_BUFFER_ID` at `get_pages`
//! — a 64-bit id the driver never reuses within a process, so a new
//! allocation at the same address has a different one — and checks it
//! again
//!
//! * every [`CHECK_PERIOD`] (10 ms, see [`NvMemClient::with_driver`]) from a
//!   checker thread that runs only while nv_mem regions are registered, and
//! * before every access (and after every read, so that bytes of an
//!   allocation that replaced the registered one during the copy are not
//!   delivered).
//!
//! When the id changed or the address is no longer device memory, the
//! allocation was freed: the invalidate callback is called exactly once,
//! always from the checker thread (the core's invalidation waits for
//! accesses in progress, so an access cannot call it itself — it fails with
//! `EFAULT` and wakes the checker), and every later access fails
//! (`REM_ACCESS_ERR` for the requester). Between two checks a free is
//! caught by the check before the next access; an access racing the free
//! fails inside `cuMemcpy` or at the check after it. A write racing a free
//! *and* a new allocation at the same address within one copy is the one
//! window this user-space scheme cannot close (the kernel client closes it
//! by holding the pages until the free callback returns).

use super::{Invalidator, PeerMemory, PeerMemoryClient, PeerResult};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

/// The client's name (its counters' directory), as nv_peer_mem's `DRV_NAME`.
pub const NAME: &str = "nv_mem";

/// The client's version, as nv_peer_mem's `DRV_VERSION`.
pub const VERSION: &str = "1.3-0";

/// GPU page: 64 KiB, as `GPU_PAGE_SHIFT 16` in nv_peer_mem.
pub const GPU_PAGE: u64 = 1 << 16;

/// How often the checker thread looks for freed allocations.
pub const CHECK_PERIOD: Duration = Duration::from_millis(10);

/// One allocation of device memory, as the driver describes it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GpuAllocation {
    /// First byte (`CU_POINTER_ATTRIBUTE_RANGE_START_ADDR`).
    pub base: u64,
    /// Bytes (`CU_POINTER_ATTRIBUTE_RANGE_SIZE`).
    pub size: u64,
    /// `CU_POINTER_ATTRIBUTE_BUFFER_ID`: unique per allocation.
    pub buffer_id: u64,
}

/// The driver calls the client needs: the real CUDA driver
/// ([`cuda::CudaDriver`]), or a mock in tests.
pub trait GpuDriver: Send + Sync {
    /// The device allocation containing `addr`, if `addr` is (unmanaged)
    /// device memory.
    fn allocation(&self, addr: u64) -> Option<GpuAllocation>;
    /// The buffer id of the allocation containing `addr` now; `None` if
    /// `addr` is no longer device memory. The cheap check before accesses.
    fn buffer_id(&self, addr: u64) -> Option<u64> {
        self.allocation(addr).map(|a| a.buffer_id)
    }
    /// Prepares the allocation at `addr` for peer access (SYNC_MEMOPS).
    fn prepare(&self, _addr: u64) -> PeerResult<()> {
        Ok(())
    }
    /// `cuMemcpyDtoH`: `dst.len()` bytes from device address `src`.
    fn copy_to_host(&self, dst: &mut [u8], src: u64) -> PeerResult<()>;
    /// `cuMemcpyHtoD`: `src` to device address `dst`.
    fn copy_to_device(&self, dst: u64, src: &[u8]) -> PeerResult<()>;
}

/// A registered range being watched for frees.
struct Watch {
    alloc: GpuAllocation,
    invalidator: Invalidator,
    /// Set once: at invalidation or at `put_pages`.
    done: Arc<AtomicBool>,
}

#[derive(Default)]
struct Checker {
    watches: Vec<Watch>,
    /// A checker thread exists.
    running: bool,
    /// An access saw a free: check now.
    wake: bool,
}

struct Shared {
    driver: Arc<dyn GpuDriver>,
    period: Duration,
    checker: Mutex<Checker>,
    cv: Condvar,
}

impl Shared {
    /// Whether the allocation still exists as registered.
    fn alive(&self, a: &GpuAllocation) -> bool {
        self.driver.buffer_id(a.base) == Some(a.buffer_id)
    }

    /// Invalidates every watched range whose allocation is gone, each once.
    /// Must not run inside an access (the invalidation waits for them).
    fn check(&self) {
        let gone: Vec<Invalidator> = {
            let mut c = self.checker.lock().unwrap();
            let mut gone = Vec::new();
            c.watches.retain(|w| {
                if w.done.load(Ordering::Acquire) {
                    return false;
                }
                if self.alive(&w.alloc) {
                    return true;
                }
                if !w.done.swap(true, Ordering::AcqRel) {
                    gone.push(w.invalidator.clone());
                }
                false
            });
            gone
        };
        for i in gone {
            tracing::debug!(core_context = i.core_context(), "nv_mem: GPU buffer freed, invalidating");
            i.invalidate();
        }
    }

    fn watch(self: &Arc<Self>, w: Watch) {
        let mut c = self.checker.lock().unwrap();
        c.watches.push(w);
        self.ensure_checker(&mut c);
    }

    fn unwatch(&self, done: &Arc<AtomicBool>) {
        self.checker.lock().unwrap().watches.retain(|w| !Arc::ptr_eq(&w.done, done));
    }

    /// Asks the checker thread to check now (from inside an access).
    fn request_check(self: &Arc<Self>) {
        let mut c = self.checker.lock().unwrap();
        c.wake = true;
        self.cv.notify_all();
        self.ensure_checker(&mut c);
    }

    fn ensure_checker(self: &Arc<Self>, c: &mut Checker) {
        if c.running || c.watches.is_empty() {
            return;
        }
        let s = self.clone();
        match std::thread::Builder::new().name("uroce-nv-mem".into()).spawn(move || s.run_checker()) {
            Ok(_) => c.running = true,
            Err(e) => tracing::warn!("nv_mem: free checker not started ({e}); frees are seen at access only"),
        }
    }

    /// The checker thread: checks every period or when woken, and stops
    /// when no region is watched (the next `get_pages` starts another).
    fn run_checker(&self) {
        loop {
            {
                let mut c = self.checker.lock().unwrap();
                if !c.wake {
                    c = self.cv.wait_timeout(c, self.period).unwrap().0;
                }
                c.wake = false;
            }
            self.check();
            let mut c = self.checker.lock().unwrap();
            if c.watches.is_empty() && !c.wake {
                c.running = false;
                return;
            }
        }
    }
}

/// The `nv_mem` client. Cloning shares it.
#[derive(Clone)]
pub struct NvMemClient {
    shared: Arc<Shared>,
    name: &'static str,
}

impl NvMemClient {
    /// A client over `driver`, checking for frees every `check_every`
    /// while regions are registered ([`load`] uses [`CHECK_PERIOD`]).
    pub fn with_driver(driver: Arc<dyn GpuDriver>, check_every: Duration) -> NvMemClient {
        NvMemClient {
            shared: Arc::new(Shared {
                driver,
                period: check_every,
                checker: Mutex::new(Checker::default()),
                cv: Condvar::new(),
            }),
            name: NAME,
        }
    }

    /// Runs the free check now in this thread (the checker thread does it
    /// periodically). Must not be called from inside a region access.
    pub fn check_frees(&self) {
        self.shared.check();
    }

    /// Regions currently watched for frees.
    pub fn watched(&self) -> usize {
        self.shared.checker.lock().unwrap().watches.len()
    }

    /// Whether the checker thread is running.
    pub fn checker_running(&self) -> bool {
        self.shared.checker.lock().unwrap().running
    }

    /// The same client under another name (tests register a mock-backed
    /// client next to a possibly loaded real one).
    #[cfg(test)]
    fn named(mut self, name: &'static str) -> NvMemClient {
        self.name = name;
        self
    }
}

impl PeerMemoryClient for NvMemClient {
    fn name(&self) -> &str {
        self.name
    }

    fn version(&self) -> &str {
        VERSION
    }

    fn acquire(&self, addr: u64, size: u64) -> Option<Box<dyn PeerMemory>> {
        let end = addr.checked_add(size)?;
        let a = self.shared.driver.allocation(addr)?;
        if addr < a.base || end > a.base.saturating_add(a.size) {
            return None;
        }
        Some(Box::new(GpuRange {
            shared: self.shared.clone(),
            alloc: a,
            pages: 0,
            done: Arc::new(AtomicBool::new(false)),
            watching: false,
        }))
    }

    fn invalidate_unmaps(&self) -> bool {
        true
    }
}

/// 64 KiB GPU pages spanned by `addr..addr+size` (nv_peer_mem's
/// `start = addr & ~0xFFFF`, `end = (addr + size + 0xFFFF) & ~0xFFFF`).
pub fn gpu_pages(addr: u64, size: u64) -> Option<u64> {
    let start = addr & !(GPU_PAGE - 1);
    let end = addr.checked_add(size)?.checked_add(GPU_PAGE - 1)? & !(GPU_PAGE - 1);
    Some((end - start) / GPU_PAGE)
}

/// One acquired GPU range.
struct GpuRange {
    shared: Arc<Shared>,
    alloc: GpuAllocation,
    pages: u64,
    done: Arc<AtomicBool>,
    watching: bool,
}

impl GpuRange {
    /// The free check around an access.
    fn check(&self) -> PeerResult<()> {
        if self.done.load(Ordering::Acquire) {
            return Err(libc::EFAULT);
        }
        if !self.shared.alive(&self.alloc) {
            // The checker thread invalidates: the core's invalidation waits
            // for this access to end.
            self.shared.request_check();
            return Err(libc::EFAULT);
        }
        Ok(())
    }
}

impl PeerMemory for GpuRange {
    fn get_pages(&mut self, addr: u64, size: u64, _write: bool, invalidator: Invalidator) -> PeerResult<()> {
        let pages = gpu_pages(addr, size).ok_or(libc::EINVAL)?;
        // Freed between acquire and get_pages?
        if !self.shared.alive(&self.alloc) {
            return Err(libc::EFAULT);
        }
        self.shared.driver.prepare(addr)?;
        self.pages = pages;
        self.shared.watch(Watch { alloc: self.alloc, invalidator, done: self.done.clone() });
        self.watching = true;
        Ok(())
    }

    fn dma_map(&mut self) -> PeerResult<u64> {
        if self.pages == 0 {
            return Err(libc::EINVAL);
        }
        Ok(self.pages)
    }

    fn dma_unmap(&mut self) {}

    fn put_pages(&mut self) {
        // Deregistration: stop watching.
        self.done.store(true, Ordering::Release);
        self.shared.unwatch(&self.done);
        self.watching = false;
    }

    fn page_size(&self) -> u64 {
        GPU_PAGE
    }

    fn read(&self, addr: u64, out: &mut [u8]) -> PeerResult<()> {
        self.check()?;
        self.shared.driver.copy_to_host(out, addr)?;
        // Not the bytes of an allocation that replaced ours during the copy.
        self.check()
    }

    fn write(&self, addr: u64, data: &[u8]) -> PeerResult<()> {
        self.check()?;
        self.shared.driver.copy_to_device(addr, data)
    }
}

impl Drop for GpuRange {
    fn drop(&mut self) {
        if self.watching {
            self.shared.unwatch(&self.done);
        }
    }
}

/// Loads libcuda, initialises it and builds the client; the error says why
/// not (shown by `uroce peers status`).
pub fn load() -> Result<Arc<NvMemClient>, String> {
    let driver = cuda::CudaDriver::open()?;
    Ok(Arc::new(NvMemClient::with_driver(Arc::new(driver), CHECK_PERIOD)))
}

/// The CUDA driver API, loaded at run time.
pub mod cuda {
    use super::{GpuAllocation, GpuDriver, PeerResult};
    use std::ffi::{c_char, c_void, CStr};

    type CuResult = i32;
    type CuDevicePtr = u64;
    type CuContext = *mut c_void;

    // CUpointer_attribute (cuda.h).
    const MEMORY_TYPE: u32 = 2;
    const SYNC_MEMOPS: u32 = 6;
    const BUFFER_ID: u32 = 7;
    const IS_MANAGED: u32 = 8;
    const RANGE_START_ADDR: u32 = 11;
    const RANGE_SIZE: u32 = 12;
    // CUmemorytype.
    const MEMORYTYPE_DEVICE: u32 = 2;

    type Init = unsafe extern "C" fn(u32) -> CuResult;
    type DeviceGetCount = unsafe extern "C" fn(*mut i32) -> CuResult;
    type DeviceGet = unsafe extern "C" fn(*mut i32, i32) -> CuResult;
    type PrimaryCtxRetain = unsafe extern "C" fn(*mut CuContext, i32) -> CuResult;
    type CtxGetCurrent = unsafe extern "C" fn(*mut CuContext) -> CuResult;
    type CtxSetCurrent = unsafe extern "C" fn(CuContext) -> CuResult;
    type PointerGetAttribute = unsafe extern "C" fn(*mut c_void, u32, CuDevicePtr) -> CuResult;
    type PointerSetAttribute = unsafe extern "C" fn(*const c_void, u32, CuDevicePtr) -> CuResult;
    type MemcpyDtoH = unsafe extern "C" fn(*mut c_void, CuDevicePtr, usize) -> CuResult;
    type MemcpyHtoD = unsafe extern "C" fn(CuDevicePtr, *const c_void, usize) -> CuResult;
    type MemAlloc = unsafe extern "C" fn(*mut CuDevicePtr, usize) -> CuResult;
    type MemFree = unsafe extern "C" fn(CuDevicePtr) -> CuResult;
    type GetErrorName = unsafe extern "C" fn(CuResult, *mut *const c_char) -> CuResult;

    /// The driver: the library and the functions uroce calls.
    pub struct CudaDriver {
        /// Keeps the function pointers below valid.
        _lib: libloading::Library,
        /// Device 0's primary context (retained for the process's life).
        ctx: usize,
        get_current: CtxGetCurrent,
        set_current: CtxSetCurrent,
        get_attr: PointerGetAttribute,
        set_attr: PointerSetAttribute,
        dtoh: MemcpyDtoH,
        htod: MemcpyHtoD,
        mem_alloc: MemAlloc,
        mem_free: MemFree,
        error_name: Option<GetErrorName>,
    }

    // SAFETY: the CUDA driver API is thread safe; `ctx` is an opaque handle
    // made current per call in the calling thread.
    unsafe impl Send for CudaDriver {}
    // SAFETY: as above; no method mutates `self`.
    unsafe impl Sync for CudaDriver {}

    /// Makes the primary context current for a call in a thread that has
    /// none, and restores "none" after.
    struct Current<'a> {
        driver: &'a CudaDriver,
        restore: bool,
    }

    impl Drop for Current<'_> {
        fn drop(&mut self) {
            if self.restore {
                // SAFETY: detaches the context this guard attached; NULL is
                // a valid argument.
                unsafe { (self.driver.set_current)(std::ptr::null_mut()) };
            }
        }
    }

    impl CudaDriver {
        /// Loads `libcuda.so.1`, initialises the driver and retains device
        /// 0's primary context; the error says why not.
        pub fn open() -> Result<CudaDriver, String> {
            // SAFETY: loading the CUDA driver runs its initialisers, which
            // are designed to be loaded into any process.
            let lib = unsafe { libloading::Library::new("libcuda.so.1") }
                .map_err(|e| format!("libcuda.so.1 not loadable (no NVIDIA driver installed?): {e}"))?;
            macro_rules! sym {
                ($name:literal, $ty:ty) => {{
                    let s: libloading::Symbol<$ty> =
                        // SAFETY: the symbol has this C signature in cuda.h;
                        // the pointer is used only while `lib` is loaded (it
                        // moves into the driver with the pointers).
                        unsafe { lib.get($name) }.map_err(|e| format!("libcuda.so.1 too old or broken: {e}"))?;
                    *s
                }};
            }
            let init = sym!(b"cuInit\0", Init);
            let count = sym!(b"cuDeviceGetCount\0", DeviceGetCount);
            let get = sym!(b"cuDeviceGet\0", DeviceGet);
            let retain = sym!(b"cuDevicePrimaryCtxRetain\0", PrimaryCtxRetain);
            // SAFETY: as in `sym!`; optional.
            let error_name = unsafe { lib.get::<GetErrorName>(b"cuGetErrorName\0") }.ok().map(|s| *s);
            let d = CudaDriver {
                get_current: sym!(b"cuCtxGetCurrent\0", CtxGetCurrent),
                set_current: sym!(b"cuCtxSetCurrent\0", CtxSetCurrent),
                get_attr: sym!(b"cuPointerGetAttribute\0", PointerGetAttribute),
                set_attr: sym!(b"cuPointerSetAttribute\0", PointerSetAttribute),
                dtoh: sym!(b"cuMemcpyDtoH_v2\0", MemcpyDtoH),
                htod: sym!(b"cuMemcpyHtoD_v2\0", MemcpyHtoD),
                mem_alloc: sym!(b"cuMemAlloc_v2\0", MemAlloc),
                mem_free: sym!(b"cuMemFree_v2\0", MemFree),
                error_name,
                ctx: 0,
                _lib: lib,
            };
            let (mut n, mut dev, mut ctx) = (0i32, 0i32, std::ptr::null_mut());
            // SAFETY: documented driver calls with valid out-pointers.
            unsafe {
                d.check(init(0), "cuInit")?;
                d.check(count(&mut n), "cuDeviceGetCount")?;
                if n == 0 {
                    return Err("no CUDA device".into());
                }
                d.check(get(&mut dev, 0), "cuDeviceGet")?;
                d.check(retain(&mut ctx, dev), "cuDevicePrimaryCtxRetain")?;
            }
            Ok(CudaDriver { ctx: ctx as usize, ..d })
        }

        fn check(&self, r: CuResult, what: &str) -> Result<(), String> {
            if r == 0 {
                return Ok(());
            }
            let mut name: *const c_char = std::ptr::null();
            if let Some(f) = self.error_name {
                // SAFETY: valid out-pointer; the driver returns a static string.
                if unsafe { f(r, &mut name) } == 0 && !name.is_null() {
                    // SAFETY: a NUL-terminated static string from the driver.
                    let s = unsafe { CStr::from_ptr(name) }.to_string_lossy();
                    return Err(format!("{what} failed: {s} ({r})"));
                }
            }
            Err(format!("{what} failed: CUresult {r}"))
        }

        /// A context for the next driver call (see the module docs).
        fn current(&self) -> Current<'_> {
            let mut cur: CuContext = std::ptr::null_mut();
            // SAFETY: valid out-pointer.
            let r = unsafe { (self.get_current)(&mut cur) };
            if r == 0 && !cur.is_null() {
                return Current { driver: self, restore: false };
            }
            // SAFETY: the retained primary context stays valid for the
            // process's life.
            let restore = unsafe { (self.set_current)(self.ctx as CuContext) } == 0;
            Current { driver: self, restore }
        }

        fn attr<T: Default>(&self, attr: u32, ptr: u64) -> Option<T> {
            let mut v = T::default();
            // SAFETY: `v` has the attribute's type (unsigned int, CUdeviceptr,
            // size_t or unsigned long long), as the callers choose it.
            (unsafe { (self.get_attr)(&mut v as *mut T as *mut c_void, attr, ptr) } == 0).then_some(v)
        }

        /// `cuMemAlloc` (for tests and examples).
        pub fn alloc(&self, size: usize) -> Result<u64, String> {
            let _c = self.current();
            let mut p = 0u64;
            // SAFETY: valid out-pointer.
            self.check(unsafe { (self.mem_alloc)(&mut p, size) }, "cuMemAlloc")?;
            Ok(p)
        }

        /// `cuMemFree`.
        pub fn free(&self, ptr: u64) -> Result<(), String> {
            let _c = self.current();
            // SAFETY: the driver checks that `ptr` is an allocation.
            self.check(unsafe { (self.mem_free)(ptr) }, "cuMemFree")
        }
    }

    impl GpuDriver for CudaDriver {
        fn allocation(&self, addr: u64) -> Option<GpuAllocation> {
            let _c = self.current();
            if self.attr::<u32>(MEMORY_TYPE, addr)? != MEMORYTYPE_DEVICE {
                return None;
            }
            if self.attr::<u32>(IS_MANAGED, addr).unwrap_or(0) != 0 {
                return None;
            }
            let base = self.attr::<u64>(RANGE_START_ADDR, addr)?;
            let size = self.attr::<usize>(RANGE_SIZE, addr)? as u64;
            let buffer_id = self.attr::<u64>(BUFFER_ID, addr)?;
            Some(GpuAllocation { base, size, buffer_id })
        }

        fn buffer_id(&self, addr: u64) -> Option<u64> {
            let _c = self.current();
            self.attr::<u64>(BUFFER_ID, addr)
        }

        fn prepare(&self, addr: u64) -> PeerResult<()> {
            let _c = self.current();
            let one = 1u32;
            // SAFETY: SYNC_MEMOPS takes a pointer to an unsigned int.
            let r = unsafe { (self.set_attr)(&one as *const u32 as *const c_void, SYNC_MEMOPS, addr) };
            if r != 0 {
                tracing::debug!("nv_mem: cuPointerSetAttribute(SYNC_MEMOPS) at {addr:#x}: CUresult {r}");
            }
            Ok(())
        }

        fn copy_to_host(&self, dst: &mut [u8], src: u64) -> PeerResult<()> {
            let _c = self.current();
            // SAFETY: `dst` is an exclusive host buffer of that length; the
            // driver checks the device range.
            let r = unsafe { (self.dtoh)(dst.as_mut_ptr() as *mut c_void, src, dst.len()) };
            if r == 0 {
                Ok(())
            } else {
                Err(libc::EFAULT)
            }
        }

        fn copy_to_device(&self, dst: u64, src: &[u8]) -> PeerResult<()> {
            let _c = self.current();
            // SAFETY: `src` is a live host slice of that length; the driver
            // checks the device range.
            let r = unsafe { (self.htod)(dst, src.as_ptr() as *const c_void, src.len()) };
            if r == 0 {
                Ok(())
            } else {
                Err(libc::EFAULT)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;
    use std::sync::atomic::AtomicUsize;
    use std::time::Instant;

    /// A fake GPU: allocations at fake device addresses, backed by vectors.
    #[derive(Default)]
    struct MockGpu {
        /// base → (buffer id, bytes).
        allocs: Mutex<BTreeMap<u64, (u64, Vec<u8>)>>,
        next_id: AtomicUsize,
        to_host: AtomicUsize,
        to_device: AtomicUsize,
        prepared: AtomicUsize,
    }

    impl MockGpu {
        fn alloc(&self, base: u64, size: usize) {
            let id = self.next_id.fetch_add(1, Ordering::Relaxed) as u64 + 1;
            self.allocs.lock().unwrap().insert(base, (id, vec![0; size]));
        }
        fn free(&self, base: u64) {
            self.allocs.lock().unwrap().remove(&base);
        }
        fn bytes(&self, base: u64, off: usize, len: usize) -> Vec<u8> {
            self.allocs.lock().unwrap()[&base].1[off..off + len].to_vec()
        }
    }

    impl GpuDriver for MockGpu {
        fn allocation(&self, addr: u64) -> Option<GpuAllocation> {
            let a = self.allocs.lock().unwrap();
            let (&base, (id, mem)) = a.range(..=addr).next_back()?;
            (addr < base + mem.len() as u64).then_some(GpuAllocation { base, size: mem.len() as u64, buffer_id: *id })
        }
        fn prepare(&self, addr: u64) -> PeerResult<()> {
            self.allocation(addr).ok_or(libc::EFAULT)?;
            self.prepared.fetch_add(1, Ordering::Relaxed);
            Ok(())
        }
        fn copy_to_host(&self, dst: &mut [u8], src: u64) -> PeerResult<()> {
            self.to_host.fetch_add(1, Ordering::Relaxed);
            let a = self.allocation(src).ok_or(libc::EFAULT)?;
            let g = self.allocs.lock().unwrap();
            let off = (src - a.base) as usize;
            dst.copy_from_slice(g[&a.base].1.get(off..off + dst.len()).ok_or(libc::EFAULT)?);
            Ok(())
        }
        fn copy_to_device(&self, dst: u64, src: &[u8]) -> PeerResult<()> {
            self.to_device.fetch_add(1, Ordering::Relaxed);
            let a = self.allocation(dst).ok_or(libc::EFAULT)?;
            let mut g = self.allocs.lock().unwrap();
            let off = (dst - a.base) as usize;
            g.get_mut(&a.base).unwrap().1.get_mut(off..off + src.len()).ok_or(libc::EFAULT)?.copy_from_slice(src);
            Ok(())
        }
    }

    /// Above any user-space host address, so that a mock client registered
    /// with the core never claims another test's host memory.
    const BASE: u64 = 0x4000_0000_0000_0000;

    /// Allocations: BASE (4 pages) and BASE + 8 pages (1 page).
    fn client_every(period: Duration) -> (Arc<MockGpu>, NvMemClient) {
        let gpu = Arc::new(MockGpu::default());
        gpu.alloc(BASE, 4 * GPU_PAGE as usize);
        gpu.alloc(BASE + 8 * GPU_PAGE, GPU_PAGE as usize);
        let c = NvMemClient::with_driver(gpu.clone(), period);
        (gpu, c)
    }

    /// A client whose checker thread practically never wakes on its own.
    fn client() -> (Arc<MockGpu>, NvMemClient) {
        client_every(Duration::from_secs(3600))
    }

    fn eventually(what: &str, f: impl Fn() -> bool) {
        let t = Instant::now();
        while !f() {
            assert!(t.elapsed() < Duration::from_secs(5), "timed out waiting until {what}");
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    #[test]
    fn name_and_version_as_nv_peer_mem() {
        let (_gpu, c) = client();
        assert_eq!((c.name(), c.version()), ("nv_mem", "1.3-0"));
        assert!(c.invalidate_unmaps());
    }

    #[test]
    fn acquire_claims_device_memory_of_one_allocation() {
        let (_gpu, c) = client();
        assert!(c.acquire(BASE + 100, 1000).is_some());
        assert!(c.acquire(BASE, 4 * GPU_PAGE).is_some(), "the whole allocation");
        assert!(c.acquire(BASE + 4 * GPU_PAGE - 1, 1).is_some(), "its last byte");
        assert!(c.acquire(BASE + 3 * GPU_PAGE, 2 * GPU_PAGE).is_none(), "crosses the allocation's end");
        assert!(c.acquire(BASE, 9 * GPU_PAGE).is_none(), "crosses into the next allocation");
        assert!(c.acquire(BASE + 5 * GPU_PAGE, 8).is_none(), "between allocations");
        let host = vec![0u8; 4096];
        assert!(c.acquire(host.as_ptr() as u64, 4096).is_none(), "host memory");
        assert!(c.acquire(u64::MAX - 10, 100).is_none(), "wraps");
    }

    #[test]
    fn pages_are_64k_gpu_pages() {
        assert_eq!(gpu_pages(BASE + 10, 1), Some(1), "1 byte inside a page");
        assert_eq!(gpu_pages(BASE, GPU_PAGE), Some(1));
        assert_eq!(gpu_pages(BASE, GPU_PAGE + 1), Some(2), "64 KiB + 1");
        assert_eq!(gpu_pages(BASE + GPU_PAGE - 1, 2), Some(2), "2 bytes across a boundary");
        assert_eq!(gpu_pages(BASE + 1, 4 * GPU_PAGE - 1), Some(4));
        assert_eq!(gpu_pages(u64::MAX - 1, 100), None);

        let (gpu, c) = client();
        let pages = |addr: u64, len: u64| {
            let mut m = c.acquire(addr, len).unwrap();
            m.get_pages(addr, len, true, Invalidator::detached(1)).unwrap();
            let n = m.dma_map().unwrap();
            m.dma_unmap();
            m.put_pages();
            n
        };
        assert_eq!(pages(BASE + 10, 1), 1);
        assert_eq!(pages(BASE, GPU_PAGE + 1), 2);
        assert_eq!(pages(BASE + GPU_PAGE - 1, 2), 2);
        assert_eq!(pages(BASE, 4 * GPU_PAGE), 4);
        assert_eq!(gpu.prepared.load(Ordering::Relaxed), 4, "SYNC_MEMOPS at every get_pages");
        assert_eq!(c.acquire(BASE, 1).unwrap().page_size(), GPU_PAGE);
        assert_eq!(c.watched(), 0, "put_pages stops watching");
    }

    #[test]
    fn get_pages_refuses_memory_freed_since_acquire() {
        let (gpu, c) = client();
        let mut m = c.acquire(BASE, 4096).unwrap();
        gpu.free(BASE);
        gpu.alloc(BASE, 4096);
        assert_eq!(m.get_pages(BASE, 4096, true, Invalidator::detached(1)), Err(libc::EFAULT));
        assert_eq!(c.watched(), 0);
    }

    #[test]
    fn reads_and_writes_go_through_the_driver() {
        let (gpu, c) = client();
        let mut m = c.acquire(BASE, 4096).unwrap();
        m.get_pages(BASE, 4096, true, Invalidator::detached(1)).unwrap();
        m.write(BASE + 10, b"gpu bytes").unwrap();
        assert_eq!(gpu.to_device.load(Ordering::Relaxed), 1);
        assert_eq!(gpu.bytes(BASE, 10, 9), b"gpu bytes");
        gpu.allocs.lock().unwrap().get_mut(&BASE).unwrap().1[100..104].copy_from_slice(b"from");
        let mut out = [0u8; 4];
        m.read(BASE + 100, &mut out).unwrap();
        assert_eq!(&out, b"from");
        assert_eq!(gpu.to_host.load(Ordering::Relaxed), 1);
        m.put_pages();
    }

    #[test]
    fn a_free_found_by_the_check_invalidates_once_and_accesses_fail() {
        let (gpu, c) = client();
        let mut m = c.acquire(BASE, 4096).unwrap();
        let (inv, count) = Invalidator::counting(7);
        m.get_pages(BASE, 4096, true, inv).unwrap();
        let mut other = c.acquire(BASE + 8 * GPU_PAGE, 64).unwrap();
        let (inv2, count2) = Invalidator::counting(8);
        other.get_pages(BASE + 8 * GPU_PAGE, 64, true, inv2).unwrap();
        assert_eq!(c.watched(), 2);
        gpu.free(BASE);
        c.check_frees();
        c.check_frees();
        assert_eq!(count.load(Ordering::Relaxed), 1, "invalidated exactly once");
        assert_eq!(count2.load(Ordering::Relaxed), 0, "the other allocation lives");
        assert_eq!(c.watched(), 1);
        let mut out = [0u8; 9];
        assert_eq!(m.read(BASE, &mut out), Err(libc::EFAULT));
        // A new allocation at the same address has a new buffer id: still refused.
        gpu.alloc(BASE, 4096);
        let copies = gpu.to_device.load(Ordering::Relaxed);
        assert_eq!(m.write(BASE, b"x"), Err(libc::EFAULT));
        assert_eq!(gpu.to_device.load(Ordering::Relaxed), copies, "no copy into the new allocation");
        assert_eq!(count.load(Ordering::Relaxed), 1);
        other.write(BASE + 8 * GPU_PAGE, b"ok").unwrap();
        other.put_pages();
    }

    #[test]
    fn a_free_found_by_an_access_wakes_the_checker() {
        let (gpu, c) = client();
        let mut m = c.acquire(BASE, 4096).unwrap();
        let (inv, count) = Invalidator::counting(1);
        m.get_pages(BASE, 4096, true, inv).unwrap();
        m.write(BASE, b"a").unwrap();
        gpu.free(BASE);
        gpu.alloc(BASE, 4096);
        let copies = gpu.to_device.load(Ordering::Relaxed);
        assert_eq!(m.write(BASE, b"b"), Err(libc::EFAULT), "refused before the checker's period");
        assert_eq!(gpu.to_device.load(Ordering::Relaxed), copies);
        eventually("the checker invalidates", || count.load(Ordering::Relaxed) == 1);
        let mut out = [0u8; 1];
        assert_eq!(m.read(BASE, &mut out), Err(libc::EFAULT));
        eventually("the checker stops", || !c.checker_running());
        assert_eq!(count.load(Ordering::Relaxed), 1, "exactly once");
    }

    #[test]
    fn the_checker_finds_frees_by_itself_and_runs_only_while_regions_exist() {
        let (gpu, c) = client_every(Duration::from_millis(10));
        assert!(!c.checker_running());
        let mut m = c.acquire(BASE, 4096).unwrap();
        let (inv, count) = Invalidator::counting(1);
        m.get_pages(BASE, 4096, true, inv).unwrap();
        assert!(c.checker_running());
        std::thread::sleep(Duration::from_millis(50));
        assert_eq!(count.load(Ordering::Relaxed), 0, "nothing freed");
        gpu.free(BASE);
        eventually("the checker invalidates", || count.load(Ordering::Relaxed) == 1);
        eventually("the checker stops", || !c.checker_running());
        drop(m);

        // Deregistered before the free: no invalidation.
        gpu.alloc(BASE, 4096);
        let mut m = c.acquire(BASE, 4096).unwrap();
        let (inv, count) = Invalidator::counting(2);
        m.get_pages(BASE, 4096, true, inv).unwrap();
        assert!(c.checker_running());
        m.dma_unmap();
        m.put_pages();
        drop(m);
        gpu.free(BASE);
        eventually("the checker stops", || !c.checker_running());
        assert_eq!(count.load(Ordering::Relaxed), 0);
    }

    /// Through the core: an access that finds the buffer freed fails at
    /// once (it must not invalidate itself: the core's invalidation waits
    /// for accesses in progress), then the region is revoked and counted.
    #[test]
    fn registered_region_is_revoked_after_a_free() {
        let (gpu, c) = client();
        let name = "nv_mem_unit_mock";
        super::super::register_client(Arc::new(c.clone().named(name))).unwrap();
        let stats = || super::super::client_stats().into_iter().find(|s| s.name == name).unwrap();
        let mapping = super::super::acquire(BASE + 4, 3 * GPU_PAGE, true).unwrap().expect("claimed");
        assert_eq!((mapping.pages(), mapping.page_size()), (4, GPU_PAGE));
        mapping.write(0, b"peer").unwrap();
        assert_eq!(gpu.bytes(BASE, 4, 4), b"peer");
        gpu.free(BASE);
        let m = mapping.clone();
        let (tx, rx) = std::sync::mpsc::channel();
        let reader = std::thread::spawn(move || {
            let mut out = [0u8; 4];
            let _ = tx.send(m.read(0, &mut out));
        });
        let r = rx.recv_timeout(Duration::from_secs(5)).expect("the access returns (no self-deadlock)");
        // The thread's clone of the mapping must be gone before the
        // deregistration below is the last reference.
        reader.join().unwrap();
        assert!(r.is_err());
        eventually("the region is revoked", || mapping.is_invalidated());
        let s = stats();
        assert_eq!((s.num_alloc_mrs, s.num_reg_pages, s.num_free_callbacks, s.num_dealloc_mrs), (1, 4, 1, 1));
        // The mapping ended at invalidation: pages and bytes with it.
        assert_eq!((s.num_dereg_pages, s.num_dereg_bytes), (4, 3 * GPU_PAGE), "MAPPED -> INVALIDATED");
        assert!(mapping.write(0, b"x").is_err());
        drop(mapping);
        assert_eq!(stats(), s, "INVALIDATED -> UNMAPPED counts nothing more");
        assert!(super::super::unregister_client(name));
        eventually("the checker stops", || !c.checker_running());
    }

    #[test]
    fn load_explains_why_not() {
        match load() {
            Ok(c) => assert_eq!(c.name(), "nv_mem"),
            Err(reason) => {
                assert!(!reason.is_empty());
                println!("nv_mem not loadable here: {reason}");
            }
        }
    }
}
