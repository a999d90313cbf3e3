//! Object import (`ibv_import_device`, `ibv_import_pd`, `ibv_import_mr`,
//! `ibv_import_dm` and the `ibv_unimport_*` calls): several `ibv_context`s
//! sharing one context's objects.
//!
//! With a kernel, a context is an open file of `/dev/infiniband/uverbsN` (its
//! `cmd_fd`) and every object created through it is a kernel object of that
//! file, named by a handle. A context built on a duplicate of the descriptor
//! (`ibv_import_device`) reaches the same objects, and `ibv_import_*` makes
//! user-space structs that name them by handle. Here [`ContextFile`](crate::handles::ContextFile) plays the
//! open file: `ibv_open_device` creates one, with a memfd of its own as the
//! `cmd_fd`, so that any duplicate of the descriptor names the context by the
//! memfd's device and inode numbers. PDs, MRs and DMs created through a context
//! are entered in a process-wide table under their handles, with the file
//! they belong to.
//!
//! Lifetime, as with the kernel:
//! - an object lives until it is destroyed (`ibv_dealloc_pd`, `ibv_dereg_mr`,
//!   `ibv_free_dm`) through any struct naming it, the one that created it or an
//!   imported one, or until the last context of its file is closed. Imported
//!   structs are not users: they never make a destroy fail with EBUSY;
//! - `ibv_unimport_*` frees one struct and leaves the object alone, the
//!   creating struct included (the object can still be imported and destroyed);
//! - once the object is destroyed, its other structs may only be unimported
//!   (rdma-core's rule). They stay memory-safe: a PD struct still holds the PD,
//!   an MR struct's keys are dead (accesses through them fail), a DM struct
//!   still holds the memory;
//! - `ibv_close_device` closes the context's `cmd_fd` (an imported context's is
//!   the descriptor it was imported from); the objects stay while another
//!   context of the file is open.
//!
//! Handles are unique in the process. An unknown handle is ENOENT, a handle of
//! another kind of object EINVAL (the kernel's lookup errors). Importing needs
//! the objects in this process: the `cmd_fd` of a uroce context passed to
//! another process (or whose contexts are all closed) cannot be imported
//! (EOPNOTSUPP). Other descriptors fail as with rdma-core 44: EINVAL when fstat
//! fails or the file is no character device, ENODEV for a character device
//! that is no verbs device.

use crate::dm_memory::UDm;
use crate::errno::null;
use crate::ffi::*;
use crate::handles::{Share, UMr, UPd};
use crate::share::{file_id, fstat, is_context_memfd, new_pd, registry, Entry, Object};
use std::ffi::c_int;
use std::os::fd::{FromRawFd, OwnedFd};
use std::sync::Weak;

/// `ibv_import_device`: a new context on the file `cmd_fd` names; it owns
/// `cmd_fd` (ibv_close_device closes it).
#[no_mangle]
pub unsafe extern "C" fn ibv_import_device(cmd_fd: c_int) -> *mut ibv_context {
    let Some(st) = fstat(cmd_fd) else { return null(libc::EINVAL) };
    let file = registry().files.get(&(st.st_dev, st.st_ino)).and_then(Weak::upgrade);
    let Some(file) = file else {
        let e = if is_context_memfd(cmd_fd) {
            libc::EOPNOTSUPP
        } else if st.st_mode & libc::S_IFMT == libc::S_IFCHR {
            libc::ENODEV
        } else {
            libc::EINVAL
        };
        return null(e);
    };
    // SAFETY: as with libibverbs, the caller hands the (duplicated)
    // descriptor over to the new context.
    let cmd_fd = unsafe { OwnedFd::from_raw_fd(cmd_fd) };
    let (dev, ctx) = (file.device as *mut ibv_device, file.ctx.clone());
    // SAFETY: the device of a context of this library.
    unsafe { crate::device::new_context(dev, ctx, Share { file, cmd_fd }) }
}

#[no_mangle]
pub unsafe extern "C" fn ibv_import_pd(ctx: *mut ibv_context, pd_handle: u32) -> *mut ibv_pd {
    if ctx.is_null() {
        return null(libc::EINVAL);
    }
    // SAFETY: a context of this library.
    let file = unsafe { file_id(ctx) };
    match registry().find(file, pd_handle) {
        Ok(Object::Pd { pd, structs }) => {
            let p = new_pd(ctx, pd_handle, pd.clone());
            structs.insert(p as usize);
            p
        }
        Ok(_) => null(libc::EINVAL),
        Err(e) => null(e),
    }
}

