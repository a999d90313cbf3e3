//! The devices the CM uses and the routing of their agents' events. Each
//! device is opened once through this library's own `ibv_open_device` (so
//! `id->verbs` is an ordinary context of the process), with one PD for
//! `id->pd` and one CM agent on its QP 1; a thread per device takes the
//! agent's events and queues them, as `rdma_cm_event`s, on the channel of
//! the id they belong to. For a REP on an id with a QP it first does what
//! librdmacm does: QP to RTS, RTU, then ESTABLISHED (CONNECT_ERROR if the
//! QP cannot move). At process exit every id still held is destroyed as
//! closing the kernel's rdma_cm file does ([`destroy_all_at_exit`]).

use super::channel::{push, UEvent, MAX_PRIVATE};
use super::ids;
use super::state::UId;
use super::state::{Dev, Global};
use crate::ffi::cma::*;
use crate::ffi::*;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;
use uroce::cm::{CmEndpoint, CmEvent, EventKind, Param};

fn open_device(dev: *mut ibv_device) -> Result<Dev, i32> {
    // SAFETY: a device of our list.
    let ctx = unsafe { crate::device::ibv_open_device(dev) };
    if ctx.is_null() {
        return Err(crate::errno::last());
    }
    // SAFETY: our context.
    let u = unsafe { crate::handles::UContext::from_ctx(ctx) };
    let ip = u.ctx.local_addr().ip();
    let ep = match CmEndpoint::open(&u.ctx) {
        Ok(ep) => Arc::new(ep),
        Err(e) => {
            // SAFETY: opened above, unused.
            unsafe { crate::device::ibv_close_device(ctx) };
            return Err(e.errno.0);
        }
    };
    // SAFETY: our context.
    let pd = unsafe { crate::objects::ibv_alloc_pd(ctx) };
    if pd.is_null() {
        return Err(crate::errno::last());
    }
    Ok(Dev { ip, ctx: ctx as usize, pd: pd as usize, ep, xrcd: 0 })
}

/// Device `d`'s XRC domain (see [`Dev::xrcd`]).
pub fn xrcd(g: &mut Global, d: usize) -> Result<*mut ibv_xrcd, i32> {
    let dev = &mut g.devs[d];
    if dev.xrcd == 0 {
        let mut a = ibv_xrcd_init_attr {
            comp_mask: ibv_xrcd_init_attr_mask_IBV_XRCD_INIT_ATTR_FD
                | ibv_xrcd_init_attr_mask_IBV_XRCD_INIT_ATTR_OFLAGS,
            fd: -1,
            oflags: libc::O_CREAT,
        };
        // SAFETY: our context; attributes on our stack.
        let x = unsafe { crate::xrcd::open_xrcd(dev.ctx as *mut ibv_context, &mut a) };
        if x.is_null() {
            return Err(crate::errno::last());
        }
        dev.xrcd = x as usize;
    }
    Ok(dev.xrcd as *mut ibv_xrcd)
}

