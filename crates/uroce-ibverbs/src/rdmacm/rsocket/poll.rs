//! `rpoll` and `rselect` over rsockets and ordinary fds together: an
//! rsocket's readiness comes from its state after its completions are
//! processed (`rs_poll_rs`); while none is ready the thread sleeps in
//! poll(2) on each rsocket's completion channel (connected) or CM event
//! channel (listening, connecting) and on the ordinary fds as given.

use super::stream::{self, Stream};
use super::{dapi, lookup, DSock, Sock};
use crate::errno::set_errno;
use std::ffi::c_int;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// `rs_poll_rs` without waiting: the events that hold now.
fn revents(sock: &Sock, events: i16) -> i16 {
    let mut s = sock.lock();
    if s.state & stream::OPENING != 0 {
        let _ = s.drive_connect();
    }
    if s.state & (stream::CONNECTED | stream::DISCONNECTED | stream::ERROR) != 0 {
        s.process();
        let mut r = 0;
        if events & libc::POLLIN != 0 && s.conn_have_rdata() {
            r |= libc::POLLIN;
        }
        if events & libc::POLLOUT != 0 && s.can_send() {
            r |= libc::POLLOUT;
        }
        // The end of the connection is reported once the data received
        // before it has been read (rsockets reports POLLHUP at once, so
        // that a reader polling for its last message may see POLLHUP
        // before it; rstream -T a then fails).
        if s.state & stream::CONNECTED == 0 && !(events & libc::POLLIN != 0 && s.have_rdata()) {
            r |= if s.state == stream::DISCONNECTED { libc::POLLHUP } else { libc::POLLERR };
        }
        return r;
    }
    if s.state == stream::LISTENING {
        let mut p = libc::pollfd { fd: s.fd, events: events & libc::POLLIN, revents: 0 };
        // SAFETY: one pollfd, no wait.
        unsafe { libc::poll(&mut p, 1, 0) };
        return p.revents & libc::POLLIN;
    }
    if s.state == stream::CONNECT_ERROR {
        return (events & (libc::POLLIN | libc::POLLOUT)) | libc::POLLERR;
    }
    0
}

/// The fd that wakes a waiter for the socket (its CQ armed first).
fn wake_fd(s: &mut Stream) -> c_int {
    match s.comp_fd() {
        Some(fd) if s.state & (stream::CONNECTED | stream::DISCONNECTED | stream::ERROR) != 0 => {
            s.arm();
            fd
        }
        _ => s.fd,
    }
}

