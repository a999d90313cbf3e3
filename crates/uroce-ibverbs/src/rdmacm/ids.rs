//! Making ids and moving their QPs: an id's allocation and addresses, the
//! id of a CONNECT_REQUEST, and the QP state changes the CM makes for it
//! (librdmacm's `ucma_modify_qp_*`). Used by the calls on ids (`id.rs`) and
//! by the event thread (`dev.rs`).

use super::channel;
use super::sockaddr::{read_sockaddr, sockaddr_of};
use super::state::{Global, IdState, UId};
use crate::ffi::cma::*;
use crate::ffi::*;
use std::ffi::{c_int, c_void};
use std::net::SocketAddr;
use uroce::cm::{CmEndpoint, ConnId, ConnInfo};
use uroce::ib::{QpAttrMask, QpState};

pub(crate) fn addrs(u: *mut UId) -> *mut libc::sockaddr_storage {
    // SAFETY: route.addr starts with src (128 bytes) then dst (128 bytes).
    unsafe { std::ptr::addr_of_mut!((*u).id.route.addr) as *mut libc::sockaddr_storage }
}

pub(crate) unsafe fn set_src(u: *mut UId, a: SocketAddr) {
    // SAFETY: the id's src_addr storage; its ibaddr after both addresses.
    unsafe {
        *addrs(u) = sockaddr_of(a);
        let ib = (addrs(u) as *mut u8).add(256);
        std::ptr::copy_nonoverlapping(uroce::ib::Gid::from_ip(a.ip()).0.as_ptr(), ib, 16);
        *(ib.add(32) as *mut u16) = 0xFFFFu16.to_be();
        (*u).path.sgid.raw = uroce::ib::Gid::from_ip(a.ip()).0;
        (*u).path.pkey = 0xFFFFu16.to_be();
    }
}

pub(crate) unsafe fn set_dst(u: *mut UId, a: SocketAddr) {
    // SAFETY: as set_src.
    unsafe {
        *addrs(u).add(1) = sockaddr_of(a);
        let ib = (addrs(u) as *mut u8).add(256 + 16);
        std::ptr::copy_nonoverlapping(uroce::ib::Gid::from_ip(a.ip()).0.as_ptr(), ib, 16);
        (*u).path.dgid.raw = uroce::ib::Gid::from_ip(a.ip()).0;
    }
}

pub unsafe fn src_of(u: *mut UId) -> Option<SocketAddr> {
    // SAFETY: the id's storage.
    unsafe { read_sockaddr(addrs(u) as *const libc::sockaddr) }
}

pub unsafe fn dst_of(u: *mut UId) -> Option<SocketAddr> {
    // SAFETY: the id's storage.
    unsafe { read_sockaddr(addrs(u).add(1) as *const libc::sockaddr) }
}

pub(crate) unsafe fn alloc_id(
    g: &mut Global,
    ch: *mut rdma_event_channel,
    ctx: *mut c_void,
    ps: u32,
    qpt: u32,
) -> *mut UId {
    let sync = ch.is_null();
    let ch = if sync { channel::create() as *mut rdma_event_channel } else { ch };
    if ch.is_null() {
        return std::ptr::null_mut();
    }
    // SAFETY: plain old data; all-zero is valid.
    let mut u: Box<UId> = Box::new(unsafe { std::mem::zeroed() });
    u.id.channel = ch;
    u.id.context = ctx;
    u.id.ps = ps;
    u.id.qp_type = qpt;
    let u = Box::into_raw(u);
    let serial = g.next_serial;
    g.next_serial += 1;
    g.ids.insert(u as usize, IdState { serial, sync, ..Default::default() });
    u
}

pub(crate) unsafe fn attach_dev(g: &Global, u: *mut UId, dev: usize) {
    let d = &g.devs[dev];
    // SAFETY: a live id.
    unsafe {
        (*u).id.verbs = d.ctx as *mut ibv_context;
        (*u).id.pd = d.pd as *mut ibv_pd;
        (*u).id.port_num = 1;
    }
}

/// The id of a CONNECT_REQUEST: the listener's channel (a private one for
/// a synchronous listener), context, port space and QP type.
pub unsafe fn new_child(g: &mut Global, l: *mut UId, dev: usize, conn: ConnId, info: &ConnInfo) -> *mut UId {
    let lsync = g.ids.get(&(l as usize)).is_some_and(|s| s.sync);
    // SAFETY: the live listener.
    let (ch, ctx, ps, qpt) = unsafe { ((*l).id.channel, (*l).id.context, (*l).id.ps, (*l).id.qp_type) };
    // SAFETY: as alloc_id's contract.
    let u = unsafe { alloc_id(g, if lsync { std::ptr::null_mut() } else { ch }, ctx, ps, qpt) };
    if u.is_null() {
        return u;
    }
    // SAFETY: the new id.
    unsafe {
        attach_dev(g, u, dev);
        set_src(u, info.local);
        set_dst(u, info.remote);
        (*u).id.route.path_rec = &mut (*u).path;
        (*u).id.route.num_paths = 1;
    }
    let s = g.ids.get_mut(&(u as usize)).expect("just inserted");
    s.dev = Some(dev);
    s.conn = Some(conn);
    g.by_conn.insert((dev, conn), u as usize);
    u
}

pub(crate) unsafe fn core_qp<'a>(qp: *mut ibv_qp) -> Option<&'a uroce::verbs::QueuePair> {
    // SAFETY: every QP of this library is the first field of a UQp.
    unsafe { (*(qp as *const crate::handles::UQp)).inner.as_ref() }
}

/// INIT → RTR → RTS with the connection's values (librdmacm's
/// `ucma_modify_qp_rtr/rts`).
pub unsafe fn connect_qp(ep: &CmEndpoint, qp: *mut ibv_qp, info: &ConnInfo) -> Result<(), c_int> {
    // SAFETY: the id's QP.
    let q = unsafe { core_qp(qp) }.ok_or(libc::EINVAL)?;
    let r = ep.connect_qp(q, info).map_err(|e| e.errno.0);
    // SAFETY: as above.
    unsafe { sync_state(qp) };
    r
}

/// `qp->state` as `ibv_modify_qp` leaves it (applications read it).
pub(crate) unsafe fn sync_state(qp: *mut ibv_qp) {
    // SAFETY: one of our QPs.
    if let Some(q) = unsafe { core_qp(qp) } {
        // SAFETY: as above.
        unsafe { (*qp).state = q.state().to_raw() as _ };
    }
}

pub unsafe fn qp_to_err(qp: *mut ibv_qp) {
    // SAFETY: the id's QP.
    if let Some(q) = unsafe { core_qp(qp) } {
        let a = uroce::verbs::QpAttr { qp_state: QpState::Err, ..Default::default() };
        let _ = q.modify(&a, QpAttrMask::STATE);
        // SAFETY: as above.
        unsafe { sync_state(qp) };
    }
}
