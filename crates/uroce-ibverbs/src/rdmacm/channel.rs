//! Event channels and events. A channel's `fd` is the read end of a pipe
//! holding one byte per queued event, so it polls readable exactly while
//! an event waits, `rdma_get_cm_event` blocks in `read` (or fails EAGAIN
//! when the application made the fd non-blocking, as the kernel's ucma
//! does), and rsocket can use the number as it uses the kernel's.
//!
//! A destroyed channel answers `rdma_get_cm_event` with EBADF, also to a
//! thread that was blocked in it (the kernel leaves such a read blocked for
//! good). Both wait out [`CLOSED_GRACE`] first: threaded programs (rping's
//! CM thread) sit in or come back to the call while the main thread
//! destroys the channel and exits, and an early error would make them
//! exit with a failure first.

use crate::errno::{null, set_errno};
use crate::ffi::cma::*;
use std::collections::VecDeque;
use std::ffi::c_int;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// How long a call on a destroyed channel waits before failing EBADF.
pub const CLOSED_GRACE: Duration = Duration::from_secs(10);

/// Bytes of private data an event carries (`RDMA_MAX_PRIVATE_DATA`).
pub const MAX_PRIVATE: usize = 256;

#[repr(C)]
pub struct UChannel {
    pub ch: rdma_event_channel,
    wfd: c_int,
    queue: Mutex<VecDeque<usize>>,
    /// Threads inside `rdma_get_cm_event` on this channel, and whether the
    /// application destroyed it: the last of them closes the fds.
    users: Mutex<Users>,
    /// Destroyed by the application (the struct stays: see destroy).
    closed: AtomicBool,
    /// Bytes owed to the pipe: events queued while it was full (64 KiB of
    /// unread events). The write end does not block (the event thread
    /// writes under the process-wide lock, and an application that never
    /// reads must not freeze it); a reader that takes a byte pays one back.
    owed: AtomicUsize,
}

#[derive(Default)]
struct Users {
    readers: u32,
    closed_at: Option<Instant>,
    fds_closed: bool,
}

/// An event as the application sees it, then its private data and which
/// incarnation of its id it belongs to.
#[repr(C)]
pub struct UEvent {
    pub ev: rdma_cm_event,
    pub private: [u8; MAX_PRIVATE],
    /// The id whose unacked count this event holds (the listener for a
    /// CONNECT_REQUEST) and that id's serial.
    pub owner: usize,
    pub serial: u64,
}

impl UEvent {
    pub fn new() -> Box<UEvent> {
        // SAFETY: plain old data; all-zero is valid (NULL pointers).
        Box::new(unsafe { std::mem::zeroed() })
    }
}

pub fn create() -> *mut UChannel {
    let mut fds = [0 as c_int; 2];
    // SAFETY: a two-int array.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        return std::ptr::null_mut();
    }
    // The write end only (the read end is the application's, its flags
    // its own): see `UChannel::owed`.
    // SAFETY: fcntl on the pipe we just made.
    unsafe { libc::fcntl(fds[1], libc::F_SETFL, libc::O_NONBLOCK) };
    Box::into_raw(Box::new(UChannel {
        ch: rdma_event_channel { fd: fds[0] },
        wfd: fds[1],
        queue: Mutex::new(VecDeque::new()),
        users: Mutex::new(Users::default()),
        closed: AtomicBool::new(false),
        owed: AtomicUsize::new(0),
    }))
}

/// Queues `ev` on `ch` and makes its fd readable.
pub unsafe fn push(ch: *mut rdma_event_channel, ev: Box<UEvent>) {
    // SAFETY: every channel an id holds is a UChannel of ours, alive while ids use it.
    let c = unsafe { &*(ch as *const UChannel) };
    let u = c.users.lock().unwrap_or_else(|p| p.into_inner());
    if u.closed_at.is_some() {
        return; // destroyed: its fds may be closed, their numbers reused
    }
    c.queue.lock().unwrap_or_else(|p| p.into_inner()).push_back(Box::into_raw(ev) as usize);
    if !poke(c.wfd) {
        // Full: the fd is readable anyway; the byte comes when one is read.
        c.owed.fetch_add(1, Ordering::SeqCst);
    }
    drop(u);
}

