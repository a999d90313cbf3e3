//! The runtime directory: where a process using uroce publishes what other
//! processes (the `uroce` command) read while it runs — peer-memory counters
//! and statistics — as small text files, like sysfs, and where it takes
//! requests (`capture.request`).
//!
//! Layout: `<runtime dir>/<pid>/…`, where the runtime directory is
//! `$UROCE_RUNTIME_DIR`, else `$XDG_RUNTIME_DIR/uroce`, else
//! `/tmp/uroce-<uid>`. A process removes its directory when it exits
//! normally; readers ignore directories whose process is gone, and what a
//! process killed (SIGKILL) left — its directory and its link sockets — is
//! reaped ([`reap`]) by the next process that opens its own directory and
//! by each reader (`uroce stat`, `uroce peers`), in this user's own
//! directory only. Each process records its start time in
//! `<pid>/start_time`, so that a reused pid is told from the one that died.
//!
//! The directory may have been created by someone else (`/tmp` is shared),
//! so it is trusted only after [`dir::SafeDir`]'s checks: created with mode
//! 0700 if absent, opened without following a link, owned by this process's
//! effective uid and writable by no one else, and every file below it is
//! reached through that descriptor. A directory that fails is refused with
//! one message on stderr naming it and why, and the process runs on without
//! publishing (no statistics, no `uroce capture`). `[stats] world_readable =
//! true` in the configuration makes the directories 0755 and the files 0644
//! so that other users can run `uroce stat` on this user's processes.

pub mod dir;
pub mod reap;

pub use dir::{Access, Refused, SafeDir};
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

/// The runtime directory (not created here).
pub fn runtime_dir() -> PathBuf {
    if let Some(d) = std::env::var_os("UROCE_RUNTIME_DIR").filter(|d| !d.is_empty()) {
        return PathBuf::from(d);
    }
    if let Some(d) = std::env::var_os("XDG_RUNTIME_DIR").filter(|d| !d.is_empty()) {
        return PathBuf::from(d).join("uroce");
    }
    PathBuf::from(format!("/tmp/uroce-{}", dir::euid()))
}

/// This process's directory and the runtime directory holding it.
pub struct ProcessDir {
    runtime: SafeDir,
    name: String,
    dir: SafeDir,
    access: Access,
}

impl ProcessDir {
    /// The verified directory `<runtime dir>/<pid>`.
    pub fn dir(&self) -> &SafeDir {
        &self.dir
    }

    #[cfg(feature = "unstable")]
    /// Mode of the files it holds (0600, or 0644 when world-readable).
    pub fn file_mode(&self) -> u32 {
        self.access.file_mode()
    }

    /// Writes `contents` to `<pid>/<subdirs…>/<name>` (see
    /// [`SafeDir::write_file`]), creating the subdirectories.
    pub fn write(&self, subdirs: &[&str], name: &str, contents: &str) -> std::io::Result<()> {
        let mut owned: Option<SafeDir> = None;
        for s in subdirs {
            let d = owned.as_ref().unwrap_or(&self.dir).subdir(s, Some(self.access)).map_err(std::io::Error::other)?;
            owned = Some(d);
        }
        owned.as_ref().unwrap_or(&self.dir).write_file(name, contents.as_bytes(), self.access.file_mode())
    }
}

/// What must outlive a process directory, kept by a layer above this one
/// before the directory is removed (this process's at exit, a dead one's
/// when reaped): `mem::peer` folds the peer-memory counters into the host
/// totals. The runtime imports nothing above it; they register here.
/// It returns once what it keeps is safe elsewhere (`Err`: the directory
/// stays, for a later process or reader to keep).
pub type Keeper = fn(rt: &SafeDir, dir_name: &str, file_mode: u32) -> std::io::Result<()>;

static KEEPER: OnceLock<Keeper> = OnceLock::new();

