//! The rsocket calls on a datagram socket ([`Dgram`]), called by [`api`]
//! when the number is a datagram socket's. Errors are errnos.
//!
//! [`api`]: super::api

use super::dgram::{self, Dgram};
use super::{dlookup, DSock};
use crate::rdmacm::sockaddr::read_sockaddr;
use std::ffi::{c_int, c_void};
use std::net::SocketAddr;
use std::sync::Arc;

pub fn dsock(fd: c_int) -> Option<Arc<DSock>> {
    dlookup(fd)
}

fn nonblocking(d: &Dgram, flags: c_int) -> bool {
    d.fd_flags & libc::O_NONBLOCK != 0 || flags & libc::MSG_DONTWAIT != 0
}

/// `ds_get_comp`: waits until `test` holds (EAGAIN when non-blocking).
fn wait(sock: &DSock, nonblock: bool, test: fn(&Dgram) -> bool) -> Result<(), c_int> {
    let _waiting = sock.wake.enter();
    sock.wake.drain();
    loop {
        let ep = {
            let mut d = sock.lock();
            d.process();
            if test(&d) {
                return Ok(());
            }
            if nonblock {
                return Err(libc::EAGAIN);
            }
            let ep = d.wake_fd();
            d.process();
            if test(&d) {
                return Ok(());
            }
            ep
        };
        let mut p = [
            libc::pollfd { fd: ep, events: libc::POLLIN, revents: 0 },
            libc::pollfd { fd: sock.wake.fd(), events: libc::POLLIN, revents: 0 },
        ];
        // SAFETY: two pollfds (a negative fd is ignored).
        if unsafe { libc::poll(p.as_mut_ptr(), 2, sock.wake.slice(-1)) } < 0 && crate::errno::last() == libc::EINTR {
            return Err(libc::EINTR);
        }
        if p[1].revents != 0 {
            sock.wake.drain();
        }
        sock.lock().take_cq_events();
    }
}

pub unsafe fn addr_of(a: *const libc::sockaddr) -> Result<SocketAddr, c_int> {
    // SAFETY: checked by the caller (sockaddr_ok).
    unsafe { read_sockaddr(a) }.ok_or(libc::EAFNOSUPPORT)
}

pub fn bind(sock: &DSock, addr: *const libc::sockaddr, len: libc::socklen_t) -> Result<c_int, c_int> {
    let mut d = sock.lock();
    d.init_ep()?;
    // SAFETY: the caller's checked address.
    if unsafe { libc::bind(d.fd, addr, len) } != 0 {
        return Err(crate::errno::last());
    }
    Ok(0)
}

pub fn connect(sock: &DSock, to: SocketAddr) -> Result<c_int, c_int> {
    sock.lock().connect(to).map(|_| 0)
}

/// `dsend` / `rsendto`: one datagram (`data` already gathered).
pub fn send(sock: &DSock, to: Option<SocketAddr>, data: &[u8], flags: c_int) -> Result<usize, c_int> {
    let to = {
        let mut d = sock.lock();
        if d.state & dgram::WRITABLE == 0 && d.has_qps() {
            return Err(libc::EPIPE);
        }
        let to = match to.or(d.conn()) {
            Some(t) => t,
            None => return Err(libc::EDESTADDRREQ),
        };
        d.prepare(to)?;
        to
    };
    let nb = nonblocking(&sock.lock(), flags);
    loop {
        if !sock.lock().can_send() {
            wait(sock, nb, Dgram::can_send)?;
        }
        let mut d = sock.lock();
        match d.send(to, data, flags) {
            Err(libc::EAGAIN) if !nb => continue,
            r => return r,
        }
    }
}

/// `ds_recvfrom`: one datagram into `buf` (truncated to `len`).
pub fn recv(sock: &DSock, buf: *mut u8, len: usize, flags: c_int) -> Result<(usize, SocketAddr), c_int> {
    let nb = {
        let d = sock.lock();
        if d.state & dgram::READABLE == 0 {
            return Err(libc::EINVAL);
        }
        nonblocking(&d, flags)
    };
    loop {
        if !sock.lock().have_rdata() {
            wait(sock, nb, Dgram::have_rdata)?;
        }
        if let Some(r) = sock.lock().recv(buf, len, flags & libc::MSG_PEEK != 0) {
            return Ok(r);
        }
        if nb {
            return Err(libc::EAGAIN);
        }
    }
}

