//! PeerDirect device memory from C (`uroce_peer_alloc`, `uroce_peer_free`,
//! `uroce_peer_memcpy_to/from`): allocation of a loaded peer-memory client's
//! device memory — e.g. a `[[peers.storage]]` device of the configuration —
//! returning a device address that a plain `ibv_reg_mr` registers through
//! that client, as OFED's core "transparently selects the appropriate peer
//! memory client". The CPU cannot dereference the address (as a GPU
//! pointer); the copy functions are the host's access (`cudaMemcpy`).

use crate::errno::{null, set_errno};
use std::ffi::{c_char, c_int, c_void, CStr};
use uroce::mem::peer;

/// 0, or sets errno and returns it.
fn ret(r: uroce::ib::Result<()>) -> c_int {
    match r {
        Ok(()) => 0,
        Err(e) => crate::errno::fail(&e),
    }
}

#[no_mangle]
pub unsafe extern "C" fn uroce_peer_alloc(client: *const c_char, length: usize) -> *mut c_void {
    if client.is_null() || length == 0 {
        return null(libc::EINVAL);
    }
    // SAFETY: the caller passes a NUL-terminated string.
    let Ok(name) = unsafe { CStr::from_ptr(client) }.to_str() else { return null(libc::EINVAL) };
    if name.len() > 63 {
        return null(libc::EINVAL);
    }
    peer::loader::ensure_loaded();
    match peer::alloc_memory(name, length as u64) {
        Ok(addr) => addr as *mut c_void,
        Err(e) => null(crate::errno::fail(&e)),
    }
}

#[no_mangle]
pub unsafe extern "C" fn uroce_peer_free(addr: *mut c_void) -> c_int {
    if addr.is_null() {
        set_errno(libc::EINVAL);
        return libc::EINVAL;
    }
    ret(peer::free_memory(addr as u64))
}

#[no_mangle]
pub unsafe extern "C" fn uroce_peer_memcpy_to(dst: *mut c_void, src: *const c_void, length: usize) -> c_int {
    if src.is_null() && length > 0 {
        set_errno(libc::EINVAL);
        return libc::EINVAL;
    }
    let data: &[u8] = if length == 0 {
        &[]
    } else {
        // SAFETY: the caller passes `length` readable host bytes at `src`.
        unsafe { std::slice::from_raw_parts(src as *const u8, length) }
    };
    ret(peer::copy_to_memory(dst as u64, data))
}

#[no_mangle]
pub unsafe extern "C" fn uroce_peer_memcpy_from(dst: *mut c_void, src: *const c_void, length: usize) -> c_int {
    if dst.is_null() && length > 0 {
        set_errno(libc::EINVAL);
        return libc::EINVAL;
    }
    let out: &mut [u8] = if length == 0 {
        &mut []
    } else {
        // SAFETY: the caller passes `length` writable host bytes at `dst`.
        unsafe { std::slice::from_raw_parts_mut(dst as *mut u8, length) }
    };
    ret(peer::copy_from_memory(src as u64, out))
}