/// Registers the [`Keeper`] (the first registration stands). Every caller
/// that may open the process directory does it first (`mem::peer` before
/// it publishes, `verbs::publish`), so that a process that removes a
/// directory keeps what it holds; a dead process's directory is left
/// alone while no keeper is registered.
pub fn set_keeper(k: Keeper) {
    let _ = KEEPER.set(k);
}

/// Runs the keeper on directory `name` of `rt`: whether what it holds was
/// kept (false when no keeper is registered; then a directory with
/// anything to keep is left alone).
fn keep(rt: &SafeDir, name: &str, file_mode: u32) -> bool {
    KEEPER.get().is_some_and(|k| k(rt, name, file_mode).is_ok())
}

fn access_from_config() -> Access {
    match crate::config::ConfigFile::load() {
        Ok(Some((f, _))) if f.stats.world_readable => Access::WorldReadable,
        _ => Access::Private,
    }
}

/// Opens (creating) and checks the runtime directory and this process's
/// directory in it, emptied of what a process with the same pid left.
pub fn open_process_dir(root: &Path, access: Access) -> Result<ProcessDir, Refused> {
    let runtime = SafeDir::create_or_open(root, access)?;
    let name = std::process::id().to_string();
    if runtime.contains(&name) {
        // An earlier process with this pid: what it left to keep (its peer
        // counters) is kept first; the directory goes in any case (it is
        // this process's now; every caller registered the keeper).
        let _ = keep(&runtime, &name, access.file_mode());
        let _ = runtime.remove_tree(&name, 4);
    }
    reap_dead(&runtime);
    let dir = runtime.subdir(&name, Some(access))?;
    if let Err(e) = dir.write_file("start_time", reap::start_time_record().as_bytes(), access.file_mode()) {
        tracing::debug!("{}: cannot record the start time: {e}", root.display());
    }
    Ok(ProcessDir { runtime, name, dir, access })
}

/// Reaps what dead processes left in `rt` (see [`reap`]), when it is this
/// user's and no one else may write into it; their peer-memory counters are
/// folded into the host totals first, as at a normal exit.
pub fn reap_dead(rt: &SafeDir) -> reap::Reaped {
    let file_mode = if rt.mode().is_ok_and(|m| m & 0o055 != 0) { 0o644 } else { 0o600 };
    let keeper = |rt: &SafeDir, name: &str| keep(rt, name, file_mode) || !holds_more_than_stats(rt, name);
    let r = reap::reap(rt, &keeper);
    if r != reap::Reaped::default() {
        tracing::debug!("reaped dead processes {:?} and link sockets {:?}", r.processes, r.sockets);
    }
    r
}

/// Whether process directory `name` holds something a [`Keeper`] keeps
/// (a `memory_peers` directory), beyond what dies with the process.
fn holds_more_than_stats(rt: &SafeDir, name: &str) -> bool {
    rt.subdir_for_reading(name).is_ok_and(|d| d.contains("memory_peers"))
}

/// This process's directory, created and checked on first use and removed
/// at exit; `None` when the runtime directory was refused (said once on
/// stderr) — then nothing is published.
pub fn process_dir() -> Option<&'static ProcessDir> {
    DIR.get_or_init(|| match open_process_dir(&runtime_dir(), access_from_config()) {
        Ok(d) => {
            extern "C" fn remove_at_exit() {
                if let Some(Some(d)) = DIR.get() {
                    // Peer counters outlive the process in the host totals.
                    if keep(&d.runtime, &d.name, d.access.file_mode()) || !holds_more_than_stats(&d.runtime, &d.name) {
                        let _ = d.runtime.remove_tree(&d.name, 4);
                    }
                }
            }
            // SAFETY: registers a plain extern "C" function with no arguments.
            unsafe { libc::atexit(remove_at_exit) };
            Some(d)
        }
        Err(e) => {
            eprintln!("uroce: not publishing statistics (uroce stat and uroce capture will not see this process): {e}");
            tracing::warn!("runtime directory refused: {e}");
            None
        }
    })
    .as_ref()
}

