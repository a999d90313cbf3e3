//! Asynchronous events through the C ABI: `ibv_get_async_event`,
//! `ibv_ack_async_event`, and the wait of `ibv_destroy_qp`/`_cq`/`_srq` for
//! the events delivered about the object to be acknowledged. As the kernel
//! with rdma-core: no event is delivered for an object already destroyed
//! (the core discards its queued events, and one whose object left the
//! context's tables meanwhile is skipped), and each delivery is counted
//! (the kernel's `events_reported`) so that destroying waits until the
//! application has acknowledged as many (`events_completed`).

use crate::errno::set_errno;
use crate::ffi::*;
use crate::handles::UContext;
use std::ffi::c_int;
use uroce::verbs::EventElement as El;

/// Counts an event delivered about the object at `ptr` (called with the
/// table that holds it locked, so that a destroyer that took it out of the
/// table sees every count).
fn reported(u: &UContext, ptr: usize) {
    *u.events_reported.lock().unwrap().entry(ptr).or_insert(0) += 1;
}

#[no_mangle]
pub unsafe extern "C" fn ibv_get_async_event(ctx: *mut ibv_context, event: *mut ibv_async_event) -> c_int {
    if ctx.is_null() || event.is_null() {
        set_errno(libc::EINVAL);
        return -1;
    }
    // SAFETY: our context.
    let u = unsafe { UContext::from_ctx(ctx) };
    loop {
        let ev = match u.ctx.get_async_event() {
            Ok(ev) => ev,
            Err(e) => {
                set_errno(e.errno.0);
                return -1;
            }
        };
        // SAFETY: the caller's event struct (plain old data).
        let e = unsafe { &mut *event };
        e.event_type = ev.kind.to_raw();
        // The object, if it is still in this context's tables (else it was
        // destroyed after the event was queued: skipped, as the kernel).
        let found = match ev.element {
            El::Qp(n) => {
                let t = u.qps.lock().unwrap();
                t.get(&n).map(|&p| {
                    reported(u, p);
                    e.element.qp = p as *mut ibv_qp;
                })
            }
            El::Cq(h) => {
                let t = u.cqs.lock().unwrap();
                t.get(&h).map(|&p| {
                    reported(u, p);
                    e.element.cq = p as *mut ibv_cq;
                })
            }
            El::Srq(h) => {
                let t = u.srqs.lock().unwrap();
                t.get(&h).map(|&p| {
                    reported(u, p);
                    e.element.srq = p as *mut ibv_srq;
                })
            }
            El::Port(p) => {
                e.element.port_num = c_int::from(p);
                Some(())
            }
        };
        if found.is_some() {
            return 0;
        }
    }
}

/// The object an event is about and the counter its acknowledgement
/// advances (rdma-core's `ibv_ack_async_event`).
#[allow(non_upper_case_globals)] // bindgen's names of the C enum
unsafe fn completed_counter(e: &ibv_async_event) -> Option<(*mut pthread_mutex_t, *mut pthread_cond_t, *mut u32)> {
    // SAFETY: the union member the event type selects, a live object of
    // this library (the application acknowledges before destroying).
    unsafe {
        match e.event_type {
            ibv_event_type_IBV_EVENT_CQ_ERR => {
                let cq = e.element.cq.as_mut()?;
                Some((&mut cq.mutex, &mut cq.cond, &mut cq.async_events_completed))
            }
            ibv_event_type_IBV_EVENT_QP_FATAL
            | ibv_event_type_IBV_EVENT_QP_REQ_ERR
            | ibv_event_type_IBV_EVENT_QP_ACCESS_ERR
            | ibv_event_type_IBV_EVENT_COMM_EST
            | ibv_event_type_IBV_EVENT_SQ_DRAINED
            | ibv_event_type_IBV_EVENT_PATH_MIG
            | ibv_event_type_IBV_EVENT_PATH_MIG_ERR
            | ibv_event_type_IBV_EVENT_QP_LAST_WQE_REACHED => {
                let qp = e.element.qp.as_mut()?;
                Some((&mut qp.mutex, &mut qp.cond, &mut qp.events_completed))
            }
            ibv_event_type_IBV_EVENT_SRQ_ERR | ibv_event_type_IBV_EVENT_SRQ_LIMIT_REACHED => {
                let srq = e.element.srq.as_mut()?;
                Some((&mut srq.mutex, &mut srq.cond, &mut srq.events_completed))
            }
            _ => None,
        }
    }
}

#[no_mangle]
pub unsafe extern "C" fn ibv_ack_async_event(event: *mut ibv_async_event) {
    // SAFETY: the caller's event, as ibv_get_async_event filled it.
    let Some((m, c, n)) = (unsafe { event.as_ref().and_then(|e| completed_counter(e)) }) else { return };
    // SAFETY: the object's mutex, condition and counter (initialised at creation).
    unsafe {
        libc::pthread_mutex_lock(m.cast());
        *n += 1;
        libc::pthread_cond_broadcast(c.cast());
        libc::pthread_mutex_unlock(m.cast());
    }
}

/// After the object at `ptr` left its context's table: waits until the
/// events delivered about it are acknowledged (`*completed` reaches the
/// count), as rdma-core's `ibv_destroy_*` wait for `events_reported`.
pub(crate) unsafe fn wait_acknowledged(
    u: &UContext,
    ptr: usize,
    m: *mut pthread_mutex_t,
    c: *mut pthread_cond_t,
    completed: *const u32,
) {
    // SAFETY: the caller's contract.
    unsafe { wait_for(&u.events_reported, ptr, m, c, completed) }
}

/// The same for the completion events `ibv_get_cq_event` delivered about
/// the CQ at `ptr` and `ibv_ack_cq_events` acknowledges
/// (`comp_events_completed`), as rdma-core's `ibv_destroy_cq`.
pub(crate) unsafe fn wait_comp_acknowledged(
    u: &UContext,
    ptr: usize,
    m: *mut pthread_mutex_t,
    c: *mut pthread_cond_t,
    completed: *const u32,
) {
    // SAFETY: the caller's contract.
    unsafe { wait_for(&u.comp_reported, ptr, m, c, completed) }
}

/// Counts a completion event delivered about the CQ at `ptr` (called with
/// the context's CQ table locked).
pub(crate) fn comp_reported(u: &UContext, ptr: usize) {
    *u.comp_reported.lock().unwrap().entry(ptr).or_insert(0) += 1;
}

unsafe fn wait_for(
    counts: &std::sync::Mutex<std::collections::HashMap<usize, u32>>,
    ptr: usize,
    m: *mut pthread_mutex_t,
    c: *mut pthread_cond_t,
    completed: *const u32,
) {
    let Some(want) = counts.lock().unwrap().remove(&ptr) else { return };
    // SAFETY: the object's mutex, condition and counter, alive until the
    // caller frees it after this returns.
    unsafe {
        libc::pthread_mutex_lock(m.cast());
        while std::ptr::read_volatile(completed) < want {
            libc::pthread_cond_wait(c.cast(), m.cast());
        }
        libc::pthread_mutex_unlock(m.cast());
    }
}
