//! One datagram rsocket (SOCK_DGRAM) with rdma-core 44's "ds" protocol: a
//! UDP socket (whose fd is the socket's number) carries a datagram to a
//! peer whose UD QP is not yet known, behind a `ds_udp_header` that names
//! the sender's UD QP; the receiver answers with an `OP_CTRL` header naming
//! its own, and from then on datagrams travel between UD QPs (one per
//! local address, bound through the CM in RDMA_PS_UDP, Q_Key
//! RDMA_UDP_QKEY), each behind a `ds_header` carrying the sender's IP
//! address and UDP port. rsockets processes the UDP socket in a service
//! thread; here the socket's own calls (and `rpoll`) process it, so an
//! application that waits in this library sees the same exchange.

use super::stream::{set_nonblock, Buf};
use super::wire;
use crate::ffi::cma::*;
use crate::ffi::*;
use crate::rdmacm::id;
use crate::rdmacm::sockaddr::read_sockaddr;
use std::collections::{HashMap, VecDeque};
use std::ffi::{c_int, c_void};
use std::net::{IpAddr, SocketAddr};
use std::ptr::null_mut;

/// `DS_UDP_TAG`, header lengths, the GRH in front of UD receives.
const UDP_TAG: u32 = 0x5555_5555;
const UDP_HDR_V4: usize = 16;
const UDP_HDR_V6: usize = 28;
const HDR_V4: usize = 8;
const HDR_V6: usize = 24;
const GRH: usize = 40;
const SLOT: usize = wire::SNDLOWAT as usize;
const RDMA_UDP_QKEY: u32 = 0x0123_4567;
/// Most peers one datagram socket keeps (each with an address handle).
const MAX_DESTS: usize = 4096;
/// `WR_ID_RECV` marks receives, as for streams.
const RECV: u64 = wire::WR_ID_RECV;

pub const READABLE: u32 = super::stream::READABLE;
pub const WRITABLE: u32 = super::stream::WRITABLE;

/// `struct ds_header` for a local address.
fn ds_header(a: &SocketAddr) -> Vec<u8> {
    match a {
        SocketAddr::V4(v) => {
            let mut h = vec![4, HDR_V4 as u8];
            h.extend_from_slice(&v.port().to_be_bytes());
            h.extend_from_slice(&v.ip().octets());
            h
        }
        SocketAddr::V6(v) => {
            let mut h = vec![6, HDR_V6 as u8];
            h.extend_from_slice(&v.port().to_be_bytes());
            h.extend_from_slice(&v.flowinfo().to_be_bytes());
            h.extend_from_slice(&v.ip().octets());
            h
        }
    }
}

/// The source a `ds_header` names, with its length; None when malformed.
fn parse_header(b: &[u8]) -> Option<(SocketAddr, usize)> {
    match (b.first(), b.get(1)) {
        (Some(4), Some(&l)) if l as usize == HDR_V4 && b.len() >= HDR_V4 => {
            let ip = std::net::Ipv4Addr::new(b[4], b[5], b[6], b[7]);
            Some((SocketAddr::new(IpAddr::V4(ip), u16::from_be_bytes([b[2], b[3]])), HDR_V4))
        }
        (Some(6), Some(&l)) if l as usize == HDR_V6 && b.len() >= HDR_V6 => {
            let ip: [u8; 16] = b[8..24].try_into().ok()?;
            let port = u16::from_be_bytes([b[2], b[3]]);
            let flow = u32::from_be_bytes(b[4..8].try_into().ok()?);
            Some((SocketAddr::V6(std::net::SocketAddrV6::new(ip.into(), port, flow, 0)), HDR_V6))
        }
        _ => None,
    }
}

/// The IPv4-mapped or IPv6 GID of an address.
fn gid_of(ip: IpAddr) -> [u8; 16] {
    match ip {
        IpAddr::V4(v) => v.to_ipv6_mapped().octets(),
        IpAddr::V6(v) => v.octets(),
    }
}

