//! PeerDirect: memory owned by a peer device (a GPU, a storage device),
//! registered with `ibv_reg_mr` like host memory and reached through the
//! peer's own client.
//!
//! This is the user-space form of MLNX OFED's `peer_memory_client` API. A
//! client ([`PeerMemoryClient`]) is registered with [`register_client`];
//! registration of an address range asks the clients in registration order
//! and the first whose `acquire` claims the whole range backs the region
//! (OFED asks peers only after pinning failed; uroce asks them first, so
//! that host memory that a client also maps is not pinned twice). The
//! acquired range ([`PeerMemory`], the OFED `client_context`) then goes
//! through `get_pages` and `dma_map`; the device moves bytes with the
//! client's `read`/`write` — the user-space stand-in for DMA to the peer's
//! BAR — in the client's page size. Deregistration calls `dma_unmap`,
//! `put_pages` and finally drops the context (`release`).
//!
//! A client that learns its memory is going away (the GPU buffer was freed)
//! calls [`Invalidator::invalidate`], the OFED invalidate callback: the
//! region stays allocated but every access through it, and through any
//! indirect key over it, fails (`REM_ACCESS_ERR` / `LOC_PROT_ERR`), until the
//! application deregisters it.
//!
//! Each client has the 8 counters of OFED's
//! `/sys/kernel/mm/memory_peers/<name>/`, published as files
//! `<runtime dir>/<pid>/memory_peers/<name>/<counter>` (see
//! `runtime::dir`), folded into the user's host-wide totals when the
//! process exits ([`host_totals`]) and shown by `uroce peers`. They change
//! together, under one lock, at these moments, so that at every moment
//! `num_alloc_mrs - num_dealloc_mrs` is the number of regions on the peer
//! and `num_reg_pages - num_dereg_pages` / `num_reg_bytes -
//! num_dereg_bytes` what is mapped (the seed's arithmetic):
//!
//! - `num_alloc_mrs` +1, `num_reg_pages` += device pages, `num_reg_bytes`
//!   += region length: after `get_pages` and `dma_map` succeed (OFED:
//!   entering MAPPED).
//! - `num_dealloc_mrs` +1, `num_dereg_pages` += the same pages,
//!   `num_dereg_bytes` += the same length: when the mapping ends, once —
//!   at deregistration (MAPPED -> UNMAPPED), or at invalidation (MAPPED ->
//!   INVALIDATED; the later deregistration adds nothing). OFED counts
//!   `num_dealloc_mrs` at the same two moments but adds the pages and
//!   bytes of an invalidated region only at its deregistration, and its
//!   pages as 0 (the SG table is already cleared), which breaks the
//!   arithmetic between the two moments and for ever after; uroce does not.
//! - `num_free_callbacks` +1 per call of the invalidate callback, even for
//!   a region already gone (as OFED).
//! - Process exit: regions still registered are unmapped by the exit (the
//!   kernel releases a dead process's umems), so the host totals count them
//!   deallocated ([`PeerStats::at_exit`]).
//!
//! Re-registration of a peer region and memory windows over it are not
//! supported (as in MLNX OFED): `rereg` fails with EOPNOTSUPP, a bind with
//! `MW_BIND_ERR`.

pub mod loader;
pub mod nv_mem;
pub mod storage;
// Internal (public with `unstable`, for the `uroce` command): they name
// the runtime directory's types. `service`: `uroce peers start|stop`;
// `totals`: the host-wide totals kept in the runtime directory (the totals
// themselves are public: [`host_totals`]).
#[cfg(feature = "unstable")]
pub mod service;
#[cfg(not(feature = "unstable"))]
pub(crate) mod service;
#[cfg(feature = "unstable")]
pub mod totals;
#[cfg(not(feature = "unstable"))]
pub(crate) mod totals;
mod stats;
pub use stats::{PeerStats, COUNTERS};
pub use totals::{host as host_totals, Host as HostTotals};

use super::error::AccessError;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, AtomicU8, Ordering};
use std::sync::{Arc, Mutex, OnceLock, RwLock, Weak};

/// An errno from a client callback.
pub type PeerResult<T> = std::result::Result<T, i32>;