/// Writes one byte into the pipe without waiting; false if it is full.
fn poke(wfd: c_int) -> bool {
    let b = 1u8;
    // SAFETY: one byte from a local; a non-blocking write end.
    unsafe { libc::write(wfd, &b as *const u8 as *const libc::c_void, 1) == 1 }
}

/// After a byte was read: pays back one owed byte (there is room now).
fn repay(c: &UChannel) {
    let took = c.owed.fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1)).is_ok();
    if took && !poke(c.wfd) {
        c.owed.fetch_add(1, Ordering::SeqCst);
    }
}

#[no_mangle]
pub unsafe extern "C" fn uroce_cm_rdma_create_event_channel() -> *mut rdma_event_channel {
    let c = create();
    if c.is_null() {
        return null(std::io::Error::last_os_error().raw_os_error().unwrap_or(libc::EMFILE));
    }
    c as *mut rdma_event_channel
}

#[no_mangle]
pub unsafe extern "C" fn uroce_cm_rdma_destroy_event_channel(ch: *mut rdma_event_channel) {
    // SAFETY: the application's channel; its struct is kept.
    unsafe { destroy(ch, false) }
}

/// Destroys a channel: its queued events, its fds. A channel of the
/// application keeps its (small) struct for good: threaded programs (rping's
/// CM thread) still call or sit in `rdma_get_cm_event` on it while the main
/// thread destroys it before exiting; such a call fails EBADF after
/// [`CLOSED_GRACE`] instead of touching freed memory. The fds stay open
/// until the last such call leaves (its fd number must not be reused under
/// it). A private channel of a synchronous id is freed when no thread reads
/// it.
pub unsafe fn destroy(ch: *mut rdma_event_channel, free: bool) {
    if ch.is_null() {
        return;
    }
    // SAFETY: a channel of ours, destroyed once (its ids are gone).
    let c = unsafe { &*(ch as *const UChannel) };
    let mut u = c.users.lock().unwrap_or_else(|p| p.into_inner());
    if c.closed.swap(true, Ordering::SeqCst) {
        return;
    }
    u.closed_at = Some(Instant::now());
    for e in c.queue.lock().unwrap_or_else(|p| p.into_inner()).drain(..) {
        // SAFETY: queued events are ours and were never handed out.
        drop(unsafe { Box::from_raw(e as *mut UEvent) });
    }
    if u.readers > 0 {
        // Woken, each blocked reader finds the channel closed (one byte per
        // reader: one may sit in `read`); the last closes the fds as it
        // leaves.
        for _ in 0..u.readers {
            // A full pipe wakes them as well. (Our pipe, open while readers remain.)
            poke(c.wfd);
        }
        return;
    }
    close_fds(c, &mut u);
    drop(u);
    if free {
        // SAFETY: no reader; nothing refers to it any more.
        drop(unsafe { Box::from_raw(ch as *mut UChannel) });
    }
}

fn close_fds(c: &UChannel, u: &mut Users) {
    if !std::mem::replace(&mut u.fds_closed, true) {
        // SAFETY: our two pipe ends, closed once.
        unsafe {
            libc::close(c.ch.fd);
            libc::close(c.wfd);
        }
    }
}

/// The next event of `ch` whose id is still alive (waiting as the fd's
/// flags say); the owner's unacked count taken. EBADF (after
/// [`CLOSED_GRACE`]) once the channel is destroyed.
pub unsafe fn get(ch: *mut rdma_event_channel) -> Result<*mut UEvent, c_int> {
    // SAFETY: a channel of ours.
    let c = unsafe { &*(ch as *const UChannel) };
    {
        let mut u = c.users.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(at) = u.closed_at {
            drop(u);
            return Err(closed(at));
        }
        u.readers += 1;
    }
    let r = next(c);
    let mut u = c.users.lock().unwrap_or_else(|p| p.into_inner());
    u.readers -= 1;
    if u.readers == 0 && u.closed_at.is_some() {
        close_fds(c, &mut u);
    }
    r
}

/// A call on a channel destroyed at `at`: waits out the grace, then EBADF.
fn closed(at: Instant) -> c_int {
    std::thread::sleep(CLOSED_GRACE.saturating_sub(at.elapsed()));
    libc::EBADF
}

