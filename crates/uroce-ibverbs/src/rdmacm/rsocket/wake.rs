//! Wake-ups between the threads of one socket. A thread that waits for a
//! socket sleeps on its completion channel and its CM channel, which fire
//! for what the device does; what another thread of the application does
//! to the socket meanwhile (it polls the CQ and takes the completion the
//! sleeper waited for, takes the channel's event, shuts the socket down)
//! fires neither. Such a thread writes the socket's eventfd, which
//! sleepers watch too, so that no wait depends on a poll interval and an
//! idle waiter costs nothing. Only changes write it (a count of
//! completions and events taken, and the state word, compared when the
//! socket's lock is released), and only while someone waits.

use std::ffi::c_int;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::atomic::{AtomicUsize, Ordering};

/// Longest slice of one wait where the socket has no eventfd (the process
/// is out of descriptors): changes by other threads are then seen within it.
pub const FALLBACK_SLICE_MS: c_int = 100;

pub struct Wake {
    fd: Option<OwnedFd>,
    waiters: AtomicUsize,
}

/// A waiter, counted while it lives.
pub struct Waiting<'a>(&'a Wake);

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        MINE.with(|m| {
            let mut m = m.borrow_mut();
            if let Some(i) = m.iter().position(|&w| w == self.0.key()) {
                m.swap_remove(i);
            }
        });
        self.0.waiters.fetch_sub(1, Ordering::SeqCst);
    }
}

thread_local! {
    /// The sockets this thread waits on (a waiter's own changes wake
    /// nobody else, and need not wake itself).
    static MINE: std::cell::RefCell<Vec<usize>> = const { std::cell::RefCell::new(Vec::new()) };
}

impl Wake {
    pub fn new() -> Wake {
        // SAFETY: eventfd with flags; the descriptor, if any, is ours.
        let fd = unsafe { libc::eventfd(0, libc::EFD_NONBLOCK | libc::EFD_CLOEXEC) };
        // SAFETY: a fresh descriptor we own.
        let fd = (fd >= 0).then(|| unsafe { OwnedFd::from_raw_fd(fd) });
        Wake { fd, waiters: AtomicUsize::new(0) }
    }

    /// Counts the caller as a waiter until the value is dropped. A change
    /// made before this is seen by the caller's next check of the socket
    /// (made under its lock, after this).
    pub fn enter(&self) -> Waiting<'_> {
        MINE.with(|m| m.borrow_mut().push(self.key()));
        self.waiters.fetch_add(1, Ordering::SeqCst);
        Waiting(self)
    }

    fn key(&self) -> usize {
        self as *const Wake as usize
    }

    /// The descriptor to sleep on beside the channels (-1: none, which
    /// poll ignores).
    pub fn fd(&self) -> c_int {
        self.fd.as_ref().map_or(-1, |f| f.as_raw_fd())
    }

    /// How long one sleep may last for a wait of `ms` (-1: no limit).
    pub fn slice(&self, ms: c_int) -> c_int {
        match (self.fd.is_some(), ms) {
            (true, ms) => ms,
            (false, ms) if ms < 0 => FALLBACK_SLICE_MS,
            (false, ms) => ms.min(FALLBACK_SLICE_MS),
        }
    }

    /// Says "the socket changed" to the threads waiting on it.
    pub fn notify(&self) {
        let waiters = self.waiters.load(Ordering::SeqCst);
        if waiters == 0 {
            return;
        }
        let mine = MINE.with(|m| m.borrow().iter().filter(|&&w| w == self.key()).count());
        if waiters <= mine {
            return;
        }
        if let Some(f) = &self.fd {
            let one = 1u64;
            let saved = crate::errno::last();
            // SAFETY: eight bytes to our non-blocking eventfd; a full counter
            // (EAGAIN) is already a wake-up.
            unsafe { libc::write(f.as_raw_fd(), (&one as *const u64).cast(), 8) };
            crate::errno::set_errno(saved);
        }
    }

    /// Forgets the wake-ups so far: called before the waiter checks the
    /// socket (once when it starts waiting, then after a sleep this
    /// eventfd ended), so that one coming after the check ends its sleep.
    pub fn drain(&self) {
        if let Some(f) = &self.fd {
            let mut v = 0u64;
            // An empty eventfd answers EAGAIN: not the caller's error (rstream
            // prints the errno a refused connect left, and tests read it).
            let saved = crate::errno::last();
            // SAFETY: eight bytes from our non-blocking eventfd.
            unsafe { libc::read(f.as_raw_fd(), (&mut v as *mut u64).cast(), 8) };
            crate::errno::set_errno(saved);
        }
    }
}
