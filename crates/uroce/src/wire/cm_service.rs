//! What rdma_cm puts into IB CM messages on a RoCE port (IBA Annex A11
//! "RDMA IP CM Service", `k/cma.c`): the Service ID made of port space and
//! port, the 36-byte private-data header `cma_hdr` carrying IP version,
//! source port and both IP addresses, the IPv4-mapped GIDs, the RoCEv2
//! flow label derived from the ports and the UDP source port derived from
//! the flow label.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

/// `enum rdma_port_space` (the port spaces an rdma_cm id lives in).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum PortSpace {
    /// `RDMA_PS_IPOIB`.
    Ipoib,
    /// `RDMA_PS_TCP`.
    Tcp,
    /// `RDMA_PS_UDP`.
    Udp,
    /// `RDMA_PS_IB`.
    Ib,
}

impl PortSpace {
    /// The `RDMA_PS_*` value.
    pub fn value(self) -> u16 {
        match self {
            PortSpace::Ipoib => 0x0002,
            PortSpace::Tcp => 0x0106,
            PortSpace::Udp => 0x0111,
            PortSpace::Ib => 0x013F,
        }
    }
    /// The port space of an `RDMA_PS_*` value; `None` if unknown.
    pub fn from_value(v: u32) -> Option<PortSpace> {
        Some(match v {
            0x0002 => PortSpace::Ipoib,
            0x0106 => PortSpace::Tcp,
            0x0111 => PortSpace::Udp,
            0x013F => PortSpace::Ib,
            _ => return None,
        })
    }
    /// Whether ids of this port space use UD QPs (connected by SIDR) rather
    /// than RC (`rc/cma.c` `rdma_create_id`).
    pub fn is_ud(self) -> bool {
        matches!(self, PortSpace::Ipoib | PortSpace::Udp)
    }
}

/// The Service ID rdma_cm uses for `port` in `ps` (`k/cma.c` `rdma_get_service_id`).
pub fn service_id(ps: PortSpace, port: u16) -> u64 {
    (ps.value() as u64) << 16 | port as u64
}

/// Port space and port of an IP-CM Service ID (`k/cma.c`
/// `rdma_ps_from_service_id`); `None` if the upper 32 bits are not zero or
/// the port space is unknown.
pub fn from_service_id(sid: u64) -> Option<(PortSpace, u16)> {
    if sid >> 32 != 0 {
        return None;
    }
    Some((PortSpace::from_value((sid >> 16) as u32 & 0xFFFF)?, sid as u16))
}

/// The GID of an IP address as `rdma_ip2gid` forms it (IPv4-mapped IPv6).
pub fn ip_to_gid(ip: IpAddr) -> [u8; 16] {
    match ip {
        IpAddr::V4(v) => v.to_ipv6_mapped().octets(),
        IpAddr::V6(v) => v.octets(),
    }
}

/// The IP address of a RoCEv2 GID (IPv4-mapped GIDs give IPv4).
pub fn gid_to_ip(gid: [u8; 16]) -> IpAddr {
    let v6 = Ipv6Addr::from(gid);
    match v6.to_ipv4_mapped() {
        Some(v4) => IpAddr::V4(v4),
        None => IpAddr::V6(v6),
    }
}

/// The RoCEv2 flow label rdma_cm puts in a REQ's primary path for its
/// source and destination ports (`k/cma.c` `cma_get_roce_udp_flow_label`).
pub fn roce_flow_label(sport: u16, dport: u16) -> u32 {
    (sport as u32).wrapping_mul(31).wrapping_add(dport as u32) & 0xF_FFFF
}

/// The UDP source port of an RC QP whose path has `flow_label`
/// (`k/ib_verbs.h` `rdma_flow_label_to_udp_sport`).
pub fn flow_label_to_udp_sport(flow_label: u32) -> u16 {
    let low = flow_label & 0x03FFF;
    let high = flow_label & 0xFC000;
    ((low ^ (high >> 14)) as u16) | 0xC000
}

/// The node GUID of a port with MAC address `mac`: its EUI-64, as rxe does.
pub fn eui64_guid(mac: [u8; 6]) -> u64 {
    u64::from_be_bytes([mac[0] ^ 2, mac[1], mac[2], 0xFF, 0xFE, mac[3], mac[4], mac[5]])
}

/// Why a private-data header is refused (the passive side rejects the REQ).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CmaHdrError {
    /// Fewer than 36 bytes of private data.
    #[error("private data shorter than the 36-byte rdma_cm header")]
    Truncated,
    /// The header's version byte is not 0.
    #[error("rdma_cm header version {0} (must be 0)")]
    BadVersion(u8),
    /// The IP version (high nibble of byte 1) is neither 4 nor 6.
    #[error("rdma_cm header IP version {0} (must be 4 or 6)")]
    BadIpVersion(u8),
}

/// The rdma_cm private-data header (`struct cma_hdr`, 36 bytes) at the
/// start of REQ and SIDR_REQ private data.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CmaHdr {
    /// The active side's port.
    pub src_port: u16,
    /// Source and destination addresses; both of the same family.
    pub src: IpAddr,
    /// Destination address (the passive side's).
    pub dst: IpAddr,
}

impl CmaHdr {
    /// Length of the header, in bytes.
    pub const LEN: usize = 36;

