//! The ODP invalidation notifier never makes `munmap` wait on the allocator.
//!
//! The kernel holds a thread in `munmap` of watched memory until the
//! notifier's reader thread has read the event, and the reader reads under
//! the notifier's ring lock. If anything that holds the ring lock allocates,
//! and the unmapping thread holds the allocator's lock (glibc trims its heap
//! with `brk`/`madvise`/`munmap` under its arena lock), nothing moves again.
//!
//! This binary's global allocator has a stand-in for that arena lock: while
//! the "unmapping" thread holds it, every allocation or free on another
//! thread waits, as it would for glibc's arena. The test holds the stand-in,
//! lets a thread drain the notifier (which must not allocate while it holds
//! the ring lock) and unmaps watched ODP memory. A watchdog lets the stand-in
//! go after a few seconds, so a deadlock fails the test instead of hanging it.
//! It is the only test of its binary: the stand-in stops every thread.

#[macro_use]
mod skip;

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use uroce::ib::Access;
use uroce::mem::{Advice, Memory};

/// The stand-in for the allocator's arena lock.
static ARENA_HELD: AtomicBool = AtomicBool::new(false);
/// The draining thread is waiting in the allocator for the stand-in.
static DRAINER_WAITING: AtomicBool = AtomicBool::new(false);

thread_local! {
    /// This thread holds the stand-in (its own allocations go through).
    static HOLDER: Cell<bool> = const { Cell::new(false) };
    /// This thread is the one draining the notifier.
    static DRAINER: Cell<bool> = const { Cell::new(false) };
}

struct ArenaAlloc;

impl ArenaAlloc {
    fn arena(&self) {
        if !ARENA_HELD.load(Ordering::Acquire) || HOLDER.try_with(Cell::get).unwrap_or(false) {
            return;
        }
        let drainer = DRAINER.try_with(Cell::get).unwrap_or(false);
        if drainer {
            DRAINER_WAITING.store(true, Ordering::Release);
        }
        while ARENA_HELD.load(Ordering::Acquire) {
            std::hint::spin_loop();
            // SAFETY: sched_yield has no preconditions.
            unsafe { libc::sched_yield() };
        }
        if drainer {
            DRAINER_WAITING.store(false, Ordering::Release);
        }
    }
}

// SAFETY: forwards to the system allocator; the wait before it touches no
// allocator state.
unsafe impl GlobalAlloc for ArenaAlloc {
    unsafe fn alloc(&self, l: Layout) -> *mut u8 {
        self.arena();
        // SAFETY: the caller's contract, passed on.
        unsafe { System.alloc(l) }
    }
    unsafe fn alloc_zeroed(&self, l: Layout) -> *mut u8 {
        self.arena();
        // SAFETY: as above.
        unsafe { System.alloc_zeroed(l) }
    }
    unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
        self.arena();
        // SAFETY: as above.
        unsafe { System.dealloc(p, l) }
    }
    unsafe fn realloc(&self, p: *mut u8, l: Layout, n: usize) -> *mut u8 {
        self.arena();
        // SAFETY: as above.
        unsafe { System.realloc(p, l, n) }
    }
}

#[global_allocator]
static GLOBAL: ArenaAlloc = ArenaAlloc;

const PAGE: usize = 4096;
const PAGES: usize = 16;
const WATCHDOG: Duration = Duration::from_secs(5);

fn map(len: usize) -> usize {
    // SAFETY: a fresh anonymous mapping, checked below.
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
            0,
        )
    };
    assert_ne!(p, libc::MAP_FAILED);
    p as usize
}

