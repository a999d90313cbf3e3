//! One stream rsocket (SOCK_STREAM): its CM id on its own event channel
//! (whose fd is the socket's number), the connection steps driven by the
//! channel's events, and the data path of rdma-core 44's protocol over an
//! RC QP: RDMA WRITE WITH IMM of data into the peer's receive buffer at the
//! target SGL entry the peer published, credit updates (`OP_SGL`) written
//! into the peer's target SGL, control messages (shutdown, disconnect).
//! The algorithms follow librdmacm/rsocket.c (credits, half-buffer
//! publication, send-buffer ring); the code is this crate's.

use super::wire::{self, ConnData, RsSge};
use crate::ffi::cma::*;
use crate::ffi::*;
use crate::rdmacm::ids::qp_to_err;
use crate::rdmacm::{channel, id};
use std::ffi::{c_int, c_void};
use std::ptr::null_mut;

// States (rsocket.c's `enum rs_state`).
pub const INIT: u32 = 0;
pub const BOUND: u32 = 0x1;
pub const LISTENING: u32 = 0x2;
pub const OPENING: u32 = 0x4;
pub const RESOLVING_ADDR: u32 = OPENING | 0x10;
pub const RESOLVING_ROUTE: u32 = OPENING | 0x20;
pub const CONNECTING: u32 = OPENING | 0x40;
pub const CONNECTED: u32 = 0x100;
pub const WRITABLE: u32 = 0x200;
pub const READABLE: u32 = 0x400;
pub const CONNECT_RDWR: u32 = CONNECTED | READABLE | WRITABLE;
pub const CONNECT_ERROR: u32 = 0x800;
pub const DISCONNECTED: u32 = 0x1000;
pub const ERROR: u32 = 0x2000;

// CM event types.
const EV_ADDR_RESOLVED: u32 = rdma_cm_event_type_RDMA_CM_EVENT_ADDR_RESOLVED;
const EV_ADDR_ERROR: u32 = rdma_cm_event_type_RDMA_CM_EVENT_ADDR_ERROR;
const EV_ROUTE_RESOLVED: u32 = rdma_cm_event_type_RDMA_CM_EVENT_ROUTE_RESOLVED;
const EV_ROUTE_ERROR: u32 = rdma_cm_event_type_RDMA_CM_EVENT_ROUTE_ERROR;
const EV_CONNECT_ERROR: u32 = rdma_cm_event_type_RDMA_CM_EVENT_CONNECT_ERROR;
const EV_UNREACHABLE: u32 = rdma_cm_event_type_RDMA_CM_EVENT_UNREACHABLE;
const EV_REJECTED: u32 = rdma_cm_event_type_RDMA_CM_EVENT_REJECTED;
const EV_ESTABLISHED: u32 = rdma_cm_event_type_RDMA_CM_EVENT_ESTABLISHED;
const EV_DISCONNECTED: u32 = rdma_cm_event_type_RDMA_CM_EVENT_DISCONNECTED;

/// Defaults of rsocket.c (`def_*`).
const DEF_INLINE: u32 = 64;
const DEF_QSIZE: u16 = 384;
const DEF_MEM: u32 = 1 << 17;

/// A zeroed, page-aligned buffer that never moves (registered memory).
pub struct Buf {
    ptr: *mut u8,
    len: usize,
}

impl Buf {
    pub fn new(len: usize) -> Result<Buf, c_int> {
        let len = len.max(1).div_ceil(4096) * 4096;
        let layout = std::alloc::Layout::from_size_align(len, 4096).map_err(|_| libc::ENOMEM)?;
        // SAFETY: a non-zero size.
        let ptr = unsafe { std::alloc::alloc_zeroed(layout) };
        if ptr.is_null() {
            return Err(libc::ENOMEM);
        }
        Ok(Buf { ptr, len })
    }
    pub fn ptr(&self) -> *mut u8 {
        self.ptr
    }
}

impl Drop for Buf {
    fn drop(&mut self) {
        // SAFETY: allocated by new with this layout.
        unsafe { std::alloc::dealloc(self.ptr, std::alloc::Layout::from_size_align_unchecked(self.len, 4096)) };
    }
}

pub struct Stream {
    pub id: *mut rdma_cm_id,
    pub ch: *mut rdma_event_channel,
    pub fd: c_int,
    pub state: u32,
    pub fd_flags: c_int,
    pub err: c_int,
    pub so_opts: u64,
    pub tcp_opts: u64,
    pub ipv6_opts: u64,
    pub keepalive_time: u32,
    pub(super) swap_sgl: bool,
    pub sq_size: u16,
    pub rq_size: u16,
    pub sq_inline: u32,
    pub sbuf_size: u32,
    pub rbuf_size: u32,
    pub target_iomap_size: u16,
    ctrl_max_seqno: u32,
    ctrl_seqno: u32,
    pub(super) sseq_no: u16,
    sseq_comp: u16,
    rseq_no: u16,
    rseq_comp: u16,
    remote_sge: u32,
    remote_sgl: RsSge,
    target_sge: usize,
    cq_ch: *mut ibv_comp_channel,
    cq: *mut ibv_cq,
    pub cq_armed: bool,
    /// Completions and events taken so far: a change other waiters of the
    /// socket are woken for (`super::wake`).
    pub progress: u64,
    sbuf: Option<Buf>,
    smr: *mut ibv_mr,
    rbuf: Option<Buf>,
    rmr: *mut ibv_mr,
    tbuf: Option<Buf>,
    tmr: *mut ibv_mr,
    rbuf_bytes_avail: u32,
    /// Bytes of rbuf the peer was offered and has not yet written (the
    /// first half at connect, a half with each credit SGL): more in
    /// `OP_DATA` messages is a protocol violation.
    rbuf_granted: u32,
    rbuf_free_offset: u32,
    rbuf_offset: u32,
    pub(super) sbuf_bytes_avail: u32,
    /// `ssgl[0].addr`: where the next copied send starts in sbuf.
    ssgl_addr: u64,
    pub(super) sqe_avail: i32,
    rmsg: Vec<(u32, u32)>,
    rmsg_head: usize,
    rmsg_tail: usize,
    /// The peer's iomap area (entries in `length`).
    pub(super) remote_iomap: RsSge,
    /// Buffers mapped with `riomap`.
    pub(super) iomap: super::maps::Maps,
    /// Where `rconnect` goes (kept across non-blocking steps).
    pub dst: libc::sockaddr_storage,
}

