//! Which IPv4 Identifications a receiver checks a packet's ICRC with, per
//! peer: the IDs a uroce sender uses (0, and k for segment k of a GSO
//! send), or, for a peer learned to send hashed IDs (Linux rxe, whose ICRC
//! covers an ID a UDP socket cannot see), an ID solved from the ICRC.
//!
//! The rule (docs/architecture.md, "IPv4 IDs on receive"): an IPv4 packet
//! that matches with none of a uroce sender's IDs is solved for; if the ID
//! solves and the peer has not shown itself a uroce-style sender (at least
//! [`EXPECTED_RUN`] packets that matched with its IDs, none solved), the
//! packet is accepted and the peer is learned as a hashed-ID sender. From
//! then on its packets are checked with the IDs after its last one
//! ([`NEXT_TRIES`] XORs), then solved. A solved packet from a uroce-style
//! peer is refused (its ICRC keeps 26 bits, as without learning). Sans-IO
//! and per receiver: the state lives with whoever calls
//! [`crate::proto::check_datagram`]; bounded to [`MAX_PEERS`] peers.

use crate::wire::{icrc, IpInfo};
use rustc_hash::FxHashMap;
use std::net::{IpAddr, Ipv4Addr};

/// Packets matched with a uroce sender's IDs, in a row, after which a peer
/// is known as a uroce-style sender, whose solved packets are refused. Linux
/// rxe's hashed IDs fall in 0..=63 by chance (1 in 1,024); 64 in a row from
/// one hashed start would need that start to be about 0.
pub const EXPECTED_RUN: u32 = 64;
/// IDs after a hashed peer's last one tried before solving (Linux gives a
/// flow's packets consecutive IDs, with jumps after idle time and when other
/// traffic between the two hosts shares the counter).
pub const NEXT_TRIES: u16 = 8;
/// Most peers remembered. A full table learns no new peer: a packet from a
/// peer it does not hold is checked as from an unknown peer (and accepted
/// when its ID solves), so a flood of forged sources costs nothing but the
/// check.
pub const MAX_PEERS: usize = 4096;

/// How a received datagram's ICRC checked out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IcrcCheck {
    /// With IP ID 0 (IPv6, or an IPv4 packet sent alone).
    Zero,
    /// With the ID of its place in a sender's GSO send.
    GsoId,
    /// With an ID solved for (a peer learned to send hashed IDs, or
    /// [`crate::proto::EngineConfig::ipv4_any_id`]).
    Solved,
    /// Solved, and its sender is now learned as a hashed-ID sender.
    Learned,
    /// Solved, but its sender is a uroce-style peer: dropped as a bad ICRC.
    Refused,
    /// With no ID tried: the packet is dropped (by the QP's engine, which
    /// counts it).
    Bad,
}

impl IcrcCheck {
    /// Whether the packet is dropped for its ICRC.
    pub fn is_bad(self) -> bool {
        matches!(self, IcrcCheck::Bad | IcrcCheck::Refused)
    }
}

#[derive(Debug, Clone, Copy)]
enum Peer {
    /// This many packets matched with a uroce sender's IDs in a row.
    Expected(u32),
    /// Learned: it sends hashed IDs; its last one.
    Hashed(u16),
}

/// One receiver's IPv4 ID state.
#[derive(Debug)]
pub struct RxIds {
    /// The ID the next uroce-style packet likely carries (the one after the
    /// last: GSO segments come in order).
    next: u16,
    peers: FxHashMap<Ipv4Addr, Peer>,
    /// The last peer seen known as uroce-style (its packets need no lookup).
    known: Option<Ipv4Addr>,
}

impl Default for RxIds {
    fn default() -> Self {
        RxIds { next: 1, peers: FxHashMap::default(), known: None }
    }
}

impl RxIds {
    pub fn new() -> RxIds {
        RxIds::default()
    }

