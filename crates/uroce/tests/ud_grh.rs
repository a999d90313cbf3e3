//! What a UD receive reports about the packet's network header, as mlx5
//! hardware reports RoCE v2 (issue 17; UCX's ud_verbs reads it): the GRH
//! area of the receive buffer and the completion's `wc_flags` and `sl`.
//!
//! - IPv4: the first 20 bytes keep what the buffer held (mlx5 does not
//!   write them), the last 20 are the packet's IPv4 header (the ID its ICRC
//!   matched, a valid checksum); `sl` = 0xA (UDP header present, L3 type 2).
//! - IPv6: the 40 bytes are the IPv6 header; `sl` = 0x9 (L3 type 1).
//!
//! Two sans-IO engines (so IPv6 needs no IPv6 loopback address), and the
//! same over real sockets on IPv4 loopback.

mod common;

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::Instant;
use uroce::ib::{Access, Gid, Mtu, QpAttrMask as M, QpState, QpType, Sge, WcFlags, WcStatus};
use uroce::mem::Memory;
use uroce::proto::cq::CompletionQueue;
use uroce::proto::qp::{required_attributes, QpInit};
use uroce::proto::wr::{AddressVector, QpAttr, QpCap, RecvWr, SendWr, UdDest, WrOpcode};
use uroce::proto::{Engine, EngineConfig};

const QKEY: u32 = 0x1111_1111;
const PORT: u16 = 4791;
/// What the receive buffer holds before the receive.
const FILL: u8 = 0xEE;

struct End {
    e: Engine,
    qpn: u32,
    cq: Arc<CompletionQueue>,
    ip: IpAddr,
    mem: Arc<Memory>,
}

fn ud_end(ip: IpAddr, mem: &Arc<Memory>, now: Instant) -> End {
    let mut e = Engine::new(EngineConfig::new(ip, PORT, Mtu::Mtu1024), mem.clone());
    let cq = Arc::new(CompletionQueue::new(1, 64));
    let cap = QpCap { max_send_wr: 16, max_recv_wr: 16, max_send_sge: 1, max_recv_sge: 2, max_inline_data: 0 };
    let init = QpInit {
        qp_type: QpType::Ud,
        pd: 1,
        send_cq: cq.clone(),
        recv_cq: cq.clone(),
        srq: None,
        cap,
        sq_sig_all: true,
        scatter_to_cqe: false,
    };
    let qpn = e.create_qp(init).unwrap();
    let mut a = QpAttr { port_num: 1, qkey: QKEY, ..QpAttr::default() };
    for (cur, next) in [(QpState::Reset, QpState::Init), (QpState::Init, QpState::Rtr), (QpState::Rtr, QpState::Rts)] {
        a.qp_state = next;
        e.modify_qp(now, qpn, &a, M::STATE | required_attributes(QpType::Ud, cur, next)).unwrap();
    }
    End { e, qpn, cq, ip, mem: mem.clone() }
}

/// One UD SEND of `msg` from `a` to `b`, received into `rx` (in two SGEs,
/// cut at byte `cut`); the IPv4 ID the packet carries is `ipv4_id` (segment
/// `ipv4_id` of a GSO send). Returns the receive completion.
fn send_one(
    a: &mut End,
    b: &mut End,
    msg: &[u8],
    rx: &mut [u8],
    cut: usize,
    ipv4_id: u16,
    now: Instant,
) -> uroce::ib::Wc {
    let mem = a.mem.clone();
    let reg = |buf: &[u8], access| {
        let addr = buf.as_ptr() as usize;
        // SAFETY: the buffers outlive the registrations (deregistered below).
        unsafe { mem.register(1, addr, buf.len() as u64, addr as u64, access, None) }.unwrap()
    };
    let tx_mr = reg(msg, Access::empty());
    let rx_mr = reg(rx, Access::LOCAL_WRITE);
    let base = rx.as_ptr() as u64;
    let sges = [
        Sge { addr: base, length: cut as u32, lkey: rx_mr.key },
        Sge { addr: base + cut as u64, length: (rx.len() - cut) as u32, lkey: rx_mr.key },
    ];
    b.e.post_recv(now, b.qpn, RecvWr { wr_id: 7, sg_list: sges.iter().copied().collect() }).unwrap();
    let mut wr = SendWr::new(1, WrOpcode::Send);
    wr.sg_list = uroce::sgl![Sge { addr: msg.as_ptr() as u64, length: msg.len() as u32, lkey: tx_mr.key }];
    let av =
        AddressVector { dgid: Gid::from_ip(b.ip), is_global: true, hop_limit: 64, port_num: 1, ..Default::default() };
    wr.ud = Some(UdDest { av, remote_qpn: b.qpn, remote_qkey: QKEY });
    a.e.post_send(now, a.qpn, wr).unwrap();
    let mut t = a.e.poll_transmit(now).expect("the UD packet");
    assert!(a.e.poll_transmit(now).is_none());
    t.set_ipv4_id(ipv4_id);
    b.e.handle_datagram(now, SocketAddr::new(a.ip, PORT), b.ip, &t.bytes());
    let mut wcs = [uroce::ib::Wc::new(0, WcStatus::Success, uroce::ib::WcOpcode::Recv, 0); 4];
    let n = b.cq.poll(&mut wcs).unwrap();
    assert_eq!(n, 1, "one receive completion; stats {:?}", b.e.stats());
    mem.deregister(tx_mr.key).unwrap();
    mem.deregister(rx_mr.key).unwrap();
    wcs[0]
}

