//! Starting and stopping peer-memory clients: the user-space form of
//! nv_peer_mem's `service nv_peer_mem start|stop` and of its boot setting
//! in `/etc/infiniband/nv_peer_mem.conf`.
//!
//! A kernel client is loaded or unloaded; a user-space client lives in each
//! process using uroce, so here *stopped* means: loaded, but asked by no new
//! registration (as after `ib_unregister_peer_memory_client`) — regions it
//! already backs keep working until deregistered — and *started* the
//! opposite. The state has two sources:
//!
//! - the configuration's `[peers] disabled` list, read when a process loads
//!   its clients (the boot setting: what new processes start with);
//! - `<runtime dir>/memory_peers.state`, one `<client> started|stopped` line
//!   per client, written by `uroce peers start|stop` and read by every
//!   running process at each registration; it overrides the configuration.
//!
//! `uroce peers start|stop` writes both (the configuration file when there
//! is one), so the change reaches running processes at once and new ones
//! after.

use crate::runtime::SafeDir;
use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Mutex, OnceLock};

/// The state file, in the runtime directory.
pub const STATE_FILE: &str = "memory_peers.state";
#[cfg(feature = "unstable")]
const LOCK: &str = "memory_peers.lock";

fn configured() -> &'static Mutex<BTreeSet<String>> {
    static C: OnceLock<Mutex<BTreeSet<String>>> = OnceLock::new();
    C.get_or_init(Default::default)
}

/// Records the configuration's `[peers] disabled` list (at client loading).
pub fn set_configured_stopped(names: &[String]) {
    *configured().lock().unwrap() = names.iter().cloned().collect();
}

/// Parses the state file: client -> started (true) or stopped (false);
/// malformed lines are ignored.
pub fn parse_state(text: &str) -> BTreeMap<String, bool> {
    text.lines()
        .filter_map(|l| match l.split_once(' ')? {
            (n, "started") => Some((n.to_string(), true)),
            (n, "stopped") => Some((n.to_string(), false)),
            _ => None,
        })
        .collect()
}

/// The state file's contents (empty when absent or unreadable).
pub fn read_state(rt: &SafeDir) -> BTreeMap<String, bool> {
    match rt.read_file(STATE_FILE, 64 * 1024, true) {
        Ok(Some(b)) => parse_state(&String::from_utf8_lossy(&b)),
        _ => BTreeMap::new(),
    }
}

/// The clients stopped now for this process: the configuration's list,
/// overridden by the state file of this user's runtime directory.
pub fn stopped_now() -> BTreeSet<String> {
    let mut s = configured().lock().unwrap().clone();
    let root = crate::runtime::runtime_dir();
    if std::fs::symlink_metadata(&root).is_err() {
        return s;
    }
    if let Ok(rt) = SafeDir::open_owned(&root) {
        for (name, started) in read_state(&rt) {
            if started {
                s.remove(&name);
            } else {
                s.insert(name);
            }
        }
    }
    s
}

/// Whether `name` is a valid client name (1..63 bytes, no '/', no space).
#[cfg(feature = "unstable")]
pub fn valid_name(name: &str) -> bool {
    !name.is_empty() && name.len() <= 63 && !name.contains(['/', ' ', '\n']) && name != "." && name != ".."
}

/// Records `names` as started or stopped in the state file of the runtime
/// directory `rt` (under the peer-memory lock; written atomically).
#[cfg(feature = "unstable")]
pub fn set_state(rt: &SafeDir, names: &[String], started: bool, file_mode: u32) -> std::io::Result<()> {
    if let Some(n) = names.iter().find(|n| !valid_name(n)) {
        return Err(std::io::Error::new(std::io::ErrorKind::InvalidInput, format!("invalid client name {n:?}")));
    }
    let _lock = rt.lock(LOCK)?;
    let mut st = read_state(rt);
    for n in names {
        st.insert(n.clone(), started);
    }
    let text: String = st.iter().map(|(n, s)| format!("{n} {}\n", if *s { "started" } else { "stopped" })).collect();
    rt.write_file(STATE_FILE, text.as_bytes(), file_mode)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn state_file_round_trip_and_override() {
        let root = std::env::temp_dir().join(format!("uroce-peer-service-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        let rt = SafeDir::create_or_open(&root, crate::runtime::Access::Private).unwrap();
        set_state(&rt, &["a".into(), "b".into()], false, 0o600).unwrap();
        set_state(&rt, &["b".into()], true, 0o600).unwrap();
        let st = read_state(&rt);
        assert_eq!(st, BTreeMap::from([("a".to_string(), false), ("b".to_string(), true)]));
        assert!(set_state(&rt, &["x/y".into()], false, 0o600).is_err());
        assert_eq!(parse_state("a stopped\ngarbage\nb maybe\n"), BTreeMap::from([("a".to_string(), false)]));
        std::fs::remove_dir_all(&root).unwrap();
    }
}
