//! `rdma_cm_id`s and the calls on them. An id is a `UId` whose first field
//! is the public `struct rdma_cm_id`; its private state (device, CM
//! connection or listener, unacked events) lives in the global state under
//! its address. Ids with no channel (`rdma_create_id(NULL, …)`,
//! `rdma_create_ep`) get a private channel and the calls that cause an
//! event wait for it, as librdmacm's synchronous mode does.

use super::channel::{self, UEvent};
use super::dev;
use super::ids::*;
use super::sockaddr::read_sockaddr;
use super::state::{EpAttr, Global, UId};
use crate::errno::set_errno;
use crate::ffi::cma::*;
use crate::ffi::*;
use std::ffi::{c_int, c_void};
use std::net::{Ipv4Addr, SocketAddr};
use uroce::cm::{AcceptParams, CmEndpoint, ConnectParams, ListenParams, PortSpace, SidrParams, RDMA_UDP_QKEY};
use uroce::ib::{QpAttrMask, QpState};

fn fail(e: c_int) -> c_int {
    set_errno(e);
    -1
}

fn ps_of(ps: u32) -> Option<PortSpace> {
    match ps {
        0x0002 => Some(PortSpace::Ipoib),
        0x0106 => Some(PortSpace::Tcp),
        0x0111 => Some(PortSpace::Udp),
        0x013F => Some(PortSpace::Ib),
        _ => None,
    }
}

/// Queues an event the library itself produces (address and route resolution).
unsafe fn local_event(g: &Global, u: *mut UId, kind: u32, status: c_int) {
    let Some(s) = g.ids.get(&(u as usize)) else { return };
    let mut ev = UEvent::new();
    ev.ev.id = u as *mut rdma_cm_id;
    ev.ev.event = kind;
    ev.ev.status = status;
    ev.owner = u as usize;
    ev.serial = s.serial;
    // SAFETY: a live id and its channel.
    unsafe { channel::push((*u).id.channel, ev) };
}

unsafe fn ack_pending(u: *mut UId) {
    // SAFETY: a live id; its pending event is ours.
    unsafe {
        let e = (*u).id.event;
        if !e.is_null() {
            (*u).id.event = std::ptr::null_mut();
            channel::uroce_cm_rdma_ack_cm_event(e);
        }
    }
}

/// For a synchronous id: waits for the event the call caused, keeps it in
/// `id->event` and maps a failure as `ucma_complete` does.
unsafe fn complete(u: *mut UId, want: u32) -> c_int {
    if !super::state::lock().ids.get(&(u as usize)).is_some_and(|s| s.sync) {
        return 0;
    }
    // SAFETY: a live synchronous id.
    unsafe {
        ack_pending(u);
        let ev = match channel::get((*u).id.channel) {
            Ok(ev) => ev,
            Err(e) => return fail(e),
        };
        (*u).id.event = ev as *mut rdma_cm_event;
        let (kind, status) = ((*ev).ev.event, (*ev).ev.status);
        if kind == want && status == 0 {
            return 0;
        }
        if kind == 8 {
            return fail(libc::ECONNREFUSED);
        }
        fail(if status < 0 {
            -status
        } else if status > 0 {
            status
        } else {
            libc::EINVAL
        })
    }
}

fn with_id<R>(id: *mut rdma_cm_id, f: impl FnOnce(&mut Global, *mut UId) -> Result<R, c_int>) -> Result<R, c_int> {
    let mut g = super::state::lock();
    if id.is_null() || !g.ids.contains_key(&(id as usize)) {
        return Err(libc::EINVAL);
    }
    f(&mut g, id as *mut UId)
}

fn rc(r: Result<(), c_int>) -> c_int {
    match r {
        Ok(()) => 0,
        Err(e) => fail(e),
    }
}

#[no_mangle]
pub unsafe extern "C" fn uroce_cm_rdma_create_id(
    ch: *mut rdma_event_channel,
    id: *mut *mut rdma_cm_id,
    context: *mut c_void,
    ps: u32,
) -> c_int {
    let qpt = match ps_of(ps) {
        Some(PortSpace::Ipoib | PortSpace::Udp) => ibv_qp_type_IBV_QPT_UD,
        Some(_) => ibv_qp_type_IBV_QPT_RC,
        None => return fail(libc::EINVAL),
    };
    // SAFETY: as rdma_create_id_ex.
    unsafe { create_id_ex(ch, id, context, ps, qpt) }
}

unsafe fn create_id_ex(
    ch: *mut rdma_event_channel,
    id: *mut *mut rdma_cm_id,
    context: *mut c_void,
    ps: u32,
    qpt: u32,
) -> c_int {
    if id.is_null() {
        return fail(libc::EINVAL);
    }
    let mut g = super::state::lock();
    // SAFETY: the caller's channel or NULL.
    let u = unsafe { alloc_id(&mut g, ch, context, ps, qpt) };
    if u.is_null() {
        return fail(libc::ENOMEM);
    }
    // SAFETY: the caller's out pointer.
    unsafe { *id = u as *mut rdma_cm_id };
    0
}

#[no_mangle]
pub unsafe extern "C" fn uroce_cm_rdma_destroy_id(id: *mut rdma_cm_id) -> c_int {
    let u = id as *mut UId;
    let sync = {
        let mut g = super::state::lock();
        let Some(s) = g.ids.get(&(u as usize)) else { return fail(libc::EINVAL) };
        let (dev, conn, listen, sync) = (s.dev, s.conn, s.listen, s.sync);
        if let Some(d) = dev {
            let ep = g.devs[d].ep.clone();
            if let Some(c) = conn {
                ep.with_cm(|cm, now| cm.destroy(now, c).ok());
                g.by_conn.remove(&(d, c));
            }
            if let Some(l) = listen {
                ep.with_cm(|cm, now| cm.unlisten(now, l).ok());
                g.by_listen.remove(&(d, l));
            }
        }
        sync
    };
    if sync {
        // SAFETY: a live id.
        unsafe { ack_pending(u) };
    }
    // The kernel's rule: wait until every event reported for the id is acked.
    let mut g = super::state::lock();
    while g.ids.get(&(u as usize)).is_some_and(|s| s.unacked > 0) {
        g = g.wait(&super::state::ACKED);
    }
    g.ids.remove(&(u as usize));
    drop(g);
    // SAFETY: no longer reachable from the state; the application gives it up.
    let b = unsafe { Box::from_raw(u) };
    if sync {
        // SAFETY: the id's private channel.
        unsafe { channel::destroy(b.id.channel, true) };
    }
    0
}

