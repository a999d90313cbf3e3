//! `nv_mem`: NVIDIA GPU memory as peer memory, the user-space counterpart of
//! Mellanox's nv_peer_mem.
//!
//! The CUDA driver API (`libcuda.so.1`) is loaded at run time with
//! `libloading`; uroce has no build-time CUDA dependency and runs the same
//! binary on hosts with and without a GPU. (cudarc offers the same dynamic
//! loading, but only the seven functions below are needed, and its bindings
//! tie the build to a CUDA version.)
//!
//! Behaviour, as nv_peer_mem:
//! * `acquire` claims a range only if all of it is device memory of one
//!   allocation (`cuPointerGetAttribute`: MEMORY_TYPE = DEVICE, RANGE_START
//!   and RANGE_SIZE cover it);
//! * pages are 64 KiB GPU pages: the range is aligned down and up to 64 KiB
//!   and `dma_map` maps one page per 64 KiB;
//! * the device reads and writes GPU memory with `cuMemcpyDtoH`/`HtoD`
//!   (synchronous; the user-space stand-in for the NIC's PCIe peer DMA);
//! * the client unmaps itself after invalidating (`PEER_MEM_INVALIDATE_UNMAPS`).
//!
//! **Detecting `cudaFree`.** The kernel client gets a free callback from the
//! NVIDIA driver; user space has none. uroce records the allocation's
//! `CU_POINTER_ATTRIBUTE_BUFFER_ID` at `get_pages` (a 64-bit id the driver
//! never reuses) and checks it again before every access and every 10 ms
//! from a checker thread while GPU regions exist. When the id changed or the
//! pointer is no longer device memory, the allocation was freed: the client
//! calls the invalidate callback (once) and every later access fails. An
//! access racing the free is caught by the check before it, or fails inside
//! `cuMemcpy` with an error, never touching freed memory of another owner
//! (a re-allocation at the same address has a new buffer id).

use super::{Invalidator, PeerMemory, PeerMemoryClient, PeerResult};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

/// GPU page: 64 KiB, as `GPU_PAGE_SHIFT 16` in nv_peer_mem.
pub const GPU_PAGE: u64 = 1 << 16;

/// One allocation of device memory, as the driver describes it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GpuAllocation {
    pub base: u64,
    pub size: u64,
    pub buffer_id: u64,
}

/// The driver calls the client needs: the real CUDA driver, or a mock in tests.
pub trait GpuDriver: Send + Sync {
    /// The device allocation containing `addr`, if `addr` is device memory.
    fn allocation(&self, addr: u64) -> Option<GpuAllocation>;
    fn copy_to_host(&self, dst: &mut [u8], src: u64) -> PeerResult<()>;
    fn copy_to_device(&self, dst: u64, src: &[u8]) -> PeerResult<()>;
}

/// A registered range being watched for frees.
struct Watch {
    alloc: GpuAllocation,
    invalidator: Invalidator,
    fired: Arc<AtomicBool>,
}

struct Shared {
    driver: Arc<dyn GpuDriver>,
    watches: Mutex<Vec<Watch>>,
    checker_running: AtomicBool,
}

impl Shared {
    /// Whether the allocation still exists as registered.
    fn alive(&self, a: &GpuAllocation) -> bool {
        self.driver.allocation(a.base).is_some_and(|now| now.buffer_id == a.buffer_id)
    }

    /// Invalidates every watched range whose allocation is gone.
    fn check(&self) {
        let gone: Vec<Invalidator> = {
            let mut w = self.watches.lock().unwrap();
            let mut gone = Vec::new();
            w.retain(|x| {
                if x.fired.load(Ordering::Acquire) {
                    return false;
                }
                if self.alive(&x.alloc) {
                    return true;
                }
                x.fired.store(true, Ordering::Release);
                gone.push(x.invalidator.clone());
                false
            });
            gone
        };
        for i in gone {
            i.invalidate();
        }
    }
}

/// The `nv_mem` client. Cloning shares it.
#[derive(Clone)]
pub struct NvMemClient {
    shared: Arc<Shared>,
    check_every: Duration,
}