/// Waits (bounded) until `f` holds, without allocating.
fn wait_until(deadline: Instant, f: impl Fn() -> bool) -> bool {
    while !f() {
        if Instant::now() > deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    true
}

#[test]
fn munmap_of_watched_memory_while_the_allocator_is_held_does_not_deadlock() {
    if !uroce::mem::odp::notifier_available() {
        skip!("no userfaultfd in this kernel or sandbox (vm.unprivileged_userfaultfd=0 without CAP_SYS_PTRACE)");
    }
    let mem = Memory::new();
    let len = PAGES * PAGE;
    let addr = map(len);
    let access = Access::ON_DEMAND | Access::LOCAL_WRITE | Access::REMOTE_WRITE;
    // SAFETY: ODP memory needs no validity promise.
    let mr = unsafe { mem.register(1, addr, len as u64, addr as u64, access, None) }.unwrap();
    let sge = uroce::ib::Sge { addr: addr as u64, length: len as u32, lkey: mr.key };
    // The device maps every page, and the notifier watches the range.
    mem.advise(1, Advice::PrefetchWrite, true, &[sge]).unwrap();
    assert_eq!(mem.odp_stats().page_prefetch, PAGES as u64);
    // One event waits in the ring (MADV_DONTNEED returns once the reader
    // has read it), so the next drain has something to take out of it.
    // SAFETY: our own mapping; nothing references its contents.
    assert_eq!(unsafe { libc::madvise(addr as *mut libc::c_void, PAGE, libc::MADV_DONTNEED) }, 0);

    // Both threads start (thread start-up allocates) before the stand-in is
    // taken, then wait for their turn.
    let go_drain = Arc::new(AtomicBool::new(false));
    let go_unmap = Arc::new(AtomicBool::new(false));
    let unmapped = Arc::new(AtomicBool::new(false));
    let (mem2, go) = (Arc::clone(&mem), Arc::clone(&go_drain));
    let drainer = std::thread::spawn(move || {
        DRAINER.with(|d| d.set(true));
        while !go.load(Ordering::Acquire) {
            std::thread::sleep(Duration::from_millis(1));
        }
        mem2.odp_stats()
    });
    let (go, flag) = (Arc::clone(&go_unmap), Arc::clone(&unmapped));
    let unmapper = std::thread::spawn(move || {
        // The "arena holder": its own allocations go through.
        HOLDER.with(|h| h.set(true));
        while !go.load(Ordering::Acquire) {
            std::thread::sleep(Duration::from_millis(1));
        }
        // SAFETY: our own mapping; nothing references it any more.
        let r = unsafe { libc::munmap(addr as *mut libc::c_void, len) };
        flag.store(r == 0, Ordering::Release);
    });
    // Give both threads time to finish starting (they allocate on the way).
    std::thread::sleep(Duration::from_millis(100));

    // From here on, other threads' allocations wait for the stand-in.
    HOLDER.with(|h| h.set(true));
    ARENA_HELD.store(true, Ordering::Release);
    go_drain.store(true, Ordering::Release);
    // The drainer reaches its first allocation (inside the ring lock before
    // the fix; after the ring lock since); then the holder unmaps watched
    // memory.
    let reached = wait_until(Instant::now() + WATCHDOG, || DRAINER_WAITING.load(Ordering::Acquire));
    go_unmap.store(true, Ordering::Release);
    let returned = wait_until(Instant::now() + WATCHDOG, || unmapped.load(Ordering::Acquire));
    // Let go of the stand-in in every case: a deadlock is broken here, and
    // the test fails below instead of hanging.
    ARENA_HELD.store(false, Ordering::Release);
    HOLDER.with(|h| h.set(false));
    unmapper.join().unwrap();
    let during = drainer.join().unwrap();
    assert!(reached, "the drainer never allocated while the arena was held (test setup)");
    assert!(
        returned,
        "munmap of watched ODP memory did not return within {WATCHDOG:?} while the allocator \
         was held: the notifier's reader was waiting for a lock held across an allocation"
    );
    assert!(unmapped.load(Ordering::Acquire));
    // Both events are applied: the page dropped by MADV_DONTNEED, then the rest.
    assert!(during.page_invalidations >= 1, "{during:?}");
    let after = mem.odp_stats();
    assert_eq!(after.page_invalidations, PAGES as u64, "{after:?}");
    assert_eq!(mem.odp_regions()[0].1.page_invalidations, PAGES as u64);
}