    /// Checks the ICRC of `data` (a UDP payload) from `ip.src`, setting
    /// `ip.ipv4_id` to the ID it matched with. `any_id`: accept a solved ID
    /// from any peer.
    pub fn check(&mut self, any_id: bool, ip: &mut IpInfo, data: &[u8]) -> IcrcCheck {
        let v4 = match ip.src {
            IpAddr::V4(a) => Some(a),
            IpAddr::V6(_) => None,
        };
        let learned = v4.and_then(|a| match self.peers.get(&a) {
            Some(&Peer::Hashed(last)) => Some((a, last)),
            _ => None,
        });
        if let Some((a, last)) = learned {
            let id = icrc::find_ipv4_id_after(ip, data, last, NEXT_TRIES).or_else(|| icrc::solve_ipv4_id(ip, data));
            return match id {
                Some(id) => {
                    self.peers.insert(a, Peer::Hashed(id));
                    ip.ipv4_id = id;
                    IcrcCheck::Solved
                }
                None => IcrcCheck::Bad,
            };
        }
        match icrc::find_ipv4_id(ip, data, self.next) {
            Some(id) => {
                self.next = id.wrapping_add(1);
                ip.ipv4_id = id;
                if let Some(a) = v4 {
                    self.count_expected(a);
                }
                if id == 0 {
                    IcrcCheck::Zero
                } else {
                    IcrcCheck::GsoId
                }
            }
            None => {
                let Some(a) = v4 else { return IcrcCheck::Bad };
                let Some(id) = icrc::solve_ipv4_id(ip, data) else { return IcrcCheck::Bad };
                ip.ipv4_id = id;
                if any_id {
                    return IcrcCheck::Solved;
                }
                match self.peers.get(&a) {
                    Some(&Peer::Expected(n)) if n >= EXPECTED_RUN => IcrcCheck::Refused,
                    Some(_) => {
                        self.peers.insert(a, Peer::Hashed(id));
                        IcrcCheck::Learned
                    }
                    None if self.peers.len() < MAX_PEERS => {
                        self.peers.insert(a, Peer::Hashed(id));
                        IcrcCheck::Learned
                    }
                    None => IcrcCheck::Solved,
                }
            }
        }
    }

    /// Counts a packet from `a` that matched with a uroce sender's ID.
    fn count_expected(&mut self, a: Ipv4Addr) {
        if self.known == Some(a) {
            return;
        }
        let full = self.peers.len() >= MAX_PEERS;
        let n = match self.peers.get_mut(&a) {
            Some(Peer::Expected(n)) => {
                *n = n.saturating_add(1);
                *n
            }
            // A hashed peer's ID fell in 0..=63 by chance (it is checked
            // as hashed first, so only when its ID was also a candidate).
            Some(Peer::Hashed(_)) => return,
            None if full => return,
            None => {
                self.peers.insert(a, Peer::Expected(1));
                1
            }
        };
        if n >= EXPECTED_RUN {
            self.known = Some(a);
        }
    }

