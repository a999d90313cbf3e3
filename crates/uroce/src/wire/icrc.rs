//! The invariant CRC as Linux rxe computes it: CRC-32 (IEEE, reflected) over
//! eight 0xFF bytes, the IP and UDP headers and the BTH with their variant
//! fields masked to ones, then the rest of the packet; stored little-endian.
//!
//! The IP header is rebuilt from [`IpInfo`]: IPv4 with IHL 5, DF set and
//! fragment offset 0 (rxe and uroce senders), or IPv6.

use std::net::IpAddr;

/// The IP/UDP facts the ICRC covers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct IpInfo {
    /// Source IP address.
    pub src: IpAddr,
    /// Destination IP address.
    pub dst: IpAddr,
    /// UDP source port.
    pub sport: u16,
    /// UDP destination port.
    pub dport: u16,
    /// IPv4 Identification (ignored for IPv6).
    pub ipv4_id: u16,
}

/// Longest masked prefix: eight 0xFF, an IPv6 header, UDP, BTH.
const MAX_PREFIX: usize = 8 + 40 + 8 + 12;
/// Packets up to this long are checksummed in one piece, prefix included:
/// CRC-32 runs several times faster over one buffer of 128 bytes or more
/// (crc32fast's carry-less multiply path) than over a handful of short
/// updates, and copying a short packet costs less than the difference.
const ONE_PIECE: usize = 256;

/// A fresh CRC-32 state: a copy of one made once, so that the CPU feature
/// check `crc32fast::Hasher::new` makes is not repeated per packet (it
/// cost about 1 % of the engine benchmark's instructions).
#[inline]
fn hasher() -> crc32fast::Hasher {
    static FRESH: std::sync::OnceLock<crc32fast::Hasher> = std::sync::OnceLock::new();
    FRESH.get_or_init(crc32fast::Hasher::new).clone()
}

/// Writes the masked pseudo-headers the ICRC starts with (eight 0xFF, the
/// IP and UDP headers, the BTH) to `out`; returns their length. Every
/// offset is a constant, so the per-packet work is a few stores.
#[inline]
fn masked_prefix(ip: &IpInfo, udp_payload_len: usize, bth: &[u8], out: &mut [u8; MAX_PREFIX]) -> usize {
    *out = [0xFF; MAX_PREFIX];
    let udp_len = (8 + udp_payload_len) as u16;
    let bth: &[u8; 12] = bth[..12].try_into().expect("12 bytes");
    let n = match (ip.src, ip.dst) {
        (IpAddr::V4(s), IpAddr::V4(d)) => {
            // Eight 0xFF (already there), then the IPv4 header: TOS, TTL
            // and checksum stay masked to 0xFF.
            out[8] = 0x45;
            out[10..12].copy_from_slice(&(20 + udp_len).to_be_bytes());
            out[12..14].copy_from_slice(&ip.ipv4_id.to_be_bytes());
            out[14] = 0x40; // DF
            out[15] = 0;
            out[17] = 17;
            out[20..24].copy_from_slice(&s.octets());
            out[24..28].copy_from_slice(&d.octets());
            28
        }
        (s, d) => {
            let v6 = |a: IpAddr| match a {
                IpAddr::V4(v) => v.to_ipv6_mapped(),
                IpAddr::V6(v) => v,
            };
            // Version 6; TC, flow label and hop limit masked.
            out[8] = 0x6F;
            out[12..14].copy_from_slice(&udp_len.to_be_bytes());
            out[14] = 17;
            out[16..32].copy_from_slice(&v6(s).octets());
            out[32..48].copy_from_slice(&v6(d).octets());
            48
        }
    };
    // UDP: ports, length, checksum masked.
    let u: &mut [u8; 20] = (&mut out[n..n + 20]).try_into().expect("room for UDP and BTH");
    u[0..2].copy_from_slice(&ip.sport.to_be_bytes());
    u[2..4].copy_from_slice(&ip.dport.to_be_bytes());
    u[4..6].copy_from_slice(&udp_len.to_be_bytes());
    u[8..20].copy_from_slice(bth);
    u[8 + 4] = 0xFF; // FECN, BECN, Resv6a
    n + 20
}

/// The ICRC wire bytes of a UDP payload whose last four bytes (the ICRC
/// itself) are not in `without_icrc`. `without_icrc` holds at least a BTH.
pub fn compute(ip: &IpInfo, without_icrc: &[u8]) -> [u8; 4] {
    compute_parts(ip, &[without_icrc])
}