/// Waits until the channel's fd is readable (true) or the channel is
/// destroyed (false); returns at once if the application made the fd
/// non-blocking (its read then says EAGAIN as the kernel's does).
fn wait_readable(c: &UChannel) -> bool {
    // SAFETY: our read end, open while this thread counts as a reader.
    let flags = unsafe { libc::fcntl(c.ch.fd, libc::F_GETFL) };
    if flags >= 0 && flags & libc::O_NONBLOCK != 0 {
        return !c.closed.load(Ordering::SeqCst);
    }
    loop {
        if c.closed.load(Ordering::SeqCst) {
            return false;
        }
        let mut p = libc::pollfd { fd: c.ch.fd, events: libc::POLLIN, revents: 0 };
        // SAFETY: one pollfd on the stack; our fd, open (see above). No
        // timeout: `destroy` wakes its readers with a byte.
        let n = unsafe { libc::poll(&mut p, 1, -1) };
        if n > 0 {
            return !c.closed.load(Ordering::SeqCst);
        }
    }
}

fn next(c: &UChannel) -> Result<*mut UEvent, c_int> {
    loop {
        if !wait_readable(c) {
            let at = c.users.lock().unwrap_or_else(|p| p.into_inner()).closed_at.unwrap_or_else(Instant::now);
            return Err(closed(at));
        }
        let mut b = 0u8;
        // SAFETY: one byte into a local; our fd, open while we read.
        let n = unsafe { libc::read(c.ch.fd, &mut b as *mut u8 as *mut libc::c_void, 1) };
        if n != 1 {
            return Err(std::io::Error::last_os_error().raw_os_error().unwrap_or(libc::EIO));
        }
        repay(c);
        let Some(p) = c.queue.lock().unwrap_or_else(|p| p.into_inner()).pop_front() else { continue };
        let ev = p as *mut UEvent;
        let mut g = super::state::lock();
        // SAFETY: queued events are ours.
        let (owner, serial) = unsafe { ((*ev).owner, (*ev).serial) };
        match g.ids.get_mut(&owner).filter(|s| s.serial == serial) {
            Some(s) => {
                s.unacked += 1;
                return Ok(ev);
            }
            // Its id was destroyed before the event was read: gone, as in the kernel.
            // SAFETY: never handed out.
            None => drop(unsafe { Box::from_raw(ev) }),
        }
    }
}

#[no_mangle]
pub unsafe extern "C" fn uroce_cm_rdma_get_cm_event(
    ch: *mut rdma_event_channel,
    event: *mut *mut rdma_cm_event,
) -> c_int {
    if ch.is_null() || event.is_null() {
        set_errno(libc::EINVAL);
        return -1;
    }
    // SAFETY: the caller's channel.
    match unsafe { get(ch) } {
        Ok(ev) => {
            // SAFETY: the caller's out pointer.
            unsafe { *event = ev as *mut rdma_cm_event };
            0
        }
        Err(e) => {
            set_errno(e);
            -1
        }
    }
}

#[no_mangle]
pub unsafe extern "C" fn uroce_cm_rdma_ack_cm_event(event: *mut rdma_cm_event) -> c_int {
    if event.is_null() {
        set_errno(libc::EINVAL);
        return -1;
    }
    // SAFETY: an event from rdma_get_cm_event, acked once.
    let ev = unsafe { Box::from_raw(event as *mut UEvent) };
    let mut g = super::state::lock();
    if let Some(s) = g.ids.get_mut(&ev.owner).filter(|s| s.serial == ev.serial) {
        s.unacked = s.unacked.saturating_sub(1);
    }
    drop(g);
    super::state::ACKED.notify_all();
    0
}