/// A peer-memory client: claims address ranges it owns.
pub trait PeerMemoryClient: Send + Sync {
    /// Up to 63 bytes, used as the counters' directory name.
    fn name(&self) -> &str;
    /// Up to 15 bytes.
    fn version(&self) -> &str;
    /// The OFED `acquire`: `Some` if the client owns all of `addr..addr+size`.
    fn acquire(&self, addr: u64, size: u64) -> Option<Box<dyn PeerMemory>>;
    /// OFED's `PEER_MEM_INVALIDATE_UNMAPS`: after calling the invalidate
    /// callback the client itself unmaps and unpins; otherwise the core
    /// calls `dma_unmap` and `put_pages` at invalidation.
    fn invalidate_unmaps(&self) -> bool {
        true
    }
    /// Allocates `len` bytes of the peer's device memory (`cudaMalloc` for
    /// a GPU) and returns its device address; EOPNOTSUPP for a client that
    /// cannot allocate.
    fn alloc(&self, _len: u64) -> PeerResult<u64> {
        Err(libc::EOPNOTSUPP)
    }
    /// Frees what [`PeerMemoryClient::alloc`] returned; regions registered
    /// over it are invalidated.
    fn free(&self, _addr: u64) -> PeerResult<()> {
        Err(libc::EOPNOTSUPP)
    }
    /// Host reads of device memory (`cudaMemcpy` device to host).
    fn host_read(&self, _addr: u64, _out: &mut [u8]) -> PeerResult<()> {
        Err(libc::EOPNOTSUPP)
    }
    /// Host writes into device memory.
    fn host_write(&self, _addr: u64, _data: &[u8]) -> PeerResult<()> {
        Err(libc::EOPNOTSUPP)
    }
}

/// One acquired range (the OFED `client_context`); dropping it is `release`.
pub trait PeerMemory: Send + Sync {
    /// Pins the pages of `addr..addr+size`. `invalidator` is what the client
    /// calls when the memory goes away while registered.
    fn get_pages(&mut self, addr: u64, size: u64, write: bool, invalidator: Invalidator) -> PeerResult<()>;
    /// Maps the pinned pages for the device; returns the number of pages.
    fn dma_map(&mut self) -> PeerResult<u64>;
    /// Undoes [`PeerMemory::dma_map`].
    fn dma_unmap(&mut self);
    /// Unpins what [`PeerMemory::get_pages`] pinned.
    fn put_pages(&mut self);
    /// The peer's page size.
    fn page_size(&self) -> u64;
    /// Device reads: copies `out.len()` bytes at peer address `addr`.
    fn read(&self, addr: u64, out: &mut [u8]) -> PeerResult<()>;
    /// Device writes.
    fn write(&self, addr: u64, data: &[u8]) -> PeerResult<()>;
}

/// A registered client.
pub struct ClientEntry {
    client: Arc<dyn PeerMemoryClient>,
    /// The counters, changed together under this lock so that every
    /// snapshot obeys the seed's arithmetic (see [`PeerStats::regions`]).
    counters: Mutex<PeerStats>,
    /// Serializes publishing so that the files never go backwards.
    publishing: Mutex<()>,
    mappings: Mutex<HashMap<u64, Weak<PeerMapping>>>,
    next_context: AtomicU64,
}

impl std::fmt::Debug for ClientEntry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClientEntry").field("name", &self.client.name()).finish()
    }
}

impl ClientEntry {
    /// A snapshot of the client's counters.
    pub fn stats(&self) -> PeerStats {
        self.counters.lock().unwrap().clone()
    }

    fn count(&self, f: impl FnOnce(&mut PeerStats)) {
        f(&mut self.counters.lock().unwrap());
    }

    /// Writes the counter files (best effort: a read-only runtime directory
    /// only loses the published copy): OFED's one file per counter, then
    /// `counters` with all of them from one moment (what `uroce peers`
    /// reads).
    fn publish(&self) {
        let _g = self.publishing.lock().unwrap();
        let s = self.stats();
        let dir = ["memory_peers", s.name.as_str()];
        // What this writes outlives the process (folded into the totals).
        crate::runtime::set_keeper(totals::fold_process);
        let mut r = crate::runtime::write_process_file(&dir, "version", &format!("{}\n", s.version));
        for (name, v) in s.counters() {
            r = r.and(crate::runtime::write_process_file(&dir, name, &format!("{v}\n")));
        }
        r = r.and(crate::runtime::write_process_file(&dir, "counters", &s.to_text()));
        if let Err(e) = r {
            tracing::debug!("peer memory: cannot publish counters of {}: {e}", s.name);
        }
    }
}