struct DsQp {
    id: *mut rdma_cm_id,
    local: SocketAddr,
    hdr: Vec<u8>,
    cq_ch: *mut ibv_comp_channel,
    cq: *mut ibv_cq,
    smr: *mut ibv_mr,
    rbuf: Buf,
    rmr: *mut ibv_mr,
    armed: bool,
}

struct Dest {
    qp: usize,
    ah: *mut ibv_ah,
    qpn: u32,
}

enum Rmsg {
    /// A UD receive: its QP and slot, the bytes after the GRH.
    Qp { qp: usize, offset: usize, len: usize },
    /// A datagram that came over the UDP socket.
    Udp { src: SocketAddr, data: Vec<u8> },
}

pub struct Dgram {
    pub fd: c_int,
    epfd: c_int,
    pub state: u32,
    /// Datagrams, completions and CQ events taken so far: a change other
    /// waiters of the socket are woken for (`super::wake`).
    pub progress: u64,
    pub fd_flags: c_int,
    pub sq_size: u16,
    pub rq_size: u16,
    pub sq_inline: u32,
    pub sbuf_size: u32,
    pub rbuf_size: u32,
    qps: Vec<DsQp>,
    dests: HashMap<SocketAddr, Dest>,
    conn: Option<SocketAddr>,
    sbuf: Option<Buf>,
    free: Vec<usize>,
    sqe_avail: usize,
    rmsgs: VecDeque<Rmsg>,
}

// SAFETY: the raw pointers are this socket's own objects, used under its mutex.
unsafe impl Send for Dgram {}

fn errno() -> c_int {
    crate::errno::last()
}

fn sockaddr(a: &SocketAddr) -> (libc::sockaddr_storage, libc::socklen_t) {
    let ss = crate::rdmacm::sockaddr::sockaddr_of(*a);
    let len =
        if a.is_ipv4() { std::mem::size_of::<libc::sockaddr_in>() } else { std::mem::size_of::<libc::sockaddr_in6>() };
    (ss, len as libc::socklen_t)
}

impl Dgram {
    /// `ds_init`: the UDP socket and the epoll set a waiter sleeps on.
    pub fn new(domain: c_int) -> Result<Dgram, c_int> {
        // SAFETY: plain socket calls.
        let fd = unsafe { libc::socket(domain, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0) };
        if fd < 0 {
            return Err(errno());
        }
        // SAFETY: as above.
        let epfd = unsafe { libc::epoll_create1(libc::EPOLL_CLOEXEC) };
        if epfd < 0 {
            let e = errno();
            // SAFETY: ours.
            unsafe { libc::close(fd) };
            return Err(e);
        }
        let mut ev = libc::epoll_event { events: libc::EPOLLIN as u32, u64: 0 };
        // SAFETY: our fds.
        unsafe { libc::epoll_ctl(epfd, libc::EPOLL_CTL_ADD, fd, &mut ev) };
        Ok(Dgram {
            fd,
            epfd,
            state: 0,
            fd_flags: 0,
            sq_size: 384,
            rq_size: 384,
            sq_inline: 64,
            sbuf_size: 1 << 17,
            rbuf_size: 1 << 17,
            qps: Vec::new(),
            dests: HashMap::new(),
            conn: None,
            sbuf: None,
            free: Vec::new(),
            sqe_avail: 0,
            rmsgs: VecDeque::new(),
            progress: 0,
        })
    }

    pub fn has_qps(&self) -> bool {
        !self.qps.is_empty()
    }
    pub fn wake_fd(&mut self) -> c_int {
        self.arm();
        self.epfd
    }

    /// `ds_init_ep` (once): queue sizes from the buffers, the send slots.
    pub fn init_ep(&mut self) -> Result<(), c_int> {
        if self.sbuf.is_some() {
            return Ok(());
        }
        self.sq_size = self.sq_size.clamp(1, 16384);
        self.rq_size = self.rq_size.clamp(1, 16384);
        let rmax = (self.rbuf_size as usize / SLOT).max(1);
        if self.rq_size as usize > rmax {
            self.rq_size = rmax as u16;
        } else {
            self.rbuf_size = (self.rq_size as usize * SLOT) as u32;
        }
        let smax = (self.sbuf_size as usize / SLOT).max(1);
        if self.sq_size as usize > smax {
            self.sq_size = smax as u16;
        } else {
            self.sbuf_size = (self.sq_size as usize * SLOT) as u32;
        }
        self.sbuf = Some(Buf::new(self.sq_size as usize * SLOT)?);
        self.free = (0..self.sq_size as usize).rev().map(|i| i * SLOT).collect();
        self.sqe_avail = self.sq_size as usize;
        self.state = READABLE | WRITABLE;
        Ok(())
    }