// SAFETY: the raw pointers are this socket's own verbs/CM objects, used only
// under the socket's mutex.
unsafe impl Send for Stream {}

fn errno() -> c_int {
    crate::errno::last()
}

impl Stream {
    /// A new socket: a CM id (RDMA_PS_TCP) on its own event channel, whose
    /// fd (non-blocking: waits are polls) is the socket's number.
    pub fn new(family: c_int, inherit: Option<&Stream>) -> Result<Stream, c_int> {
        // SAFETY: plain constructor.
        let ch = unsafe { channel::uroce_cm_rdma_create_event_channel() };
        if ch.is_null() {
            return Err(errno());
        }
        let mut idp: *mut rdma_cm_id = null_mut();
        // SAFETY: our channel, an out pointer.
        if unsafe { id::uroce_cm_rdma_create_id(ch, &mut idp, null_mut(), rdma_port_space_RDMA_PS_TCP) } != 0 {
            let e = errno();
            // SAFETY: the channel just made, no id on it, read by no one.
            unsafe { channel::destroy(ch, true) };
            return Err(e);
        }
        // SAFETY: a live id; as rsocket(): the family of the id's source.
        unsafe { (*idp).route.addr.__bindgen_anon_1.src_addr.sa_family = family as u16 };
        // SAFETY: the channel's fd.
        let fd = unsafe { (*ch).fd };
        set_nonblock(fd);
        let mut s = Stream::blank(idp, ch, fd);
        if let Some(p) = inherit {
            s.sbuf_size = p.sbuf_size;
            s.rbuf_size = p.rbuf_size;
            s.sq_inline = p.sq_inline;
            s.sq_size = p.sq_size;
            s.rq_size = p.rq_size;
            s.target_iomap_size = p.target_iomap_size;
        }
        Ok(s)
    }

    /// The socket of an accepted request: its id (moved to `ch`), the
    /// listener's sizes (rsockets inherits them).
    pub fn adopt(id: *mut rdma_cm_id, ch: *mut rdma_event_channel, l: &Stream) -> Stream {
        // SAFETY: our new channel.
        let fd = unsafe { (*ch).fd };
        set_nonblock(fd);
        let mut s = Stream::blank(id, ch, fd);
        s.sbuf_size = l.sbuf_size;
        s.rbuf_size = l.rbuf_size;
        s.sq_inline = l.sq_inline;
        s.sq_size = l.sq_size;
        s.rq_size = l.rq_size;
        s.target_iomap_size = l.target_iomap_size;
        s
    }

    fn blank(id: *mut rdma_cm_id, ch: *mut rdma_event_channel, fd: c_int) -> Stream {
        Stream {
            id,
            ch,
            fd,
            state: INIT,
            fd_flags: 0,
            err: 0,
            so_opts: 0,
            tcp_opts: 0,
            ipv6_opts: 0,
            keepalive_time: 0,
            swap_sgl: false,
            sq_size: DEF_QSIZE,
            rq_size: DEF_QSIZE,
            sq_inline: DEF_INLINE,
            sbuf_size: DEF_MEM,
            rbuf_size: DEF_MEM,
            target_iomap_size: 0,
            ctrl_max_seqno: wire::QP_CTRL_SIZE,
            ctrl_seqno: 0,
            sseq_no: 0,
            sseq_comp: 0,
            rseq_no: 0,
            rseq_comp: 0,
            remote_sge: 0,
            remote_sgl: RsSge::default(),
            target_sge: 0,
            cq_ch: null_mut(),
            cq: null_mut(),
            cq_armed: false,
            progress: 0,
            sbuf: None,
            smr: null_mut(),
            rbuf: None,
            rmr: null_mut(),
            tbuf: None,
            tmr: null_mut(),
            rbuf_bytes_avail: 0,
            rbuf_granted: 0,
            rbuf_free_offset: 0,
            rbuf_offset: 0,
            sbuf_bytes_avail: 0,
            ssgl_addr: 0,
            sqe_avail: 0,
            rmsg: Vec::new(),
            rmsg_head: 0,
            rmsg_tail: 0,
            remote_iomap: RsSge::default(),
            iomap: super::maps::Maps::default(),
            // SAFETY: plain old data.
            dst: unsafe { std::mem::zeroed() },
        }
    }

    pub fn has_bufs(&self) -> bool {
        self.rbuf.is_some()
    }

    pub fn comp_fd(&self) -> Option<c_int> {
        // SAFETY: our live comp channel.
        (!self.cq_ch.is_null()).then(|| unsafe { (*self.cq_ch).fd })
    }

