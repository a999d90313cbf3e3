//! The operating-system side of setting up a link: where a device
//! advertises itself (a Unix socket in `<runtime dir>/links`, named by its
//! network namespace and UDP address), connecting to and accepting from
//! it, the peer's credentials, descriptors passed with `SCM_RIGHTS`, and
//! the sealed memfd that holds a link's two rings.
//!
//! Only a process of the same user reaches the socket (the directories are
//! verified 0700 and ours, see [`crate::runtime::SafeDir`]); both sides
//! still check `SO_PEERCRED`. A memfd received is used only if it is sealed
//! against shrinking (a peer that could shrink it would make our reads
//! fault) and has exactly the expected size; a doorbell only if it is an
//! eventfd.

use crate::runtime::{Access, SafeDir};
use std::io;
use std::net::SocketAddr;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::time::Duration;

fn cvt(r: libc::c_int) -> io::Result<libc::c_int> {
    if r < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(r)
    }
}

/// The directory of advertised devices: `<runtime dir>/links`, 0700,
/// created if absent (the runtime directory's own mode is left as is).
pub fn links_dir() -> Result<SafeDir, crate::runtime::Refused> {
    let root = crate::runtime::runtime_dir();
    let rt = match SafeDir::open_owned(&root) {
        Ok(d) => d,
        Err(_) if std::fs::symlink_metadata(&root).is_err() => SafeDir::create_or_open(&root, Access::Private)?,
        Err(e) => return Err(e),
    };
    rt.subdir("links", Some(Access::Private))
}

/// The calling thread's network namespace (its inode; 0 if unknown): the
/// one a device opened here binds its socket in, which is not the
/// process's when the thread entered another with `setns`. Devices of
/// different namespaces never link, even with a shared runtime directory.
pub fn netns() -> u64 {
    use std::os::unix::fs::MetadataExt;
    ["/proc/thread-self/ns/net", "/proc/self/ns/net"]
        .iter()
        .find_map(|p| std::fs::metadata(p).ok())
        .map_or(0, |m| m.ino())
}

/// The socket's name for a device at `addr` in namespace `ns`.
pub fn socket_name(ns: u64, addr: SocketAddr) -> String {
    format!("{ns}-{}-{}", addr.ip(), addr.port())
}

/// A `sockaddr_un` for `name` in `dir`, reached through the directory's
/// verified descriptor (`/proc/self/fd/N/name`), never by its path.
fn unix_addr(dir: &SafeDir, name: &str) -> io::Result<(libc::sockaddr_un, libc::socklen_t)> {
    let path = format!("/proc/self/fd/{}/{name}", dir.as_raw_fd());
    // SAFETY: all-zero is a valid sockaddr_un.
    let mut sa: libc::sockaddr_un = unsafe { std::mem::zeroed() };
    sa.sun_family = libc::AF_UNIX as libc::sa_family_t;
    if path.len() >= sa.sun_path.len() || name.contains('/') {
        return Err(io::Error::new(io::ErrorKind::InvalidInput, "socket name too long"));
    }
    for (d, s) in sa.sun_path.iter_mut().zip(path.bytes()) {
        *d = s as libc::c_char;
    }
    let len = std::mem::size_of::<libc::sa_family_t>() + path.len() + 1;
    Ok((sa, len as libc::socklen_t))
}