    fn udp_name(&self, peer: bool) -> Option<SocketAddr> {
        // SAFETY: plain old data and our socket.
        let mut ss: libc::sockaddr_storage = unsafe { std::mem::zeroed() };
        let mut len = std::mem::size_of::<libc::sockaddr_storage>() as libc::socklen_t;
        let p = &mut ss as *mut _ as *mut libc::sockaddr;
        // SAFETY: as above.
        let r = unsafe {
            if peer {
                libc::getpeername(self.fd, p, &mut len)
            } else {
                libc::getsockname(self.fd, p, &mut len)
            }
        };
        // SAFETY: a sockaddr the kernel filled.
        (r == 0).then(|| unsafe { read_sockaddr(p) }).flatten()
    }

    /// `ds_get_src_addr`: the local address datagrams to `dst` leave from.
    fn src_for(&self, dst: &SocketAddr) -> Result<SocketAddr, c_int> {
        let mine = self.udp_name(false).ok_or(libc::EINVAL)?;
        let any = match mine.ip() {
            IpAddr::V4(v) => v.is_unspecified() || v == std::net::Ipv4Addr::LOCALHOST,
            IpAddr::V6(v) => v.is_unspecified() || v.is_loopback(),
        };
        if !any {
            return Ok(mine);
        }
        let domain = if dst.is_ipv4() { libc::AF_INET } else { libc::AF_INET6 };
        // SAFETY: a temporary socket of ours.
        let s = unsafe { libc::socket(domain, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0) };
        if s < 0 {
            return Err(errno());
        }
        let (ss, len) = sockaddr(dst);
        // SAFETY: our socket, a sockaddr of `len` bytes.
        let r = unsafe { libc::connect(s, &ss as *const _ as *const libc::sockaddr, len) };
        let mut out = Err(errno());
        if r == 0 {
            // SAFETY: as above.
            let mut ls: libc::sockaddr_storage = unsafe { std::mem::zeroed() };
            let mut ll = std::mem::size_of::<libc::sockaddr_storage>() as libc::socklen_t;
            // SAFETY: as above.
            if unsafe { libc::getsockname(s, &mut ls as *mut _ as *mut libc::sockaddr, &mut ll) } == 0 {
                // SAFETY: filled by the kernel.
                if let Some(a) = unsafe { read_sockaddr(&ls as *const _ as *const libc::sockaddr) } {
                    out = Ok(SocketAddr::new(a.ip(), mine.port()));
                }
            }
        }
        // SAFETY: ours.
        unsafe { libc::close(s) };
        out
    }

    /// `ds_create_qp`: a UD QP bound (RDMA_PS_UDP) to `local`, receives posted.
    fn create_qp(&mut self, local: SocketAddr) -> Result<usize, c_int> {
        let mut idp: *mut rdma_cm_id = null_mut();
        // SAFETY: a synchronous id (no channel).
        if unsafe { id::uroce_cm_rdma_create_id(null_mut(), &mut idp, null_mut(), rdma_port_space_RDMA_PS_UDP) } != 0 {
            return Err(errno());
        }
        let rbuf = match Buf::new(self.rbuf_size as usize + GRH) {
            Ok(b) => b,
            Err(e) => {
                // SAFETY: the id just made.
                unsafe { id::uroce_cm_rdma_destroy_id(idp) };
                return Err(e);
            }
        };
        let mut q = DsQp {
            id: idp,
            local,
            hdr: ds_header(&local),
            cq_ch: null_mut(),
            cq: null_mut(),
            smr: null_mut(),
            rbuf,
            rmr: null_mut(),
            armed: false,
        };
        let r = self.setup_qp(&mut q);
        if let Err(e) = r {
            drop_qp(self.epfd, q);
            return Err(e);
        }
        self.qps.push(q);
        Ok(self.qps.len() - 1)
    }

