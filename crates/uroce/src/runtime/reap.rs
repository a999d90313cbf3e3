//! Reaping what processes that died without running their exit handler
//! (SIGKILL, a crash) left in the runtime directory: their `<pid>/`
//! directories (`stats.json`, published counters, requests) and the link
//! sockets they advertised in `links/` (named `<netns>-<address>-<port>`,
//! see `io::link::discovery`). A process removes both itself at a normal
//! exit; this removes them for the dead.
//!
//! Safety rules: only in a runtime directory of this user that no one else
//! may write into (checked again here, whoever calls), never through a
//! link, and only what is certainly dead:
//! * `<pid>/`: `kill(pid, 0)` answers ESRCH (no such process), or a live
//!   process with that pid started at another time than the one recorded in
//!   `<pid>/start_time` (the pid was reused). A live pid with no record is
//!   kept. The directory is first renamed to a tombstone and its record
//!   read again, so a process that took the pid and its directory in
//!   between gets it back. Peer-memory counters are folded into the host
//!   totals first, as at a normal exit.
//! * a link socket: no socket of this network namespace is bound to its
//!   name (`/proc/thread-self/net/unix`), and the file is older than that
//!   listing; names of other namespaces are left alone (their sockets are
//!   not listed here). It is renamed to a tombstone, checked to be the same
//!   file, then removed.

use super::SafeDir;
use std::collections::HashSet;
use std::io::Read;

/// The directory of advertised link sockets (`io::link::discovery`).
const LINKS: &str = "links";
/// Entries per pass at most (a directory that big is not ours to sweep).
const MAX_ENTRIES: usize = 4096;

/// What one pass removed.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Reaped {
    pub processes: Vec<u32>,
    pub sockets: Vec<String>,
}

/// The start time of process `pid` (clock ticks after boot, field 22 of
/// `/proc/<pid>/stat`), or `None` if it cannot be read.
pub fn start_time(pid: u32) -> Option<u64> {
    let mut text = String::new();
    std::fs::File::open(format!("/proc/{pid}/stat")).ok()?.take(4096).read_to_string(&mut text).ok()?;
    // The command name (field 2) may hold spaces and parentheses: count
    // from the last ')'.
    let rest = &text[text.rfind(')')? + 1..];
    rest.split_ascii_whitespace().nth(19)?.parse().ok()
}

/// This process's start time as recorded in `<pid>/start_time`.
pub fn start_time_record() -> String {
    start_time(std::process::id()).map_or_else(String::new, |t| format!("{t}\n"))
}

/// Whether process `pid` certainly no longer exists: `kill(pid, 0)` fails
/// with ESRCH (EPERM means it exists, as another user's).
fn dead(pid: u32) -> bool {
    let Ok(p) = libc::pid_t::try_from(pid) else { return false };
    if p <= 0 {
        return false;
    }
    // SAFETY: signal 0 sends nothing; it only checks that `p` exists.
    let r = unsafe { libc::kill(p, 0) };
    r != 0 && std::io::Error::last_os_error().raw_os_error() == Some(libc::ESRCH)
}

/// A pid directory's name: the canonical decimal form of a pid above 0.
fn pid_of(name: &str) -> Option<u32> {
    let pid: u32 = name.parse().ok()?;
    (pid > 0 && pid.to_string() == name).then_some(pid)
}

fn recorded_start(rt: &SafeDir, dir: &str) -> Option<u64> {
    let d = rt.subdir_for_reading(dir).ok()?;
    let text = d.read_file("start_time", 64, true).ok()??;
    std::str::from_utf8(&text).ok()?.trim().parse().ok()
}

/// Whether `<pid>/` belongs to no live process: the pid is gone, or reused
/// by a process that started at another time than the record says.
fn stale(rt: &SafeDir, pid: u32) -> bool {
    if dead(pid) {
        return true;
    }
    match (recorded_start(rt, &pid.to_string()), start_time(pid)) {
        (Some(rec), Some(now)) => rec != now,
        _ => false,
    }
}

/// Whether `rt` may be swept by this process: ours, writable by no one else.
fn sweepable(rt: &SafeDir) -> bool {
    rt.owner().is_ok_and(|o| o == super::dir::euid()) && rt.mode().is_ok_and(|m| m & 0o022 == 0)
}

