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
//! uroce refuses to start rather than guess: an address that is
//! unspecified (`0.0.0.0`, `::`), the limited broadcast or multicast, port 0
//! and an MTU that is not an IB MTU are refused in the file as in the
//! environment (see [`check_address`], [`check_port`], [`check_mtu`]).
//!
//! ```toml
//! [[device]]                 # any number; the first is the default
//! name = "uroce0"
//! address = "192.0.2.10"     # IPv4 or IPv6 to bind (default: first free 127.0.0.x)
//! port = 4791
//! mtu = 4096                 # active MTU: 256, 512, 1024, 2048 or 4096 (default: from the interface)
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
//! world_readable = false     # true: other users may read them (0755/0644)
//!
//! [peers]
//! load = ["storage", "nv_mem"] # default: every client that is available
//! disabled = []                # loaded but not used for new registrations
//!                              # (`uroce peers stop/start` edit it)
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
    /// The `[[device]]` entries; the first is the default device.
    #[serde(default, rename = "device")]
    pub devices: Vec<DeviceEntry>,
    /// `[capture]`.
    #[serde(default)]
    pub capture: CaptureSection,
    /// `[stats]`.
    #[serde(default)]
    pub stats: StatsSection,
    /// `[peers]`.
    #[serde(default)]
    pub peers: PeersSection,
}

/// One `[[device]]`.
#[derive(Debug, Clone, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct DeviceEntry {
    /// The device's name: 1 to 63 characters, unique in the file.
    pub name: String,
    /// The IPv4 or IPv6 address to bind (unicast); `None`: the first free
    /// 127.0.0.x.
    pub address: Option<IpAddr>,
    /// The UDP port; `None`: 4791.
    pub port: Option<u16>,
    /// The active MTU in bytes: 256, 512, 1024, 2048 or 4096; `None`: from
    /// the interface.
    pub mtu: Option<u32>,
    /// The GID type; RoCEv2 is the only one.
    pub gid_type: Option<GidType>,
    /// Spin on the socket instead of sleeping (lower latency, one busy
    /// core); `None`: off.
    pub busy_poll: Option<bool>,
    /// Inline receive (scatter-to-CQE) for QPs that do not choose; `None`:
    /// on.
    pub scatter_to_cqe: Option<bool>,
    /// CQE size in bytes: 64 (messages of up to 32 bytes inline) or 128 (up
    /// to 64); `None`: 64.
    pub cqe_size: Option<u32>,
    /// IPv4: accept from any peer a packet whose ICRC only verifies with an
    /// IP Identification solved from it (see the engine's `ipv4_any_id`);
    /// `None`: off.
    pub ipv4_any_id: Option<bool>,
    /// Send payloads of pinned host memory straight from the registered
    /// buffer, without copying them into the packet; `None`: on.
    pub send_in_place: Option<bool>,
    /// Fault injection for testing (see `uroce::io::faults`).
    pub faults: Option<String>,
}

/// GID types a device may declare.
#[derive(Debug, Clone, Copy, Deserialize, PartialEq, Eq)]
pub enum GidType {
    /// RoCE v2: GIDs are IP addresses and packets travel in UDP/IP
    /// (`RoCEv2`, `RoCE v2` or `roce-v2` in the file).
    #[serde(rename = "RoCEv2", alias = "RoCE v2", alias = "roce-v2")]
    RoceV2,
}

/// `[capture]`.
#[derive(Debug, Clone, Default, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct CaptureSection {
    /// A pcap file every packet sent and received is written to; `%p`
    /// becomes the process id.
    pub file: Option<String>,
}

/// `[stats]`.
#[derive(Debug, Clone, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct StatsSection {
    /// Publish the counters for `uroce stat` (default: true).
    #[serde(default = "yes")]
    pub publish: bool,
    /// How often the published counters are refreshed, in milliseconds
    /// (positive; default: 500).
    #[serde(default = "default_interval")]
    pub interval_ms: u64,
    /// Publish for other users too: directories 0755 and files 0644 instead
    /// of 0700/0600 (see `runtime::dir`).
    #[serde(default)]
    pub world_readable: bool,
}

impl Default for StatsSection {
    fn default() -> Self {
        StatsSection { publish: true, interval_ms: default_interval(), world_readable: false }
    }
}

fn yes() -> bool {
    true
}

fn default_interval() -> u64 {
    500
}

/// `[peers]`: the peer-memory clients.
#[derive(Debug, Clone, Default, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct PeersSection {
    /// Clients to load; `None`: every available one.
    pub load: Option<Vec<String>>,
    /// Clients loaded but stopped: no new registration goes through them
    /// (`uroce peers stop`; see `mem::peer::service`).
    #[serde(default)]
    pub disabled: Vec<String>,
    /// The `[[peers.storage]]` devices.
    #[serde(default)]
    pub storage: Vec<StorageEntry>,
}