impl NvMemClient {
    /// A client over `driver`, checking for frees every `check_every`.
    pub fn with_driver(driver: Arc<dyn GpuDriver>, check_every: Duration) -> NvMemClient {
        NvMemClient {
            shared: Arc::new(Shared {
                driver,
                watches: Mutex::new(Vec::new()),
                checker_running: AtomicBool::new(false),
            }),
            check_every,
        }
    }

    /// Runs the free check now (the checker thread does it periodically).
    pub fn check_frees(&self) {
        self.shared.check();
    }

    fn start_checker(&self) {
        if self.shared.checker_running.swap(true, Ordering::AcqRel) {
            return;
        }
        let weak: Weak<Shared> = Arc::downgrade(&self.shared);
        let period = self.check_every;
        let spawned = std::thread::Builder::new().name("uroce-nv-mem".into()).spawn(move || loop {
            std::thread::sleep(period);
            let Some(s) = weak.upgrade() else { return };
            s.check();
            let mut w = s.watches.lock().unwrap();
            if w.is_empty() {
                // Stop while nothing is registered; the next get_pages restarts it.
                s.checker_running.store(false, Ordering::Release);
                w.clear();
                return;
            }
        });
        if spawned.is_err() {
            self.shared.checker_running.store(false, Ordering::Release);
        }
    }
}

impl PeerMemoryClient for NvMemClient {
    fn name(&self) -> &str {
        "nv_mem"
    }

    fn version(&self) -> &str {
        "1.3-0"
    }

    fn acquire(&self, addr: u64, size: u64) -> Option<Box<dyn PeerMemory>> {
        let a = self.shared.driver.allocation(addr)?;
        let end = addr.checked_add(size)?;
        if addr < a.base || end > a.base + a.size {
            return None;
        }
        Some(Box::new(GpuRange { client: self.clone(), alloc: a, pages: 0, fired: Arc::new(AtomicBool::new(false)) }))
    }
}

/// One acquired GPU range.
struct GpuRange {
    client: NvMemClient,
    alloc: GpuAllocation,
    pages: u64,
    fired: Arc<AtomicBool>,
}

impl GpuRange {
    /// The free check before an access.
    fn check(&self) -> PeerResult<()> {
        if self.fired.load(Ordering::Acquire) || !self.client.shared.alive(&self.alloc) {
            self.client.shared.check();
            return Err(libc::EFAULT);
        }
        Ok(())
    }
}

impl PeerMemory for GpuRange {
    fn get_pages(&mut self, addr: u64, size: u64, _write: bool, invalidator: Invalidator) -> PeerResult<()> {
        let start = addr & !(GPU_PAGE - 1);
        let end = (addr + size + GPU_PAGE - 1) & !(GPU_PAGE - 1);
        self.pages = (end - start) / GPU_PAGE;
        let watch = Watch { alloc: self.alloc, invalidator, fired: self.fired.clone() };
        self.client.shared.watches.lock().unwrap().push(watch);
        self.client.start_checker();
        Ok(())
    }

    fn dma_map(&mut self) -> PeerResult<u64> {
        Ok(self.pages)
    }

    fn dma_unmap(&mut self) {}

    fn put_pages(&mut self) {
        // Stop watching: the region is being deregistered.
        self.fired.store(true, Ordering::Release);
        self.client.shared.watches.lock().unwrap().retain(|w| !Arc::ptr_eq(&w.fired, &self.fired));
    }

    fn page_size(&self) -> u64 {
        GPU_PAGE
    }

    fn read(&self, addr: u64, out: &mut [u8]) -> PeerResult<()> {
        self.check()?;
        self.client.shared.driver.copy_to_host(out, addr)
    }

    fn write(&self, addr: u64, data: &[u8]) -> PeerResult<()> {
        self.check()?;
        self.client.shared.driver.copy_to_device(addr, data)
    }
}

/// Loads libcuda, initialises it and builds the client; the error says why
/// not (shown by `uroce peers status`).
pub fn load() -> Result<Arc<NvMemClient>, String> {
    let driver = cuda::CudaDriver::open()?;
    Ok(Arc::new(NvMemClient::with_driver(Arc::new(driver), Duration::from_millis(10))))
}