static DIR: OnceLock<Option<ProcessDir>> = OnceLock::new();

/// Writes `<pid>/<subdirs…>/<name>` in this process's directory (see
/// [`ProcessDir::write`]). Errors are returned for the caller to log.
pub fn write_process_file(subdirs: &[&str], name: &str, contents: &str) -> std::io::Result<()> {
    match process_dir() {
        Some(d) => d.write(subdirs, name, contents),
        None => Err(std::io::Error::other("the runtime directory was refused; publishing is off")),
    }
}

/// Whether process `pid` is alive (its runtime entries are current).
pub fn process_alive(pid: u32) -> bool {
    Path::new("/proc").join(pid.to_string()).exists()
}

/// What a reader (`uroce stat`, `uroce peers`) finds: the live process
/// directories by pid, opened without following links, and what it skipped.
#[derive(Debug, Default)]
pub struct Listing {
    pub processes: Vec<(u32, SafeDir)>,
    pub skipped: Vec<String>,
}

/// The live process directories under the runtime directory. The default
/// directory must belong to this user; one named by `$UROCE_RUNTIME_DIR` may
/// belong to another (world-readable statistics). Nothing is followed
/// through a link.
pub fn live_processes() -> Listing {
    let mut l = Listing::default();
    let root = runtime_dir();
    if std::fs::symlink_metadata(&root).is_err() {
        return l;
    }
    let rt = match SafeDir::open_for_reading(&root) {
        Ok(d) => d,
        Err(e) => {
            l.skipped.push(e.to_string());
            return l;
        }
    };
    let explicit = std::env::var_os("UROCE_RUNTIME_DIR").is_some_and(|d| !d.is_empty());
    if !explicit {
        if let Ok(o) = rt.owner() {
            if o != dir::euid() {
                l.skipped.push(format!("{}: owned by uid {o}, not by uid {} (ignored)", root.display(), dir::euid()));
                return l;
            }
        }
    }
    // What killed processes left goes (only where this user owns it all).
    reap_dead(&rt);
    let mut pids: Vec<u32> = rt.entries().iter().filter_map(|n| n.parse().ok()).collect();
    pids.sort();
    for pid in pids.into_iter().filter(|p| process_alive(*p)) {
        match rt.subdir_for_reading(&pid.to_string()) {
            Ok(d) => l.processes.push((pid, d)),
            Err(e) => l.skipped.push(e.to_string()),
        }
    }
    l
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    fn mode(p: &Path) -> u32 {
        std::fs::metadata(p).unwrap().permissions().mode() & 0o777
    }

    #[test]
    fn private_by_default_world_readable_when_configured() {
        let root = std::env::temp_dir().join(format!("uroce-rt-test-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        let me = std::process::id().to_string();
        set_keeper(crate::mem::peer::totals::fold_process);
        let d = open_process_dir(&root, Access::Private).unwrap();
        d.write(&["memory_peers", "ssd0"], "version", "1\n").unwrap();
        assert_eq!((mode(&root), mode(&root.join(&me))), (0o700, 0o700));
        assert_eq!(mode(&root.join(&me).join("memory_peers/ssd0/version")), 0o600);
        assert!(d.write(&[".."], "x", "").is_err(), "one component at a time");
        // A stale directory of an earlier process with this pid is emptied.
        drop(d);
        let d = open_process_dir(&root, Access::WorldReadable).unwrap();
        assert!(!root.join(&me).join("memory_peers").exists());
        d.write(&[], "stats.json", "{}").unwrap();
        assert_eq!((mode(&root), mode(&root.join(&me))), (0o755, 0o755));
        assert_eq!(mode(&root.join(&me).join("stats.json")), 0o644);
        std::fs::remove_dir_all(&root).unwrap();
    }
}
