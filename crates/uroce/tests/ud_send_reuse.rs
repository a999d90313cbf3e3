//! A UD send whose payload leaves in place (straight from the registered
//! buffer, read by the kernel in `sendmmsg`) completes only after the
//! kernel has the bytes (issue 17). Before, the completion came while the
//! packet was still on its way to `sendmmsg`: an application that polls on
//! another thread and refills the buffer at once sent the new bytes under
//! the old ICRC, and the receiver dropped them as bad ICRCs.
//!
//! One thread posts 4 KiB UD sends, another polls their completions and
//! overwrites the buffer with the next message the moment one arrives; every
//! message the receiver gets must be intact, and no packet may be dropped
//! for a bad ICRC. UD may lose packets (a full ring or socket buffer on a
//! busy machine): a lost message is counted, never waited for.

mod common;

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use uroce::verbs::*;

const QKEY: u32 = 0x1111_1111;
const SIZE: usize = 4096;
const MESSAGES: u64 = 3000;
const RECVS: u64 = 1024;

/// Message `i`: its number, then a byte that depends on it.
fn message(i: u64) -> Vec<u8> {
    let mut m = vec![(i % 251) as u8; SIZE];
    m[..8].copy_from_slice(&i.to_le_bytes());
    m
}

fn ud_qp(pd: &ProtectionDomain, cq: &CompletionQueue) -> QueuePair {
    let mut init = QpInitAttr::ud(cq, cq);
    init.cap.max_recv_wr = RECVS as u32;
    init.cap.max_send_wr = 16;
    let q = pd.create_qp(&init).unwrap();
    let mut a = QpAttr { qp_state: QpState::Init, port_num: 1, qkey: QKEY, ..QpAttr::default() };
    q.modify(&a, QpAttrMask::STATE | QpAttrMask::PKEY_INDEX | QpAttrMask::PORT | QpAttrMask::QKEY).unwrap();
    a.qp_state = QpState::Rtr;
    q.modify(&a, QpAttrMask::STATE).unwrap();
    a.qp_state = QpState::Rts;
    q.modify(&a, QpAttrMask::STATE | QpAttrMask::SQ_PSN).unwrap();
    q
}

#[test]
fn a_buffer_reused_at_its_ud_send_completion_changes_no_packet() {
    let (ca, cb) = common::pair_with(None);
    assert!(ca.query_port(1).unwrap().active_mtu.bytes() as usize >= SIZE, "loopback MTU");
    let (pa, pb) = (ca.alloc_pd().unwrap(), cb.alloc_pd().unwrap());
    let (qa_cq, qb_cq) = (ca.create_cq(64, None).unwrap(), cb.create_cq(RECVS as u32 * 2, None).unwrap());
    let (qa, qb) = (ud_qp(&pa, &qa_cq), ud_qp(&pb, &qb_cq));
    let rx = pb.register(vec![0u8; RECVS as usize * (40 + SIZE)], Access::LOCAL_WRITE).unwrap();
    let slot = |k: u64| rx.sge(k as usize * (40 + SIZE), (40 + SIZE) as u32);
    for k in 0..RECVS {
        qb.post_recv(&RecvWr { wr_id: k, sg_list: uroce::sgl![slot(k)] }).unwrap();
    }
    let tx = Arc::new(pa.register(message(0), Access::empty()).unwrap());
    let ah = pa
        .create_ah(AddressVector {
            dgid: cb.query_gid(0).unwrap(),
            is_global: true,
            hop_limit: 64,
            port_num: 1,
            ..Default::default()
        })
        .unwrap();
    let dest = UdDest { av: ah.av, remote_qpn: qb.qp_num(), remote_qkey: QKEY };

    // The message the buffer holds (set by the completion thread); set by
    // the receiver once it has seen the last message (or one after it).
    let ready = Arc::new(AtomicU64::new(0));
    let done = AtomicBool::new(false);
    let stop = AtomicBool::new(false);
    let deadline = Instant::now() + Duration::from_secs(120);
    std::thread::scope(|s| {
        // Whatever ends this scope, a panic included, stops both threads
        // (else the scope would wait for them forever).
        let _stop = SetOnDrop(&stop);
        // Posts message i once the buffer holds it, past the last one until
        // the receiver has seen one of them (the last may be lost).
        s.spawn(|| {
            for i in 0..2 * MESSAGES {
                while ready.load(Ordering::Acquire) < i && !stop.load(Ordering::Relaxed) {
                    // (Not a bare spin: on two cores the receiver and the
                    // progress threads need the CPU too.)
                    std::thread::yield_now();
                }
                if stop.load(Ordering::Relaxed) || done.load(Ordering::Relaxed) {
                    return;
                }
                let mut w = common::wr(i, WrOpcode::Send, tx.sge(0, SIZE as u32));
                w.ud = Some(dest);
                qa.post_send(&w).unwrap();
            }
        });
        // On the completion of message i, refills the buffer with i + 1 at
        // once: the application owns the buffer again.
        s.spawn(|| {
            let _stop = SetOnDrop(&stop);
            let mut next = 0;
            while !stop.load(Ordering::Relaxed) {
                let Some(wc) = qa_cq.poll_one() else { continue };
                assert_eq!((wc.status, wc.wr_id), (WcStatus::Success, next));
                next += 1;
                tx.write_at(0, &message(next)).unwrap();
                ready.store(next, Ordering::Release);
            }
        });
        // The receiver: every message it gets intact and in order (loopback
        // keeps it), none dropped for a bad ICRC.
        let (mut last, mut received) = (None, 0u64);
        while Instant::now() < deadline && cb.stats().rx_drop_icrc == 0 && !stop.load(Ordering::Relaxed) {
            let Some(wc) = qb_cq.poll_one() else {
                std::thread::sleep(Duration::from_micros(20));
                continue;
            };
            assert_eq!((wc.status, wc.byte_len), (WcStatus::Success, (40 + SIZE) as u32));
            let mut got = vec![0u8; SIZE];
            rx.read_at(wc.wr_id as usize * (40 + SIZE) + 40, &mut got).unwrap();
            let i = u64::from_le_bytes(got[..8].try_into().unwrap());
            assert!(
                last.is_none_or(|l| i > l),
                "message {i} after {last:?}: in order: {:?} {:?}",
                ca.link_stats(),
                cb.link_stats()
            );
            assert!(got == message(i), "message {i}'s bytes are the ones it was sent with");
            (last, received) = (Some(i), received + 1);
            qb.post_recv(&RecvWr { wr_id: wc.wr_id, sg_list: uroce::sgl![slot(wc.wr_id)] }).unwrap();
            if i + 1 >= MESSAGES {
                done.store(true, Ordering::Relaxed);
                break;
            }
        }
        let st = cb.stats();
        assert_eq!(st.rx_drop_icrc, 0, "packets sent with bytes changed after their ICRC: {st:?}");
        assert!(done.load(Ordering::Relaxed), "the last message (or one after it) arrived in time: {st:?}");
        // Enough arrived for the check to mean something (a receiver slower
        // than the sender loses UD packets: the link's ring or the socket
        // buffer overflows, counted as ring_full_drops or by the kernel).
        assert!(received >= MESSAGES / 10, "{received} of {MESSAGES} messages arrived: {st:?}");
        eprintln!(
            "{received} of {MESSAGES} messages arrived intact ({} lost): {st:?} {:?}",
            MESSAGES - received.min(MESSAGES),
            ca.link_stats()
        );
    });
}