fn ipv4_checksum_holds(h: &[u8]) -> bool {
    let sum = h.chunks(2).fold(0u32, |a, w| a + u16::from_be_bytes([w[0], w[1]]) as u32);
    let sum = (sum & 0xFFFF) + (sum >> 16);
    (sum & 0xFFFF) + (sum >> 16) == 0xFFFF
}

#[test]
fn ipv4_ud_receive_has_the_ip_header_in_the_last_20_bytes_and_sl_0xa() {
    let mem = Arc::new(Memory::new());
    let now = Instant::now();
    let (src, dst): (IpAddr, IpAddr) = ("10.0.0.1".parse().unwrap(), "10.0.0.2".parse().unwrap());
    let (mut a, mut b) = (ud_end(src, &mem, now), ud_end(dst, &mem, now));
    let msg: Vec<u8> = (0..100u8).collect();
    // The GRH area spans the two SGEs (cut inside the IPv4 header), and the
    // packet is segment 5 of a GSO send: IPv4 ID 5.
    for (cut, id) in [(40usize, 0u16), (27, 5)] {
        let mut rx = vec![FILL; 40 + 128];
        let wc = send_one(&mut a, &mut b, &msg, &mut rx, cut, id, now);
        assert_eq!((wc.status, wc.byte_len, wc.src_qp), (WcStatus::Success, 140, a.qpn));
        assert!(wc.wc_flags.contains(WcFlags::GRH));
        assert_eq!(wc.sl, 0xA, "mlx5: UDP header present (8) | IPv4 (2)");
        assert_eq!(wc.sl & 7, 2, "UCX 1.13 ud_verbs: IPv4");
        assert_eq!((wc.slid, wc.dlid_path_bits, wc.pkey_index), (0, 0, 0));
        assert_eq!(rx[..20], [FILL; 20], "mlx5 leaves the first 20 bytes alone");
        let h = &rx[20..40];
        // UDP length: 8 + BTH 12 + DETH 8 + 100 + ICRC 4 = 132; IP total 152.
        let want_id = id.to_be_bytes();
        assert_eq!(h[..10], [0x45, 0, 0, 152, want_id[0], want_id[1], 0x40, 0, 64, 17], "cut {cut}");
        assert_eq!(h[12..20], [10, 0, 0, 1, 10, 0, 0, 2]);
        assert!(ipv4_checksum_holds(h), "{h:?}");
        assert_eq!(rx[40..140], msg[..]);
        assert_eq!(rx[140..], [FILL; 28]);
    }
    assert_eq!(b.e.stats().rx_icrc_gso_id, 1);
}

/// A sender whose IPv4 IDs are hashed (Linux rxe: its ICRC covers an ID
/// that counts up from a hash, which a UDP receiver cannot see) is learned
/// from its first packet with no setting (issue 26): each packet arrives,
/// and the GRH area shows the ID the ICRC was solved for.
#[test]
fn a_sender_with_hashed_ipv4_ids_is_learned_with_no_setting() {
    let mem = Arc::new(Memory::new());
    let now = Instant::now();
    let (src, dst): (IpAddr, IpAddr) = ("10.0.0.1".parse().unwrap(), "10.0.0.2".parse().unwrap());
    let (mut a, mut b) = (ud_end(src, &mem, now), ud_end(dst, &mem, now));
    assert!(!b.e.config().ipv4_any_id);
    let msg: Vec<u8> = (0..64u8).collect();
    // Counting up, a jump (other traffic shared the counter), and an ID
    // that is also a uroce sender's.
    let ids = [0xBE10u16, 0xBE11, 0xBE12, 0xC3A7, 0xC3A8, 0x0007];
    for &id in &ids {
        let mut rx = vec![FILL; 40 + 64];
        let wc = send_one(&mut a, &mut b, &msg, &mut rx, 40, id, now);
        assert_eq!((wc.status, wc.byte_len), (WcStatus::Success, 104), "ID {id:#x}");
        assert_eq!(rx[24..26], id.to_be_bytes(), "the solved ID in the IPv4 header");
        assert_eq!(rx[40..], msg[..]);
    }
    let st = b.e.stats();
    assert_eq!(st.rx_icrc_peers_learned, 1, "{st:?}");
    assert_eq!(st.rx_icrc_solved_id, ids.len() as u64, "{st:?}");
    assert_eq!((st.rx_drop_icrc, st.rx_icrc_solved_refused), (0, 0));
}

