//! Device configuration: name, address, port, MTU, capture. Read from the
//! configuration file ([`crate::config`]) and then the environment by
//! [`DeviceConfig::from_env`]; the environment wins:
//!
//! | variable | meaning | default |
//! |---|---|---|
//! | `UROCE_DEVICE` | device name | `uroce0` |
//! | `UROCE_ADDR` | IPv4 or IPv6 unicast address to bind (not `0.0.0.0`, `::`, broadcast or multicast), or the name of a network interface: its first IPv4 address, else its first IPv6 address that is not link-local | the first free of 127.0.0.1 … 127.0.0.254 |
//! | `UROCE_PORT` | UDP port of this device and its peers (not 0) | 4791 |
//! | `UROCE_MTU` | active MTU in bytes: 256, 512, 1024, 2048 or 4096 | from the interface MTU − 80 (rxe's rule) |
//! | `UROCE_CAPTURE` | write a pcap of every packet to this file (`%p` = pid; created 0600, never through a link; an existing file is replaced only if it is a regular file of this user) | off |
//! | `UROCE_BUSY_POLL` | boolean: spin instead of sleeping | 0 |
//! | `UROCE_IPV4_ANY_ID` | boolean: accept IPv4 ICRCs with any IP ID from every peer (without it, hashed-ID peers such as Linux rxe are learned) | 0 |
//! | `UROCE_SEND_IN_PLACE` | boolean: payloads leave straight from registered memory | 1 |
//! | `UROCE_SCATTER_TO_CQE` | boolean: inline receive | 1 |
//! | `MLX5_SCATTER_TO_CQE` | as mlx5: only `0` turns inline receive off, any other value is ignored (`UROCE_SCATTER_TO_CQE` wins) | unset |
//! | `UROCE_CQE_SIZE` (or `MLX5_CQE_SIZE`) | 64 (inline receive ≤ 32 B) or 128 (≤ 64 B) | 64 |
//! | `UROCE_FAULTS` | inject faults into received packets, e.g. `loss=0.01,dup=0.01,reorder=0.02,corrupt=0.001,delay_us=300,seed=7` (testing; see [`crate::io::faults`]) | off |
//!
//! | `UROCE_LOG` | log filter (`tracing` syntax, e.g. `uroce=debug`) | off (the `uroce` command: `warn`) |
//!
//! Booleans are `1`/`0`, `true`/`false`, `yes`/`no` or `on`/`off` (any
//! case). A value that does not parse is refused with an error naming the
//! variable, never ignored.
//!
//! On one host every process needs its own address, because RoCE peers know
//! each other by GID (an IP address) and all use port 4791. With no
//! `UROCE_ADDR`, uroce takes the first free loopback address 127.0.0.x, so a
//! client and a server on one host simply work.

use crate::ib::{Error, Mtu, Result};

/// The address `UROCE_ADDR=<interface>` names: the interface's first IPv4
/// address, else its first IPv6 address that is not link-local.
pub fn interface_address(name: &str) -> Option<IpAddr> {
    let mut list: *mut libc::ifaddrs = std::ptr::null_mut();
    // SAFETY: getifaddrs fills `list`, freed below.
    if unsafe { libc::getifaddrs(&mut list) } != 0 {
        return None;
    }
    let (mut v4, mut v6) = (None, None);
    let mut p = list;
    while !p.is_null() {
        // SAFETY: an entry of getifaddrs' list, alive until freeifaddrs.
        let i = unsafe { &*p };
        p = i.ifa_next;
        // SAFETY: ifa_name is a NUL-terminated string of the entry.
        let ifname = unsafe { std::ffi::CStr::from_ptr(i.ifa_name) };
        if i.ifa_addr.is_null() || ifname.to_bytes() != name.as_bytes() {
            continue;
        }
        // SAFETY: ifa_addr is a sockaddr of the family it says.
        match unsafe { (*i.ifa_addr).sa_family } as i32 {
            libc::AF_INET if v4.is_none() => {
                // SAFETY: as above, an AF_INET sockaddr.
                let s = unsafe { &*(i.ifa_addr as *const libc::sockaddr_in) };
                v4 = Some(IpAddr::from(u32::from_be(s.sin_addr.s_addr).to_be_bytes()));
            }
            libc::AF_INET6 if v6.is_none() => {
                // SAFETY: as above, an AF_INET6 sockaddr.
                let s = unsafe { &*(i.ifa_addr as *const libc::sockaddr_in6) };
                let a = std::net::Ipv6Addr::from(s.sin6_addr.s6_addr);
                if a.segments()[0] & 0xffc0 != 0xfe80 {
                    v6 = Some(IpAddr::V6(a));
                }
            }
            _ => {}
        }
    }
    // SAFETY: the list getifaddrs made.
    unsafe { libc::freeifaddrs(list) };
    v4.or(v6)
}
use std::net::IpAddr;
use std::path::PathBuf;

