//! The uroce configuration file.
//!
//! One TOML file declares the devices of a host, the peer-memory clients to
//! load, capture and statistics. It is looked up in this order, the first
//! that exists wins:
//!
//! 1. `$UROCE_CONFIG` (an explicit path; an error if it does not exist);
//! 2. `$XDG_CONFIG_HOME/uroce/uroce.toml` or `~/.config/uroce/uroce.toml`;
//! 3. `/etc/uroce/uroce.toml`.
//!
//! With no file at all, uroce runs one device on loopback. Environment
//! variables (see [`crate::verbs::DeviceConfig`]) override the file for one
//! process. An invalid file is an error naming the line and the field, and
//! uroce refuses to start rather than guess.
//!
//! ```toml
//! [[device]]                 # any number; the first is the default
//! name = "uroce0"
//! address = "192.0.2.10"     # IPv4 or IPv6 to bind (default: first free 127.0.0.x)
//! port = 4791
//! mtu = 4096                 # active MTU in bytes (default: from the interface)
//! gid_type = "RoCEv2"        # the only type uroce speaks
//! busy_poll = false
//! send_in_place = true       # payloads leave straight from registered memory
//! scatter_to_cqe = true      # inline receive
//! cqe_size = 64              # 64 or 128
//! faults = "loss=0.01"       # testing only: inject faults into received packets
//!
//! [capture]
//! file = "/tmp/uroce-%p.pcap"  # pcap of every packet (%p = pid)
//!
//! [stats]
//! publish = true             # write counters for `uroce stat`
//! interval_ms = 500
//!
//! [peers]
//! load = ["storage", "nv_mem"] # default: every client that is available
//!
//! [[peers.storage]]          # file- or block-device-backed peer memory
//! name = "ssd0"
//! path = "/var/tmp/uroce-ssd0.img"
//! capacity = 1073741824
//! ```

use serde::Deserialize;
use std::net::IpAddr;
use std::path::{Path, PathBuf};

/// The whole file.
#[derive(Debug, Clone, Default, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct ConfigFile {
    #[serde(default, rename = "device")]
    pub devices: Vec<DeviceEntry>,
    #[serde(default)]
    pub capture: CaptureSection,
    #[serde(default)]
    pub stats: StatsSection,
    #[serde(default)]
    pub peers: PeersSection,
}

/// One `[[device]]`.
#[derive(Debug, Clone, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct DeviceEntry {
    pub name: String,
    pub address: Option<IpAddr>,
    pub port: Option<u16>,
    pub mtu: Option<u32>,
    pub gid_type: Option<GidType>,
    pub busy_poll: Option<bool>,
    pub scatter_to_cqe: Option<bool>,
    pub cqe_size: Option<u32>,
    pub ipv4_any_id: Option<bool>,
    pub send_in_place: Option<bool>,
    /// Fault injection for testing (see `uroce::io::faults`).
    pub faults: Option<String>,
}

/// GID types a device may declare.
#[derive(Debug, Clone, Copy, Deserialize, PartialEq, Eq)]
pub enum GidType {
    #[serde(rename = "RoCEv2", alias = "RoCE v2", alias = "roce-v2")]
    RoceV2,
}

#[derive(Debug, Clone, Default, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct CaptureSection {
    pub file: Option<String>,
}

#[derive(Debug, Clone, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct StatsSection {
    #[serde(default = "yes")]
    pub publish: bool,
    #[serde(default = "default_interval")]
    pub interval_ms: u64,
}

impl Default for StatsSection {
    fn default() -> Self {
        StatsSection { publish: true, interval_ms: default_interval() }
    }
}

fn yes() -> bool {
    true
}

fn default_interval() -> u64 {
    500
}

#[derive(Debug, Clone, Default, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct PeersSection {
    /// Clients to load; `None`: every available one.
    pub load: Option<Vec<String>>,
    #[serde(default)]
    pub storage: Vec<StorageEntry>,
}

/// One `[[peers.storage]]`.
#[derive(Debug, Clone, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct StorageEntry {
    pub name: String,
    pub path: PathBuf,
    pub capacity: u64,
}

/// A configuration error: which file, and what (with line and field).
#[derive(Debug, Clone, thiserror::Error)]
#[error("{path}: {message}")]
pub struct ConfigError {
    pub path: PathBuf,
    pub message: String,
}

impl ConfigFile {
    /// Parses file text; `path` names it in errors.
    pub fn parse(text: &str, path: &Path) -> Result<ConfigFile, ConfigError> {
        let err = |message: String| ConfigError { path: path.to_path_buf(), message };
        let c: ConfigFile = toml::from_str(text).map_err(|e| err(e.to_string().trim_end().to_string()))?;
        c.validate().map_err(err)?;
        Ok(c)
    }

