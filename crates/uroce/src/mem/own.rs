//! Pinned registrations own their pages, as a kernel device's pin does.
//!
//! A kernel device holds the pages it pinned: after the application unmaps
//! them, the device still reaches the old, orphaned pages, never memory
//! mapped later at the same address. uroce touches registered memory with the
//! CPU, so registration gives uroce its own mapping of the region's pages,
//! and every access goes through it (the application's `munmap`, `mprotect`
//! or `MAP_FIXED` over its own range then change nothing for the device):
//! - a shared mapping (a file, shmem, a memfd, SysV shm) is mapped a second
//!   time with `mremap(old_size = 0)`: the same pages, no copy;
//! - private anonymous memory (heap, anonymous `mmap`; never a stack:
//!   [`super::stacks`]) has no second
//!   name, so registration gives it one: its pages are copied into a memfd,
//!   which is mapped `MAP_SHARED | MAP_FIXED` over the application's range
//!   and at uroce's address. Writes of other threads are held meanwhile
//!   ([`super::safe::hold_writes`]: the range is read-only, a write faults,
//!   waits in the fault handler and then lands in the new pages); a write
//!   the kernel makes for the application in that window (`read(2)` into
//!   the buffer) fails with EFAULT. When the last registration using such a
//!   memfd goes, the application's range gets private memory back the same
//!   way, where it still maps the memfd.
//! - anything else (private file mappings, hugetlb, device memory) is not
//!   owned: [`take`] answers `None` and the region is reached through the
//!   application's address, as before (documented in the README).
//!
//! uroce's mappings are `MADV_DONTFORK`. A child of `fork` gets private
//! copies of the application's moved ranges (a `pthread_atfork` handler
//! makes them, as the kernel copies pinned pages at fork), so parent and
//! child never share pages the application thought private.

use super::maps::{self, Vma};
use crate::ib::{Errno, Error, Result};
use std::cell::UnsafeCell;
use std::sync::{Arc, Mutex, Once, Weak};

/// `mmap`, `mremap` and `munmap` by system call, not through libc's
/// wrappers: libraries that watch an application's memory (UCX's `ucm`,
/// libfabric's `memhooks`) patch those wrappers and take every call for the
/// application's own, and may call back into the verbs library from inside
/// it. uroce's remaps of a registered range change no byte the application
/// sees, so such a library must not hear of them. Through the wrappers, MPI
/// over UCX with UCX's registration cache on died in its 1 MiB round every
/// time (the buffer's first pages left mapped read-only from uroce's memfd:
/// a SIGSEGV in the application's own `memset`, or EFAULT from
/// `ibv_reg_mr`); by system call it passes (`tests/mpi.rs`). Which of UCX's
/// callbacks undid the move is not traced. Same arguments, results and
/// errno as the wrappers.
mod sys {
    use libc::{c_int, c_long, c_void, off_t, size_t};

    fn ptr(r: c_long) -> *mut c_void {
        if r == -1 {
            libc::MAP_FAILED
        } else {
            r as *mut c_void
        }
    }

    /// SAFETY: as `libc::mmap`.
    pub unsafe fn mmap(addr: *mut c_void, len: size_t, prot: c_int, flags: c_int, fd: c_int, off: off_t) -> *mut c_void {
        // SAFETY: the caller's contract is mmap(2)'s.
        ptr(unsafe { libc::syscall(libc::SYS_mmap, addr, len, prot, flags, fd, off) })
    }

    /// SAFETY: as `libc::mremap` with a new address.
    pub unsafe fn mremap(old: *mut c_void, old_len: size_t, new_len: size_t, flags: c_int, new: *mut c_void) -> *mut c_void {
        // SAFETY: the caller's contract is mremap(2)'s.
        ptr(unsafe { libc::syscall(libc::SYS_mremap, old, old_len, new_len, flags, new) })
    }

    /// SAFETY: as `libc::munmap`.
    pub unsafe fn munmap(addr: *mut c_void, len: size_t) -> c_int {
        // SAFETY: the caller's contract is munmap(2)'s.
        unsafe { libc::syscall(libc::SYS_munmap, addr, len) as c_int }
    }
}