    #[cfg(feature = "unstable")]
    /// Peers learned to send hashed IDs.
    pub fn hashed_peers(&self) -> usize {
        self.peers.values().filter(|p| matches!(p, Peer::Hashed(_))).count()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An RDMA READ request Linux rxe sent (IPv4 ID 0xBE10; from the wire
    /// specification's vectors, `wire::icrc` tests).
    const RXE_READ: &str = "000c29ae1ca4000c2989a2e508004500003cbe10400040118a4bc0a83881c0a83883df9412b7002800000c00ffff000000118054cb6300007fee260fb000000002b80001000008c6154a";

    fn rxe_read() -> (IpInfo, Vec<u8>) {
        let f: Vec<u8> = (0..RXE_READ.len()).step_by(2).map(|i| u8::from_str_radix(&RXE_READ[i..i + 2], 16).unwrap()).collect();
        let (ip, p) = crate::wire::pcap::extract_roce(1, &f, 4791).expect("RoCEv2 frame");
        (IpInfo { ipv4_id: 0, ..ip }, p.to_vec())
    }

    /// The same packet as its sender would have sent it with IP ID `id`.
    fn with_id(p: &[u8], from: u16, id: u16) -> Vec<u8> {
        let mut p = p.to_vec();
        icrc::set_ipv4_id(&mut p, from); // back to ID 0 (the delta is an XOR)
        icrc::set_ipv4_id(&mut p, id);
        p
    }

    fn check(ids: &mut RxIds, ip: IpInfo, p: &[u8]) -> (IcrcCheck, u16) {
        let mut ip = ip;
        let c = ids.check(false, &mut ip, p);
        (c, ip.ipv4_id)
    }

    #[test]
    fn an_rxe_peer_is_learned_on_its_first_packet_and_followed() {
        let (ip, p) = rxe_read();
        let mut ids = RxIds::new();
        assert_eq!(check(&mut ids, ip, &p), (IcrcCheck::Learned, 0xBE10));
        assert_eq!(ids.hashed_peers(), 1);
        // The next IDs (one CRC and a few XORs), a jump (a solve), and an
        // ID that happens to be a uroce sender's.
        for id in [0xBE11, 0xBE12, 0xBE19, 0x0123, 0x0005, 0xFFFF, 0x0000] {
            assert_eq!(check(&mut ids, ip, &with_id(&p, 0xBE10, id)), (IcrcCheck::Solved, id), "{id:#x}");
        }
        let mut bad = p.clone();
        bad[20] ^= 0x04;
        assert_eq!(check(&mut ids, ip, &bad).0, IcrcCheck::Bad);
        assert_eq!(ids.hashed_peers(), 1);
    }

    #[test]
    fn a_uroce_style_peer_keeps_the_full_check() {
        let (ip, p) = rxe_read();
        let zero = with_id(&p, 0xBE10, 0);
        let mut ids = RxIds::new();
        for k in 0..EXPECTED_RUN {
            let id = (k % 64) as u16;
            assert_eq!(check(&mut ids, ip, &with_id(&zero, 0, id)).1, id);
        }
        // Now a packet that only a solved ID explains is refused (with the
        // 26-bit check, a corruption; rxe would not have sent 64 IDs in
        // 0..=63 in a row) ...
        assert_eq!(check(&mut ids, ip, &p).0, IcrcCheck::Refused);
        assert!(IcrcCheck::Refused.is_bad());
        assert_eq!(ids.hashed_peers(), 0);
        // ... unless told to accept any ID.
        let mut ip2 = ip;
        assert_eq!(ids.check(true, &mut ip2, &p), IcrcCheck::Solved);
        assert_eq!(ip2.ipv4_id, 0xBE10);
    }

    #[test]
    fn an_rxe_peer_whose_first_ids_were_a_uroce_senders_is_still_learned() {
        let (ip, p) = rxe_read();
        let mut ids = RxIds::new();
        for id in [3u16, 4, 5] {
            assert_eq!(check(&mut ids, ip, &with_id(&p, 0xBE10, id)), (IcrcCheck::GsoId, id));
        }
        assert_eq!(check(&mut ids, ip, &with_id(&p, 0xBE10, 70)), (IcrcCheck::Learned, 70));
    }

    #[test]
    fn the_table_is_bounded_and_a_full_one_still_accepts() {
        let (ip, p) = rxe_read();
        let mut ids = RxIds::new();
        // Forged sources: the ICRC covers the source address, so each packet
        // is rebuilt for its source (the ID solves to whatever it is).
        for k in 0..MAX_PEERS as u32 + 10 {
            let src = Ipv4Addr::from(0x0A00_0000 + k);
            let ipk = IpInfo { src: src.into(), ..ip };
            let mut q = p.clone();
            let n = q.len();
            let c = icrc::compute(&IpInfo { ipv4_id: 0x4321, ..ipk }, &q[..n - 4]);
            q[n - 4..].copy_from_slice(&c);
            let want = if (k as usize) < MAX_PEERS { IcrcCheck::Learned } else { IcrcCheck::Solved };
            assert_eq!(check(&mut ids, ipk, &q), (want, 0x4321));
        }
        assert_eq!(ids.peers.len(), MAX_PEERS);
    }

    #[test]
    fn ipv6_has_no_id_to_learn() {
        let (ip, p) = rxe_read();
        let v6 = IpInfo { src: "fd00::1".parse().unwrap(), dst: "fd00::2".parse().unwrap(), ..ip };
        let mut q = p.clone();
        let n = q.len();
        let c = icrc::compute(&v6, &q[..n - 4]);
        q[n - 4..].copy_from_slice(&c);
        let mut ids = RxIds::new();
        assert_eq!(check(&mut ids, v6, &q).0, IcrcCheck::Zero);
        q[n - 1] ^= 1;
        assert_eq!(check(&mut ids, v6, &q).0, IcrcCheck::Bad);
        assert_eq!(ids.peers.len(), 0);
    }
}
