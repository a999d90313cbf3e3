//! Verbs objects: protection domains, memory regions, completion channels,
//! completion queues, queue pairs, and asynchronous events. Each C struct is
//! the first field of a `#[repr(C)]` struct that also holds the uroce handle
//! (`handles.rs`).

use crate::errno::{fail, null, ret, set_errno};
use crate::ffi::*;
use crate::handles::{UAh, UChannel, UContext, UCq, UMr, UPd, UQp, USrq};
use std::cell::Cell;
use std::ffi::c_int;
use uroce::ib::{Access, Gid, Mtu, QpAttrMask, QpState, QpType};
use uroce::verbs::{AddressVector, QpAttr, QpCap, QpInitAttr, QueuePair};

thread_local! {
    /// The inline-receive choice of the `mlx5dv_create_qp` in progress on
    /// this thread (None: the device's default), read by `ibv_create_qp`.
    static SCATTER: Cell<Option<bool>> = const { Cell::new(None) };
}

/// Runs `create` (which creates one QP) with the QP's inline-receive choice:
/// `mlx5dv_create_qp`'s `DISABLE`/`ALLOW_SCATTER_TO_CQE`.
pub(crate) fn with_scatter_to_cqe<T>(choice: Option<bool>, create: impl FnOnce() -> T) -> T {
    SCATTER.with(|s| s.set(choice));
    let made = create();
    SCATTER.with(|s| s.set(None));
    made
}

fn mutex_init(m: *mut pthread_mutex_t) {
    // SAFETY: `m` points into a fresh allocation we own.
    unsafe { libc::pthread_mutex_init(m as *mut libc::pthread_mutex_t, std::ptr::null()) };
}

fn cond_init(c: *mut pthread_cond_t) {
    // SAFETY: `c` points into a fresh allocation we own.
    unsafe { libc::pthread_cond_init(c as *mut libc::pthread_cond_t, std::ptr::null()) };
}

#[no_mangle]
pub unsafe extern "C" fn ibv_alloc_pd(ctx: *mut ibv_context) -> *mut ibv_pd {
    if ctx.is_null() {
        return null(libc::EINVAL);
    }
    // SAFETY: our context.
    let u = unsafe { UContext::from_ctx(ctx) };
    match u.ctx.alloc_pd() {
        // SAFETY: our context.
        Ok(pd) => unsafe { crate::share::publish_pd(ctx, pd) },
        Err(e) => null(fail(&e)),
    }
}

/// 0, or an errno value also set in errno (EBUSY: objects still use it), as
/// rdma-core's, which returns the errno of the kernel's PD_DESTROY.
#[no_mangle]
pub unsafe extern "C" fn ibv_dealloc_pd(pd: *mut ibv_pd) -> c_int {
    if pd.is_null() {
        return ret(libc::EINVAL);
    }
    // A PD shared with imported copies (import.rs).
    // SAFETY: a PD from ibv_alloc_pd or ibv_import_pd.
    if let Some(rc) = unsafe { crate::share::dealloc_pd(pd) } {
        return ret(rc);
    }
    // SAFETY: as above.
    let p = unsafe { &mut *(pd as *mut UPd) };
    if p.parent_domain {
        // Objects created from it hold the parent PD themselves.
        // SAFETY: a parent domain from alloc_parent_domain, freed once.
        drop(unsafe { Box::from_raw(pd as *mut UPd) });
        return 0;
    }
    let Some(inner) = p.inner.take() else { return ret(libc::EINVAL) };
    match inner.dealloc() {
        Ok(()) => {
            // SAFETY: nothing refers to it any more.
            drop(unsafe { Box::from_raw(pd as *mut UPd) });
            0
        }
        Err((inner, e)) => {
            p.inner = Some(inner);
            ret(e.errno.0)
        }
    }
}

