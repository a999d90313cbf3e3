//! Object import (`ibv_import_device`, `ibv_import_pd`, `ibv_import_mr`,
//! `ibv_import_dm` and the `ibv_unimport_*` calls): several `ibv_context`s
//! sharing one context's objects.
//!
//! With a kernel, a context is an open file of `/dev/infiniband/uverbsN` (its
//! `cmd_fd`) and every object created through it is a kernel object of that
//! file, named by a handle. A context built on a duplicate of the descriptor
//! (`ibv_import_device`) reaches the same objects, and `ibv_import_*` makes
//! user-space structs that name them by handle. Here [`ContextFile`] plays the
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

use crate::device::UContext;
use crate::dm::{Allocation, UDm};
use crate::errno::null;
use crate::ffi::*;
use crate::objects::{UMr, UPd};
use std::collections::{HashMap, HashSet};
use std::ffi::{c_int, CStr};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, Weak};
use uroce::verbs::{Context, ProtectionDomain};

/// The name of a context's memfd (`/proc/self/fd` shows `/memfd:<name>`).
const MEMFD_NAME: &CStr = c"uroce-context";

/// What a kernel keeps in an open uverbs file: the device, and (through the
/// table) the objects created through the contexts that share it.
pub struct ContextFile {
    id: u64,
    /// `st_dev`, `st_ino` of the memfd.
    key: (u64, u64),
    /// The `ibv_device` (a leaked `UDevice`).
    device: usize,
    ctx: Context,
}

/// A context's part: its file, and the `cmd_fd` it closes.
pub struct Share {
    // Dropped before `cmd_fd`: the memfd's inode (the file's key) outlives
    // the file's entry in the table.
    file: Arc<ContextFile>,
    cmd_fd: OwnedFd,
}

impl Share {
    /// A new file for a context `ibv_open_device` opens on `dev`; Err(errno).
    pub fn open(dev: *mut ibv_device, ctx: &Context) -> Result<Share, c_int> {
        // SAFETY: a NUL-terminated name; no other memory is involved.
        let fd = unsafe { libc::memfd_create(MEMFD_NAME.as_ptr(), libc::MFD_CLOEXEC) };
        if fd < 0 {
            return Err(last_errno());
        }
        // SAFETY: a fresh descriptor nothing else owns.
        let cmd_fd = unsafe { OwnedFd::from_raw_fd(fd) };
        let st = fstat(fd).ok_or_else(last_errno)?;
        static NEXT_ID: AtomicU64 = AtomicU64::new(1);
        let file = Arc::new(ContextFile {
            id: NEXT_ID.fetch_add(1, Ordering::Relaxed),
            key: (st.st_dev, st.st_ino),
            device: dev as usize,
            ctx: ctx.clone(),
        });
        registry().files.insert(file.key, Arc::downgrade(&file));
        Ok(Share { file, cmd_fd })
    }

    /// The descriptor for `ibv_context.cmd_fd`.
    pub fn cmd_fd(&self) -> RawFd {
        self.cmd_fd.as_raw_fd()
    }

    /// Whether this context is the last one open on its file (contexts of
    /// `ibv_import_device` share it).
    pub fn is_last(&self) -> bool {
        Arc::strong_count(&self.file) == 1
    }

    /// `ibv_close_device` of the file's last context, with regions and PDs
    /// the application leaked: they are released, as the kernel releases a
    /// file's objects. The structs stay (the application still holds
    /// them) with no object behind them.
    pub fn release_objects(&self) {
        let reg = registry();
        for e in reg.objects.values().filter(|e| e.file == self.file.id) {
            match &e.obj {
                Object::Mr { primary, released: false, .. } => {
                    // SAFETY: the UMr that registered the region, which its
                    // application leaked (it is in the table).
                    let m = unsafe { &mut *(*primary as *mut UMr) };
                    m.inner = None;
                    m.dm = None;
                }
                Object::Pd { structs, .. } => {
                    for &p in structs {
                        // SAFETY: the UPds naming the PD, leaked by the application.
                        unsafe { (*(p as *mut UPd)).inner = None };
                    }
                }
                _ => {}
            }
        }
    }
}