#[no_mangle]
pub unsafe extern "C" fn uroce_cm_rdma_bind_addr(id: *mut rdma_cm_id, addr: *mut libc::sockaddr) -> c_int {
    // SAFETY: the caller's sockaddr.
    let Some(a) = (unsafe { read_sockaddr(addr) }) else { return fail(libc::EAFNOSUPPORT) };
    rc(with_id(id, |g, u| {
        let s = &g.ids[&(u as usize)];
        // Bound already: a device, or a wildcard address with its port
        // (rsockets sets only the family of a new id's source address).
        // SAFETY: a live id.
        let bound = unsafe { src_of(u) }.is_some_and(|b| !b.ip().is_unspecified() || b.port() != 0);
        if s.dev.is_some() || bound {
            return Err(libc::EINVAL);
        }
        // As the kernel: an address no device has but a loopback one binds
        // to the first device (`cma_bind_loopback`); the wildcard address
        // binds no device (`id->verbs` stays NULL until an address is
        // resolved or the id listens). Unlike the kernel, the id's address
        // then becomes the device's: a uroce device is a host of its own
        // (a peer process has its own device), so 127.0.0.1 would name no
        // device a peer can reach, and a peer learns the address from
        // `rdma_get_local_addr` (libfabric binds "localhost" when the
        // application names no node, then sends its address to the peer).
        let any = a.ip().is_unspecified();
        let mut a = a;
        let d = match dev::device_for(g, if any { None } else { Some(a.ip()) }) {
            Err(libc::EADDRNOTAVAIL) if a.ip().is_loopback() => {
                let d = dev::device_for(g, None)?;
                if a.is_ipv4() == g.devs[d].ip.is_ipv4() {
                    a.set_ip(g.devs[d].ip);
                }
                d
            }
            r => r?,
        };
        if a.port() == 0 {
            // As the kernel: binding to port 0 takes an ephemeral port.
            a.set_port(g.devs[d].ep.ephemeral_port());
        }
        // SAFETY: a live id.
        unsafe {
            if !any {
                attach_dev(g, u, d);
            }
            set_src(u, a);
        }
        if !any {
            g.ids.get_mut(&(u as usize)).expect("live").dev = Some(d);
        }
        Ok(())
    }))
}

#[no_mangle]
pub unsafe extern "C" fn uroce_cm_rdma_resolve_addr(
    id: *mut rdma_cm_id,
    src: *mut libc::sockaddr,
    dst: *mut libc::sockaddr,
    _timeout_ms: c_int,
) -> c_int {
    // SAFETY: the caller's sockaddrs.
    let (s, Some(d)) = (unsafe { read_sockaddr(src) }, unsafe { read_sockaddr(dst) }) else {
        return fail(libc::EINVAL);
    };
    let r = with_id(id, |g, u| {
        let dev = match g.ids[&(u as usize)].dev {
            Some(x) => x,
            None => {
                // A source given here, else the (wildcard) address bound before.
                // SAFETY: a live id.
                let s = s.or(unsafe { src_of(u) });
                let x = dev::device_for(g, s.map(|s| s.ip()))?;
                // SAFETY: a live id.
                unsafe {
                    attach_dev(g, u, x);
                    set_src(u, SocketAddr::new(g.devs[x].ip, s.map_or(0, |s| s.port())));
                }
                g.ids.get_mut(&(u as usize)).expect("live").dev = Some(x);
                x
            }
        };
        if d.is_ipv4() != g.devs[dev].ip.is_ipv4() {
            return Err(libc::EAFNOSUPPORT);
        }
        // SAFETY: a live id.
        unsafe {
            set_dst(u, d);
            local_event(g, u, rdma_cm_event_type_RDMA_CM_EVENT_ADDR_RESOLVED, 0);
        }
        Ok(())
    });
    if let Err(e) = r {
        return fail(e);
    }
    // SAFETY: a live id.
    unsafe { complete(id as *mut UId, rdma_cm_event_type_RDMA_CM_EVENT_ADDR_RESOLVED) }
}

#[no_mangle]
pub unsafe extern "C" fn uroce_cm_rdma_resolve_route(id: *mut rdma_cm_id, _timeout_ms: c_int) -> c_int {
    let r = with_id(id, |g, u| {
        // SAFETY: a live id.
        if g.ids[&(u as usize)].dev.is_none() || unsafe { dst_of(u) }.is_none() {
            return Err(libc::EINVAL);
        }
        // SAFETY: a live id.
        unsafe {
            (*u).path.hop_limit = 64;
            (*u).path.mtu = 3;
            (*u).path.packet_life_time = 16;
            (*u).id.route.path_rec = &mut (*u).path;
            (*u).id.route.num_paths = 1;
            local_event(g, u, rdma_cm_event_type_RDMA_CM_EVENT_ROUTE_RESOLVED, 0);
        }
        Ok(())
    });
    if let Err(e) = r {
        return fail(e);
    }
    // SAFETY: a live id.
    unsafe { complete(id as *mut UId, rdma_cm_event_type_RDMA_CM_EVENT_ROUTE_RESOLVED) }
}

#[no_mangle]
pub unsafe extern "C" fn uroce_cm_rdma_listen(id: *mut rdma_cm_id, backlog: c_int) -> c_int {
    rc(with_id(id, |g, u| {
        let s = &g.ids[&(u as usize)];
        if s.listen.is_some() {
            return Ok(());
        }
        let d = match s.dev {
            Some(d) => d,
            None => {
                // Listening unbound: any address, an ephemeral port (as the kernel autobinds).
                let d = dev::device_for(g, None)?;
                // SAFETY: a live id.
                unsafe {
                    attach_dev(g, u, d);
                    if src_of(u).is_none() {
                        set_src(u, SocketAddr::new(Ipv4Addr::UNSPECIFIED.into(), 0));
                    }
                }
                g.ids.get_mut(&(u as usize)).expect("live").dev = Some(d);
                d
            }
        };
        // SAFETY: a live id.
        let mut a = unsafe { src_of(u) }.ok_or(libc::EINVAL)?;
        let ep = g.devs[d].ep.clone();
        if a.port() == 0 {
            a.set_port(ep.ephemeral_port());
            // SAFETY: a live id.
            unsafe { set_src(u, a) };
        }
        // SAFETY: a live id.
        let ps = ps_of(unsafe { (*u).id.ps }).ok_or(libc::EINVAL)?;
        let addr = Some(a.ip()).filter(|i| !i.is_unspecified());
        // SAFETY: a live id.
        let xrc = unsafe { (*u).id.qp_type } == ibv_qp_type_IBV_QPT_XRC_RECV;
        let p = ListenParams { ps, addr, port: a.port(), backlog: backlog.max(0) as u32, xrc };
        let l = ep.with_cm(|cm, _| cm.listen(p)).map_err(|e| e.errno.0)?;
        g.ids.get_mut(&(u as usize)).expect("live").listen = Some(l);
        g.by_listen.insert((d, l), u as usize);
        Ok(())
    }))
}

unsafe fn param<'a>(p: *mut rdma_conn_param) -> Option<&'a rdma_conn_param> {
    // SAFETY: the caller's param or NULL.
    unsafe { p.as_ref() }
}