unsafe fn reg(pd: *mut ibv_pd, addr: *mut libc::c_void, len: usize, iova: u64, access: c_int) -> *mut ibv_mr {
    // NULL is an address only for implicit ODP (length SIZE_MAX).
    let on_demand = access as u32 & Access::ON_DEMAND.bits() != 0;
    if pd.is_null() || (addr.is_null() && len > 0 && !on_demand) {
        return null(libc::EINVAL);
    }
    // SAFETY: a PD from ibv_alloc_pd.
    let p = unsafe { &*(pd as *const UPd) };
    let access = Access::from_bits_retain(access as u32);
    // SAFETY: the verbs contract: the memory stays valid until ibv_dereg_mr.
    match unsafe { p.inner.as_ref().unwrap().register_raw(addr as *mut u8, len, iova, access) } {
        Ok(mr) => {
            let raw = ibv_mr {
                context: p.pd.context,
                pd,
                addr,
                length: len,
                handle: 0, // named by publish_mr
                lkey: mr.lkey(),
                rkey: mr.rkey(),
            };
            // SAFETY: the PD's context is ours.
            unsafe { crate::share::publish_mr(UMr { mr: raw, inner: Some(mr), dm: None }) }
        }
        Err(e) => null(fail(&e)),
    }
}

#[no_mangle]
pub unsafe extern "C" fn ibv_reg_mr(
    pd: *mut ibv_pd,
    addr: *mut libc::c_void,
    len: usize,
    access: c_int,
) -> *mut ibv_mr {
    // SAFETY: forwarded contract.
    unsafe { reg(pd, addr, len, addr as u64, access) }
}

#[no_mangle]
pub unsafe extern "C" fn ibv_reg_mr_iova(
    pd: *mut ibv_pd,
    addr: *mut libc::c_void,
    len: usize,
    iova: u64,
    access: c_int,
) -> *mut ibv_mr {
    // SAFETY: forwarded contract.
    unsafe { reg(pd, addr, len, iova, access) }
}

#[no_mangle]
pub unsafe extern "C" fn ibv_reg_mr_iova2(
    pd: *mut ibv_pd,
    addr: *mut libc::c_void,
    len: usize,
    iova: u64,
    access: u32,
) -> *mut ibv_mr {
    // SAFETY: forwarded contract.
    unsafe { reg(pd, addr, len, iova, access as c_int) }
}

/// 0, or an errno value also set in errno (EBUSY: windows still bound), as
/// rdma-core's, which returns the errno of the kernel's MR_DESTROY.
#[no_mangle]
pub unsafe extern "C" fn ibv_dereg_mr(mr: *mut ibv_mr) -> c_int {
    if mr.is_null() {
        return ret(libc::EINVAL);
    }
    // An MR shared with imported copies (import.rs).
    // SAFETY: an MR from ibv_reg_mr or ibv_import_mr.
    if let Some(rc) = unsafe { crate::share::dereg_mr(mr) } {
        return ret(rc);
    }
    // SAFETY: as above.
    let m = unsafe { &mut *(mr as *mut UMr) };
    let Some(inner) = m.inner.take() else { return ret(libc::EINVAL) };
    match inner.dereg() {
        Ok(()) => {
            // SAFETY: deregistered; nothing refers to it any more.
            drop(unsafe { Box::from_raw(mr as *mut UMr) });
            0
        }
        Err((inner, e)) => {
            m.inner = Some(inner);
            ret(e.errno.0)
        }
    }
}

#[no_mangle]
pub unsafe extern "C" fn ibv_create_comp_channel(ctx: *mut ibv_context) -> *mut ibv_comp_channel {
    if ctx.is_null() {
        return null(libc::EINVAL);
    }
    // SAFETY: our context.
    let u = unsafe { UContext::from_ctx(ctx) };
    match u.ctx.create_comp_channel() {
        Ok(ch) => {
            let raw = ibv_comp_channel { context: ctx, fd: ch.fd(), refcnt: 0 };
            Box::into_raw(Box::new(UChannel { ch: raw, inner: Some(ch) })) as *mut ibv_comp_channel
        }
        Err(e) => null(fail(&e)),
    }
}

#[no_mangle]
pub unsafe extern "C" fn ibv_destroy_comp_channel(ch: *mut ibv_comp_channel) -> c_int {
    if ch.is_null() {
        return libc::EINVAL;
    }
    // SAFETY: a channel from ibv_create_comp_channel.
    let c = unsafe { &*(ch as *const UChannel) };
    if c.ch.refcnt > 0 || c.inner.as_ref().is_some_and(|i| i.is_used()) {
        return libc::EBUSY;
    }
    // SAFETY: as above; no CQ uses it.
    drop(unsafe { Box::from_raw(ch as *mut UChannel) });
    0
}