    fn setup_qp(&self, q: &mut DsQp) -> Result<(), c_int> {
        let (mut ss, _) = sockaddr(&q.local);
        // SAFETY: our id and a sockaddr.
        if unsafe { id::uroce_cm_rdma_bind_addr(q.id, &mut ss as *mut _ as *mut _) } != 0 {
            return Err(errno());
        }
        // SAFETY: the bound id's device objects; our buffers, alive as long as the QP.
        unsafe {
            let (ctx, pd) = ((*q.id).verbs, (*q.id).pd);
            let lw = ibv_access_flags_IBV_ACCESS_LOCAL_WRITE as c_int;
            let sb = self.sbuf.as_ref().ok_or(libc::EINVAL)?;
            q.smr = crate::objects::ibv_reg_mr(pd, sb.ptr() as *mut c_void, self.sbuf_size as usize, lw);
            if q.smr.is_null() {
                return Err(errno());
            }
            q.rmr = crate::objects::ibv_reg_mr(pd, q.rbuf.ptr() as *mut c_void, self.rbuf_size as usize + GRH, lw);
            if q.rmr.is_null() {
                return Err(errno());
            }
            q.cq_ch = crate::objects::ibv_create_comp_channel(ctx);
            if q.cq_ch.is_null() {
                return Err(errno());
            }
            set_nonblock((*q.cq_ch).fd);
            let n = self.sq_size as c_int + self.rq_size as c_int;
            q.cq = crate::objects::ibv_create_cq(ctx, n, null_mut(), q.cq_ch, 0);
            if q.cq.is_null() {
                return Err(errno());
            }
            let mut attr: ibv_qp_init_attr = std::mem::zeroed();
            attr.send_cq = q.cq;
            attr.recv_cq = q.cq;
            attr.qp_type = ibv_qp_type_IBV_QPT_UD;
            attr.sq_sig_all = 1;
            attr.cap.max_send_wr = self.sq_size as u32;
            attr.cap.max_recv_wr = self.rq_size as u32;
            attr.cap.max_send_sge = 1;
            attr.cap.max_recv_sge = 2;
            attr.cap.max_inline_data = self.sq_inline;
            if id::uroce_cm_rdma_create_qp(q.id, null_mut(), &mut attr) != 0 {
                return Err(errno());
            }
            let mut ev = libc::epoll_event { events: libc::EPOLLIN as u32, u64: 1 };
            libc::epoll_ctl(self.epfd, libc::EPOLL_CTL_ADD, (*q.cq_ch).fd, &mut ev);
        }
        for i in 0..self.rq_size as usize {
            post_recv(q, self.rbuf_size as usize, i * SLOT)?;
        }
        Ok(())
    }

    /// `ds_get_dest`: the destination entry for `addr` (with the QP of the
    /// local address that reaches it).
    fn dest(&mut self, addr: SocketAddr) -> Result<(), c_int> {
        if self.dests.contains_key(&addr) {
            return Ok(());
        }
        // Each peer costs an address handle: bounded (datagrams from more
        // peers than this are dropped, sends to them fail ENOBUFS).
        if self.dests.len() >= MAX_DESTS {
            return Err(libc::ENOBUFS);
        }
        let local = self.src_for(&addr)?;
        let qp = match self.qps.iter().position(|q| q.local == local) {
            Some(i) => i,
            None => self.create_qp(local)?,
        };
        self.dests.insert(addr, Dest { qp, ah: null_mut(), qpn: 0 });
        Ok(())
    }