unsafe fn private<'a>(p: Option<&rdma_conn_param>) -> &'a [u8] {
    match p {
        Some(p) if !p.private_data.is_null() && p.private_data_len > 0 => {
            // SAFETY: the caller's private data of the length it gives.
            unsafe { std::slice::from_raw_parts(p.private_data as *const u8, p.private_data_len as usize) }
        }
        _ => &[],
    }
}

/// `RDMA_MAX_RESP_RES` and `RDMA_MAX_INIT_DEPTH`: "as many as the device
/// allows".
const RD_ATOM_MAX_ASKED: u8 = 0xFF;

/// The device's limit on responder resources and initiator depth.
const RD_ATOM_DEVICE: u8 = uroce::verbs::MAX_RD_ATOM as u8;

/// librdmacm's `ucma_valid_param`: on an RDMA_PS_TCP id, a responder
/// resources or initiator depth above the device's limit (other than
/// "the most") is EINVAL, and so is no parameter without a QP.
fn valid_param(ps: PortSpace, p: Option<&rdma_conn_param>, has_qp: bool) -> Result<(), c_int> {
    if ps != PortSpace::Tcp {
        return Ok(());
    }
    let Some(p) = p else { return if has_qp { Ok(()) } else { Err(libc::EINVAL) } };
    let over = |v: u8| v != RD_ATOM_MAX_ASKED && v > RD_ATOM_DEVICE;
    match over(p.responder_resources) || over(p.initiator_depth) {
        true => Err(libc::EINVAL),
        false => Ok(()),
    }
}

#[no_mangle]
pub unsafe extern "C" fn uroce_cm_rdma_connect(id: *mut rdma_cm_id, conn_param: *mut rdma_conn_param) -> c_int {
    // SAFETY: the caller's param.
    let p = unsafe { param(conn_param) };
    let r = with_id(id, |g, u| {
        let s = &g.ids[&(u as usize)];
        let d = s.dev.ok_or(libc::EINVAL)?;
        if s.conn.is_some() {
            return Err(libc::EISCONN);
        }
        // SAFETY: a live id.
        let (dst, mut src, qp, ps) =
            unsafe { (dst_of(u).ok_or(libc::EINVAL)?, src_of(u).ok_or(libc::EINVAL)?, (*u).id.qp, (*u).id.ps) };
        let ps = ps_of(ps).ok_or(libc::EINVAL)?;
        let (qp_type, qp_srq) = match qp.is_null() {
            true => (0, false),
            // SAFETY: the id's QP, not NULL.
            false => unsafe { ((*qp).qp_type, !(*qp).srq.is_null()) },
        };
        let ep = g.devs[d].ep.clone();
        if src.port() == 0 {
            src.set_port(ep.ephemeral_port());
            // SAFETY: a live id.
            unsafe { set_src(u, src) };
        }
        // SAFETY: the caller's private data.
        let pdata = unsafe { private(p) }.to_vec();
        let conn = if ps.is_ud() {
            let sp = SidrParams { ps, src_port: src.port(), dst, private_data: pdata };
            ep.with_cm(|cm, now| cm.sidr_resolve(now, sp)).map_err(|e| e.errno.0)?
        } else {
            if qp.is_null() && p.is_none() {
                return Err(libc::EINVAL);
            }
            // SAFETY: the id's QP.
            let qpn = if qp.is_null() { p.map_or(0, |p| p.qp_num) } else { unsafe { (*qp).qp_num } };
            use uroce::cm::mad::TransportType;
            let transport = match qp_type {
                t if t == ibv_qp_type_IBV_QPT_UC => TransportType::Uc,
                t if t == ibv_qp_type_IBV_QPT_XRC_SEND => TransportType::Xrc,
                _ => TransportType::Rc,
            };
            valid_param(ps, p, !qp.is_null())?;
            // As librdmacm: "the most", or no parameter, asks for the device's limit.
            let lim = |v: Option<u8>| match v {
                Some(v) if v != RD_ATOM_MAX_ASKED => v,
                _ => RD_ATOM_DEVICE,
            };
            let cp = ConnectParams {
                ps,
                src_port: src.port(),
                dst,
                qpn,
                transport,
                responder_resources: lim(p.map(|p| p.responder_resources)),
                initiator_depth: lim(p.map(|p| p.initiator_depth)),
                flow_control: p.is_some_and(|p| p.flow_control != 0),
                retry_count: p.map_or(7, |p| p.retry_count),
                rnr_retry_count: p.map_or(7, |p| p.rnr_retry_count),
                // As librdmacm: the QP's SRQ where the id has a QP, else the parameter's.
                srq: if qp.is_null() { p.is_some_and(|p| p.srq != 0) } else { qp_srq },
                traffic_class: g.ids[&(u as usize)].tos,
                private_data: pdata,
            };
            ep.with_cm(|cm, now| cm.connect(now, cp)).map_err(|e| e.errno.0)?
        };
        g.ids.get_mut(&(u as usize)).expect("live").conn = Some(conn);
        g.by_conn.insert((d, conn), u as usize);
        Ok(())
    });
    if let Err(e) = r {
        return fail(e);
    }
    // SAFETY: a live id.
    unsafe { complete(id as *mut UId, rdma_cm_event_type_RDMA_CM_EVENT_ESTABLISHED) }
}