fn unix_socket(nonblocking: bool) -> io::Result<OwnedFd> {
    let flags = libc::SOCK_STREAM | libc::SOCK_CLOEXEC | if nonblocking { libc::SOCK_NONBLOCK } else { 0 };
    // SAFETY: plain socket call.
    let fd = cvt(unsafe { libc::socket(libc::AF_UNIX, flags, 0) })?;
    // SAFETY: a fresh descriptor nothing else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// Whether a live process listens on `name` (one whose backlog is full
/// counts: it is there, only slow). Never waits.
fn listened_on(dir: &SafeDir, name: &str) -> bool {
    match connect_raw(dir, name) {
        Ok(_) => true,
        Err(e) => e.raw_os_error() == Some(libc::EAGAIN),
    }
}

/// Whether `name` is a socket file nobody listens on (never waits).
pub fn is_stale(dir: &SafeDir, name: &str) -> bool {
    connect_raw(dir, name).is_err_and(|e| e.raw_os_error() == Some(libc::ECONNREFUSED))
}

fn connect_raw(dir: &SafeDir, name: &str) -> io::Result<OwnedFd> {
    let (sa, len) = unix_addr(dir, name)?;
    let s = unix_socket(true)?;
    // SAFETY: `sa` is a valid sockaddr_un of `len` bytes.
    cvt(unsafe { libc::connect(s.as_raw_fd(), (&sa as *const libc::sockaddr_un).cast(), len) })?;
    Ok(s)
}

/// Binds and listens on `name` in `dir` (non-blocking). A socket file left
/// by a process that died (nobody accepts on it) is replaced.
pub fn listen(dir: &SafeDir, name: &str) -> io::Result<OwnedFd> {
    let (sa, len) = unix_addr(dir, name)?;
    for _ in 0..2 {
        let s = unix_socket(true)?;
        // SAFETY: `sa` is a valid sockaddr_un of `len` bytes.
        match cvt(unsafe { libc::bind(s.as_raw_fd(), (&sa as *const libc::sockaddr_un).cast(), len) }) {
            Ok(_) => {
                // SAFETY: fchmod-like: the file was created with the umask;
                // the directory is 0700 anyway. listen on our socket.
                cvt(unsafe { libc::listen(s.as_raw_fd(), 64) })?;
                return Ok(s);
            }
            Err(e) if e.raw_os_error() == Some(libc::EADDRINUSE) => {
                if listened_on(dir, name) {
                    return Err(io::Error::new(
                        io::ErrorKind::AddrInUse,
                        "another live device advertises this address",
                    ));
                }
                dir.remove(name)?;
            }
            Err(e) => return Err(e),
        }
    }
    Err(io::Error::new(io::ErrorKind::AddrInUse, "cannot replace a stale socket file"))
}

/// Connects to the device advertised as `name` without waiting: a
/// listener whose backlog is full (a stopped or fake peer that never
/// accepts) is refused at once (`WouldBlock`). The socket then blocks, with
/// `timeout` on each later read and write.
pub fn connect(dir: &SafeDir, name: &str, timeout: Duration) -> io::Result<OwnedFd> {
    let s = connect_raw(dir, name)?;
    set_blocking(&s, true)?;
    set_timeout(&s, timeout)?;
    Ok(s)
}

/// Accepts one connection, if any waits (`Ok(None)` otherwise); the new
/// socket never blocks (the hub waits for its hello with `poll`).
pub fn accept(listener: &OwnedFd) -> io::Result<Option<OwnedFd>> {
    let flags = libc::SOCK_CLOEXEC | libc::SOCK_NONBLOCK;
    // SAFETY: null address pointers are allowed; the flags are valid.
    let r = unsafe { libc::accept4(listener.as_raw_fd(), std::ptr::null_mut(), std::ptr::null_mut(), flags) };
    if r < 0 {
        let e = io::Error::last_os_error();
        return match e.raw_os_error() {
            Some(libc::EAGAIN) | Some(libc::ECONNABORTED) | Some(libc::EINTR) => Ok(None),
            _ => Err(e),
        };
    }
    // SAFETY: a fresh descriptor nothing else owns.
    Ok(Some(unsafe { OwnedFd::from_raw_fd(r) }))
}

fn set_timeout(s: &OwnedFd, t: Duration) -> io::Result<()> {
    let tv = libc::timeval { tv_sec: t.as_secs() as _, tv_usec: t.subsec_micros() as _ };
    for opt in [libc::SO_RCVTIMEO, libc::SO_SNDTIMEO] {
        // SAFETY: `tv` is a valid timeval of the given size.
        cvt(unsafe {
            libc::setsockopt(
                s.as_raw_fd(),
                libc::SOL_SOCKET,
                opt,
                (&tv as *const libc::timeval).cast(),
                std::mem::size_of::<libc::timeval>() as libc::socklen_t,
            )
        })?;
    }
    Ok(())
}

/// Makes a socket non-blocking (after setup: the hub only watches it for
/// the peer's end).
pub fn set_nonblocking(s: &OwnedFd) -> io::Result<()> {
    set_blocking(s, false)
}

fn set_blocking(s: &OwnedFd, blocking: bool) -> io::Result<()> {
    // SAFETY: fcntl on our descriptor.
    let fl = cvt(unsafe { libc::fcntl(s.as_raw_fd(), libc::F_GETFL) })?;
    let fl = if blocking { fl & !libc::O_NONBLOCK } else { fl | libc::O_NONBLOCK };
    // SAFETY: as above.
    cvt(unsafe { libc::fcntl(s.as_raw_fd(), libc::F_SETFL, fl) }).map(drop)
}

/// Proves that process `pid` (a linking peer, by `SO_PEERCRED`) owns the
/// UDP address `addr` it claims: a UDP socket of this user is bound to
/// exactly `addr` in the calling thread's network namespace (so this
/// device reaches it by loopback), and `pid` holds that socket. A peer
/// that claims another's address (to receive its packets) fails here.
pub fn owns_udp(pid: u32, addr: SocketAddr) -> io::Result<()> {
    let refused = |why: String| io::Error::new(io::ErrorKind::PermissionDenied, why);
    let table = if addr.is_ipv4() { "/proc/thread-self/net/udp" } else { "/proc/thread-self/net/udp6" };
    let me = crate::runtime::dir::euid();
    // Up to three reads. The kernel makes the table a page per `read`, and
    // starts each again by counting lines from the first: a socket closed
    // meanwhile before that point shifts the count, and a line is skipped.
    // Beside a process opening and closing 1 500 UDP sockets, a socket bound
    // throughout was missing from 155 of 14 578 reads, and from none of 155
    // triples; a legitimate peer's claim was refused (its packets then went
    // by UDP), and `link_attempts_beyond_the_cap_are_refused_and_reaped`
    // failed 5 of 44 runs on it (docs/reliability.md).
    let mut want = Vec::new();
    for _ in 0..3 {
        want = std::fs::read_to_string(table)?
            .lines()
            .skip(1)
            .filter_map(parse_udp_line)
            .filter(|&(a, uid, _)| a == addr && uid == me)
            .map(|(_, _, ino)| format!("socket:[{ino}]"))
            .collect();
        if !want.is_empty() {
            break;
        }
    }
    if want.is_empty() {
        return Err(refused(format!("no UDP socket of this user is bound to {addr} in this namespace")));
    }
    // A process holds at most RLIMIT_NOFILE descriptors; bounded anyway.
    for e in std::fs::read_dir(format!("/proc/{pid}/fd"))?.take(1 << 20) {
        let Ok(e) = e else { continue };
        if std::fs::read_link(e.path()).is_ok_and(|t| want.iter().any(|w| t.as_os_str() == w.as_str())) {
            return Ok(());
        }
    }
    Err(refused(format!("process {pid} does not hold the UDP socket bound to {addr}")))
}

/// (local address, uid, inode) of a line of `/proc/net/udp{,6}`: the
/// address as the kernel prints it (each 32-bit word in host order).
pub fn parse_udp_line(l: &str) -> Option<(SocketAddr, u32, u64)> {
    let f: Vec<&str> = l.split_whitespace().collect();
    let (ip, port) = f.get(1)?.split_once(':')?;
    let port = u16::from_str_radix(port, 16).ok()?;
    let word = |i: usize| ip.get(8 * i..8 * i + 8).and_then(|w| u32::from_str_radix(w, 16).ok()).map(u32::to_ne_bytes);
    let ip: std::net::IpAddr = match ip.len() {
        8 => std::net::Ipv4Addr::from(word(0)?).into(),
        32 => {
            let mut b = [0u8; 16];
            for i in 0..4 {
                b[4 * i..4 * i + 4].copy_from_slice(&word(i)?);
            }
            std::net::Ipv6Addr::from(b).into()
        }
        _ => return None,
    };
    Some((SocketAddr::new(ip, port), f.get(7)?.parse().ok()?, f.get(9)?.parse().ok()?))
}

/// A link's doorbell: a pair of connected Unix datagram sockets. The
/// receiver keeps the first end and polls it; the second goes to the peer,
/// which rings it with [`ring_peer`]. The receiver never writes to
/// anything the peer holds, and the peer's ringing never blocks: a send
/// with `MSG_DONTWAIT` does not depend on the file's flags (which the peer
/// could change), and a full queue means the receiver has wake-ups
/// pending anyway.
pub fn doorbell_pair() -> io::Result<(OwnedFd, OwnedFd)> {
    let mut fds = [0; 2];
    let ty = libc::SOCK_DGRAM | libc::SOCK_CLOEXEC | libc::SOCK_NONBLOCK;
    // SAFETY: socketpair writes two descriptors into `fds`.
    cvt(unsafe { libc::socketpair(libc::AF_UNIX, ty, 0, fds.as_mut_ptr()) })?;
    // SAFETY: two fresh descriptors nothing else owns.
    Ok(unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) })
}

