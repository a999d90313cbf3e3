//! Event channels and events. A channel's `fd` is the read end of a pipe
//! holding one byte per queued event, so it polls readable exactly while
//! an event waits, `rdma_get_cm_event` blocks in `read` (or fails EAGAIN
//! when the application made the fd non-blocking, as the kernel's ucma
//! does), and rsocket can use the number as it uses the kernel's.

use crate::errno::{null, set_errno};
use crate::ffi::cma::*;
use std::collections::VecDeque;
use std::ffi::c_int;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::Mutex;

/// Bytes of private data an event carries (`RDMA_MAX_PRIVATE_DATA`).
pub const MAX_PRIVATE: usize = 256;

#[repr(C)]
pub struct UChannel {
    pub ch: rdma_event_channel,
    wfd: c_int,
    queue: Mutex<VecDeque<usize>>,
    /// Threads inside `rdma_get_cm_event` on this channel.
    readers: AtomicU32,
    /// Destroyed by the application (the struct stays: see destroy).
    closed: AtomicBool,
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
    Box::into_raw(Box::new(UChannel {
        ch: rdma_event_channel { fd: fds[0] },
        wfd: fds[1],
        queue: Mutex::new(VecDeque::new()),
        readers: AtomicU32::new(0),
        closed: AtomicBool::new(false),
    }))
}

/// Queues `ev` on `ch` and makes its fd readable.
pub unsafe fn push(ch: *mut rdma_event_channel, ev: Box<UEvent>) {
    // SAFETY: every channel an id holds is a UChannel of ours, alive while ids use it.
    let c = unsafe { &*(ch as *const UChannel) };
    c.queue.lock().unwrap_or_else(|p| p.into_inner()).push_back(Box::into_raw(ev) as usize);
    let b = 1u8;
    // SAFETY: one byte from a local; the pipe holds 64 KiB of pending events.
    unsafe { libc::write(c.wfd, &b as *const u8 as *const libc::c_void, 1) };
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
/// thread destroys it before exiting; such a call waits (at most 10 s) as
/// a read on the kernel's closed file stays blocked, instead of touching
/// freed memory. A private channel of a synchronous id is freed when no
/// thread reads it.
pub unsafe fn destroy(ch: *mut rdma_event_channel, free: bool) {
    if ch.is_null() {
        return;
    }
    // SAFETY: a channel of ours, destroyed once (its ids are gone).
    let c = unsafe { &*(ch as *const UChannel) };
    if c.closed.swap(true, Ordering::SeqCst) {
        return;
    }
    for e in c.queue.lock().unwrap_or_else(|p| p.into_inner()).drain(..) {
        // SAFETY: queued events are ours and were never handed out.
        drop(unsafe { Box::from_raw(e as *mut UEvent) });
    }
    // SAFETY: our read end.
    unsafe { libc::close(c.ch.fd) };
    if c.readers.load(Ordering::SeqCst) > 0 {
        // A thread blocks in read: the write end stays, so it never wakes.
        return;
    }
    // SAFETY: our write end.
    unsafe { libc::close(c.wfd) };
    if free {
        // SAFETY: no reader; nothing refers to it any more.
        drop(unsafe { Box::from_raw(ch as *mut UChannel) });
    }
}

/// The next event of `ch` whose id is still alive (waiting as the fd's
/// flags say); the owner's unacked count taken.
pub unsafe fn get(ch: *mut rdma_event_channel) -> Result<*mut UEvent, c_int> {
    // SAFETY: a channel of ours.
    let c = unsafe { &*(ch as *const UChannel) };
    if c.closed.load(Ordering::SeqCst) {
        std::thread::sleep(std::time::Duration::from_secs(10));
        return Err(libc::EBADF);
    }
    c.readers.fetch_add(1, Ordering::SeqCst);
    let r = next(c);
    c.readers.fetch_sub(1, Ordering::SeqCst);
    r
}

fn next(c: &UChannel) -> Result<*mut UEvent, c_int> {
    loop {
        let mut b = 0u8;
        // SAFETY: one byte into a local.
        let n = unsafe { libc::read(c.ch.fd, &mut b as *mut u8 as *mut libc::c_void, 1) };
        if n == 0 {
            // The application destroyed the channel while this thread was
            // about to read it (the write end is closed only when no reader
            // was counted): as a read blocked on a closed rdma_cm fd, wait
            // (the process is usually exiting), then fail as `get` does.
            std::thread::sleep(std::time::Duration::from_secs(10));
            return Err(libc::EBADF);
        }
        if n != 1 {
            return Err(std::io::Error::last_os_error().raw_os_error().unwrap_or(libc::EIO));
        }
        let Some(p) = c.queue.lock().unwrap_or_else(|p| p.into_inner()).pop_front() else { continue };
        let ev = p as *mut UEvent;
        let mut g = super::lock();
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
    let mut g = super::lock();
    if let Some(s) = g.ids.get_mut(&ev.owner).filter(|s| s.serial == ev.serial) {
        s.unacked = s.unacked.saturating_sub(1);
    }
    drop(g);
    super::ACKED.notify_all();
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
