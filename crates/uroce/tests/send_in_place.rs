//! Sending in place (`EngineConfig::send_in_place`): a requester whose
//! payload is one run of pinned host memory of at least `IN_PLACE_MIN`
//! bytes leaves it in the registered buffer, and the packet's pieces
//! (headers, the application's bytes, pad and ICRC) gather to exactly the
//! packet a copy would have built, ICRC included, also after the IPv4-ID
//! rewrite of a GSO send. Shorter payloads, several SGEs and ODP memory are
//! copied. While a packet holds its bytes, deregistration of their region
//! waits, so the kernel never reads memory the application got back.

use std::sync::Arc;
use std::time::{Duration, Instant};
use uroce::ib::{Access, Gid, Mtu, QpAttrMask as M, QpState, QpType, Sge};
use uroce::mem::{Memory, MemoryRegion};
use uroce::proto::cq::CompletionQueue;
use uroce::proto::qp::{required_attributes, QpInit};
use uroce::proto::wr::{AddressVector, QpAttr, QpCap, SendWr, WrOpcode};
use uroce::proto::{Engine, EngineConfig, Transmit, IN_PLACE_MIN};
use uroce::wire::{icrc, IpInfo, Opcode, Packet};

const LOCAL: [u8; 4] = [10, 0, 0, 2];
const PEER: [u8; 4] = [10, 0, 0, 1];
const MTU: usize = 1024;

/// An engine with one RC QP in RTS towards PEER.
fn requester(mem: &Arc<Memory>, in_place: bool) -> (Engine, u32, Instant) {
    let mut cfg = EngineConfig::new(LOCAL.into(), 4791, Mtu::Mtu1024);
    cfg.send_in_place = in_place;
    let mut e = Engine::new(cfg, mem.clone());
    let cq = Arc::new(CompletionQueue::new(1, 1024));
    let cap = QpCap { max_send_wr: 16, max_recv_wr: 1, max_send_sge: 4, max_recv_sge: 1, max_inline_data: 0 };
    let init = QpInit {
        qp_type: QpType::Rc,
        pd: 1,
        send_cq: cq.clone(),
        recv_cq: cq,
        srq: None,
        cap,
        sq_sig_all: false,
        scatter_to_cqe: false,
    };
    let qpn = e.create_qp(init).unwrap();
    let now = Instant::now();
    let mut a = QpAttr {
        qp_state: QpState::Init,
        port_num: 1,
        qp_access_flags: Access::LOCAL_WRITE,
        path_mtu: Mtu::Mtu1024,
        dest_qp_num: 0x11,
        max_dest_rd_atomic: 1,
        max_rd_atomic: 1,
        timeout: 14,
        retry_cnt: 7,
        rnr_retry: 7,
        ah_attr: AddressVector {
            dgid: Gid::from_ip(PEER.into()),
            is_global: true,
            hop_limit: 64,
            port_num: 1,
            ..Default::default()
        },
        ..QpAttr::default()
    };
    for (cur, next) in [(QpState::Reset, QpState::Init), (QpState::Init, QpState::Rtr), (QpState::Rtr, QpState::Rts)] {
        a.qp_state = next;
        e.modify_qp(now, qpn, &a, M::STATE | required_attributes(QpType::Rc, cur, next)).unwrap();
    }
    (e, qpn, now)
}

/// A buffer of `len` bytes with a recognisable pattern.
fn buffer(len: usize) -> Vec<u8> {
    (0..len).map(|i| (i * 7 + i / 251) as u8).collect()
}

fn register(mem: &Memory, buf: &[u8], access: Access) -> Arc<MemoryRegion> {
    let addr = buf.as_ptr() as usize;
    // SAFETY: every buffer outlives its region in these tests (each test
    // deregisters, or drops the Memory, before the buffer).
    unsafe { mem.register(1, addr, buf.len() as u64, addr as u64, access, None) }.unwrap()
}

fn write(wr_id: u64, sges: &[Sge]) -> SendWr {
    let mut wr = SendWr::new(wr_id, WrOpcode::RdmaWrite);
    wr.sg_list = sges.iter().copied().collect();
    wr.remote_addr = 0x1000;
    wr.rkey = 0x42;
    wr
}

fn drain(e: &mut Engine, now: Instant) -> Vec<Transmit> {
    std::iter::from_fn(|| e.poll_transmit(now)).take(1000).collect()
}

fn ip(id: u16) -> IpInfo {
    IpInfo { src: LOCAL.into(), dst: PEER.into(), sport: 4791, dport: 4791, ipv4_id: id }
}

/// Checks that `ts` carry `src` in order as WRITE packets with good ICRCs,
/// and returns how many were sent in place.
fn check_packets(ts: &[Transmit], src: &[u8]) -> usize {
    let mut at = 0;
    for t in ts {
        let bytes = t.bytes();
        assert_eq!(bytes.len(), t.len());
        assert!(icrc::verify(&ip(0), &bytes), "ICRC of a packet");
        let p = Packet::parse(&bytes).unwrap();
        assert!(matches!(
            p.headers.bth.opcode,
            Opcode::RC_WRITE_FIRST | Opcode::RC_WRITE_MIDDLE | Opcode::RC_WRITE_LAST | Opcode::RC_WRITE_ONLY
        ));
        assert_eq!(p.payload, &src[at..at + p.payload.len()], "payload at {at}");
        at += p.payload.len();
    }
    assert_eq!(at, src.len(), "the whole message went out");
    ts.iter().filter(|t| t.in_place.is_some()).count()
}

