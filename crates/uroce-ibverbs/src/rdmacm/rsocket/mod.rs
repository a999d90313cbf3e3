//! rsockets (`<rdma/rsocket.h>`, librdmacm 44's `rsocket`, `rsend`, …):
//! stream and datagram sockets over RDMA with rdma-core 44's wire
//! protocol, so a uroce program talks to a real rsockets peer (rxe or
//! hardware) and back.
//!
//! What is implemented: SOCK_STREAM (AF_INET/AF_INET6) over an RC QP per
//! socket connected by this crate's CM: the `struct rs_conn_data` private
//! data (version 1, credits, target SGL, first data buffer), data as RDMA
//! WRITE WITH IMM (`OP_DATA | length`) into the peer's receive buffer,
//! receive buffers republished half at a time by an RDMA write of an
//! `rs_sge` into the peer's target SGL (`OP_SGL | credits`), control
//! messages SHUTDOWN and DISCONNECT; blocking and non-blocking calls
//! (`rfcntl` O_NONBLOCK, MSG_DONTWAIT: EAGAIN), non-blocking connect
//! (EINPROGRESS, then `rpoll` POLLOUT and SO_ERROR), MSG_PEEK and
//! MSG_WAITALL, `rpoll`/`rselect` over rsockets mixed with ordinary fds,
//! the socket options rsockets knows (SOL_SOCKET, IPPROTO_TCP,
//! IPPROTO_IPV6, SOL_RDMA sizes and inline), `rshutdown`, `rclose`,
//! `rgetpeername`/`rgetsockname`.
//!
//! SOCK_DGRAM with rsockets' "ds" protocol (see [`dgram`]): the first
//! datagram to a peer over UDP behind a `ds_udp_header`, the peer's QPN
//! learnt from its `OP_CTRL` answer, then UD sends behind a `ds_header`;
//! `rsendto`/`rrecvfrom` with source addresses, `rconnect`, `rpoll`.
//! A datagram socket whose route leaves from an address no uroce device
//! has (127.0.0.1 for a 127.x peer) is bound to the default device's
//! address first; the UDP socket is processed by the socket's own calls
//! rather than by a service thread.
//!
//! Iomapped buffers (see [`iomap`]): `riomap` (PROT_WRITE: published to
//! the peer's iomap area, when the peer advertised one with
//! RDMA_IOMAPSIZE; PROT_NONE: local), `riounmap`, `riowrite` (RDMA WRITE
//! straight into the peer's mapping).
//!
//! Not implemented: keepalive messages (SO_KEEPALIVE is recorded, no
//! keepalive is sent), RDMA_ROUTE (EOPNOTSUPP), the iWARP message mode.
//! A UD datagram larger than the path MTU fails EINVAL, as on rxe
//! (rsockets does not split datagrams).
//!
//! Socket numbers: as rsockets, a stream socket's number is the fd of its
//! own CM event channel (a pipe read end this library holds), a datagram
//! socket's that of its UDP socket, so it never
//! collides with the application's fds; `rpoll` tells rsockets from
//! ordinary fds by this table. Deviations from rsockets where rsockets
//! crashes or answers oddly, with the kernel's errno instead: calls on an
//! unknown number fail EBADF (`rclose` too: rsockets returns the positive
//! EBADF), data calls on an unconnected socket ENOTCONN, `raccept` on a
//! socket that does not listen EINVAL, `rsend` on an unconnected datagram
//! socket EDESTADDRREQ, a datagram over 65507 bytes EMSGSIZE; `rpoll`
//! reports the end of a stream (POLLHUP) only once the data received before
//! it has been read. As rsockets, a send after the connection ended fails
//! ECONNRESET and no SIGPIPE is ever raised.
//!
//! [`wire`] holds the formats, [`stream`] one stream socket and its
//! protocol, [`iomap`] its iomapped buffers, [`dgram`] one datagram
//! socket, [`poll`] `rpoll`/`rselect`, [`api`] the exported calls,
//! [`dapi`] their datagram side.

mod api;
mod dapi;
mod dgram;
mod iomap;
mod maps;
mod poll;
mod stream;
mod wake;
mod wire;

use dgram::Dgram;
use std::collections::HashMap;
use std::ffi::c_int;
use std::sync::{Arc, LazyLock, Mutex, MutexGuard};
use stream::Stream;
use wake::Wake;

/// One socket: its state, the locks that serialize its senders and its
/// receivers (rsocket.c's slock and rlock) while the state lock is
/// released during waits, and the wake-ups of its waiters ([`wake`]).
pub struct Sock {
    st: Mutex<Stream>,
    slock: Mutex<()>,
    rlock: Mutex<()>,
    wake: Wake,
}

/// What a socket's waiters watch for change: completions and events
/// taken, and the state word.
pub trait Watched {
    fn mark(&self) -> (u64, u32);
}

impl Watched for Stream {
    fn mark(&self) -> (u64, u32) {
        (self.progress, self.state)
    }
}