/// The configuration of one device (see the module docs for the variables).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceConfig {
    /// Device name (`UROCE_DEVICE`).
    pub name: String,
    /// None: pick the first free 127.0.0.x.
    pub addr: Option<IpAddr>,
    /// UDP port of this device and its peers.
    pub port: u16,
    /// None: derived from the interface MTU as rxe does (lo: 4096, 1500: 1024).
    pub mtu: Option<Mtu>,
    /// A pcap file that gets every packet sent and received; None: no capture.
    pub capture: Option<PathBuf>,
    /// Spin instead of sleeping while waiting for packets.
    pub busy_poll: bool,
    /// Accept IPv4 ICRCs with any IP Identification from every peer,
    /// instead of learning the peers that send hashed IDs.
    pub ipv4_any_id: bool,
    /// Send payloads of pinned host memory in place, without copying them
    /// into the packet (`UROCE_SEND_IN_PLACE=0` copies, for comparison).
    pub send_in_place: bool,
    /// Inline receive (scatter-to-CQE) for QPs that do not choose.
    pub scatter_to_cqe: bool,
    /// CQE size: 64 (messages ≤ 32 bytes travel inline) or 128 (≤ 64).
    pub cqe_size: u32,
    /// Fault injection (see `io::faults`).
    pub faults: Option<String>,
}

impl Default for DeviceConfig {
    fn default() -> Self {
        DeviceConfig {
            name: "uroce0".into(),
            addr: None,
            port: crate::wire::ROCE_V2_PORT,
            mtu: None,
            capture: None,
            busy_poll: false,
            ipv4_any_id: false,
            send_in_place: true,
            scatter_to_cqe: true,
            cqe_size: 64,
            faults: None,
        }
    }
}

impl DeviceConfig {
    /// A device on the first free loopback address, port 4791.
    pub fn loopback() -> DeviceConfig {
        DeviceConfig::default()
    }

    /// A device at `addr:port` named `name`.
    pub fn at(name: &str, addr: IpAddr, port: u16) -> DeviceConfig {
        DeviceConfig { name: name.into(), addr: Some(addr), port, ..Default::default() }
    }

    /// The device this process opens by default: `UROCE_DEVICE`, else the
    /// first device of the configuration file, else `uroce0` on loopback;
    /// the environment overrides the file (see the module docs).
    pub fn from_env() -> Result<DeviceConfig> {
        Ok(Self::list_from_env()?.remove(0))
    }

    /// Every device of the configuration file (the default one first, with
    /// the environment's overrides), or the one default device.
    pub fn list_from_env() -> Result<Vec<DeviceConfig>> {
        let file = crate::config::ConfigFile::load().map_err(|e| Error::inval(format!("configuration: {e}")))?;
        let file = file.map(|(f, _)| f).unwrap_or_default();
        let mut list: Vec<DeviceConfig> = file.devices.iter().map(|d| Self::from_entry(d, &file)).collect();
        if list.is_empty() {
            list.push(DeviceConfig { capture: file.capture.file.as_deref().map(expand_pid), ..Default::default() });
        }
        let var = |k: &str| std::env::var(k).ok().filter(|v| !v.is_empty());
        let chosen = match var("UROCE_DEVICE") {
            Some(name) => match list.iter().position(|c| c.name == name) {
                Some(i) => i,
                None => {
                    list.insert(0, DeviceConfig { name, ..list[0].clone() });
                    0
                }
            },
            None => 0,
        };
        let c = list.remove(chosen);
        list.insert(0, c.with_env(|k| std::env::var(k).ok())?);
        Ok(list)
    }

    fn from_entry(d: &crate::config::DeviceEntry, file: &crate::config::ConfigFile) -> DeviceConfig {
        let base = DeviceConfig::default();
        DeviceConfig {
            name: d.name.clone(),
            addr: d.address,
            port: d.port.unwrap_or(base.port),
            // The file's values were checked when it was parsed.
            mtu: d.mtu.map(Mtu::from_bytes_floor),
            capture: file.capture.file.as_deref().map(expand_pid),
            busy_poll: d.busy_poll.unwrap_or(base.busy_poll),
            ipv4_any_id: d.ipv4_any_id.unwrap_or(base.ipv4_any_id),
            send_in_place: d.send_in_place.unwrap_or(base.send_in_place),
            scatter_to_cqe: d.scatter_to_cqe.unwrap_or(base.scatter_to_cqe),
            cqe_size: d.cqe_size.unwrap_or(base.cqe_size),
            faults: d.faults.clone(),
        }
    }