/// Removes the directories of dead processes and the link sockets nobody
/// listens on (see the module docs); `before_removing(rt, name)` is called
/// on each directory first (under its tombstone name), to keep what must
/// outlive it; false leaves the directory (under its own name).
pub fn reap(rt: &SafeDir, before_removing: &dyn Fn(&SafeDir, &str) -> bool) -> Reaped {
    let mut out = Reaped::default();
    if !sweepable(rt) {
        return out;
    }
    let me = std::process::id();
    for name in rt.entries().into_iter().take(MAX_ENTRIES) {
        let Some(pid) = pid_of(&name) else { continue };
        let is_dir = rt.stat_entry(&name).is_some_and(|st| st.st_mode & libc::S_IFMT == libc::S_IFDIR);
        if pid == me || !is_dir || !stale(rt, pid) {
            continue;
        }
        let before = recorded_start(rt, &name);
        let tomb = format!(".reap.{name}.{me}");
        if rt.rename_noreplace(&name, &tomb).is_err() {
            continue;
        }
        // A process that took this pid may have made its directory between
        // the check and the rename: then it is its, and goes back.
        let now = recorded_start(rt, &tomb);
        let taken = now != before || (!dead(pid) && now.is_some() && now == start_time(pid));
        if taken {
            let _ = rt.rename_noreplace(&tomb, &name);
            continue;
        }
        if !before_removing(rt, &tomb) {
            // What it holds could not be kept: left under its own name.
            let _ = rt.rename_noreplace(&tomb, &name);
            continue;
        }
        if rt.remove_tree(&tomb, 4).is_ok() {
            out.processes.push(pid);
        } else {
            // Deeper than we remove: left under its own name.
            let _ = rt.rename_noreplace(&tomb, &name);
        }
    }
    let is_dir = rt.stat_entry(LINKS).is_some_and(|st| st.st_mode & libc::S_IFMT == libc::S_IFDIR);
    if is_dir {
        if let Ok(links) = rt.subdir(LINKS, None) {
            out.sockets = reap_sockets(&links);
        }
    }
    out
}

/// This thread's network namespace inode (as io::link names sockets).
fn netns() -> Option<u64> {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata("/proc/thread-self/ns/net").ok().map(|m| m.ino())
}

/// The last path component of every bound Unix socket of this network
/// namespace, or `None` if the list cannot be read.
fn bound_names() -> Option<HashSet<String>> {
    let mut text = String::new();
    std::fs::File::open("/proc/thread-self/net/unix").ok()?.take(64 << 20).read_to_string(&mut text).ok()?;
    // "Num RefCount Protocol Flags Type St Inode Path": the path is the
    // eighth field, when bound.
    Some(
        text.lines()
            .skip(1)
            .filter_map(|l| l.split_ascii_whitespace().nth(7))
            .filter_map(|p| p.rsplit('/').next())
            .map(str::to_string)
            .collect(),
    )
}