#[no_mangle]
pub unsafe extern "C" fn ibv_create_cq(
    ctx: *mut ibv_context,
    cqe: c_int,
    cq_context: *mut libc::c_void,
    channel: *mut ibv_comp_channel,
    comp_vector: c_int,
) -> *mut ibv_cq {
    if ctx.is_null() || cqe <= 0 {
        return null(libc::EINVAL);
    }
    // SAFETY: our context.
    if comp_vector < 0 || comp_vector >= unsafe { (*ctx).num_comp_vectors } {
        return null(libc::EINVAL);
    }
    // SAFETY: our context, and a channel from ibv_create_comp_channel or NULL.
    let (u, ch) = unsafe { (UContext::from_ctx(ctx), (channel as *mut UChannel).as_mut()) };
    match u.ctx.create_cq(cqe as u32, ch.as_ref().and_then(|c| c.inner.as_ref())) {
        Ok(cq) => {
            // SAFETY: ibv_cq_ex is plain old data plus function pointers (NULL).
            let mut raw: ibv_cq_ex = unsafe { std::mem::zeroed() };
            raw.context = ctx;
            raw.channel = channel;
            raw.cq_context = cq_context;
            raw.handle = cq.handle();
            raw.cqe = cqe;
            if let Some(c) = ch {
                c.ch.refcnt += 1;
            }
            let p = Box::into_raw(Box::new(UCq { cq: raw, inner: Some(cq), cur: Default::default() }));
            // SAFETY: fresh allocation.
            unsafe {
                mutex_init(&mut (*p).cq.mutex);
                cond_init(&mut (*p).cq.cond);
            }
            u.cqs.lock().unwrap().insert(raw.handle, p as usize);
            p as *mut ibv_cq
        }
        Err(e) => null(fail(&e)),
    }
}

#[no_mangle]
pub unsafe extern "C" fn ibv_resize_cq(cq: *mut ibv_cq, cqe: c_int) -> c_int {
    if cq.is_null() || cqe <= 0 {
        return libc::EINVAL;
    }
    // SAFETY: a CQ from ibv_create_cq.
    let c = unsafe { &mut *(cq as *mut UCq) };
    match c.inner.as_ref().unwrap().resize(cqe as u32) {
        Ok(()) => {
            c.cq.cqe = cqe;
            0
        }
        Err(e) => e.errno.0,
    }
}

/// 0, or an errno value also set in errno (EBUSY: a QP still uses it), as
/// rdma-core's (the kernel's CQ_DESTROY).
#[no_mangle]
pub unsafe extern "C" fn ibv_destroy_cq(cq: *mut ibv_cq) -> c_int {
    if cq.is_null() {
        return ret(libc::EINVAL);
    }
    // SAFETY: a CQ from ibv_create_cq.
    let c = unsafe { &mut *(cq as *mut UCq) };
    let Some(inner) = c.inner.take() else { return ret(libc::EINVAL) };
    match inner.destroy() {
        Ok(()) => {
            // SAFETY: the CQ's context and channel outlive it.
            let u = unsafe { UContext::from_ctx(c.cq.context) };
            u.cqs.lock().unwrap().remove(&c.cq.handle);
            // SAFETY: the CQ's own mutex, condition and counters: the
            // completion and asynchronous events delivered about it must be
            // acknowledged first (rdma-core's ibv_cmd_destroy_cq).
            unsafe {
                crate::events::wait_comp_acknowledged(
                    u,
                    cq as usize,
                    &mut c.cq.mutex,
                    &mut c.cq.cond,
                    &c.cq.comp_events_completed,
                );
                crate::events::wait_acknowledged(
                    u,
                    cq as usize,
                    &mut c.cq.mutex,
                    &mut c.cq.cond,
                    &c.cq.async_events_completed,
                )
            };
            // SAFETY: a CQ's channel is NULL or one of ours, alive while a
            // CQ uses it (destroy_comp_channel refuses EBUSY until then).
            if let Some(ch) = unsafe { (c.cq.channel as *mut UChannel).as_mut() } {
                ch.ch.refcnt -= 1;
            }
            // SAFETY: nothing refers to it any more.
            drop(unsafe { Box::from_raw(cq as *mut UCq) });
            0
        }
        Err((inner, e)) => {
            c.inner = Some(inner);
            ret(e.errno.0)
        }
    }
}