#[test]
fn ipv6_ud_receive_has_the_ipv6_header_and_sl_0x9() {
    let mem = Arc::new(Memory::new());
    let now = Instant::now();
    let (src, dst): (IpAddr, IpAddr) = ("fd75::1".parse().unwrap(), "fd75::2".parse().unwrap());
    let (mut a, mut b) = (ud_end(src, &mem, now), ud_end(dst, &mem, now));
    let msg: Vec<u8> = (0..100u8).rev().collect();
    let mut rx = vec![FILL; 40 + 100];
    let wc = send_one(&mut a, &mut b, &msg, &mut rx, 13, 0, now);
    assert_eq!((wc.status, wc.byte_len, wc.src_qp), (WcStatus::Success, 140, a.qpn));
    assert!(wc.wc_flags.contains(WcFlags::GRH));
    assert_eq!(wc.sl, 0x9, "mlx5: UDP header present (8) | IPv6 (1)");
    assert_eq!(rx[..8], [0x60, 0, 0, 0, 0, 132, 17, 64]);
    let (s6, d6) = (
        src.to_string().parse::<std::net::Ipv6Addr>().unwrap(),
        dst.to_string().parse::<std::net::Ipv6Addr>().unwrap(),
    );
    assert_eq!(rx[8..24], s6.octets());
    assert_eq!(rx[24..40], d6.octets());
    assert_eq!(rx[40..], msg[..]);
}

/// The same through the device runtime and its socket, on IPv4 loopback.
#[test]
fn ud_grh_over_loopback_sockets() {
    use uroce::verbs::{QpAttr, QpInitAttr, RecvWr};
    let (ca, cb) = common::pair_with(None);
    let (pa, pb) = (ca.alloc_pd().unwrap(), cb.alloc_pd().unwrap());
    let (qa_cq, qb_cq) = (ca.create_cq(16, None).unwrap(), cb.create_cq(16, None).unwrap());
    let qa = pa.create_qp(&QpInitAttr::ud(&qa_cq, &qa_cq)).unwrap();
    let qb = pb.create_qp(&QpInitAttr::ud(&qb_cq, &qb_cq)).unwrap();
    for q in [&qa, &qb] {
        let mut a = QpAttr { qp_state: QpState::Init, port_num: 1, qkey: QKEY, ..QpAttr::default() };
        q.modify(&a, M::STATE | M::PKEY_INDEX | M::PORT | M::QKEY).unwrap();
        a.qp_state = QpState::Rtr;
        q.modify(&a, M::STATE).unwrap();
        a.qp_state = QpState::Rts;
        q.modify(&a, M::STATE | M::SQ_PSN).unwrap();
    }
    let rx = pb.register(vec![FILL; 40 + 64], Access::LOCAL_WRITE).unwrap();
    qb.post_recv(&RecvWr { wr_id: 1, sg_list: uroce::sgl![rx.sge(0, 104)] }).unwrap();
    let tx = pa.register(b"GRH as mlx5 fills it".to_vec(), Access::empty()).unwrap();
    let ah = pa
        .create_ah(AddressVector {
            dgid: cb.query_gid(0).unwrap(),
            is_global: true,
            hop_limit: 64,
            port_num: 1,
            ..Default::default()
        })
        .unwrap();
    let mut s = common::wr(9, WrOpcode::Send, tx.sge(0, 20));
    s.ud = Some(UdDest { av: ah.av, remote_qpn: qb.qp_num(), remote_qkey: QKEY });
    qa.post_send(&s).unwrap();
    let wc = qb_cq.wait(1, common::T).unwrap()[0];
    assert_eq!((wc.status, wc.byte_len, wc.sl), (WcStatus::Success, 60, 0xA));
    assert!(wc.wc_flags.contains(WcFlags::GRH));
    let got = rx.to_vec();
    assert_eq!(got[..20], [FILL; 20]);
    let (IpAddr::V4(sa), IpAddr::V4(da)) = (ca.local_addr().ip(), cb.local_addr().ip()) else { panic!("IPv4") };
    assert_eq!(got[20..30], [0x45, 0, 0, 72, 0, 0, 0x40, 0, 64, 17]);
    assert_eq!(got[32..36], sa.octets());
    assert_eq!(got[36..40], da.octets(), "UCX compares these 4 bytes with its own GID");
    assert!(ipv4_checksum_holds(&got[20..40]));
    assert_eq!(&got[40..60], b"GRH as mlx5 fills it");
}