/// Whether `fd` is a Unix datagram socket (a peer's doorbell end).
pub fn is_doorbell(fd: &OwnedFd) -> bool {
    let opt = |name| {
        let mut v: libc::c_int = 0;
        let mut len = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
        // SAFETY: `v` is a valid out-buffer of `len` bytes.
        let r = unsafe {
            libc::getsockopt(fd.as_raw_fd(), libc::SOL_SOCKET, name, (&mut v as *mut libc::c_int).cast(), &mut len)
        };
        (r == 0).then_some(v)
    };
    opt(libc::SO_DOMAIN) == Some(libc::AF_UNIX) && opt(libc::SO_TYPE) == Some(libc::SOCK_DGRAM)
}

/// The two ends of a link's switch-over marker path: UDP sockets bound to
/// `ip` (the connecting device's own address, so that both lie on this
/// host and the datagrams go through loopback, as the device's own UDP
/// packets to its peer do) and connected to each other. Each side sends its
/// marker by its end just before its first ring packet; the other reads it
/// before it reads that ring (see `Link::held`).
pub fn mark_pair(ip: std::net::IpAddr) -> io::Result<(OwnedFd, OwnedFd)> {
    use socket2::{Domain, Protocol, Socket, Type};
    let one = || -> io::Result<Socket> {
        let s = Socket::new(Domain::for_address(SocketAddr::new(ip, 0)), Type::DGRAM.cloexec(), Some(Protocol::UDP))?;
        s.set_nonblocking(true)?;
        s.bind(&SocketAddr::new(ip, 0).into())?;
        Ok(s)
    };
    let (a, b) = (one()?, one()?);
    a.connect(&b.local_addr()?)?;
    b.connect(&a.local_addr()?)?;
    Ok((a.into(), b.into()))
}