    /// Reads the header at the start of `b` (REQ or SIDR_REQ private data).
    pub fn parse(b: &[u8]) -> Result<CmaHdr, CmaHdrError> {
        let h: &[u8; Self::LEN] = b.get(..Self::LEN).and_then(|s| s.try_into().ok()).ok_or(CmaHdrError::Truncated)?;
        if h[0] != 0 {
            return Err(CmaHdrError::BadVersion(h[0]));
        }
        let src_port = u16::from_be_bytes([h[2], h[3]]);
        let v4 = |at: usize| IpAddr::V4(Ipv4Addr::new(h[at], h[at + 1], h[at + 2], h[at + 3]));
        let v6 = |at: usize| {
            let mut a = [0u8; 16];
            a.copy_from_slice(&h[at..at + 16]);
            IpAddr::V6(Ipv6Addr::from(a))
        };
        match h[1] >> 4 {
            4 => Ok(CmaHdr { src_port, src: v4(16), dst: v4(32) }),
            6 => Ok(CmaHdr { src_port, src: v6(4), dst: v6(20) }),
            v => Err(CmaHdrError::BadIpVersion(v)),
        }
    }

    /// Writes the 36 bytes at the start of `b` (at least 36 long; the
    /// private data of a REQ or SIDR_REQ always is).
    pub fn emit(&self, b: &mut [u8]) -> Result<(), CmaHdrError> {
        let h: &mut [u8; Self::LEN] =
            b.get_mut(..Self::LEN).and_then(|s| s.try_into().ok()).ok_or(CmaHdrError::Truncated)?;
        h.fill(0);
        h[2..4].copy_from_slice(&self.src_port.to_be_bytes());
        let mut put = |ip: IpAddr, at: usize| match ip {
            IpAddr::V4(v) => h[at + 12..at + 16].copy_from_slice(&v.octets()),
            IpAddr::V6(v) => h[at..at + 16].copy_from_slice(&v.octets()),
        };
        put(self.src, 4);
        put(self.dst, 20);
        h[1] = if self.src.is_ipv4() { 0x40 } else { 0x60 };
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn service_ids_of_the_captures() {
        assert_eq!(service_id(PortSpace::Tcp, 7174), 0x0106_1c06);
        assert_eq!(service_id(PortSpace::Tcp, 18515), 0x0106_4853);
        assert_eq!(service_id(PortSpace::Udp, 1), 0x0111_0001);
        assert_eq!(from_service_id(0x0106_1c06), Some((PortSpace::Tcp, 7174)));
        assert_eq!(from_service_id(0x0111_0000), Some((PortSpace::Udp, 0)));
        assert_eq!(from_service_id(0x1_0106_1c06), None);
        assert_eq!(from_service_id(0x0107_0000), None);
    }

    #[test]
    fn flow_labels_and_ports_of_the_captures() {
        assert_eq!(roce_flow_label(52471, 18515), 0x91a3c);
        assert_eq!(flow_label_to_udp_sport(0x91a3c), 55832);
        assert_eq!(flow_label_to_udp_sport(0x85955), 55668);
        assert_eq!(flow_label_to_udp_sport(0x70bbd), 52129);
        assert_eq!(roce_flow_label(48489, 7174), 0x70bbd);
        assert_eq!(roce_flow_label(50878, 18515), 0x85955);
    }

    #[test]
    fn guid_is_the_eui64_of_the_mac() {
        assert_eq!(eui64_guid([0x00, 0x50, 0x56, 0xa7, 0x7d, 0x03]), 0x025056fffea77d03);
    }

    #[test]
    fn gids_map_ipv4() {
        let ip: IpAddr = "10.1.16.62".parse().unwrap();
        let g = ip_to_gid(ip);
        assert_eq!(&g[..12], &[0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff]);
        assert_eq!(gid_to_ip(g), ip);
        let v6: IpAddr = "fe80::1".parse().unwrap();
        assert_eq!(gid_to_ip(ip_to_gid(v6)), v6);
    }

    #[test]
    fn cma_hdr_v4_v6_and_refusals() {
        let h = CmaHdr { src_port: 52471, src: "10.1.16.62".parse().unwrap(), dst: "10.1.16.61".parse().unwrap() };
        let mut b = [0xEEu8; 40];
        h.emit(&mut b).unwrap();
        assert_eq!(&b[..4], &[0x00, 0x40, 0xcc, 0xf7]);
        assert_eq!(&b[16..20], &[10, 1, 16, 62]);
        assert_eq!(&b[32..36], &[10, 1, 16, 61]);
        assert_eq!(&b[36..], &[0xEE; 4]);
        assert_eq!(CmaHdr::parse(&b).unwrap(), h);

        let h6 = CmaHdr { src_port: 1, src: "fd00::1".parse().unwrap(), dst: "fd00::2".parse().unwrap() };
        let mut b = [0u8; 36];
        h6.emit(&mut b).unwrap();
        assert_eq!(b[1], 0x60);
        assert_eq!(CmaHdr::parse(&b).unwrap(), h6);

        assert_eq!(CmaHdr::parse(&b[..35]), Err(CmaHdrError::Truncated));
        b[0] = 1;
        assert_eq!(CmaHdr::parse(&b), Err(CmaHdrError::BadVersion(1)));
        b[0] = 0;
        b[1] = 0x50;
        assert_eq!(CmaHdr::parse(&b), Err(CmaHdrError::BadIpVersion(5)));
        assert_eq!(h.emit(&mut [0u8; 10]), Err(CmaHdrError::Truncated));
    }
}