    /// An unbound socket whose route to `dst` leaves from an address no
    /// uroce device has (127.0.0.1 for every 127.x peer) is bound to the
    /// default device's address first, so that its UD QP and the address
    /// its datagrams name agree (rsockets would pick the route's source).
    fn bind_for(&mut self, dst: &SocketAddr) -> Result<(), c_int> {
        if self.udp_name(false).is_some_and(|a| a.port() != 0) {
            return Ok(());
        }
        let src = self.src_for(dst)?;
        let mut g = crate::rdmacm::state::lock();
        if crate::rdmacm::dev::device_for(&mut g, Some(src.ip())).is_ok() {
            return Ok(());
        }
        let Ok(i) = crate::rdmacm::dev::device_for(&mut g, None) else { return Ok(()) };
        let ip = g.devs[i].ip;
        drop(g);
        if ip.is_ipv4() != dst.is_ipv4() {
            return Ok(());
        }
        let (ss, len) = sockaddr(&SocketAddr::new(ip, 0));
        // SAFETY: our socket, a sockaddr of `len` bytes.
        if unsafe { libc::bind(self.fd, &ss as *const _ as *const libc::sockaddr, len) } != 0 {
            return Err(errno());
        }
        Ok(())
    }

    pub fn connect(&mut self, addr: SocketAddr) -> Result<(), c_int> {
        self.init_ep()?;
        self.bind_for(&addr)?;
        let (ss, len) = sockaddr(&addr);
        // SAFETY: our socket, a sockaddr of `len` bytes.
        if unsafe { libc::connect(self.fd, &ss as *const _ as *const libc::sockaddr, len) } != 0 {
            return Err(errno());
        }
        self.dest(addr)?;
        self.conn = Some(addr);
        Ok(())
    }

    /// `ds_sendv_udp`: the UDP header (this side's QP) and `data` to `to`.
    fn send_udp(&self, to: SocketAddr, op: u8, data: &[u8], flags: c_int) -> Result<usize, c_int> {
        let d = self.dests.get(&to).ok_or(libc::EINVAL)?;
        let q = &self.qps[d.qp];
        // SAFETY: the QP of a live dest.
        let qpn = unsafe { (*(*q.id).qp).qp_num } & 0xFF_FFFF;
        let mut h = Vec::with_capacity(UDP_HDR_V6);
        h.extend_from_slice(&UDP_TAG.to_be_bytes());
        let v6 = q.local.is_ipv6();
        h.push(if v6 { 6 } else { 4 });
        h.push(op);
        h.push(if v6 { UDP_HDR_V6 } else { UDP_HDR_V4 } as u8);
        h.push(0);
        h.extend_from_slice(&qpn.to_be_bytes());
        match q.local.ip() {
            IpAddr::V4(v) => h.extend_from_slice(&v.octets()),
            IpAddr::V6(v) => h.extend_from_slice(&v.octets()),
        }
        let mut iov = [
            libc::iovec { iov_base: h.as_ptr() as *mut c_void, iov_len: h.len() },
            libc::iovec { iov_base: data.as_ptr() as *mut c_void, iov_len: data.len() },
        ];
        let (mut ss, len) = sockaddr(&to);
        // SAFETY: plain old data.
        let mut m: libc::msghdr = unsafe { std::mem::zeroed() };
        m.msg_name = &mut ss as *mut _ as *mut c_void;
        m.msg_namelen = len;
        m.msg_iov = iov.as_mut_ptr();
        m.msg_iovlen = 2;
        // SAFETY: our socket and message.
        let n = unsafe { libc::sendmsg(self.fd, &m, flags & libc::MSG_DONTWAIT) };
        if n < 0 {
            return Err(errno());
        }
        Ok((n as usize).saturating_sub(h.len()))
    }