pub fn revents(sock: &DSock, events: i16) -> i16 {
    let mut d = sock.lock();
    d.process();
    let mut r = 0;
    if events & libc::POLLIN != 0 && d.have_rdata() {
        r |= libc::POLLIN;
    }
    if events & libc::POLLOUT != 0 && d.can_send() {
        r |= libc::POLLOUT;
    }
    r
}

pub fn shutdown(sock: &DSock) -> Result<c_int, c_int> {
    let mut d = sock.lock();
    d.state &= !(dgram::READABLE | dgram::WRITABLE);
    Ok(0)
}

pub fn name(sock: &DSock, peer: bool, addr: *mut libc::sockaddr, len: *mut libc::socklen_t) -> Result<c_int, c_int> {
    let d = sock.lock();
    // SAFETY: the caller's buffers, checked by the kernel.
    let r = unsafe {
        if peer {
            libc::getpeername(d.fd, addr, len)
        } else {
            libc::getsockname(d.fd, addr, len)
        }
    };
    if r != 0 {
        return Err(crate::errno::last());
    }
    Ok(0)
}

const SOL_RDMA: c_int = 0x10000;

pub fn setsockopt(
    sock: &DSock,
    level: c_int,
    name: c_int,
    v: *const c_void,
    len: libc::socklen_t,
) -> Result<c_int, c_int> {
    let mut d = sock.lock();
    if level != SOL_RDMA {
        // SAFETY: the caller's option, checked by the kernel.
        if unsafe { libc::setsockopt(d.fd, level, name, v, len) } != 0 {
            return Err(crate::errno::last());
        }
        if level == libc::SOL_SOCKET && matches!(name, libc::SO_RCVBUF | libc::SO_SNDBUF) && !d.has_qps() {
            // SAFETY: the kernel read an int there.
            let x = unsafe { std::ptr::read_unaligned(v as *const c_int) }.max(0) as u32;
            let x = x.saturating_mul(2).clamp(2 * super::wire::SNDLOWAT, 32 << 20);
            if name == libc::SO_RCVBUF {
                d.rbuf_size = x;
            } else {
                d.sbuf_size = x;
            }
        }
        return Ok(0);
    }
    if d.has_qps() {
        return Err(libc::EINVAL);
    }
    if v.is_null() {
        return Err(libc::EFAULT);
    }
    if (len as usize) < 4 {
        return Err(libc::EINVAL);
    }
    // SAFETY: an int of the caller.
    let x = unsafe { std::ptr::read_unaligned(v as *const u32) }.min(super::wire::QP_MAX_SIZE as u32);
    match name {
        0 => d.sq_size = x as u16,
        1 => d.rq_size = x as u16,
        2 => d.sq_inline = x,
        _ => return Err(libc::EOPNOTSUPP),
    }
    Ok(0)
}

pub fn getsockopt(
    sock: &DSock,
    level: c_int,
    name: c_int,
    v: *mut c_void,
    len: *mut libc::socklen_t,
) -> Result<c_int, c_int> {
    let d = sock.lock();
    if level != SOL_RDMA {
        // SAFETY: the caller's buffers, checked by the kernel.
        if unsafe { libc::getsockopt(d.fd, level, name, v, len) } != 0 {
            return Err(crate::errno::last());
        }
        return Ok(0);
    }
    let val = match name {
        0 => d.sq_size as c_int,
        1 => d.rq_size as c_int,
        2 => d.sq_inline as c_int,
        _ => return Err(libc::EOPNOTSUPP),
    };
    // SAFETY: the caller's length.
    if v.is_null() || len.is_null() || (unsafe { *len } as usize) < 4 {
        return Err(libc::EINVAL);
    }
    // SAFETY: an int's room.
    unsafe {
        std::ptr::write_unaligned(v as *mut c_int, val);
        *len = 4;
    }
    Ok(0)
}
