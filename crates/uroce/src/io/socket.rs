//! The UDP socket of a device. For IPv4 it is unconnected with
//! `IP_MTU_DISCOVER = IP_PMTUDISC_DO`, so the kernel sends DF with an IP
//! Identification of 0: the value the ICRC is computed with (see
//! shared/spec/platform.md). Datagrams are never fragmented.
//!
//! Batching: [`RoceSocket::send_groups`] hands the kernel several groups of
//! up to 64 equal packets, each group for one destination, in one
//! `sendmmsg` with UDP GSO (`UDP_SEGMENT`); each packet stays a datagram of
//! its own on the wire, the k-th of a group with IPv4 ID k (the caller fixes
//! its ICRC). The socket receives with
//! UDP GRO: one `recvmsg` may return several datagrams back to back, with
//! their size in a `UDP_GRO` control message.

use smallvec::SmallVec;
use socket2::{Domain, Protocol, SockAddr, Socket, Type};
use std::io;
use std::net::SocketAddr;
use std::os::fd::{AsRawFd, RawFd};

#[derive(Debug)]
pub struct RoceSocket {
    sock: Socket,
    local: SocketAddr,
    /// UDP GSO works (cleared after the kernel refuses it once).
    gso: std::sync::atomic::AtomicBool,
    gro: bool,
}

/// One datagram to send, in up to three pieces that the kernel gathers
/// (a packet's headers, its payload straight from registered memory, its
/// pad and ICRC), or in one.
#[derive(Debug, Clone, Copy)]
pub struct Datagram<'a> {
    parts: [&'a [u8]; 3],
}