/// uroce's own mapping of a pinned registration's pages.
pub struct Owned {
    /// uroce's mapping, `len` bytes: the pages of `app..app + len`.
    mine: usize,
    app: usize,
    len: usize,
    /// The memfds behind the range that uroce made (moved private memory),
    /// held so that the application's memory is given back after the last
    /// registration that uses them. Emptied by [`Owned::give_back`] when the
    /// registration goes, on the deregistering thread: never later.
    pieces: Mutex<Vec<Arc<Moved>>>,
    pid: u32,
}

impl std::fmt::Debug for Owned {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Owned")
            .field("mine", &format_args!("{:#x}", self.mine))
            .field("app", &format_args!("{:#x}", self.app))
            .field("len", &self.len)
            .field("moved", &self.pieces.lock().map_or(0, |p| p.len()))
            .finish()
    }
}

impl Owned {
    /// uroce's address of the application's `addr` (inside the range).
    pub fn host(&self, addr: usize) -> usize {
        self.mine + (addr - self.app)
    }

    /// Gives the application's range back to it where this was the last
    /// registration using the memory uroce moved (private memory again,
    /// with its bytes). Deregistration calls it before it returns: the
    /// application may then unmap the range and map something else there,
    /// which must never be replaced by a give-back that runs later (when
    /// another thread drops the last reference to the region). uroce's own
    /// mapping stays until `self` is dropped.
    pub fn give_back(&self) {
        let pieces = std::mem::take(&mut *self.pieces.lock().unwrap());
        drop(pieces);
    }

    #[cfg(feature = "unstable")]
    /// The application's address of uroce's `host` (inside the range).
    pub fn app_address(&self, host: usize) -> usize {
        self.app + (host - self.mine)
    }
}

impl Drop for Owned {
    fn drop(&mut self) {
        if std::process::id() != self.pid {
            // A forked child: the mapping was not inherited (DONTFORK).
            return;
        }
        // SAFETY: our own reservation; nothing reaches it once the region is
        // gone (the region holds the only reference).
        unsafe { sys::munmap(self.mine as *mut libc::c_void, self.len) };
    }
}

/// Private memory that registration moved into memfd `ino`, at
/// `at..at + len` of the application's space.
struct Moved {
    at: usize,
    len: usize,
    ino: u64,
    pid: u32,
}

impl Drop for Moved {
    fn drop(&mut self) {
        if std::process::id() != self.pid {
            return;
        }
        let _fork = ForkLock::take();
        give_back(self.at, self.len, self.ino);
        registry().lock().unwrap().retain(|(_, w)| w.strong_count() > 0);
    }
}

/// Live moved ranges, for `fork` and for registrations that overlap them.
/// Only touched under [`ForkLock`].
/// Each entry with its memfd's inode, so that a lookup upgrades only the
/// one it takes (an upgraded reference dropped under the lock could be the
/// last, whose `Drop` takes the lock again).
fn registry() -> &'static Mutex<Vec<(u64, Weak<Moved>)>> {
    static R: Mutex<Vec<(u64, Weak<Moved>)>> = Mutex::new(Vec::new());
    &R
}

/// Serializes moves of memory with `fork`: the atfork prepare handler takes
/// it, so a child never sees a range half moved.
struct ForkLock;

struct RawMutex(UnsafeCell<libc::pthread_mutex_t>);
// SAFETY: a pthread mutex is made to be shared between threads.
unsafe impl Sync for RawMutex {}
static FORK_MUTEX: RawMutex = RawMutex(UnsafeCell::new(libc::PTHREAD_MUTEX_INITIALIZER));

impl ForkLock {
    fn take() -> ForkLock {
        install_atfork();
        // SAFETY: a static, initialized mutex.
        unsafe { libc::pthread_mutex_lock(FORK_MUTEX.0.get()) };
        ForkLock
    }
}

impl Drop for ForkLock {
    fn drop(&mut self) {
        // SAFETY: locked by `take` in this thread.
        unsafe { libc::pthread_mutex_unlock(FORK_MUTEX.0.get()) };
    }
}