/// [`compute`] over a UDP payload given in pieces, in order (the first
/// holds at least the BTH), without its ICRC.
pub fn compute_parts(ip: &IpInfo, parts: &[&[u8]]) -> [u8; 4] {
    let Some(first) = parts.first() else { return [0; 4] };
    if first.len() < 12 {
        let whole = parts.concat();
        if whole.len() < 12 {
            return [0; 4];
        }
        return compute(ip, &whole);
    }
    let len: usize = parts.iter().map(|p| p.len()).sum();
    let mut h = hasher();
    if len - 12 <= ONE_PIECE {
        // One buffer, prefix and packet, not zeroed first: only the bytes
        // written below are read.
        let mut buf = std::mem::MaybeUninit::<[u8; MAX_PREFIX + ONE_PIECE]>::uninit();
        let base = buf.as_mut_ptr().cast::<u8>();
        // SAFETY: `base` points to MAX_PREFIX + ONE_PIECE writable bytes,
        // aligned for bytes. The first MAX_PREFIX are initialized (written)
        // before a reference to them is made; the pieces after the n <=
        // MAX_PREFIX prefix bytes are len - 12 <= ONE_PIECE bytes in all,
        // so every copy stays inside; the slice read is exactly the bytes
        // written (0..at).
        let whole = unsafe {
            let prefix = base.cast::<[u8; MAX_PREFIX]>();
            prefix.write([0xFF; MAX_PREFIX]);
            let mut at = masked_prefix(ip, len + 4, first, &mut *prefix);
            for p in std::iter::once(&first[12..]).chain(parts[1..].iter().copied()) {
                std::ptr::copy_nonoverlapping(p.as_ptr(), base.add(at), p.len());
                at += p.len();
            }
            std::slice::from_raw_parts(base, at)
        };
        h.update(whole);
    } else {
        let mut prefix = [0u8; MAX_PREFIX];
        let n = masked_prefix(ip, len + 4, first, &mut prefix);
        h.update(&prefix[..n]);
        h.update(&first[12..]);
        for p in &parts[1..] {
            h.update(p);
        }
    }
    h.finalize().to_le_bytes()
}

/// An ICRC computed over pieces fed one at a time, for a payload that is
/// read in chunks (memory that may vanish while it is read).
pub struct Incremental(crc32fast::Hasher);

impl Incremental {
    /// Starts the ICRC of a UDP payload of `len` bytes (without the ICRC)
    /// whose first piece is `first`, which holds at least the 12 BTH bytes.
    pub fn new(ip: &IpInfo, len: usize, first: &[u8]) -> Incremental {
        let mut buf = [0u8; MAX_PREFIX];
        let n = masked_prefix(ip, len + 4, first, &mut buf);
        let mut h = hasher();
        h.update(&buf[..n]);
        h.update(&first[12..]);
        Incremental(h)
    }

    /// Feeds the next piece of the payload, in order.
    pub fn update(&mut self, bytes: &[u8]) {
        self.0.update(bytes);
    }

    /// The ICRC wire bytes.
    pub fn finish(self) -> [u8; 4] {
        self.0.finalize().to_le_bytes()
    }
}

/// Whether the last four bytes of `udp_payload` are its correct ICRC.
pub fn verify(ip: &IpInfo, udp_payload: &[u8]) -> bool {
    let n = udp_payload.len();
    n >= 16 && compute(ip, &udp_payload[..n - 4]) == udp_payload[n - 4..]
}

/// How the ICRC of an IPv4 packet of `udp_payload_len` bytes changes when
/// its IP Identification goes from 0 to `id`. The CRC is affine over GF(2),
/// so the change depends only on the length and the ID, not the contents:
/// the XOR of one column per set ID bit (see `ipv4_id_columns`).
pub fn ipv4_id_delta(udp_payload_len: usize, id: u16) -> u32 {
    if id == 0 || udp_payload_len < 16 {
        return 0;
    }
    delta(&ipv4_id_columns(udp_payload_len), id)
}

fn delta(cols: &[u32; 16], id: u16) -> u32 {
    (0..16).filter(|i| id >> i & 1 == 1).fold(0, |d, i| d ^ cols[i])
}