impl<'a> Datagram<'a> {
    pub fn new(parts: [&'a [u8]; 3]) -> Datagram<'a> {
        Datagram { parts }
    }

    pub fn one(bytes: &'a [u8]) -> Datagram<'a> {
        Datagram { parts: [bytes, &[], &[]] }
    }

    pub fn len(&self) -> usize {
        self.parts.iter().map(|p| p.len()).sum()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// The iovecs of datagrams' non-empty pieces, in order.
fn iovecs<'a>(segs: &'a [Datagram<'a>]) -> impl Iterator<Item = libc::iovec> + 'a {
    segs.iter()
        .flat_map(|d| d.parts.iter())
        .filter(|p| !p.is_empty())
        .map(|p| libc::iovec { iov_base: p.as_ptr() as *mut libc::c_void, iov_len: p.len() })
}

/// Most groups in one `sendmmsg`.
pub const SEND_GROUPS: usize = 64;

/// Most segments in one GSO send, and most bytes.
pub const GSO_MAX_SEGMENTS: usize = 64;
pub const GSO_MAX_BYTES: usize = 65000;

impl RoceSocket {
    pub fn bind(addr: SocketAddr) -> io::Result<RoceSocket> {
        let domain = if addr.is_ipv4() { Domain::IPV4 } else { Domain::IPV6 };
        let sock = Socket::new(domain, Type::DGRAM.nonblocking().cloexec(), Some(Protocol::UDP))?;
        if addr.is_ipv6() {
            sock.set_only_v6(true)?;
        }
        let _ = sock.set_recv_buffer_size(8 << 20);
        let _ = sock.set_send_buffer_size(8 << 20);
        if addr.ip().is_ipv4() {
            let val: libc::c_int = libc::IP_PMTUDISC_DO;
            // SAFETY: setsockopt reads `size_of::<c_int>()` bytes from &val.
            let rc = unsafe {
                libc::setsockopt(
                    sock.as_raw_fd(),
                    libc::IPPROTO_IP,
                    libc::IP_MTU_DISCOVER,
                    (&val as *const libc::c_int).cast(),
                    std::mem::size_of::<libc::c_int>() as libc::socklen_t,
                )
            };
            if rc != 0 {
                return Err(io::Error::last_os_error());
            }
        }
        let one: libc::c_int = 1;
        // SAFETY: setsockopt reads one c_int. Failure (an old kernel) only
        // means datagrams arrive one per call.
        let gro = unsafe {
            libc::setsockopt(
                sock.as_raw_fd(),
                libc::SOL_UDP,
                libc::UDP_GRO,
                (&one as *const libc::c_int).cast(),
                std::mem::size_of::<libc::c_int>() as libc::socklen_t,
            )
        } == 0;
        sock.bind(&SockAddr::from(addr))?;
        let local = sock.local_addr()?.as_socket().ok_or_else(|| io::Error::other("not an IP socket"))?;
        Ok(RoceSocket { sock, local, gso: std::sync::atomic::AtomicBool::new(true), gro })
    }

    pub fn local_addr(&self) -> SocketAddr {
        self.local
    }

    pub fn send_to(&self, data: &[u8], dst: SocketAddr) -> io::Result<usize> {
        self.sock.send_to(data, &SockAddr::from(dst))
    }

    /// Sends `segs` (equal lengths except a shorter last one) to `dst` in one
    /// call with UDP GSO; falls back to one send per segment. Returns how
    /// many segments went out (all, or those before an error).
    pub fn send_segments(&self, segs: &[Datagram<'_>], dst: SocketAddr) -> io::Result<usize> {
        use std::sync::atomic::Ordering;
        let addr = SockAddr::from(dst);
        if segs.len() == 1 || !self.gso.load(Ordering::Relaxed) {
            for (i, s) in segs.iter().enumerate() {
                if let Err(e) =
                    self.sendmsg(&mut iovecs(std::slice::from_ref(s)).collect::<SmallVec<[_; 3]>>(), &addr, None)
                {
                    return if i == 0 { Err(e) } else { Ok(i) };
                }
            }
            return Ok(segs.len());
        }
        match self.sendmsg(&mut iovecs(segs).collect::<Vec<_>>(), &addr, Some(segs[0].len() as u16)) {
            Ok(_) => Ok(segs.len()),
            Err(e) if matches!(e.raw_os_error(), Some(libc::EINVAL) | Some(libc::EIO) | Some(libc::ENOPROTOOPT)) => {
                tracing::warn!("UDP GSO refused ({e}); sending one datagram per call");
                self.gso.store(false, Ordering::Relaxed);
                self.send_segments(segs, dst)
            }
            Err(e) => Err(e),
        }
    }

    /// One `sendmsg` of the bytes `iov` gathers to `addr`, as UDP GSO
    /// segments of `gso` bytes when given.
    fn sendmsg(&self, iov: &mut [libc::iovec], addr: &SockAddr, gso: Option<u16>) -> io::Result<usize> {
        // CMSG space for one u16.
        let mut cbuf = [0u64; 4];
        // SAFETY: msghdr is plain old data; every pointer set below refers to
        // live values (`iov` over the caller's buffers, `addr`, `cbuf`) that
        // outlive the sendmsg call, and the control message is written inside
        // `cbuf` through the CMSG_* macros, which respect its length.
        let r = unsafe {
            let mut msg: libc::msghdr = std::mem::zeroed();
            msg.msg_name = addr.as_ptr() as *mut libc::c_void;
            msg.msg_namelen = addr.len();
            msg.msg_iov = iov.as_mut_ptr();
            msg.msg_iovlen = iov.len() as _;
            if let Some(seg) = gso {
                msg.msg_control = cbuf.as_mut_ptr().cast();
                msg.msg_controllen = libc::CMSG_SPACE(2) as _;
                let c = libc::CMSG_FIRSTHDR(&msg);
                (*c).cmsg_level = libc::SOL_UDP;
                (*c).cmsg_type = libc::UDP_SEGMENT;
                (*c).cmsg_len = libc::CMSG_LEN(2) as _;
                std::ptr::write_unaligned(libc::CMSG_DATA(c) as *mut u16, seg);
            }
            libc::sendmsg(self.sock.as_raw_fd(), &msg, 0)
        };
        if r < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(r as usize)
    }

    /// Sends several groups in one `sendmmsg`: each group's segments (equal
    /// lengths except a shorter last one) go to its destination as one UDP
    /// GSO send, or as a plain datagram when it has one segment. Returns how
    /// many groups went out; an error only when the first one failed. Without
    /// GSO, falls back to [`RoceSocket::send_segments`] per group.
    pub fn send_groups(&self, groups: &[(SocketAddr, &[Datagram<'_>])]) -> io::Result<usize> {
        use std::sync::atomic::Ordering;
        if groups.is_empty() {
            return Ok(0);
        }
        if !self.gso.load(Ordering::Relaxed) {
            let (dst, segs) = groups[0];
            return self.send_segments(segs, dst).map(|_| 1);
        }
        let n = groups.len().min(SEND_GROUPS);
        let addrs: Vec<SockAddr> = groups[..n].iter().map(|&(dst, _)| SockAddr::from(dst)).collect();
        let mut iov = Vec::with_capacity(groups[..n].iter().map(|g| g.1.len()).sum());
        let mut ends = Vec::with_capacity(n);
        for &(_, segs) in &groups[..n] {
            iov.extend(iovecs(segs));
            ends.push(iov.len());
        }
        // CMSG space for one u16 per group.
        let mut cbufs = vec![[0u64; 4]; n];
        // SAFETY: mmsghdr is plain old data; all-zero is a valid value.
        let mut hdrs: Vec<libc::mmsghdr> = (0..n).map(|_| unsafe { std::mem::zeroed() }).collect();
        let mut at = 0;
        for (k, &(_, segs)) in groups[..n].iter().enumerate() {
            let h = &mut hdrs[k].msg_hdr;
            h.msg_name = addrs[k].as_ptr() as *mut libc::c_void;
            h.msg_namelen = addrs[k].len();
            // SAFETY: `at <= ends[k] <= iov.len()`: `iov` holds every group's
            // pieces in order, group k's ending at `ends[k]`.
            h.msg_iov = unsafe { iov.as_mut_ptr().add(at) };
            h.msg_iovlen = (ends[k] - at) as _;
            at = ends[k];
            if segs.len() > 1 {
                h.msg_control = cbufs[k].as_mut_ptr().cast();
                // SAFETY: the control buffer is CMSG_SPACE(2) bytes of
                // `cbufs[k]` (32 bytes); the CMSG_* macros stay inside it.
                unsafe {
                    h.msg_controllen = libc::CMSG_SPACE(2) as _;
                    let c = libc::CMSG_FIRSTHDR(h);
                    (*c).cmsg_level = libc::SOL_UDP;
                    (*c).cmsg_type = libc::UDP_SEGMENT;
                    (*c).cmsg_len = libc::CMSG_LEN(2) as _;
                    std::ptr::write_unaligned(libc::CMSG_DATA(c) as *mut u16, segs[0].len() as u16);
                }
            }
        }
        // SAFETY: the `n` headers point at live locals (`addrs`, `iov` over
        // the callers' buffers, `cbufs`) that outlive the call.
        let r = unsafe { libc::sendmmsg(self.sock.as_raw_fd(), hdrs.as_mut_ptr(), n as _, 0) };
        if r < 0 {
            let e = io::Error::last_os_error();
            if matches!(e.raw_os_error(), Some(libc::EINVAL) | Some(libc::EIO) | Some(libc::ENOPROTOOPT)) {
                tracing::warn!("UDP GSO refused ({e}); sending one datagram per call");
                self.gso.store(false, Ordering::Relaxed);
                return self.send_groups(groups);
            }
            return Err(e);
        }
        Ok(r as usize)
    }

    /// Receives without blocking: a datagram, or with GRO several of
    /// `Some(size)` bytes each back to back (the last may be shorter).
    pub fn recv_gro(&self, buf: &mut [u8]) -> io::Result<(usize, SocketAddr, Option<usize>)> {
        if !self.gro {
            let (n, from) = self.recv_from(buf)?;
            return Ok((n, from, None));
        }
        // SAFETY: sockaddr_storage is plain old data.
        let mut from: libc::sockaddr_storage = unsafe { std::mem::zeroed() };
        let mut iov = libc::iovec { iov_base: buf.as_mut_ptr().cast(), iov_len: buf.len() };
        let mut cbuf = [0u64; 8];
        // SAFETY: msghdr is plain old data; its pointers refer to live locals
        // (`from`, `iov` over `buf`, `cbuf`) for the duration of recvmsg,
        // which writes at most their stated lengths. Control messages are
        // read with the CMSG_* macros within `msg_controllen`.
        unsafe {
            let mut msg: libc::msghdr = std::mem::zeroed();
            msg.msg_name = (&mut from as *mut libc::sockaddr_storage).cast();
            msg.msg_namelen = std::mem::size_of::<libc::sockaddr_storage>() as _;
            msg.msg_iov = &mut iov;
            msg.msg_iovlen = 1;
            msg.msg_control = cbuf.as_mut_ptr().cast();
            msg.msg_controllen = std::mem::size_of_val(&cbuf) as _;
            let n = libc::recvmsg(self.sock.as_raw_fd(), &mut msg, libc::MSG_DONTWAIT);
            if n < 0 {
                return Err(io::Error::last_os_error());
            }
            let mut seg = None;
            let mut c = libc::CMSG_FIRSTHDR(&msg);
            while !c.is_null() {
                if (*c).cmsg_level == libc::SOL_UDP && (*c).cmsg_type == libc::UDP_GRO {
                    seg = Some(std::ptr::read_unaligned(libc::CMSG_DATA(c) as *const u16) as usize);
                }
                c = libc::CMSG_NXTHDR(&msg, c);
            }
            let addr = SockAddr::new(from, msg.msg_namelen);
            let from = addr.as_socket().ok_or_else(|| io::Error::other("not an IP peer"))?;
            Ok((n as usize, from, seg.filter(|&s| s > 0 && s < n as usize)))
        }
    }

    /// Receives one datagram without blocking.
    pub fn recv_from(&self, buf: &mut [u8]) -> io::Result<(usize, SocketAddr)> {
        // SAFETY: `MaybeUninit<u8>` has the layout of u8, and socket2 only
        // writes initialised bytes into the slice.
        let uninit = unsafe { &mut *(buf as *mut [u8] as *mut [std::mem::MaybeUninit<u8>]) };
        let (n, from) = self.sock.recv_from(uninit)?;
        let from = from.as_socket().ok_or_else(|| io::Error::other("not an IP peer"))?;
        Ok((n, from))
    }
}

impl AsRawFd for RoceSocket {
    fn as_raw_fd(&self) -> RawFd {
        self.sock.as_raw_fd()
    }
}
