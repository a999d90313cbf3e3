//! Packet capture: every packet a device sends and receives, as a pcap file
//! that Wireshark and tshark decode as RoCEv2.
//!
//! The file is created 0600 without following a link (`O_CREAT|O_EXCL|
//! O_NOFOLLOW`). [`Capture::create`] (the configuration's or
//! `UROCE_CAPTURE`'s path) replaces an existing file only if it is a regular
//! file of this user with one link; [`Capture::create_new`] (a
//! `uroce capture` request) never replaces anything: "capture file exists".
//!
//! No file I/O runs on the data path nor under any lock: [`Capture::record`]
//! copies the packet into a bounded queue ([`QUEUE`] records) that one
//! writer thread per capture drains into the file; when the queue is full
//! the record is dropped and counted ([`Capture::dropped`]), never waited
//! for. Dropping a `Capture` only closes its queue: the writer writes what
//! is queued, flushes, closes the file and ends on its own ([`settle`]
//! waits for that).
//!
//! A capture file is complete at process exit whatever the application
//! leaks: every capture is listed in a process-wide registry that an
//! `atexit` hook flushes ([`flush_all`], bounded waits), and records reach
//! the file at most [`FLUSH_EVERY`] after they were queued and whenever
//! [`flush_all`] runs (the statistics publisher calls it every period).
//! Records are written whole, so a flushed file ends on a record boundary.

use crate::wire::pcap::PcapWriter;
use crate::wire::IpInfo;
use std::fs::File;
use std::io::{self, BufWriter};
use std::os::fd::{AsRawFd, FromRawFd};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, SyncSender, TrySendError};
use std::sync::{Arc, Mutex, OnceLock, Weak};
use std::time::{Duration, Instant, SystemTime};

/// Queued records reach the file at most this long after being queued.
pub const FLUSH_EVERY: Duration = Duration::from_millis(200);
/// Records queued for the writer at most; more are dropped and counted.
pub const QUEUE: usize = 4096;
/// How long [`flush_all`], [`settle`] and a capture's start wait for the
/// writers at most.
pub const WAIT: Duration = Duration::from_secs(5);

enum Msg {
    Record { ts: SystemTime, ip: IpInfo, bytes: Vec<u8> },
    /// Flush, then answer.
    Flush(SyncSender<()>),
}

/// What the registry, the capture and its writer thread share.
struct Entry {
    /// The queue; `None` once the capture is dropped (the writer then ends).
    tx: Mutex<Option<SyncSender<Msg>>>,
    /// Set by the writer thread when it has flushed and closed the file.
    done: AtomicBool,
    dropped: AtomicU64,
}

pub struct Capture {
    entry: Arc<Entry>,
    /// The queue, also here so that [`Capture::record`] takes no lock.
    tx: SyncSender<Msg>,
}

impl std::fmt::Debug for Capture {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Capture")
    }
}

fn registry() -> &'static Mutex<Vec<Weak<Entry>>> {
    static R: OnceLock<Mutex<Vec<Weak<Entry>>>> = OnceLock::new();
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