/// One `[[peers.storage]]`.
#[derive(Debug, Clone, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct StorageEntry {
    /// The device's name.
    pub name: String,
    /// The backing file (created if missing) or block device.
    pub path: PathBuf,
    /// Its size in bytes (positive; rounded up to whole 4096-byte pages).
    pub capacity: u64,
}

/// A configuration error: which file, and what (with line and field).
#[derive(Debug, Clone, thiserror::Error)]
#[error("{path}: {message}")]
pub struct ConfigError {
    /// The file.
    pub path: PathBuf,
    /// What is wrong, naming the line and field where it can.
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
                check_mtu(m).map_err(|e| format!("{at}: field `mtu`: {e}"))?;
            }
            if let Some(a) = d.address {
                check_address(a).map_err(|e| format!("{at}: field `address`: {e}"))?;
            }
            if let Some(p) = d.port {
                check_port(p).map_err(|e| format!("{at}: field `port`: {e}"))?;
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

/// An address a device may bind: a unicast address, not `0.0.0.0`/`::`
/// (a GID names one address), not the limited broadcast, not multicast.
pub fn check_address(a: IpAddr) -> Result<(), String> {
    if a.is_unspecified() {
        return Err(format!("{a} is unspecified; a device needs one unicast address (its GID)"));
    }
    if a.is_multicast() {
        return Err(format!("{a} is a multicast address; a device needs a unicast address"));
    }
    if a == IpAddr::V4(std::net::Ipv4Addr::BROADCAST) {
        return Err(format!("{a} is the broadcast address; a device needs a unicast address"));
    }
    Ok(())
}

/// A UDP port a device may use: not 0.
pub fn check_port(p: u16) -> Result<(), String> {
    if p == 0 {
        return Err("0 is not a port (RoCEv2 uses 4791)".into());
    }
    Ok(())
}

/// An IB MTU in bytes: 256, 512, 1024, 2048 or 4096.
pub fn check_mtu(m: u32) -> Result<crate::ib::Mtu, String> {
    match m {
        256 | 512 | 1024 | 2048 | 4096 => Ok(crate::ib::Mtu::from_bytes_floor(m)),
        _ => Err(format!("{m} is not an IB MTU (256, 512, 1024, 2048 or 4096)")),
    }
}

/// A boolean setting: `1`, `true`, `yes`, `on` or `0`, `false`, `no`, `off`
/// (any case); anything else is refused.
pub fn parse_bool(v: &str) -> Result<bool, String> {
    match v.to_ascii_lowercase().as_str() {
        "1" | "true" | "yes" | "on" => Ok(true),
        "0" | "false" | "no" | "off" => Ok(false),
        _ => Err(format!("{v:?} is not a boolean (1/0, true/false, yes/no, on/off)")),
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
        assert_eq!(c.stats, StatsSection { publish: true, interval_ms: 100, world_readable: false });
        assert_eq!(c.peers.storage[0].capacity, 4096);
        assert_eq!(parse("").unwrap(), ConfigFile::default());
    }

    #[test]
    fn booleans_are_strict() {
        for t in ["1", "true", "YES", "on"] {
            assert_eq!(parse_bool(t), Ok(true));
        }
        for f in ["0", "false", "no", "Off"] {
            assert_eq!(parse_bool(f), Ok(false));
        }
        for bad in ["", "2", "y", "enable", "yes please"] {
            assert!(parse_bool(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn errors_name_line_and_field() {
        let e = parse("[[device]]\nname = \"a\"\nadress = \"1.2.3.4\"\n").unwrap_err().to_string();
        assert!(e.contains("line 3") && e.contains("adress"), "{e}");
        let e = parse("[[device]]\nname = \"a\"\nport = 70000\n").unwrap_err().to_string();
        assert!(e.contains("line 3") && e.contains("port"), "{e}");
        let e = parse("[[device]]\nname = \"a\"\nmtu = 9000\n").unwrap_err().to_string();
        assert!(e.contains("mtu") && e.contains("9000"), "{e}");
        let e = parse("[[device]]\nname = \"a\"\nmtu = 1500\n").unwrap_err().to_string();
        assert!(e.contains("mtu") && e.contains("not an IB MTU"), "{e}");
        for a in ["0.0.0.0", "::", "255.255.255.255", "224.0.0.1", "ff02::1"] {
            let e = parse(&format!("[[device]]\nname = \"a\"\naddress = \"{a}\"\n")).unwrap_err().to_string();
            assert!(e.contains("address") && e.contains(a), "{e}");
        }
        let e = parse("[[device]]\nname = \"a\"\nport = 0\n").unwrap_err().to_string();
        assert!(e.contains("port") && e.contains("0 is not a port"), "{e}");
        let e = parse("[[device]]\nname = \"a\"\ngid_type = \"RoCEv1\"\n").unwrap_err().to_string();
        assert!(e.contains("line 3") && e.contains("RoCEv1"), "{e}");
        let e = parse("[[device]]\nname = \"a\"\n[[device]]\nname = \"a\"\n").unwrap_err().to_string();
        assert!(e.contains("duplicate"), "{e}");
    }
}
