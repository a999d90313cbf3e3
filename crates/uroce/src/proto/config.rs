//! What an engine knows of its device: [`EngineConfig`].

use crate::ib::{Gid, Mtu};
use std::net::IpAddr;

/// What an engine needs to know about its device.
#[derive(Debug, Clone)]
pub struct EngineConfig {
    /// The address the device sends from and receives on.
    pub addr: IpAddr,
    /// The UDP port of this device and of its peers (4791 by default).
    pub port: u16,
    /// The port's active MTU (the UD payload limit).
    pub mtu: Mtu,
    /// The GID table.
    pub gids: Vec<Gid>,
    /// IPv4: accept a packet whose ICRC only verifies with an IP
    /// Identification solved from it from any peer, even one known to send
    /// a uroce sender's IDs. Without it such a peer (Linux rxe, whose
    /// hashed IDs a UDP socket cannot see) is learned on its first packet
    /// (`proto::rx_ids`). A solved ID leaves 16 of the ICRC's 32 bits as a
    /// check.
    pub ipv4_any_id: bool,
    /// Send payloads of pinned host memory in place: the packet's headers
    /// and ICRC are built, and the kernel gathers the payload straight from
    /// the registered buffer (one copy fewer). Needs a consumer of
    /// [`Transmit`](super::Transmit)s that sends its pieces; off by default, on in the
    /// device runtime.
    pub send_in_place: bool,
    /// Copies that may block (on-demand paging, peer memory) become copy
    /// jobs that the engine's user runs outside its locks
    /// ([`Engine::poll_copy`](super::Engine::poll_copy), [`Engine::copy_done`](super::Engine::copy_done); `proto::copy`). Off
    /// by default (such copies run inside the engine's calls); on in the
    /// device runtime.
    pub defer_blocking_copies: bool,
    /// Chooses where QPN allocation starts, so that a peer cannot predict
    /// QPNs (the engine has no random source of its own: the device seeds
    /// it from the OS, a simulation from its seed).
    pub id_seed: u64,
}

impl EngineConfig {
    pub fn new(addr: IpAddr, port: u16, mtu: Mtu) -> EngineConfig {
        EngineConfig {
            addr,
            port,
            mtu,
            gids: vec![Gid::from_ip(addr)],
            ipv4_any_id: false,
            send_in_place: false,
            defer_blocking_copies: false,
            id_seed: 0,
        }
    }
}
