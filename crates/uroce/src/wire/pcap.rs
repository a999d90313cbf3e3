//! Classic pcap files: a writer that wraps RoCE UDP payloads in synthesized
//! Ethernet/IP/UDP headers (so Wireshark decodes them), a reader, and the
//! extraction of RoCEv2 packets from captured frames.

use super::IpInfo;
use std::cell::RefCell;
use std::io::{self, Read, Write};
use std::net::IpAddr;
use std::rc::Rc;
use std::time::{SystemTime, UNIX_EPOCH};

/// Link type of Ethernet frames.
pub const LINKTYPE_ETHERNET: u32 = 1;
/// Link type of raw IP packets (no link-layer header).
pub const LINKTYPE_RAW: u32 = 101;
/// Link type of Linux cooked captures, version 1 (16-byte header).
pub const LINKTYPE_LINUX_SLL: u32 = 113;
/// Link type of Linux cooked captures, version 2 (20-byte header).
pub const LINKTYPE_LINUX_SLL2: u32 = 276;

/// Writes a pcap stream of Ethernet frames (the file format by
/// `pcap-file`, the Ethernet/IP/UDP headers by `etherparse`).
pub struct PcapWriter<W: Write> {
    w: pcap_file::pcap::PcapWriter<Sink<W>>,
    sink: Sink<W>,
}

/// The stream under the `pcap-file` writer, shared with [`PcapWriter`] so
/// that it can be flushed (`pcap-file` hands out no reference to it).
struct Sink<W>(Rc<RefCell<W>>);

impl<W: Write> Write for Sink<W> {
    fn write(&mut self, b: &[u8]) -> io::Result<usize> {
        self.0.borrow_mut().write(b)
    }
    fn write_all(&mut self, b: &[u8]) -> io::Result<()> {
        self.0.borrow_mut().write_all(b)
    }
    fn flush(&mut self) -> io::Result<()> {
        self.0.borrow_mut().flush()
    }
}

/// The largest frame a capture record holds (the pcap header's snaplen).
pub const SNAPLEN: u32 = 262_144;

fn mac_for(ip: IpAddr) -> [u8; 6] {
    let o = match ip {
        IpAddr::V4(v) => v.octets(),
        IpAddr::V6(v) => {
            let o = v.octets();
            [o[12], o[13], o[14], o[15]]
        }
    };
    [0x02, 0x00, o[0], o[1], o[2], o[3]]
}

fn pcap_error(e: pcap_file::PcapError) -> io::Error {
    match e {
        pcap_file::PcapError::IoError(e) => e,
        e => io::Error::new(io::ErrorKind::InvalidInput, e.to_string()),
    }
}

/// The Ethernet frame Wireshark decodes as the RoCEv2 packet `udp_payload`:
/// Ethernet, IPv4 (DF, TTL 64, ID from `ip`, UDP checksum 0 as rxe) or IPv6
/// (hop limit 64, real UDP checksum), UDP. `InvalidInput` for a payload
/// too large for one IP packet.
pub fn roce_frame(ip: &IpInfo, udp_payload: &[u8]) -> io::Result<Vec<u8>> {
    use etherparse::{EtherType, Ethernet2Header, IpNumber, Ipv4Header, Ipv6Header, UdpHeader};
    let too_big = |e: &dyn std::fmt::Display| io::Error::new(io::ErrorKind::InvalidInput, e.to_string());
    let mut f = Vec::with_capacity(14 + 40 + 8 + udp_payload.len());
    let eth = |ether_type| Ethernet2Header { source: mac_for(ip.src), destination: mac_for(ip.dst), ether_type };
    let udp = match (ip.src, ip.dst) {
        (IpAddr::V4(s), IpAddr::V4(d)) => {
            let udp =
                UdpHeader::without_ipv4_checksum(ip.sport, ip.dport, udp_payload.len()).map_err(|e| too_big(&e))?;
            let mut h =
                Ipv4Header::new(udp.length, 64, IpNumber::UDP, s.octets(), d.octets()).map_err(|e| too_big(&e))?;
            h.identification = ip.ipv4_id;
            h.dont_fragment = true;
            h.header_checksum = h.calc_header_checksum();
            f.extend_from_slice(&eth(EtherType::IPV4).to_bytes());
            f.extend_from_slice(&h.to_bytes());
            udp
        }
        (s, d) => {
            let v6 = |a: IpAddr| match a {
                IpAddr::V4(v) => v.to_ipv6_mapped(),
                IpAddr::V6(v) => v,
            };
            let len = u16::try_from(8 + udp_payload.len()).map_err(|e| too_big(&e))?;
            let h = Ipv6Header {
                payload_length: len,
                next_header: IpNumber::UDP,
                hop_limit: 64,
                source: v6(s).octets(),
                destination: v6(d).octets(),
                ..Default::default()
            };
            let udp = UdpHeader::with_ipv6_checksum(ip.sport, ip.dport, &h, udp_payload).map_err(|e| too_big(&e))?;
            f.extend_from_slice(&eth(EtherType::IPV6).to_bytes());
            f.extend_from_slice(&h.to_bytes());
            udp
        }
    };
    f.extend_from_slice(&udp.to_bytes());
    f.extend_from_slice(udp_payload);
    Ok(f)
}