#[no_mangle]
pub unsafe extern "C" fn ibv_unimport_pd(pd: *mut ibv_pd) {
    if pd.is_null() {
        return;
    }
    // SAFETY: a PD of this library.
    let handle = unsafe { (*pd).handle };
    if let Some(Entry { obj: Object::Pd { structs, .. }, .. }) = registry().objects.get_mut(&handle) {
        structs.remove(&(pd as usize));
    }
    // SAFETY: the application gives the struct up; the PD lives on in the
    // table (or in the objects using it).
    drop(unsafe { Box::from_raw(pd as *mut UPd) });
}

/// `ibv_import_mr`: a copy of the MR `mr_handle` names in `pd`'s context
/// file, with its current keys and length and a NULL `addr` (as rdma-core).
#[no_mangle]
pub unsafe extern "C" fn ibv_import_mr(pd: *mut ibv_pd, mr_handle: u32) -> *mut ibv_mr {
    if pd.is_null() {
        return null(libc::EINVAL);
    }
    // SAFETY: a PD of this library.
    let ctx = unsafe { (*pd).context };
    // SAFETY: its context is ours.
    let file = unsafe { file_id(ctx) };
    match registry().find(file, mr_handle) {
        Ok(Object::Mr { primary, copies, .. }) => {
            // SAFETY: the primary struct lives while its entry does (the
            // table's lock is held).
            let orig = unsafe { &(*(*primary as *const UMr)).mr };
            let mr = ibv_mr {
                context: ctx,
                pd,
                addr: std::ptr::null_mut(),
                length: orig.length,
                handle: mr_handle,
                lkey: orig.lkey,
                rkey: orig.rkey,
            };
            let p = Box::into_raw(Box::new(UMr { mr, inner: None, dm: None }));
            copies.insert(p as usize);
            p as *mut ibv_mr
        }
        Ok(_) => null(libc::EINVAL),
        Err(e) => null(e),
    }
}

#[no_mangle]
pub unsafe extern "C" fn ibv_unimport_mr(mr: *mut ibv_mr) {
    if mr.is_null() {
        return;
    }
    let key = mr as usize;
    // SAFETY: an MR of this library.
    let handle = unsafe { (*mr).handle };
    {
        let mut reg = registry();
        if let Some(Entry { obj: Object::Mr { primary, released, copies }, .. }) = reg.objects.get_mut(&handle) {
            if *primary == key && !*released {
                // The region stays registered; the table keeps its struct.
                *released = true;
                return;
            }
            copies.remove(&key);
        }
    }
    // SAFETY: a copy, or a struct whose MR is gone: the application gives
    // it up.
    drop(unsafe { Box::from_raw(mr as *mut UMr) });
}

#[no_mangle]
pub unsafe extern "C" fn ibv_import_dm(ctx: *mut ibv_context, dm_handle: u32) -> *mut ibv_dm {
    if ctx.is_null() {
        return null(libc::EINVAL);
    }
    // SAFETY: a context of this library.
    let file = unsafe { file_id(ctx) };
    match registry().find(file, dm_handle) {
        Ok(Object::Dm { alloc, structs }) => {
            let p = Box::into_raw(Box::new(UDm::new(ctx, dm_handle, alloc.clone())));
            structs.insert(p as usize);
            p as *mut ibv_dm
        }
        Ok(_) => null(libc::EINVAL),
        Err(e) => null(e),
    }
}

#[no_mangle]
pub unsafe extern "C" fn ibv_unimport_dm(dm: *mut ibv_dm) {
    if dm.is_null() {
        return;
    }
    // SAFETY: a DM of this library.
    let handle = unsafe { (*dm).handle };
    if let Some(Entry { obj: Object::Dm { structs, .. }, .. }) = registry().objects.get_mut(&handle) {
        structs.remove(&(dm as usize));
    }
    // SAFETY: the application gives the struct up; the memory lives on in
    // the table and the regions over it.
    drop(unsafe { Box::from_raw(dm as *mut UDm) });
}