    /// Applies the environment's overrides; `env` reads one variable.
    fn with_env(mut self, env: impl Fn(&str) -> Option<String>) -> Result<DeviceConfig> {
        let c = &mut self;
        let var = |k: &str| env(k).filter(|v| !v.is_empty());
        let bad = |k: &str, e: String| Error::inval(format!("{k}: {e}"));
        let flag = |k: &str, v: &str| crate::config::parse_bool(v).map_err(|e| bad(k, e));
        if let Some(v) = var("UROCE_ADDR") {
            let a: IpAddr = match v.parse() {
                Ok(a) => a,
                // An interface name: its address (libfabric's verbs provider
                // wants a device on an interface other than `lo`).
                Err(_) => interface_address(&v).ok_or_else(|| {
                    bad("UROCE_ADDR", format!("not an IP address, nor an interface with an address: {v}"))
                })?,
            };
            crate::config::check_address(a).map_err(|e| bad("UROCE_ADDR", e))?;
            c.addr = Some(a);
        }
        if let Some(v) = var("UROCE_PORT") {
            let p: u16 = v.parse().map_err(|_| bad("UROCE_PORT", format!("not a port: {v}")))?;
            crate::config::check_port(p).map_err(|e| bad("UROCE_PORT", e))?;
            c.port = p;
        }
        if let Some(v) = var("UROCE_MTU") {
            let b: u32 = v.parse().map_err(|_| bad("UROCE_MTU", format!("not a number: {v}")))?;
            c.mtu = Some(crate::config::check_mtu(b).map_err(|e| bad("UROCE_MTU", e))?);
        }
        if let Some(v) = var("UROCE_CAPTURE") {
            c.capture = Some(expand_pid(&v));
        }
        if let Some(v) = var("UROCE_BUSY_POLL") {
            c.busy_poll = flag("UROCE_BUSY_POLL", &v)?;
        }
        if let Some(v) = var("UROCE_IPV4_ANY_ID") {
            c.ipv4_any_id = flag("UROCE_IPV4_ANY_ID", &v)?;
        }
        if let Some(v) = var("UROCE_SEND_IN_PLACE") {
            c.send_in_place = flag("UROCE_SEND_IN_PLACE", &v)?;
        }
        if let Some(v) = var("UROCE_FAULTS") {
            c.faults = Some(v);
        }
        if let Some(v) = var("UROCE_SCATTER_TO_CQE") {
            c.scatter_to_cqe = flag("UROCE_SCATTER_TO_CQE", &v)?;
        } else if let Some(v) = var("MLX5_SCATTER_TO_CQE") {
            // mlx5's rule (providers/mlx5/verbs.c, use_scatter_to_cqe):
            // only the literal "0" disables; any other value is ignored.
            if v == "0" {
                c.scatter_to_cqe = false;
            }
        }
        if let Some(v) = var("UROCE_LOG") {
            tracing_subscriber::EnvFilter::try_new(&v)
                .map_err(|e| bad("UROCE_LOG", format!("not a log filter ({e}): {v}")))?;
        }
        if let Some(v) = var("UROCE_CQE_SIZE").or_else(|| var("MLX5_CQE_SIZE")) {
            c.cqe_size = match v.as_str() {
                "64" => 64,
                "128" => 128,
                _ => return Err(Error::inval(format!("UROCE_CQE_SIZE: {v} is not 64 or 128"))),
            };
        }
        Ok(self)
    }
}

/// `%p` in a path becomes the process id.
fn expand_pid(p: &str) -> PathBuf {
    PathBuf::from(p.replace("%p", &std::process::id().to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn with(vars: &[(&str, &str)]) -> Result<DeviceConfig> {
        DeviceConfig::default().with_env(|k| vars.iter().find(|(n, _)| *n == k).map(|(_, v)| v.to_string()))
    }

    #[test]
    fn mlx5_scatter_to_cqe_turns_off_only_on_the_literal_zero() {
        assert!(!with(&[("MLX5_SCATTER_TO_CQE", "0")]).unwrap().scatter_to_cqe);
        // mlx5 ignores every other value: inline receive stays on and the
        // device opens.
        for v in ["1", "2", "false", "no", "off", "00", " 0", "x"] {
            assert!(with(&[("MLX5_SCATTER_TO_CQE", v)]).unwrap().scatter_to_cqe, "MLX5_SCATTER_TO_CQE={v}");
        }
        assert!(with(&[]).unwrap().scatter_to_cqe);
    }

    #[test]
    fn uroce_scatter_to_cqe_stays_strict_and_wins() {
        assert!(!with(&[("UROCE_SCATTER_TO_CQE", "off")]).unwrap().scatter_to_cqe);
        assert!(with(&[("UROCE_SCATTER_TO_CQE", "2")]).is_err());
        assert!(with(&[("UROCE_SCATTER_TO_CQE", "1"), ("MLX5_SCATTER_TO_CQE", "0")]).unwrap().scatter_to_cqe);
        assert!(!with(&[("UROCE_SCATTER_TO_CQE", "0"), ("MLX5_SCATTER_TO_CQE", "2")]).unwrap().scatter_to_cqe);
    }

    #[test]
    fn an_interface_name_gives_its_address() {
        assert_eq!(interface_address("lo"), Some(std::net::Ipv4Addr::LOCALHOST.into()));
        assert_eq!(interface_address("no-such-interface0"), None);
    }
}