    /// `udp_svc_create_ah`: the address handle to the peer's UD QP `qpn`.
    fn create_ah(&mut self, to: SocketAddr, qpn: u32) {
        let Some(d) = self.dests.get(&to) else { return };
        let q = &self.qps[d.qp];
        // SAFETY: the QP's context and PD; plain old data.
        let ah = unsafe {
            let mut attr: ibv_ah_attr = std::mem::zeroed();
            attr.is_global = 1;
            attr.grh.dgid.raw = gid_of(to.ip());
            attr.grh.hop_limit = 64;
            attr.port_num = 1;
            let want = gid_of(q.local.ip());
            for i in 0..16 {
                let mut g: ibv_gid = std::mem::zeroed();
                if crate::device::ibv_query_gid((*q.id).verbs, 1, i, &mut g) == 0 && g.raw == want {
                    attr.grh.sgid_index = i as u8;
                    break;
                }
            }
            crate::objects::ibv_create_ah((*q.id).pd, &mut attr)
        };
        if ah.is_null() {
            return;
        }
        let d = self.dests.get_mut(&to).expect("checked");
        if !d.ah.is_null() {
            // SAFETY: the dest's previous AH.
            unsafe { crate::objects::ibv_destroy_ah(d.ah) };
        }
        d.ah = ah;
        d.qpn = qpn;
    }

    /// `udp_svc_process_rs` for every datagram waiting on the UDP socket.
    fn process_udp(&mut self) {
        let mut buf = [0u8; SLOT];
        for _ in 0..64 {
            // SAFETY: plain old data.
            let mut ss: libc::sockaddr_storage = unsafe { std::mem::zeroed() };
            let mut sl = std::mem::size_of::<libc::sockaddr_storage>() as libc::socklen_t;
            // SAFETY: our socket and buffers.
            let n = unsafe {
                libc::recvfrom(
                    self.fd,
                    buf.as_mut_ptr() as *mut c_void,
                    buf.len(),
                    libc::MSG_DONTWAIT,
                    &mut ss as *mut _ as *mut libc::sockaddr,
                    &mut sl,
                )
            };
            if n < 0 {
                return;
            }
            self.progress += 1;
            let b = &buf[..n as usize];
            // SAFETY: filled by the kernel.
            let Some(src) = (unsafe { read_sockaddr(&ss as *const _ as *const libc::sockaddr) }) else {
                continue;
            };
            let hl = if src.is_ipv4() { UDP_HDR_V4 } else { UDP_HDR_V6 };
            let ver = if src.is_ipv4() { 4 } else { 6 };
            if b.len() < hl
                || u32::from_be_bytes([b[0], b[1], b[2], b[3]]) != UDP_TAG
                || b[4] != ver
                || b[6] as usize != hl
            {
                continue;
            }
            let op = b[5] as u32;
            let qpn = u32::from_be_bytes([b[8], b[9], b[10], b[11]]) & 0xFF_FFFF;
            if self.dest(src).is_err() {
                continue;
            }
            if op == wire::OP_DATA {
                let _ = self.send_udp(src, wire::OP_CTRL as u8, &[], libc::MSG_DONTWAIT);
            }
            let d = &self.dests[&src];
            if d.ah.is_null() || d.qpn != qpn {
                self.create_ah(src, qpn);
            }
            if op == wire::OP_DATA && self.rmsgs.len() < self.rq_size as usize {
                self.rmsgs.push_back(Rmsg::Udp { src, data: b[hl..].to_vec() });
            }
        }
    }

    pub fn arm(&mut self) {
        for q in &mut self.qps {
            if !q.armed {
                // SAFETY: our CQ.
                unsafe { crate::datapath::req_notify_cq(q.cq, 0) };
                q.armed = true;
            }
        }
    }

    /// Takes the CQ events that fired (re-armed by the next wait).
    pub fn take_cq_events(&mut self) {
        for q in &mut self.qps {
            let (mut cq, mut ctx) = (null_mut(), null_mut());
            // SAFETY: our non-blocking channel.
            while unsafe { crate::objects::ibv_get_cq_event(q.cq_ch, &mut cq, &mut ctx) } == 0 {
                // SAFETY: our CQ.
                unsafe { crate::objects::ibv_ack_cq_events(cq, 1) };
                q.armed = false;
                self.progress += 1;
            }
        }
    }