#[no_mangle]
pub unsafe extern "C" fn uroce_cm_rpoll(fds: *mut libc::pollfd, nfds: libc::nfds_t, timeout: c_int) -> c_int {
    if nfds > 0 && fds.is_null() {
        set_errno(libc::EFAULT);
        return -1;
    }
    if nfds > 65536 {
        set_errno(libc::EINVAL);
        return -1;
    }
    // SAFETY: nfds pollfds of the caller.
    let user = unsafe { std::slice::from_raw_parts_mut(fds, nfds as usize) };
    let socks: Vec<Option<Arc<Sock>>> = user.iter().map(|p| lookup(p.fd)).collect();
    let dsocks: Vec<Option<Arc<DSock>>> = user.iter().map(|p| dapi::dsock(p.fd)).collect();
    if socks.iter().all(Option::is_none) && dsocks.iter().all(Option::is_none) {
        // SAFETY: forwarded: only the kernel's fds.
        return unsafe { libc::poll(fds, nfds, timeout) };
    }
    let start = Instant::now();
    let deadline = (timeout >= 0).then(|| start + Duration::from_millis(timeout as u64));
    let mut kfds: Vec<libc::pollfd> = vec![libc::pollfd { fd: -1, events: 0, revents: 0 }; user.len()];
    // Each rsocket's wake-ups after the caller's fds: what another thread
    // does to one of them wakes this call (`super::wake`).
    let wakes: Vec<&super::wake::Wake> =
        socks.iter().flatten().map(|s| &s.wake).chain(dsocks.iter().flatten().map(|d| &d.wake)).collect();
    let _waiting: Vec<_> = wakes.iter().map(|w| w.enter()).collect();
    kfds.extend(wakes.iter().map(|w| libc::pollfd { fd: w.fd(), events: libc::POLLIN, revents: 0 }));
    // Without an eventfd (out of descriptors) a sleep lasts a slice.
    let sliced = wakes.iter().any(|w| w.fd() < 0);
    // Forgotten before the first check, then those that ended a sleep.
    for w in &wakes {
        w.drain();
    }
    loop {
        // Check everything once, as rs_poll_check.
        let mut cnt = 0;
        for ((p, s), d) in user.iter_mut().zip(&socks).zip(&dsocks) {
            p.revents = match (s, d) {
                (Some(s), _) => revents(s, p.events),
                (None, Some(d)) => dapi::revents(d, p.events),
                (None, None) => {
                    let mut q = libc::pollfd { fd: p.fd, events: p.events, revents: 0 };
                    // SAFETY: one pollfd, no wait.
                    unsafe { libc::poll(&mut q, 1, 0) };
                    q.revents
                }
            };
            if p.revents != 0 {
                cnt += 1;
            }
        }
        if cnt > 0 || timeout == 0 {
            return cnt;
        }
        let left = match deadline {
            Some(d) => {
                let now = Instant::now();
                if now >= d {
                    return 0;
                }
                let ms = (d - now).as_micros().div_ceil(1000).min(c_int::MAX as u128) as c_int;
                if sliced {
                    ms.min(super::wake::FALLBACK_SLICE_MS)
                } else {
                    ms
                }
            }
            None if sliced => super::wake::FALLBACK_SLICE_MS,
            None => -1,
        };
        // Arm, then check again before sleeping (rs_poll_arm).
        let mut ready = false;
        for (((k, p), s), d) in kfds.iter_mut().zip(user.iter()).zip(&socks).zip(&dsocks) {
            match (s, d) {
                (Some(s), _) => {
                    let fd = wake_fd(&mut s.lock());
                    *k = libc::pollfd { fd, events: libc::POLLIN, revents: 0 };
                    if revents(s, p.events) != 0 {
                        ready = true;
                    }
                }
                (None, Some(d)) => {
                    let fd = d.lock().wake_fd();
                    *k = libc::pollfd { fd, events: libc::POLLIN, revents: 0 };
                    if dapi::revents(d, p.events) != 0 {
                        ready = true;
                    }
                }
                (None, None) => *k = libc::pollfd { fd: p.fd, events: p.events, revents: 0 },
            }
        }
        if ready {
            continue;
        }
        // SAFETY: our pollfd array.
        let n = unsafe { libc::poll(kfds.as_mut_ptr(), kfds.len() as libc::nfds_t, left) };
        if n < 0 {
            return -1;
        }
        for (w, k) in wakes.iter().zip(&kfds[user.len()..]) {
            if k.revents != 0 {
                w.drain();
            }
        }
        for ((k, s), d) in kfds.iter().zip(&socks).zip(&dsocks) {
            if k.revents != 0 {
                if let Some(s) = s {
                    s.lock().take_cq_event();
                }
                if let Some(d) = d {
                    d.lock().take_cq_events();
                }
            }
        }
    }
}

#[no_mangle]
pub unsafe extern "C" fn uroce_cm_rselect(
    n: c_int,
    r: *mut libc::fd_set,
    w: *mut libc::fd_set,
    e: *mut libc::fd_set,
    t: *mut libc::timeval,
) -> c_int {
    if !(0..=libc::FD_SETSIZE as c_int).contains(&n) {
        set_errno(libc::EINVAL);
        return -1;
    }
    let timeout = if t.is_null() {
        -1
    } else {
        // SAFETY: the caller's timeval.
        let tv = unsafe { *t };
        if tv.tv_sec < 0 || tv.tv_usec < 0 {
            set_errno(libc::EINVAL);
            return -1;
        }
        (tv.tv_sec.saturating_mul(1000).saturating_add(tv.tv_usec / 1000)).min(c_int::MAX as i64) as c_int
    };
    // SAFETY: the caller's sets (or NULL), n bits each.
    let isset = |s: *mut libc::fd_set, fd: c_int| !s.is_null() && unsafe { libc::FD_ISSET(fd, s) };
    let mut fds = Vec::new();
    for fd in 0..n {
        let mut ev = 0;
        if isset(r, fd) {
            ev |= libc::POLLIN;
        }
        if isset(w, fd) {
            ev |= libc::POLLOUT;
        }
        if ev != 0 || isset(e, fd) {
            fds.push(libc::pollfd { fd, events: ev, revents: 0 });
        }
    }
    // SAFETY: our array.
    let ret = unsafe { uroce_cm_rpoll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, timeout) };
    for s in [r, w, e] {
        if !s.is_null() {
            // SAFETY: the caller's set.
            unsafe { libc::FD_ZERO(s) };
        }
    }
    if ret <= 0 {
        return ret;
    }
    let mut cnt = 0;
    for p in &fds {
        // SAFETY: the caller's sets, fd < n.
        unsafe {
            if !r.is_null() && p.revents & (libc::POLLIN | libc::POLLHUP) != 0 {
                libc::FD_SET(p.fd, r);
                cnt += 1;
            }
            if !w.is_null() && p.revents & libc::POLLOUT != 0 {
                libc::FD_SET(p.fd, w);
                cnt += 1;
            }
            if !e.is_null() && p.revents & !(libc::POLLIN | libc::POLLOUT) != 0 {
                libc::FD_SET(p.fd, e);
                cnt += 1;
            }
        }
    }
    cnt
}