impl Drop for ContextFile {
    /// The last context of the file is closed: its objects go, as when a
    /// kernel releases the file.
    fn drop(&mut self) {
        let mut gone = Vec::new();
        {
            let mut reg = registry();
            if reg.files.get(&self.key).is_some_and(|w| std::ptr::eq(w.as_ptr(), self)) {
                reg.files.remove(&self.key);
            }
            let handles: Vec<u32> = reg.objects.iter().filter(|(_, e)| e.file == self.id).map(|(&h, _)| h).collect();
            gone.extend(handles.iter().filter_map(|h| reg.objects.remove(h)));
        }
        for e in gone {
            if let Object::Mr { primary, released: true, .. } = e.obj {
                // SAFETY: an MR struct its application gave up (ibv_unimport_mr);
                // the table owned it.
                drop(unsafe { Box::from_raw(primary as *mut UMr) });
            }
        }
    }
}

/// An object of a context file.
struct Entry {
    /// The [`ContextFile::id`] it belongs to.
    file: u64,
    obj: Object,
}

enum Object {
    /// A PD. The table and every struct naming it hold it; the structs
    /// (addresses of `UPd`s) are not users.
    Pd { pd: ProtectionDomain, structs: HashSet<usize> },
    /// An MR. The struct that registered it (`primary`, a `UMr`) owns the
    /// region; imported copies carry its keys only. `released`: the primary
    /// was unimported and the table owns it.
    Mr { primary: usize, released: bool, copies: HashSet<usize> },
    /// A DM. The table and every struct naming it (`UDm`s) hold the memory.
    Dm { alloc: Arc<Allocation>, structs: HashSet<usize> },
}

#[derive(Default)]
struct Registry {
    files: HashMap<(u64, u64), Weak<ContextFile>>,
    objects: HashMap<u32, Entry>,
    last_handle: u32,
}

impl Registry {
    fn new_handle(&mut self) -> u32 {
        loop {
            self.last_handle = self.last_handle.wrapping_add(1);
            if self.last_handle != 0 && !self.objects.contains_key(&self.last_handle) {
                return self.last_handle;
            }
        }
    }

    /// The entry `handle` names in `file`: ENOENT for none.
    fn find(&mut self, file: u64, handle: u32) -> Result<&mut Object, c_int> {
        match self.objects.get_mut(&handle) {
            Some(e) if e.file == file => Ok(&mut e.obj),
            _ => Err(libc::ENOENT),
        }
    }
}

/// The table. Never drop an `Arc<ContextFile>` while holding it.
fn registry() -> MutexGuard<'static, Registry> {
    static R: OnceLock<Mutex<Registry>> = OnceLock::new();
    R.get_or_init(Default::default).lock().unwrap_or_else(|e| e.into_inner())
}

fn last_errno() -> c_int {
    std::io::Error::last_os_error().raw_os_error().unwrap_or(libc::EIO)
}

fn fstat(fd: RawFd) -> Option<libc::stat> {
    // SAFETY: plain old data, filled by fstat.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: a valid out pointer; an invalid descriptor is EBADF.
    (unsafe { libc::fstat(fd, &mut st) } == 0).then_some(st)
}

/// Whether `fd` is the memfd of a uroce context (of this process or not).
fn is_context_memfd(fd: RawFd) -> bool {
    let want = format!("/memfd:{}", MEMFD_NAME.to_string_lossy());
    std::fs::read_link(format!("/proc/self/fd/{fd}")).is_ok_and(|p| p.to_string_lossy().starts_with(&want))
}

/// The file of a context of this library.
unsafe fn file_id(ctx: *mut ibv_context) -> u64 {
    // SAFETY: the caller's contract.
    unsafe { UContext::from_ctx(ctx) }.share.file.id
}

fn new_pd(ctx: *mut ibv_context, handle: u32, pd: ProtectionDomain) -> *mut ibv_pd {
    let p = UPd { pd: ibv_pd { context: ctx, handle }, inner: Some(pd), parent_domain: false };
    Box::into_raw(Box::new(p)) as *mut ibv_pd
}

/// The `ibv_pd` of a PD just allocated on `ctx`, entered in the table.
pub unsafe fn publish_pd(ctx: *mut ibv_context, pd: ProtectionDomain) -> *mut ibv_pd {
    // SAFETY: the caller's contract.
    let file = unsafe { file_id(ctx) };
    let mut reg = registry();
    let handle = reg.new_handle();
    let p = new_pd(ctx, handle, pd.clone());
    reg.objects.insert(handle, Entry { file, obj: Object::Pd { pd, structs: HashSet::from([p as usize]) } });
    p
}

