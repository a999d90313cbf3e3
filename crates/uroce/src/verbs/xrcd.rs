//! XRC domains (`ibv_xrcd`): the scope in which XRC SRQs and XRC_RECV
//! queue pairs meet. A request arriving at an XRC_RECV QP names an SRQ by
//! number; only SRQs of the QP's domain may be named.
//!
//! `ibv_open_xrcd` with a file descriptor shares one domain among every open
//! of the same file (inode) on the device, as the kernel's uverbs does:
//! O_CREAT creates it if it does not exist (EAGAIN otherwise), O_EXCL
//! refuses an existing one (EINVAL). Without a file (fd −1) each open is a
//! new domain. The domain lives while any handle to it is open; a handle
//! cannot be closed while SRQs or QPs created through it exist (EBUSY).

use super::context::Context;
use super::device::XrcDomain;
use crate::ib::{Errno, Error, Result};
use std::os::fd::RawFd;
use std::sync::Arc;

/// One open handle: what the SRQs and QPs created through it hold.
pub(crate) struct XrcdInner {
    pub ctx: Context,
    pub domain: Arc<XrcDomain>,
}

/// An open XRC domain (`ibv_xrcd`).
pub struct Xrcd {
    pub(crate) inner: Arc<XrcdInner>,
}

impl Context {
    /// `ibv_open_xrcd` without a file: a new XRC domain.
    pub fn open_xrcd(&self) -> Result<Xrcd> {
        Ok(self.xrcd_handle(Arc::new(XrcDomain { number: self.dev.next_handle() })))
    }

    /// `ibv_open_xrcd` with a file: the domain of the file's inode on this
    /// device. `create` (O_CREAT) makes it if there is none, `exclusive`
    /// (O_EXCL) refuses one that exists. EBADF for a descriptor that is not
    /// open.
    pub fn open_xrcd_file(&self, fd: RawFd, create: bool, exclusive: bool) -> Result<Xrcd> {
        // SAFETY: fstat writes a `struct stat` into our zeroed one; any fd
        // value is allowed (an invalid one fails with EBADF).
        let mut st: libc::stat = unsafe { std::mem::zeroed() };
        // SAFETY: as above.
        if unsafe { libc::fstat(fd, &mut st) } != 0 {
            return Err(Error::new(Errno(libc::EBADF), "open_xrcd: fd is not an open file"));
        }
        let key = (st.st_dev, st.st_ino);
        let mut table = self.dev.xrcds.lock().unwrap();
        let domain = match table.get(&key).and_then(|w| w.upgrade()) {
            Some(_) if exclusive => return Err(Error::inval("open_xrcd: O_EXCL and the file's domain exists")),
            Some(d) => d,
            None if !create => {
                return Err(Error::new(Errno::EAGAIN, "open_xrcd: the file has no XRC domain and O_CREAT is not set"))
            }
            None => {
                let d = Arc::new(XrcDomain { number: self.dev.next_handle() });
                table.retain(|_, w| w.strong_count() > 0);
                table.insert(key, Arc::downgrade(&d));
                d
            }
        };
        Ok(self.xrcd_handle(domain))
    }

    fn xrcd_handle(&self, domain: Arc<XrcDomain>) -> Xrcd {
        Xrcd { inner: Arc::new(XrcdInner { ctx: self.clone(), domain }) }
    }
}

impl Xrcd {
    /// The domain's device-wide number (equal for handles of one domain).
    pub fn number(&self) -> u32 {
        self.inner.domain.number
    }

    /// Closes the handle (`ibv_close_xrcd`), or fails with EBUSY while SRQs
    /// or QPs created through it exist.
    pub fn close(self) -> std::result::Result<(), (Self, Error)> {
        if Arc::strong_count(&self.inner) > 1 {
            return Err((self, Error::new(Errno::EBUSY, "close_xrcd: SRQs or QPs of the domain exist")));
        }
        Ok(())
    }
}

impl std::fmt::Debug for Xrcd {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Xrcd").field("number", &self.number()).finish()
    }
}