/// What a client calls when registered memory goes away: the OFED
/// `invalidate_peer_memory(reg_handle, core_context)`.
#[derive(Clone)]
pub struct Invalidator {
    entry: Weak<ClientEntry>,
    core_context: u64,
    /// Unit tests of clients count calls here.
    #[cfg(test)]
    calls: Option<Arc<std::sync::atomic::AtomicUsize>>,
}

impl std::fmt::Debug for Invalidator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Invalidator").field("core_context", &self.core_context).finish()
    }
}

impl Invalidator {
    /// Revokes the region: accesses fail from now on; waits for accesses in
    /// progress. Counts a free callback even when the region is already gone.
    pub fn invalidate(&self) {
        #[cfg(test)]
        if let Some(c) = &self.calls {
            c.fetch_add(1, Ordering::Relaxed);
        }
        let Some(entry) = self.entry.upgrade() else { return };
        entry.count(|c| c.num_free_callbacks += 1);
        let mapping = entry.mappings.lock().unwrap().get(&self.core_context).and_then(Weak::upgrade);
        if let Some(m) = mapping {
            m.invalidate(&entry);
        }
        entry.publish();
    }

    /// The core's identifier of the registration (OFED's `core_context`).
    pub fn core_context(&self) -> u64 {
        self.core_context
    }

    /// An invalidator attached to no registration (client unit tests).
    #[cfg(test)]
    pub(crate) fn detached(core_context: u64) -> Invalidator {
        Invalidator { entry: Weak::new(), core_context, calls: None }
    }

    /// A detached invalidator that counts its calls.
    #[cfg(test)]
    pub(crate) fn counting(core_context: u64) -> (Invalidator, Arc<std::sync::atomic::AtomicUsize>) {
        let c = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        (Invalidator { entry: Weak::new(), core_context, calls: Some(c.clone()) }, c)
    }
}

const MAPPED: u8 = 1;
const INVALIDATED: u8 = 2;
const UNMAPPED: u8 = 3;

/// A registered peer range (OFED's peer umem).
pub struct PeerMapping {
    entry: Arc<ClientEntry>,
    mem: RwLock<Box<dyn PeerMemory>>,
    state: AtomicU8,
    /// Peer (user virtual) address of the region's first byte.
    addr: u64,
    len: u64,
    pages: u64,
    core_context: u64,
    /// Serializes read-modify-write atomics through the client.
    atomics: Mutex<()>,
    released: std::sync::atomic::AtomicBool,
}

impl Drop for PeerMapping {
    fn drop(&mut self) {
        self.release();
    }
}

impl PeerMapping {
    /// Name of the client that backs the range.
    pub fn client_name(&self) -> &str {
        self.entry.client.name()
    }

    /// Pages mapped at registration, in the client's page size.
    pub fn pages(&self) -> u64 {
        self.pages
    }

    /// The client's page size, in bytes.
    pub fn page_size(&self) -> u64 {
        self.mem.read().unwrap().page_size()
    }

    /// Whether accesses fail: the client invalidated the range, or it was
    /// deregistered.
    pub fn is_invalidated(&self) -> bool {
        self.state.load(Ordering::Acquire) != MAPPED
    }

    pub(crate) fn read(&self, off: u64, out: &mut [u8]) -> Result<(), AccessError> {
        let mem = self.mem.read().unwrap();
        if self.is_invalidated() {
            return Err(AccessError::Fault);
        }
        mem.read(self.addr + off, out).map_err(|_| AccessError::Fault)
    }

    pub(crate) fn write(&self, off: u64, data: &[u8]) -> Result<(), AccessError> {
        let mem = self.mem.read().unwrap();
        if self.is_invalidated() {
            return Err(AccessError::Fault);
        }
        mem.write(self.addr + off, data).map_err(|_| AccessError::Fault)
    }

    /// An atomic as read-modify-write through the client: atomic with
    /// respect to other RDMA atomics, not to the peer device's own writes.
    pub(crate) fn read_modify_write(&self, off: u64, next: impl FnOnce(u64) -> u64) -> Result<u64, AccessError> {
        let _g = self.atomics.lock().unwrap();
        let mut b = [0u8; 8];
        self.read(off, &mut b)?;
        let v = u64::from_ne_bytes(b);
        self.write(off, &next(v).to_ne_bytes())?;
        Ok(v)
    }