#[no_mangle]
pub unsafe extern "C" fn ibv_get_cq_event(
    ch: *mut ibv_comp_channel,
    cq: *mut *mut ibv_cq,
    cq_context: *mut *mut libc::c_void,
) -> c_int {
    if ch.is_null() || cq.is_null() || cq_context.is_null() {
        set_errno(libc::EINVAL);
        return -1;
    }
    // SAFETY: a channel from ibv_create_comp_channel.
    let c = unsafe { &*(ch as *const UChannel) };
    // SAFETY: the channel's context is ours.
    let u = unsafe { UContext::from_ctx(c.ch.context) };
    loop {
        let handle = match c.inner.as_ref().unwrap().get_event() {
            Ok(h) => h,
            Err(e) => {
                set_errno(e.errno.0);
                return -1;
            }
        };
        // An event raised while its CQ was being destroyed is not delivered.
        let Some(p) = u.cqs.lock().unwrap().get(&handle).map(|&p| {
            crate::events::comp_reported(u, p);
            p
        }) else {
            continue;
        };
        // SAFETY: out parameters, and a live CQ of this context.
        unsafe {
            *cq = p as *mut ibv_cq;
            *cq_context = (*(p as *mut ibv_cq)).cq_context;
        }
        return 0;
    }
}

#[no_mangle]
pub unsafe extern "C" fn ibv_ack_cq_events(cq: *mut ibv_cq, nevents: u32) {
    if cq.is_null() {
        return;
    }
    // SAFETY: a CQ from ibv_create_cq; the counter is guarded by its mutex.
    unsafe {
        let m = &mut (*cq).mutex as *mut _ as *mut libc::pthread_mutex_t;
        libc::pthread_mutex_lock(m);
        (*cq).comp_events_completed += nevents;
        libc::pthread_cond_broadcast(&mut (*cq).cond as *mut _ as *mut libc::pthread_cond_t);
        libc::pthread_mutex_unlock(m);
    }
}

fn qp_type_from(t: u32) -> Option<QpType> {
    QpType::from_raw(t)
}

#[no_mangle]
pub unsafe extern "C" fn ibv_create_qp(pd: *mut ibv_pd, attr: *mut ibv_qp_init_attr) -> *mut ibv_qp {
    if pd.is_null() || attr.is_null() {
        return null(libc::EINVAL);
    }
    // SAFETY: a PD from ibv_alloc_pd and the caller's attributes.
    let (p, a) = unsafe { (&*(pd as *const UPd), &mut *attr) };
    let Some(qp_type) = qp_type_from(a.qp_type) else {
        return null(libc::EOPNOTSUPP);
    };
    // An XRC_SEND QP has no receive side: its receive CQ may be NULL.
    let recv_cq = if qp_type == QpType::XrcSend && a.recv_cq.is_null() { a.send_cq } else { a.recv_cq };
    // SAFETY: CQs of ibv_create_cq(_ex), or NULL.
    let (Some(send), Some(recv)) =
        (unsafe { (a.send_cq as *const UCq).as_ref() }, unsafe { (recv_cq as *const UCq).as_ref() })
    else {
        return null(libc::EINVAL);
    };
    // SAFETY: an SRQ from ibv_create_srq, or NULL.
    let srq = unsafe { (a.srq as *const USrq).as_ref() }.and_then(|s| s.inner.as_ref());
    let c = &a.cap;
    let init = QpInitAttr {
        qp_type,
        send_cq: send.inner.as_ref().unwrap(),
        recv_cq: recv.inner.as_ref().unwrap(),
        srq,
        cap: QpCap {
            max_send_wr: c.max_send_wr.max(1),
            max_recv_wr: c.max_recv_wr.max(1),
            max_send_sge: c.max_send_sge.max(1),
            max_recv_sge: c.max_recv_sge.max(1),
            max_inline_data: c.max_inline_data,
        },
        sq_sig_all: a.sq_sig_all != 0,
        // mlx5dv_create_qp's DISABLE/ALLOW_SCATTER_TO_CQE, else the device's.
        scatter_to_cqe: SCATTER.with(|s| s.get()),
    };
    match p.inner.as_ref().unwrap().create_qp(&init) {
        // SAFETY: the caller's PD and attributes.
        Ok(qp) => unsafe { new_qp(p.pd.context, pd, a, qp) },
        Err(e) => null(fail(&e)),
    }
}