#[no_mangle]
pub unsafe extern "C" fn uroce_cm_rdma_accept(id: *mut rdma_cm_id, conn_param: *mut rdma_conn_param) -> c_int {
    // SAFETY: the caller's param.
    let p = unsafe { param(conn_param) };
    let mut ud = false;
    let r = with_id(id, |g, u| {
        let s = &g.ids[&(u as usize)];
        let (d, c) = (s.dev.ok_or(libc::EINVAL)?, s.conn.ok_or(libc::EINVAL)?);
        let ep = g.devs[d].ep.clone();
        // SAFETY: a live id.
        let (qp, ps) = unsafe { ((*u).id.qp, ps_of((*u).id.ps).ok_or(libc::EINVAL)?) };
        // SAFETY: the caller's private data.
        let pdata = unsafe { private(p) }.to_vec();
        // SAFETY: the id's QP.
        let qpn = if qp.is_null() { p.map_or(0, |p| p.qp_num) } else { unsafe { (*qp).qp_num } };
        if ps.is_ud() {
            ud = true;
            let a = AcceptParams { qpn, qkey: RDMA_UDP_QKEY, private_data: pdata, ..AcceptParams::default() };
            return ep.with_cm(|cm, now| cm.accept(now, c, a)).map_err(|e| e.errno.0);
        }
        if qp.is_null() && p.is_none() {
            return Err(libc::EINVAL);
        }
        valid_param(ps, p, !qp.is_null())?;
        let mut info = ep.with_cm(|cm, _| cm.conn_info(c).cloned()).ok_or(libc::EINVAL)?;
        // As librdmacm: "the most", or no parameter, takes what the peer
        // offered, up to the device's limit.
        let pick = |given: Option<u8>, offered: u8| match given {
            Some(v) if v != RD_ATOM_MAX_ASKED => v,
            _ => offered.min(RD_ATOM_DEVICE),
        };
        info.responder_resources = pick(p.map(|p| p.responder_resources), info.responder_resources);
        info.initiator_depth = pick(p.map(|p| p.initiator_depth), info.initiator_depth);
        if let Some(t) = s.ack_timeout {
            info.ack_timeout = t;
        }
        if !qp.is_null() {
            // SAFETY: the id's QP.
            if let Err(e) = unsafe { connect_qp(&ep, qp, &info) } {
                // SAFETY: the id's QP.
                unsafe { qp_to_err(qp) };
                return Err(e);
            }
        }
        let a = AcceptParams {
            qpn,
            responder_resources: info.responder_resources,
            initiator_depth: info.initiator_depth,
            flow_control: p.is_some_and(|p| p.flow_control != 0),
            rnr_retry_count: p.map_or(7, |p| p.rnr_retry_count),
            // As librdmacm: the QP's SRQ where the id has a QP (the
            // parameter's `srq` is then not read: libfabric leaves it
            // uninitialised), else the parameter's.
            // SAFETY: the id's QP.
            srq: if qp.is_null() { p.is_some_and(|p| p.srq != 0) } else { unsafe { !(*qp).srq.is_null() } },
            qkey: 0,
            private_data: pdata,
        };
        ep.with_cm(|cm, now| cm.accept(now, c, a)).map_err(|e| e.errno.0)
    });
    if let Err(e) = r {
        return fail(e);
    }
    if ud {
        return 0;
    }
    // SAFETY: a live id.
    unsafe { complete(id as *mut UId, rdma_cm_event_type_RDMA_CM_EVENT_ESTABLISHED) }
}

#[no_mangle]
pub unsafe extern "C" fn uroce_cm_rdma_reject(id: *mut rdma_cm_id, data: *const c_void, len: u8) -> c_int {
    // SAFETY: forwarded.
    unsafe { reject(id, data, len, uroce::cm::mad::rej_reason::CONSUMER_DEFINED) }
}

/// `rdma_reject_ece`: REJ reason 35 (vendor option not supported).
#[no_mangle]
pub unsafe extern "C" fn uroce_cm_rdma_reject_ece(id: *mut rdma_cm_id, data: *const c_void, len: u8) -> c_int {
    // SAFETY: forwarded.
    unsafe { reject(id, data, len, uroce::cm::mad::rej_reason::VENDOR_OPTION_NOT_SUPPORTED) }
}

unsafe fn reject(id: *mut rdma_cm_id, data: *const c_void, len: u8, reason: u16) -> c_int {
    let pdata = if data.is_null() || len == 0 {
        Vec::new()
    } else {
        // SAFETY: the caller's bytes.
        unsafe { std::slice::from_raw_parts(data as *const u8, len as usize) }.to_vec()
    };
    rc(with_id(id, |g, u| {
        let s = &g.ids[&(u as usize)];
        let (d, c) = (s.dev.ok_or(libc::EINVAL)?, s.conn.ok_or(libc::EINVAL)?);
        g.devs[d].ep.with_cm(|cm, now| cm.reject(now, c, reason, &pdata)).map_err(|e| e.errno.0)
    }))
}

#[no_mangle]
pub unsafe extern "C" fn uroce_cm_rdma_disconnect(id: *mut rdma_cm_id) -> c_int {
    let r = with_id(id, |g, u| {
        let s = &g.ids[&(u as usize)];
        let (d, c) = (s.dev.ok_or(libc::EINVAL)?, s.conn.ok_or(libc::ENOTCONN)?);
        // SAFETY: a live id and its QP.
        unsafe {
            if !(*u).id.qp.is_null() {
                qp_to_err((*u).id.qp);
            }
        }
        g.devs[d].ep.with_cm(|cm, now| cm.disconnect(now, c)).map_err(|e| e.errno.0)
    });
    if let Err(e) = r {
        return fail(e);
    }
    // SAFETY: a live id.
    unsafe { complete(id as *mut UId, rdma_cm_event_type_RDMA_CM_EVENT_DISCONNECTED) }
}

#[no_mangle]
pub unsafe extern "C" fn uroce_cm_rdma_establish(id: *mut rdma_cm_id) -> c_int {
    rc(with_id(id, |g, u| {
        let s = &g.ids[&(u as usize)];
        let (d, c) = (s.dev.ok_or(libc::EINVAL)?, s.conn.ok_or(libc::EINVAL)?);
        g.devs[d].ep.with_cm(|cm, now| cm.establish(now, c)).map_err(|e| e.errno.0)
    }))
}

#[no_mangle]
pub unsafe extern "C" fn uroce_cm_rdma_notify(id: *mut rdma_cm_id, event: u32) -> c_int {
    if event != ibv_event_type_IBV_EVENT_COMM_EST {
        return 0;
    }
    rc(with_id(id, |g, u| {
        let s = &g.ids[&(u as usize)];
        let (d, c) = (s.dev.ok_or(libc::EINVAL)?, s.conn.ok_or(libc::EINVAL)?);
        g.devs[d].ep.with_cm(|cm, now| cm.notify_established(now, c)).map_err(|e| e.errno.0)
    }))
}

/// Moves a new QP of `u` to INIT (RC/UC) or RTS (UD) as librdmacm does.
unsafe fn init_new_qp(u: *mut UId, qp: *mut ibv_qp) -> Result<(), c_int> {
    // SAFETY: our QP.
    let q = unsafe { core_qp(qp) }.ok_or(libc::EINVAL)?;
    if q.qp_type() == uroce::ib::QpType::Ud {
        let mut a =
            uroce::verbs::QpAttr { qp_state: QpState::Init, port_num: 1, qkey: RDMA_UDP_QKEY, ..Default::default() };
        q.modify(&a, QpAttrMask::STATE | QpAttrMask::PKEY_INDEX | QpAttrMask::PORT | QpAttrMask::QKEY)
            .map_err(|e| e.errno.0)?;
        a.qp_state = QpState::Rtr;
        q.modify(&a, QpAttrMask::STATE).map_err(|e| e.errno.0)?;
        a.qp_state = QpState::Rts;
        return q.modify(&a, QpAttrMask::STATE | QpAttrMask::SQ_PSN).map_err(|e| e.errno.0);
    }
    let _ = u;
    CmEndpoint::init_qp(q).map_err(|e| e.errno.0)
}

