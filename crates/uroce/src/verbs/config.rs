//! Device configuration: name, address, port, MTU, capture. Read from the
//! environment by [`DeviceConfig::from_env`]:
//!
//! | variable | meaning | default |
//! |---|---|---|
//! | `UROCE_DEVICE` | device name | `uroce0` |
//! | `UROCE_ADDR` | IPv4 or IPv6 address to bind | the first free of 127.0.0.1 … 127.0.0.254 |
//! | `UROCE_PORT` | UDP port of this device and its peers | 4791 |
//! | `UROCE_MTU` | active MTU in bytes (256…4096) | from the interface MTU − 80 (rxe's rule) |
//! | `UROCE_CAPTURE` | write a pcap of every packet to this file (`%p` = pid) | off |
//! | `UROCE_BUSY_POLL` | `1`: spin instead of sleeping | 0 |
//! | `UROCE_IPV4_ANY_ID` | `1`: accept IPv4 ICRCs with any IP ID (Linux rxe peers) | 0 |
//! | `UROCE_SCATTER_TO_CQE` (or `MLX5_SCATTER_TO_CQE`) | `0`: no inline receive | 1 |
//! | `UROCE_CQE_SIZE` (or `MLX5_CQE_SIZE`) | 64 (inline receive ≤ 32 B) or 128 (≤ 64 B) | 64 |
//!
//! On one host every process needs its own address, because RoCE peers know
//! each other by GID (an IP address) and all use port 4791. With no
//! `UROCE_ADDR`, uroce takes the first free loopback address 127.0.0.x, so a
//! client and a server on one host simply work.

use crate::ib::{Error, Mtu, Result};
use std::net::IpAddr;
use std::path::PathBuf;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceConfig {
    pub name: String,
    /// None: pick the first free 127.0.0.x.
    pub addr: Option<IpAddr>,
    pub port: u16,
    /// None: derived from the interface MTU as rxe does (lo: 4096, 1500: 1024).
    pub mtu: Option<Mtu>,
    pub capture: Option<PathBuf>,
    pub busy_poll: bool,
    pub ipv4_any_id: bool,
    /// Inline receive (scatter-to-CQE) for QPs that do not choose.
    pub scatter_to_cqe: bool,
    /// CQE size: 64 (messages ≤ 32 bytes travel inline) or 128 (≤ 64).
    pub cqe_size: u32,
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
            scatter_to_cqe: true,
            cqe_size: 64,
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

    /// The configuration the environment describes (see the module docs).
    pub fn from_env() -> Result<DeviceConfig> {
        let mut c = DeviceConfig::default();
        let var = |k: &str| std::env::var(k).ok().filter(|v| !v.is_empty());
        if let Some(v) = var("UROCE_DEVICE") {
            c.name = v;
        }
        if let Some(v) = var("UROCE_ADDR") {
            c.addr = Some(v.parse().map_err(|_| Error::inval(format!("UROCE_ADDR: not an IP address: {v}")))?);
        }
        if let Some(v) = var("UROCE_PORT") {
            c.port = v.parse().map_err(|_| Error::inval(format!("UROCE_PORT: not a port: {v}")))?;
        }
        if let Some(v) = var("UROCE_MTU") {
            let b: u32 = v.parse().map_err(|_| Error::inval(format!("UROCE_MTU: not a number: {v}")))?;
            if !(256..=4096).contains(&b) {
                return Err(Error::inval(format!("UROCE_MTU: {b} outside 256..4096")));
            }
            c.mtu = Some(Mtu::from_bytes_floor(b));
        }
        if let Some(v) = var("UROCE_CAPTURE") {
            c.capture = Some(PathBuf::from(v.replace("%p", &std::process::id().to_string())));
        }
        c.busy_poll = var("UROCE_BUSY_POLL").is_some_and(|v| v == "1");
        c.ipv4_any_id = var("UROCE_IPV4_ANY_ID").is_some_and(|v| v == "1");
        if let Some(v) = var("UROCE_SCATTER_TO_CQE").or_else(|| var("MLX5_SCATTER_TO_CQE")) {
            c.scatter_to_cqe = v != "0";
        }
        if let Some(v) = var("UROCE_CQE_SIZE").or_else(|| var("MLX5_CQE_SIZE")) {
            c.cqe_size = match v.as_str() {
                "64" => 64,
                "128" => 128,
                _ => return Err(Error::inval(format!("UROCE_CQE_SIZE: {v} is not 64 or 128"))),
            };
        }
        Ok(c)
    }
}
