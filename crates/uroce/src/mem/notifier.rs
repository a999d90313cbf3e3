//! The ODP invalidation notifier: a user-space MMU notifier built on
//! userfaultfd.
//!
//! One userfaultfd per process, opened with the UNMAP, REMOVE and REMAP event
//! features, watches the address ranges ODP regions have touched. Ranges are
//! registered in write-protect mode only and nothing is ever write-protected,
//! so the application's own page faults cost nothing (no fault messages);
//! what arrives are the events: `munmap` and `mmap(MAP_FIXED)` over a range
//! (UNMAP), `MADV_DONTNEED`/`MADV_FREE` (REMOVE), `mremap` (REMAP, then UNMAP
//! of the old range). See `../shared/spec/platform.md` for the measurements.
//!
//! The kernel makes the unmapping thread wait until the event is read — the
//! same synchronous contract as a kernel MMU notifier — so a dedicated
//! reader thread does nothing but read events into a fixed ring (it never
//! allocates or frees, and so can never unmap memory and wait on itself).
//! Threads that need current state (an ODP access, a statistics read) drain
//! the ring and apply the events to the subscribed regions.
//!
//! # The reader's lock
//!
//! The reader reads each event under the ring lock (so that whoever drains
//! after `munmap` returned finds the event), so a thread blocked in `munmap`
//! waits for every holder of that lock. The unmapping thread may hold any
//! lock of its own — the allocator's arena lock above all, when `free` trims
//! the heap — so **nothing runs under the ring lock but copies of
//! fixed-size events**: no allocation or free, no logging, no callback, no
//! other lock, no system call but the reader's `read(2)`. A drain copies the
//! events into a buffer allocated when the notifier opened (`State::batch`),
//! lets the ring go, and only then allocates and takes region locks, under
//! the state lock, which the reader never takes (and logs after that). The
//! ring is a static, so the reader does not even wait for the notifier's
//! one-time initialisation. `tests/odp_notifier.rs` holds a stand-in for the arena
//! lock in its global allocator and checks that `munmap` still returns.
//!
//! The userfaultfd ABI is declared here (a few constants and two structs from
//! `<linux/userfaultfd.h>`): the `userfaultfd` crate would need libclang at
//! build time for its bindings.

use super::rangeset::RangeSet;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, PoisonError, Weak};

const UFFD_API: u64 = 0xAA;
const UFFD_USER_MODE_ONLY: libc::c_int = 1;
const UFFD_FEATURE_EVENT_REMAP: u64 = 1 << 2;
const UFFD_FEATURE_EVENT_REMOVE: u64 = 1 << 3;
const UFFD_FEATURE_EVENT_UNMAP: u64 = 1 << 6;
const UFFD_EVENT_REMAP: u8 = 0x14;
const UFFD_EVENT_REMOVE: u8 = 0x15;
const UFFD_EVENT_UNMAP: u8 = 0x16;
const UFFDIO_REGISTER_MODE_WP: u64 = 1 << 1;
/// `_IOWR(0xAA, 0x3F, struct uffdio_api)`.
const UFFDIO_API: libc::c_ulong = 0xC018_AA3F;
/// `_IOWR(0xAA, 0x00, struct uffdio_register)`.
const UFFDIO_REGISTER: libc::c_ulong = 0xC020_AA00;

#[repr(C)]
struct UffdioApi {
    api: u64,
    features: u64,
    ioctls: u64,
}

#[repr(C)]
struct UffdioRegister {
    start: u64,
    len: u64,
    mode: u64,
    ioctls: u64,
}

/// `struct uffd_msg` (32 bytes): the event byte, padding, and the union as
/// three u64 (remove/unmap: start, end; remap: from, to, len).
#[repr(C)]
#[derive(Clone, Copy, Default)]
struct UffdMsg {
    event: u8,
    _r1: u8,
    _r2: u16,
    _r3: u32,
    a: u64,
    b: u64,
    c: u64,
}

const RING: usize = 512;

/// An invalidated range `start..end`; `unmapped` when the mapping itself is
/// gone (its watch registration went with it).
#[derive(Clone, Copy, Default)]
struct Event {
    start: u64,
    end: u64,
    unmapped: bool,
}

struct Ring {
    events: [Event; RING],
    len: usize,
    /// Events were lost: everything must be treated as invalidated.
    overflow: bool,
}