/// The CUDA driver API, loaded at run time.
pub mod cuda {
    use super::{GpuAllocation, GpuDriver, PeerResult};
    use std::ffi::c_void;

    type CuResult = i32;
    type CuDevicePtr = u64;
    const MEMORY_TYPE: u32 = 2;
    const SYNC_MEMOPS: u32 = 6;
    const BUFFER_ID: u32 = 7;
    const RANGE_START_ADDR: u32 = 11;
    const RANGE_SIZE: u32 = 12;
    const MEMORYTYPE_DEVICE: u32 = 2;

    type PointerGetAttribute = unsafe extern "C" fn(*mut c_void, u32, CuDevicePtr) -> CuResult;
    type PointerSetAttribute = unsafe extern "C" fn(*const c_void, u32, CuDevicePtr) -> CuResult;
    type MemcpyDtoH = unsafe extern "C" fn(*mut c_void, CuDevicePtr, usize) -> CuResult;
    type MemcpyHtoD = unsafe extern "C" fn(CuDevicePtr, *const c_void, usize) -> CuResult;
    type CtxSetCurrent = unsafe extern "C" fn(*mut c_void) -> CuResult;
    type MemAlloc = unsafe extern "C" fn(*mut CuDevicePtr, usize) -> CuResult;
    type MemFree = unsafe extern "C" fn(CuDevicePtr) -> CuResult;

    /// The driver: the library and the functions uroce calls.
    pub struct CudaDriver {
        _lib: libloading::Library,
        ctx: usize,
        get_attr: PointerGetAttribute,
        set_attr: PointerSetAttribute,
        dtoh: MemcpyDtoH,
        htod: MemcpyHtoD,
        set_current: CtxSetCurrent,
        mem_alloc: MemAlloc,
        mem_free: MemFree,
    }

    // SAFETY: the CUDA driver API is thread safe; `ctx` is an opaque handle
    // made current per call.
    unsafe impl Send for CudaDriver {}
    // SAFETY: as above.
    unsafe impl Sync for CudaDriver {}

    impl CudaDriver {
        /// Loads `libcuda.so.1`, initialises the driver and retains device
        /// 0's primary context.
        pub fn open() -> Result<CudaDriver, String> {
            // SAFETY: loading the CUDA driver runs its initialisers, which
            // are designed to be loaded into any process.
            let lib = unsafe { libloading::Library::new("libcuda.so.1") }
                .map_err(|e| format!("libcuda.so.1 not loadable (no NVIDIA driver): {e}"))?;
            macro_rules! sym {
                ($name:literal, $ty:ty) => {{
                    // SAFETY: the symbol has this C signature in cuda.h.
                    let s: libloading::Symbol<$ty> =
                        unsafe { lib.get($name) }.map_err(|e| format!("libcuda.so.1: {e}"))?;
                    *s
                }};
            }
            let init = sym!(b"cuInit\0", unsafe extern "C" fn(u32) -> CuResult);
            let count = sym!(b"cuDeviceGetCount\0", unsafe extern "C" fn(*mut i32) -> CuResult);
            let get = sym!(b"cuDeviceGet\0", unsafe extern "C" fn(*mut i32, i32) -> CuResult);
            let retain = sym!(b"cuDevicePrimaryCtxRetain\0", unsafe extern "C" fn(*mut *mut c_void, i32) -> CuResult);
            let d = CudaDriver {
                get_attr: sym!(b"cuPointerGetAttribute\0", PointerGetAttribute),
                set_attr: sym!(b"cuPointerSetAttribute\0", PointerSetAttribute),
                dtoh: sym!(b"cuMemcpyDtoH_v2\0", MemcpyDtoH),
                htod: sym!(b"cuMemcpyHtoD_v2\0", MemcpyHtoD),
                set_current: sym!(b"cuCtxSetCurrent\0", CtxSetCurrent),
                mem_alloc: sym!(b"cuMemAlloc_v2\0", MemAlloc),
                mem_free: sym!(b"cuMemFree_v2\0", MemFree),
                ctx: 0,
                _lib: lib,
            };
            let (mut n, mut dev, mut ctx) = (0i32, 0i32, std::ptr::null_mut());
            // SAFETY: documented driver calls with valid out-pointers.
            unsafe {
                check(init(0), "cuInit")?;
                check(count(&mut n), "cuDeviceGetCount")?;
                if n == 0 {
                    return Err("no CUDA device".into());
                }
                check(get(&mut dev, 0), "cuDeviceGet")?;
                check(retain(&mut ctx, dev), "cuDevicePrimaryCtxRetain")?;
            }
            Ok(CudaDriver { ctx: ctx as usize, ..d })
        }