#[no_mangle]
pub unsafe extern "C" fn uroce_cm_rdma_create_qp(
    id: *mut rdma_cm_id,
    pd: *mut ibv_pd,
    attr: *mut ibv_qp_init_attr,
) -> c_int {
    if attr.is_null() {
        return fail(libc::EINVAL);
    }
    let r = with_id(id, |g, u| {
        // SAFETY: a live id; the caller's attributes.
        unsafe {
            if g.ids[&(u as usize)].dev.is_none() || !(*u).id.qp.is_null() {
                return Err(libc::EINVAL);
            }
            let pd = if pd.is_null() { (*u).id.pd } else { pd };
            if pd.is_null() || (*pd).context != (*u).id.verbs {
                return Err(libc::EINVAL);
            }
            // As librdmacm: a copy; only the granted capabilities go back.
            let mut b = *attr;
            let a = &mut b;
            let mut own = false;
            if a.send_cq.is_null() || a.recv_cq.is_null() {
                own = true;
                let ctx = (*u).id.verbs;
                for (cqp, chp, n) in [
                    (&mut (*u).id.send_cq, &mut (*u).id.send_cq_channel, a.cap.max_send_wr),
                    (&mut (*u).id.recv_cq, &mut (*u).id.recv_cq_channel, a.cap.max_recv_wr),
                ] {
                    let ch = crate::objects::ibv_create_comp_channel(ctx);
                    if ch.is_null() {
                        return Err(crate::errno::last());
                    }
                    let cq = crate::objects::ibv_create_cq(ctx, n.max(1) as c_int, std::ptr::null_mut(), ch, 0);
                    if cq.is_null() {
                        return Err(crate::errno::last());
                    }
                    *chp = ch;
                    *cqp = cq;
                }
                a.send_cq = (*u).id.send_cq;
                a.recv_cq = (*u).id.recv_cq;
                g.ids.get_mut(&(u as usize)).expect("live").own_cqs = true;
            } else {
                (*u).id.send_cq = a.send_cq;
                (*u).id.recv_cq = a.recv_cq;
            }
            let xrc_recv = a.qp_type == ibv_qp_type_IBV_QPT_XRC_RECV;
            // As librdmacm: the id's SRQ unless the caller names one (an
            // XRC target has none: its requests name their SRQ).
            if a.srq.is_null() && !xrc_recv {
                a.srq = (*u).id.srq;
            }
            let qp = if xrc_recv {
                // An XRC target lives in the device's XRC domain.
                let d = g.ids[&(u as usize)].dev.ok_or(libc::EINVAL)?;
                let mut ex: ibv_qp_init_attr_ex = std::mem::zeroed();
                ex.qp_context = a.qp_context;
                ex.qp_type = a.qp_type;
                ex.cap = a.cap;
                ex.comp_mask = ibv_qp_init_attr_mask_IBV_QP_INIT_ATTR_PD | ibv_qp_init_attr_mask_IBV_QP_INIT_ATTR_XRCD;
                ex.pd = pd;
                ex.xrcd = dev::xrcd(g, d)?;
                crate::objects::create_qp_ex((*u).id.verbs, &mut ex)
            } else {
                crate::objects::ibv_create_qp(pd, a)
            };
            if qp.is_null() {
                return Err(crate::errno::last());
            }
            (*attr).cap = a.cap;
            let r = init_new_qp(u, qp);
            sync_state(qp);
            if let Err(e) = r {
                crate::objects::ibv_destroy_qp(qp);
                return Err(e);
            }
            (*u).id.qp = qp;
            if !a.srq.is_null() {
                (*u).id.srq = a.srq;
            }
            g.ids.get_mut(&(u as usize)).expect("live").own_cqs = own;
        }
        Ok(())
    });
    rc(r)
}

#[no_mangle]
pub unsafe extern "C" fn uroce_cm_rdma_create_qp_ex(id: *mut rdma_cm_id, attr: *mut ibv_qp_init_attr_ex) -> c_int {
    if attr.is_null() {
        return fail(libc::EINVAL);
    }
    // SAFETY: the caller's attributes.
    let a = unsafe { &*attr };
    if a.comp_mask & !ibv_qp_init_attr_mask_IBV_QP_INIT_ATTR_PD != 0 {
        return fail(libc::EOPNOTSUPP);
    }
    let mut b = ibv_qp_init_attr {
        qp_context: a.qp_context,
        send_cq: a.send_cq,
        recv_cq: a.recv_cq,
        srq: a.srq,
        cap: a.cap,
        qp_type: a.qp_type,
        sq_sig_all: a.sq_sig_all,
    };
    let pd = if a.comp_mask & ibv_qp_init_attr_mask_IBV_QP_INIT_ATTR_PD != 0 { a.pd } else { std::ptr::null_mut() };
    // SAFETY: forwarded.
    let r = unsafe { uroce_cm_rdma_create_qp(id, pd, &mut b) };
    if r == 0 {
        // SAFETY: the caller's attributes: the capabilities granted.
        unsafe { (*attr).cap = b.cap };
    }
    r
}

#[no_mangle]
pub unsafe extern "C" fn uroce_cm_rdma_destroy_qp(id: *mut rdma_cm_id) {
    let _ = with_id(id, |g, u| {
        // SAFETY: a live id and the QP rdma_create_qp made.
        unsafe {
            if !(*u).id.qp.is_null() {
                crate::objects::ibv_destroy_qp((*u).id.qp);
                (*u).id.qp = std::ptr::null_mut();
            }
            // As librdmacm: an XRC target's CQs serve its XRC SRQ, and go
            // with it (rdma_destroy_srq).
            if (*u).id.qp_type != ibv_qp_type_IBV_QPT_XRC_RECV || (*u).id.srq.is_null() {
                destroy_own_cqs(g, u);
            }
        }
        Ok(())
    });
}

/// Destroys the CQs and channels rdma_create_qp or rdma_create_srq made
/// for id `u`, if they did.
///
/// # Safety
/// `u` is a live id, its QP and SRQ (that use them) gone.
unsafe fn destroy_own_cqs(g: &mut Global, u: *mut UId) {
    let s = g.ids.get_mut(&(u as usize)).expect("live");
    if !std::mem::take(&mut s.own_cqs) {
        return;
    }
    // SAFETY: the caller's promise.
    unsafe {
        for cq in [(*u).id.send_cq, (*u).id.recv_cq] {
            if !cq.is_null() {
                crate::objects::ibv_destroy_cq(cq);
            }
        }
        for ch in [(*u).id.send_cq_channel, (*u).id.recv_cq_channel] {
            if !ch.is_null() {
                crate::objects::ibv_destroy_comp_channel(ch);
            }
        }
        (*u).id.send_cq = std::ptr::null_mut();
        (*u).id.recv_cq = std::ptr::null_mut();
        (*u).id.send_cq_channel = std::ptr::null_mut();
        (*u).id.recv_cq_channel = std::ptr::null_mut();
    }
}

