//! The exported rsocket calls (`uroce_cm_r*`, renamed to librdmacm's names
//! by the drop-in librdmacm.so.1): argument checks, then the socket's
//! [`Stream`] under its locks. Every failure is -1 with errno.

use super::dapi;
use super::dgram::Dgram;
use super::stream::{self, Stream};
use super::{dinsert, dtable, guard, insert, lookup, table, wait, wire, Sock};
use crate::errno::set_errno;
use crate::ffi::cma::*;
use crate::rdmacm::id;
use std::ffi::{c_int, c_void};
use std::sync::Arc;

const SOL_RDMA: c_int = 0x10000;
const RDMA_SQSIZE: c_int = 0;
const RDMA_RQSIZE: c_int = 1;
const RDMA_INLINE: c_int = 2;
const RDMA_IOMAPSIZE: c_int = 3;
const RDMA_ROUTE: c_int = 4;
/// Largest SO_SNDBUF/SO_RCVBUF buffer (bytes) a socket registers.
const MAX_BUF: u32 = 32 << 20;
const IOV_MAX: c_int = 1024;

fn fail<T: From<i8>>(e: c_int) -> T {
    set_errno(e);
    T::from(-1)
}

fn sock_of(fd: c_int) -> Result<Arc<Sock>, c_int> {
    lookup(fd).ok_or(libc::EBADF)
}

/// Whether `fd` is one of this library's sockets (stream or datagram).
fn known(fd: c_int) -> bool {
    lookup(fd).is_some() || dapi::dsock(fd).is_some()
}

/// Largest datagram a datagram socket takes (a UDP payload).
const MAX_DGRAM: usize = 65507;

fn nonblocking(s: &Stream, flags: c_int) -> bool {
    s.fd_flags & libc::O_NONBLOCK != 0 || flags & libc::MSG_DONTWAIT != 0
}

#[no_mangle]
pub extern "C" fn uroce_cm_rsocket(domain: c_int, kind: c_int, protocol: c_int) -> c_int {
    // SOCK_NONBLOCK / SOCK_CLOEXEC are not rsockets flags: rejected as rsockets does.
    if domain != libc::AF_INET && domain != libc::AF_INET6 {
        return fail(libc::EOPNOTSUPP);
    }
    match (kind, protocol) {
        (libc::SOCK_STREAM, 0 | libc::IPPROTO_TCP) => match Stream::new(domain, None) {
            Ok(s) => insert(s),
            Err(e) => fail(e),
        },
        (libc::SOCK_DGRAM, 0 | libc::IPPROTO_UDP) => match Dgram::new(domain) {
            Ok(d) => dinsert(d),
            Err(e) => fail(e),
        },
        _ => fail(libc::EOPNOTSUPP),
    }
}

unsafe fn sockaddr_ok(addr: *const libc::sockaddr, len: libc::socklen_t) -> Result<(), c_int> {
    if addr.is_null() {
        return Err(libc::EFAULT);
    }
    // SAFETY: the caller's sockaddr, at least a family.
    let fam = unsafe { (*addr).sa_family } as c_int;
    let need = match fam {
        libc::AF_INET => std::mem::size_of::<libc::sockaddr_in>(),
        libc::AF_INET6 => std::mem::size_of::<libc::sockaddr_in6>(),
        _ => return Err(libc::EAFNOSUPPORT),
    };
    if (len as usize) < need {
        return Err(libc::EINVAL);
    }
    Ok(())
}

#[no_mangle]
pub unsafe extern "C" fn uroce_cm_rbind(fd: c_int, addr: *const libc::sockaddr, len: libc::socklen_t) -> c_int {
    let r = (|| {
        if let Some(d) = dapi::dsock(fd) {
            // SAFETY: the caller's address of `len` bytes.
            unsafe { sockaddr_ok(addr, len)? };
            return dapi::bind(&d, addr, len);
        }
        let sock = sock_of(fd)?;
        // SAFETY: the caller's address of `len` bytes.
        unsafe { sockaddr_ok(addr, len)? };
        let mut s = sock.lock();
        if s.state != stream::INIT {
            return Err(libc::EINVAL);
        }
        // SAFETY: our id; the caller's checked address.
        if unsafe { id::uroce_cm_rdma_bind_addr(s.id, addr as *mut libc::sockaddr as *mut _) } != 0 {
            return Err(crate::errno::last());
        }
        s.state = stream::BOUND;
        Ok(0)
    })();
    r.unwrap_or_else(fail)
}

#[no_mangle]
pub extern "C" fn uroce_cm_rlisten(fd: c_int, backlog: c_int) -> c_int {
    let r = (|| {
        if dapi::dsock(fd).is_some() {
            return Err(libc::EOPNOTSUPP);
        }
        let sock = sock_of(fd)?;
        let mut s = sock.lock();
        match s.state {
            stream::LISTENING => return Ok(0),
            stream::INIT | stream::BOUND => {}
            _ => return Err(libc::EINVAL),
        }
        // SAFETY: our id.
        if unsafe { id::uroce_cm_rdma_listen(s.id, backlog) } != 0 {
            return Err(crate::errno::last());
        }
        s.state = stream::LISTENING;
        Ok(0)
    })();
    r.unwrap_or_else(fail)
}

/// Copies `src` into the caller's sockaddr, truncated to `*len`; `*len`
/// set to its full size (getpeername(2)).
unsafe fn copy_addr(
    src: *const libc::sockaddr,
    dst: *mut libc::sockaddr,
    len: *mut libc::socklen_t,
) -> Result<(), c_int> {
    if dst.is_null() || len.is_null() {
        return Err(libc::EFAULT);
    }
    // SAFETY: our id's address (a sockaddr_storage), the caller's buffers.
    unsafe {
        let full = match (*src).sa_family as c_int {
            libc::AF_INET6 => std::mem::size_of::<libc::sockaddr_in6>(),
            _ => std::mem::size_of::<libc::sockaddr_in>(),
        };
        let n = full.min(*len as usize);
        std::ptr::copy_nonoverlapping(src as *const u8, dst as *mut u8, n);
        *len = full as libc::socklen_t;
    }
    Ok(())
}