/// Whether `fd` is a UDP socket bound and connected to addresses of `ip`
/// (a connecting peer's end of [`mark_pair`]; `ip` is the address it
/// proved it owns): what we send by it stays on this host.
pub fn is_mark(fd: &OwnedFd, ip: std::net::IpAddr) -> bool {
    let s = socket2::SockRef::from(fd);
    let on_ip = |a: io::Result<socket2::SockAddr>| a.ok().and_then(|a| a.as_socket()).is_some_and(|a| a.ip() == ip);
    s.r#type().ok() == Some(socket2::Type::DGRAM)
        && s.protocol().ok().flatten() == Some(socket2::Protocol::UDP)
        && on_ip(s.local_addr())
        && on_ip(s.peer_addr())
}

/// Sends a link's switch-over marker by its end of [`mark_pair`], never
/// waiting; a failure is ignored (the receiver stops waiting for it after
/// a while).
pub fn send_mark(fd: RawFd) {
    // SAFETY: sends from a valid buffer.
    unsafe { libc::send(fd, MARK.as_ptr().cast(), MARK.len(), libc::MSG_DONTWAIT | libc::MSG_NOSIGNAL) };
}

/// Whether the peer's marker waits on our end of [`mark_pair`] (reads at
/// most 8 datagrams, never waiting; anything else is discarded).
pub fn take_mark(fd: RawFd) -> bool {
    let mut b = [0u8; 16];
    for _ in 0..8 {
        // SAFETY: reads into a valid buffer without waiting.
        let n = unsafe { libc::recv(fd, b.as_mut_ptr().cast(), b.len(), libc::MSG_DONTWAIT) };
        if n < 0 {
            return false;
        }
        if b[..n as usize] == MARK[..] {
            return true;
        }
    }
    false
}

const MARK: [u8; 8] = *b"uroceMRK";