#[no_mangle]
pub unsafe extern "C" fn uroce_cm_rdma_migrate_id(id: *mut rdma_cm_id, ch: *mut rdma_event_channel) -> c_int {
    let sync = {
        let g = super::state::lock();
        match g.ids.get(&(id as usize)) {
            Some(s) => s.sync,
            None => return fail(libc::EINVAL),
        }
    };
    // librdmacm: a synchronous id stays synchronous only with a new private channel.
    if sync && ch.is_null() {
        return fail(libc::EINVAL);
    }
    if sync {
        // As librdmacm: the event a synchronous call kept in `id->event` is
        // acked first (libfabric migrates ids made by rdma_create_ep).
        // SAFETY: a live id; its held event is ours.
        unsafe { ack_pending(id as *mut UId) };
    }
    let mut g = super::state::lock();
    while g.ids.get(&(id as usize)).is_some_and(|s| s.unacked > 0) {
        g = g.wait(&super::state::ACKED);
    }
    let Some(s) = g.ids.get_mut(&(id as usize)) else { return fail(libc::EINVAL) };
    let new = if ch.is_null() { channel::create() as *mut rdma_event_channel } else { ch };
    if new.is_null() {
        return fail(libc::ENOMEM);
    }
    // SAFETY: a live id.
    let old = unsafe { (*id).channel };
    let was_sync = s.sync;
    s.sync = ch.is_null();
    // SAFETY: a live id.
    unsafe { (*id).channel = new };
    if was_sync {
        // SAFETY: its private channel, no longer used.
        unsafe { channel::destroy(old, true) };
    }
    0
}

#[no_mangle]
pub unsafe extern "C" fn uroce_cm_rdma_set_option(
    id: *mut rdma_cm_id,
    level: c_int,
    optname: c_int,
    optval: *mut c_void,
    optlen: usize,
) -> c_int {
    rc(with_id(id, |g, u| {
        if optval.is_null() {
            return Err(libc::EINVAL);
        }
        let s = g.ids.get_mut(&(u as usize)).expect("live");
        match (level, optname) {
            // RDMA_OPTION_ID_TOS (u8): the REQ's traffic class.
            // SAFETY: the caller's option of the length it gives.
            (0, 0) if optlen == 1 => s.tos = unsafe { *(optval as *const u8) },
            // REUSEADDR (int)
            // SAFETY: as above.
            (0, 1) if optlen == 4 => s.reuse = unsafe { *(optval as *const c_int) } != 0,
            // AFONLY (int): accepted (ids bind one family either way).
            (0, 2) if optlen == 4 => {}
            // ACK_TIMEOUT (u8): RC/UC ids only (`rdma_set_ack_timeout`);
            // the QP's timeout at RTS and in rdma_init_qp_attr.
            (0, 3) if optlen == 1 => {
                // SAFETY: a live id.
                let qpt = unsafe { (*u).id.qp_type };
                if qpt != ibv_qp_type_IBV_QPT_RC && qpt != ibv_qp_type_IBV_QPT_UC {
                    return Err(libc::EINVAL);
                }
                // SAFETY: the caller's option of the length it gives.
                s.ack_timeout = Some(unsafe { *(optval as *const u8) }.min(31));
            }
            (0, 3) => return Err(libc::EINVAL),
            // RDMA_OPTION_IB_PATH: RoCE takes no IB paths.
            (1, 1) => return Err(libc::EOPNOTSUPP),
            _ => return Err(libc::ENOSYS),
        }
        Ok(())
    }))
}

unsafe fn port_of(sa: *const libc::sockaddr) -> u16 {
    // SAFETY: the id's storage.
    unsafe { read_sockaddr(sa) }.map_or(0, |a| a.port().to_be())
}

#[no_mangle]
pub unsafe extern "C" fn uroce_cm_rdma_get_src_port(id: *mut rdma_cm_id) -> u16 {
    if id.is_null() {
        return 0;
    }
    // SAFETY: the caller's id (rdma_get_src_port reads the struct only).
    unsafe { port_of(addrs(id as *mut UId) as *const libc::sockaddr) }
}

#[no_mangle]
pub unsafe extern "C" fn uroce_cm_rdma_get_dst_port(id: *mut rdma_cm_id) -> u16 {
    if id.is_null() {
        return 0;
    }
    // SAFETY: as above; dst_addr follows src_addr.
    unsafe { port_of(addrs(id as *mut UId).add(1) as *const libc::sockaddr) }
}

#[no_mangle]
pub unsafe extern "C" fn uroce_cm_rdma_get_request(listen: *mut rdma_cm_id, id: *mut *mut rdma_cm_id) -> c_int {
    if id.is_null() {
        return fail(libc::EINVAL);
    }
    let ch = {
        let g = super::state::lock();
        match g.ids.get(&(listen as usize)) {
            Some(s) if s.sync && s.listen.is_some() => {}
            _ => return fail(libc::EINVAL),
        }
        // SAFETY: a live id.
        unsafe { (*listen).channel }
    };
    // SAFETY: the listener's private channel.
    unsafe {
        ack_pending(listen as *mut UId);
        let ev = match channel::get(ch) {
            Ok(e) => e,
            Err(e) => return fail(e),
        };
        if (*ev).ev.event != rdma_cm_event_type_RDMA_CM_EVENT_CONNECT_REQUEST {
            let st = (*ev).ev.status;
            channel::uroce_cm_rdma_ack_cm_event(ev as *mut rdma_cm_event);
            return fail(if st < 0 { -st } else { libc::EINVAL });
        }
        let child = (*ev).ev.id;
        (*child).event = ev as *mut rdma_cm_event;
        let attr = super::state::lock().ids.get(&(listen as usize)).and_then(|s| s.ep_attr.map(|a| a.0));
        if let Some(mut a) = attr {
            if uroce_cm_rdma_create_qp(child, std::ptr::null_mut(), &mut a) != 0 {
                let e = crate::errno::last();
                uroce_cm_rdma_reject(child, std::ptr::null(), 0);
                uroce_cm_rdma_destroy_id(child);
                return fail(e);
            }
        }
        *id = child;
    }
    0
}