    pub(super) fn qp(&self) -> *mut ibv_qp {
        // SAFETY: our live id.
        unsafe { (*self.id).qp }
    }

    pub(super) fn target(&self, i: usize) -> *mut RsSge {
        let t = self.tbuf.as_ref().map_or(null_mut(), |b| b.ptr()) as *mut RsSge;
        // SAFETY: i < SGL_SIZE, inside the target buffer.
        unsafe { t.add(i) }
    }

    /// A target SGL entry (the peer writes them: read fresh each time).
    pub(super) fn tget(&self, i: usize) -> RsSge {
        // SAFETY: our registered target list; the peer's RDMA writes land
        // there under the engine, hence the volatile read.
        unsafe { std::ptr::read_volatile(self.target(i)) }
    }

    fn tset(&self, i: usize, v: RsSge) {
        // SAFETY: as tget.
        unsafe { std::ptr::write_volatile(self.target(i), v) }
    }

    // ---- connection setup ------------------------------------------------

    /// `rs_create_ep`: CQ with its channel (armed), RC QP, buffers, receives.
    pub fn create_ep(&mut self) -> Result<(), c_int> {
        self.sq_size = self.sq_size.clamp(wire::QP_MIN_SIZE, wire::QP_MAX_SIZE.min(16384));
        self.rq_size = self.rq_size.clamp(wire::QP_MIN_SIZE, wire::QP_MAX_SIZE.min(16384));
        // SAFETY: our live id, attached to a device by now.
        let ctx = unsafe { (*self.id).verbs };
        if ctx.is_null() {
            return Err(libc::EINVAL);
        }
        // SAFETY: the id's context.
        let cch = unsafe { crate::objects::ibv_create_comp_channel(ctx) };
        if cch.is_null() {
            return Err(errno());
        }
        self.cq_ch = cch;
        // SAFETY: the context and its channel.
        set_nonblock(unsafe { (*cch).fd });
        let n = self.sq_size as c_int + self.rq_size as c_int;
        // SAFETY: as above.
        let cq = unsafe { crate::objects::ibv_create_cq(ctx, n, self.id as *mut c_void, cch, 0) };
        if cq.is_null() {
            return Err(errno());
        }
        self.cq = cq;
        // SAFETY: our id: rsocket.c keeps its CQ in the id.
        unsafe {
            (*self.id).recv_cq_channel = cch;
            (*self.id).send_cq_channel = cch;
            (*self.id).recv_cq = cq;
            (*self.id).send_cq = cq;
        }
        self.arm();
        // SAFETY: plain old data.
        let mut attr: ibv_qp_init_attr = unsafe { std::mem::zeroed() };
        attr.send_cq = cq;
        attr.recv_cq = cq;
        attr.qp_type = ibv_qp_type_IBV_QPT_RC;
        attr.sq_sig_all = 1;
        attr.cap.max_send_wr = self.sq_size as u32;
        attr.cap.max_recv_wr = self.rq_size as u32;
        attr.cap.max_send_sge = 2;
        attr.cap.max_recv_sge = 1;
        attr.cap.max_inline_data = self.sq_inline;
        // SAFETY: our id and attributes.
        if unsafe { id::uroce_cm_rdma_create_qp(self.id, null_mut(), &mut attr) } != 0 {
            return Err(errno());
        }
        self.sq_inline = attr.cap.max_inline_data;
        self.init_bufs()?;
        for _ in 0..self.rq_size {
            self.post_recv()?;
        }
        Ok(())
    }

    fn reg(&self, b: &Buf, len: u32, access: u32) -> Result<*mut ibv_mr, c_int> {
        // SAFETY: the id's PD; a buffer that lives as long as this socket.
        let mr =
            unsafe { crate::objects::ibv_reg_mr((*self.id).pd, b.ptr() as *mut c_void, len as usize, access as c_int) };
        if mr.is_null() {
            Err(errno())
        } else {
            Ok(mr)
        }
    }

    /// `rs_init_bufs`.
    fn init_bufs(&mut self) -> Result<(), c_int> {
        self.rmsg = vec![(0, 0); self.rq_size as usize + 1];
        let mut sbuf_total = self.sbuf_size;
        if self.sq_inline < wire::MAX_CTRL_MSG {
            sbuf_total += wire::MAX_CTRL_MSG * wire::QP_CTRL_SIZE;
        }
        let lw = ibv_access_flags_IBV_ACCESS_LOCAL_WRITE;
        let rw = lw | ibv_access_flags_IBV_ACCESS_REMOTE_WRITE;
        let sb = Buf::new(sbuf_total as usize)?;
        self.smr = self.reg(&sb, sbuf_total, lw)?;
        self.sbuf = Some(sb);
        let tlen = std::mem::size_of::<RsSge>() as u32 * wire::SGL_SIZE
            + wire::IOMAP_LEN as u32 * self.target_iomap_size as u32;
        let tb = Buf::new(tlen as usize)?;
        self.tmr = self.reg(&tb, tlen, rw)?;
        self.tbuf = Some(tb);
        let rb = Buf::new(self.rbuf_size as usize)?;
        self.rmr = self.reg(&rb, self.rbuf_size, rw)?;
        self.rbuf = Some(rb);
        self.ssgl_addr = self.sbase();
        self.sbuf_bytes_avail = self.sbuf_size;
        self.rbuf_free_offset = self.rbuf_size >> 1;
        self.rbuf_bytes_avail = self.rbuf_size >> 1;
        self.rbuf_granted = self.rbuf_size >> 1;
        self.sqe_avail = self.sq_size as i32 - self.ctrl_max_seqno as i32;
        self.rseq_comp = self.rq_size >> 1;
        Ok(())
    }

