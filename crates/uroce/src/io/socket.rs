//! The UDP socket of a device. For IPv4 it is unconnected with
//! `IP_MTU_DISCOVER = IP_PMTUDISC_DO`, so the kernel sends DF with an IP
//! Identification of 0: the value the ICRC is computed with (see
//! shared/spec/platform.md). Datagrams are never fragmented.
//!
//! Batching: [`RoceSocket::send_groups`] hands the kernel several groups of
//! up to 64 equal packets, each group for one destination, in one
//! `sendmmsg` with UDP GSO (`UDP_SEGMENT`); each packet stays a datagram of
//! its own on the wire, the k-th of a group with IPv4 ID k (the caller fixes
//! its ICRC). The socket receives with UDP GRO into a [`RecvBatch`], all
//! that is queued in one `recvmmsg`: each buffer may hold several datagrams
//! back to back, their size in a `UDP_GRO` control message.
//! `UROCE_GRO=0` leaves `UDP_GRO` off (a test knob: every datagram then
//! arrives alone, as from a device without GRO).

use smallvec::SmallVec;
use socket2::{Domain, Protocol, SockAddr, Socket, Type};
use std::io;
use std::net::SocketAddr;
use std::os::fd::{AsRawFd, RawFd};

/// One buffer filled by [`RoceSocket::recv_batch`]: `len` bytes from
/// `from`; with GRO, datagrams of `seg` bytes back to back (the last may be
/// shorter).
#[derive(Debug, Clone, Copy)]
pub struct Received {
    pub len: usize,
    pub from: SocketAddr,
    pub seg: Option<usize>,
}

/// The `UDP_GRO` segment size in a received message's control data.
///
/// # Safety
/// `msg` is a header the kernel filled: `msg_control` valid for
/// `msg_controllen` bytes.
unsafe fn gro_segment(msg: &libc::msghdr) -> Option<usize> {
    let mut seg = None;
    // SAFETY: the caller's guarantee; the CMSG_* macros stay within
    // `msg_controllen`.
    unsafe {
        let mut c = libc::CMSG_FIRSTHDR(msg);
        while !c.is_null() {
            if (*c).cmsg_level == libc::SOL_UDP && (*c).cmsg_type == libc::UDP_GRO {
                seg = Some(std::ptr::read_unaligned(libc::CMSG_DATA(c) as *const u16) as usize);
            }
            c = libc::CMSG_NXTHDR(msg, c);
        }
    }
    seg
}

/// Room for one `UDP_SEGMENT` control message (CMSG_SPACE of a u16).
pub type SegmentControl = [u64; 4];

/// Makes `msg` a UDP GSO send of `seg`-byte segments: one `UDP_SEGMENT`
/// control message, stored in `ctl`.
///
/// # Safety
/// `ctl` outlives every use of `msg`.
pub unsafe fn set_udp_segment(msg: &mut libc::msghdr, ctl: &mut SegmentControl, seg: u16) {
    msg.msg_control = ctl.as_mut_ptr().cast();
    // SAFETY: CMSG_SPACE(2) (24 bytes) fits in `ctl` (32 bytes); the CMSG_*
    // macros stay inside it.
    unsafe {
        msg.msg_controllen = libc::CMSG_SPACE(2) as _;
        let c = libc::CMSG_FIRSTHDR(msg);
        (*c).cmsg_level = libc::SOL_UDP;
        (*c).cmsg_type = libc::UDP_SEGMENT;
        (*c).cmsg_len = libc::CMSG_LEN(2) as _;
        std::ptr::write_unaligned(libc::CMSG_DATA(c) as *mut u16, seg);
    }
}

/// The sender's address in a received message header.
///
/// # Safety
/// `msg.msg_name` points at a `sockaddr_storage` the kernel filled for
/// `msg_namelen` bytes.
unsafe fn sockaddr(msg: &libc::msghdr) -> Option<SocketAddr> {
    // SAFETY: the caller's guarantee.
    let storage = unsafe { *(msg.msg_name as *const libc::sockaddr_storage) };
    // SAFETY: `storage` holds `msg_namelen` bytes of a socket address.
    let addr = unsafe { SockAddr::new(storage, msg.msg_namelen) };
    addr.as_socket()
}