/// The device whose address is `ip` (any address: the default device),
/// opened and its agent started on first use. EADDRNOTAVAIL if no device
/// of this process has that address.
pub fn device_for(g: &mut Global, ip: Option<IpAddr>) -> Result<usize, i32> {
    let want = ip.filter(|a| !a.is_unspecified());
    if let Some(i) = g.devs.iter().position(|d| want.is_none() || Some(d.ip) == want) {
        return Ok(i);
    }
    let mut n = 0;
    // SAFETY: our device list, freed below.
    let list = unsafe { crate::device::ibv_get_device_list(&mut n) };
    if list.is_null() || n == 0 {
        return Err(libc::ENODEV);
    }
    let mut res = Err(libc::EADDRNOTAVAIL);
    for i in 0..n as usize {
        // SAFETY: i < n.
        let d = unsafe { *list.add(i) };
        // SAFETY: devices of our list are UDevices.
        let cfg = unsafe { &(*(d as *const crate::handles::UDevice)).cfg };
        let open_it = match (want, cfg.addr) {
            (None, _) => i == 0,
            (Some(w), Some(a)) => a == w,
            // A device that takes the first free address: opened to see it.
            (Some(_), None) => i == 0,
        };
        if !open_it || g.devs.iter().any(|x| Some(x.ip) == cfg.addr) {
            continue;
        }
        match open_device(d) {
            Ok(dev) => {
                let matches = want.is_none() || Some(dev.ip) == want;
                let ep = dev.ep.clone();
                let idx = g.devs.len();
                g.devs.push(dev);
                static AT_EXIT: std::sync::Once = std::sync::Once::new();
                AT_EXIT.call_once(|| {
                    EXIT_OWNER.store(std::process::id(), std::sync::atomic::Ordering::Relaxed);
                    // SAFETY: registers a plain extern "C" function with no arguments.
                    unsafe { libc::atexit(destroy_all_at_exit) };
                });
                let _ = std::thread::Builder::new().name("uroce-rdmacm".into()).spawn(move || dispatch(idx, ep));
                if matches {
                    res = Ok(idx);
                    break;
                }
            }
            Err(e) => res = Err(e),
        }
    }
    // SAFETY: from ibv_get_device_list.
    unsafe { crate::device::ibv_free_device_list(list) };
    res
}

/// Run by `exit()`: a process that ends without destroying its ids (perftest's
/// servers return from `main` connected) still says goodbye as a kernel
/// does when it closes the process's rdma_cm file: a DREQ for each
/// established connection, a REJ for each pending one, so that the peer
/// gets DISCONNECTED or REJECTED at once instead of retrying into a void.
/// The CM lock is tried for at most ~200 ms (a thread may hold it while
/// the process exits); the agents' own locks are only ever held briefly.
/// A forked child that exits says nothing: the connections are its
/// parent's (the kernel's file stays open while the parent holds it).
extern "C" fn destroy_all_at_exit() {
    if EXIT_OWNER.load(std::sync::atomic::Ordering::Relaxed) != std::process::id() {
        return;
    }
    let mut eps: Vec<Arc<CmEndpoint>> = Vec::new();
    for _ in 0..100 {
        match super::state::STATE.try_lock_unpoisoned() {
            Some(g) => eps = g.devs.iter().map(|d| d.ep.clone()).collect(),
            None => {
                std::thread::sleep(Duration::from_millis(2));
                continue;
            }
        }
        break;
    }
    for ep in eps {
        ep.with_cm(|cm, now| cm.destroy_all(now));
    }
}

/// The process that registered [`destroy_all_at_exit`].
static EXIT_OWNER: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);

/// The device's event thread: routes each CM event to its id's channel,
/// sleeping until one comes (the agent notifies; the timeout only bounds
/// one wait of a loop that never ends).
fn dispatch(dev: usize, ep: Arc<CmEndpoint>) {
    loop {
        if let Some(e) = ep.next_event(Duration::from_secs(60)) {
            route(dev, &ep, e);
        }
    }
}

/// Fills an event's parameters from the agent's.
pub fn fill(ev: &mut UEvent, e: &CmEvent, remote: Option<SocketAddr>) {
    ev.ev.event = e.kind as u32;
    ev.ev.status = e.status;
    let n = e.private_data.len().min(MAX_PRIVATE);
    ev.private[..n].copy_from_slice(&e.private_data[..n]);
    let pd = if n > 0 { ev.private.as_ptr() as *const libc::c_void } else { std::ptr::null() };
    match e.param {
        Param::Ud(u) => {
            // SAFETY: the param union's ud member; plain data.
            let ud = unsafe { ev.ev.param.ud.as_mut() };
            ud.private_data = pd;
            ud.private_data_len = n as u8;
            ud.qp_num = u.qp_num;
            ud.qkey = u.qkey;
            if let Some(r) = remote {
                ud.ah_attr.is_global = 1;
                ud.ah_attr.port_num = 1;
                ud.ah_attr.grh.hop_limit = 64;
                ud.ah_attr.grh.dgid.raw = uroce::ib::Gid::from_ip(r.ip()).0;
            }
        }
        Param::Conn(c) => {
            // SAFETY: the param union's conn member; plain data.
            let p = unsafe { ev.ev.param.conn.as_mut() };
            p.private_data = pd;
            p.private_data_len = n as u8;
            p.responder_resources = c.responder_resources;
            p.initiator_depth = c.initiator_depth;
            p.flow_control = c.flow_control as u8;
            p.retry_count = c.retry_count;
            p.rnr_retry_count = c.rnr_retry_count;
            p.srq = c.srq as u8;
            p.qp_num = c.qp_num;
        }
        Param::None => {
            // SAFETY: as above.
            let p = unsafe { ev.ev.param.conn.as_mut() };
            p.private_data = pd;
            p.private_data_len = n as u8;
        }
    }
}