    fn sbase(&self) -> u64 {
        self.sbuf.as_ref().map_or(0, |b| b.ptr() as u64)
    }
    fn rbase(&self) -> *mut u8 {
        self.rbuf.as_ref().map_or(null_mut(), |b| b.ptr())
    }

    fn post_recv(&self) -> Result<(), c_int> {
        // SAFETY: plain old data.
        let mut wr: ibv_recv_wr = unsafe { std::mem::zeroed() };
        wr.wr_id = wire::WR_ID_RECV;
        let mut bad = null_mut();
        // SAFETY: our QP; a WR with no SGE.
        match unsafe { crate::datapath::post_recv(self.qp(), &mut wr, &mut bad) } {
            0 => Ok(()),
            e => Err(e),
        }
    }

    /// `rs_format_conn_data`.
    pub fn conn_data(&self) -> ConnData {
        // SAFETY: registered MRs of ours.
        let (tkey, rkey) = unsafe { ((*self.tmr).rkey, (*self.rmr).rkey) };
        ConnData {
            version: wire::VERSION,
            flags: wire::FLAG_IOMAP | if cfg!(target_endian = "big") { wire::FLAG_NET } else { 0 },
            credits: self.rq_size,
            target_iomap_size: wire::value_to_scale(self.target_iomap_size as u32, 8) as u8,
            target_sgl: RsSge { addr: self.target(0) as u64, key: tkey, length: wire::SGL_SIZE },
            data_buf: RsSge { addr: self.rbase() as u64, key: rkey, length: self.rbuf_size >> 1 },
        }
    }

    /// `rs_save_conn_data`.
    pub fn save_conn_data(&mut self, c: &ConnData) {
        self.remote_sgl = c.target_sgl;
        self.remote_sge = 1;
        let net = cfg!(target_endian = "big");
        self.swap_sgl = net != (c.flags & wire::FLAG_NET != 0);
        self.tset(0, c.data_buf);
        self.sseq_comp = c.credits;
        if c.flags & wire::FLAG_IOMAP != 0 {
            let entries = wire::scale_to_value(c.target_iomap_size as u32, 8);
            self.remote_iomap = RsSge {
                addr: c.target_sgl.addr.wrapping_add(std::mem::size_of::<RsSge>() as u64 * c.target_sgl.length as u64),
                key: c.target_sgl.key,
                length: entries,
            };
            self.iomap.remote = vec![None; entries as usize];
        }
    }

    /// Reads the next CM event of the socket's channel without waiting:
    /// (type, status, private data).
    pub fn next_event(&self) -> Option<(u32, c_int, Vec<u8>, *mut rdma_cm_id, rdma_conn_param)> {
        // The channel's EAGAIN is ours, not the caller's: errno stays as it
        // was (see `api::recv_with`).
        let saved = errno();
        // SAFETY: our channel; its fd is non-blocking.
        let Ok(ev) = (unsafe { channel::get(self.ch) }) else {
            crate::errno::set_errno(saved);
            return None;
        };
        // SAFETY: an event just read; acked below.
        unsafe {
            let e = &(*ev).ev;
            let conn = *e.param.conn.as_ref();
            let data = if conn.private_data.is_null() {
                Vec::new()
            } else {
                std::slice::from_raw_parts(conn.private_data as *const u8, conn.private_data_len as usize).to_vec()
            };
            let r = (e.event, e.status, data, e.id, conn);
            channel::uroce_cm_rdma_ack_cm_event(ev as *mut rdma_cm_event);
            Some(r)
        }
    }

    /// One step of `rs_do_connect` per event available (none waited for):
    /// Ok when connected, Err(EINPROGRESS) while opening, another errno on
    /// failure (state CONNECT_ERROR, `err` set).
    pub fn drive_connect(&mut self) -> Result<(), c_int> {
        match self.state {
            INIT | BOUND => {
                let dst = &mut self.dst as *mut _ as *mut libc::sockaddr;
                // SAFETY: our id; the saved destination.
                if unsafe { id::uroce_cm_rdma_resolve_addr(self.id, null_mut(), dst as *mut _, 2000) } != 0 {
                    return self.connect_failed(errno());
                }
                self.state = RESOLVING_ADDR;
            }
            s if s & OPENING != 0 => {}
            s if s & CONNECTED != 0 => return Ok(()),
            CONNECT_ERROR | DISCONNECTED | ERROR => return Err(libc::ENOTCONN),
            _ => return Err(libc::EINVAL),
        }
        while let Some((kind, status, data, _, _)) = self.next_event() {
            match (self.state, kind) {
                (RESOLVING_ADDR, EV_ADDR_RESOLVED) if status == 0 => {
                    // SAFETY: our id.
                    if unsafe { id::uroce_cm_rdma_resolve_route(self.id, 2000) } != 0 {
                        return self.connect_failed(errno());
                    }
                    self.state = RESOLVING_ROUTE;
                }
                (RESOLVING_ROUTE, EV_ROUTE_RESOLVED) if status == 0 => {
                    if let Err(e) = self.create_ep() {
                        return self.connect_failed(e);
                    }
                    let cd = self.conn_data().encode();
                    // SAFETY: plain old data.
                    let mut p: rdma_conn_param = unsafe { std::mem::zeroed() };
                    p.private_data = cd.as_ptr() as *const c_void;
                    p.private_data_len = cd.len() as u8;
                    p.flow_control = 1;
                    p.retry_count = 7;
                    p.rnr_retry_count = 7;
                    p.responder_resources = 0xFF;
                    p.initiator_depth = 0xFF;
                    // SAFETY: our id; the param and its data live across the call.
                    if unsafe { id::uroce_cm_rdma_connect(self.id, &mut p) } != 0 {
                        return self.connect_failed(errno());
                    }
                    self.state = CONNECTING;
                }
                (CONNECTING, EV_ESTABLISHED) if status == 0 => match ConnData::decode(&data) {
                    Some(c) if c.usable() => {
                        self.save_conn_data(&c);
                        self.state = CONNECT_RDWR;
                        return Ok(());
                    }
                    _ => return self.connect_failed(libc::EOPNOTSUPP),
                },
                (_, EV_REJECTED) => return self.connect_failed(libc::ECONNREFUSED),
                (
                    _,
                    EV_ADDR_ERROR | EV_ROUTE_ERROR | EV_CONNECT_ERROR | EV_UNREACHABLE | EV_ADDR_RESOLVED
                    | EV_ROUTE_RESOLVED | EV_ESTABLISHED,
                ) => {
                    // As ucma_complete: the status as an errno.
                    let e = match status {
                        0 => libc::EINVAL,
                        s if s < 0 => -s,
                        s => s,
                    };
                    return self.connect_failed(e);
                }
                _ => {}
            }
        }
        Err(libc::EINPROGRESS)
    }