        fn current(&self) {
            // SAFETY: makes the retained primary context current in this thread.
            unsafe { (self.set_current)(self.ctx as *mut c_void) };
        }

        fn attr<T: Default>(&self, attr: u32, ptr: u64) -> Option<T> {
            let mut v = T::default();
            // SAFETY: `v` has the attribute's type (u32, u64 or size_t).
            (unsafe { (self.get_attr)(&mut v as *mut T as *mut c_void, attr, ptr) } == 0).then_some(v)
        }

        /// `cuMemAlloc` (for tests and examples).
        pub fn alloc(&self, size: usize) -> Result<u64, String> {
            self.current();
            let mut p = 0u64;
            // SAFETY: valid out-pointer.
            check(unsafe { (self.mem_alloc)(&mut p, size) }, "cuMemAlloc")?;
            Ok(p)
        }

        /// `cuMemFree`.
        pub fn free(&self, ptr: u64) -> Result<(), String> {
            self.current();
            // SAFETY: a pointer from `alloc`.
            check(unsafe { (self.mem_free)(ptr) }, "cuMemFree")
        }
    }

    fn check(r: CuResult, what: &str) -> Result<(), String> {
        if r == 0 {
            Ok(())
        } else {
            Err(format!("{what} failed: CUresult {r}"))
        }
    }

    impl GpuDriver for CudaDriver {
        fn allocation(&self, addr: u64) -> Option<GpuAllocation> {
            self.current();
            if self.attr::<u32>(MEMORY_TYPE, addr)? != MEMORYTYPE_DEVICE {
                return None;
            }
            let base = self.attr::<u64>(RANGE_START_ADDR, addr)?;
            let size = self.attr::<usize>(RANGE_SIZE, addr)? as u64;
            let buffer_id = self.attr::<u64>(BUFFER_ID, addr)?;
            // Synchronous memory operations on this allocation, as
            // nv_peer_mem requires for peer DMA.
            let one = 1u32;
            // SAFETY: SYNC_MEMOPS takes a pointer to an unsigned int.
            unsafe { (self.set_attr)(&one as *const u32 as *const c_void, SYNC_MEMOPS, addr) };
            Some(GpuAllocation { base, size, buffer_id })
        }