/// The 16 columns of a length: how each IP ID bit flips the ICRC. Computed
/// once per length and kept in a small per-thread cache, most recently used
/// first (a flow has one or two packet lengths; hashing per packet showed
/// up at 10 % of a receiver's profile).
fn ipv4_id_columns(udp_payload_len: usize) -> [u32; 16] {
    use std::cell::RefCell;
    const CACHED_LENGTHS: usize = 16;
    thread_local! {
        static COLS: RefCell<Vec<(usize, [u32; 16])>> = const { RefCell::new(Vec::new()) };
    }
    COLS.with(|c| {
        let mut c = c.borrow_mut();
        if let Some(i) = c.iter().position(|&(len, _)| len == udp_payload_len) {
            if i > 0 {
                let hit = c.remove(i);
                c.insert(0, hit);
            }
            return c[0].1;
        }
        let z = std::net::Ipv4Addr::UNSPECIFIED.into();
        let ip = IpInfo { src: z, dst: z, sport: 0, dport: 0, ipv4_id: 0 };
        let body = vec![0u8; udp_payload_len - 4];
        let crc = |id: u16| u32::from_le_bytes(compute(&IpInfo { ipv4_id: id, ..ip }, &body));
        let base = crc(0);
        let cols = std::array::from_fn(|i| crc(1 << i) ^ base);
        c.truncate(CACHED_LENGTHS - 1);
        c.insert(0, (udp_payload_len, cols));
        cols
    })
}

/// Rewrites the ICRC of an IPv4 packet built for IP ID 0 to the one for `id`
/// (the k-th segment of a UDP GSO send carries ID k).
pub fn set_ipv4_id(udp_payload: &mut [u8], id: u16) {
    let n = udp_payload.len();
    if n >= 16 {
        rewrite_for_ipv4_id(&mut udp_payload[n - 4..], n, id);
    }
}

/// [`set_ipv4_id`] given just the ICRC's four bytes and the length of the
/// UDP payload they end (for a packet whose payload is elsewhere).
pub fn rewrite_for_ipv4_id(icrc: &mut [u8], udp_payload_len: usize, id: u16) {
    if udp_payload_len < 16 || id == 0 || icrc.len() != 4 {
        return;
    }
    let v = u32::from_le_bytes(icrc[..4].try_into().unwrap()) ^ ipv4_id_delta(udp_payload_len, id);
    icrc.copy_from_slice(&v.to_le_bytes());
}

/// Most segments a uroce sender puts in one UDP GSO send, so the IPv4 IDs
/// its packets carry: segment k of a send has ID k (`inet_gso_segment`),
/// 0..=63. A receiver tries each (see [`find_ipv4_id`]).
pub const IPV4_ID_CANDIDATES: u16 = 64;

/// The IPv4 ID in `0..IPV4_ID_CANDIDATES` that makes the ICRC match, if one
/// does: segment k of a uroce sender's GSO send carries ID k, and a UDP
/// socket cannot see the ID, whether the segment arrives alone (no GRO, a
/// GRO flush in the middle of a send, a device that segments itself) or in
/// a datagram GRO merged. One CRC over the packet, then one XOR per
/// candidate (the IDs are visited in Gray-code order, so each differs from
/// the one before in one bit: one column of the per-length table). `hint`,
/// the ID the caller expects (the one after the last it saw: segments come
/// in order), is tried right after 0. For IPv6, where the ICRC covers no
/// ID, this is [`verify`].
///
/// Cost to the check's strength: a corrupted packet whose CRC is random
/// matches one of the 64 values with probability 64 × 2^-32 = 2^-26
/// instead of 2^-32 (and the UDP checksum, which a kernel sender fills,
/// still guards it).
pub fn find_ipv4_id(ip: &IpInfo, udp_payload: &[u8], hint: u16) -> Option<u16> {
    let n = udp_payload.len();
    if n < 16 {
        return None;
    }
    let want = u32::from_le_bytes(udp_payload[n - 4..].try_into().ok()?);
    let crc0 = u32::from_le_bytes(compute(&IpInfo { ipv4_id: 0, ..*ip }, &udp_payload[..n - 4]));
    if crc0 == want {
        return Some(0);
    }
    if !ip.src.is_ipv4() {
        return None;
    }
    let cols = ipv4_id_columns(n);
    if hint > 0 && hint < IPV4_ID_CANDIDATES && crc0 ^ delta(&cols, hint) == want {
        return Some(hint);
    }
    let mut d = 0u32;
    for g in 1..IPV4_ID_CANDIDATES {
        // Gray code: ID g ^ (g >> 1) differs from the previous one in bit
        // trailing_zeros(g).
        d ^= cols[g.trailing_zeros() as usize];
        if crc0 ^ d == want {
            return Some(g ^ (g >> 1));
        }
    }
    None
}