/// Every capture of this process whose writer has not ended. Bounded wait
/// (this runs at exit, when another thread may hold the registry for an
/// instant: it is held only to push or list).
fn entries(deadline: Instant) -> Vec<Arc<Entry>> {
    loop {
        if let Some(mut r) = try_lock(registry()) {
            r.retain(|w| w.upgrade().is_some_and(|e| !e.done.load(Ordering::Acquire)));
            return r.iter().filter_map(Weak::upgrade).collect();
        }
        if Instant::now() >= deadline {
            return Vec::new();
        }
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// Flushes every capture of this process (at exit, and periodically) and
/// waits, at most [`WAIT`] in all, for the writers of dropped captures to
/// finish their files.
pub fn flush_all() {
    let deadline = Instant::now() + WAIT;
    let mut acks = Vec::new();
    for e in entries(deadline) {
        let tx = try_lock(&e.tx).and_then(|g| g.clone());
        if let Some(tx) = tx {
            let (ack_tx, ack_rx) = mpsc::sync_channel(1);
            if send_until(&tx, Msg::Flush(ack_tx), deadline) {
                acks.push(ack_rx);
            }
        }
    }
    for a in acks {
        let _ = a.recv_timeout(deadline.saturating_duration_since(Instant::now()));
    }
    settle_until(deadline);
}

/// Waits, at most [`WAIT`], until the writer of every dropped capture has
/// written what was queued and closed its file (`uroce capture --pid …
/// stop` answers after this, so that the file it names is complete).
pub fn settle() {
    settle_until(Instant::now() + WAIT);
}

fn settle_until(deadline: Instant) {
    loop {
        let closing = entries(deadline).iter().any(|e| try_lock(&e.tx).is_some_and(|g| g.is_none()));
        if !closing || Instant::now() >= deadline {
            return;
        }
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// Queues `m`, retrying while the queue is full until `deadline` (never on
/// the data path: flushes only). Whether it was queued.
fn send_until(tx: &SyncSender<Msg>, mut m: Msg, deadline: Instant) -> bool {
    loop {
        match tx.try_send(m) {
            Ok(()) => return true,
            Err(TrySendError::Disconnected(_)) => return false,
            Err(TrySendError::Full(back)) => m = back,
        }
        if Instant::now() >= deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// The writer thread: writes queued records, flushes [`FLUSH_EVERY`] after
/// the oldest unflushed one and when asked, and at the queue's close
/// flushes, closes the file and marks the capture done.
fn writer(mut w: PcapWriter<BufWriter<File>>, rx: Receiver<Msg>, entry: Arc<Entry>) {
    let mut dirty_since: Option<Instant> = None;
    let mut warned = false;
    loop {
        let wait = dirty_since.map_or(Duration::from_secs(3600), |t| FLUSH_EVERY.saturating_sub(t.elapsed()));
        let flush = match rx.recv_timeout(wait) {
            Ok(Msg::Record { ts, ip, bytes }) => {
                if let Err(e) = w.write_roce(ts, &ip, &bytes) {
                    if !std::mem::replace(&mut warned, true) {
                        tracing::warn!("packet capture: {e}");
                    }
                }
                let t = *dirty_since.get_or_insert_with(Instant::now);
                t.elapsed() >= FLUSH_EVERY
            }
            Ok(Msg::Flush(ack)) => {
                let _ = w.flush();
                dirty_since = None;
                let _ = ack.try_send(());
                false
            }
            Err(RecvTimeoutError::Timeout) => true,
            Err(RecvTimeoutError::Disconnected) => break,
        };
        if flush {
            let _ = w.flush();
            dirty_since = None;
        }
    }
    let _ = w.flush();
    drop(w);
    let n = entry.dropped.load(Ordering::Relaxed);
    if n > 0 {
        tracing::warn!("packet capture: {n} packets not captured (the writer fell behind)");
    }
    entry.done.store(true, Ordering::Release);
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

    /// Opens the writer: its thread writes the file header and flushes it
    /// before this returns, so a capture's file is a valid pcap from the
    /// start.
    fn start(path: &Path, f: io::Result<File>) -> io::Result<Capture> {
        let f = f.map_err(|e| open_error(path, e))?;
        let (tx, rx) = mpsc::sync_channel(QUEUE);
        let entry = Arc::new(Entry { tx: Mutex::new(Some(tx.clone())), done: AtomicBool::new(false), dropped: AtomicU64::new(0) });
        let (ready_tx, ready_rx) = mpsc::sync_channel::<io::Result<()>>(1);
        let e = entry.clone();
        std::thread::Builder::new()
            .name("uroce-capture".into())
            .spawn(move || {
                let header = PcapWriter::new(BufWriter::new(f)).and_then(|mut w| w.flush().map(|()| w));
                match header {
                    Ok(w) => {
                        let _ = ready_tx.send(Ok(()));
                        writer(w, rx, e);
                    }
                    Err(err) => {
                        e.done.store(true, Ordering::Release);
                        let _ = ready_tx.send(Err(err));
                    }
                }
            })
            .map_err(|e| open_error(path, e))?;
        match ready_rx.recv_timeout(WAIT) {
            Ok(Ok(())) => {}
            Ok(Err(e)) => return Err(open_error(path, e)),
            Err(_) => {
                return Err(open_error(path, io::Error::new(io::ErrorKind::TimedOut, "the capture writer did not start")))
            }
        }
        registry().lock().unwrap_or_else(|p| p.into_inner()).push(Arc::downgrade(&entry));
        Ok(Capture { entry, tx })
    }

    /// Queues one packet for the file; never blocks nor does file I/O (a
    /// full queue drops the record and counts it).
    pub fn record(&self, ip: &IpInfo, udp_payload: &[u8]) {
        let m = Msg::Record { ts: SystemTime::now(), ip: *ip, bytes: udp_payload.to_vec() };
        if self.tx.try_send(m).is_err() {
            self.entry.dropped.fetch_add(1, Ordering::Relaxed);
        }
    }

    #[cfg(feature = "unstable")]
    /// Packets not captured because the writer was behind.
    pub fn dropped(&self) -> u64 {
        self.entry.dropped.load(Ordering::Relaxed)
    }

    /// Asks the writer to flush and waits for it, at most [`WAIT`].
    pub fn flush(&self) {
        let deadline = Instant::now() + WAIT;
        let (ack_tx, ack_rx) = mpsc::sync_channel(1);
        if send_until(&self.tx, Msg::Flush(ack_tx), deadline) {
            let _ = ack_rx.recv_timeout(WAIT);
        }
    }
}

impl Drop for Capture {
    /// Closes the queue without waiting: the writer finishes the file on its
    /// own ([`settle`], [`flush_all`] wait for it).
    fn drop(&mut self) {
        // Held by others only to clone the sender: never for long.
        self.entry.tx.lock().unwrap_or_else(|p| p.into_inner()).take();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Recording never waits for the file: past the queue's room records are
    /// dropped and counted, and after the capture is dropped and settled
    /// the file holds every record that was not, whole.
    #[test]
    fn records_are_queued_or_counted_and_the_file_ends_whole() {
        let d = std::env::temp_dir().join(format!("uroce-capture-queue-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        let path = d.join("q.pcap");
        let c = Capture::create_new(&path).unwrap();
        let ip = IpInfo {
            src: "127.0.0.1".parse().unwrap(),
            dst: "127.0.0.2".parse().unwrap(),
            sport: 4791,
            dport: 4791,
            ipv4_id: 3,
        };
        let n = 3 * QUEUE as u64;
        let payload = [0x5au8; 1024];
        for _ in 0..n {
            c.record(&ip, &payload);
        }
        let dropped = c.dropped();
        assert!(dropped < n, "some records reach the queue");
        drop(c);
        settle();
        let f = std::fs::File::open(&path).unwrap();
        let r = crate::wire::pcap::PcapReader::new(f).unwrap();
        let mut written = 0u64;
        for frame in r {
            let frame = frame.expect("whole records only");
            let (got, p) =
                crate::wire::pcap::extract_roce(crate::wire::pcap::LINKTYPE_ETHERNET, &frame.data, 4791).unwrap();
            assert_eq!((got, p), (ip, &payload[..]));
            written += 1;
        }
        assert_eq!(written + dropped, n, "each record written or counted");
        std::fs::remove_dir_all(&d).unwrap();
    }

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
