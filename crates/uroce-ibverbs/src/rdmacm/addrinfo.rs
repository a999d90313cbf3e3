//! `rdma_getaddrinfo` / `rdma_freeaddrinfo` (`rc/addrinfo.c`): the
//! system's `getaddrinfo` for the name, its first result as the
//! destination (or, with RAI_PASSIVE, the source), RC/RDMA_PS_TCP for
//! stream sockets and UD/RDMA_PS_UDP for datagrams. GID = IP address, so
//! no route or path record is attached.

use crate::errno::set_errno;
use crate::ffi::cma::*;
use crate::ffi::*;
use std::ffi::{c_char, c_int};

unsafe fn dup_addr(sa: *const libc::sockaddr, len: libc::socklen_t) -> *mut libc::sockaddr {
    // SAFETY: a fresh allocation of `len` bytes, filled from the caller's address.
    unsafe {
        let p = libc::calloc(1, len as usize) as *mut libc::sockaddr;
        if !p.is_null() {
            std::ptr::copy_nonoverlapping(sa as *const u8, p as *mut u8, len as usize);
        }
        p
    }
}

fn sa_len(family: c_int) -> libc::socklen_t {
    (if family == libc::AF_INET6 {
        std::mem::size_of::<libc::sockaddr_in6>()
    } else {
        std::mem::size_of::<libc::sockaddr_in>()
    }) as libc::socklen_t
}

#[no_mangle]
pub unsafe extern "C" fn uroce_cm_rdma_getaddrinfo(
    node: *const c_char,
    service: *const c_char,
    hints: *const rdma_addrinfo,
    res: *mut *mut rdma_addrinfo,
) -> c_int {
    if res.is_null() || (node.is_null() && service.is_null() && hints.is_null()) {
        set_errno(libc::EINVAL);
        return -1;
    }
    // SAFETY: the caller's hints or NULL.
    let h = unsafe { hints.as_ref() };
    let flags = h.map_or(0, |h| h.ai_flags);
    let passive = flags & RAI_PASSIVE as c_int != 0;
    // SAFETY: all-zero is a valid addrinfo.
    let mut ai: libc::addrinfo = unsafe { std::mem::zeroed() };
    ai.ai_flags = if passive { libc::AI_PASSIVE } else { 0 }
        | if flags & RAI_NUMERICHOST as c_int != 0 { libc::AI_NUMERICHOST } else { 0 };
    ai.ai_family = h.map_or(0, |h| h.ai_family);
    let qpt = h.map_or(0, |h| h.ai_qp_type);
    let ps = h.map_or(0, |h| h.ai_port_space);
    let dgram = qpt == ibv_qp_type_IBV_QPT_UD as c_int || ps == rdma_port_space_RDMA_PS_UDP as c_int;
    ai.ai_socktype = if dgram { libc::SOCK_DGRAM } else { libc::SOCK_STREAM };
    // SAFETY: all-zero is a valid rdma_addrinfo.
    let mut r: Box<rdma_addrinfo> = Box::new(unsafe { std::mem::zeroed() });
    r.ai_flags = flags;
    r.ai_qp_type = if qpt != 0 {
        qpt
    } else if dgram {
        ibv_qp_type_IBV_QPT_UD as c_int
    } else {
        ibv_qp_type_IBV_QPT_RC as c_int
    };
    r.ai_port_space = if ps != 0 {
        ps
    } else if dgram {
        rdma_port_space_RDMA_PS_UDP as c_int
    } else {
        rdma_port_space_RDMA_PS_TCP as c_int
    };
    if !node.is_null() || !service.is_null() {
        let mut out: *mut libc::addrinfo = std::ptr::null_mut();
        // SAFETY: the caller's strings; our hints.
        let e = unsafe { libc::getaddrinfo(node, service, &ai, &mut out) };
        if e != 0 {
            return e;
        }
        // SAFETY: getaddrinfo's first result.
        unsafe {
            let a = &*out;
            r.ai_family = a.ai_family;
            let p = dup_addr(a.ai_addr, a.ai_addrlen);
            if passive {
                r.ai_src_addr = p as *mut sockaddr;
                r.ai_src_len = a.ai_addrlen;
            } else {
                r.ai_dst_addr = p as *mut sockaddr;
                r.ai_dst_len = a.ai_addrlen;
            }
            libc::freeaddrinfo(out);
        }
    }
    if let Some(h) = h {
        // SAFETY: the caller's addresses.
        unsafe {
            if r.ai_src_addr.is_null() && !h.ai_src_addr.is_null() {
                let fam = (*h.ai_src_addr).sa_family as c_int;
                let len = if h.ai_src_len > 0 { h.ai_src_len } else { sa_len(fam) };
                r.ai_src_addr = dup_addr(h.ai_src_addr as *const libc::sockaddr, len) as *mut sockaddr;
                r.ai_src_len = len;
                if r.ai_family == 0 {
                    r.ai_family = fam;
                }
            }
            if r.ai_dst_addr.is_null() && !h.ai_dst_addr.is_null() {
                let fam = (*h.ai_dst_addr).sa_family as c_int;
                let len = if h.ai_dst_len > 0 { h.ai_dst_len } else { sa_len(fam) };
                r.ai_dst_addr = dup_addr(h.ai_dst_addr as *const libc::sockaddr, len) as *mut sockaddr;
                r.ai_dst_len = len;
                // With neither node nor service, the family is the hints'
                // addresses' (libfabric resolves a peer this way).
                if r.ai_family == 0 {
                    r.ai_family = fam;
                }
            }
            if r.ai_family == 0 {
                r.ai_family = h.ai_family;
            }
        }
    }
    // SAFETY: the caller's out pointer; freed by rdma_freeaddrinfo.
    unsafe { *res = Box::into_raw(r) };
    0
}

#[no_mangle]
pub unsafe extern "C" fn uroce_cm_rdma_freeaddrinfo(res: *mut rdma_addrinfo) {
    let mut p = res;
    while !p.is_null() {
        // SAFETY: a list from rdma_getaddrinfo (one Box each, addresses calloc'd).
        let r = unsafe { Box::from_raw(p) };
        // SAFETY: as above.
        unsafe {
            libc::free(r.ai_src_addr as *mut libc::c_void);
            libc::free(r.ai_dst_addr as *mut libc::c_void);
        }
        p = r.ai_next;
    }
}