fn install_atfork() {
    static ONCE: Once = Once::new();
    extern "C" fn prepare() {
        // SAFETY: a static, initialized mutex; released in `parent`/`child`.
        unsafe { libc::pthread_mutex_lock(FORK_MUTEX.0.get()) };
    }
    extern "C" fn parent() {
        // SAFETY: locked by `prepare` in this thread.
        unsafe { libc::pthread_mutex_unlock(FORK_MUTEX.0.get()) };
    }
    extern "C" fn child() {
        // The only thread of the child; the parent's threads are gone, so
        // nobody else holds the registry (every user holds the fork lock).
        if let Ok(reg) = registry().try_lock() {
            for m in reg.iter().filter_map(|(_, w)| w.upgrade()) {
                // (Its Drop does nothing in the child: another pid.)
                give_back(m.at, m.len, m.ino);
            }
        }
        // SAFETY: re-initializing the child's copy of the mutex, locked by
        // `prepare` in the parent's thread that is this one now.
        unsafe { *FORK_MUTEX.0.get() = libc::PTHREAD_MUTEX_INITIALIZER };
    }
    // SAFETY: registering three functions that only take the mutex and
    // remap memory.
    ONCE.call_once(|| unsafe {
        libc::pthread_atfork(Some(prepare), Some(parent), Some(child));
    });
}

fn os_err(what: &str) -> Error {
    errno_err(what, std::io::Error::last_os_error().raw_os_error().unwrap_or(libc::EFAULT))
}

fn errno_err(what: &str, errno: i32) -> Error {
    Error::new(Errno(errno), format!("reg_mr: {what}: {}", std::io::Error::from_raw_os_error(errno)))
}

fn errno() -> i32 {
    std::io::Error::last_os_error().raw_os_error().unwrap_or(libc::EFAULT)
}

/// Private anonymous memory uroce may move into a memfd, `from` up (`below`:
/// the mapping under `v`, if any). Never a stack: the main thread's
/// (`[stack]`), the one this thread runs on, nor another thread's
/// ([`super::stacks`]) — while the range is read-only for the copy, the
/// thread's next push would fault, and the fault handler itself needs that
/// stack (the process died with SIGSEGV registering a buffer on the stack).
/// Such a region is not owned: it follows the application's address space,
/// as before.
fn movable(v: &Vma, below: Option<&Vma>, from: u64) -> bool {
    let here = 0u8;
    let sp = std::ptr::addr_of!(here) as u64;
    !v.shared
        && v.inode == 0
        && !(v.lo..v.hi).contains(&sp)
        && (v.name.is_empty() || v.name == "[heap]" || v.name.starts_with("[anon:"))
        && !super::stacks::is_thread_stack(v, below, from)
}

/// Takes ownership of the pages of `addr..addr + len` (see the module
/// docs): `Ok(None)` when the memory is of a kind uroce cannot own (the
/// region then follows the application's address space).
pub(crate) fn take(addr: usize, len: u64) -> Result<Option<Owned>> {
    let page = super::odp::page_size() as usize;
    let len = usize::try_from(len).map_err(|_| Error::inval("reg_mr: length"))?;
    let app = addr / page * page;
    let end = addr.checked_add(len).ok_or_else(|| Error::inval("reg_mr: range wraps"))?.div_ceil(page) * page;
    let n = end - app;
    let _fork = ForkLock::take();
    // With the mapping under the first: a thread stack's guard, if it is one.
    let Ok((below, vmas)) = maps::vmas_and_below(app as u64, end as u64) else { return Ok(None) };
    // Everything must be ownable, without holes, before anything changes.
    let mut at = app as u64;
    for (i, v) in vmas.iter().enumerate() {
        let under = if i == 0 { below.as_ref() } else { vmas.get(i - 1) };
        if v.lo > at || !(v.shared || movable(v, under, at)) {
            return Ok(None);
        }
        at = v.hi;
    }
    if at < end as u64 {
        return Ok(None);
    }
    // SAFETY: a fresh reservation chosen by the kernel, checked below.
    let mine = unsafe {
        sys::mmap(
            std::ptr::null_mut(),
            n,
            libc::PROT_NONE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
            -1,
            0,
        )
    };
    if mine == libc::MAP_FAILED {
        return Err(os_err("reserving address space"));
    }
    let mut owned = Owned { mine: mine as usize, app, len: n, pieces: Mutex::new(Vec::new()), pid: std::process::id() };
    let filled = fill(&mut owned, &vmas, end);
    drop(_fork);
    // On failure `owned` is dropped here, outside the lock: what it moved
    // is given back.
    match filled {
        Ok(true) => {
            // SAFETY: our reservation; DONTFORK keeps it out of children.
            unsafe { libc::madvise(owned.mine as *mut libc::c_void, n, libc::MADV_DONTFORK) };
            Ok(Some(owned))
        }
        Ok(false) => Ok(None),
        Err(e) => Err(e),
    }
}