    fn connect_failed(&mut self, e: c_int) -> Result<(), c_int> {
        self.state = CONNECT_ERROR;
        self.err = e;
        Err(e)
    }

    /// Events on a connected socket's channel: DISCONNECTED ends it (the
    /// peer went away without a disconnect message), but only after what
    /// the CQ holds: the peer disconnects once its last sends were
    /// acknowledged, so their completions (its data, its in-band
    /// DISCONNECT) are in our CQ, and may have come after this call's
    /// `poll_cq` looked (seen: the progress thread, woken by that data,
    /// preempted this thread between the two, and rstream -T a saw POLLHUP
    /// with 64 KiB still to read, 1 run in 10 beside two busy loops).
    pub fn drain_cm(&mut self) {
        while let Some((kind, ..)) = self.next_event() {
            self.progress += 1;
            if kind == EV_DISCONNECTED && self.state & CONNECTED != 0 {
                self.poll_cq();
                if self.state & CONNECTED != 0 {
                    self.state = DISCONNECTED;
                }
            }
        }
    }

    // ---- completions and credits -------------------------------------------

    pub fn arm(&mut self) {
        if !self.cq.is_null() && !self.cq_armed {
            // SAFETY: our CQ.
            unsafe { crate::datapath::req_notify_cq(self.cq, 0) };
            self.cq_armed = true;
        }
    }

    /// Takes the CQ event the comp channel holds (it fired): re-arm later.
    pub fn take_cq_event(&mut self) {
        if self.cq_ch.is_null() {
            return;
        }
        let (mut cq, mut ctx) = (null_mut(), null_mut());
        let saved = errno();
        // SAFETY: our non-blocking channel and out pointers.
        while unsafe { crate::objects::ibv_get_cq_event(self.cq_ch, &mut cq, &mut ctx) } == 0 {
            // SAFETY: the CQ the event was for (ours).
            unsafe { crate::objects::ibv_ack_cq_events(cq, 1) };
            self.cq_armed = false;
            self.progress += 1;
        }
        // The loop ends on EAGAIN: not the caller's error.
        crate::errno::set_errno(saved);
    }

    pub(super) fn post_write_msg(
        &mut self,
        sgl: &mut [ibv_sge],
        m: u32,
        flags: u32,
        addr: u64,
        rkey: u32,
    ) -> Result<(), c_int> {
        self.post(sgl, m, flags, addr, rkey, true)
    }

    /// An RDMA WRITE (WITH IMM `m` when `imm`), `m` also its wr_id.
    pub(super) fn post(
        &mut self,
        sgl: &mut [ibv_sge],
        m: u32,
        flags: u32,
        addr: u64,
        rkey: u32,
        imm: bool,
    ) -> Result<(), c_int> {
        // SAFETY: plain old data.
        let mut wr: ibv_send_wr = unsafe { std::mem::zeroed() };
        wr.wr_id = m as u64;
        wr.sg_list = if sgl.is_empty() { null_mut() } else { sgl.as_mut_ptr() };
        wr.num_sge = sgl.len() as c_int;
        wr.opcode = if imm { ibv_wr_opcode_IBV_WR_RDMA_WRITE_WITH_IMM } else { ibv_wr_opcode_IBV_WR_RDMA_WRITE };
        wr.send_flags = flags;
        wr.__bindgen_anon_1.imm_data = m.to_be();
        wr.wr.rdma.remote_addr = addr;
        wr.wr.rdma.rkey = rkey;
        let mut bad = null_mut();
        // SAFETY: our QP; the WR and its SGEs live across the call (inline
        // data is copied by the post).
        match unsafe { crate::datapath::post_send(self.qp(), &mut wr, &mut bad) } {
            0 => Ok(()),
            e => Err(e),
        }
    }

    fn post_msg(&mut self, m: u32) -> Result<(), c_int> {
        self.post_write_msg(&mut [], m, 0, 0, 0)
    }

    fn ctrl_avail(&self) -> bool {
        self.ctrl_seqno != self.ctrl_max_seqno
    }