#[test]
fn pinned_payloads_leave_in_place_with_the_packet_a_copy_would_build() {
    let mem = Arc::new(Memory::new());
    // 8 KiB + 13: eight full packets and a 13-byte LAST (padded, copied).
    let src = buffer(8 * MTU + 13);
    let mr = register(&mem, &src, Access::LOCAL_WRITE);
    let sge = Sge { addr: src.as_ptr() as u64, length: src.len() as u32, lkey: mr.key };

    let (mut e, qpn, now) = requester(&mem, true);
    e.post_send(now, qpn, write(1, &[sge])).unwrap();
    let in_place = drain(&mut e, now);
    assert_eq!(check_packets(&in_place, &src), 8, "the full packets are sent in place, the short LAST is copied");
    const { assert!(IN_PLACE_MIN > 13 && IN_PLACE_MIN <= MTU) };

    // The same message from an engine that copies: byte for byte the same.
    let (mut c, qpn_c, now_c) = requester(&mem, false);
    assert_eq!(qpn_c, qpn);
    c.post_send(now_c, qpn_c, write(1, &[sge])).unwrap();
    let copied = drain(&mut c, now_c);
    assert_eq!(check_packets(&copied, &src), 0);
    assert_eq!(in_place.len(), copied.len());
    for (a, b) in in_place.iter().zip(&copied) {
        assert_eq!(a.bytes(), b.bytes());
    }

    // A GSO send gives its k-th segment IPv4 ID k: the rewritten ICRC of a
    // packet sent in place checks out with that ID, as a copied one's does.
    let mut t = in_place.into_iter().nth(3).unwrap();
    t.set_ipv4_id(3);
    assert!(icrc::verify(&ip(3), &t.bytes()));
    assert!(!icrc::verify(&ip(0), &t.bytes()));
}

#[test]
fn short_payloads_several_sges_and_odp_memory_are_copied() {
    let mem = Arc::new(Memory::new());
    let src = buffer(4 * MTU);
    let mr = register(&mem, &src, Access::LOCAL_WRITE);
    let base = src.as_ptr() as u64;
    let (mut e, qpn, now) = requester(&mem, true);

    // Shorter than IN_PLACE_MIN.
    let short = Sge { addr: base, length: (IN_PLACE_MIN - 1) as u32, lkey: mr.key };
    e.post_send(now, qpn, write(1, &[short])).unwrap();
    assert_eq!(check_packets(&drain(&mut e, now), &src[..IN_PLACE_MIN - 1]), 0);

    // Two SGEs: gathered by a copy.
    let halves = [
        Sge { addr: base, length: MTU as u32, lkey: mr.key },
        Sge { addr: base + MTU as u64, length: MTU as u32, lkey: mr.key },
    ];
    e.post_send(now, qpn, write(2, &halves)).unwrap();
    assert_eq!(check_packets(&drain(&mut e, now), &src[..2 * MTU]), 0);

    // ODP memory may be unmapped at any time: copied by the fault-tolerant path.
    let odp = register(&mem, &src, Access::LOCAL_WRITE | Access::ON_DEMAND);
    let sge = Sge { addr: base, length: (2 * MTU) as u32, lkey: odp.key };
    e.post_send(now, qpn, write(3, &[sge])).unwrap();
    assert_eq!(check_packets(&drain(&mut e, now), &src[..2 * MTU]), 0);
    mem.deregister(odp.key).unwrap();
    mem.deregister(mr.key).unwrap();
}

#[test]
fn deregistration_waits_for_a_packet_that_holds_the_bytes() {
    let mem = Arc::new(Memory::new());
    let src = buffer(2 * MTU);
    let mr = register(&mem, &src, Access::LOCAL_WRITE);
    let (mut e, qpn, now) = requester(&mem, true);
    let sge = Sge { addr: src.as_ptr() as u64, length: src.len() as u32, lkey: mr.key };
    e.post_send(now, qpn, write(1, &[sge])).unwrap();
    let held = drain(&mut e, now);
    assert_eq!(held.iter().filter(|t| t.in_place.is_some()).count(), 2);

    let key = mr.key;
    let m = mem.clone();
    let dereg = std::thread::spawn(move || m.deregister(key));
    std::thread::sleep(Duration::from_millis(100));
    assert!(!dereg.is_finished(), "deregistration returned while packets still referenced the region");
    drop(held); // sent: the kernel has copied the bytes
    let deadline = Instant::now() + Duration::from_secs(5);
    while !dereg.is_finished() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(5));
    }
    assert!(dereg.is_finished(), "deregistration still waiting after the packets were dropped");
    dereg.join().unwrap().unwrap();
}