/// Maps every piece of `vmas` into `owned`'s reservation; false when one
/// cannot be owned. Called under the fork lock.
fn fill(owned: &mut Owned, vmas: &[Vma], end: usize) -> Result<bool> {
    let (app, mine) = (owned.app, owned.mine);
    let mut reg = registry().lock().unwrap();
    for v in vmas {
        let (lo, hi) = ((v.lo as usize).max(app), (v.hi as usize).min(end));
        let dst = mine + (lo - app);
        let ours = v.shared && v.name.contains("uroce-mr");
        let live = ours.then(|| reg.iter().find(|(ino, _)| *ino == v.inode).and_then(|(_, w)| w.upgrade())).flatten();
        // A memfd of ours whose registrations are all gone (its memory is
        // being given back) is moved again, into a memfd of its own.
        if v.shared && (!ours || live.is_some()) {
            // SAFETY: a second mapping of a shared mapping's pages, placed
            // inside our own reservation.
            let p = unsafe {
                sys::mremap(
                    lo as *mut libc::c_void,
                    0,
                    hi - lo,
                    libc::MREMAP_MAYMOVE | libc::MREMAP_FIXED,
                    dst as *mut libc::c_void,
                )
            };
            if p == libc::MAP_FAILED {
                // Device memory, hugetlb...: not ours to own.
                return Ok(false);
            }
            owned.pieces.get_mut().unwrap().extend(live);
        } else {
            let m = move_private(lo, hi - lo, v.prot, dst)?;
            reg.push((m.ino, Arc::downgrade(&m)));
            owned.pieces.get_mut().unwrap().push(m);
        }
    }
    Ok(true)
}

/// Moves the private pages `lo..lo + n` (protection `prot`) into a new
/// memfd mapped at `lo` and at `dst` (inside our reservation).
fn move_private(lo: usize, n: usize, prot: i32, dst: usize) -> Result<Arc<Moved>> {
    // SAFETY: memfd_create with a static name; the descriptor is ours.
    let fd = unsafe { libc::memfd_create(c"uroce-mr".as_ptr(), libc::MFD_CLOEXEC) };
    if fd < 0 {
        return Err(os_err("memfd_create"));
    }
    // SAFETY: our descriptor.
    let fd = unsafe { <std::os::fd::OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(fd) };
    let raw = std::os::fd::AsRawFd::as_raw_fd(&fd);
    // SAFETY: all-zero is a valid `stat`; fstat fills it.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: our descriptor, our buffer.
    if unsafe { libc::ftruncate(raw, n as libc::off_t) } != 0 || unsafe { libc::fstat(raw, &mut st) } != 0 {
        return Err(os_err("sizing a memfd"));
    }
    let shared = |at: usize, prot: i32| {
        // SAFETY: MAP_FIXED over `at`: our reservation, or the application's
        // range whose contents are copied there first (see below).
        unsafe {
            sys::mmap(at as *mut libc::c_void, n, prot, libc::MAP_SHARED | libc::MAP_FIXED | libc::MAP_POPULATE, raw, 0)
        }
    };
    // Pages allocated at once (cheaper than one fault per page in the copy).
    // SAFETY: our descriptor.
    unsafe { libc::fallocate(raw, 0, 0, n as libc::off_t) };
    if shared(dst, libc::PROT_READ | libc::PROT_WRITE) == libc::MAP_FAILED {
        return Err(os_err("mapping a memfd"));
    }
    let writes = prot & libc::PROT_WRITE != 0;
    // From here to `drop(held)`: no allocation, no lock that a thread whose
    // write is held may hold.
    let held = match writes {
        true => match hold(lo, n) {
            Some(h) => Some(h),
            None => return Err(Error::new(Errno::EAGAIN, "reg_mr: too many registrations moving memory at once")),
        },
        false => None,
    };
    // SAFETY: the application's range, made read-only for the copy (writes
    // that fault wait for `held` to go), copied fault-tolerantly (it may be
    // unmapped meanwhile) into our mapping of the memfd, then replaced by
    // the memfd; on failure it gets its protection back.
    let failed = unsafe {
        if writes && libc::mprotect(lo as *mut libc::c_void, n, prot & !libc::PROT_WRITE) != 0 {
            Some(("mprotect", errno()))
        } else if super::safe::copy(dst as *mut u8, lo as *const u8, n) != 0 {
            Some(("the memory changed during registration", libc::EFAULT))
        } else if shared(lo, prot) == libc::MAP_FAILED {
            Some(("mapping a memfd over the region", errno()))
        } else {
            None
        }
    };
    if failed.is_some() && writes {
        // SAFETY: giving the range back its protection.
        unsafe { libc::mprotect(lo as *mut libc::c_void, n, prot) };
    }
    drop(held);
    if let Some((what, e)) = failed {
        return Err(errno_err(what, e));
    }
    // uroce's mapping gets the application's protection: a read-only
    // registration stays read-only (`rereg` checks it for write access).
    // SAFETY: our mapping of the memfd.
    unsafe { libc::mprotect(dst as *mut libc::c_void, n, prot) };
    Ok(Arc::new(Moved { at: lo, len: n, ino: st.st_ino, pid: std::process::id() }))
}

