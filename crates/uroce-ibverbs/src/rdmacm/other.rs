//! The librdmacm exports that fail cleanly, and the few that need no CM:
//! rsockets are not implemented (`rsocket` fails ENOSYS, so no rsocket fd
//! can exist and the calls on one fail EBADF), except `rpoll`/`rselect`,
//! which on ordinary fds are `poll`/`select` (rping and the other examples
//! poll their channel with them); multicast and ECE options fail
//! EOPNOTSUPP;
//! `rdma_get_devices` lists the contexts the CM uses.

use crate::errno::set_errno;
use crate::ffi::*;
use std::ffi::c_int;

macro_rules! failing {
    ($errno:expr => $($name:ident),* $(,)?) => {
        $(
            #[no_mangle]
            pub extern "C" fn $name() -> isize {
                set_errno($errno);
                -1
            }
        )*
    };
}

failing!(libc::ENOSYS => uroce_cm_rsocket);
failing!(libc::EBADF =>
    uroce_cm_rbind, uroce_cm_rlisten, uroce_cm_raccept, uroce_cm_rconnect, uroce_cm_rshutdown, uroce_cm_rclose,
    uroce_cm_rrecv, uroce_cm_rrecvfrom, uroce_cm_rrecvmsg, uroce_cm_rsend, uroce_cm_rsendto, uroce_cm_rsendmsg,
    uroce_cm_rread, uroce_cm_rreadv, uroce_cm_rwrite, uroce_cm_rwritev, uroce_cm_rgetpeername, uroce_cm_rgetsockname,
    uroce_cm_rsetsockopt, uroce_cm_rgetsockopt, uroce_cm_rfcntl, uroce_cm_riomap, uroce_cm_riounmap, uroce_cm_riowrite,
);
failing!(libc::EOPNOTSUPP =>
    uroce_cm_rdma_join_multicast, uroce_cm_rdma_join_multicast_ex, uroce_cm_rdma_leave_multicast,
    uroce_cm_rdma_get_remote_ece, uroce_cm_rdma_set_local_ece,
);

#[no_mangle]
pub unsafe extern "C" fn uroce_cm_rpoll(fds: *mut libc::pollfd, nfds: libc::nfds_t, timeout: c_int) -> c_int {
    // SAFETY: forwarded: no rsocket exists, every fd is the kernel's.
    unsafe { libc::poll(fds, nfds, timeout) }
}

#[no_mangle]
pub unsafe extern "C" fn uroce_cm_rselect(
    n: c_int,
    r: *mut libc::fd_set,
    w: *mut libc::fd_set,
    e: *mut libc::fd_set,
    t: *mut libc::timeval,
) -> c_int {
    // SAFETY: forwarded, as rpoll.
    unsafe { libc::select(n, r, w, e, t) }
}

#[no_mangle]
pub unsafe extern "C" fn uroce_cm_rdma_get_devices(num: *mut c_int) -> *mut *mut ibv_context {
    let ctxs: Vec<usize> = {
        let mut g = super::lock();
        let _ = super::dev::device_for(&mut g, None);
        g.devs.iter().map(|d| d.ctx).collect()
    };
    // SAFETY: n+1 pointers, freed by rdma_free_devices.
    let list = unsafe { libc::calloc(ctxs.len() + 1, std::mem::size_of::<usize>()) } as *mut *mut ibv_context;
    if list.is_null() {
        set_errno(libc::ENOMEM);
        return list;
    }
    for (i, c) in ctxs.iter().enumerate() {
        // SAFETY: i < len.
        unsafe { *list.add(i) = *c as *mut ibv_context };
    }
    if !num.is_null() {
        // SAFETY: the caller's int.
        unsafe { *num = ctxs.len() as c_int };
    }
    list
}

#[no_mangle]
pub unsafe extern "C" fn uroce_cm_rdma_free_devices(list: *mut *mut ibv_context) {
    // SAFETY: from rdma_get_devices (calloc) or NULL.
    unsafe { libc::free(list as *mut libc::c_void) };
}