fn peer_of(s: &Stream) -> *const libc::sockaddr {
    // SAFETY: our live id.
    unsafe { &(*s.id).route.addr.__bindgen_anon_2.dst_addr as *const _ as *const libc::sockaddr }
}
fn local_of(s: &Stream) -> *const libc::sockaddr {
    // SAFETY: our live id.
    unsafe { &(*s.id).route.addr.__bindgen_anon_1.src_addr as *const _ as *const libc::sockaddr }
}

/// `rs_accept` for one CONNECT_REQUEST: a socket on its own channel, its
/// QP and buffers, the rs_conn_data answer in the REP.
fn accept_one(l: &Stream, nid: *mut rdma_cm_id, data: &[u8], req: rdma_conn_param) -> Result<Stream, c_int> {
    let reject = |e: c_int| {
        // SAFETY: the request's id, not yet owned by a socket.
        unsafe {
            id::uroce_cm_rdma_reject(nid, std::ptr::null(), 0);
            id::uroce_cm_rdma_destroy_id(nid);
        }
        e
    };
    let cd = match wire::ConnData::decode(data) {
        Some(c) if c.usable() => c,
        _ => return Err(reject(libc::EPROTO)),
    };
    // SAFETY: plain constructor.
    let ch = unsafe { crate::rdmacm::channel::uroce_cm_rdma_create_event_channel() };
    if ch.is_null() {
        return Err(reject(crate::errno::last()));
    }
    // SAFETY: the request's id and our new channel.
    if unsafe { id::uroce_cm_rdma_migrate_id(nid, ch) } != 0 {
        let e = crate::errno::last();
        // SAFETY: an empty channel of ours, read by no one.
        unsafe { crate::rdmacm::channel::destroy(ch, true) };
        return Err(reject(e));
    }
    let mut s = Stream::adopt(nid, ch, l);
    // From here the socket owns the id: dropping it destroys the id.
    let r = (|| {
        s.create_ep()?;
        s.save_conn_data(&cd);
        let mine = s.conn_data().encode();
        let mut p = req;
        p.private_data = mine.as_ptr() as *const c_void;
        p.private_data_len = mine.len() as u8;
        // SAFETY: the socket's id; the param and its data live across the call.
        if unsafe { id::uroce_cm_rdma_accept(s.id, &mut p) } != 0 {
            return Err(crate::errno::last());
        }
        Ok(())
    })();
    if let Err(e) = r {
        // SAFETY: the socket's id, never accepted.
        unsafe { id::uroce_cm_rdma_reject(s.id, std::ptr::null(), 0) };
        return Err(e);
    }
    s.state = stream::CONNECT_RDWR;
    Ok(s)
}

#[no_mangle]
pub unsafe extern "C" fn uroce_cm_raccept(fd: c_int, addr: *mut libc::sockaddr, len: *mut libc::socklen_t) -> c_int {
    let r = (|| {
        if dapi::dsock(fd).is_some() {
            return Err(libc::EOPNOTSUPP);
        }
        let sock = sock_of(fd)?;
        let _waiting = sock.wake.enter();
        sock.wake.drain();
        loop {
            let s = sock.lock();
            if s.state != stream::LISTENING {
                return Err(libc::EINVAL);
            }
            while let Some((kind, _, data, nid, req)) = s.next_event() {
                if kind != rdma_cm_event_type_RDMA_CM_EVENT_CONNECT_REQUEST {
                    continue;
                }
                let Ok(ns) = accept_one(&s, nid, &data, req) else { continue };
                if !addr.is_null() && !len.is_null() {
                    // SAFETY: the caller's buffers.
                    let _ = unsafe { copy_addr(peer_of(&ns), addr, len) };
                }
                return Ok(insert(ns));
            }
            if nonblocking(&s, 0) {
                return Err(libc::EAGAIN);
            }
            let mut p = [
                libc::pollfd { fd: s.fd, events: libc::POLLIN, revents: 0 },
                libc::pollfd { fd: sock.wake.fd(), events: libc::POLLIN, revents: 0 },
            ];
            drop(s);
            // SAFETY: two pollfds (a negative fd is ignored).
            if unsafe { libc::poll(p.as_mut_ptr(), 2, sock.wake.slice(-1)) } < 0 && crate::errno::last() == libc::EINTR
            {
                return Err(libc::EINTR);
            }
            if p[1].revents != 0 {
                sock.wake.drain();
            }
        }
    })();
    r.unwrap_or_else(fail)
}

#[no_mangle]
pub unsafe extern "C" fn uroce_cm_rconnect(fd: c_int, addr: *const libc::sockaddr, len: libc::socklen_t) -> c_int {
    let r = (|| {
        if let Some(d) = dapi::dsock(fd) {
            // SAFETY: the caller's address of `len` bytes.
            unsafe { sockaddr_ok(addr, len)? };
            // SAFETY: checked.
            return dapi::connect(&d, unsafe { dapi::addr_of(addr)? });
        }
        let sock = sock_of(fd)?;
        // SAFETY: the caller's address of `len` bytes.
        unsafe { sockaddr_ok(addr, len)? };
        let mut s = sock.lock();
        match s.state {
            stream::INIT | stream::BOUND => {
                let n = (len as usize).min(std::mem::size_of::<libc::sockaddr_storage>());
                // SAFETY: `n` bytes of the caller's checked address into ours.
                unsafe { std::ptr::copy_nonoverlapping(addr as *const u8, &mut s.dst as *mut _ as *mut u8, n) };
            }
            st if st & stream::CONNECTED != 0 => return Err(libc::EISCONN),
            st if st & stream::OPENING != 0 => {}
            stream::LISTENING => return Err(libc::EINVAL),
            _ => return Err(libc::ENOTCONN),
        }
        let _waiting = sock.wake.enter();
        sock.wake.drain();
        loop {
            match s.drive_connect() {
                Ok(()) => return Ok(0),
                Err(libc::EINPROGRESS) if !nonblocking(&s, 0) => {
                    let mut p = [
                        libc::pollfd { fd: s.fd, events: libc::POLLIN, revents: 0 },
                        libc::pollfd { fd: sock.wake.fd(), events: libc::POLLIN, revents: 0 },
                    ];
                    drop(s);
                    // SAFETY: two pollfds (a negative fd is ignored).
                    unsafe { libc::poll(p.as_mut_ptr(), 2, sock.wake.slice(-1)) };
                    if p[1].revents != 0 {
                        sock.wake.drain();
                    }
                    s = sock.lock();
                }
                Err(e) => return Err(e),
            }
        }
    })();
    r.unwrap_or_else(fail)
}

