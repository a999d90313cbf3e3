//! The runtime directory: where a process using uroce publishes what other
//! processes (the `uroce` command) read while it runs — peer-memory counters
//! and statistics — as small text files, like sysfs.
//!
//! Layout: `<runtime dir>/<pid>/…`, where the runtime directory is
//! `$UROCE_RUNTIME_DIR`, else `$XDG_RUNTIME_DIR/uroce`, else
//! `/tmp/uroce-<uid>`. A process removes its directory when it exits
//! normally; readers ignore directories whose process is gone.

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
    // SAFETY: getuid cannot fail.
    PathBuf::from(format!("/tmp/uroce-{}", unsafe { libc::getuid() }))
}

/// This process's directory, created on first use and removed at exit.
pub fn process_dir() -> &'static Path {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let d = runtime_dir().join(std::process::id().to_string());
        let _ = std::fs::create_dir_all(&d);
        extern "C" fn remove_at_exit() {
            if let Some(d) = DIR_FOR_EXIT.get() {
                let _ = std::fs::remove_dir_all(d);
            }
        }
        let _ = DIR_FOR_EXIT.set(d.clone());
        // SAFETY: registers a plain extern "C" function with no arguments.
        unsafe { libc::atexit(remove_at_exit) };
        d
    })
}

static DIR_FOR_EXIT: OnceLock<PathBuf> = OnceLock::new();

/// Writes `contents` to `path` atomically (write, then rename), creating
/// parent directories. Errors are returned for the caller to log.
pub fn write_file(path: &Path, contents: &str) -> std::io::Result<()> {
    if let Some(parent) = path.parent() {
        std::fs::create_dir_all(parent)?;
    }
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, contents)?;
    std::fs::rename(&tmp, path)
}

/// Whether process `pid` is alive (its runtime entries are current).
pub fn process_alive(pid: u32) -> bool {
    Path::new("/proc").join(pid.to_string()).exists()
}

/// The live process directories under the runtime directory, by pid.
pub fn live_processes() -> Vec<(u32, PathBuf)> {
    let mut v: Vec<(u32, PathBuf)> = std::fs::read_dir(runtime_dir())
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| Some((e.file_name().to_str()?.parse::<u32>().ok()?, e.path())))
        .filter(|(pid, _)| process_alive(*pid))
        .collect();
    v.sort();
    v
}
