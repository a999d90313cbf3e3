//! Conformance against real Linux rxe traffic and hardware/scapy ICRC
//! vectors (the repository's conformance/ folder, with its licences): every
//! RoCE packet of every capture parses, its ICRC verifies, re-emitting the
//! parsed headers and payload reproduces the exact bytes, tshark agrees with
//! our decode on opcode, PSN and QPN, and every RoCEv2 vector verifies.

#[macro_use]
mod skip;

use std::path::PathBuf;
use uroce::wire::pcap::{extract_roce, PcapReader};
use uroce::wire::{build_packet, icrc, Packet};

fn conformance() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../conformance")
}

fn captures() -> Vec<PathBuf> {
    let dir = conformance().join("captures/rxe");
    let mut v: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "pcap"))
        .collect();
    v.sort();
    v
}

#[test]
fn every_rxe_packet_parses_verifies_and_reemits() {
    let files = captures();
    assert_eq!(files.len(), 20);
    let (mut total, mut ok) = (0, 0);
    for f in &files {
        let r = PcapReader::new(std::fs::File::open(f).unwrap()).unwrap();
        let lt = r.linktype;
        for frame in r {
            let frame = frame.unwrap();
            let Some((ip, udp)) = extract_roce(lt, &frame.data, 4791) else { continue };
            total += 1;
            let p = Packet::parse(udp).unwrap_or_else(|e| panic!("{}: {e}", f.display()));
            assert!(icrc::verify(&ip, udp), "{}: bad ICRC", f.display());
            ok += 1;
            let mut buf = vec![0u8; udp.len() + 8];
            let n = build_packet(&p.headers, p.payload, &ip, &mut buf).unwrap();
            assert_eq!(&buf[..n], udp, "{}: re-emitted bytes differ", f.display());
        }
    }
    assert_eq!((total, ok), (1653, 1653));
}

#[test]
fn tshark_agrees_on_opcode_psn_qpn() {
    let files = captures();
    if std::process::Command::new("tshark").arg("-v").output().is_err() {
        skip!("tshark is not installed (Debian package tshark)");
    }
    for f in &files {
        let out = std::process::Command::new("tshark")
            .args([
                "-r",
                f.to_str().unwrap(),
                "-d",
                "udp.port==4791,infiniband",
                "--disable-protocol",
                "rpcordma",
                "--disable-protocol",
                "tftp",
            ])
            .args([
                "-Y",
                "udp.dstport==4791",
                "-T",
                "fields",
                "-E",
                "separator=,",
                "-e",
                "infiniband.bth.opcode",
                "-e",
                "infiniband.bth.psn",
                "-e",
                "infiniband.bth.destqp",
            ])
            .output()
            .unwrap();
        assert!(out.status.success());
        let theirs: Vec<(u32, u32, u32)> = String::from_utf8_lossy(&out.stdout)
            .lines()
            .map(|l| {
                let v: Vec<u32> = l
                    .split(',')
                    .map(|x| {
                        let x = x.trim();
                        x.strip_prefix("0x").map_or_else(|| x.parse().unwrap(), |h| u32::from_str_radix(h, 16).unwrap())
                    })
                    .collect();
                (v[0], v[1], v[2])
            })
            .collect();
        let r = PcapReader::new(std::fs::File::open(f).unwrap()).unwrap();
        let lt = r.linktype;
        let ours: Vec<(u32, u32, u32)> = r
            .filter_map(|fr| {
                let fr = fr.unwrap();
                let (_, udp) = extract_roce(lt, &fr.data, 4791)?;
                let p = Packet::parse(udp).unwrap();
                Some((p.headers.bth.opcode.0 as u32, p.headers.bth.psn, p.headers.bth.dest_qp))
            })
            .collect();
        assert_eq!(ours, theirs, "{}", f.display());
    }
}

/// The RoCEv2 frames of vectors.txt (a ConnectX-4 Lx CNP, scapy's UC SENDs
/// over IPv4 and IPv6, a Soft-RoCE READ request) verify, and their ICRC
/// recomputes to the wire bytes. The two RoCEv1 frames (ethertype 0x8915)
/// are not RoCEv2 and not read.
#[test]
fn every_rocev2_vector_verifies() {
    let text = std::fs::read_to_string(conformance().join("vectors.txt")).unwrap();
    let mut names = Vec::new();
    let mut name = "";
    for line in text.lines() {
        if let Some(n) = line.strip_prefix('[').and_then(|l| l.strip_suffix(']')) {
            name = n;
        }
        let Some(hex) = line.strip_prefix("frame: ") else { continue };
        let frame: Vec<u8> =
            (0..hex.len()).step_by(2).map(|i| u8::from_str_radix(&hex[i..i + 2], 16).unwrap()).collect();
        if frame[12..14] == [0x89, 0x15] {
            continue;
        }
        let (ip, udp) = extract_roce(1, &frame, 4791).unwrap_or_else(|| panic!("{name}: not a RoCEv2 frame"));
        assert!(icrc::verify(&ip, udp), "{name}: bad ICRC");
        let n = udp.len();
        assert_eq!(icrc::compute(&ip, &udp[..n - 4])[..], udp[n - 4..], "{name}");
        names.push(name);
    }
    names.sort();
    assert_eq!(
        names,
        [
            "connectx4lx_cnp_ipv4",
            "pcapplusplus_rc_rdma_read_request",
            "scapy_uc_send_only_ipv4",
            "scapy_uc_send_only_ipv6"
        ]
    );
}