/// A data call on a socket still connecting continues the connection
/// (EAGAIN while it is under way); a socket never connected: ENOTCONN.
fn ready_for_data(s: &mut Stream) -> Result<(), c_int> {
    if s.state & stream::OPENING != 0 {
        return match s.drive_connect() {
            Err(libc::EINPROGRESS) => Err(libc::EAGAIN),
            r => r,
        };
    }
    if s.state & (stream::CONNECTED | stream::DISCONNECTED | stream::ERROR) == 0 {
        return Err(libc::ENOTCONN);
    }
    Ok(())
}

/// `rsend`/`rsendv`: `src(dst, n)` copies the next n bytes of the caller's data.
fn send_with(fd: c_int, len: usize, flags: c_int, src: &mut dyn FnMut(*mut u8, usize)) -> isize {
    send_to(fd, len, flags, None, src)
}

fn send_to(
    fd: c_int,
    len: usize,
    flags: c_int,
    to: Option<std::net::SocketAddr>,
    src: &mut dyn FnMut(*mut u8, usize),
) -> isize {
    if let Some(d) = dapi::dsock(fd) {
        if len > MAX_DGRAM {
            return fail(libc::EMSGSIZE);
        }
        let mut v = vec![0u8; len];
        src(v.as_mut_ptr(), len);
        return match dapi::send(&d, to, &v, flags) {
            Ok(n) => n as isize,
            Err(e) => fail(e),
        };
    }
    let sock = match sock_of(fd) {
        Ok(s) => s,
        Err(e) => return fail(e),
    };
    let _sg = guard(&sock.slock);
    let nb = {
        let mut s = sock.lock();
        if let Err(e) = ready_for_data(&mut s) {
            return fail(e);
        }
        if s.state & stream::WRITABLE == 0 {
            return fail(ended(&mut s));
        }
        nonblocking(&s, flags)
    };
    if let Err(e) = flush_iomaps(&sock, nb) {
        return fail(e);
    }
    let mut left = len;
    let mut olen = wire::OLAP_START;
    let mut err = 0;
    while left > 0 {
        let mut s = sock.lock();
        if !s.can_send() {
            drop(s);
            if let Err(e) = wait(&sock, nb, Stream::conn_can_send) {
                err = e;
                break;
            }
            s = sock.lock();
            if s.state & stream::WRITABLE == 0 {
                err = ended(&mut s);
                break;
            }
        }
        match s.write_some(src, left, &mut olen) {
            Ok(n) => left -= n as usize,
            Err(e) => {
                err = e;
                break;
            }
        }
    }
    if err != 0 && left == len {
        return fail(err);
    }
    (len - left) as isize
}

/// Why a socket cannot send: the error its connection ended with (once),
/// else ECONNRESET.
fn ended(s: &mut Stream) -> c_int {
    if s.state & stream::ERROR != 0 && s.err != 0 {
        std::mem::take(&mut s.err)
    } else {
        libc::ECONNRESET
    }
}

/// `rrecv`: `dst(src, n)` takes the next n received bytes (`rrecvv` fills
/// every vector, rsockets only the first).
///
/// A call that returns data or end of stream leaves errno as it found it:
/// the library's own non-blocking reads (CM events, CQ events) fail EAGAIN
/// inside it, and a caller that checks errno after a 0 return (rstream's
/// `recv_xfer` retries on EAGAIN) would spin on a connection that ended.
fn recv_with(fd: c_int, len: usize, flags: c_int, bufs: &mut dyn FnMut(&mut Stream, usize, bool) -> usize) -> isize {
    let saved = crate::errno::last();
    let sock = match sock_of(fd) {
        Ok(s) => s,
        Err(e) => return fail(e),
    };
    let _rg = guard(&sock.rlock);
    let nb = {
        let mut s = sock.lock();
        if let Err(e) = ready_for_data(&mut s) {
            return fail(e);
        }
        nonblocking(&s, flags)
    };
    let peek = flags & libc::MSG_PEEK != 0;
    let mut left = len;
    let mut err = 0;
    loop {
        if !sock.lock().have_rdata() {
            if let Err(e) = wait(&sock, nb, Stream::conn_have_rdata) {
                err = e;
                break;
            }
        }
        let mut s = sock.lock();
        let n = bufs(&mut s, len - left, peek);
        left -= n;
        if !peek {
            s.update_credits();
        }
        if peek || left == 0 || flags & libc::MSG_WAITALL == 0 || s.state & stream::READABLE == 0 {
            break;
        }
    }
    if err == 0 && left == len && len > 0 && !peek {
        // A connection that ended in error (EPROTO: the peer broke the
        // protocol; EIO: the transport failed) says so once, as a TCP
        // socket's reset does. rsocket.c returns 0 with errno untouched,
        // and rstream's non-blocking loops retry that 0 on a stale EAGAIN
        // for good.
        let mut s = sock.lock();
        if s.state & stream::ERROR != 0 && s.err != 0 {
            err = ended(&mut s);
        }
    }
    if err != 0 && left == len {
        return fail(err);
    }
    crate::errno::set_errno(saved);
    (len - left) as isize
}

