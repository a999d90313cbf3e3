//! The device as this process runs it: its runtime and memory, the routing
//! of its events (completion events to channels, asynchronous events to
//! the queue `ibv_get_async_event` reads), its handles and its XRC domains.
//! Shared by every context opened on it ([`super::Context`]); the layer
//! under the verbs objects, which name it and are never named by it.

use crate::ib::{Errno, Error, Mtu, Result};
use crate::io::{EventSink, Runtime};
use crate::mem::Memory;
use crate::proto::{AsyncEvent, Event, EventElement};
use std::collections::{HashMap, HashSet, VecDeque};
use std::net::{IpAddr, SocketAddr};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Mutex, Weak};

/// An XRC domain; its device-wide number is what SRQs and QPs record.
#[derive(Debug)]
pub(crate) struct XrcDomain {
    pub number: u32,
}

/// One device of this process: runtime, memory and event routing. Shared by
/// every context opened on it.
pub(crate) struct DeviceShared {
    pub name: String,
    pub rt: Arc<Runtime>,
    pub mem: Arc<Memory>,
    pub addr: SocketAddr,
    pub mtu: Mtu,
    /// Inline receive by default, and the payload a completion carries.
    pub scatter_to_cqe: bool,
    pub inline_recv: usize,
    next_handle: AtomicU32,
    channels: Mutex<HashMap<u32, Weak<ChannelInner>>>,
    async_events: Mutex<AsyncQueue>,
    async_fd: OwnedFd,
    /// XRC domains opened through a file, by the file's (device, inode).
    pub xrcds: Mutex<HashMap<(u64, u64), Weak<XrcDomain>>>,
}

/// The asynchronous events not yet taken, and the objects they may be
/// about: as the kernel, an event is never delivered for an object already
/// destroyed (its queued events go when it does, and one raised while it
/// was being destroyed is dropped).
#[derive(Default)]
struct AsyncQueue {
    events: VecDeque<AsyncEvent>,
    live: HashSet<(u8, u32)>,
}

/// The object an event is about, as a key of [`AsyncQueue::live`] (None: the
/// port, which always exists).
fn object_key(el: EventElement) -> Option<(u8, u32)> {
    match el {
        EventElement::Qp(n) => Some((0, n)),
        EventElement::Cq(h) => Some((1, h)),
        EventElement::Srq(h) => Some((2, h)),
        EventElement::Port(_) => None,
    }
}

impl DeviceShared {
    pub(crate) fn new(
        name: String,
        rt: Arc<Runtime>,
        mem: Arc<Memory>,
        scatter_to_cqe: bool,
        inline_recv: usize,
    ) -> Result<DeviceShared> {
        Ok(DeviceShared {
            name,
            addr: rt.local_addr(),
            mtu: rt.config().mtu,
            rt,
            mem,
            scatter_to_cqe,
            inline_recv,
            next_handle: AtomicU32::new(1),
            channels: Mutex::new(HashMap::new()),
            async_events: Mutex::new(AsyncQueue::default()),
            async_fd: new_eventfd(libc::EFD_SEMAPHORE)?,
            xrcds: Mutex::new(HashMap::new()),
        })
    }

    /// The fd that becomes readable when an asynchronous event is pending.
    pub(crate) fn async_fd(&self) -> RawFd {
        self.async_fd.as_raw_fd()
    }

    /// Waits for the next asynchronous event (unless the fd was made
    /// non-blocking: EAGAIN). An event counted by the fd but discarded
    /// since (its object was destroyed) is skipped.
    pub(crate) fn next_async_event(&self) -> Result<AsyncEvent> {
        loop {
            read_eventfd(self.async_fd.as_raw_fd())?;
            if let Some(ev) = self.async_events.lock().unwrap().events.pop_front() {
                return Ok(ev);
            }
        }
    }

    /// The next asynchronous event, if one is pending (the fd's count kept
    /// in step).
    pub(crate) fn try_async_event(&self) -> Option<AsyncEvent> {
        let ev = self.async_events.lock().unwrap().events.pop_front()?;
        drain_one(self.async_fd.as_raw_fd());
        Some(ev)
    }

    /// An object (QP, CQ, SRQ) that events may be about from now on.
    pub(crate) fn track_events(&self, el: EventElement) {
        if let Some(k) = object_key(el) {
            self.async_events.lock().unwrap().live.insert(k);
        }
    }

    /// An object being destroyed: its events not yet taken are discarded,
    /// and none raised later is queued.
    pub(crate) fn untrack_events(&self, el: EventElement) {
        let Some(k) = object_key(el) else { return };
        let mut q = self.async_events.lock().unwrap();
        q.live.remove(&k);
        let before = q.events.len();
        q.events.retain(|e| e.element != el);
        // Keep the eventfd's count in step with the queue (a reader that
        // took a count for a discarded event finds none and waits again).
        for _ in q.events.len()..before {
            drain_one(self.async_fd.as_raw_fd());
        }
    }

    pub fn next_handle(&self) -> u32 {
        self.next_handle.fetch_add(1, Ordering::Relaxed)
    }

    pub fn bind_channel(&self, cq: u32, ch: &Arc<ChannelInner>) {
        self.channels.lock().unwrap().insert(cq, Arc::downgrade(ch));
    }

    pub fn unbind_channel(&self, cq: u32) {
        self.channels.lock().unwrap().remove(&cq);
    }