    /// `rs_send_credits`.
    fn send_credits(&mut self) {
        self.ctrl_seqno = self.ctrl_seqno.wrapping_add(1);
        self.rseq_comp = self.rseq_no.wrapping_add(self.rq_size >> 1);
        let m = wire::msg(wire::OP_SGL, self.rseq_no as u32 + self.rq_size as u32);
        if self.rbuf_bytes_avail >= self.rbuf_size >> 1 {
            // SAFETY: our MR.
            let rkey = unsafe { (*self.rmr).rkey };
            let mut sge = RsSge {
                addr: self.rbase() as u64 + self.rbuf_free_offset as u64,
                key: rkey,
                length: self.rbuf_size >> 1,
            };
            if self.swap_sgl {
                sge = sge.swapped();
            }
            let raddr = self.remote_sgl.addr + self.remote_sge as u64 * std::mem::size_of::<RsSge>() as u64;
            let rk = self.remote_sgl.key;
            let r = if self.sq_inline >= wire::MAX_CTRL_MSG {
                let mut ib = ibv_sge { addr: &sge as *const RsSge as u64, length: 16, lkey: 0 };
                self.post_write_msg(std::slice::from_mut(&mut ib), m, ibv_send_flags_IBV_SEND_INLINE, raddr, rk)
            } else {
                let slot = (self.ctrl_seqno & (wire::QP_CTRL_SIZE - 1)) as u64;
                let at = self.sbase() + self.sbuf_size as u64 + wire::MAX_CTRL_MSG as u64 * slot;
                // SAFETY: the control area after sbuf (allocated when inline < 16).
                unsafe { std::ptr::write_unaligned(at as *mut RsSge, sge) };
                // SAFETY: our MR.
                let mut ib = ibv_sge { addr: at, length: 16, lkey: unsafe { (*self.smr).lkey } };
                self.post_write_msg(std::slice::from_mut(&mut ib), m, 0, raddr, rk)
            };
            if r.is_err() {
                self.set_error(libc::EIO);
            }
            self.rbuf_bytes_avail -= self.rbuf_size >> 1;
            self.rbuf_granted = self.rbuf_granted.saturating_add(self.rbuf_size >> 1);
            self.rbuf_free_offset += self.rbuf_size >> 1;
            if self.rbuf_free_offset >= self.rbuf_size {
                self.rbuf_free_offset = 0;
            }
            self.remote_sge += 1;
            if self.remote_sge >= self.remote_sgl.length {
                self.remote_sge = 0;
            }
        } else if self.post_msg(m).is_err() {
            self.set_error(libc::EIO);
        }
    }

    fn give_credits(&self) -> bool {
        (self.rbuf_bytes_avail >= self.rbuf_size >> 1 || (self.rseq_no.wrapping_sub(self.rseq_comp) as i16) >= 0)
            && self.ctrl_avail()
            && self.state & CONNECTED != 0
    }

    pub fn update_credits(&mut self) {
        if self.give_credits() {
            self.send_credits();
        }
    }

    fn set_error(&mut self, e: c_int) {
        if self.state & CONNECTED != 0 {
            self.state = ERROR;
            self.err = e;
        }
    }

    /// A message no rsockets peer sends (librdmacm's rsocket.c trusts
    /// them, and reads past its buffer on a bad length): the connection
    /// ends with EPROTO and its QP goes to the error state, so nothing
    /// more the peer sends lands in our buffers.
    fn violation(&mut self) {
        if self.state & CONNECTED != 0 {
            self.set_error(libc::EPROTO);
            self.qp_to_err();
        }
    }

    /// An `OP_DATA` message of `len` bytes: queued when it fits one target
    /// entry, the peer had the bytes (credits) and a message slot, else a
    /// violation.
    fn queue_data(&mut self, len: u32) {
        let next = (self.rmsg_tail + 1) % self.rmsg.len().max(1);
        // (One message fills at most one target entry: half of rbuf.)
        if len > self.rbuf_size >> 1 || len > self.rbuf_granted || next == self.rmsg_head || self.rmsg.is_empty() {
            return self.violation();
        }
        self.rbuf_granted -= len;
        self.rmsg[self.rmsg_tail] = (wire::OP_DATA, len);
        self.rmsg_tail = next;
    }

