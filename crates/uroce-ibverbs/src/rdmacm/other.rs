//! The librdmacm exports that fail cleanly, and the few that need no CM:
//! multicast and ECE options fail EOPNOTSUPP;
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

failing!(libc::EOPNOTSUPP =>
    uroce_cm_rdma_join_multicast, uroce_cm_rdma_join_multicast_ex, uroce_cm_rdma_leave_multicast,
    uroce_cm_rdma_get_remote_ece, uroce_cm_rdma_set_local_ece,
);

#[no_mangle]
pub unsafe extern "C" fn uroce_cm_rdma_get_devices(num: *mut c_int) -> *mut *mut ibv_context {
    let ctxs: Vec<usize> = {
        let mut g = super::state::lock();
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