    fn invalidate(&self, entry: &ClientEntry) {
        if self.state.compare_exchange(MAPPED, INVALIDATED, Ordering::AcqRel, Ordering::Acquire).is_err() {
            return;
        }
        // Wait for accesses in progress (they hold the read lock).
        let mut mem = self.mem.write().unwrap();
        if !entry.client.invalidate_unmaps() {
            mem.dma_unmap();
            mem.put_pages();
            self.state.store(UNMAPPED, Ordering::Release);
        }
        // The mapping ends here (the client unmapped, or the core just
        // did): region, pages and bytes leave the peer together.
        self.count_unmapped(entry);
    }

    /// MAPPED -> INVALIDATED or MAPPED -> UNMAPPED: once per mapping.
    fn count_unmapped(&self, entry: &ClientEntry) {
        entry.count(|c| {
            c.num_dealloc_mrs += 1;
            c.num_dereg_pages += self.pages;
            c.num_dereg_bytes += self.len;
        });
    }

    /// Deregistration: unmap, unpin, release. Runs once (again on drop).
    pub(crate) fn release(&self) {
        if self.released.swap(true, Ordering::AcqRel) {
            return;
        }
        let entry = &self.entry;
        let mut mem = self.mem.write().unwrap();
        // An invalidated mapping was counted when it was invalidated (see
        // `count_unmapped`).
        if self.state.swap(UNMAPPED, Ordering::AcqRel) == MAPPED {
            mem.dma_unmap();
            mem.put_pages();
            self.count_unmapped(entry);
        }
        drop(mem);
        entry.mappings.lock().unwrap().remove(&self.core_context);
        entry.publish();
    }
}

impl std::fmt::Debug for PeerMapping {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PeerMapping")
            .field("client", &self.client_name())
            .field("addr", &format_args!("{:#x}", self.addr))
            .field("len", &self.len)
            .field("invalidated", &self.is_invalidated())
            .finish()
    }
}

fn clients() -> &'static Mutex<Vec<Arc<ClientEntry>>> {
    static C: OnceLock<Mutex<Vec<Arc<ClientEntry>>>> = OnceLock::new();
    C.get_or_init(Default::default)
}

/// A registered client; dropping it does not unregister (see [`unregister_client`]).
pub type ClientHandle = Arc<ClientEntry>;

/// `ib_register_peer_memory_client`: adds a client after those already
/// registered. EEXIST if a client of that name is registered.
pub fn register_client(client: Arc<dyn PeerMemoryClient>) -> crate::ib::Result<ClientHandle> {
    let name = client.name();
    if name.is_empty() || name.len() > 63 || name.contains('/') || client.version().len() > 15 {
        return Err(crate::ib::Error::inval("peer client: name must be 1..63 bytes without '/', version ≤ 15 bytes"));
    }
    let mut cs = clients().lock().unwrap();
    if cs.iter().any(|c| c.client.name() == name) {
        return Err(crate::ib::Error::new(
            crate::ib::Errno::EEXIST,
            "peer client: a client of that name is registered",
        ));
    }
    let counters = PeerStats { name: name.to_string(), version: client.version().to_string(), ..Default::default() };
    let entry = Arc::new(ClientEntry {
        client,
        counters: Mutex::new(counters),
        publishing: Mutex::new(()),
        mappings: Mutex::new(HashMap::new()),
        next_context: AtomicU64::new(0),
    });
    entry.publish();
    cs.push(entry.clone());
    Ok(entry)
}

/// `ib_unregister_peer_memory_client`: later registrations no longer ask
/// it; regions it backs keep working until deregistered.
pub fn unregister_client(name: &str) -> bool {
    let mut cs = clients().lock().unwrap();
    let before = cs.len();
    cs.retain(|c| c.client.name() != name);
    before != cs.len()
}

/// Counters of every registered client.
pub fn client_stats() -> Vec<PeerStats> {
    clients().lock().unwrap().iter().map(|c| c.stats()).collect()
}