    /// `ds_poll_cqs` and the UDP socket.
    pub fn process(&mut self) {
        self.process_udp();
        let rbuf_size = self.rbuf_size as usize;
        for (i, q) in self.qps.iter().enumerate() {
            loop {
                // SAFETY: plain old data.
                let mut wc: ibv_wc = unsafe { std::mem::zeroed() };
                // SAFETY: our CQ.
                if unsafe { crate::datapath::poll_cq(q.cq, 1, &mut wc) } <= 0 {
                    break;
                }
                self.progress += 1;
                let off = wc.wr_id as u32 as usize;
                if wc.wr_id & RECV != 0 {
                    let len = (wc.byte_len as usize).saturating_sub(GRH);
                    // SAFETY: the slot inside rbuf.
                    let b = unsafe { std::slice::from_raw_parts(q.rbuf.ptr().add(off), len.min(SLOT)) };
                    let ok = wc.status == ibv_wc_status_IBV_WC_SUCCESS && parse_header(b).is_some();
                    if ok && self.rmsgs.len() < self.rq_size as usize {
                        self.rmsgs.push_back(Rmsg::Qp { qp: i, offset: off, len: len.min(SLOT) });
                    } else {
                        let _ = post_recv(q, rbuf_size, off);
                    }
                } else {
                    self.free.push(off);
                    self.sqe_avail += 1;
                }
            }
        }
    }

    pub fn have_rdata(&self) -> bool {
        !self.rmsgs.is_empty()
    }
    pub fn can_send(&self) -> bool {
        self.sqe_avail > 0
    }

    /// `dsend` to `to` (which has a dest entry): over UDP until the peer's
    /// QP is known, then over UD.
    pub fn send(&mut self, to: SocketAddr, data: &[u8], flags: c_int) -> Result<usize, c_int> {
        let d = self.dests.get(&to).ok_or(libc::EDESTADDRREQ)?;
        if d.ah.is_null() {
            return self.send_udp(to, wire::OP_DATA as u8, data, flags);
        }
        let q = &self.qps[d.qp];
        if q.hdr.len() + data.len() > SLOT {
            return Err(libc::EMSGSIZE);
        }
        let Some(off) = self.free.pop() else { return Err(libc::EAGAIN) };
        self.sqe_avail -= 1;
        let sb = self.sbuf.as_ref().expect("init_ep ran").ptr();
        // SAFETY: one SLOT-byte slot of sbuf, the header and data fit (checked).
        unsafe {
            std::ptr::copy_nonoverlapping(q.hdr.as_ptr(), sb.add(off), q.hdr.len());
            std::ptr::copy_nonoverlapping(data.as_ptr(), sb.add(off + q.hdr.len()), data.len());
        }
        let total = (q.hdr.len() + data.len()) as u32;
        // SAFETY: our MR.
        let mut sge = ibv_sge { addr: sb as u64 + off as u64, length: total, lkey: unsafe { (*q.smr).lkey } };
        // SAFETY: plain old data.
        let mut wr: ibv_send_wr = unsafe { std::mem::zeroed() };
        wr.wr_id = off as u64;
        wr.sg_list = &mut sge;
        wr.num_sge = 1;
        wr.opcode = ibv_wr_opcode_IBV_WR_SEND;
        wr.send_flags = if total <= self.sq_inline { ibv_send_flags_IBV_SEND_INLINE } else { 0 };
        wr.wr.ud.ah = d.ah;
        wr.wr.ud.remote_qpn = d.qpn;
        wr.wr.ud.remote_qkey = RDMA_UDP_QKEY;
        let mut bad = null_mut();
        // SAFETY: our QP; the WR lives across the call.
        match unsafe { crate::datapath::post_send((*q.id).qp, &mut wr, &mut bad) } {
            0 => Ok(data.len()),
            e => {
                self.free.push(off);
                self.sqe_avail += 1;
                Err(e)
            }
        }
    }

    /// Ensures a dest entry for `to` (rsendto).
    pub fn prepare(&mut self, to: SocketAddr) -> Result<(), c_int> {
        self.init_ep()?;
        if !self.dests.contains_key(&to) {
            self.bind_for(&to)?;
        }
        self.dest(to)
    }
    pub fn conn(&self) -> Option<SocketAddr> {
        self.conn
    }