/// The `ibv_qp` of a created QP, with the `ibv_wr_*` builders of its type,
/// registered for asynchronous events; the capacities it got are written
/// back to `a.cap`. `pd` is NULL for an XRC_RECV QP.
pub(crate) unsafe fn new_qp(
    ctx: *mut ibv_context,
    pd: *mut ibv_pd,
    a: &mut ibv_qp_init_attr,
    qp: QueuePair,
) -> *mut ibv_qp {
    let qp_type = qp.qp_type();
    // SAFETY: ibv_qp_ex is plain old data plus function pointers (NULL).
    let mut raw: ibv_qp_ex = unsafe { std::mem::zeroed() };
    let q = &mut raw.qp_base;
    q.context = ctx;
    q.qp_context = a.qp_context;
    q.pd = pd;
    // The CQs and SRQ the QP has (an XRC half has not all).
    if qp_type != QpType::XrcRecv {
        q.send_cq = a.send_cq;
    }
    if !matches!(qp_type, QpType::XrcSend | QpType::XrcRecv) {
        q.recv_cq = a.recv_cq;
        q.srq = a.srq;
    }
    q.handle = qp.qp_num();
    q.qp_num = qp.qp_num();
    q.state = ibv_qp_state_IBV_QPS_RESET as _;
    q.qp_type = qp_type.to_raw();
    let cap = qp.cap();
    a.cap.max_send_wr = cap.max_send_wr;
    a.cap.max_recv_wr = cap.max_recv_wr;
    a.cap.max_send_sge = cap.max_send_sge;
    a.cap.max_recv_sge = cap.max_recv_sge;
    crate::qp_ex::set_ops(&mut raw, qp_type, crate::qp_ex::all_ops(qp_type));
    let b =
        Box::into_raw(Box::new(UQp { qp: raw, inner: Some(qp), batch: Default::default(), mlx5: Default::default() }));
    // SAFETY: fresh allocation; the context outlives it.
    unsafe {
        mutex_init(&mut (*b).qp.qp_base.mutex);
        cond_init(&mut (*b).qp.qp_base.cond);
        let u = UContext::from_ctx(ctx);
        u.qps.lock().unwrap().insert((*b).qp.qp_base.qp_num, b as usize);
    }
    b as *mut ibv_qp
}

#[no_mangle]
pub unsafe extern "C" fn ibv_qp_to_qp_ex(qp: *mut ibv_qp) -> *mut ibv_qp_ex {
    // Every QP of this library is the start of an ibv_qp_ex, with the
    // ibv_wr_* builders of its type (ibv_create_qp) or those asked for
    // (ibv_create_qp_ex's send_ops_flags): qp_ex.rs.
    qp as *mut ibv_qp_ex
}

fn gid_of(g: &ibv_gid) -> Gid {
    // SAFETY: reading the raw bytes of the union is always valid.
    Gid(unsafe { g.raw })
}