/// The `ibv_mr` of a region just registered (`m.mr.context` one of our
/// contexts), named by a new handle and entered in the table.
pub unsafe fn publish_mr(mut m: UMr) -> *mut ibv_mr {
    // SAFETY: the caller's contract.
    let file = unsafe { file_id(m.mr.context) };
    let mut reg = registry();
    let handle = reg.new_handle();
    m.mr.handle = handle;
    let p = Box::into_raw(Box::new(m)) as usize;
    reg.objects.insert(handle, Entry { file, obj: Object::Mr { primary: p, released: false, copies: HashSet::new() } });
    p as *mut ibv_mr
}

/// The `ibv_dm` of an allocation just made on `ctx`, entered in the table.
pub unsafe fn publish_dm(ctx: *mut ibv_context, alloc: Arc<Allocation>) -> *mut ibv_dm {
    // SAFETY: the caller's contract.
    let file = unsafe { file_id(ctx) };
    let mut reg = registry();
    let handle = reg.new_handle();
    let p = Box::into_raw(Box::new(UDm::new(ctx, handle, alloc.clone()))) as usize;
    reg.objects.insert(handle, Entry { file, obj: Object::Dm { alloc, structs: HashSet::from([p]) } });
    p as *mut ibv_dm
}

/// `ibv_dealloc_pd` of a PD in the table: `None` for a struct the table does
/// not list (a parent domain; a struct left after its PD was destroyed),
/// which the caller handles.
pub unsafe fn dealloc_pd(pd: *mut ibv_pd) -> Option<c_int> {
    // SAFETY: a PD of this library (the caller's contract).
    let handle = unsafe { (*pd).handle };
    let mut reg = registry();
    let Some(Entry { obj: Object::Pd { pd: obj, structs }, .. }) = reg.objects.get(&handle) else { return None };
    if !structs.contains(&(pd as usize)) {
        return None;
    }
    // Anything beyond the table's and the structs' references is a user.
    if obj.ref_count() > 1 + structs.len() {
        return Some(libc::EBUSY);
    }
    let entry = reg.objects.remove(&handle);
    drop(reg);
    drop(entry);
    // SAFETY: listed, hence live and ours; the application gives it up.
    drop(unsafe { Box::from_raw(pd as *mut UPd) });
    Some(0)
}

/// `ibv_dereg_mr` of an MR in the table, through the struct that registered
/// it or an imported copy: `None` for a struct the table does not list (one
/// left after its MR was deregistered), which the caller handles.
pub unsafe fn dereg_mr(mr: *mut ibv_mr) -> Option<c_int> {
    let key = mr as usize;
    // SAFETY: an MR of this library (the caller's contract).
    let handle = unsafe { (*mr).handle };
    let mut reg = registry();
    let Some(Entry { obj: Object::Mr { primary, released, copies }, .. }) = reg.objects.get(&handle) else {
        return None;
    };
    let (primary, released) = (*primary, *released);
    let through_primary = key == primary && !released;
    if !through_primary && !copies.contains(&key) {
        return None;
    }
    // SAFETY: the table's primary struct lives while its entry does; the
    // table's lock orders this with every other use of the entry.
    let p = unsafe { &mut *(primary as *mut UMr) };
    let Some(inner) = p.inner.take() else { return Some(libc::EINVAL) };
    if let Err((inner, e)) = inner.dereg() {
        p.inner = Some(inner);
        return Some(e.errno.0);
    }
    // A device-memory region no longer keeps its allocation busy.
    p.dm = None;
    reg.objects.remove(&handle);
    drop(reg);
    // SAFETY: the struct passed in (listed: live and ours) goes, and the
    // primary too when the table owned it; a primary the application still
    // holds stays for ibv_unimport_mr.
    unsafe {
        drop(Box::from_raw(mr as *mut UMr));
        if !through_primary && released {
            drop(Box::from_raw(primary as *mut UMr));
        }
    }
    Some(0)
}

/// `ibv_free_dm` of a DM in the table: `None` for a struct the table does
/// not list (one left after its DM was freed), which the caller handles.
pub unsafe fn free_dm(dm: *mut ibv_dm) -> Option<c_int> {
    // SAFETY: a DM of this library (the caller's contract).
    let handle = unsafe { (*dm).handle };
    let mut reg = registry();
    let Some(Entry { obj: Object::Dm { alloc, structs }, .. }) = reg.objects.get(&handle) else { return None };
    if !structs.contains(&(dm as usize)) {
        return None;
    }
    if alloc.in_use() {
        return Some(libc::EBUSY);
    }
    let entry = reg.objects.remove(&handle);
    drop(reg);
    drop(entry);
    // SAFETY: listed, hence live and ours; the application gives it up.
    drop(unsafe { Box::from_raw(dm as *mut UDm) });
    Some(0)
}

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
