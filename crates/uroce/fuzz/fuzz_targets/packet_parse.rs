//! Any bytes: the parser never panics; what it accepts re-emits to the same
//! headers and payload (the pad count aside: a sender may pad a payload that
//! needs none, and the emitter pads minimally).
#![no_main]

use libfuzzer_sys::fuzz_target;
use uroce::wire::{build_packet, IpInfo, Packet};

fuzz_target!(|data: &[u8]| {
    let Ok(p) = Packet::parse(data) else { return };
    let ip = IpInfo { src: [10, 0, 0, 1].into(), dst: [10, 0, 0, 2].into(), sport: 1, dport: 4791, ipv4_id: 0 };
    let mut buf = vec![0u8; data.len() + 64];
    let n = build_packet(&p.headers, p.payload, &ip, &mut buf).expect("a parsed packet re-emits");
    let q = Packet::parse(&buf[..n]).expect("the re-emitted packet parses");
    let mut h = q.headers;
    h.bth.pad_count = p.headers.bth.pad_count;
    assert_eq!(h, p.headers);
    assert_eq!(q.payload, p.payload);
});