#[no_mangle]
pub unsafe extern "C" fn ibv_modify_qp(qp: *mut ibv_qp, attr: *mut ibv_qp_attr, mask: c_int) -> c_int {
    if qp.is_null() || attr.is_null() {
        return libc::EINVAL;
    }
    // SAFETY: a QP from ibv_create_qp and the caller's attributes.
    let (q, a) = unsafe { (&mut *(qp as *mut UQp), &*attr) };
    let Some(mask) = QpAttrMask::from_bits(mask as u32) else { return libc::EINVAL };
    let state = |v: u32| QpState::from_raw(v);
    let (Some(qp_state), Some(cur)) = (state(a.qp_state), state(a.cur_qp_state).or(Some(QpState::Reset))) else {
        return libc::EINVAL;
    };
    let path_mtu = match Mtu::from_raw(a.path_mtu) {
        Some(m) => m,
        None if !mask.contains(QpAttrMask::PATH_MTU) => Mtu::Mtu256,
        None => return libc::EINVAL,
    };
    let ah = &a.ah_attr;
    let attr = QpAttr {
        qp_state,
        cur_qp_state: cur,
        path_mtu,
        qkey: a.qkey,
        rq_psn: a.rq_psn,
        sq_psn: a.sq_psn,
        dest_qp_num: a.dest_qp_num,
        qp_access_flags: Access::from_bits_retain(a.qp_access_flags),
        cap: QpCap::default(),
        ah_attr: AddressVector {
            dgid: gid_of(&ah.grh.dgid),
            sgid_index: ah.grh.sgid_index,
            hop_limit: ah.grh.hop_limit,
            traffic_class: ah.grh.traffic_class,
            flow_label: ah.grh.flow_label,
            sl: ah.sl,
            port_num: ah.port_num,
            is_global: ah.is_global != 0,
        },
        pkey_index: a.pkey_index,
        en_sqd_async_notify: a.en_sqd_async_notify != 0,
        sq_draining: false,
        max_rd_atomic: a.max_rd_atomic,
        max_dest_rd_atomic: a.max_dest_rd_atomic,
        min_rnr_timer: a.min_rnr_timer,
        port_num: a.port_num,
        timeout: a.timeout,
        retry_cnt: a.retry_cnt,
        rnr_retry: a.rnr_retry,
    };
    let inner = q.inner.as_ref().unwrap();
    match inner.modify(&attr, mask) {
        Ok(()) => {
            q.qp.qp_base.state = inner.state().to_raw() as _;
            0
        }
        Err(e) => e.errno.0,
    }
}

#[no_mangle]
pub unsafe extern "C" fn ibv_query_qp(
    qp: *mut ibv_qp,
    attr: *mut ibv_qp_attr,
    _mask: c_int,
    init: *mut ibv_qp_init_attr,
) -> c_int {
    if qp.is_null() || attr.is_null() || init.is_null() {
        return libc::EINVAL;
    }
    // SAFETY: a QP from ibv_create_qp and the caller's out structs.
    let (q, a, i) = unsafe { (&*(qp as *const UQp), &mut *attr, &mut *init) };
    let s = q.inner.as_ref().unwrap().query();
    // SAFETY: plain old data.
    *a = unsafe { std::mem::zeroed() };
    a.qp_state = s.qp_state.to_raw();
    a.cur_qp_state = s.qp_state.to_raw();
    a.path_mtu = s.path_mtu.to_raw();
    a.qkey = s.qkey;
    a.rq_psn = s.rq_psn;
    a.sq_psn = s.sq_psn;
    a.dest_qp_num = s.dest_qp_num;
    a.qp_access_flags = s.qp_access_flags.bits();
    a.cap = ibv_qp_cap {
        max_send_wr: s.cap.max_send_wr,
        max_recv_wr: s.cap.max_recv_wr,
        max_send_sge: s.cap.max_send_sge,
        max_recv_sge: s.cap.max_recv_sge,
        max_inline_data: s.cap.max_inline_data,
    };
    a.ah_attr.grh.dgid.raw = s.ah_attr.dgid.0;
    a.ah_attr.grh.sgid_index = s.ah_attr.sgid_index;
    a.ah_attr.grh.hop_limit = s.ah_attr.hop_limit;
    a.ah_attr.grh.traffic_class = s.ah_attr.traffic_class;
    a.ah_attr.grh.flow_label = s.ah_attr.flow_label;
    a.ah_attr.is_global = s.ah_attr.is_global as u8;
    a.ah_attr.port_num = s.ah_attr.port_num;
    a.pkey_index = s.pkey_index;
    a.max_rd_atomic = s.max_rd_atomic;
    a.max_dest_rd_atomic = s.max_dest_rd_atomic;
    a.min_rnr_timer = s.min_rnr_timer;
    a.port_num = s.port_num;
    a.timeout = s.timeout;
    a.retry_cnt = s.retry_cnt;
    a.rnr_retry = s.rnr_retry;
    // SAFETY: plain old data.
    *i = unsafe { std::mem::zeroed() };
    let b = &q.qp.qp_base;
    i.qp_context = b.qp_context;
    i.send_cq = b.send_cq;
    i.recv_cq = b.recv_cq;
    i.srq = b.srq;
    i.cap = a.cap;
    i.qp_type = b.qp_type;
    0
}

