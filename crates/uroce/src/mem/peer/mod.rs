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
//! `/sys/kernel/mm/memory_peers/<name>/`, with the same meanings, published
//! as files `<runtime dir>/<pid>/memory_peers/<name>/<counter>` (see
//! [`crate::runtime`]) and shown by `uroce peers`.
//!
//! Re-registration of a peer region and memory windows over it are not
//! supported (as in MLNX OFED): `rereg` fails with EOPNOTSUPP, a bind with
//! `MW_BIND_ERR`.

pub mod loader;
pub mod nv_mem;
pub mod storage;

use super::AccessError;
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
}

/// One acquired range (the OFED `client_context`); dropping it is `release`.
pub trait PeerMemory: Send + Sync {
    /// Pins the pages of `addr..addr+size`. `invalidator` is what the client
    /// calls when the memory goes away while registered.
    fn get_pages(&mut self, addr: u64, size: u64, write: bool, invalidator: Invalidator) -> PeerResult<()>;
    /// Maps the pinned pages for the device; returns the number of pages.
    fn dma_map(&mut self) -> PeerResult<u64>;
    fn dma_unmap(&mut self);
    fn put_pages(&mut self);
    /// The peer's page size.
    fn page_size(&self) -> u64;
    /// Device reads: copies `out.len()` bytes at peer address `addr`.
    fn read(&self, addr: u64, out: &mut [u8]) -> PeerResult<()>;
    /// Device writes.
    fn write(&self, addr: u64, data: &[u8]) -> PeerResult<()>;
}

/// The per-client counters of OFED's `memory_peers` sysfs directory.
#[derive(Debug, Default)]
pub struct PeerCounters {
    pub num_alloc_mrs: AtomicU64,
    pub num_dealloc_mrs: AtomicU64,
    pub num_reg_pages: AtomicU64,
    pub num_dereg_pages: AtomicU64,
    pub num_reg_bytes: AtomicU64,
    pub num_dereg_bytes: AtomicU64,
    pub num_free_callbacks: AtomicU64,
}

/// A snapshot of one client's counters.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct PeerStats {
    pub name: String,
    pub version: String,
    pub num_alloc_mrs: u64,
    pub num_dealloc_mrs: u64,
    pub num_reg_pages: u64,
    pub num_dereg_pages: u64,
    pub num_reg_bytes: u64,
    pub num_dereg_bytes: u64,
    pub num_free_callbacks: u64,
}

/// Counter file names in OFED's order (after `version`).
pub const COUNTERS: [&str; 7] = [
    "num_alloc_mrs",
    "num_dealloc_mrs",
    "num_reg_pages",
    "num_dereg_pages",
    "num_reg_bytes",
    "num_dereg_bytes",
    "num_free_callbacks",
];

impl PeerStats {
    pub fn counters(&self) -> [(&'static str, u64); 7] {
        [
            (COUNTERS[0], self.num_alloc_mrs),
            (COUNTERS[1], self.num_dealloc_mrs),
            (COUNTERS[2], self.num_reg_pages),
            (COUNTERS[3], self.num_dereg_pages),
            (COUNTERS[4], self.num_reg_bytes),
            (COUNTERS[5], self.num_dereg_bytes),
            (COUNTERS[6], self.num_free_callbacks),
        ]
    }
}

/// A registered client.
pub struct ClientEntry {
    client: Arc<dyn PeerMemoryClient>,
    counters: PeerCounters,
    mappings: Mutex<HashMap<u64, Weak<PeerMapping>>>,
    next_context: AtomicU64,
}

impl std::fmt::Debug for ClientEntry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClientEntry").field("name", &self.client.name()).finish()
    }
}

impl ClientEntry {
    pub fn stats(&self) -> PeerStats {
        let c = &self.counters;
        let l = |a: &AtomicU64| a.load(Ordering::Relaxed);
        PeerStats {
            name: self.client.name().to_string(),
            version: self.client.version().to_string(),
            num_alloc_mrs: l(&c.num_alloc_mrs),
            num_dealloc_mrs: l(&c.num_dealloc_mrs),
            num_reg_pages: l(&c.num_reg_pages),
            num_dereg_pages: l(&c.num_dereg_pages),
            num_reg_bytes: l(&c.num_reg_bytes),
            num_dereg_bytes: l(&c.num_dereg_bytes),
            num_free_callbacks: l(&c.num_free_callbacks),
        }
    }

    /// Writes the counter files (best effort: a read-only runtime directory
    /// only loses the published copy).
    fn publish(&self) {
        let s = self.stats();
        let dir = ["memory_peers", s.name.as_str()];
        let mut r = crate::runtime::write_process_file(&dir, "version", &format!("{}\n", s.version));
        for (name, v) in s.counters() {
            r = r.and(crate::runtime::write_process_file(&dir, name, &format!("{v}\n")));
        }
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
        entry.counters.num_free_callbacks.fetch_add(1, Ordering::Relaxed);
        let mapping = entry.mappings.lock().unwrap().get(&self.core_context).and_then(Weak::upgrade);
        if let Some(m) = mapping {
            m.invalidate(&entry);
        }
        entry.publish();
    }

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
    pub fn client_name(&self) -> &str {
        self.entry.client.name()
    }

    /// Pages mapped at registration, in the client's page size.
    pub fn pages(&self) -> u64 {
        self.pages
    }

    pub fn page_size(&self) -> u64 {
        self.mem.read().unwrap().page_size()
    }

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
        entry.counters.num_dealloc_mrs.fetch_add(1, Ordering::Relaxed);
        // Wait for accesses in progress (they hold the read lock).
        let mut mem = self.mem.write().unwrap();
        if !entry.client.invalidate_unmaps() {
            mem.dma_unmap();
            mem.put_pages();
            self.state.store(UNMAPPED, Ordering::Release);
            entry.counters.num_dereg_pages.fetch_add(self.pages, Ordering::Relaxed);
            entry.counters.num_dereg_bytes.fetch_add(self.len, Ordering::Relaxed);
        }
    }

    /// Deregistration: unmap, unpin, release. Runs once (again on drop).
    pub(crate) fn release(&self) {
        if self.released.swap(true, Ordering::AcqRel) {
            return;
        }
        let entry = &self.entry;
        let mut mem = self.mem.write().unwrap();
        match self.state.swap(UNMAPPED, Ordering::AcqRel) {
            MAPPED => {
                mem.dma_unmap();
                mem.put_pages();
                entry.counters.num_dealloc_mrs.fetch_add(1, Ordering::Relaxed);
                entry.counters.num_dereg_pages.fetch_add(self.pages, Ordering::Relaxed);
                entry.counters.num_dereg_bytes.fetch_add(self.len, Ordering::Relaxed);
            }
            INVALIDATED => {
                // The client unmapped at invalidation; OFED adds the bytes
                // and 0 pages (the SG table is already cleared).
                entry.counters.num_dereg_bytes.fetch_add(self.len, Ordering::Relaxed);
            }
            _ => {}
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
    let entry = Arc::new(ClientEntry {
        client,
        counters: PeerCounters::default(),
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
    for entry in cs {
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
        entry.counters.num_alloc_mrs.fetch_add(1, Ordering::Relaxed);
        entry.counters.num_reg_pages.fetch_add(pages, Ordering::Relaxed);
        entry.counters.num_reg_bytes.fetch_add(len, Ordering::Relaxed);
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