/// For an IPv4 receiver that cannot see the Identification: the ID that
/// makes the ICRC match, if one does. The CRC is affine over GF(2) in the 16
/// ID bits, so one CRC of the packet (for ID 0) and the per-length columns
/// give the system and elimination solves it; 16 of the 32 ICRC bits
/// determine the ID and the other 16 remain a check (a random corruption
/// passes with probability 2^-16).
pub fn solve_ipv4_id(ip: &IpInfo, udp_payload: &[u8]) -> Option<u16> {
    let n = udp_payload.len();
    if n < 16 || !ip.src.is_ipv4() {
        return None;
    }
    let want = u32::from_le_bytes(udp_payload[n - 4..].try_into().ok()?);
    let base = u32::from_le_bytes(compute(&IpInfo { ipv4_id: 0, ..*ip }, &udp_payload[..n - 4]));
    let cols = ipv4_id_columns(n);
    let id = solve_columns(&cols, want ^ base)?;
    (base ^ delta(&cols, id) == want).then_some(id)
}

/// The ID whose columns XOR to `target`, if one does (Gaussian elimination
/// over GF(2): rows are CRC bits, unknowns ID bits).
fn solve_columns(cols: &[u32; 16], target: u32) -> Option<u16> {
    let mut rows: [(u32, bool); 32] = std::array::from_fn(|r| {
        let m = (0..16).filter(|&i| cols[i] >> r & 1 == 1).fold(0u32, |m, i| m | 1 << i);
        (m, target >> r & 1 == 1)
    });
    let mut pivot_row = 0;
    let mut pivots = [(0u32, 0usize); 16];
    let mut npiv = 0;
    for bit in 0..16 {
        let Some(p) = (pivot_row..32).find(|&r| rows[r].0 >> bit & 1 == 1) else { continue };
        rows.swap(pivot_row, p);
        let (pm, pv) = rows[pivot_row];
        for (r, row) in rows.iter_mut().enumerate() {
            if r != pivot_row && row.0 >> bit & 1 == 1 {
                row.0 ^= pm;
                row.1 ^= pv;
            }
        }
        pivots[npiv] = (bit, pivot_row);
        npiv += 1;
        pivot_row += 1;
    }
    if rows[pivot_row..].iter().any(|&(m, v)| m == 0 && v) {
        return None; // inconsistent: corrupted
    }
    let mut id = 0u16;
    for &(bit, r) in &pivots[..npiv] {
        if rows[r].1 {
            id |= 1 << bit;
        }
    }
    Some(id)
}

/// The ID in `after + 1 ..= after + tries` (wrapping) that makes the ICRC of
/// an IPv4 packet match, if one does: a peer whose IDs count up (Linux
/// sends a flow's packets with consecutive IDs from a hashed start) is
/// checked with one CRC and a few XORs instead of a solve. The check keeps
/// 32 - log2(tries) bits.
pub fn find_ipv4_id_after(ip: &IpInfo, udp_payload: &[u8], after: u16, tries: u16) -> Option<u16> {
    let n = udp_payload.len();
    if n < 16 || !ip.src.is_ipv4() {
        return None;
    }
    let want = u32::from_le_bytes(udp_payload[n - 4..].try_into().ok()?);
    let base = u32::from_le_bytes(compute(&IpInfo { ipv4_id: 0, ..*ip }, &udp_payload[..n - 4]));
    let cols = ipv4_id_columns(n);
    (1..=tries).map(|k| after.wrapping_add(k)).find(|&id| base ^ delta(&cols, id) == want)
}

#[cfg(test)]
mod id_tests {
    use super::*;
    use proptest::prelude::*;

    /// The ICRC the slow, obvious way: the whole masked pseudo-packet in one
    /// buffer, one CRC over it.
    /// (The prefix written field by field into a slice, as it was before
    /// `masked_prefix`: an independent check of that one.)
    fn reference(ip: &IpInfo, without_icrc: &[u8]) -> [u8; 4] {
        let mut prefix = [0u8; MAX_PREFIX];
        let n = reference_prefix(ip, without_icrc.len() + 4, without_icrc, &mut prefix);
        let mut all = prefix[..n].to_vec();
        all.extend_from_slice(&without_icrc[12..]);
        crc32fast::hash(&all).to_le_bytes()
    }