    /// Rules serde cannot express.
    fn validate(&self) -> Result<(), String> {
        let mut names = std::collections::HashSet::new();
        for (i, d) in self.devices.iter().enumerate() {
            let at = format!("device[{i}] ({})", d.name);
            if d.name.is_empty() || d.name.len() > 63 {
                return Err(format!("{at}: field `name` must be 1..63 characters"));
            }
            if !names.insert(&d.name) {
                return Err(format!("{at}: field `name`: duplicate device name"));
            }
            if let Some(m) = d.mtu {
                if !(256..=4096).contains(&m) {
                    return Err(format!("{at}: field `mtu`: {m} outside 256..4096"));
                }
            }
            if let Some(c) = d.cqe_size {
                if c != 64 && c != 128 {
                    return Err(format!("{at}: field `cqe_size`: {c} is not 64 or 128"));
                }
            }
        }
        if self.stats.interval_ms == 0 {
            return Err("[stats]: field `interval_ms` must be positive".into());
        }
        for (i, s) in self.peers.storage.iter().enumerate() {
            if s.capacity == 0 {
                return Err(format!("peers.storage[{i}] ({}): field `capacity` must be positive", s.name));
            }
        }
        Ok(())
    }

    /// The file in effect (see the module docs) and where it came from;
    /// `Ok(None)` when there is none.
    pub fn load() -> Result<Option<(ConfigFile, PathBuf)>, ConfigError> {
        let Some(path) = Self::path()? else { return Ok(None) };
        let text = std::fs::read_to_string(&path)
            .map_err(|e| ConfigError { path: path.clone(), message: format!("cannot read: {e}") })?;
        Ok(Some((Self::parse(&text, &path)?, path)))
    }

    /// The path of the file in effect, if any.
    pub fn path() -> Result<Option<PathBuf>, ConfigError> {
        if let Some(p) = std::env::var_os("UROCE_CONFIG").filter(|p| !p.is_empty()) {
            let p = PathBuf::from(p);
            if !p.exists() {
                return Err(ConfigError { path: p, message: "UROCE_CONFIG names a file that does not exist".into() });
            }
            return Ok(Some(p));
        }
        let user = std::env::var_os("XDG_CONFIG_HOME")
            .filter(|p| !p.is_empty())
            .map(PathBuf::from)
            .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".config")))
            .map(|d| d.join("uroce/uroce.toml"));
        Ok([user, Some(PathBuf::from("/etc/uroce/uroce.toml"))].into_iter().flatten().find(|p| p.exists()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(t: &str) -> Result<ConfigFile, ConfigError> {
        ConfigFile::parse(t, Path::new("test.toml"))
    }

    #[test]
    fn full_file() {
        let c = parse(
            r#"
[[device]]
name = "a"
address = "127.0.0.5"
mtu = 1024
gid_type = "RoCEv2"
[[device]]
name = "b"
[capture]
file = "/tmp/x.pcap"
[stats]
interval_ms = 100
[peers]
load = ["storage"]
[[peers.storage]]
name = "ssd0"
path = "/tmp/ssd0.img"
capacity = 4096
"#,
        )
        .unwrap();
        assert_eq!(c.devices.len(), 2);
        assert_eq!(c.devices[0].address, Some("127.0.0.5".parse().unwrap()));
        assert_eq!(c.stats, StatsSection { publish: true, interval_ms: 100 });
        assert_eq!(c.peers.storage[0].capacity, 4096);
        assert_eq!(parse("").unwrap(), ConfigFile::default());
    }

    #[test]
    fn errors_name_line_and_field() {
        let e = parse("[[device]]\nname = \"a\"\nadress = \"1.2.3.4\"\n").unwrap_err().to_string();
        assert!(e.contains("line 3") && e.contains("adress"), "{e}");
        let e = parse("[[device]]\nname = \"a\"\nport = 70000\n").unwrap_err().to_string();
        assert!(e.contains("line 3") && e.contains("port"), "{e}");
        let e = parse("[[device]]\nname = \"a\"\nmtu = 9000\n").unwrap_err().to_string();
        assert!(e.contains("mtu") && e.contains("9000"), "{e}");
        let e = parse("[[device]]\nname = \"a\"\ngid_type = \"RoCEv1\"\n").unwrap_err().to_string();
        assert!(e.contains("line 3") && e.contains("RoCEv1"), "{e}");
        let e = parse("[[device]]\nname = \"a\"\n[[device]]\nname = \"a\"\n").unwrap_err().to_string();
        assert!(e.contains("duplicate"), "{e}");
    }
}