/// Asks the clients for `addr..addr+len`; `Ok(None)` when none claims it.
pub(crate) fn acquire(addr: u64, len: u64, write: bool) -> crate::ib::Result<Option<Arc<PeerMapping>>> {
    let cs: Vec<Arc<ClientEntry>> = clients().lock().unwrap().clone();
    let stopped = service::stopped_now();
    for entry in cs {
        if stopped.contains(entry.client.name()) {
            continue; // `uroce peers stop`: not for new registrations
        }
        let Some(mut mem) = entry.client.acquire(addr, len) else { continue };
        let core_context = entry.next_context.fetch_add(1, Ordering::Relaxed) % u32::MAX as u64;
        let inv = Invalidator {
            entry: Arc::downgrade(&entry),
            core_context,
            #[cfg(test)]
            calls: None,
        };
        let errno = |e: i32, what| crate::ib::Error::new(crate::ib::Errno(e.abs()), what);
        mem.get_pages(addr, len, write, inv).map_err(|e| errno(e, "peer memory: get_pages failed"))?;
        let pages = match mem.dma_map() {
            Ok(n) => n,
            Err(e) => {
                mem.put_pages();
                return Err(errno(e, "peer memory: dma_map failed"));
            }
        };
        let mapping = Arc::new(PeerMapping {
            entry: entry.clone(),
            mem: RwLock::new(mem),
            state: AtomicU8::new(MAPPED),
            addr,
            len,
            pages,
            core_context,
            atomics: Mutex::new(()),
            released: Default::default(),
        });
        entry.mappings.lock().unwrap().insert(core_context, Arc::downgrade(&mapping));
        entry.count(|c| {
            c.num_alloc_mrs += 1;
            c.num_reg_pages += pages;
            c.num_reg_bytes += len;
        });
        entry.publish();
        return Ok(Some(mapping));
    }
    Ok(None)
}

/// Whether any client is registered (registration skips the peer path
/// entirely otherwise).
pub(crate) fn any_client() -> bool {
    !clients().lock().unwrap().is_empty()
}

/// Device memory allocated through [`alloc_memory`]: start -> (client, length).
type DeviceAllocs = std::collections::BTreeMap<u64, (Arc<dyn PeerMemoryClient>, u64)>;

fn device_allocs() -> &'static Mutex<DeviceAllocs> {
    static A: OnceLock<Mutex<DeviceAllocs>> = OnceLock::new();
    A.get_or_init(Default::default)
}

fn errno(e: i32, what: &'static str) -> crate::ib::Error {
    crate::ib::Error::new(crate::ib::Errno(e.abs()), what)
}

/// Allocates `len` bytes of device memory of the registered client named
/// `client` (the C API's `uroce_peer_alloc`): its address, registered with
/// a plain `ibv_reg_mr`, is then claimed by that client. EINVAL: `len` 0;
/// ENOENT: no registered client of that name; EOPNOTSUPP: the client does
/// not allocate; ENOMEM: the device is full.
pub fn alloc_memory(client: &str, len: u64) -> crate::ib::Result<u64> {
    if len == 0 {
        return Err(crate::ib::Error::inval("peer memory: length 0"));
    }
    let c = clients().lock().unwrap().iter().find(|c| c.client.name() == client).map(|c| c.client.clone());
    let c = c.ok_or_else(|| errno(libc::ENOENT, "peer memory: no peer-memory client of that name is loaded"))?;
    let addr = c.alloc(len).map_err(|e| errno(e, "peer memory: the client cannot allocate that"))?;
    device_allocs().lock().unwrap().insert(addr, (c, len));
    Ok(addr)
}

/// Frees an allocation of [`alloc_memory`] (EINVAL if `addr` is not one's
/// start); regions still registered over it are invalidated.
pub fn free_memory(addr: u64) -> crate::ib::Result<()> {
    let (c, _) = device_allocs()
        .lock()
        .unwrap()
        .remove(&addr)
        .ok_or_else(|| crate::ib::Error::inval("peer memory: not the start of a peer allocation"))?;
    c.free(addr).map_err(|e| errno(e, "peer memory: free failed"))
}

/// The client and allocation holding `addr..addr+len`; EFAULT otherwise.
fn holding(addr: u64, len: u64) -> crate::ib::Result<Arc<dyn PeerMemoryClient>> {
    let a = device_allocs().lock().unwrap();
    let end = addr.checked_add(len);
    match a.range(..=addr).next_back() {
        Some((&start, (c, l))) if end.is_some_and(|e| e <= start + l) => Ok(c.clone()),
        _ => Err(errno(libc::EFAULT, "peer memory: range outside every peer allocation")),
    }
}

/// Host read of device memory allocated by [`alloc_memory`].
pub fn copy_from_memory(addr: u64, out: &mut [u8]) -> crate::ib::Result<()> {
    holding(addr, out.len() as u64)?.host_read(addr, out).map_err(|e| errno(e, "peer memory: read failed"))
}

/// Host write into device memory allocated by [`alloc_memory`].
pub fn copy_to_memory(addr: u64, data: &[u8]) -> crate::ib::Result<()> {
    holding(addr, data.len() as u64)?.host_write(addr, data).map_err(|e| errno(e, "peer memory: write failed"))
}