        fn copy_to_host(&self, dst: &mut [u8], src: u64) -> PeerResult<()> {
            self.current();
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
            self.current();
            // SAFETY: `src` is a live host slice; the driver checks the range.
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

    /// A fake GPU: allocations at fake device addresses, backed by vectors.
    #[derive(Default)]
    struct MockGpu {
        allocs: Mutex<BTreeMap<u64, (u64, Vec<u8>)>>,
        next_id: AtomicUsize,
    }

    impl MockGpu {
        fn alloc(&self, base: u64, size: usize) {
            let id = self.next_id.fetch_add(1, Ordering::Relaxed) as u64 + 1;
            self.allocs.lock().unwrap().insert(base, (id, vec![0; size]));
        }
        fn free(&self, base: u64) {
            self.allocs.lock().unwrap().remove(&base);
        }
    }

    impl GpuDriver for MockGpu {
        fn allocation(&self, addr: u64) -> Option<GpuAllocation> {
            let a = self.allocs.lock().unwrap();
            let (&base, (id, mem)) = a.range(..=addr).next_back()?;
            (addr < base + mem.len() as u64).then_some(GpuAllocation { base, size: mem.len() as u64, buffer_id: *id })
        }
        fn copy_to_host(&self, dst: &mut [u8], src: u64) -> PeerResult<()> {
            let a = self.allocation(src).ok_or(libc::EFAULT)?;
            let g = self.allocs.lock().unwrap();
            let off = (src - a.base) as usize;
            dst.copy_from_slice(g[&a.base].1.get(off..off + dst.len()).ok_or(libc::EFAULT)?);
            Ok(())
        }
        fn copy_to_device(&self, dst: u64, src: &[u8]) -> PeerResult<()> {
            let a = self.allocation(dst).ok_or(libc::EFAULT)?;
            let mut g = self.allocs.lock().unwrap();
            let off = (dst - a.base) as usize;
            g.get_mut(&a.base).unwrap().1.get_mut(off..off + src.len()).ok_or(libc::EFAULT)?.copy_from_slice(src);
            Ok(())
        }
    }

    const BASE: u64 = 0x7f00_0000_0000;

    fn client() -> (Arc<MockGpu>, NvMemClient) {
        let gpu = Arc::new(MockGpu::default());
        gpu.alloc(BASE, 4 * GPU_PAGE as usize);
        gpu.alloc(BASE + 8 * GPU_PAGE, GPU_PAGE as usize);
        let c = NvMemClient::with_driver(gpu.clone(), Duration::from_secs(3600));
        (gpu, c)
    }

    #[test]
    fn acquire_claims_device_memory_of_one_allocation() {
        let (_gpu, c) = client();
        assert!(c.acquire(BASE + 100, 1000).is_some());
        assert!(c.acquire(BASE, 4 * GPU_PAGE).is_some());
        assert!(c.acquire(BASE + 3 * GPU_PAGE, 2 * GPU_PAGE).is_none(), "crosses the allocation's end");
        assert!(c.acquire(0x1000, 64).is_none(), "host memory");
        assert!(c.acquire(BASE + 5 * GPU_PAGE, 8).is_none(), "between allocations");
    }

    #[test]
    fn pages_are_64k_aligned() {
        let (_gpu, c) = client();
        let pages = |addr: u64, len: u64| {
            let mut m = c.acquire(addr, len).unwrap();
            m.get_pages(addr, len, true, Invalidator::detached(1)).unwrap();
            let n = m.dma_map().unwrap();
            m.put_pages();
            n
        };
        assert_eq!(pages(BASE + 10, 1), 1);
        assert_eq!(pages(BASE, GPU_PAGE), 1);
        assert_eq!(pages(BASE, GPU_PAGE + 1), 2);
        assert_eq!(pages(BASE + GPU_PAGE - 1, 2), 2);
        assert_eq!(c.acquire(BASE, 1).unwrap().page_size(), GPU_PAGE);
    }

    #[test]
    fn data_moves_through_the_driver_and_a_free_invalidates_once() {
        let (gpu, c) = client();
        let mut m = c.acquire(BASE, 4096).unwrap();
        let (inv, count) = Invalidator::counting(7);
        m.get_pages(BASE, 4096, true, inv).unwrap();
        m.write(BASE + 10, b"gpu bytes").unwrap();
        let mut out = [0u8; 9];
        m.read(BASE + 10, &mut out).unwrap();
        assert_eq!(&out, b"gpu bytes");
        assert_eq!(&gpu.allocs.lock().unwrap()[&BASE].1[10..19], b"gpu bytes");
        gpu.free(BASE);
        c.check_frees();
        c.check_frees();
        assert_eq!(count.load(Ordering::Relaxed), 1, "invalidated exactly once");
        assert_eq!(m.read(BASE, &mut out), Err(libc::EFAULT));
        // A new allocation at the same address has a new buffer id: still refused.
        gpu.alloc(BASE, 4096);
        assert_eq!(m.write(BASE, b"x"), Err(libc::EFAULT));
        assert_eq!(count.load(Ordering::Relaxed), 1);
    }

    #[test]
    fn load_explains_why_not() {
        match load() {
            Ok(_) => println!("libcuda and a GPU are present"),
            Err(reason) => assert!(!reason.is_empty()),
        }
    }
}