impl<W: Write> PcapWriter<W> {
    /// Writes the file header: classic pcap 2.4, little-endian, µs
    /// timestamps, Ethernet, snaplen [`SNAPLEN`].
    pub fn new(w: W) -> io::Result<Self> {
        use pcap_file::{pcap::PcapHeader, DataLink, Endianness, TsResolution};
        let header = PcapHeader {
            version_major: 2,
            version_minor: 4,
            ts_correction: 0,
            ts_accuracy: 0,
            snaplen: SNAPLEN,
            datalink: DataLink::ETHERNET,
            ts_resolution: TsResolution::MicroSecond,
            endianness: Endianness::Little,
        };
        let shared = Rc::new(RefCell::new(w));
        let w = pcap_file::pcap::PcapWriter::with_header(Sink(shared.clone()), header).map_err(pcap_error)?;
        Ok(PcapWriter { w, sink: Sink(shared) })
    }

    /// Writes one RoCEv2 packet as [`roce_frame`] builds it.
    pub fn write_roce(&mut self, ts: SystemTime, ip: &IpInfo, udp_payload: &[u8]) -> io::Result<()> {
        self.write_frame(ts, &roce_frame(ip, udp_payload)?)
    }

    /// Writes one record holding `frame` (at most [`SNAPLEN`] bytes).
    pub fn write_frame(&mut self, ts: SystemTime, frame: &[u8]) -> io::Result<()> {
        let t = ts.duration_since(UNIX_EPOCH).unwrap_or_default();
        let len = u32::try_from(frame.len()).unwrap_or(u32::MAX);
        self.w.write_packet(&pcap_file::pcap::PcapPacket::new(t, len, frame)).map_err(pcap_error)?;
        Ok(())
    }

    /// Flushes the underlying stream.
    pub fn flush(&mut self) -> io::Result<()> {
        self.sink.flush()
    }
}

/// One captured frame.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Frame {
    /// Timestamp: seconds.
    pub ts_sec: u32,
    /// Timestamp: the fraction of a second, in µs or ns as the file's
    /// magic number says.
    pub ts_frac: u32,
    /// The captured bytes.
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
    /// The file's link type (`LINKTYPE_*`, byte order fixed).
    pub linktype: u32,
    records: u64,
    cut: Option<Cut>,
}

impl<R: Read> PcapReader<R> {
    /// Reads the file header; `InvalidData` if it is not classic pcap.
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

    /// The bytes the hand-written writer produced: file header, an IPv4
    /// frame (DF, TTL 64, the ID, a checksum that holds, UDP checksum 0).
    #[test]
    fn file_header_and_ipv4_frame_bytes() {
        let mut out = Vec::new();
        PcapWriter::new(&mut out).unwrap().flush().unwrap();
        let mut want = vec![0xd4, 0xc3, 0xb2, 0xa1, 2, 0, 4, 0, 0, 0, 0, 0, 0, 0, 0, 0];
        want.extend_from_slice(&SNAPLEN.to_le_bytes());
        want.extend_from_slice(&LINKTYPE_ETHERNET.to_le_bytes());
        assert_eq!(out, want);
        let ip = IpInfo {
            src: "127.0.0.1".parse().unwrap(),
            dst: "127.0.0.2".parse().unwrap(),
            sport: 49152,
            dport: 4791,
            ipv4_id: 0x1234,
        };
        let f = roce_frame(&ip, b"abcd").unwrap();
        let mut h = vec![0x45, 0, 0, 32, 0x12, 0x34, 0x40, 0, 64, 17, 0, 0, 127, 0, 0, 1, 127, 0, 0, 2];
        let sum = h.chunks(2).fold(0u32, |a, w| a + u16::from_be_bytes([w[0], w[1]]) as u32);
        let sum = !(((sum & 0xFFFF) + (sum >> 16)) as u16);
        h[10..12].copy_from_slice(&sum.to_be_bytes());
        let mut want = vec![2, 0, 127, 0, 0, 2, 2, 0, 127, 0, 0, 1, 0x08, 0x00];
        want.extend_from_slice(&h);
        want.extend_from_slice(&[0xc0, 0x00, 0x12, 0xb7, 0, 12, 0, 0]);
        want.extend_from_slice(b"abcd");
        assert_eq!(f, want);
    }

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