    fn reference_prefix(ip: &IpInfo, udp_payload_len: usize, bth: &[u8], out: &mut [u8]) -> usize {
        out[..8].fill(0xFF);
        let udp_len = (8 + udp_payload_len) as u16;
        let mut n = 8;
        match (ip.src, ip.dst) {
            (IpAddr::V4(s), IpAddr::V4(d)) => {
                let x = &mut out[n..n + 20];
                x[0] = 0x45;
                x[1] = 0xFF; // TOS
                x[2..4].copy_from_slice(&(20 + udp_len).to_be_bytes());
                x[4..6].copy_from_slice(&ip.ipv4_id.to_be_bytes());
                x[6] = 0x40; // DF
                x[7] = 0;
                x[8] = 0xFF; // TTL
                x[9] = 17;
                x[10] = 0xFF; // checksum
                x[11] = 0xFF;
                x[12..16].copy_from_slice(&s.octets());
                x[16..20].copy_from_slice(&d.octets());
                n += 20;
            }
            (s, d) => {
                let v6 = |a: IpAddr| match a {
                    IpAddr::V4(v) => v.to_ipv6_mapped(),
                    IpAddr::V6(v) => v,
                };
                let x = &mut out[n..n + 40];
                x[0..4].copy_from_slice(&[0x6F, 0xFF, 0xFF, 0xFF]);
                x[4..6].copy_from_slice(&udp_len.to_be_bytes());
                x[6] = 17;
                x[7] = 0xFF;
                x[8..24].copy_from_slice(&v6(s).octets());
                x[24..40].copy_from_slice(&v6(d).octets());
                n += 40;
            }
        }
        let u = &mut out[n..n + 8];
        u[0..2].copy_from_slice(&ip.sport.to_be_bytes());
        u[2..4].copy_from_slice(&ip.dport.to_be_bytes());
        u[4..6].copy_from_slice(&udp_len.to_be_bytes());
        u[6..8].fill(0xFF);
        n += 8;
        out[n..n + 12].copy_from_slice(&bth[..12]);
        out[n + 4] = 0xFF;
        n + 12
    }

    proptest! {
        /// Every length (either side of the one-piece limit) and every way of
        /// cutting a packet into pieces give the same ICRC.
        #[test]
        fn pieces_and_lengths_agree(len in 12usize..700, cut1 in 0usize..700, cut2 in 0usize..700,
                                   v6 in any::<bool>(), seed in any::<u8>(), id in any::<u16>(),
                                   sport in any::<u16>()) {
            let pkt: Vec<u8> = (0..len).map(|i| (i as u8).wrapping_mul(31) ^ seed).collect();
            let ip = IpInfo {
                src: if v6 { "2001:db8::1".parse().unwrap() } else { "10.0.0.1".parse().unwrap() },
                dst: if v6 { "2001:db8::2".parse().unwrap() } else { "10.0.0.2".parse().unwrap() },
                sport,
                dport: 4791,
                ipv4_id: id,
            };
            let want = reference(&ip, &pkt);
            prop_assert_eq!(compute(&ip, &pkt), want);
            let (a, b) = (12 + cut1 % (len - 11), 12 + cut2 % (len - 11));
            let (a, b) = (a.min(b).min(len), a.max(b).min(len));
            prop_assert_eq!(compute_parts(&ip, &[&pkt[..a], &pkt[a..b], &pkt[b..]]), want);
        }
    }

    /// Segment k of a GSO send (ID k) is found whatever batch it arrived
    /// in, for every k a sender uses; other IDs are not taken.
    #[test]
    fn every_gso_segment_id_is_found_and_no_other() {
        let ip = IpInfo {
            src: "10.0.0.1".parse().unwrap(),
            dst: "10.0.0.2".parse().unwrap(),
            sport: 49152,
            dport: 4791,
            ipv4_id: 0,
        };
        for len in [16usize, 20, 1052, 4124] {
            let mut pkt: Vec<u8> = (0..len).map(|i| (i * 13) as u8).collect();
            let c = compute(&ip, &pkt[..len - 4]);
            pkt[len - 4..].copy_from_slice(&c);
            for id in 0..IPV4_ID_CANDIDATES {
                let mut p = pkt.clone();
                set_ipv4_id(&mut p, id);
                assert_eq!(find_ipv4_id(&ip, &p, 0), Some(id), "len {len} id {id}");
                assert_eq!(find_ipv4_id(&ip, &p, 5), Some(id), "len {len} id {id}, hint 5");
            }
            for id in [IPV4_ID_CANDIDATES, 65, 0x100, 0xFFFF] {
                let mut p = pkt.clone();
                set_ipv4_id(&mut p, id);
                assert_eq!(find_ipv4_id(&ip, &p, id), None, "len {len} id {id}");
            }
        }
    }

