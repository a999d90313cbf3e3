//! Classic pcap files: a writer that wraps RoCE UDP payloads in synthesized
//! Ethernet/IP/UDP headers (so Wireshark decodes them), a reader, and the
//! extraction of RoCEv2 packets from captured frames.

use super::IpInfo;
use std::io::{self, Read, Write};
use std::net::IpAddr;
use std::time::{SystemTime, UNIX_EPOCH};

pub const LINKTYPE_ETHERNET: u32 = 1;
pub const LINKTYPE_RAW: u32 = 101;
pub const LINKTYPE_LINUX_SLL: u32 = 113;
pub const LINKTYPE_LINUX_SLL2: u32 = 276;

/// Writes a pcap stream of Ethernet frames.
pub struct PcapWriter<W: Write> {
    w: W,
}

fn mac_for(ip: IpAddr) -> [u8; 6] {
    let o = match ip {
        IpAddr::V4(v) => v.octets(),
        IpAddr::V6(v) => v.octets()[12..].try_into().unwrap(),
    };
    [0x02, 0x00, o[0], o[1], o[2], o[3]]
}

fn checksum(chunks: &[&[u8]]) -> u16 {
    let mut sum = 0u32;
    for c in chunks {
        for pair in c.chunks(2) {
            let w = if pair.len() == 2 { u16::from_be_bytes([pair[0], pair[1]]) } else { (pair[0] as u16) << 8 };
            sum += w as u32;
        }
    }
    while sum >> 16 != 0 {
        sum = (sum & 0xFFFF) + (sum >> 16);
    }
    !(sum as u16)
}

impl<W: Write> PcapWriter<W> {
    pub fn new(mut w: W) -> io::Result<Self> {
        let mut h = Vec::with_capacity(24);
        h.extend_from_slice(&0xa1b2_c3d4u32.to_le_bytes());
        h.extend_from_slice(&2u16.to_le_bytes());
        h.extend_from_slice(&4u16.to_le_bytes());
        h.extend_from_slice(&0i32.to_le_bytes());
        h.extend_from_slice(&0u32.to_le_bytes());
        h.extend_from_slice(&262_144u32.to_le_bytes());
        h.extend_from_slice(&LINKTYPE_ETHERNET.to_le_bytes());
        w.write_all(&h)?;
        Ok(PcapWriter { w })
    }

    /// Writes one RoCEv2 packet: Ethernet, IPv4 (DF, TTL 64, ID from `ip`,
    /// UDP checksum 0 as rxe) or IPv6 (hop limit 64, real UDP checksum), UDP.
    pub fn write_roce(&mut self, ts: SystemTime, ip: &IpInfo, udp_payload: &[u8]) -> io::Result<()> {
        let mut f = Vec::with_capacity(62 + udp_payload.len());
        f.extend_from_slice(&mac_for(ip.dst));
        f.extend_from_slice(&mac_for(ip.src));
        let udp_len = (8 + udp_payload.len()) as u16;
        let mut udp = [0u8; 8];
        udp[0..2].copy_from_slice(&ip.sport.to_be_bytes());
        udp[2..4].copy_from_slice(&ip.dport.to_be_bytes());
        udp[4..6].copy_from_slice(&udp_len.to_be_bytes());
        match (ip.src, ip.dst) {
            (IpAddr::V4(s), IpAddr::V4(d)) => {
                f.extend_from_slice(&[0x08, 0x00]);
                let mut h = [0u8; 20];
                h[0] = 0x45;
                h[2..4].copy_from_slice(&(20 + udp_len).to_be_bytes());
                h[4..6].copy_from_slice(&ip.ipv4_id.to_be_bytes());
                h[6] = 0x40;
                h[8] = 64;
                h[9] = 17;
                h[12..16].copy_from_slice(&s.octets());
                h[16..20].copy_from_slice(&d.octets());
                let c = checksum(&[&h]);
                h[10..12].copy_from_slice(&c.to_be_bytes());
                f.extend_from_slice(&h);
            }
            (s, d) => {
                let v6 = |a: IpAddr| match a {
                    IpAddr::V4(v) => v.to_ipv6_mapped(),
                    IpAddr::V6(v) => v,
                };
                let (s, d) = (v6(s).octets(), v6(d).octets());
                f.extend_from_slice(&[0x86, 0xDD]);
                let mut h = [0u8; 40];
                h[0] = 0x60;
                h[4..6].copy_from_slice(&udp_len.to_be_bytes());
                h[6] = 17;
                h[7] = 64;
                h[8..24].copy_from_slice(&s);
                h[24..40].copy_from_slice(&d);
                f.extend_from_slice(&h);
                let mut pseudo = [0u8; 40];
                pseudo[0..16].copy_from_slice(&s);
                pseudo[16..32].copy_from_slice(&d);
                pseudo[34..36].copy_from_slice(&udp_len.to_be_bytes());
                pseudo[39] = 17;
                let mut c = checksum(&[&pseudo, &udp, udp_payload]);
                if c == 0 {
                    c = 0xFFFF;
                }
                udp[6..8].copy_from_slice(&c.to_be_bytes());
            }
        }
        f.extend_from_slice(&udp);
        f.extend_from_slice(udp_payload);
        let t = ts.duration_since(UNIX_EPOCH).unwrap_or_default();
        let mut rec = [0u8; 16];
        rec[0..4].copy_from_slice(&(t.as_secs() as u32).to_le_bytes());
        rec[4..8].copy_from_slice(&t.subsec_micros().to_le_bytes());
        rec[8..12].copy_from_slice(&(f.len() as u32).to_le_bytes());
        rec[12..16].copy_from_slice(&(f.len() as u32).to_le_bytes());
        self.w.write_all(&rec)?;
        self.w.write_all(&f)
    }