fn reap_sockets(links: &SafeDir) -> Vec<String> {
    let mut out = Vec::new();
    if !sweepable(links) {
        return out;
    }
    let Some(ns) = netns() else { return out };
    let prefix = format!("{ns}-");
    // Files made after this moment may be bound after the listing: kept
    // (with a second's margin: file times come from a coarser clock).
    let listed_at = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs() as i64)
        - 1;
    let Some(bound) = bound_names() else { return out };
    let me = std::process::id();
    for name in links.entries().into_iter().take(MAX_ENTRIES) {
        if !name.starts_with(&prefix) || bound.contains(&name) {
            continue;
        }
        let Some(st) = links.stat_entry(&name) else { continue };
        if st.st_mode & libc::S_IFMT != libc::S_IFSOCK || st.st_ctime >= listed_at {
            continue;
        }
        let tomb = format!(".reap.{me}");
        if links.rename_noreplace(&name, &tomb).is_err() {
            continue;
        }
        let same = links.stat_entry(&tomb).is_some_and(|t| t.st_ino == st.st_ino && t.st_dev == st.st_dev);
        if !same {
            // Replaced by a live device in between: its file goes back.
            let _ = links.rename_noreplace(&tomb, &name);
            continue;
        }
        if links.remove(&tomb).is_ok() {
            out.push(name);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::runtime::Access;
    use std::path::PathBuf;

    fn tmp(tag: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("uroce-reap-test-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        d
    }

    /// A pid that has exited (a child, waited for).
    fn dead_pid() -> u32 {
        let mut c = std::process::Command::new("true").spawn().unwrap();
        let pid = c.id();
        c.wait().unwrap();
        pid
    }

    #[test]
    fn start_time_of_this_process() {
        let t = start_time(std::process::id()).expect("/proc/self/stat");
        assert_eq!(start_time_record(), format!("{t}\n"));
        assert_eq!(start_time(u32::MAX), None);
    }

    #[test]
    fn dead_and_reused_pids_are_reaped_live_ones_kept() {
        let root = tmp("pids");
        let rt = SafeDir::create_or_open(&root, Access::Private).unwrap();
        let mode = Access::Private.file_mode();
        let folded = std::cell::RefCell::new(Vec::new());
        // A dead process's directory, with and without a start record.
        let gone = dead_pid();
        let d = rt.subdir(&gone.to_string(), Some(Access::Private)).unwrap();
        d.write_file("stats.json", b"{}", mode).unwrap();
        // A live child: kept with its true record, reaped with a false one
        // (its pid was reused), kept with none.
        let mut child = std::process::Command::new("sleep").arg("30").spawn().unwrap();
        let live = child.id();
        let truth = start_time(live).unwrap();
        let ld = rt.subdir(&live.to_string(), Some(Access::Private)).unwrap();
        ld.write_file("start_time", format!("{truth}\n").as_bytes(), mode).unwrap();
        ld.write_file("stats.json", b"{}", mode).unwrap();
        // This process, pid 1 (alive, no record) and names that are not pids.
        for n in [std::process::id().to_string(), "1".into(), "007".into(), "x".into()] {
            rt.subdir(&n, Some(Access::Private)).unwrap();
        }
        let r = reap(&rt, &|d, n| {
            folded.borrow_mut().push(d.subdir_for_reading(n).unwrap().contains("stats.json"));
            true
        });
        assert_eq!(r.processes, vec![gone], "{r:?}");
        assert_eq!(*folded.borrow(), vec![true], "folded before the removal");
        assert!(!rt.contains(&gone.to_string()));
        assert!(rt.contains(&live.to_string()) && rt.contains("1") && rt.contains("007") && rt.contains("x"));
        ld.write_file("start_time", format!("{}\n", truth + 1).as_bytes(), mode).unwrap();
        assert_eq!(reap(&rt, &|_, _| true).processes, vec![live], "a reused pid");
        // What could not be kept stays, under its own name.
        rt.subdir(&gone.to_string(), Some(Access::Private)).unwrap();
        assert_eq!(reap(&rt, &|_, _| false), Reaped::default());
        assert!(rt.contains(&gone.to_string()));
        let _ = child.kill();
        let _ = child.wait();
        assert!(rt.entries().iter().all(|e| !e.starts_with(".reap")), "{:?}", rt.entries());
        std::fs::remove_dir_all(&root).unwrap();
    }

    #[test]
    fn a_directory_others_may_write_into_is_not_swept() {
        use std::os::unix::fs::PermissionsExt;
        let root = tmp("open");
        let rt = SafeDir::create_or_open(&root, Access::Private).unwrap();
        let gone = dead_pid().to_string();
        rt.subdir(&gone, Some(Access::Private)).unwrap();
        std::fs::set_permissions(&root, std::fs::Permissions::from_mode(0o777)).unwrap();
        assert_eq!(reap(&rt, &|_, _| true), Reaped::default());
        assert!(rt.contains(&gone));
        std::fs::remove_dir_all(&root).unwrap();
    }

    #[test]
    fn sockets_nobody_listens_on_are_reaped() {
        let root = tmp("links");
        let rt = SafeDir::create_or_open(&root, Access::Private).unwrap();
        let links = rt.subdir(LINKS, Some(Access::Private)).unwrap();
        let ns = netns().unwrap();
        let (live, dead, other_ns) =
            (format!("{ns}-127.0.0.1-1"), format!("{ns}-127.0.0.2-1"), format!("{}-127.0.0.3-1", ns + 1));
        let listener = std::os::unix::net::UnixListener::bind(root.join(LINKS).join(&live)).unwrap();
        drop(std::os::unix::net::UnixListener::bind(root.join(LINKS).join(&dead)).unwrap());
        drop(std::os::unix::net::UnixListener::bind(root.join(LINKS).join(&other_ns)).unwrap());
        // Files younger than the listing are kept (they may be bound just
        // after it): wait until these are older, bounded.
        let t0 = std::time::Instant::now();
        let mut r = Reaped::default();
        while r.sockets.is_empty() && t0.elapsed() < std::time::Duration::from_secs(30) {
            std::thread::sleep(std::time::Duration::from_millis(100));
            r = reap(&rt, &|_, _| true);
        }
        assert_eq!(r.sockets, vec![dead.clone()]);
        assert!(links.contains(&live) && links.contains(&other_ns) && !links.contains(&dead));
        drop(listener);
        std::fs::remove_dir_all(&root).unwrap();
    }
}