fn check_buf(p: *const c_void, len: usize) -> Result<(), c_int> {
    if p.is_null() && len > 0 {
        return Err(libc::EFAULT);
    }
    if len > isize::MAX as usize {
        return Err(libc::EINVAL);
    }
    Ok(())
}

#[no_mangle]
pub unsafe extern "C" fn uroce_cm_rsend(fd: c_int, buf: *const c_void, len: usize, flags: c_int) -> isize {
    if let Err(e) = check_buf(buf, len) {
        return if !known(fd) { fail(libc::EBADF) } else { fail(e) };
    }
    let mut at = buf as *const u8;
    send_with(fd, len, flags, &mut |dst, n| {
        // SAFETY: the caller's buffer holds `len` bytes; n bytes are taken in order.
        unsafe {
            std::ptr::copy_nonoverlapping(at, dst, n);
            at = at.add(n);
        }
    })
}

#[no_mangle]
pub unsafe extern "C" fn uroce_cm_rwrite(fd: c_int, buf: *const c_void, len: usize) -> isize {
    // SAFETY: forwarded.
    unsafe { uroce_cm_rsend(fd, buf, len, 0) }
}

#[no_mangle]
pub unsafe extern "C" fn uroce_cm_rsendto(
    fd: c_int,
    buf: *const c_void,
    len: usize,
    flags: c_int,
    dst: *const libc::sockaddr,
    dlen: libc::socklen_t,
) -> isize {
    if dapi::dsock(fd).is_some() && !dst.is_null() {
        if let Err(e) = check_buf(buf, len) {
            return fail(e);
        }
        // SAFETY: the caller's address of `dlen` bytes.
        let to = match unsafe { sockaddr_ok(dst, dlen).and_then(|_| dapi::addr_of(dst)) } {
            Ok(t) => t,
            Err(e) => return fail(e),
        };
        let at = buf as *const u8;
        return send_to(fd, len, flags, Some(to), &mut |d, n| {
            // SAFETY: the caller's buffer of `len` bytes, taken once.
            unsafe { std::ptr::copy_nonoverlapping(at, d, n) }
        });
    }
    if lookup(fd).is_none() {
        return fail(if known(fd) { libc::EDESTADDRREQ } else { libc::EBADF });
    }
    if !dst.is_null() || dlen != 0 {
        return fail(libc::EISCONN);
    }
    // SAFETY: forwarded.
    unsafe { uroce_cm_rsend(fd, buf, len, flags) }
}

/// The iovecs checked and their total.
unsafe fn iov_total(iov: *const libc::iovec, cnt: c_int) -> Result<usize, c_int> {
    if !(0..=IOV_MAX).contains(&cnt) {
        return Err(libc::EINVAL);
    }
    if cnt > 0 && iov.is_null() {
        return Err(libc::EFAULT);
    }
    let mut total = 0usize;
    for i in 0..cnt as usize {
        // SAFETY: cnt iovecs of the caller.
        let v = unsafe { &*iov.add(i) };
        check_buf(v.iov_base, v.iov_len)?;
        total = total.checked_add(v.iov_len).filter(|t| *t <= isize::MAX as usize).ok_or(libc::EINVAL)?;
    }
    Ok(total)
}

unsafe fn sendv(fd: c_int, iov: *const libc::iovec, cnt: c_int, flags: c_int) -> isize {
    if !known(fd) {
        return fail(libc::EBADF);
    }
    // SAFETY: the caller's vectors.
    let total = match unsafe { iov_total(iov, cnt) } {
        Ok(t) => t,
        Err(e) => return fail(e),
    };
    let (mut i, mut off) = (0usize, 0usize);
    send_with(fd, total, flags, &mut |mut dst, mut n| {
        while n > 0 {
            // SAFETY: checked vectors; `n` never exceeds what is left of them.
            unsafe {
                let v = &*iov.add(i);
                let k = (v.iov_len - off).min(n);
                std::ptr::copy_nonoverlapping((v.iov_base as *const u8).add(off), dst, k);
                dst = dst.add(k);
                n -= k;
                off += k;
                if off == v.iov_len {
                    i += 1;
                    off = 0;
                }
            }
        }
    })
}

#[no_mangle]
pub unsafe extern "C" fn uroce_cm_rwritev(fd: c_int, iov: *const libc::iovec, cnt: c_int) -> isize {
    // SAFETY: forwarded.
    unsafe { sendv(fd, iov, cnt, 0) }
}

#[no_mangle]
pub unsafe extern "C" fn uroce_cm_rsendmsg(fd: c_int, msg: *const libc::msghdr, flags: c_int) -> isize {
    if !known(fd) {
        return fail(libc::EBADF);
    }
    if msg.is_null() {
        return fail(libc::EFAULT);
    }
    // SAFETY: the caller's msghdr.
    let m = unsafe { &*msg };
    if !m.msg_control.is_null() && m.msg_controllen != 0 {
        return fail(libc::EOPNOTSUPP);
    }
    if (!m.msg_name.is_null() || m.msg_namelen != 0) && dapi::dsock(fd).is_none() {
        return fail(libc::EISCONN);
    }
    if let (Some(_), false) = (dapi::dsock(fd), m.msg_name.is_null()) {
        // A datagram to msg_name: gathered, then as rsendto.
        // SAFETY: the caller's vectors.
        let total = match unsafe { iov_total(m.msg_iov, m.msg_iovlen as c_int) } {
            Ok(t) if t <= MAX_DGRAM => t,
            Ok(_) => return fail(libc::EMSGSIZE),
            Err(e) => return fail(e),
        };
        let mut v = Vec::with_capacity(total);
        for i in 0..m.msg_iovlen {
            // SAFETY: checked vectors.
            let io = unsafe { &*m.msg_iov.add(i) };
            if io.iov_len > 0 {
                // SAFETY: as above.
                v.extend_from_slice(unsafe { std::slice::from_raw_parts(io.iov_base as *const u8, io.iov_len) });
            }
        }
        // SAFETY: forwarded with the caller's name.
        return unsafe {
            uroce_cm_rsendto(fd, v.as_ptr() as *const c_void, v.len(), flags, m.msg_name as *const _, m.msg_namelen)
        };
    }
    // SAFETY: the caller's vectors.
    unsafe { sendv(fd, m.msg_iov, m.msg_iovlen as c_int, flags) }
}