fn route(dev: usize, ep: &CmEndpoint, mut e: CmEvent) {
    let mut g = super::state::lock();
    let mut ev = UEvent::new();
    if e.kind == EventKind::ConnectRequest {
        let Some(&l) = e.listen_id.and_then(|l| g.by_listen.get(&(dev, l))) else {
            ep.with_cm(|cm, now| cm.reject(now, e.id, uroce::cm::mad::rej_reason::CONSUMER_DEFINED, &[]).ok());
            return;
        };
        let info = ep.with_cm(|cm, _| cm.conn_info(e.id).cloned());
        let Some(info) = info else { return };
        // SAFETY: a live listener id (in by_listen).
        let child = unsafe { ids::new_child(&mut g, l as *mut UId, dev, e.id, &info) };
        let remote = Some(info.remote);
        fill(&mut ev, &e, remote);
        ev.ev.id = child as *mut rdma_cm_id;
        ev.ev.listen_id = l as *mut rdma_cm_id;
        let Some(ls) = g.ids.get(&l) else { return };
        ev.owner = l;
        ev.serial = ls.serial;
        // SAFETY: the listener is alive; its channel too.
        unsafe { push((*(l as *mut UId)).id.channel, ev) };
        return;
    }
    let Some(&idp) = g.by_conn.get(&(dev, e.id)) else { return };
    let u = idp as *mut UId;
    let mut info = ep.with_cm(|cm, _| cm.conn_info(e.id).cloned());
    // rdma_set_ack_timeout's value replaces the path's at RTS.
    if let (Some(i), Some(t)) = (info.as_mut(), g.ids.get(&idp).and_then(|s| s.ack_timeout)) {
        i.ack_timeout = t;
    }
    // SAFETY: a live id (in by_conn).
    let qp = unsafe { (*u).id.qp };
    match e.kind {
        EventKind::ConnectResponse if !qp.is_null() => {
            // SAFETY: the id's QP, one of ours.
            let moved = info.as_ref().map_or(Err(libc::ECONNABORTED), |i| unsafe { ids::connect_qp(ep, qp, i) });
            if moved.is_ok() && ep.with_cm(|cm, now| cm.establish(now, e.id)).is_ok() {
                e.kind = EventKind::Established;
            } else {
                e.kind = EventKind::ConnectError;
                e.status = -moved.err().unwrap_or(libc::EINVAL);
                if let Some(s) = g.ids.get_mut(&idp) {
                    s.conn_error = true;
                }
            }
        }
        EventKind::Rejected | EventKind::Disconnected if g.ids.get(&idp).is_some_and(|s| s.conn_error) => return,
        EventKind::Rejected if !qp.is_null() => {
            // SAFETY: the id's QP.
            unsafe { ids::qp_to_err(qp) };
        }
        _ => {}
    }
    fill(&mut ev, &e, info.map(|i| i.remote));
    ev.ev.id = u as *mut rdma_cm_id;
    let Some(s) = g.ids.get(&idp) else { return };
    ev.owner = idp;
    ev.serial = s.serial;
    // SAFETY: live id, live channel.
    unsafe { push((*u).id.channel, ev) };
}
