//! Host-wide peer-memory totals: the user-space form of the system-wide
//! `/sys/kernel/mm/memory_peers/<client>/` counters.
//!
//! Each process publishes its own counters under
//! `<runtime dir>/<pid>/memory_peers/<client>/`. When it exits (normally: at
//! `exit`; abnormally: found dead by the next reader, `uroce peers`, or by a
//! new process given the same pid), its counters are *folded* into
//! `<runtime dir>/memory_peers.exited/<client>` — regions it still had
//! registered counted as deallocated and unmapped by the exit
//! ([`PeerStats::at_exit`]) — and its `memory_peers` directory is removed,
//! under an exclusive lock on `<runtime dir>/memory_peers.lock`, so each
//! process is folded once. The host total of a client is then the folded
//! total plus every live process's counters ([`host`]). Everything is
//! reached through the verified runtime directory's descriptor
//! (`SafeDir`); folding is done only in a runtime directory this user
//! owns.

use super::stats::{PeerStats, COUNTERS};
use crate::runtime::SafeDir;
use std::collections::BTreeMap;

/// Directory of the folded totals, in the runtime directory.
pub const EXITED_DIR: &str = "memory_peers.exited";
const LOCK: &str = "memory_peers.lock";
/// Largest counter file read.
const CAP: u64 = 4096;

/// One process's published clients: `counters` (all counters of one
/// moment) or, from an older writer, the per-counter files.
pub fn read_process(pid_dir: &SafeDir, skipped: &mut Vec<String>) -> Vec<PeerStats> {
    let Ok(peers) = pid_dir.subdir_for_reading("memory_peers") else { return Vec::new() };
    let mut names = peers.entries();
    names.sort();
    let mut out = Vec::new();
    for name in names {
        let p = match peers.subdir_for_reading(&name) {
            Ok(p) => p,
            Err(e) => {
                skipped.push(e.to_string());
                continue;
            }
        };
        let mut read = |f: &str| match p.read_file(f, CAP, false) {
            Ok(b) => b.map(|b| String::from_utf8_lossy(&b).into_owned()),
            Err(e) => {
                skipped.push(format!("{}: {e}", p.path().join(f).display()));
                None
            }
        };
        if let Some(t) = read("counters") {
            out.push(PeerStats::from_text(&name, &t));
            continue;
        }
        let mut s = PeerStats { name: name.clone(), ..Default::default() };
        s.version = read("version").unwrap_or_default().trim().to_string();
        for c in COUNTERS {
            s.set(c, read(c).and_then(|v| v.trim().parse().ok()).unwrap_or(0));
        }
        out.push(s);
    }
    out
}

/// The folded totals of exited processes, by client.
pub fn exited(rt: &SafeDir, skipped: &mut Vec<String>) -> BTreeMap<String, PeerStats> {
    let mut out = BTreeMap::new();
    let Ok(d) = rt.subdir_for_reading(EXITED_DIR) else { return out };
    for name in d.entries() {
        if name.starts_with('.') {
            continue;
        }
        match d.read_file(&name, CAP, false) {
            Ok(Some(b)) => {
                out.insert(name.clone(), PeerStats::from_text(&name, &String::from_utf8_lossy(&b)));
            }
            Ok(None) => {}
            Err(e) => skipped.push(format!("{}: {e}", d.path().join(&name).display())),
        }
    }
    out
}

/// Folds the counters of process directory `pid` into the totals and
/// removes its `memory_peers` directory (see the module docs). Call it only
/// for a process that has exited, or for this process at its exit.
pub fn fold_process(rt: &SafeDir, pid: &str, file_mode: u32) -> std::io::Result<()> {
    let _lock = rt.lock(LOCK)?;
    fold_locked(rt, pid, file_mode)
}