#[no_mangle]
pub unsafe extern "C" fn uroce_cm_rrecv(fd: c_int, buf: *mut c_void, len: usize, flags: c_int) -> isize {
    if let Err(e) = check_buf(buf, len) {
        return if !known(fd) { fail(libc::EBADF) } else { fail(e) };
    }
    if let Some(d) = dapi::dsock(fd) {
        return match dapi::recv(&d, buf as *mut u8, len, flags) {
            Ok((n, _)) => n as isize,
            Err(e) => fail(e),
        };
    }
    recv_with(fd, len, flags, &mut |s, done, peek| {
        // SAFETY: the caller's buffer of `len` bytes, `done` already filled.
        s.read_some(unsafe { (buf as *mut u8).add(done) }, len - done, peek)
    })
}

#[no_mangle]
pub unsafe extern "C" fn uroce_cm_rread(fd: c_int, buf: *mut c_void, len: usize) -> isize {
    // SAFETY: forwarded.
    unsafe { uroce_cm_rrecv(fd, buf, len, 0) }
}

#[no_mangle]
pub unsafe extern "C" fn uroce_cm_rrecvfrom(
    fd: c_int,
    buf: *mut c_void,
    len: usize,
    flags: c_int,
    src: *mut libc::sockaddr,
    slen: *mut libc::socklen_t,
) -> isize {
    if let Some(d) = dapi::dsock(fd) {
        if let Err(e) = check_buf(buf, len) {
            return fail(e);
        }
        return match dapi::recv(&d, buf as *mut u8, len, flags) {
            Ok((n, from)) => {
                if !src.is_null() && !slen.is_null() {
                    let ss = crate::rdmacm::sockaddr::sockaddr_of(from);
                    // SAFETY: the caller's buffers.
                    let _ = unsafe { copy_addr(&ss as *const _ as *const libc::sockaddr, src, slen) };
                }
                n as isize
            }
            Err(e) => fail(e),
        };
    }
    // SAFETY: forwarded.
    let n = unsafe { uroce_cm_rrecv(fd, buf, len, flags) };
    if n > 0 && !src.is_null() {
        // SAFETY: forwarded; the caller's buffers.
        unsafe { uroce_cm_rgetpeername(fd, src, slen) };
    }
    n
}

unsafe fn recvv(fd: c_int, iov: *const libc::iovec, cnt: c_int, flags: c_int) -> isize {
    if !known(fd) {
        return fail(libc::EBADF);
    }
    // SAFETY: the caller's vectors.
    let total = match unsafe { iov_total(iov, cnt) } {
        Ok(t) => t,
        Err(e) => return fail(e),
    };
    if dapi::dsock(fd).is_some() {
        // One datagram into a bounce buffer, scattered over the vectors.
        let mut v = vec![0u8; total.min(MAX_DGRAM)];
        // SAFETY: our buffer.
        let n = unsafe { uroce_cm_rrecv(fd, v.as_mut_ptr() as *mut c_void, v.len(), flags) };
        if n > 0 {
            let mut at = 0usize;
            for i in 0..cnt as usize {
                // SAFETY: checked vectors.
                let io = unsafe { &*iov.add(i) };
                let k = io.iov_len.min(n as usize - at);
                // SAFETY: inside the caller's vector.
                unsafe { std::ptr::copy_nonoverlapping(v.as_ptr().add(at), io.iov_base as *mut u8, k) };
                at += k;
            }
        }
        return n;
    }
    recv_with(fd, total, flags, &mut |s, done, peek| {
        // Fill the vectors from byte `done` on.
        let (mut skip, mut got) = (done, 0usize);
        for i in 0..cnt as usize {
            // SAFETY: checked vectors.
            let v = unsafe { &*iov.add(i) };
            if skip >= v.iov_len {
                skip -= v.iov_len;
                continue;
            }
            let want = v.iov_len - skip;
            // SAFETY: inside the caller's vector. A peek reads from the
            // queue head each time, so only the first vector is peeked.
            let n = s.read_some(unsafe { (v.iov_base as *mut u8).add(skip) }, want, peek);
            skip = 0;
            got += n;
            if n < want || peek {
                break;
            }
        }
        got
    })
}

#[no_mangle]
pub unsafe extern "C" fn uroce_cm_rreadv(fd: c_int, iov: *const libc::iovec, cnt: c_int) -> isize {
    // SAFETY: forwarded.
    unsafe { recvv(fd, iov, cnt, 0) }
}

#[no_mangle]
pub unsafe extern "C" fn uroce_cm_rrecvmsg(fd: c_int, msg: *mut libc::msghdr, flags: c_int) -> isize {
    if !known(fd) {
        return fail(libc::EBADF);
    }
    if msg.is_null() {
        return fail(libc::EFAULT);
    }
    // SAFETY: the caller's msghdr.
    let m = unsafe { &mut *msg };
    if !m.msg_control.is_null() && m.msg_controllen != 0 {
        return fail(libc::EOPNOTSUPP);
    }
    // SAFETY: the caller's vectors.
    let n = unsafe { recvv(fd, m.msg_iov, m.msg_iovlen as c_int, flags) };
    if n >= 0 {
        m.msg_flags = 0;
        if !m.msg_name.is_null() {
            let mut l = m.msg_namelen;
            // SAFETY: the caller's name buffer.
            if unsafe { uroce_cm_rgetpeername(fd, m.msg_name as *mut libc::sockaddr, &mut l) } == 0 {
                m.msg_namelen = l;
            }
        }
    }
    n
}

