//! Packet capture: every packet a device sends and receives, as a pcap file
//! that Wireshark and tshark decode as RoCEv2.
//!
//! The file is created 0600 without following a link (`O_CREAT|O_EXCL|
//! O_NOFOLLOW`). [`Capture::create`] (the configuration's or
//! `UROCE_CAPTURE`'s path) replaces an existing file only if it is a regular
//! file of this user with one link; [`Capture::create_new`] (a
//! `uroce capture` request) never replaces anything: "capture file exists".
//!
//! A capture file is complete at process exit whatever the application
//! leaks: every live capture is listed (weakly) in a process-wide registry
//! that an `atexit` hook flushes, and records are flushed to the file at
//! most [`FLUSH_EVERY`] after they were written and whenever
//! [`flush_all`] runs (the statistics publisher calls it every period).
//! Records are written whole under the writer's lock, so a flushed file
//! ends on a record boundary.

use crate::wire::pcap::PcapWriter;
use crate::wire::IpInfo;
use std::fs::File;
use std::io::{self, BufWriter};
use std::os::fd::{AsRawFd, FromRawFd};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::sync::{Arc, Mutex, OnceLock, Weak};
use std::time::{Duration, Instant, SystemTime};

/// Buffered records reach the file at most this long after being written.
pub const FLUSH_EVERY: Duration = Duration::from_millis(200);

struct Inner {
    writer: PcapWriter<BufWriter<File>>,
    /// When the oldest unflushed record was written.
    dirty_since: Option<Instant>,
}

type Shared = Arc<Mutex<Inner>>;

pub struct Capture {
    inner: Shared,
}

impl std::fmt::Debug for Capture {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Capture")
    }
}

fn registry() -> &'static Mutex<Vec<Weak<Mutex<Inner>>>> {
    static R: OnceLock<Mutex<Vec<Weak<Mutex<Inner>>>>> = OnceLock::new();
    R.get_or_init(|| {
        extern "C" fn flush_at_exit() {
            flush_all();
        }
        // SAFETY: registers a plain extern "C" function with no arguments.
        unsafe { libc::atexit(flush_at_exit) };
        Mutex::default()
    })
}

/// The lock if free (also after a panic of its holder), else `None`.
fn try_lock<T>(m: &Mutex<T>) -> Option<std::sync::MutexGuard<'_, T>> {
    match m.try_lock() {
        Ok(g) => Some(g),
        Err(std::sync::TryLockError::Poisoned(p)) => Some(p.into_inner()),
        Err(std::sync::TryLockError::WouldBlock) => None,
    }
}

/// Flushes every live capture of this process (at exit, and periodically).
pub fn flush_all() {
    // Bounded waits (this runs at exit, when another thread may hold a lock
    // for an instant): the registry is held only to push or list.
    let mut live: Vec<Shared> = Vec::new();
    for _ in 0..1000 {
        if let Some(mut r) = try_lock(registry()) {
            r.retain(|w| w.strong_count() > 0);
            live = r.iter().filter_map(Weak::upgrade).collect();
            break;
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    for c in live {
        // Bounded: a writer is held only while one record is written.
        for _ in 0..1000 {
            if let Some(mut g) = try_lock(&c) {
                let _ = g.writer.flush();
                g.dirty_since = None;
                break;
            }
            std::thread::sleep(Duration::from_millis(1));
        }
    }
}

/// An error opening a capture file, naming the file.
fn open_error(path: &Path, e: io::Error) -> io::Error {
    let errno = e.raw_os_error().unwrap_or(match e.kind() {
        io::ErrorKind::AlreadyExists => libc::EEXIST,
        _ => libc::EIO,
    });
    io::Error::new(e.kind(), CaptureOpenError { message: format!("capture file {}: {e}", path.display()), errno })
}

/// The error [`Capture::create`] returns: it names the capture file, so
/// that device start reports it as a capture problem, not a bind problem.
#[derive(Debug, thiserror::Error)]
#[error("{message}")]
pub struct CaptureOpenError {
    pub message: String,
    pub errno: i32,
}

fn open_new(path: &Path) -> io::Result<File> {
    let c = std::ffi::CString::new(path.as_os_str().as_bytes())
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "path contains a NUL byte"))?;
    let flags = libc::O_WRONLY | libc::O_CREAT | libc::O_EXCL | libc::O_NOFOLLOW | libc::O_CLOEXEC;
    // SAFETY: `c` is NUL-terminated.
    let fd = unsafe { libc::open(c.as_ptr(), flags, 0o600 as libc::c_uint) };
    if fd < 0 {
        let e = io::Error::last_os_error();
        if e.raw_os_error() == Some(libc::EEXIST) {
            return Err(io::Error::new(io::ErrorKind::AlreadyExists, "capture file exists"));
        }
        return Err(e);
    }
    // SAFETY: a fresh descriptor nothing else owns.
    Ok(unsafe { File::from_raw_fd(fd) })
}