fn fold_locked(rt: &SafeDir, pid: &str, file_mode: u32) -> std::io::Result<()> {
    let Ok(dir) = rt.subdir_for_reading(pid) else { return Ok(()) };
    if !dir.contains("memory_peers") {
        return Ok(());
    }
    let mut skipped = Vec::new();
    let procs = read_process(&dir, &mut skipped);
    if !procs.is_empty() {
        let mut totals = exited(rt, &mut skipped);
        let access = if file_mode & 0o044 != 0 {
            crate::runtime::Access::WorldReadable
        } else {
            crate::runtime::Access::Private
        };
        let out = rt.subdir(EXITED_DIR, Some(access)).map_err(std::io::Error::other)?;
        for p in procs {
            let t = totals
                .entry(p.name.clone())
                .or_insert_with(|| PeerStats { name: p.name.clone(), ..Default::default() });
            t.add(&p.at_exit());
            if !p.version.is_empty() {
                t.version = p.version.clone();
            }
            out.write_file(&p.name, t.to_text().as_bytes(), file_mode)?;
        }
    }
    // Only after the totals are written: a failure above leaves the
    // process's counters to be folded by the next reader.
    let parent = rt.subdir(pid, None).map_err(std::io::Error::other)?;
    parent.remove_tree("memory_peers", 2)
}

/// Folds every process directory whose process is gone. Nothing is done
/// in a runtime directory owned by another user.
pub fn fold_exited(rt: &SafeDir, file_mode: u32) -> std::io::Result<()> {
    if rt.owner()? != crate::runtime::dir::euid() {
        return Ok(());
    }
    let dead: Vec<String> = rt
        .entries()
        .into_iter()
        .filter(|n| n.parse::<u32>().is_ok_and(|p| !crate::runtime::process_alive(p)))
        .collect();
    if dead.is_empty() {
        return Ok(());
    }
    let _lock = rt.lock(LOCK)?;
    for pid in dead {
        fold_locked(rt, &pid, file_mode)?;
    }
    Ok(())
}

/// The host's counters: per client, the exited total plus every live
/// process's; and per live process its own.
#[derive(Debug, Default)]
pub struct Host {
    /// Per client: the exited processes' folded total plus every live
    /// process's counters.
    pub totals: Vec<PeerStats>,
    /// Per client: the folded total of the exited processes.
    pub exited: Vec<PeerStats>,
    /// Each live process's counters, by pid.
    pub processes: Vec<(u32, PeerStats)>,
    /// What could not be read or folded, one message each.
    pub skipped: Vec<String>,
}

/// Reads (folding first what exited processes left, where this user may)
/// the host's counters from the runtime directory.
pub fn host() -> Host {
    let mut h = Host::default();
    let root = crate::runtime::runtime_dir();
    if std::fs::symlink_metadata(&root).is_err() {
        return h;
    }
    // Folded only in this user's own directory; another user's
    // (world-readable) one is read as it is.
    if let Ok(rt) = SafeDir::open_owned(&root) {
        let mode = std::fs::symlink_metadata(&root).map(|m| std::os::unix::fs::PermissionsExt::mode(&m.permissions()));
        let file_mode = if mode.is_ok_and(|m| m & 0o055 != 0) { 0o644 } else { 0o600 };
        if let Err(e) = fold_exited(&rt, file_mode) {
            h.skipped.push(format!("{}: cannot fold exited processes: {e}", root.display()));
        }
    }
    let listing = crate::runtime::live_processes();
    h.skipped.extend(listing.skipped);
    let Ok(rt) = SafeDir::open_for_reading(&root) else { return h };
    let exited = exited(&rt, &mut h.skipped);
    let mut totals = exited.clone();
    for (pid, dir) in &listing.processes {
        for s in read_process(dir, &mut h.skipped) {
            let t = totals
                .entry(s.name.clone())
                .or_insert_with(|| PeerStats { name: s.name.clone(), ..Default::default() });
            t.add(&s);
            t.version = s.version.clone();
            h.processes.push((*pid, s));
        }
    }
    h.totals = totals.into_values().collect();
    h.exited = exited.into_values().collect();
    h
}
