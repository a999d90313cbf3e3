//! The open-file table behind `ibv_import_*` (`import.rs` has the verbs and
//! their lifetime rules): each context's [`ContextFile`], the PDs, MRs and
//! DMs created through it, entered under process-wide handles as they are
//! made (`publish_*`), and their destruction through any struct naming them.

use crate::dm_memory::{Allocation, UDm};
use crate::ffi::*;
use crate::handles::{ContextFile, Share, UContext, UMr, UPd};
use std::collections::{HashMap, HashSet};
use std::ffi::{c_int, CStr};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, Weak};
use uroce::verbs::{Context, ProtectionDomain};

/// The name of a context's memfd (`/proc/self/fd` shows `/memfd:<name>`).
pub(crate) const MEMFD_NAME: &CStr = c"uroce-context";

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
pub(crate) struct Entry {
    /// The [`ContextFile::id`] it belongs to.
    pub(crate) file: u64,
    pub(crate) obj: Object,
}

pub(crate) enum Object {
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
pub(crate) struct Registry {
    pub(crate) files: HashMap<(u64, u64), Weak<ContextFile>>,
    pub(crate) objects: HashMap<u32, Entry>,
    last_handle: u32,
}

impl Registry {
    pub(crate) fn new_handle(&mut self) -> u32 {
        loop {
            self.last_handle = self.last_handle.wrapping_add(1);
            if self.last_handle != 0 && !self.objects.contains_key(&self.last_handle) {
                return self.last_handle;
            }
        }
    }

    /// The entry `handle` names in `file`: ENOENT for none.
    pub(crate) fn find(&mut self, file: u64, handle: u32) -> Result<&mut Object, c_int> {
        match self.objects.get_mut(&handle) {
            Some(e) if e.file == file => Ok(&mut e.obj),
            _ => Err(libc::ENOENT),
        }
    }
}

/// The table. Never drop an `Arc<ContextFile>` while holding it.
pub(crate) fn registry() -> MutexGuard<'static, Registry> {
    static R: OnceLock<Mutex<Registry>> = OnceLock::new();
    R.get_or_init(Default::default).lock().unwrap_or_else(|e| e.into_inner())
}

pub(crate) fn last_errno() -> c_int {
    std::io::Error::last_os_error().raw_os_error().unwrap_or(libc::EIO)
}

pub(crate) fn fstat(fd: RawFd) -> Option<libc::stat> {
    // SAFETY: plain old data, filled by fstat.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: a valid out pointer; an invalid descriptor is EBADF.
    (unsafe { libc::fstat(fd, &mut st) } == 0).then_some(st)
}

/// Whether `fd` is the memfd of a uroce context (of this process or not).
pub(crate) fn is_context_memfd(fd: RawFd) -> bool {
    let want = format!("/memfd:{}", MEMFD_NAME.to_string_lossy());
    std::fs::read_link(format!("/proc/self/fd/{fd}")).is_ok_and(|p| p.to_string_lossy().starts_with(&want))
}

/// The file of a context of this library.
pub(crate) unsafe fn file_id(ctx: *mut ibv_context) -> u64 {
    // SAFETY: the caller's contract.
    unsafe { UContext::from_ctx(ctx) }.share.file.id
}

pub(crate) fn new_pd(ctx: *mut ibv_context, handle: u32, pd: ProtectionDomain) -> *mut ibv_pd {
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