    /// `ds_recvfrom` on the queued head: the bytes copied and the source.
    pub fn recv(&mut self, buf: *mut u8, len: usize, peek: bool) -> Option<(usize, SocketAddr)> {
        let rbuf_size = self.rbuf_size as usize;
        let (n, src) = match self.rmsgs.front()? {
            Rmsg::Qp { qp, offset, len: l } => {
                let q = &self.qps[*qp];
                // SAFETY: a received slot of rbuf.
                let b = unsafe { std::slice::from_raw_parts(q.rbuf.ptr().add(*offset), *l) };
                let (src, hl) = parse_header(b)?;
                let n = len.min(l - hl);
                // SAFETY: the caller's buffer of `len` bytes.
                unsafe { std::ptr::copy_nonoverlapping(b[hl..].as_ptr(), buf, n) };
                (n, src)
            }
            Rmsg::Udp { src, data } => {
                let n = len.min(data.len());
                // SAFETY: as above.
                unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), buf, n) };
                (n, *src)
            }
        };
        if !peek {
            if let Some(Rmsg::Qp { qp, offset, .. }) = self.rmsgs.pop_front() {
                let _ = post_recv(&self.qps[qp], rbuf_size, offset);
            }
        }
        Some((n, src))
    }
}

fn post_recv(q: &DsQp, rbuf_size: usize, offset: usize) -> Result<(), c_int> {
    // SAFETY: our MR.
    let lkey = unsafe { (*q.rmr).lkey };
    let base = q.rbuf.ptr() as u64;
    let mut sge = [
        ibv_sge { addr: base + rbuf_size as u64, length: GRH as u32, lkey },
        ibv_sge { addr: base + offset as u64, length: SLOT as u32, lkey },
    ];
    // SAFETY: plain old data.
    let mut wr: ibv_recv_wr = unsafe { std::mem::zeroed() };
    wr.wr_id = RECV | offset as u64;
    wr.sg_list = sge.as_mut_ptr();
    wr.num_sge = 2;
    let mut bad = null_mut();
    // SAFETY: our QP; the WR and SGEs live across the call.
    match unsafe { crate::datapath::post_recv((*q.id).qp, &mut wr, &mut bad) } {
        0 => Ok(()),
        e => Err(e),
    }
}

fn drop_qp(epfd: c_int, q: DsQp) {
    // SAFETY: the objects this QP made, each destroyed once.
    unsafe {
        if !(*q.id).qp.is_null() {
            id::uroce_cm_rdma_destroy_qp(q.id);
        }
        for mr in [q.smr, q.rmr] {
            if !mr.is_null() {
                crate::objects::ibv_dereg_mr(mr);
            }
        }
        if !q.cq.is_null() {
            crate::objects::ibv_destroy_cq(q.cq);
        }
        if !q.cq_ch.is_null() {
            libc::epoll_ctl(epfd, libc::EPOLL_CTL_DEL, (*q.cq_ch).fd, null_mut());
            crate::objects::ibv_destroy_comp_channel(q.cq_ch);
        }
        id::uroce_cm_rdma_destroy_id(q.id);
    }
}

impl Drop for Dgram {
    fn drop(&mut self) {
        for d in self.dests.values() {
            if !d.ah.is_null() {
                // SAFETY: our AH.
                unsafe { crate::objects::ibv_destroy_ah(d.ah) };
            }
        }
        for q in self.qps.drain(..) {
            drop_qp(self.epfd, q);
        }
        // SAFETY: our fds.
        unsafe {
            libc::close(self.epfd);
            libc::close(self.fd);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ds_header_round_trip() {
        let a: SocketAddr = "10.1.2.3:7174".parse().unwrap();
        let h = ds_header(&a);
        assert_eq!(h, [4, 8, 0x1C, 0x06, 10, 1, 2, 3]);
        assert_eq!(parse_header(&h), Some((a, 8)));
        assert_eq!(parse_header(&h[..7]), None);
        let b: SocketAddr = "[fe80::1]:9".parse().unwrap();
        let h6 = ds_header(&b);
        assert_eq!(h6.len(), 24);
        assert_eq!(parse_header(&h6).map(|x| x.1), Some(24));
    }
}