/// Events read and not yet applied. Its lock is the one a thread blocked
/// in `munmap` waits for: only fixed-size copies run under it (module docs).
static RING_LOCK: Mutex<Ring> =
    Mutex::new(Ring { events: [Event { start: 0, end: 0, unmapped: false }; RING], len: 0, overflow: false });

/// The ring lock, even if a holder panicked (its state is a plain array).
fn ring() -> MutexGuard<'static, Ring> {
    RING_LOCK.lock().unwrap_or_else(PoisonError::into_inner)
}

struct Notifier {
    fd: OwnedFd,
    state: Mutex<State>,
}

struct State {
    watched: RangeSet,
    subscribers: Vec<Weak<dyn Subscriber>>,
    /// Where a drain copies the ring's events to, allocated once, so that
    /// the copy under the ring lock allocates nothing.
    batch: Box<[Event; RING]>,
}

fn notifier() -> Option<&'static Notifier> {
    static N: OnceLock<Option<Notifier>> = OnceLock::new();
    N.get_or_init(|| match open() {
        Ok(n) => Some(n),
        Err(e) => {
            tracing::warn!("ODP: no userfaultfd ({e}); page invalidations will not be counted");
            None
        }
    })
    .as_ref()
}

fn open() -> std::io::Result<Notifier> {
    let flags = libc::O_CLOEXEC | libc::O_NONBLOCK;
    // SAFETY: the userfaultfd syscall takes flags only and returns a new fd.
    let mut fd = unsafe { libc::syscall(libc::SYS_userfaultfd, flags | UFFD_USER_MODE_ONLY) };
    if fd < 0 {
        // Kernels before 5.11 do not know UFFD_USER_MODE_ONLY; root may omit it.
        // SAFETY: as above.
        fd = unsafe { libc::syscall(libc::SYS_userfaultfd, flags) };
    }
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: `fd` is a new descriptor that nothing else owns.
    let fd = unsafe { OwnedFd::from_raw_fd(fd as i32) };
    let mut api = UffdioApi {
        api: UFFD_API,
        features: UFFD_FEATURE_EVENT_UNMAP | UFFD_FEATURE_EVENT_REMOVE | UFFD_FEATURE_EVENT_REMAP,
        ioctls: 0,
    };
    // SAFETY: UFFDIO_API reads and writes one `struct uffdio_api`.
    if unsafe { libc::ioctl(fd.as_raw_fd(), UFFDIO_API, &mut api) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    let state = State { watched: RangeSet::new(), subscribers: Vec::new(), batch: Box::new([Event::default(); RING]) };
    let reader = fd.try_clone()?;
    std::thread::Builder::new().name("uroce-odp-notifier".into()).spawn(move || read_events(reader))?;
    Ok(Notifier { fd, state: Mutex::new(state) })
}

/// The reader thread: blocks in read(2) and queues events. It must stay
/// allocation-free and take no lock but the ring's (see the module docs).
fn read_events(fd: OwnedFd) {
    let mut msgs = [UffdMsg::default(); 16];
    loop {
        // Wait for events without consuming them: the kernel lets the
        // unmapping thread go on when an event is *read*, so the read
        // happens under the ring lock, and whoever drains after the unmap
        // returned finds the event queued.
        let mut pfd = libc::pollfd { fd: fd.as_raw_fd(), events: libc::POLLIN, revents: 0 };
        // SAFETY: one valid pollfd.
        let r = unsafe { libc::poll(&mut pfd, 1, -1) };
        if r < 0 {
            if std::io::Error::last_os_error().kind() == std::io::ErrorKind::Interrupted {
                continue;
            }
            return;
        }
        let mut ring = ring();
        // SAFETY: reads whole `uffd_msg`s into an array of exactly that size.
        let n =
            unsafe { libc::read(fd.as_raw_fd(), msgs.as_mut_ptr() as *mut libc::c_void, std::mem::size_of_val(&msgs)) };
        if n < 0 {
            let e = std::io::Error::last_os_error();
            if matches!(e.kind(), std::io::ErrorKind::Interrupted | std::io::ErrorKind::WouldBlock) {
                continue;
            }
            return;
        }
        let count = n as usize / std::mem::size_of::<UffdMsg>();
        for m in &msgs[..count] {
            let ev = match m.event {
                UFFD_EVENT_UNMAP => Event { start: m.a, end: m.b, unmapped: true },
                UFFD_EVENT_REMOVE => Event { start: m.a, end: m.b, unmapped: false },
                UFFD_EVENT_REMAP => Event { start: m.a, end: m.a.saturating_add(m.c), unmapped: true },
                _ => continue,
            };
            if ring.len == RING {
                ring.overflow = true;
            } else {
                let i = ring.len;
                ring.events[i] = ev;
                ring.len += 1;
            }
        }
    }
}

#[cfg(feature = "unstable")]
/// Whether invalidations are being observed.
pub fn available() -> bool {
    notifier().is_some()
}

/// What receives invalidations (an ODP region, `mem::odp`), called with
/// the notifier's state lock held.
pub(crate) trait Subscriber: Send + Sync {
    /// Addresses `start..end` changed (`unmapped`: they are gone).
    fn invalidate(&self, start: u64, end: u64, unmapped: bool);
    /// Events were lost: everything may have changed.
    fn invalidate_all(&self);
}

/// Adds a subscriber to those that receive invalidations, for as long as
/// it lives.
pub(crate) fn subscribe(r: Weak<dyn Subscriber>) {
    if let Some(n) = notifier() {
        let mut st = n.state.lock().unwrap();
        st.subscribers.retain(|w| w.strong_count() > 0);
        st.subscribers.push(r);
    }
}

/// Applies queued events to the subscribed regions. The state lock is
/// taken first and held until the events are applied: a concurrent caller
/// that finds the ring empty must not read the regions while another
/// thread is still applying the events it took from it.
pub(crate) fn drain() {
    let Some(n) = notifier() else { return };
    let mut st = n.state.lock().unwrap();
    apply_pending(&mut st);
}

/// The body of [`drain`], with the state lock held.
fn apply_pending(st: &mut State) {
    // Under the ring lock: a copy into the preallocated batch, nothing else
    // (no allocation, no logging, no other lock; see the module docs).
    let (count, overflow) = {
        let mut ring = ring();
        let count = ring.len;
        if count == 0 && !ring.overflow {
            return;
        }
        st.batch[..count].copy_from_slice(&ring.events[..count]);
        let overflow = ring.overflow;
        ring.len = 0;
        ring.overflow = false;
        (count, overflow)
    };
    let subs: Vec<Arc<dyn Subscriber>> = st.subscribers.iter().filter_map(Weak::upgrade).collect();
    if overflow {
        st.watched.clear();
        for s in &subs {
            s.invalidate_all();
        }
    }
    for e in &st.batch[..count] {
        if e.unmapped {
            st.watched.remove(e.start, e.end);
        }
        for s in &subs {
            s.invalidate(e.start, e.end, e.unmapped);
        }
    }
}

/// Makes sure unmaps of `start..end` (page aligned) are reported; false
/// when the range cannot be registered.
pub(crate) fn watch(start: u64, end: u64) -> bool {
    let Some(n) = notifier() else { return false };
    let mut st = n.state.lock().unwrap();
    // Events not yet applied may say that part of the range was unmapped
    // since it was registered (the registration went with the old mapping):
    // apply them first, or a stale `watched` entry would hide a new mapping
    // at the same address, e.g. memory another thread freed and this one got
    // back from `mmap`. (The kernel holds `munmap` until the reader thread
    // has read the event, which it then puts in the ring: what remains is
    // the reader's few instructions between the two.)
    apply_pending(&mut st);
    if st.watched.contains(start, end) {
        return true;
    }
    let mut reg = UffdioRegister { start, len: end - start, mode: UFFDIO_REGISTER_MODE_WP, ioctls: 0 };
    // SAFETY: UFFDIO_REGISTER reads and writes one `struct uffdio_register`;
    // registering in write-protect mode changes no memory and no protection.
    let r = unsafe { libc::ioctl(n.fd.as_raw_fd(), UFFDIO_REGISTER, &mut reg) };
    if r == 0 {
        st.watched.insert(start, end);
        true
    } else {
        // File-backed mappings without WP_ASYNC, or a range another
        // userfaultfd owns: accesses stay correct, only the counters miss
        // invalidations of this range. Logged after the state lock is
        // released (every ODP access of every shard takes it).
        let e = std::io::Error::last_os_error();
        drop(st);
        tracing::debug!("ODP: cannot watch {start:#x}..{end:#x} for invalidations: {e}");
        false
    }
}