/// `rshutdown` on a locked socket (also rclose's first step).
fn shutdown(sock: &Sock, how: c_int) -> Result<(), c_int> {
    {
        let mut s = sock.lock();
        if s.state & stream::CONNECTED == 0 {
            if s.state & stream::DISCONNECTED != 0 {
                s.qp_to_err();
            }
            return match s.state {
                stream::INIT | stream::BOUND | stream::CONNECT_ERROR => Err(libc::ENOTCONN),
                _ => Ok(()),
            };
        }
        let ctrl = match how {
            libc::SHUT_RDWR => {
                s.state &= !(stream::READABLE | stream::WRITABLE);
                wire::CTRL_DISCONNECT
            }
            libc::SHUT_WR => {
                s.state &= !stream::WRITABLE;
                if s.state & stream::READABLE != 0 {
                    wire::CTRL_SHUTDOWN
                } else {
                    wire::CTRL_DISCONNECT
                }
            }
            _ => {
                s.state &= !stream::READABLE;
                if s.state & stream::WRITABLE != 0 {
                    return Ok(());
                }
                wire::CTRL_DISCONNECT
            }
        };
        drop(s);
        wait(sock, false, Stream::conn_can_send_ctrl)?;
        let mut s = sock.lock();
        s.send_ctrl(ctrl)?;
    }
    if sock.lock().state & stream::CONNECTED != 0 {
        wait(sock, false, Stream::all_sends_done)?;
    }
    let mut s = sock.lock();
    if s.state & stream::DISCONNECTED != 0 {
        s.qp_to_err();
    }
    Ok(())
}

#[no_mangle]
pub extern "C" fn uroce_cm_rshutdown(fd: c_int, how: c_int) -> c_int {
    let r = (|| {
        if !matches!(how, libc::SHUT_RD | libc::SHUT_WR | libc::SHUT_RDWR) && known(fd) {
            return Err(libc::EINVAL);
        }
        if let Some(d) = dapi::dsock(fd) {
            return dapi::shutdown(&d);
        }
        let sock = sock_of(fd)?;
        let _sg = guard(&sock.slock);
        shutdown(&sock, how).map(|_| 0)
    })();
    r.unwrap_or_else(fail)
}

#[no_mangle]
pub extern "C" fn uroce_cm_rclose(fd: c_int) -> c_int {
    if let Some(d) = dtable().remove(&fd) {
        drop(d);
        return 0;
    }
    let Some(sock) = table().remove(&fd) else { return fail(libc::EBADF) };
    if sock.lock().state & stream::CONNECTED != 0 {
        let _ = shutdown(&sock, libc::SHUT_RDWR);
    }
    // The Stream (id, QP, buffers, channel) goes with the last reference:
    // a thread still inside a call on it finishes first.
    drop(sock);
    0
}

#[no_mangle]
pub unsafe extern "C" fn uroce_cm_rgetpeername(
    fd: c_int,
    addr: *mut libc::sockaddr,
    len: *mut libc::socklen_t,
) -> c_int {
    let r = (|| {
        if let Some(d) = dapi::dsock(fd) {
            return dapi::name(&d, true, addr, len);
        }
        let sock = sock_of(fd)?;
        let s = sock.lock();
        if s.state & (stream::CONNECTED | stream::DISCONNECTED | stream::ERROR) == 0 {
            return Err(libc::ENOTCONN);
        }
        // SAFETY: the caller's buffers.
        unsafe { copy_addr(peer_of(&s), addr, len) }.map(|_| 0)
    })();
    r.unwrap_or_else(fail)
}

#[no_mangle]
pub unsafe extern "C" fn uroce_cm_rgetsockname(
    fd: c_int,
    addr: *mut libc::sockaddr,
    len: *mut libc::socklen_t,
) -> c_int {
    let r = (|| {
        if let Some(d) = dapi::dsock(fd) {
            return dapi::name(&d, false, addr, len);
        }
        let sock = sock_of(fd)?;
        let s = sock.lock();
        // SAFETY: the caller's buffers.
        unsafe { copy_addr(local_of(&s), addr, len) }.map(|_| 0)
    })();
    r.unwrap_or_else(fail)
}

unsafe fn int_opt(v: *const c_void, len: libc::socklen_t) -> Result<c_int, c_int> {
    if v.is_null() {
        return Err(libc::EFAULT);
    }
    if (len as usize) < std::mem::size_of::<c_int>() {
        return Err(libc::EINVAL);
    }
    // SAFETY: at least an int of the caller.
    Ok(unsafe { std::ptr::read_unaligned(v as *const c_int) })
}