/// A slot holding writes to `lo..lo + n`, waiting up to a second for one of
/// the 16 to be free (other threads moving memory at the same moment).
fn hold(lo: usize, n: usize) -> Option<super::safe::HeldWrites> {
    let t = std::time::Instant::now();
    loop {
        if let Some(h) = super::safe::hold_writes(lo, n) {
            return Some(h);
        }
        if t.elapsed() > std::time::Duration::from_secs(1) {
            return None;
        }
        std::thread::yield_now();
    }
}

/// Gives the application private memory again where `at..at + len` still
/// maps memfd `ino` (with the same contents). Called under the fork lock.
fn give_back(at: usize, len: usize, ino: u64) {
    let Ok(vmas) = maps::vmas(at as u64, (at + len) as u64) else { return };
    for v in vmas.iter().filter(|v| v.shared && v.inode == ino && v.name.contains("uroce-mr")) {
        let (lo, hi) = ((v.lo as usize).max(at), (v.hi as usize).min(at + len));
        privatize(lo, hi - lo, v.prot);
    }
}

/// Replaces `lo..lo + n` by private anonymous memory with the same bytes
/// and protection `prot`.
fn privatize(lo: usize, n: usize, prot: i32) {
    // SAFETY: a fresh private mapping chosen by the kernel, checked.
    let tmp = unsafe {
        sys::mmap(
            std::ptr::null_mut(),
            n,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
            0,
        )
    };
    if tmp == libc::MAP_FAILED {
        return;
    }
    let writes = prot & libc::PROT_WRITE != 0;
    let held = if writes { hold(lo, n) } else { None };
    if writes && held.is_none() {
        // SAFETY: our temporary mapping.
        unsafe { sys::munmap(tmp, n) };
        tracing::warn!(lo, n, "dereg_mr: the range stays in uroce's memfd (no hold slot free for a second)");
        return;
    }
    // SAFETY: see `move_private`: read-only while copied, writers held.
    let ok = (!writes || unsafe { libc::mprotect(lo as *mut libc::c_void, n, prot & !libc::PROT_WRITE) } == 0)
        // SAFETY: our temporary mapping and the application's range, fault-tolerant.
        && unsafe { super::safe::copy(tmp as *mut u8, lo as *const u8, n) } == 0
        // SAFETY: our temporary mapping.
        && unsafe { libc::mprotect(tmp, n, prot) } == 0;
    // SAFETY: moving our temporary mapping over the range it copies.
    let moved = ok
        && unsafe {
            sys::mremap(tmp, n, n, libc::MREMAP_MAYMOVE | libc::MREMAP_FIXED, lo as *mut libc::c_void)
        } != libc::MAP_FAILED;
    if !moved {
        tracing::warn!(lo, n, "dereg_mr: the range stays in uroce's memfd (it changed during the copy back)");
        // SAFETY: our temporary mapping; the range keeps the memfd.
        unsafe {
            sys::munmap(tmp, n);
            if writes {
                libc::mprotect(lo as *mut libc::c_void, n, prot);
            }
        }
    }
    drop(held);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn anon(n: usize) -> usize {
        // SAFETY: a fresh private mapping, checked.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                n,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        assert_ne!(p, libc::MAP_FAILED);
        p as usize
    }

    #[test]
    fn owned_pages_outlive_the_application_mapping() {
        super::super::safe::install();
        let n = 3 * 4096;
        let a = anon(n);
        // SAFETY: our mapping.
        unsafe { std::ptr::write_bytes(a as *mut u8, 0x5a, n) };
        let o = take(a + 10, (n - 20) as u64).unwrap().expect("anonymous memory is owned");
        let mine = o.host(a + 10);
        // SAFETY: uroce's mapping and the application's: the same pages.
        unsafe {
            assert_eq!(*(mine as *const u8), 0x5a);
            *(a as *mut u8).add(100) = 7;
            assert_eq!(*((o.host(a) + 100) as *const u8), 7, "the application's writes reach uroce");
            *((o.host(a) + 200) as *mut u8) = 9;
            assert_eq!(*(a as *const u8).add(200), 9, "and uroce's the application");
            // Unmapped and mapped again: uroce keeps the old pages.
            libc::munmap(a as *mut libc::c_void, n);
            let b = libc::mmap(
                a as *mut libc::c_void,
                n,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_FIXED,
                -1,
                0,
            );
            assert_eq!(b as usize, a);
            *((o.host(a) + 300) as *mut u8) = 1;
            assert_eq!(*(a as *const u8).add(300), 0, "the new mapping is untouched");
            assert_eq!(*((o.host(a) + 100) as *const u8), 7, "uroce still reaches the old pages");
        }
        drop(o);
        // SAFETY: our mapping.
        unsafe { libc::munmap(a as *mut libc::c_void, n) };
    }

    #[test]
    fn deregistration_gives_private_memory_back() {
        let n = 2 * 4096;
        let a = anon(n);
        // SAFETY: our mapping.
        unsafe { std::ptr::write_bytes(a as *mut u8, 3, n) };
        let o = take(a, n as u64).unwrap().unwrap();
        let o2 = take(a + 4096, 4096).unwrap().unwrap();
        let v = maps::vmas(a as u64, (a + n) as u64).unwrap();
        assert!(v.iter().all(|v| v.shared && v.name.contains("uroce-mr")), "{v:?}");
        drop(o);
        let v = maps::vmas(a as u64, (a + n) as u64).unwrap();
        assert!(v.iter().all(|v| v.shared), "another registration still uses the memfd: {v:?}");
        drop(o2);
        let v = maps::vmas(a as u64, (a + n) as u64).unwrap();
        assert!(v.iter().all(|v| !v.shared && v.inode == 0), "{v:?}");
        // SAFETY: our mapping, private again with its bytes.
        unsafe {
            assert_eq!(*(a as *const u8).add(n - 1), 3);
            libc::munmap(a as *mut libc::c_void, n);
        }
    }

    /// A writer thread keeps writing while its memory is registered and
    /// deregistered again and again: no write is lost (writes during a move
    /// wait in the fault handler, then land in the new pages).
    #[test]
    fn concurrent_writes_survive_the_moves() {
        use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
        let n = 4 * 4096;
        let a = anon(n);
        let stop = Arc::new(AtomicBool::new(false));
        let last = Arc::new(AtomicU64::new(0));
        let w = {
            let (stop, last) = (stop.clone(), last.clone());
            std::thread::spawn(move || {
                let mut i = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    i += 1;
                    for page in 0..4 {
                        // SAFETY: our mapping (moved under us, never unmapped).
                        unsafe { std::ptr::write_volatile((a + page * 4096 + 8) as *mut u64, i) };
                    }
                    last.store(i, Ordering::Release);
                }
            })
        };
        for _ in 0..200 {
            let o = take(a + 100, (n - 200) as u64).unwrap().unwrap();
            let seen = last.load(Ordering::Acquire);
            for page in 0..4 {
                // SAFETY: uroce's mapping of the pages.
                let v = unsafe { std::ptr::read_volatile((o.host(a) + page * 4096 + 8) as *const u64) };
                assert!(v >= seen, "page {page}: {v} < {seen}: a write was lost in the move");
            }
            drop(o);
        }
        stop.store(true, Ordering::Relaxed);
        w.join().unwrap();
        let seen = last.load(Ordering::Acquire);
        for page in 0..4 {
            // SAFETY: our mapping.
            assert_eq!(unsafe { *((a + page * 4096 + 8) as *const u64) }, seen);
        }
        // SAFETY: our mapping.
        unsafe { libc::munmap(a as *mut libc::c_void, n) };
    }

    /// A buffer on another thread's stack, which that thread keeps writing
    /// (its frames below the buffer share the buffer's first page): never
    /// moved, so the thread never faults where it has no stack for the
    /// handler. Before `mem::stacks`, `take` moved it.
    #[test]
    fn another_threads_stack_is_not_moved() {
        use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
        #[inline(never)]
        fn push(i: u64) -> u64 {
            let mut frame = [i; 64];
            std::hint::black_box(&mut frame)[7] ^= 1;
            frame[7]
        }
        super::super::safe::install();
        let (addr, stop) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicBool::new(false)));
        let t = {
            let (addr, stop) = (addr.clone(), stop.clone());
            std::thread::spawn(move || {
                let mut buf = [0u8; 3 * 4096];
                addr.store(buf.as_mut_ptr() as usize, Ordering::Release);
                let mut i = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    i = push(i);
                    std::hint::black_box(&mut buf)[5000] = i as u8;
                }
                i
            })
        };
        let a = loop {
            match addr.load(Ordering::Acquire) {
                0 => std::thread::yield_now(),
                a => break a,
            }
        };
        let moved = (0..100).filter(|_| take(a, 3 * 4096).unwrap().is_some()).count();
        stop.store(true, Ordering::Relaxed);
        t.join().unwrap();
        assert_eq!(moved, 0, "a thread's stack was moved");
    }

    /// `rereg` onto a new range: the new range's pages are owned, the old
    /// range is private memory again.
    #[test]
    fn rereg_owns_the_new_range_and_gives_the_old_back() {
        use crate::ib::Access;
        use crate::mem::{Memory, Rereg, Translation, Want};
        let (a, b) = (anon(2 * 4096), anon(2 * 4096));
        let mem = Memory::default();
        let rw = Access::LOCAL_WRITE | Access::REMOTE_WRITE | Access::REMOTE_READ;
        // SAFETY: the mappings outlive the region (b is replaced on purpose).
        let mr = unsafe { mem.register(1, a, 8192, a as u64, rw, None) }.unwrap();
        let t = Translation { addr: b, len: 8192, iova: b as u64, owner: None };
        // SAFETY: as above.
        let mr2 = unsafe { mem.rereg(mr.key, Rereg { translation: Some(t), ..Default::default() }) }.unwrap();
        drop(mr);
        let v = maps::vmas(a as u64, (a + 8192) as u64).unwrap();
        assert!(v.iter().all(|v| !v.shared), "the old range is private again: {v:?}");
        // The application maps new memory over the new range: a remote
        // WRITE through the key reaches the old pages, not the new mapping.
        // SAFETY: MAP_FIXED over our own mapping.
        let p = unsafe {
            libc::mmap(
                b as *mut libc::c_void,
                8192,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_FIXED,
                -1,
                0,
            )
        };
        assert_eq!(p as usize, b);
        assert!(mem.write_remote(mr2.key, 1, 1, b as u64 + 10, &[9u8; 100]).unwrap());
        // SAFETY: the new mapping.
        assert!(unsafe { std::slice::from_raw_parts(b as *const u8, 8192) }.iter().all(|&x| x == 0));
        let span = mem.resolve(mr2.key, 1, b as u64 + 10, 100, Want::LocalRead).unwrap();
        let mut back = [0u8; 100];
        span.read(0, &mut back).unwrap();
        assert_eq!(back, [9u8; 100]);
        drop(span);
        mem.deregister(mr2.key).unwrap();
        // SAFETY: our mappings.
        unsafe {
            libc::munmap(a as *mut libc::c_void, 8192);
            libc::munmap(b as *mut libc::c_void, 8192);
        }
    }
}