impl Watched for Dgram {
    fn mark(&self) -> (u64, u32) {
        (self.progress, self.state)
    }
}

/// The state of a socket, locked; waiters are woken when it is released
/// changed ([`Watched`]).
pub struct Locked<'a, T: Watched> {
    g: MutexGuard<'a, T>,
    wake: &'a Wake,
    was: (u64, u32),
}

impl<'a, T: Watched> Locked<'a, T> {
    fn new(m: &'a Mutex<T>, wake: &'a Wake) -> Self {
        let g = m.lock().unwrap_or_else(|p| p.into_inner());
        let was = g.mark();
        Locked { g, wake, was }
    }
}

impl<T: Watched> std::ops::Deref for Locked<'_, T> {
    type Target = T;
    fn deref(&self) -> &T {
        &self.g
    }
}

impl<T: Watched> std::ops::DerefMut for Locked<'_, T> {
    fn deref_mut(&mut self) -> &mut T {
        &mut self.g
    }
}

impl<T: Watched> Drop for Locked<'_, T> {
    fn drop(&mut self) {
        if self.g.mark() != self.was {
            self.wake.notify();
        }
    }
}

impl Sock {
    fn new(s: Stream) -> Arc<Sock> {
        Arc::new(Sock { st: Mutex::new(s), slock: Mutex::new(()), rlock: Mutex::new(()), wake: Wake::new() })
    }
    fn lock(&self) -> Locked<'_, Stream> {
        Locked::new(&self.st, &self.wake)
    }
}

fn guard(m: &Mutex<()>) -> MutexGuard<'_, ()> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

static TABLE: LazyLock<Mutex<HashMap<c_int, Arc<Sock>>>> = LazyLock::new(|| Mutex::new(HashMap::new()));

fn table() -> MutexGuard<'static, HashMap<c_int, Arc<Sock>>> {
    TABLE.lock().unwrap_or_else(|p| p.into_inner())
}

fn lookup(fd: c_int) -> Option<Arc<Sock>> {
    table().get(&fd).cloned()
}

/// A datagram socket: one lock (its calls are short; waits release it),
/// and the wake-ups of its waiters ([`wake`]).
pub struct DSock {
    st: Mutex<Dgram>,
    wake: Wake,
}

impl DSock {
    fn new(d: Dgram) -> DSock {
        DSock { st: Mutex::new(d), wake: Wake::new() }
    }
    fn lock(&self) -> Locked<'_, Dgram> {
        Locked::new(&self.st, &self.wake)
    }
}

static DTABLE: LazyLock<Mutex<HashMap<c_int, Arc<DSock>>>> = LazyLock::new(|| Mutex::new(HashMap::new()));

fn dtable() -> MutexGuard<'static, HashMap<c_int, Arc<DSock>>> {
    DTABLE.lock().unwrap_or_else(|p| p.into_inner())
}

fn dlookup(fd: c_int) -> Option<Arc<DSock>> {
    dtable().get(&fd).cloned()
}

fn dinsert(d: Dgram) -> c_int {
    let fd = d.fd;
    dtable().insert(fd, Arc::new(DSock::new(d)));
    fd
}

fn insert(s: Stream) -> c_int {
    let fd = s.fd;
    table().insert(fd, Sock::new(s));
    fd
}

/// Waits until `test` holds for the socket, processing its completions
/// (`rs_get_comp`): EAGAIN when `nonblock` and it does not hold yet.
fn wait(sock: &Sock, nonblock: bool, test: fn(&Stream) -> bool) -> Result<(), c_int> {
    let _waiting = sock.wake.enter();
    // Wake-ups are forgotten before a check of the socket (here, and after
    // a sleep they ended), so one coming after the check ends the sleep.
    sock.wake.drain();
    loop {
        let (cfd, chfd) = {
            let mut s = sock.lock();
            s.process();
            if test(&s) {
                return Ok(());
            }
            if nonblock {
                return Err(libc::EAGAIN);
            }
            s.arm();
            s.process();
            if test(&s) {
                return Ok(());
            }
            (s.comp_fd().unwrap_or(-1), s.fd)
        };
        let mut p = [
            libc::pollfd { fd: cfd, events: libc::POLLIN, revents: 0 },
            libc::pollfd { fd: chfd, events: libc::POLLIN, revents: 0 },
            libc::pollfd { fd: sock.wake.fd(), events: libc::POLLIN, revents: 0 },
        ];
        // SAFETY: three pollfds (a negative fd is ignored by poll).
        let n = unsafe { libc::poll(p.as_mut_ptr(), 3, sock.wake.slice(-1)) };
        if n < 0 && crate::errno::last() == libc::EINTR {
            return Err(libc::EINTR);
        }
        if p[2].revents != 0 {
            sock.wake.drain();
        }
        if p[0].revents != 0 {
            sock.lock().take_cq_event();
        }
    }
}