    pub fn guid(&self) -> u64 {
        // EUI-64 style from the address: stable and unique per address.
        let mut g = [0u8; 8];
        g[0] = 0x02;
        match self.addr.ip() {
            IpAddr::V4(v) => g[4..].copy_from_slice(&v.octets()),
            IpAddr::V6(v) => g[2..].copy_from_slice(&v.octets()[10..]),
        }
        g[1] = (self.addr.port() >> 8) as u8 ^ 0x12;
        g[2] ^= self.addr.port() as u8;
        u64::from_be_bytes(g)
    }
}

impl EventSink for DeviceShared {
    fn event(&self, ev: Event) {
        match ev {
            Event::CompletionNotify(cq) => {
                let ch = self.channels.lock().unwrap().get(&cq).and_then(|w| w.upgrade());
                if let Some(ch) = ch {
                    ch.notify(cq);
                }
            }
            Event::Async(a) => {
                tracing::debug!(?a, "async event");
                let mut q = self.async_events.lock().unwrap();
                if object_key(a.element).is_some_and(|k| !q.live.contains(&k)) {
                    tracing::debug!(?a, "async event for a destroyed object dropped");
                    return;
                }
                q.events.push_back(a);
                write_eventfd(self.async_fd.as_raw_fd());
            }
        }
    }
}

impl Drop for DeviceShared {
    fn drop(&mut self) {
        self.rt.shutdown();
    }
}

fn new_eventfd(flags: libc::c_int) -> Result<OwnedFd> {
    // SAFETY: eventfd has no memory preconditions.
    let fd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC | flags) };
    if fd < 0 {
        return Err(Error::new(
            Errno(std::io::Error::last_os_error().raw_os_error().unwrap_or(libc::EMFILE)),
            "eventfd",
        ));
    }
    // SAFETY: a fresh descriptor we own.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

pub(crate) fn write_eventfd(fd: RawFd) {
    let one: u64 = 1;
    // SAFETY: writes a valid u64 to an eventfd.
    unsafe { libc::write(fd, (&one as *const u64).cast(), 8) };
}

/// Blocking (unless the fd is non-blocking) read of one eventfd count.
pub(crate) fn read_eventfd(fd: RawFd) -> Result<()> {
    let mut v: u64 = 0;
    // SAFETY: reads 8 bytes into a valid u64.
    let n = unsafe { libc::read(fd, (&mut v as *mut u64).cast(), 8) };
    if n == 8 {
        Ok(())
    } else {
        let e = std::io::Error::last_os_error().raw_os_error().unwrap_or(libc::EIO);
        Err(Error::new(Errno(e), "read event"))
    }
}

pub(crate) struct ChannelInner {
    /// The device whose CQs may use the channel: a thread waiting for an
    /// event receives for it meanwhile (`Runtime::wait_receiving`); none
    /// for an internal channel.
    pub(crate) rt: Weak<Runtime>,
    pub(crate) fd: OwnedFd,
    pub(crate) fired: Mutex<VecDeque<u32>>,
    /// CQs created on the channel and not yet destroyed (rdma-core's
    /// `refcnt`): what decides whether it may be destroyed. The progress
    /// thread's passing reference while it notifies does not count.
    pub(crate) cqs: AtomicU32,
    /// Set by [`CompletionChannel::interrupt`](super::CompletionChannel::interrupt): the waiter returns with no
    /// event.
    pub(crate) interrupted: AtomicBool,
}

impl ChannelInner {
    /// A channel whose waiter receives for `rt` (none: an internal channel).
    pub(crate) fn new(rt: Weak<Runtime>) -> Result<ChannelInner> {
        Ok(ChannelInner {
            rt,
            fd: new_eventfd(libc::EFD_SEMAPHORE)?,
            fired: Mutex::new(VecDeque::new()),
            cqs: AtomicU32::new(0),
            interrupted: AtomicBool::new(false),
        })
    }

    /// Whether an application waits on it (not an internal channel).
    pub(crate) fn is_application(&self) -> bool {
        self.rt.strong_count() > 0
    }
    fn notify(&self, cq: u32) {
        self.fired.lock().unwrap().push_back(cq);
        write_eventfd(self.fd.as_raw_fd());
    }

    /// A CQ of the channel is destroyed: its events not yet taken go (the
    /// kernel never delivers a completion event for a destroyed CQ).
    pub(crate) fn discard(&self, cq: u32) {
        let mut f = self.fired.lock().unwrap();
        let before = f.len();
        f.retain(|&h| h != cq);
        for _ in f.len()..before {
            drain_one(self.fd.as_raw_fd());
        }
    }
}

/// Whether `fd` has O_NONBLOCK (an application may set it on a channel's
/// fd to poll it).
pub(crate) fn is_nonblocking(fd: RawFd) -> bool {
    // SAFETY: F_GETFL has no memory arguments.
    let fl = unsafe { libc::fcntl(fd, libc::F_GETFL) };
    fl >= 0 && fl & libc::O_NONBLOCK != 0
}

/// Takes one count of a semaphore eventfd without blocking (none: nothing).
fn drain_one(fd: RawFd) {
    let mut v = 0u64;
    // SAFETY: a non-blocking read of 8 bytes of our eventfd into a u64.
    unsafe {
        let fl = libc::fcntl(fd, libc::F_GETFL);
        libc::fcntl(fd, libc::F_SETFL, fl | libc::O_NONBLOCK);
        libc::read(fd, (&mut v as *mut u64).cast(), 8);
        libc::fcntl(fd, libc::F_SETFL, fl);
    }
}