#[no_mangle]
pub unsafe extern "C" fn ibv_destroy_qp(qp: *mut ibv_qp) -> c_int {
    if qp.is_null() {
        return libc::EINVAL;
    }
    // SAFETY: a QP from ibv_create_qp.
    let mut b = unsafe { Box::from_raw(qp as *mut UQp) };
    // SAFETY: its context outlives it.
    let u = unsafe { UContext::from_ctx(b.qp.qp_base.context) };
    // Out of the table first: no event is delivered about it after this.
    u.qps.lock().unwrap().remove(&b.qp.qp_base.qp_num);
    drop(b.inner.take());
    let base = &mut b.qp.qp_base;
    // SAFETY: the QP's own mutex, condition and counter.
    unsafe {
        crate::events::wait_acknowledged(u, qp as usize, &mut base.mutex, &mut base.cond, &base.events_completed)
    };
    drop(b);
    0
}

#[no_mangle]
pub unsafe extern "C" fn ibv_create_ah(pd: *mut ibv_pd, attr: *mut ibv_ah_attr) -> *mut ibv_ah {
    if pd.is_null() || attr.is_null() {
        return null(libc::EINVAL);
    }
    // SAFETY: a PD from ibv_alloc_pd and the caller's attributes.
    let (p, a) = unsafe { (&*(pd as *const UPd), &*attr) };
    let av = AddressVector {
        dgid: gid_of(&a.grh.dgid),
        sgid_index: a.grh.sgid_index,
        hop_limit: a.grh.hop_limit,
        traffic_class: a.grh.traffic_class,
        flow_label: a.grh.flow_label,
        sl: a.sl,
        port_num: a.port_num,
        is_global: a.is_global != 0,
    };
    match p.inner.as_ref().unwrap().create_ah(av) {
        Ok(ah) => {
            static NEXT: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(1);
            let raw =
                ibv_ah { context: p.pd.context, pd, handle: NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed) };
            let b = Box::into_raw(Box::new(UAh { ah: raw, av: ah.av, inner: Some(ah) }));
            // SAFETY: the PD's context is ours.
            unsafe { UContext::from_ctx(p.pd.context) }.ahs.lock().unwrap().insert(b as usize);
            b as *mut ibv_ah
        }
        Err(e) => null(fail(&e)),
    }
}

#[no_mangle]
pub unsafe extern "C" fn ibv_destroy_ah(ah: *mut ibv_ah) -> c_int {
    if ah.is_null() {
        return libc::EINVAL;
    }
    // SAFETY: an AH from ibv_create_ah.
    let b = unsafe { Box::from_raw(ah as *mut UAh) };
    // SAFETY: its context outlives it.
    unsafe { UContext::from_ctx(b.ah.context) }.ahs.lock().unwrap().remove(&(ah as usize));
    drop(b);
    0
}

/// `ibv_rereg_mr`: 0, or an `IBV_REREG_MR_ERR_*` code with errno set
/// (-1: input error found before anything changed, -4: the device refused).
#[no_mangle]
pub unsafe extern "C" fn ibv_rereg_mr(
    mr: *mut ibv_mr,
    flags: c_int,
    pd: *mut ibv_pd,
    addr: *mut libc::c_void,
    length: usize,
    access: c_int,
) -> c_int {
    const TRANSLATION: c_int = 1;
    const PD: c_int = 2;
    const ACCESS: c_int = 4;
    const ERR_INPUT: c_int = -1;
    const ERR_CMD: c_int = -4;
    if mr.is_null() || flags & !7 != 0 {
        set_errno(libc::EINVAL);
        return ERR_INPUT;
    }
    if (flags & TRANSLATION != 0 && (length == 0 || addr.is_null())) || (flags & ACCESS == 0 && access != 0) {
        set_errno(libc::EINVAL);
        return ERR_INPUT;
    }
    if flags == 0 {
        set_errno(libc::EINVAL);
        return ERR_CMD;
    }
    // SAFETY: an MR from ibv_reg_mr.
    let m = unsafe { &mut *(mr as *mut UMr) };
    let Some(inner) = m.inner.as_mut() else {
        set_errno(libc::EINVAL);
        return ERR_INPUT;
    };
    if flags & PD != 0 {
        // SAFETY: a PD from ibv_alloc_pd, or NULL.
        let Some(p) = (unsafe { (pd as *const UPd).as_ref() }) else {
            set_errno(libc::EINVAL);
            return ERR_CMD;
        };
        if let Err(e) = inner.rereg_pd(p.inner.as_ref().unwrap()) {
            set_errno(e.errno.0);
            return ERR_CMD;
        }
        m.mr.pd = pd;
        m.mr.context = p.pd.context;
    }
    if flags & ACCESS != 0 {
        if let Err(e) = inner.rereg_access(Access::from_bits_retain(access as u32)) {
            set_errno(e.errno.0);
            return ERR_CMD;
        }
    }
    if flags & TRANSLATION != 0 {
        // SAFETY: the verbs contract: the new range stays valid until dereg.
        if let Err(e) = unsafe { inner.rereg_raw(addr as *mut u8, length, addr as u64) } {
            set_errno(e.errno.0);
            return ERR_CMD;
        }
        m.mr.addr = addr;
        m.mr.length = length;
    }
    m.mr.lkey = inner.lkey();
    m.mr.rkey = inner.rkey();
    0
}