#[no_mangle]
pub unsafe extern "C" fn uroce_cm_rsetsockopt(
    fd: c_int,
    level: c_int,
    name: c_int,
    v: *const c_void,
    len: libc::socklen_t,
) -> c_int {
    let r = (|| {
        if let Some(d) = dapi::dsock(fd) {
            return dapi::setsockopt(&d, level, name, v, len);
        }
        let sock = sock_of(fd)?;
        let mut s = sock.lock();
        let unsupported = Err(libc::EOPNOTSUPP);
        // (the option word, whether it is on) when one is recorded.
        let mut record: Option<(u8, bool)> = None;
        match (level, name) {
            (libc::SOL_SOCKET, libc::SO_LINGER) => {
                if v.is_null() {
                    return Err(libc::EFAULT);
                }
                if (len as usize) < std::mem::size_of::<libc::linger>() {
                    return Err(libc::EINVAL);
                }
                // SAFETY: a linger of the caller. Inverted as rsockets keeps it.
                let on = unsafe { std::ptr::read_unaligned(v as *const libc::linger) }.l_onoff != 0;
                record = Some((0, !on));
            }
            (libc::SOL_SOCKET, _) => {
                // SAFETY: the caller's value.
                let x = unsafe { int_opt(v, len)? };
                match name {
                    libc::SO_REUSEADDR => {
                        let mut on: c_int = x;
                        // SAFETY: our id; an int option. Errors ignored as rsockets
                        // does where the id cannot take it any more.
                        unsafe {
                            id::uroce_cm_rdma_set_option(s.id, 0, 1, &mut on as *mut c_int as *mut c_void, 4);
                        }
                        record = Some((0, x != 0));
                    }
                    libc::SO_RCVBUF => {
                        if !s.has_bufs() {
                            s.rbuf_size = ((x.max(0) as u32).saturating_mul(2)).clamp(2 * wire::SNDLOWAT, MAX_BUF);
                        }
                    }
                    libc::SO_SNDBUF => {
                        if !s.has_bufs() {
                            s.sbuf_size = ((x.max(0) as u32).saturating_mul(2)).clamp(2 * wire::SNDLOWAT, MAX_BUF);
                        }
                    }
                    libc::SO_KEEPALIVE => {
                        if x != 0 && s.keepalive_time == 0 {
                            s.keepalive_time = 7200;
                        }
                        record = Some((0, x != 0));
                    }
                    libc::SO_OOBINLINE => record = Some((0, x != 0)),
                    _ => return unsupported,
                }
            }
            (libc::IPPROTO_TCP, _) => {
                // SAFETY: the caller's value.
                let x = unsafe { int_opt(v, len)? };
                match name {
                    libc::TCP_KEEPCNT | libc::TCP_KEEPINTVL | libc::TCP_MAXSEG => {}
                    libc::TCP_KEEPIDLE => {
                        if x <= 0 {
                            return Err(libc::EINVAL);
                        }
                        s.keepalive_time = x as u32;
                    }
                    libc::TCP_NODELAY => record = Some((1, x != 0)),
                    _ => return unsupported,
                }
            }
            (libc::IPPROTO_IPV6, libc::IPV6_V6ONLY) => {
                // SAFETY: the caller's value.
                let mut x = unsafe { int_opt(v, len)? };
                // SAFETY: our id; an int option (RDMA_OPTION_ID_AFONLY).
                if unsafe { id::uroce_cm_rdma_set_option(s.id, 0, 2, &mut x as *mut c_int as *mut c_void, 4) } != 0 {
                    return Err(crate::errno::last());
                }
                record = Some((2, x != 0));
            }
            (SOL_RDMA, _) => {
                if s.state >= stream::OPENING {
                    return Err(libc::EINVAL);
                }
                if name == RDMA_ROUTE {
                    return unsupported;
                }
                // SAFETY: the caller's value.
                let x = unsafe { int_opt(v, len)? } as u32;
                let cap = wire::QP_MAX_SIZE as u32;
                match name {
                    RDMA_SQSIZE => s.sq_size = x.min(cap) as u16,
                    RDMA_RQSIZE => s.rq_size = x.min(cap) as u16,
                    RDMA_INLINE => s.sq_inline = x.min(cap),
                    RDMA_IOMAPSIZE => {
                        s.target_iomap_size =
                            wire::scale_to_value(wire::value_to_scale(x.min(255 << 8), 8) & 0xFF, 8) as u16
                    }
                    _ => return unsupported,
                }
            }
            _ => return unsupported,
        }
        if let Some((word, on)) = record {
            let bit = 1u64 << (name as u32 & 63);
            let w = match word {
                0 => &mut s.so_opts,
                1 => &mut s.tcp_opts,
                _ => &mut s.ipv6_opts,
            };
            if on {
                *w |= bit;
            } else {
                *w &= !bit;
            }
        }
        Ok(0)
    })();
    r.unwrap_or_else(fail)
}

#[no_mangle]
pub unsafe extern "C" fn uroce_cm_rgetsockopt(
    fd: c_int,
    level: c_int,
    name: c_int,
    v: *mut c_void,
    len: *mut libc::socklen_t,
) -> c_int {
    let r = (|| {
        if let Some(d) = dapi::dsock(fd) {
            return dapi::getsockopt(&d, level, name, v, len);
        }
        let sock = sock_of(fd)?;
        let mut s = sock.lock();
        if v.is_null() || len.is_null() {
            return Err(libc::EFAULT);
        }
        let bit = |w: u64| (w >> (name as u32 & 63)) & 1;
        let val: c_int = match (level, name) {
            (libc::SOL_SOCKET, libc::SO_LINGER) => {
                // SAFETY: the caller's length.
                if (unsafe { *len } as usize) < std::mem::size_of::<libc::linger>() {
                    return Err(libc::EINVAL);
                }
                let l = libc::linger { l_onoff: (bit(s.so_opts) == 0) as c_int, l_linger: 0 };
                // SAFETY: a linger's room, checked.
                unsafe {
                    std::ptr::write_unaligned(v as *mut libc::linger, l);
                    *len = std::mem::size_of::<libc::linger>() as libc::socklen_t;
                }
                return Ok(0);
            }
            (libc::SOL_SOCKET, libc::SO_REUSEADDR | libc::SO_KEEPALIVE | libc::SO_OOBINLINE) => bit(s.so_opts) as c_int,
            (libc::SOL_SOCKET, libc::SO_RCVBUF) => s.rbuf_size as c_int,
            (libc::SOL_SOCKET, libc::SO_SNDBUF) => s.sbuf_size as c_int,
            (libc::SOL_SOCKET, libc::SO_ERROR) => std::mem::take(&mut s.err),
            (libc::SOL_SOCKET, libc::SO_TYPE) => libc::SOCK_STREAM,
            (libc::IPPROTO_TCP, libc::TCP_KEEPCNT | libc::TCP_KEEPINTVL) => 1,
            (libc::IPPROTO_TCP, libc::TCP_KEEPIDLE) => s.keepalive_time as c_int,
            (libc::IPPROTO_TCP, libc::TCP_NODELAY) => bit(s.tcp_opts) as c_int,
            (libc::IPPROTO_TCP, libc::TCP_MAXSEG) => 1024,
            (libc::IPPROTO_IPV6, libc::IPV6_V6ONLY) => bit(s.ipv6_opts) as c_int,
            (SOL_RDMA, RDMA_SQSIZE) => s.sq_size as c_int,
            (SOL_RDMA, RDMA_RQSIZE) => s.rq_size as c_int,
            (SOL_RDMA, RDMA_INLINE) => s.sq_inline as c_int,
            (SOL_RDMA, RDMA_IOMAPSIZE) => s.target_iomap_size as c_int,
            _ => return Err(libc::EOPNOTSUPP),
        };
        // SAFETY: the caller's length.
        if (unsafe { *len } as usize) < std::mem::size_of::<c_int>() {
            return Err(libc::EINVAL);
        }
        // SAFETY: an int's room, checked.
        unsafe {
            std::ptr::write_unaligned(v as *mut c_int, val);
            *len = std::mem::size_of::<c_int>() as libc::socklen_t;
        }
        Ok(0)
    })();
    r.unwrap_or_else(fail)
}