    /// `rs_poll_cq`: every completion, then receives re-posted.
    fn poll_cq(&mut self) {
        if self.cq.is_null() {
            return;
        }
        let mut rcnt = 0;
        loop {
            // SAFETY: plain old data.
            let mut wc: ibv_wc = unsafe { std::mem::zeroed() };
            // SAFETY: our CQ, one entry.
            if unsafe { crate::datapath::poll_cq(self.cq, 1, &mut wc) } <= 0 {
                break;
            }
            self.progress += 1;
            if wc.wr_id & wire::WR_ID_RECV != 0 {
                if wc.status != ibv_wc_status_IBV_WC_SUCCESS {
                    // Not re-posted (a failed QP would only flush it
                    // again). A failure other than a flush (a SEND too long
                    // for our empty receives, say) ends the connection.
                    if wc.status != ibv_wc_status_IBV_WC_WR_FLUSH_ERR {
                        self.set_error(libc::EIO);
                    }
                    continue;
                }
                rcnt += 1;
                if wc.wc_flags & ibv_wc_flags_IBV_WC_WITH_IMM == 0 {
                    continue;
                }
                // SAFETY: WITH_IMM says the union holds the immediate.
                let m = u32::from_be(unsafe { wc.__bindgen_anon_1.imm_data });
                match wire::msg_op(m) {
                    wire::OP_SGL => self.sseq_comp = wire::msg_data(m) as u16,
                    wire::OP_IOMAP_SGL | wire::OP_WRITE => {}
                    wire::OP_CTRL => match wire::msg_data(m) {
                        wire::CTRL_DISCONNECT => {
                            self.state = DISCONNECTED;
                            return;
                        }
                        wire::CTRL_SHUTDOWN => {
                            if self.state & WRITABLE != 0 {
                                self.state &= !READABLE;
                            } else {
                                self.state = DISCONNECTED;
                                return;
                            }
                        }
                        // Keepalives carry nothing; unknown controls are ignored.
                        wire::CTRL_KEEPALIVE => {}
                        _ => {}
                    },
                    // More bytes than were offered, more messages than
                    // credits, or a reserved op (1, 3, 5).
                    wire::OP_DATA => self.queue_data(wire::msg_data(m)),
                    _ => self.violation(),
                }
            } else {
                let m = wc.wr_id as u32;
                match wire::msg_op(m) {
                    wire::OP_SGL => self.ctrl_max_seqno = self.ctrl_max_seqno.wrapping_add(1),
                    wire::OP_CTRL => {
                        self.ctrl_max_seqno = self.ctrl_max_seqno.wrapping_add(1);
                        if wire::msg_data(m) == wire::CTRL_DISCONNECT {
                            self.state = DISCONNECTED;
                        }
                    }
                    wire::OP_IOMAP_SGL => {
                        self.sqe_avail += 1;
                        self.sbuf_bytes_avail += 24;
                    }
                    _ => {
                        self.sqe_avail += 1;
                        self.sbuf_bytes_avail += wire::msg_data(m);
                    }
                }
                if wc.status != ibv_wc_status_IBV_WC_SUCCESS {
                    self.set_error(libc::EIO);
                }
            }
        }
        if self.state & CONNECTED != 0 {
            for _ in 0..rcnt {
                if let Err(e) = self.post_recv() {
                    self.set_error(e);
                    break;
                }
            }
        }
    }

    /// One round of `rs_process_cq` without waiting.
    pub fn process(&mut self) {
        self.update_credits();
        self.poll_cq();
        self.update_credits();
        if self.state & (CONNECTED | DISCONNECTED | ERROR) != 0 {
            self.drain_cm();
        }
    }

    // ---- tests (rsocket.c's rs_* predicates) -------------------------------

    pub fn can_send(&self) -> bool {
        self.has_bufs()
            && self.sqe_avail > 0
            && self.sbuf_bytes_avail >= wire::SNDLOWAT
            && self.sseq_no != self.sseq_comp
            && self.tget(self.target_sge).length != 0
    }
    pub fn conn_can_send(&self) -> bool {
        self.can_send() || self.state & WRITABLE == 0
    }
    pub fn have_rdata(&self) -> bool {
        self.rmsg_head != self.rmsg_tail
    }
    pub fn conn_have_rdata(&self) -> bool {
        self.have_rdata() || self.state & READABLE == 0
    }
    pub fn conn_can_send_ctrl(&self) -> bool {
        self.ctrl_avail() || self.state & CONNECTED == 0
    }
    pub fn all_sends_done(&self) -> bool {
        (self.ctrl_max_seqno.wrapping_sub(self.ctrl_seqno) as i32 + self.sqe_avail == self.sq_size as i32)
            || self.state & CONNECTED == 0
    }

    // ---- data ---------------------------------------------------------------

    fn sbuf_left(&self) -> u32 {
        (self.sbase() + self.sbuf_size as u64 - self.ssgl_addr) as u32
    }

    /// One write of at most what credits, buffers and the target allow,
    /// taken from `src` (whose total is `left`); the bytes written.
    /// `rs_write_data` with rsend's three copy cases.
    pub fn write_some(
        &mut self,
        src: &mut dyn FnMut(*mut u8, usize),
        left: usize,
        olen: &mut u32,
    ) -> Result<u32, c_int> {
        let mut xfer = next_transfer(olen, left);
        xfer = xfer.min(self.sbuf_bytes_avail).min(self.tget(self.target_sge).length);
        let (mut sgl, n) = self.ring_copy(src, xfer);
        let flags = if xfer <= self.sq_inline { ibv_send_flags_IBV_SEND_INLINE } else { 0 };
        // rs_write_data: the target entry is advanced before the post.
        self.sseq_no = self.sseq_no.wrapping_add(1);
        self.sqe_avail -= 1;
        self.sbuf_bytes_avail -= xfer;
        let mut t = self.tget(self.target_sge);
        let (addr, rkey) = (t.addr, t.key);
        // (The peer wrote the entry: its address may wrap.)
        t.addr = t.addr.wrapping_add(xfer as u64);
        t.length -= xfer;
        self.tset(self.target_sge, t);
        if t.length == 0 {
            self.target_sge = (self.target_sge + 1) % wire::SGL_SIZE as usize;
        }
        self.post_write_msg(&mut sgl[..n], wire::msg(wire::OP_DATA, xfer), flags, addr, rkey)?;
        Ok(xfer)
    }