/// `ibv_query_qp_data_in_order`: 0, "no guarantee" (uroce places data in
/// PSN order, but makes no promise to applications yet).
#[no_mangle]
pub extern "C" fn ibv_query_qp_data_in_order(_qp: *mut ibv_qp, _op: u32, _flags: u32) -> c_int {
    0
}

/// `verbs_context.create_qp_ex`. verbs.h's inline sends a `comp_mask` of
/// only `IBV_QP_INIT_ATTR_PD` to `ibv_create_qp` directly.
pub unsafe extern "C" fn create_qp_ex(ctx: *mut ibv_context, attr: *mut ibv_qp_init_attr_ex) -> *mut ibv_qp {
    if ctx.is_null() || attr.is_null() {
        return null(libc::EINVAL);
    }
    // SAFETY: the caller's attributes.
    let a = unsafe { &mut *attr };
    if a.comp_mask & !crate::qp_ex::COMP_MASK_SUP != 0
        || (a.comp_mask & ibv_qp_init_attr_mask_IBV_QP_INIT_ATTR_CREATE_FLAGS != 0 && a.create_flags != 0)
    {
        return null(libc::EOPNOTSUPP);
    }
    let Some(t) = QpType::from_raw(a.qp_type) else { return null(libc::EOPNOTSUPP) };
    let with_ops = a.comp_mask & ibv_qp_init_attr_mask_IBV_QP_INIT_ATTR_SEND_OPS_FLAGS != 0;
    if with_ops && a.send_ops_flags & !crate::qp_ex::all_ops(t) != 0 {
        return null(libc::EOPNOTSUPP);
    }
    if t == QpType::XrcRecv {
        // An XRC target is created in an XRC domain, without PD, CQs or queues.
        // SAFETY: an XRC domain of open_xrcd, or NULL.
        let xrcd = unsafe { crate::handles::UXrcd::from_ptr(a.xrcd) };
        let Some(x) = xrcd.filter(|_| a.comp_mask & ibv_qp_init_attr_mask_IBV_QP_INIT_ATTR_XRCD != 0) else {
            return null(libc::EINVAL);
        };
        return match x.create_recv_qp() {
            // SAFETY: ibv_qp_init_attr is the start of ibv_qp_init_attr_ex.
            Ok(qp) => unsafe { new_qp(ctx, std::ptr::null_mut(), &mut *(attr as *mut _), qp) },
            Err(e) => null(fail(&e)),
        };
    }
    if a.comp_mask & ibv_qp_init_attr_mask_IBV_QP_INIT_ATTR_PD == 0 || a.pd.is_null() {
        return null(libc::EINVAL);
    }
    // ibv_qp_init_attr is the start of ibv_qp_init_attr_ex (verbs.h's inline
    // makes the same cast).
    // SAFETY: a PD from ibv_alloc_pd and the caller's attributes.
    let qp = unsafe { ibv_create_qp(a.pd, attr as *mut ibv_qp_init_attr) };
    if !qp.is_null() {
        // SAFETY: a fresh QP of ibv_create_qp, not yet known to the caller.
        let q = unsafe { &mut *(qp as *mut UQp) };
        crate::qp_ex::set_ops(&mut q.qp, t, if with_ops { a.send_ops_flags } else { 0 });
    }
    qp
}