/// Rings a peer's doorbell: one byte, never waiting (see
/// [`doorbell_pair`]); every failure is ignored (a full queue: the peer has
/// wake-ups pending; a closed one: the hub drops the link).
pub fn ring_peer(fd: RawFd) {
    // SAFETY: sends one byte from a valid buffer.
    unsafe { libc::send(fd, [1u8].as_ptr().cast(), 1, libc::MSG_DONTWAIT | libc::MSG_NOSIGNAL) };
}

/// Empties our end of a doorbell (at most 64 rings: a peer that rings
/// faster only costs it its own wake-ups).
pub fn drain_doorbell(fd: RawFd) {
    let mut b = [0u8; 16];
    for _ in 0..64 {
        // SAFETY: reads into a valid buffer without waiting.
        if unsafe { libc::recv(fd, b.as_mut_ptr().cast(), b.len(), libc::MSG_DONTWAIT) } < 0 {
            break;
        }
    }
}

/// The peer's (pid, uid) as the kernel recorded them at connect time.
pub fn peer_cred(s: &OwnedFd) -> io::Result<(u32, u32)> {
    // SAFETY: all-zero is a valid ucred.
    let mut c: libc::ucred = unsafe { std::mem::zeroed() };
    let mut len = std::mem::size_of::<libc::ucred>() as libc::socklen_t;
    // SAFETY: `c` is a valid out-buffer of `len` bytes.
    cvt(unsafe {
        libc::getsockopt(
            s.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_PEERCRED,
            (&mut c as *mut libc::ucred).cast(),
            &mut len,
        )
    })?;
    Ok((c.pid as u32, c.uid))
}

const MAX_FDS: usize = 3;

/// Sends `bytes` with `fds` attached.
pub fn send_with_fds(s: &OwnedFd, bytes: &[u8], fds: &[RawFd]) -> io::Result<()> {
    assert!(fds.len() <= MAX_FDS);
    // Room for the control message, aligned for cmsghdr.
    let mut cbuf = [0u64; 8];
    // SAFETY: CMSG_SPACE is a pure size computation.
    let space = unsafe { libc::CMSG_SPACE(std::mem::size_of_val(fds) as u32) } as usize;
    let mut iov = libc::iovec { iov_base: bytes.as_ptr() as *mut _, iov_len: bytes.len() };
    // SAFETY: all-zero is a valid msghdr.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    if !fds.is_empty() {
        msg.msg_control = cbuf.as_mut_ptr().cast();
        msg.msg_controllen = space as _;
        // SAFETY: the control buffer holds `space` bytes (64 >= CMSG_SPACE
        // of three ints); CMSG_FIRSTHDR of it is non-null and in bounds.
        unsafe {
            let c = libc::CMSG_FIRSTHDR(&msg);
            (*c).cmsg_level = libc::SOL_SOCKET;
            (*c).cmsg_type = libc::SCM_RIGHTS;
            (*c).cmsg_len = libc::CMSG_LEN(std::mem::size_of_val(fds) as u32) as _;
            std::ptr::copy_nonoverlapping(fds.as_ptr(), libc::CMSG_DATA(c).cast::<RawFd>(), fds.len());
        }
    }
    // SAFETY: msg points at valid buffers for the call's duration.
    let n = unsafe { libc::sendmsg(s.as_raw_fd(), &msg, libc::MSG_NOSIGNAL) };
    if n < 0 {
        return Err(io::Error::last_os_error());
    }
    if n as usize != bytes.len() {
        return Err(io::Error::new(io::ErrorKind::WriteZero, "short send"));
    }
    Ok(())
}