    /// Copies `xfer` bytes from `src` into the send ring (rsend's copy
    /// cases): the SGEs (one, or two when the ring wraps) and their count.
    pub(super) fn ring_copy(&mut self, src: &mut dyn FnMut(*mut u8, usize), xfer: u32) -> ([ibv_sge; 2], usize) {
        // SAFETY: our MR.
        let lkey = unsafe { (*self.smr).lkey };
        let mut sgl =
            [ibv_sge { addr: self.ssgl_addr, length: 0, lkey }, ibv_sge { addr: self.sbase(), length: 0, lkey }];
        if xfer <= self.sbuf_left() {
            src(self.ssgl_addr as *mut u8, xfer as usize);
            sgl[0].length = xfer;
            if xfer < self.sbuf_left() {
                self.ssgl_addr += xfer as u64;
            } else {
                self.ssgl_addr = self.sbase();
            }
            (sgl, 1)
        } else {
            let first = self.sbuf_left();
            src(self.ssgl_addr as *mut u8, first as usize);
            sgl[0].length = first;
            sgl[1].length = xfer - first;
            src(self.sbase() as *mut u8, (xfer - first) as usize);
            self.ssgl_addr = self.sbase() + sgl[1].length as u64;
            (sgl, 2)
        }
    }

    /// Copies received bytes to `dst` (None: MSG_PEEK leaves them queued);
    /// the count.
    pub fn read_some(&mut self, buf: *mut u8, len: usize, peek: bool) -> usize {
        let rbase = self.rbase();
        let (mut head, mut off) = (self.rmsg_head, self.rbuf_offset);
        let mut left = len;
        let mut out = buf;
        while left > 0 && head != self.rmsg_tail {
            let avail = self.rmsg[head].1 as usize;
            let mut rsize = if left < avail {
                if !peek {
                    self.rmsg[head].1 -= left as u32;
                }
                left
            } else {
                if !peek {
                    self.rseq_no = self.rseq_no.wrapping_add(1);
                }
                head = (head + 1) % self.rmsg.len();
                avail
            };
            let end = (self.rbuf_size - off) as usize;
            if rsize > end {
                // SAFETY: `end` bytes inside rbuf; the caller's buffer has `left` bytes.
                unsafe { std::ptr::copy_nonoverlapping(rbase.add(off as usize), out, end) };
                off = 0;
                // SAFETY: as above.
                out = unsafe { out.add(end) };
                rsize -= end;
                left -= end;
                if !peek {
                    self.rbuf_bytes_avail += end as u32;
                }
            }
            // SAFETY: as above.
            unsafe { std::ptr::copy_nonoverlapping(rbase.add(off as usize), out, rsize) };
            off += rsize as u32;
            // SAFETY: as above.
            out = unsafe { out.add(rsize) };
            left -= rsize;
            if !peek {
                self.rbuf_bytes_avail += rsize as u32;
            }
        }
        if !peek {
            self.rmsg_head = head;
            self.rbuf_offset = off;
        }
        len - left
    }

    /// Sends a control message if a control slot is free (`rshutdown`).
    pub fn send_ctrl(&mut self, ctrl: u32) -> Result<(), c_int> {
        if self.state & CONNECTED != 0 && self.ctrl_avail() {
            self.ctrl_seqno = self.ctrl_seqno.wrapping_add(1);
            self.post_msg(wire::msg(wire::OP_CTRL, ctrl))?;
        }
        Ok(())
    }

    /// `ucma_shutdown` for IB/RoCE: the QP to the error state (flushes).
    pub fn qp_to_err(&mut self) {
        if !self.qp().is_null() {
            // SAFETY: our QP.
            unsafe { qp_to_err(self.qp()) };
        }
    }
}

impl Drop for Stream {
    /// `rs_free`: MRs, QP, CQ, channel, id, event channel.
    fn drop(&mut self) {
        // SAFETY: the objects this socket made, each destroyed once.
        unsafe {
            self.iomap.release_all();
            for mr in [self.smr, self.rmr, self.tmr] {
                if !mr.is_null() {
                    crate::objects::ibv_dereg_mr(mr);
                }
            }
            if !self.id.is_null() {
                if !(*self.id).qp.is_null() {
                    id::uroce_cm_rdma_destroy_qp(self.id);
                }
                (*self.id).recv_cq = null_mut();
                (*self.id).send_cq = null_mut();
                (*self.id).recv_cq_channel = null_mut();
                (*self.id).send_cq_channel = null_mut();
            }
            if !self.cq.is_null() {
                crate::objects::ibv_destroy_cq(self.cq);
            }
            if !self.cq_ch.is_null() {
                crate::objects::ibv_destroy_comp_channel(self.cq_ch);
            }
            if !self.id.is_null() {
                id::uroce_cm_rdma_destroy_id(self.id);
            }
            if !self.ch.is_null() {
                // Freed, not kept as an application's channel is: only
                // this socket (under its lock, never blocking) reads it.
                channel::destroy(self.ch, true);
            }
        }
    }
}

pub fn set_nonblock(fd: c_int) {
    // SAFETY: an fd of ours.
    unsafe {
        let fl = libc::fcntl(fd, libc::F_GETFL);
        if fl >= 0 {
            libc::fcntl(fd, libc::F_SETFL, fl | libc::O_NONBLOCK);
        }
    }
}

/// The size of a stream write's next transfer, as rsockets' `rs_send`
/// grows it: the current size `olen` (doubled for the next one, up to
/// `MAX_TRANSFER`) while more than that is `left`, else the rest.
pub(super) fn next_transfer(olen: &mut u32, left: usize) -> u32 {
    if (*olen as usize) < left {
        let x = *olen;
        if *olen < wire::MAX_TRANSFER {
            *olen <<= 1;
        }
        x
    } else {
        left as u32
    }
}