#[no_mangle]
pub unsafe extern "C" fn uroce_cm_rdma_create_ep(
    id: *mut *mut rdma_cm_id,
    res: *mut rdma_addrinfo,
    pd: *mut ibv_pd,
    qp_init_attr: *mut ibv_qp_init_attr,
) -> c_int {
    if id.is_null() || res.is_null() {
        return fail(libc::EINVAL);
    }
    // SAFETY: the caller's addrinfo.
    let r = unsafe { &*res };
    let mut cm: *mut rdma_cm_id = std::ptr::null_mut();
    // SAFETY: a private channel.
    if unsafe {
        create_id_ex(std::ptr::null_mut(), &mut cm, std::ptr::null_mut(), r.ai_port_space as u32, r.ai_qp_type as u32)
    } != 0
    {
        return -1;
    }
    let undo = |cm| {
        let e = crate::errno::last();
        // SAFETY: the id made above.
        unsafe { uroce_cm_rdma_destroy_id(cm) };
        fail(e)
    };
    // SAFETY: the caller's addrinfo; our id.
    unsafe {
        // As librdmacm: the QP type is the addrinfo's.
        if !qp_init_attr.is_null() {
            (*qp_init_attr).qp_type = r.ai_qp_type as u32;
        }
        if r.ai_flags & RAI_PASSIVE as c_int != 0 {
            if uroce_cm_rdma_bind_addr(cm, r.ai_src_addr as *mut libc::sockaddr) != 0 {
                return undo(cm);
            }
            if !qp_init_attr.is_null() {
                let a = EpAttr(*qp_init_attr);
                super::state::lock().ids.get_mut(&(cm as usize)).expect("live").ep_attr = Some(a);
            }
        } else {
            if uroce_cm_rdma_resolve_addr(
                cm,
                r.ai_src_addr as *mut libc::sockaddr,
                r.ai_dst_addr as *mut libc::sockaddr,
                2000,
            ) != 0
                || uroce_cm_rdma_resolve_route(cm, 2000) != 0
            {
                return undo(cm);
            }
            if !qp_init_attr.is_null() && uroce_cm_rdma_create_qp(cm, pd, qp_init_attr) != 0 {
                return undo(cm);
            }
        }
        *id = cm;
    }
    0
}

#[no_mangle]
pub unsafe extern "C" fn uroce_cm_rdma_destroy_ep(id: *mut rdma_cm_id) {
    if id.is_null() {
        return;
    }
    // SAFETY: the caller's id.
    unsafe {
        if !(*id).qp.is_null() {
            uroce_cm_rdma_destroy_qp(id);
        }
        if !(*id).srq.is_null() {
            uroce_cm_rdma_destroy_srq(id);
        }
        uroce_cm_rdma_destroy_id(id);
    }
}

#[no_mangle]
pub unsafe extern "C" fn uroce_cm_rdma_create_srq(
    id: *mut rdma_cm_id,
    pd: *mut ibv_pd,
    attr: *mut ibv_srq_init_attr,
) -> c_int {
    if id.is_null() || attr.is_null() {
        return fail(libc::EINVAL);
    }
    // As librdmacm: an XRC SRQ for an XRC_RECV id, else a basic one.
    // SAFETY: the caller's id (checked live below) and attributes.
    let mut ex: ibv_srq_init_attr_ex = unsafe { std::mem::zeroed() };
    // SAFETY: as above.
    unsafe {
        ex.srq_context = (*attr).srq_context;
        ex.attr = (*attr).attr;
        ex.srq_type = match (*id).qp_type == ibv_qp_type_IBV_QPT_XRC_RECV {
            true => ibv_srq_type_IBV_SRQT_XRC,
            false => ibv_srq_type_IBV_SRQT_BASIC,
        };
    }
    ex.comp_mask = ibv_srq_init_attr_mask_IBV_SRQ_INIT_ATTR_TYPE | ibv_srq_init_attr_mask_IBV_SRQ_INIT_ATTR_PD;
    ex.pd = pd;
    // SAFETY: forwarded.
    let r = unsafe { uroce_cm_rdma_create_srq_ex(id, &mut ex) };
    // SAFETY: the caller's attributes: the granted sizes.
    unsafe { (*attr).attr = ex.attr };
    r
}

/// `rdma_create_srq_ex`: the attributes must say the SRQ's type. The id's
/// PD where none is given; an XRC SRQ gets the device's XRC domain and the
/// id's receive CQ (made here if the id has none, with its channel) where
/// the caller names none (librdmacm).
#[no_mangle]
pub unsafe extern "C" fn uroce_cm_rdma_create_srq_ex(id: *mut rdma_cm_id, attr: *mut ibv_srq_init_attr_ex) -> c_int {
    if attr.is_null() {
        return fail(libc::EINVAL);
    }
    rc(with_id(id, |g, u| {
        // SAFETY: a live id; the caller's attributes.
        unsafe {
            let a = &mut *attr;
            let has = |a: &ibv_srq_init_attr_ex, bit: u32| a.comp_mask & bit != 0;
            if !has(a, ibv_srq_init_attr_mask_IBV_SRQ_INIT_ATTR_TYPE) || !(*u).id.srq.is_null() {
                return Err(libc::EINVAL);
            }
            if !has(a, ibv_srq_init_attr_mask_IBV_SRQ_INIT_ATTR_PD) || a.pd.is_null() {
                a.pd = (*u).id.pd;
                a.comp_mask |= ibv_srq_init_attr_mask_IBV_SRQ_INIT_ATTR_PD;
            }
            if a.pd.is_null() {
                return Err(libc::EINVAL);
            }
            let d = g.ids[&(u as usize)].dev.ok_or(libc::EINVAL)?;
            if a.srq_type == ibv_srq_type_IBV_SRQT_XRC {
                if !has(a, ibv_srq_init_attr_mask_IBV_SRQ_INIT_ATTR_XRCD) || a.xrcd.is_null() {
                    a.xrcd = dev::xrcd(g, d)?;
                }
                if !has(a, ibv_srq_init_attr_mask_IBV_SRQ_INIT_ATTR_CQ) || a.cq.is_null() {
                    if (*u).id.recv_cq.is_null() {
                        let ch = crate::objects::ibv_create_comp_channel((*u).id.verbs);
                        if ch.is_null() {
                            return Err(crate::errno::last());
                        }
                        let cq = crate::objects::ibv_create_cq(
                            (*u).id.verbs,
                            a.attr.max_wr.max(1) as c_int,
                            std::ptr::null_mut(),
                            ch,
                            0,
                        );
                        if cq.is_null() {
                            let e = crate::errno::last();
                            crate::objects::ibv_destroy_comp_channel(ch);
                            return Err(e);
                        }
                        (*u).id.recv_cq_channel = ch;
                        (*u).id.recv_cq = cq;
                        g.ids.get_mut(&(u as usize)).expect("live").own_cqs = true;
                    }
                    a.cq = (*u).id.recv_cq;
                }
                a.comp_mask |=
                    ibv_srq_init_attr_mask_IBV_SRQ_INIT_ATTR_XRCD | ibv_srq_init_attr_mask_IBV_SRQ_INIT_ATTR_CQ;
            }
            let srq = crate::srq::create_srq_ex((*u).id.verbs, a);
            if srq.is_null() {
                let e = crate::errno::last();
                if (*u).id.qp.is_null() {
                    destroy_own_cqs(g, u);
                }
                return Err(e);
            }
            if (*u).id.pd.is_null() {
                (*u).id.pd = a.pd;
            }
            (*u).id.srq = srq;
        }
        Ok(())
    }))
}