    pub fn flush(&mut self) -> io::Result<()> {
        self.w.flush()
    }
}

/// One captured frame.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Frame {
    pub ts_sec: u32,
    pub ts_frac: u32,
    pub data: Vec<u8>,
}

/// Where a pcap stream ends in the middle of a record (a capture cut short).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Cut {
    /// Complete records before the cut.
    pub records: u64,
    /// Bytes of the incomplete record that follow them.
    pub trailing: u64,
}

impl std::fmt::Display for Cut {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "file is cut after {} records ({} trailing bytes)", self.records, self.trailing)
    }
}

/// Reads a classic pcap stream (either byte order, µs or ns timestamps).
/// Every complete record is returned; a stream that ends inside a record
/// yields one `UnexpectedEof` error saying so, then ends, and [`cut`]
/// tells where.
///
/// [`cut`]: PcapReader::cut
pub struct PcapReader<R: Read> {
    r: R,
    swap: bool,
    pub linktype: u32,
    records: u64,
    cut: Option<Cut>,
}

impl<R: Read> PcapReader<R> {
    pub fn new(mut r: R) -> io::Result<Self> {
        let mut h = [0u8; 24];
        r.read_exact(&mut h)?;
        let magic = u32::from_le_bytes(h[0..4].try_into().unwrap());
        let swap = match magic {
            0xa1b2_c3d4 | 0xa1b2_3c4d => false,
            0xd4c3_b2a1 | 0x4d3c_b2a1 => true,
            _ => {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidData,
                    "not a classic pcap file (pcapng is not supported)",
                ))
            }
        };
        let lt = u32::from_le_bytes(h[20..24].try_into().unwrap());
        Ok(PcapReader { r, swap, linktype: if swap { lt.swap_bytes() } else { lt }, records: 0, cut: None })
    }

    /// Where the stream was cut, once the reader met the cut.
    pub fn cut(&self) -> Option<Cut> {
        self.cut
    }

    /// Reads until `buf` is full or the stream ends; the bytes read.
    fn fill(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let mut n = 0;
        while n < buf.len() {
            match self.r.read(&mut buf[n..]) {
                Ok(0) => break,
                Ok(k) => n += k,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        Ok(n)
    }

    fn cut_at(&mut self, trailing: u64) -> io::Error {
        let c = Cut { records: self.records, trailing };
        self.cut = Some(c);
        io::Error::new(io::ErrorKind::UnexpectedEof, c.to_string())
    }

    fn u32(&self, b: &[u8]) -> u32 {
        let v = u32::from_le_bytes(b.try_into().unwrap());
        if self.swap {
            v.swap_bytes()
        } else {
            v
        }
    }
}

impl<R: Read> Iterator for PcapReader<R> {
    type Item = io::Result<Frame>;
    fn next(&mut self) -> Option<io::Result<Frame>> {
        if self.cut.is_some() {
            return None;
        }
        let mut rec = [0u8; 16];
        match self.fill(&mut rec) {
            Ok(0) => return None,
            Ok(16) => {}
            Ok(n) => return Some(Err(self.cut_at(n as u64))),
            Err(e) => return Some(Err(e)),
        }
        let incl = self.u32(&rec[8..12]) as usize;
        if incl > 1 << 24 {
            return Some(Err(io::Error::new(io::ErrorKind::InvalidData, "pcap record too large")));
        }
        let mut data = vec![0u8; incl];
        match self.fill(&mut data) {
            Ok(n) if n == incl => {}
            Ok(n) => return Some(Err(self.cut_at(16 + n as u64))),
            Err(e) => return Some(Err(e)),
        }
        self.records += 1;
        Some(Ok(Frame { ts_sec: self.u32(&rec[0..4]), ts_frac: self.u32(&rec[4..8]), data }))
    }
}

/// The IP facts and UDP payload of a frame carrying UDP to `port`.
pub fn extract_roce(linktype: u32, frame: &[u8], port: u16) -> Option<(IpInfo, &[u8])> {
    let ip = match linktype {
        LINKTYPE_ETHERNET => {
            let mut off = 12;
            let mut et = u16::from_be_bytes([*frame.get(12)?, *frame.get(13)?]);
            while et == 0x8100 || et == 0x88A8 {
                off += 4;
                et = u16::from_be_bytes([*frame.get(off)?, *frame.get(off + 1)?]);
            }
            frame.get(off + 2..)?
        }
        LINKTYPE_LINUX_SLL => frame.get(16..)?,
        LINKTYPE_LINUX_SLL2 => frame.get(20..)?,
        12 | LINKTYPE_RAW => frame,
        _ => return None,
    };
    let (src, dst, id, udp) = match ip.first()? >> 4 {
        4 => {
            let ihl = ((ip[0] & 0x0F) as usize) * 4;
            if ip.get(9)? != &17 || ihl < 20 {
                return None;
            }
            let total = u16::from_be_bytes([ip[2], ip[3]]) as usize;
            let s: [u8; 4] = ip.get(12..16)?.try_into().ok()?;
            let d: [u8; 4] = ip.get(16..20)?.try_into().ok()?;
            (IpAddr::from(s), IpAddr::from(d), u16::from_be_bytes([ip[4], ip[5]]), ip.get(ihl..total.max(ihl))?)
        }
        6 => {
            if ip.get(6)? != &17 {
                return None;
            }
            let plen = u16::from_be_bytes([ip[4], ip[5]]) as usize;
            let s: [u8; 16] = ip.get(8..24)?.try_into().ok()?;
            let d: [u8; 16] = ip.get(24..40)?.try_into().ok()?;
            (IpAddr::from(s), IpAddr::from(d), 0, ip.get(40..40 + plen)?)
        }
        _ => return None,
    };
    let sport = u16::from_be_bytes([*udp.first()?, *udp.get(1)?]);
    let dport = u16::from_be_bytes([*udp.get(2)?, *udp.get(3)?]);
    let ulen = u16::from_be_bytes([*udp.get(4)?, *udp.get(5)?]) as usize;
    if dport != port || ulen < 8 {
        return None;
    }
    let payload = udp.get(8..ulen)?;
    Some((IpInfo { src, dst, sport, dport, ipv4_id: id }, payload))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::{build_packet, icrc, Bth, Headers, Opcode};

    #[test]
    fn write_then_read_v4_and_v6() {
        let mut out = Vec::new();
        let mut w = PcapWriter::new(&mut out).unwrap();
        let h = Headers::new(Bth {
            opcode: Opcode::RC_SEND_ONLY,
            solicited: false,
            mig_req: false,
            pad_count: 0,
            tver: 0,
            pkey: 0xffff,
            fecn: false,
            becn: false,
            dest_qp: 0x11,
            ack_req: true,
            psn: 1,
        });
        let infos = [
            IpInfo {
                src: "127.0.0.1".parse().unwrap(),
                dst: "127.0.0.2".parse().unwrap(),
                sport: 4791,
                dport: 4791,
                ipv4_id: 0,
            },
            IpInfo {
                src: "::1".parse().unwrap(),
                dst: "fe80::2".parse().unwrap(),
                sport: 4791,
                dport: 4791,
                ipv4_id: 0,
            },
        ];
        for ip in &infos {
            let mut buf = [0u8; 64];
            let n = build_packet(&h, b"hello", ip, &mut buf).unwrap();
            w.write_roce(SystemTime::now(), ip, &buf[..n]).unwrap();
        }
        let r = PcapReader::new(&out[..]).unwrap();
        let lt = r.linktype;
        let frames: Vec<Frame> = r.map(|f| f.unwrap()).collect();
        assert_eq!(frames.len(), 2);
        // Cut anywhere inside the second record: the first is read, then the cut.
        let first = 24 + 16 + frames[0].data.len();
        for end in [first + 1, first + 15, first + 16, out.len() - 1] {
            let mut r = PcapReader::new(&out[..end]).unwrap();
            assert_eq!(r.next().unwrap().unwrap(), frames[0]);
            let e = r.next().unwrap().unwrap_err();
            assert_eq!(e.kind(), io::ErrorKind::UnexpectedEof);
            let c = Cut { records: 1, trailing: (end - first) as u64 };
            assert_eq!(r.cut(), Some(c));
            assert_eq!(e.to_string(), c.to_string());
            assert!(r.next().is_none());
        }
        assert_eq!(PcapReader::new(&out[..first]).unwrap().count(), 1, "a file ending on a record is whole");
        for (f, ip) in frames.iter().zip(&infos) {
            let (got, p) = extract_roce(lt, &f.data, 4791).unwrap();
            assert_eq!(&got, ip);
            assert!(icrc::verify(&got, p));
        }
    }
}