/// Reopens an existing capture file of this user to replace its contents:
/// a regular file, owned by the effective uid, with one link, not reached
/// through a link.
fn reopen_own(path: &Path) -> io::Result<File> {
    let c = std::ffi::CString::new(path.as_os_str().as_bytes())
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "path contains a NUL byte"))?;
    let flags = libc::O_WRONLY | libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_NOCTTY | libc::O_CLOEXEC;
    // SAFETY: `c` is NUL-terminated.
    let fd = unsafe { libc::open(c.as_ptr(), flags) };
    if fd < 0 {
        let e = io::Error::last_os_error();
        if e.raw_os_error() == Some(libc::ELOOP) {
            return Err(io::Error::new(io::ErrorKind::InvalidInput, "is a symbolic link (not followed)"));
        }
        return Err(e);
    }
    // SAFETY: a fresh descriptor nothing else owns.
    let f = unsafe { File::from_raw_fd(fd) };
    // SAFETY: all-zero is a valid `stat`.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: `st` is a valid out-pointer.
    if unsafe { libc::fstat(f.as_raw_fd(), &mut st) } != 0 {
        return Err(io::Error::last_os_error());
    }
    if st.st_mode & libc::S_IFMT != libc::S_IFREG || st.st_uid != crate::runtime::dir::euid() || st.st_nlink != 1 {
        return Err(io::Error::new(
            io::ErrorKind::AlreadyExists,
            "capture file exists and is not a regular file of this user",
        ));
    }
    f.set_len(0)?;
    // Back to blocking writes.
    // SAFETY: fcntl on a descriptor we own.
    unsafe { libc::fcntl(f.as_raw_fd(), libc::F_SETFL, 0) };
    Ok(f)
}

impl Capture {
    /// Starts a capture into `path`, replacing a previous capture file of
    /// this user (see the module docs).
    pub fn create(path: &Path) -> io::Result<Capture> {
        let f = match open_new(path) {
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => reopen_own(path),
            r => r,
        };
        Self::start(path, f)
    }

    /// Starts a capture into a new file `path`; an existing file is an error.
    pub fn create_new(path: &Path) -> io::Result<Capture> {
        Self::start(path, open_new(path))
    }

    fn start(path: &Path, f: io::Result<File>) -> io::Result<Capture> {
        let f = f.map_err(|e| open_error(path, e))?;
        let writer = PcapWriter::new(BufWriter::new(f)).map_err(|e| open_error(path, e))?;
        let inner = Arc::new(Mutex::new(Inner { writer, dirty_since: None }));
        registry().lock().unwrap().push(Arc::downgrade(&inner));
        Ok(Capture { inner })
    }

    pub fn record(&self, ip: &IpInfo, udp_payload: &[u8]) {
        let mut g = self.inner.lock().unwrap();
        if let Err(e) = g.writer.write_roce(SystemTime::now(), ip, udp_payload) {
            tracing::warn!("packet capture: {e}");
        }
        let now = Instant::now();
        match g.dirty_since {
            Some(t) if now.duration_since(t) >= FLUSH_EVERY => {
                let _ = g.writer.flush();
                g.dirty_since = None;
            }
            Some(_) => {}
            None => g.dirty_since = Some(now),
        }
    }

    pub fn flush(&self) {
        let mut g = self.inner.lock().unwrap();
        let _ = g.writer.flush();
        g.dirty_since = None;
    }
}

impl Drop for Capture {
    fn drop(&mut self) {
        self.flush();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn create_never_follows_links_nor_replaces_others() {
        let d = std::env::temp_dir().join(format!("uroce-capture-test-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        let victim = d.join("victim");
        std::fs::write(&victim, b"secret").unwrap();
        let link = d.join("link.pcap");
        std::os::unix::fs::symlink(&victim, &link).unwrap();
        let e = Capture::create(&link).unwrap_err().to_string();
        assert!(e.contains("link.pcap"), "{e}");
        assert!(Capture::create_new(&link).is_err());
        assert_eq!(std::fs::read(&victim).unwrap(), b"secret");
        // A hard link (two links) is not replaced either.
        let hard = d.join("hard.pcap");
        std::fs::hard_link(&victim, &hard).unwrap();
        assert!(Capture::create(&hard).is_err());
        assert_eq!(std::fs::read(&victim).unwrap(), b"secret");
        // create_new: an existing file is an error; create: an own file is replaced.
        let own = d.join("own.pcap");
        std::fs::write(&own, b"old").unwrap();
        let e = Capture::create_new(&own).unwrap_err().to_string();
        assert!(e.contains("capture file exists"), "{e}");
        drop(Capture::create(&own).unwrap());
        assert_eq!(std::fs::read(&own).unwrap().len(), 24, "a fresh pcap header");
        let fresh = d.join("new.pcap");
        drop(Capture::create_new(&fresh).unwrap());
        use std::os::unix::fs::PermissionsExt;
        assert_eq!(std::fs::metadata(&fresh).unwrap().permissions().mode() & 0o777, 0o600);
        let e = Capture::create(&d.join("no/such/dir.pcap")).unwrap_err().to_string();
        assert!(e.contains("no/such/dir.pcap") && e.contains("No such file"), "{e}");
        std::fs::remove_dir_all(&d).unwrap();
    }
}