    #[test]
    fn id_delta_matches_a_full_recompute() {
        let ip = IpInfo {
            src: "10.0.0.1".parse().unwrap(),
            dst: "10.0.0.2".parse().unwrap(),
            sport: 5,
            dport: 4791,
            ipv4_id: 0,
        };
        let mut pkt: Vec<u8> = (0..200u8).collect();
        let n = pkt.len();
        let c = compute(&ip, &pkt[..n - 4]);
        pkt[n - 4..].copy_from_slice(&c);
        for id in [1u16, 2, 7, 63, 0x8001] {
            let mut p = pkt.clone();
            set_ipv4_id(&mut p, id);
            assert!(verify(&IpInfo { ipv4_id: id, ..ip }, &p), "id {id}");
            assert_eq!(find_ipv4_id(&ip, &p, 0), (id <= 63).then_some(id));
            assert_eq!(find_ipv4_id(&ip, &p, 7), (id <= 63).then_some(id), "a wrong hint");
            assert_eq!(find_ipv4_id(&ip, &p, id), (id <= 63).then_some(id), "the right hint");
        }
        assert_eq!(find_ipv4_id(&ip, &pkt, 0), Some(0));
        pkt[20] ^= 1;
        assert_eq!(find_ipv4_id(&ip, &pkt, 0), None, "corruption is still caught");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// (frame hex, from wire.md and conformance/vectors.txt)
    const CNP: &str = "e41d2dab2bc27cfe90643b32080045c2003c718c4000401191610a0011010a001201000012b7002800008100ffff40000118000000000000000000000000000000000000000082fd002a";
    const READ: &str = "000c29ae1ca4000c2989a2e508004500003cbe10400040118a4bc0a83881c0a83883df9412b7002800000c00ffff000000118054cb6300007fee260fb000000002b80001000008c6154a";
    const UC_V4: &str = "248a07a8fa22248a07a8fa22080045010040047840004011b4d5c0a80007c0a80007c00012b7002caca22460ffff000000d300cf17104630818be28935d90e9a95505401be885e50000078f353f3";
    const UC_V6: &str = "248a07a8fa22248a07a8fa2286dd6e21face002c11ff2022000000000000000000000000102320230000000000000000000000001024c00012b7002ce7c52460ffff000000d300cf17104630818be28935d90e9a95505401be885e5000003e5b743b";

    fn hex(s: &str) -> Vec<u8> {
        (0..s.len()).step_by(2).map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap()).collect()
    }

    /// IpInfo and UDP payload of an Ethernet frame.
    fn split(f: &[u8]) -> (IpInfo, Vec<u8>) {
        crate::wire::pcap::extract_roce(1, f, 4791).map(|(i, p)| (i, p.to_vec())).expect("RoCEv2 frame")
    }

    #[test]
    fn vectors_verify() {
        for v in [CNP, READ, UC_V4, UC_V6] {
            let f = hex(v);
            let (ip, p) = split(&f);
            assert!(verify(&ip, &p), "{v}");
            let n = p.len();
            assert_eq!(compute(&ip, &p[..n - 4])[..], p[n - 4..]);
        }
    }

    #[test]
    fn ipv4_id_is_solved_and_corruption_rejected() {
        for (v, id) in [(CNP, 0x718C), (READ, 0xBE10), (UC_V4, 0x0478)] {
            let (ip, mut p) = split(&hex(v));
            assert_eq!(solve_ipv4_id(&IpInfo { ipv4_id: 0, ..ip }, &p), Some(id));
            let i = p.len() - 6;
            p[i] ^= 0x10;
            assert_eq!(solve_ipv4_id(&ip, &p), None, "corruption of {v}");
        }
    }

    #[test]
    fn masked_fields_do_not_matter() {
        let (mut ip, mut p) = split(&hex(CNP));
        p[4] ^= 0xC0; // FECN/BECN
        assert!(verify(&ip, &p));
        ip.ipv4_id ^= 1;
        assert!(!verify(&ip, &p));
    }
}