/// `rdma_destroy_srq`: the SRQ, then the CQs made for it when the id has
/// no QP left (an XRC target's; librdmacm's `ucma_destroy_cqs`).
#[no_mangle]
pub unsafe extern "C" fn uroce_cm_rdma_destroy_srq(id: *mut rdma_cm_id) {
    let _ = with_id(id, |g, u| {
        // SAFETY: a live id and its SRQ.
        unsafe {
            if !(*u).id.srq.is_null() {
                crate::srq::ibv_destroy_srq((*u).id.srq);
                (*u).id.srq = std::ptr::null_mut();
            }
            if (*u).id.qp.is_null() {
                destroy_own_cqs(g, u);
            }
        }
        Ok(())
    });
}

/// The QP states `rdma_init_qp_attr` tells apart.
#[derive(PartialEq)]
enum To {
    Init,
    Rtr,
    Rts,
    Other,
}

/// `rdma_init_qp_attr`: the attributes that move a QP to the state the
/// caller asks for in `attr->qp_state` (the kernel's `rdma_init_qp_attr`;
/// the cases below). The ACK timeout set by RDMA_OPTION_ID_ACK_TIMEOUT
/// replaces the path's.
#[no_mangle]
pub unsafe extern "C" fn uroce_cm_rdma_init_qp_attr(
    id: *mut rdma_cm_id,
    attr: *mut ibv_qp_attr,
    mask: *mut c_int,
) -> c_int {
    if attr.is_null() || mask.is_null() {
        return fail(libc::EINVAL);
    }
    // SAFETY: not NULL (checked): the caller's mask, written once below.
    let mask = unsafe { &mut *mask };
    rc(with_id(id, |g, u| {
        let s = &g.ids[&(u as usize)];
        let d = s.dev.ok_or(libc::EINVAL)?;
        let info = s.conn.and_then(|c| g.devs[d].ep.with_cm(|cm, _| cm.conn_info(c).cloned()));
        // SAFETY: the caller's attribute struct (its qp_state is the request).
        let want = unsafe { (*attr).qp_state };
        // SAFETY: a live id.
        let ud = ps_of(unsafe { (*u).id.ps }).is_some_and(|p| p.is_ud());
        // A connected RC/UC id answers as the IB CM (`ib_cm_init_qp_attr`):
        // INIT, RTR or RTS, else EINVAL. Any other id (UD, or not connected
        // yet) as `cma_ib_init_qp_attr`: the state asked for, with the
        // P_Key index, port, and Q_Key (UD) or no remote access.
        let connected = if ud { None } else { info };
        let to = if want == ibv_qp_state_IBV_QPS_INIT {
            To::Init
        } else if want == ibv_qp_state_IBV_QPS_RTR {
            To::Rtr
        } else if want == ibv_qp_state_IBV_QPS_RTS {
            To::Rts
        } else {
            To::Other
        };
        if connected.is_some() && to == To::Other {
            return Err(libc::EINVAL);
        }
        // SAFETY: the caller's attribute struct; all-zero is valid.
        let a = unsafe { &mut *attr };
        // SAFETY: as above.
        *a = unsafe { std::mem::zeroed() };
        a.qp_state = want;
        a.port_num = 1;
        let m = |bits: u32| bits as c_int;
        match (to, connected) {
            (_, None) => {
                *mask = m(ibv_qp_attr_mask_IBV_QP_STATE
                    | ibv_qp_attr_mask_IBV_QP_PKEY_INDEX
                    | ibv_qp_attr_mask_IBV_QP_PORT);
                if ud {
                    a.qkey = RDMA_UDP_QKEY;
                    *mask |= m(ibv_qp_attr_mask_IBV_QP_QKEY);
                } else {
                    *mask |= m(ibv_qp_attr_mask_IBV_QP_ACCESS_FLAGS);
                }
            }
            (To::Init, Some(i)) => {
                // `cm_init_qp_init_attr`: remote write, and read and
                // atomics when the peer may issue them.
                a.qp_access_flags = ibv_access_flags_IBV_ACCESS_REMOTE_WRITE;
                if i.responder_resources > 0 {
                    a.qp_access_flags |=
                        ibv_access_flags_IBV_ACCESS_REMOTE_READ | ibv_access_flags_IBV_ACCESS_REMOTE_ATOMIC;
                }
                *mask = m(ibv_qp_attr_mask_IBV_QP_STATE
                    | ibv_qp_attr_mask_IBV_QP_PKEY_INDEX
                    | ibv_qp_attr_mask_IBV_QP_PORT
                    | ibv_qp_attr_mask_IBV_QP_ACCESS_FLAGS);
            }
            (To::Rtr, Some(i)) => {
                a.path_mtu = i.path_mtu as u32;
                a.dest_qp_num = i.remote_qpn;
                a.rq_psn = i.local_psn;
                a.max_dest_rd_atomic = i.responder_resources;
                a.min_rnr_timer = 0;
                a.ah_attr.is_global = 1;
                a.ah_attr.port_num = 1;
                a.ah_attr.grh.dgid.raw = uroce::ib::Gid::from_ip(i.remote.ip()).0;
                a.ah_attr.grh.hop_limit = i.hop_limit;
                a.ah_attr.grh.flow_label = i.flow_label;
                a.ah_attr.grh.traffic_class = i.traffic_class;
                *mask = m(ibv_qp_attr_mask_IBV_QP_STATE
                    | ibv_qp_attr_mask_IBV_QP_AV
                    | ibv_qp_attr_mask_IBV_QP_PATH_MTU
                    | ibv_qp_attr_mask_IBV_QP_DEST_QPN
                    | ibv_qp_attr_mask_IBV_QP_RQ_PSN
                    | ibv_qp_attr_mask_IBV_QP_MAX_DEST_RD_ATOMIC
                    | ibv_qp_attr_mask_IBV_QP_MIN_RNR_TIMER);
            }
            (_, Some(i)) => {
                a.sq_psn = i.remote_psn;
                a.timeout = s.ack_timeout.unwrap_or(i.ack_timeout);
                a.retry_cnt = i.retry_count;
                a.rnr_retry = i.rnr_retry_count;
                a.max_rd_atomic = i.initiator_depth;
                *mask = m(ibv_qp_attr_mask_IBV_QP_STATE
                    | ibv_qp_attr_mask_IBV_QP_SQ_PSN
                    | ibv_qp_attr_mask_IBV_QP_TIMEOUT
                    | ibv_qp_attr_mask_IBV_QP_RETRY_CNT
                    | ibv_qp_attr_mask_IBV_QP_RNR_RETRY
                    | ibv_qp_attr_mask_IBV_QP_MAX_QP_RD_ATOMIC);
            }
        }
        Ok(())
    }))
}
