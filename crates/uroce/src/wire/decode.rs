//! `uroce decode`: one line per RoCE packet of a pcap file, with every header
//! field and whether the ICRC is correct.

use super::pcap::{extract_roce, PcapReader};
use super::{icrc, AethKind, IpInfo, Packet};
use std::io::{self, Read, Write};

/// Counts of a decode run.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct DecodeSummary {
    /// Frames read.
    pub frames: usize,
    /// Frames carrying UDP to the RoCE port.
    pub roce: usize,
    /// RoCE packets that parsed, with a correct ICRC.
    pub icrc_ok: usize,
    /// RoCE packets that parsed, with a wrong ICRC.
    pub icrc_bad: usize,
    /// RoCE packets that did not parse.
    pub malformed: usize,
    /// The file ended inside a record after the complete ones.
    pub cut: Option<super::pcap::Cut>,
}

/// One packet's description (without frame number and addresses).
pub fn describe(p: &Packet) -> String {
    let h = &p.headers;
    let b = h.bth;
    let name = b.opcode.info().map_or("?", |i| i.name);
    let mut s = format!(
        "{name}({:#04x}) qpn={:#08x} psn={} A={} SE={} M={} pad={} pkey={:#06x}",
        b.opcode.0, b.dest_qp, b.psn, b.ack_req as u8, b.solicited as u8, b.mig_req as u8, b.pad_count, b.pkey
    );
    if let Some(d) = h.deth {
        s += &format!(" | DETH qkey={:#010x} srcqp={:#08x}", d.qkey, d.src_qp);
    }
    if let Some(v) = h.xrceth {
        s += &format!(" | XRCETH srqn={v:#08x}");
    }
    if let Some(r) = h.reth {
        s += &format!(" | RETH va={:#018x} rkey={:#010x} len={}", r.va, r.rkey, r.dma_len);
    }
    if let Some(a) = h.atomic_eth {
        s += &format!(
            " | AtomicETH va={:#018x} rkey={:#010x} swap/add={:#x} cmp={:#x}",
            a.va, a.rkey, a.swap_add, a.compare
        );
    }
    if let Some(a) = h.aeth {
        let k = match a.kind() {
            AethKind::Ack { credits } => format!("ACK credits={credits:#x}"),
            AethKind::RnrNak { timer } => format!("RNR NAK {} us", super::rnr_timer_usec(timer)),
            AethKind::Nak(c) => format!("NAK {}", c.name()),
            AethKind::Reserved(v) => format!("reserved {v:#x}"),
        };
        s += &format!(" | AETH {k} msn={}", a.msn);
    }
    if let Some(v) = h.atomic_ack {
        s += &format!(" | AtomicAckETH orig={v:#x}");
    }
    if let Some(v) = h.imm {
        s += &format!(" | ImmDt {v:#010x}");
    }
    if let Some(v) = h.ieth {
        s += &format!(" | IETH rkey={v:#010x}");
    }
    s += &format!(" | payload={}", p.payload.len());
    // A MAD to the GSI QP: the CM message by name.
    if h.deth.is_some_and(|d| d.qkey == super::mad::GSI_QKEY) && b.dest_qp == super::mad::GSI_QPN {
        s += &format!(" | {}", super::mad::summarize(p.payload));
    }
    s
}

/// Decodes every RoCE packet (UDP to `port`) of a pcap stream into `out`.
pub fn decode_pcap<R: Read, W: Write>(input: R, port: u16, out: &mut W) -> io::Result<DecodeSummary> {
    let mut reader = PcapReader::new(input)?;
    let lt = reader.linktype;
    let mut s = DecodeSummary::default();
    while let Some(frame) = reader.next() {
        let frame = match frame {
            Ok(f) => f,
            // Every complete record was decoded; the summary says where it was cut.
            Err(_) if reader.cut().is_some() => break,
            Err(e) => return Err(e),
        };
        s.frames += 1;
        let Some((ip, udp)) = extract_roce(lt, &frame.data, port) else { continue };
        s.roce += 1;
        let addrs = format!("{}:{} -> {}:{}", ip.src, ip.sport, ip.dst, ip.dport);
        match Packet::parse(udp) {
            Err(e) => {
                s.malformed += 1;
                writeln!(out, "#{} {addrs} MALFORMED: {e}", s.frames)?;
            }
            Ok(p) => {
                let ok = icrc::verify(&ip, udp);
                let icrc = if ok {
                    s.icrc_ok += 1;
                    "icrc=ok".to_string()
                } else {
                    s.icrc_bad += 1;
                    let n = udp.len();
                    let want = icrc::compute(&ip, &udp[..n - 4]);
                    format!("icrc=BAD (wire {}, expected {})", hex(&udp[n - 4..]), hex(&want))
                };
                writeln!(out, "#{} {addrs} {} | {icrc}", s.frames, describe(&p))?;
            }
        }
    }
    writeln!(
        out,
        "{} frames, {} RoCE packets: {} ICRC ok, {} ICRC bad, {} malformed",
        s.frames, s.roce, s.icrc_ok, s.icrc_bad, s.malformed
    )?;
    s.cut = reader.cut();
    Ok(s)
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// The IP facts of a packet, for callers that decode single packets.
pub fn ip_of(ip: &IpInfo) -> String {
    format!("{}:{} -> {}:{}", ip.src, ip.sport, ip.dst, ip.dport)
}

#[cfg(test)]
mod tests {
    #[test]
    fn cm_mads_are_named_with_their_fields() {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../conformance/captures/rxe/rping.pcap");
        let mut out = Vec::new();
        let s = super::decode_pcap(std::fs::File::open(path).unwrap(), 4791, &mut out).unwrap();
        assert_eq!((s.roce, s.icrc_ok), (65, 65));
        let out = String::from_utf8(out).unwrap();
        let cm: Vec<&str> = out.lines().filter(|l| l.contains("| CM ")).collect();
        assert_eq!(cm.len(), 5);
        assert!(cm[0].contains("CM REQ tid=0x000000026dc5c06e lcid=0x6ec0c56d sid=0x0000000001061c06"), "{}", cm[0]);
        assert!(cm[0].contains("qpn=0x00002c psn=0x003da6 rr=1 id=1 retry=7 rnr=7 mtu=3 flow=0x70bbd"), "{}", cm[0]);
        assert!(cm[0].contains("ip 10.1.16.62:48489 -> 10.1.16.61"), "{}", cm[0]);
        assert!(cm[1].contains("CM REP") && cm[1].contains("qpn=0x00002b psn=0xfebd3d"), "{}", cm[1]);
        assert!(cm[2].contains("CM RTU tid=0x000000026dc5c06e lcid=0x6ec0c56d rcid=0x9d88f456"), "{}", cm[2]);
        assert!(cm[3].contains("CM DREQ") && cm[3].contains("remote_qpn=0x00002b"), "{}", cm[3]);
        assert!(cm[4].contains("CM DREP"), "{}", cm[4]);
    }
}