/// Whether the socket asks for UDP GRO: yes unless `UROCE_GRO=0`, a knob
/// for tests that need every datagram to arrive alone (as from a device
/// without GRO).
fn gro_wanted() -> bool {
    std::env::var_os("UROCE_GRO").is_none_or(|v| v != "0")
}

#[derive(Debug)]
pub struct RoceSocket {
    sock: Socket,
    local: SocketAddr,
    /// UDP GSO works (cleared after the kernel refuses it once).
    gso: std::sync::atomic::AtomicBool,
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

    #[cfg(feature = "unstable")]
    pub fn one(bytes: &'a [u8]) -> Datagram<'a> {
        Datagram { parts: [bytes, &[], &[]] }
    }

    pub fn len(&self) -> usize {
        self.parts.iter().map(|p| p.len()).sum()
    }

    #[cfg(any(test, feature = "unstable"))]
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

/// Most segments in one GSO send, and most bytes. The k-th segment of a
/// send carries IPv4 ID k, and receivers try exactly these IDs
/// (`wire::icrc::IPV4_ID_CANDIDATES`): the two are one number.
pub const GSO_MAX_SEGMENTS: usize = crate::wire::icrc::IPV4_ID_CANDIDATES as usize;
pub const GSO_MAX_BYTES: usize = 65000;

/// `setsockopt` of one `c_int` (options socket2 does not name).
fn set_int(sock: &Socket, level: libc::c_int, name: libc::c_int, value: libc::c_int) -> io::Result<()> {
    // SAFETY: setsockopt reads one c_int from `value`, which outlives the call.
    let rc = unsafe {
        libc::setsockopt(
            sock.as_raw_fd(),
            level,
            name,
            (&value as *const libc::c_int).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

impl RoceSocket {
    pub fn bind(addr: SocketAddr) -> io::Result<RoceSocket> {
        let domain = if addr.is_ipv4() { Domain::IPV4 } else { Domain::IPV6 };
        let sock = Socket::new(domain, Type::DGRAM.nonblocking().cloexec(), Some(Protocol::UDP))?;
        if addr.is_ipv6() {
            sock.set_only_v6(true)?;
            // Linux rxe sends RoCEv2 over IPv6 with a zero UDP checksum (its
            // ICRC covers the packet), which IPv6 sockets drop unless told
            // (RFC 6936, `udp6_unicast_rcv_skb`): without this, every
            // packet from a kernel rxe over IPv6 was lost here.
            set_int(&sock, libc::SOL_UDP, libc::UDP_NO_CHECK6_RX, 1)?;
        }
        let _ = sock.set_recv_buffer_size(8 << 20);
        let _ = sock.set_send_buffer_size(8 << 20);
        if addr.ip().is_ipv4() {
            set_int(&sock, libc::IPPROTO_IP, libc::IP_MTU_DISCOVER, libc::IP_PMTUDISC_DO)?;
        }
        if gro_wanted() {
            // Failure (an old kernel) only means datagrams arrive one per buffer.
            let _ = set_int(&sock, libc::SOL_UDP, libc::UDP_GRO, 1);
        }
        sock.bind(&SockAddr::from(addr))?;
        let local = sock.local_addr()?.as_socket().ok_or_else(|| io::Error::other("not an IP socket"))?;
        Ok(RoceSocket { sock, local, gso: std::sync::atomic::AtomicBool::new(true) })
    }

    pub fn local_addr(&self) -> SocketAddr {
        self.local
    }

    #[cfg(feature = "unstable")]
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
        // Inline room for the common case (a few groups: a reply and the
        // ACKs beside it), so that a small send allocates nothing.
        let addrs: SmallVec<[SockAddr; 4]> = groups[..n].iter().map(|&(dst, _)| SockAddr::from(dst)).collect();
        let mut iov: SmallVec<[libc::iovec; 12]> = SmallVec::new();
        let mut ends: SmallVec<[usize; 4]> = SmallVec::new();
        for &(_, segs) in &groups[..n] {
            iov.extend(iovecs(segs));
            ends.push(iov.len());
        }
        // CMSG space for one u16 per group.
        let mut cbufs: SmallVec<[SegmentControl; 4]> = smallvec::smallvec![[0u64; 4]; n];
        // SAFETY: mmsghdr is plain old data; all-zero is a valid value.
        let mut hdrs: SmallVec<[libc::mmsghdr; 4]> = (0..n).map(|_| unsafe { std::mem::zeroed() }).collect();
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
                // SAFETY: `cbufs` outlives the `sendmmsg` below.
                unsafe { set_udp_segment(h, &mut cbufs[k], segs[0].len() as u16) };
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

    /// Receives without blocking into as many of `batch`'s buffers as the
    /// socket has datagrams (or GRO batches) for, in one `recvmmsg`; the
    /// filled ones are then `batch.filled()`. An empty socket fills none.
    ///
    /// After a receive that found the socket empty, this one takes a single
    /// message with `recvmsg`: `recvmmsg` would try for a second one before
    /// returning the first, which costs a datagram that ends a quiet spell
    /// (a ping-pong's every datagram) ≈ 0.2 µs. A busy socket gets `recvmmsg`.
    pub fn recv_batch(&self, batch: &mut RecvBatch) -> io::Result<()> {
        batch.filled.clear();
        for m in batch.msgs[..batch.touched].iter_mut() {
            // The kernel shortens both to what it wrote.
            m.msg_hdr.msg_namelen = std::mem::size_of::<libc::sockaddr_storage>() as _;
            m.msg_hdr.msg_controllen = std::mem::size_of::<Control>() as _;
        }
        let fd = self.sock.as_raw_fd();
        let got = if batch.was_empty {
            // SAFETY: the first header points into `batch`'s own buffers, of
            // the lengths it states (see `RecvBatch::new`); the kernel writes
            // within them.
            let n = unsafe { libc::recvmsg(fd, &mut batch.msgs[0].msg_hdr, libc::MSG_DONTWAIT) };
            if n < 0 {
                -1
            } else {
                // One message, however long (an empty datagram too: the
                // engine counts it as malformed, as after `recvmmsg`).
                batch.msgs[0].msg_len = n as _;
                1
            }
        } else {
            // SAFETY: as above, for every header.
            unsafe {
                libc::recvmmsg(
                    fd,
                    batch.msgs.as_mut_ptr(),
                    batch.msgs.len() as _,
                    libc::MSG_DONTWAIT,
                    std::ptr::null_mut(),
                )
            }
        };
        batch.touched = got.max(1) as usize;
        batch.was_empty = got <= 0;
        if got < 0 {
            let e = io::Error::last_os_error();
            return if e.kind() == io::ErrorKind::WouldBlock { Ok(()) } else { Err(e) };
        }
        for m in &batch.msgs[..got as usize] {
            let len = m.msg_len as usize;
            // SAFETY: the kernel filled this header's control buffer within
            // `msg_controllen`, and its name within `msg_namelen`.
            let (seg, from) = unsafe { (gro_segment(&m.msg_hdr), sockaddr(&m.msg_hdr)) };
            let from = from.ok_or_else(|| io::Error::other("not an IP peer"))?;
            batch.filled.push(Received { len, from, seg: seg.filter(|&s| s > 0 && s < len) });
        }
        Ok(())
    }
}

/// Room for the `UDP_GRO` control message.
type Control = [u64; 8];

/// Receive buffers and the `recvmmsg` headers that point into them, set up
/// once: a receive only resets two lengths per header.
pub struct RecvBatch {
    bufs: Vec<Vec<u8>>,
    /// Where `msgs` point (senders' addresses, control messages, iovecs
    /// over `bufs`): never read through these fields, only kept alive.
    _names: Box<[libc::sockaddr_storage]>,
    _controls: Box<[Control]>,
    _iovs: Box<[libc::iovec]>,
    msgs: Box<[libc::mmsghdr]>,
    filled: Vec<Received>,
    /// Headers the last receive may have changed (their lengths to reset).
    touched: usize,
    /// The last receive found the socket empty.
    was_empty: bool,
}

// SAFETY: the raw pointers in `iovs` and `msgs` point only into this
// struct's own heap allocations, which move with it; they are used only
// through `&mut self`.
unsafe impl Send for RecvBatch {}

impl RecvBatch {
    /// `n` buffers of `size` bytes.
    pub fn new(n: usize, size: usize) -> RecvBatch {
        let mut bufs: Vec<Vec<u8>> = (0..n).map(|_| vec![0u8; size]).collect();
        // SAFETY: sockaddr_storage is plain old data; all zero is valid.
        let mut names: Box<[libc::sockaddr_storage]> = (0..n).map(|_| unsafe { std::mem::zeroed() }).collect();
        let mut controls: Box<[Control]> = vec![[0u64; 8]; n].into_boxed_slice();
        let mut iovs: Box<[libc::iovec]> =
            bufs.iter_mut().map(|b| libc::iovec { iov_base: b.as_mut_ptr().cast(), iov_len: b.len() }).collect();
        let msgs = (0..n)
            .map(|i| {
                // SAFETY: mmsghdr is plain old data; all zero is valid.
                let mut m: libc::mmsghdr = unsafe { std::mem::zeroed() };
                m.msg_hdr.msg_name = (&mut names[i] as *mut libc::sockaddr_storage).cast();
                m.msg_hdr.msg_iov = &mut iovs[i];
                m.msg_hdr.msg_iovlen = 1;
                m.msg_hdr.msg_control = controls[i].as_mut_ptr().cast();
                m
            })
            .collect();
        RecvBatch {
            bufs,
            _names: names,
            _controls: controls,
            _iovs: iovs,
            msgs,
            filled: Vec::with_capacity(n),
            touched: n,
            was_empty: false,
        }
    }

    /// A pass that does not read the socket: nothing filled.
    pub fn skip(&mut self) {
        self.filled.clear();
    }

    /// Whether the last read found the socket empty.
    pub fn was_empty(&self) -> bool {
        self.was_empty
    }

    /// What the last receive filled, a buffer each, in order.
    pub fn filled(&self) -> &[Received] {
        &self.filled
    }

    /// The bytes of the `i`-th filled buffer.
    pub fn bytes(&self, i: usize) -> &[u8] {
        &self.bufs[i][..self.filled[i].len]
    }
}

impl AsRawFd for RoceSocket {
    fn as_raw_fd(&self) -> RawFd {
        self.sock.as_raw_fd()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pair() -> (RoceSocket, RoceSocket) {
        let a = RoceSocket::bind("127.0.0.1:0".parse().unwrap()).unwrap();
        let b = RoceSocket::bind("127.0.0.1:0".parse().unwrap()).unwrap();
        (a, b)
    }

    /// Receives until `n` buffers came or a second passed.
    fn recv_until(s: &RoceSocket, batch: &mut RecvBatch, n: usize) -> Vec<Received> {
        let t = std::time::Instant::now();
        let mut got = Vec::new();
        while got.len() < n && t.elapsed() < std::time::Duration::from_secs(1) {
            s.recv_batch(batch).unwrap();
            got.extend_from_slice(batch.filled());
        }
        got
    }

    /// Kernel rxe sends RoCEv2 over IPv6 with a zero UDP checksum: such a
    /// datagram (sent here through a raw socket, as the kernel would put
    /// it on the wire) reaches the device's socket. Without
    /// UDP_NO_CHECK6_RX the kernel dropped it as a checksum error.
    #[test]
    fn an_ipv6_datagram_with_a_zero_checksum_arrives() {
        let Ok(b) = RoceSocket::bind("[::1]:0".parse().unwrap()) else {
            println!("SKIP {}: no IPv6 loopback here", std::thread::current().name().unwrap_or("?"));
            return;
        };
        // SAFETY: a raw IPv6 socket for UDP, closed below.
        let raw = unsafe { libc::socket(libc::AF_INET6, libc::SOCK_RAW, libc::IPPROTO_UDP) };
        if raw < 0 {
            println!("SKIP {}: no raw socket (needs CAP_NET_RAW)", std::thread::current().name().unwrap_or("?"));
            return;
        }
        let payload = [0x5au8; 40];
        let mut dgram = Vec::new();
        dgram.extend_from_slice(&4791u16.to_be_bytes());
        dgram.extend_from_slice(&b.local_addr().port().to_be_bytes());
        dgram.extend_from_slice(&((8 + payload.len()) as u16).to_be_bytes());
        dgram.extend_from_slice(&[0, 0]); // no checksum
        dgram.extend_from_slice(&payload);
        // SAFETY: an all-zero sockaddr_in6 is valid; filled below.
        let mut to: libc::sockaddr_in6 = unsafe { std::mem::zeroed() };
        to.sin6_family = libc::AF_INET6 as libc::sa_family_t;
        to.sin6_addr.s6_addr = std::net::Ipv6Addr::LOCALHOST.octets();
        // SAFETY: our raw socket, a buffer and an address of the sizes given.
        let sent = unsafe {
            libc::sendto(
                raw,
                dgram.as_ptr().cast(),
                dgram.len(),
                0,
                (&to as *const libc::sockaddr_in6).cast(),
                std::mem::size_of::<libc::sockaddr_in6>() as libc::socklen_t,
            )
        };
        // SAFETY: our descriptor.
        unsafe { libc::close(raw) };
        assert_eq!(sent, dgram.len() as isize, "{}", io::Error::last_os_error());
        let mut batch = RecvBatch::new(4, 65536);
        let got = recv_until(&b, &mut batch, 1);
        assert_eq!(got.len(), 1, "the zero-checksum datagram was dropped");
        assert_eq!(batch.bytes(0), payload);
    }

    #[test]
    fn a_gso_send_arrives_as_one_gro_buffer_of_its_segments() {
        let (a, b) = pair();
        let bytes: Vec<Vec<u8>> = (0..3u8).map(|i| vec![i; if i == 2 { 50 } else { 100 }]).collect();
        let segs: Vec<Datagram> = bytes.iter().map(|d| Datagram::one(d)).collect();
        assert_eq!(a.send_groups(&[(b.local_addr(), &segs)]).unwrap(), 1);
        let mut batch = RecvBatch::new(4, 65536);
        let got = recv_until(&b, &mut batch, 1);
        assert_eq!(got.len(), 1);
        assert_eq!((got[0].len, got[0].seg, got[0].from), (250, Some(100), a.local_addr()));
        assert_eq!(batch.bytes(0), bytes.concat());
    }

    #[test]
    fn a_receive_after_an_empty_one_takes_one_message_and_the_next_the_rest() {
        let (a, b) = pair();
        let mut batch = RecvBatch::new(8, 2048);
        let send3 = || {
            for i in 0..3u8 {
                a.send_to(&[i; 10], b.local_addr()).unwrap();
            }
        };
        // A busy socket (the last receive was not empty): all at once.
        send3();
        std::thread::sleep(std::time::Duration::from_millis(20));
        b.recv_batch(&mut batch).unwrap();
        assert_eq!(batch.filled().len(), 3);
        b.recv_batch(&mut batch).unwrap();
        assert!(batch.filled().is_empty());
        // After an empty receive: the first alone, then the other two.
        send3();
        std::thread::sleep(std::time::Duration::from_millis(20));
        b.recv_batch(&mut batch).unwrap();
        assert_eq!(batch.filled().len(), 1);
        assert_eq!(batch.bytes(0), [0u8; 10]);
        b.recv_batch(&mut batch).unwrap();
        assert_eq!(batch.filled().len(), 2);
        assert_eq!((batch.bytes(0), batch.bytes(1)), (&[1u8; 10][..], &[2u8; 10][..]));
    }

    #[test]
    fn an_empty_datagram_is_received_either_way() {
        let (a, b) = pair();
        let mut batch = RecvBatch::new(8, 2048);
        for was_empty in [false, true] {
            batch.was_empty = was_empty;
            a.send_to(&[], b.local_addr()).unwrap();
            std::thread::sleep(std::time::Duration::from_millis(20));
            b.recv_batch(&mut batch).unwrap();
            assert_eq!(batch.filled().len(), 1, "after an empty receive: {was_empty}");
            assert_eq!(batch.filled()[0].len, 0);
        }
    }
}