#[no_mangle]
pub extern "C" fn uroce_cm_rdma_event_str(event: c_int) -> *const std::ffi::c_char {
    let s: &'static [u8] = match event {
        0 => b"RDMA_CM_EVENT_ADDR_RESOLVED\0",
        1 => b"RDMA_CM_EVENT_ADDR_ERROR\0",
        2 => b"RDMA_CM_EVENT_ROUTE_RESOLVED\0",
        3 => b"RDMA_CM_EVENT_ROUTE_ERROR\0",
        4 => b"RDMA_CM_EVENT_CONNECT_REQUEST\0",
        5 => b"RDMA_CM_EVENT_CONNECT_RESPONSE\0",
        6 => b"RDMA_CM_EVENT_CONNECT_ERROR\0",
        7 => b"RDMA_CM_EVENT_UNREACHABLE\0",
        8 => b"RDMA_CM_EVENT_REJECTED\0",
        9 => b"RDMA_CM_EVENT_ESTABLISHED\0",
        10 => b"RDMA_CM_EVENT_DISCONNECTED\0",
        11 => b"RDMA_CM_EVENT_DEVICE_REMOVAL\0",
        12 => b"RDMA_CM_EVENT_MULTICAST_JOIN\0",
        13 => b"RDMA_CM_EVENT_MULTICAST_ERROR\0",
        14 => b"RDMA_CM_EVENT_ADDR_CHANGE\0",
        15 => b"RDMA_CM_EVENT_TIMEWAIT_EXIT\0",
        _ => b"UNKNOWN EVENT\0",
    };
    s.as_ptr() as *const std::ffi::c_char
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Issue 27 §1: a thread blocked in `rdma_get_cm_event` when the
    /// channel is destroyed, and a call after, fail EBADF (after the grace)
    /// instead of blocking for good.
    #[test]
    fn get_on_a_destroyed_channel_fails_ebadf() {
        let c = create();
        assert!(!c.is_null());
        let addr = c as usize;
        let blocked = std::thread::spawn(move || {
            // SAFETY: the channel's struct stays (destroyed with free = false).
            unsafe { get(addr as *mut rdma_event_channel) }.map(|_| ())
        });
        // SAFETY: ours, alive.
        let uc = unsafe { &*c };
        let deadline = Instant::now() + Duration::from_secs(30);
        while uc.users.lock().unwrap().readers == 0 {
            assert!(Instant::now() < deadline, "the reader never entered");
            std::thread::yield_now();
        }
        let t0 = Instant::now();
        // SAFETY: ours; the struct is kept.
        unsafe { destroy(c as *mut rdma_event_channel, false) };
        // SAFETY: as above.
        assert_eq!(unsafe { get(c as *mut rdma_event_channel) }.map(|_| ()), Err(libc::EBADF));
        assert_eq!(blocked.join().unwrap(), Err(libc::EBADF));
        let took = t0.elapsed();
        assert!(took >= CLOSED_GRACE && took < CLOSED_GRACE + Duration::from_secs(20), "{took:?}");
        assert!(uc.users.lock().unwrap().fds_closed, "the last reader closed the fds");
    }

    /// An application that reads none of its events does not freeze the
    /// thread that queues them (under the process-wide lock): past the
    /// pipe's 64 KiB the bytes are owed, and paid back as bytes are read,
    /// so that every event still has its byte.
    #[test]
    fn an_unread_channel_never_blocks_the_sender_and_every_event_keeps_its_byte() {
        let c = create();
        assert!(!c.is_null());
        let n = 70_000;
        for _ in 0..n {
            // SAFETY: ours, alive.
            unsafe { push(c as *mut rdma_event_channel, UEvent::new()) };
        }
        // SAFETY: ours, alive.
        let uc = unsafe { &*c };
        assert!(uc.owed.load(Ordering::SeqCst) > 0, "the pipe filled");
        // SAFETY: fcntl on our read end.
        unsafe { libc::fcntl(uc.ch.fd, libc::F_SETFL, libc::O_NONBLOCK) };
        let mut read = 0;
        let mut b = 0u8;
        // SAFETY: one byte into a local from our pipe.
        while unsafe { libc::read(uc.ch.fd, &mut b as *mut u8 as *mut libc::c_void, 1) } == 1 {
            read += 1;
            repay(uc);
        }
        assert_eq!((read, uc.owed.load(Ordering::SeqCst)), (n, 0));
        assert_eq!(uc.queue.lock().unwrap().len(), n);
        // SAFETY: ours, no reader; frees the queued events and the struct.
        unsafe { destroy(c as *mut rdma_event_channel, true) };
    }
}