/// `rfcntl(fd, cmd, ...)`: F_GETFL and F_SETFL (the third argument is
/// read as an int, as the variadic call passes it).
#[no_mangle]
pub extern "C" fn uroce_cm_rfcntl(fd: c_int, cmd: c_int, arg: c_int) -> c_int {
    let r = (|| {
        if let Some(d) = dapi::dsock(fd) {
            let mut d = d.lock();
            return match cmd {
                libc::F_GETFL => Ok(d.fd_flags),
                libc::F_SETFL => {
                    d.fd_flags = arg;
                    Ok(0)
                }
                _ => Err(libc::EOPNOTSUPP),
            };
        }
        let sock = sock_of(fd)?;
        let mut s = sock.lock();
        match cmd {
            libc::F_GETFL => Ok(s.fd_flags),
            libc::F_SETFL => {
                s.fd_flags = arg;
                Ok(0)
            }
            _ => Err(libc::EOPNOTSUPP),
        }
    })();
    r.unwrap_or_else(fail)
}

/// Writes the socket's queued iomap entries to the peer (`rs_send_iomaps`),
/// waiting for send room as `rsend` does.
fn flush_iomaps(sock: &Sock, nb: bool) -> Result<(), c_int> {
    loop {
        let mut s = sock.lock();
        if !s.iomaps_pending() {
            return Ok(());
        }
        if !s.can_send() {
            drop(s);
            wait(sock, nb, Stream::conn_can_send)?;
            s = sock.lock();
            if s.state & stream::WRITABLE == 0 {
                return Err(libc::ECONNRESET);
            }
            continue;
        }
        s.send_one_iomap()?;
    }
}

#[no_mangle]
pub unsafe extern "C" fn uroce_cm_riomap(
    fd: c_int,
    buf: *mut c_void,
    len: usize,
    prot: c_int,
    _flags: c_int,
    off: i64,
) -> i64 {
    let r = (|| {
        if dapi::dsock(fd).is_some() {
            return Err(libc::EINVAL);
        }
        let sock = sock_of(fd)?;
        let _sg = guard(&sock.slock);
        let mut s = sock.lock();
        s.iomap(buf, len, prot, off)
    })();
    r.unwrap_or_else(fail)
}

#[no_mangle]
pub unsafe extern "C" fn uroce_cm_riounmap(fd: c_int, buf: *mut c_void, len: usize) -> c_int {
    let r = (|| {
        if dapi::dsock(fd).is_some() {
            return Err(libc::EINVAL);
        }
        let sock = sock_of(fd)?;
        let _sg = guard(&sock.slock);
        let mut s = sock.lock();
        s.iounmap(buf, len).map(|_| 0)
    })();
    r.unwrap_or_else(fail)
}

/// `riowrite`: straight into the peer's iomapped buffer at `off`; the
/// bytes written (fewer when the mapping ends), -1 with errno.
#[no_mangle]
pub unsafe extern "C" fn uroce_cm_riowrite(fd: c_int, buf: *const c_void, len: usize, off: i64, flags: c_int) -> isize {
    if let Err(e) = check_buf(buf, len) {
        return fail(if !known(fd) { libc::EBADF } else { e });
    }
    if dapi::dsock(fd).is_some() {
        return fail(libc::EINVAL);
    }
    let sock = match sock_of(fd) {
        Ok(s) => s,
        Err(e) => return fail(e),
    };
    let _sg = guard(&sock.slock);
    let nb = {
        let mut s = sock.lock();
        if let Err(e) = ready_for_data(&mut s) {
            return fail(e);
        }
        nonblocking(&s, flags)
    };
    if let Err(e) = flush_iomaps(&sock, nb) {
        return fail(e);
    }
    let mut at = buf as *const u8;
    let mut src = |dst: *mut u8, n: usize| {
        // SAFETY: the caller's buffer, taken in order.
        unsafe {
            std::ptr::copy_nonoverlapping(at, dst, n);
            at = at.add(n);
        }
    };
    let (mut left, mut offset, mut olen, mut err) = (len, off as u64, wire::OLAP_START, 0);
    while left > 0 {
        let mut s = sock.lock();
        let Some(iom) = s.find_iomap(offset) else { break };
        if !s.can_send() {
            drop(s);
            if let Err(e) = wait(&sock, nb, Stream::conn_can_send) {
                err = e;
                break;
            }
            s = sock.lock();
            if s.state & stream::WRITABLE == 0 {
                err = libc::ECONNRESET;
                break;
            }
        }
        match s.write_direct(&mut src, left, offset, iom, &mut olen) {
            Ok(n) => {
                left -= n as usize;
                offset += n as u64;
            }
            Err(e) => {
                err = e;
                break;
            }
        }
    }
    if err != 0 && left == len {
        return fail(err);
    }
    (len - left) as isize
}
