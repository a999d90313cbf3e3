//! Conformance against real Linux rxe traffic (shared/conformance): every
//! RoCE packet of every capture parses, its ICRC verifies, re-emitting the
//! parsed headers and payload reproduces the exact bytes, and tshark agrees
//! with our decode on opcode, PSN and QPN. Skips with a reason when the
//! reference data or tshark is absent.

use std::path::PathBuf;
use uroce::wire::pcap::{extract_roce, PcapReader};
use uroce::wire::{build_packet, icrc, Packet};

fn captures() -> Option<Vec<PathBuf>> {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../../shared/conformance/captures/rxe");
    let mut v: Vec<PathBuf> = std::fs::read_dir(&dir)
        .ok()?
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "pcap"))
        .collect();
    v.sort();
    Some(v)
}

#[test]
fn every_rxe_packet_parses_verifies_and_reemits() {
    let Some(files) = captures() else {
        println!("SKIP wire conformance: ../shared/conformance is not present (a fresh clone has no ../shared)");
        return;
    };
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
    let Some(files) = captures() else {
        println!("SKIP tshark agreement: ../shared/conformance is not present");
        return;
    };
    if std::process::Command::new("tshark").arg("-v").output().is_err() {
        println!("SKIP tshark agreement: tshark is not installed");
        return;
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
