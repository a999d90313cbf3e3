//! Loading peer-memory clients at device start, the user-space form of
//! nv_peer_mem's service and its `/etc/infiniband/nv_peer_mem.conf`: the
//! configuration file's `[peers] load` list decides which built-in clients
//! load (default: every one that is available), and each client's status —
//! loaded with its version, or why not — is kept for `uroce peers status`.
//!
//! Built-in clients: `storage` (one client per `[[peers.storage]]` entry,
//! named by the entry) and `nv_mem` (NVIDIA GPU memory through libcuda,
//! loaded at run time).

use super::storage::StoragePeer;
use crate::config::ConfigFile;
use std::sync::{Arc, Mutex, OnceLock};

/// Built-in client kinds, as named in `[peers] load`.
pub const KINDS: [&str; 2] = ["storage", "nv_mem"];

/// The outcome of loading one client.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct ClientStatus {
    /// Client name (the counters' directory).
    pub name: String,
    /// Built-in kind.
    pub kind: String,
    /// Whether the client is registered (for [`evaluate`] without
    /// `register`: whether it would be).
    pub loaded: bool,
    /// The client's version, when it loaded.
    pub version: Option<String>,
    /// Why it is not loaded.
    pub reason: Option<String>,
}

fn statuses() -> &'static Mutex<Vec<ClientStatus>> {
    static S: OnceLock<Mutex<Vec<ClientStatus>>> = OnceLock::new();
    S.get_or_init(Default::default)
}

/// What the last [`load_configured`] did.
pub fn status() -> Vec<ClientStatus> {
    statuses().lock().unwrap().clone()
}

/// Loads the clients `file` asks for; returns and records their status.
/// Runs once per process (later calls return the first result).
pub fn load_configured(file: &ConfigFile) -> Vec<ClientStatus> {
    static DONE: OnceLock<()> = OnceLock::new();
    if DONE.get().is_some() {
        return status();
    }
    let _ = DONE.set(());
    super::service::set_configured_stopped(&file.peers.disabled);
    let v = evaluate(file, true);
    *statuses().lock().unwrap() = v.clone();
    v
}

/// Loads the configured clients now if no device has started yet (the C
/// API's `uroce_peer_alloc` may come before `ibv_open_device`). A
/// configuration that does not parse loads none.
pub fn ensure_loaded() {
    let file = match ConfigFile::load() {
        Ok(f) => f.map(|(f, _)| f).unwrap_or_default(),
        Err(e) => {
            tracing::warn!("{e}; peer clients use defaults");
            ConfigFile::default()
        }
    };
    load_configured(&file);
}

/// Decides, and with `register` loads, each client of `file`. Without
/// `register` only tells what would load (for `uroce peers status`);
/// `loaded` then means "would load".
pub fn evaluate(file: &ConfigFile, register: bool) -> Vec<ClientStatus> {
    let wanted = |kind: &str| file.peers.load.as_ref().is_none_or(|l| l.iter().any(|k| k == kind));
    let mut out = Vec::new();
    for kind in file.peers.load.iter().flatten() {
        if !KINDS.contains(&kind.as_str()) {
            out.push(ClientStatus {
                name: kind.clone(),
                kind: kind.clone(),
                loaded: false,
                version: None,
                reason: Some(format!("unknown client kind (known: {})", KINDS.join(", "))),
            });
        }
    }
    for s in &file.peers.storage {
        let mut st =
            ClientStatus { name: s.name.clone(), kind: "storage".into(), loaded: false, version: None, reason: None };
        if !wanted("storage") {
            st.reason = Some("not in [peers] load".into());
        } else if !register {
            // Tell what would happen without creating the backing file.
            let parent_ok = s.path.parent().is_none_or(|p| p.as_os_str().is_empty() || p.is_dir());
            if s.path.exists() || parent_ok {
                st.loaded = true;
                st.version = Some(super::storage::VERSION.into());
            } else {
                st.reason = Some(format!("{}: directory does not exist", s.path.display()));
            }
        } else {
            match StoragePeer::open(&s.name, &s.path, s.capacity) {
                Err(e) => st.reason = Some(format!("{}: {e}", s.path.display())),
                Ok(peer) => {
                    st.version = Some(super::storage::VERSION.into());
                    match super::register_client(Arc::new(peer)) {
                        Ok(_) => st.loaded = true,
                        Err(e) => st.reason = Some(e.to_string()),
                    }
                }
            }
        }
        out.push(st);
    }
    if file.peers.load.as_ref().is_some_and(|l| l.iter().any(|k| k == "storage")) && file.peers.storage.is_empty() {
        out.push(ClientStatus {
            name: "storage".into(),
            kind: "storage".into(),
            loaded: false,
            version: None,
            reason: Some("no [[peers.storage]] entry declares a device".into()),
        });
    }
    let mut nv =
        ClientStatus { name: "nv_mem".into(), kind: "nv_mem".into(), loaded: false, version: None, reason: None };
    if !wanted("nv_mem") {
        nv.reason = Some("not in [peers] load".into());
    } else {
        match load_nv_mem(register) {
            Ok(version) => {
                nv.loaded = true;
                nv.version = Some(version);
            }
            Err(reason) => nv.reason = Some(reason),
        }
    }
    out.push(nv);
    out
}

/// Loads the GPU client when libcuda and a GPU are present.
fn load_nv_mem(register: bool) -> Result<String, String> {
    let client = super::nv_mem::load()?;
    let version = super::PeerMemoryClient::version(&*client).to_string();
    if register {
        super::register_client(client).map_err(|e| e.to_string())?;
    }
    Ok(version)
}