/// Sets its flag when dropped.
struct SetOnDrop<'a>(&'a AtomicBool);

impl Drop for SetOnDrop<'_> {
    fn drop(&mut self) {
        self.0.store(true, Ordering::Relaxed);
    }
}

/// The same in the sans-IO engine: a UD send sent in place completes at
/// `Engine::sent`, not when its packet is built, and a copied send posted
/// after it completes after it; a copied send alone completes at once.
#[test]
fn in_place_ud_completions_wait_for_sent_and_keep_their_order() {
    use std::net::IpAddr;
    use uroce::ib::{Gid, Mtu, QpAttrMask as M, QpType, Sge, WcOpcode};
    use uroce::mem::Memory;
    use uroce::proto::cq::CompletionQueue as Ring;
    use uroce::proto::qp::{required_attributes, QpInit};
    use uroce::proto::{Engine, EngineConfig};

    let mem = Memory::new();
    let now = Instant::now();
    let ip: IpAddr = "10.0.0.1".parse().unwrap();
    let mut cfg = EngineConfig::new(ip, 4791, Mtu::Mtu4096);
    cfg.send_in_place = true;
    let mut e = Engine::new(cfg, mem.clone());
    let cq = Arc::new(Ring::new(1, 64));
    let cap = QpCap { max_send_wr: 16, max_recv_wr: 1, max_send_sge: 1, max_recv_sge: 1, max_inline_data: 0 };
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
    let buf = message(7);
    let addr = buf.as_ptr() as usize;
    // SAFETY: `buf` outlives the registration (deregistered at the end).
    let mr = unsafe { mem.register(1, addr, SIZE as u64, addr as u64, uroce::ib::Access::empty(), None) }.unwrap();
    let av = AddressVector {
        dgid: Gid::from_ip("10.0.0.2".parse().unwrap()),
        is_global: true,
        port_num: 1,
        ..Default::default()
    };
    let send = |id: u64, len: u32| {
        let mut w = SendWr::new(id, WrOpcode::Send);
        w.sg_list = uroce::sgl![Sge { addr: addr as u64, length: len, lkey: mr.key }];
        w.ud = Some(UdDest { av, remote_qpn: 0x22, remote_qkey: QKEY });
        w
    };
    // A short (copied) send alone: complete when built.
    e.post_send(now, qpn, send(1, 64)).unwrap();
    let t = e.poll_transmit(now).unwrap();
    assert!(t.in_place.is_none() && t.after_send().is_none());
    assert_eq!(cq.poll_one().map(|w| w.wr_id), Some(1));
    // In place, then copied: neither completes before the first is sent.
    e.post_send(now, qpn, send(2, SIZE as u32)).unwrap();
    e.post_send(now, qpn, send(3, 64)).unwrap();
    let (t2, t3) = (e.poll_transmit(now).unwrap(), e.poll_transmit(now).unwrap());
    assert!(t2.in_place.is_some() && t3.in_place.is_none() && t3.after_send().is_none());
    assert!(cq.poll_one().is_none(), "no completion before the kernel has the bytes");
    e.sent(now, t2.after_send());
    let wcs: Vec<_> = std::iter::from_fn(|| cq.poll_one()).collect();
    assert_eq!(wcs.iter().map(|w| (w.wr_id, w.opcode)).collect::<Vec<_>>(), [(2, WcOpcode::Send), (3, WcOpcode::Send)]);
    drop((t, t2, t3));
    mem.deregister(mr.key).unwrap();
}