/// Receives one message into `buf` with the descriptors attached to it
/// (closed again unless the caller keeps them). Returns its length.
pub fn recv_with_fds(s: &OwnedFd, buf: &mut [u8]) -> io::Result<(usize, Vec<OwnedFd>)> {
    let mut cbuf = [0u64; 16];
    let mut iov = libc::iovec { iov_base: buf.as_mut_ptr().cast(), iov_len: buf.len() };
    // SAFETY: all-zero is a valid msghdr.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = cbuf.as_mut_ptr().cast();
    msg.msg_controllen = std::mem::size_of_val(&cbuf) as _;
    // SAFETY: msg points at valid buffers for the call's duration.
    let n = unsafe { libc::recvmsg(s.as_raw_fd(), &mut msg, libc::MSG_CMSG_CLOEXEC) };
    if n < 0 {
        return Err(io::Error::last_os_error());
    }
    let mut fds = Vec::new();
    // SAFETY: walking the control messages the kernel wrote into `cbuf`,
    // within msg_controllen, with the libc macros.
    unsafe {
        let mut c = libc::CMSG_FIRSTHDR(&msg);
        while !c.is_null() {
            if (*c).cmsg_level == libc::SOL_SOCKET && (*c).cmsg_type == libc::SCM_RIGHTS {
                let data = libc::CMSG_DATA(c).cast::<RawFd>();
                let k = ((*c).cmsg_len as usize - libc::CMSG_LEN(0) as usize) / std::mem::size_of::<RawFd>();
                for i in 0..k {
                    // Each is a fresh descriptor the kernel installed for us.
                    fds.push(OwnedFd::from_raw_fd(std::ptr::read_unaligned(data.add(i))));
                }
            }
            c = libc::CMSG_NXTHDR(&msg, c);
        }
    }
    if msg.msg_flags & libc::MSG_CTRUNC != 0 {
        return Err(io::Error::new(io::ErrorKind::InvalidData, "too many descriptors"));
    }
    Ok((n as usize, fds))
}

/// A new memfd of `size` bytes, sealed against shrinking and growing.
pub fn sealed_memfd(size: usize) -> io::Result<OwnedFd> {
    // SAFETY: the name is NUL-terminated; valid flags.
    let fd = cvt(unsafe { libc::memfd_create(c"uroce-link".as_ptr(), libc::MFD_CLOEXEC | libc::MFD_ALLOW_SEALING) })?;
    // SAFETY: a fresh descriptor nothing else owns.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    // SAFETY: ftruncate/fcntl on our descriptor.
    cvt(unsafe { libc::ftruncate(fd.as_raw_fd(), size as libc::off_t) })?;
    let seals = libc::F_SEAL_SHRINK | libc::F_SEAL_GROW | libc::F_SEAL_SEAL;
    // SAFETY: as above.
    cvt(unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_ADD_SEALS, seals) })?;
    Ok(fd)
}

/// Whether `fd` is a memfd of exactly `size` bytes that can no longer
/// shrink (so that a mapping of it never faults).
pub fn check_memfd(fd: &OwnedFd, size: usize) -> Result<(), &'static str> {
    // SAFETY: fcntl on a descriptor we own.
    let seals = unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_GET_SEALS) };
    if seals < 0 || seals & libc::F_SEAL_SHRINK == 0 {
        return Err("ring memory not sealed against shrinking");
    }
    // SAFETY: all-zero is a valid stat, which fstat fills.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: as above.
    if unsafe { libc::fstat(fd.as_raw_fd(), &mut st) } != 0 || st.st_mode & libc::S_IFMT != libc::S_IFREG {
        return Err("ring memory is not a regular file");
    }
    if st.st_size as u64 != size as u64 {
        return Err("ring memory of the wrong size");
    }
    Ok(())
}

/// Rings one of this process's own non-blocking eventfds (never one a
/// peer holds: see [`ring_peer`]); a full counter is as good as a ring.
pub fn ring(fd: RawFd) {
    let one: u64 = 1;
    // SAFETY: writes 8 bytes from a valid u64.
    unsafe { libc::write(fd, (&one as *const u64).cast(), 8) };
}

/// A shared, read-write mapping of a whole memfd, unmapped on drop.
#[derive(Debug)]
pub struct Mapping {
    base: *mut u8,
    len: usize,
}

// SAFETY: the mapping is plain shared memory; access goes through
// `ring::RingMem`'s atomics and copies.
unsafe impl Send for Mapping {}
// SAFETY: as above.
unsafe impl Sync for Mapping {}

impl Mapping {
    pub fn new(fd: &OwnedFd, len: usize) -> io::Result<Mapping> {
        // SAFETY: a fresh shared mapping of our descriptor; the kernel picks
        // the address.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                fd.as_raw_fd(),
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        Ok(Mapping { base: p.cast(), len })
    }

    pub fn base(&self) -> *mut u8 {
        self.base
    }

    /// Bytes mapped (never 0: mmap refuses that).
    pub fn size(&self) -> usize {
        self.len
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: unmaps exactly what `new` mapped; no reference into it
        // outlives the Mapping (rings hold it through their link).
        unsafe { libc::munmap(self.base.cast(), self.len) };
    }
}
