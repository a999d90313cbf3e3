//! The agent against a third party that can send MADs from its own address
//! (`docs/reliability.md`, "Hostile peers"): it may learn IDs from a
//! connection of its own, but no MAD of its changes a live connection
//! unless it carries both comm IDs (`k/cm.c`: `cm_acquire_rejected_id`,
//! `cm_acquire_id`, `cm_acquire_mraed_id`).

use super::conn::State;
use super::mad::{attr, rej_reason, Bytes, CmMad, CmMsg, MsgRef, Rej};
use super::tests::*;
use super::*;
use crate::mem::KeyRng;
use std::net::SocketAddr;

const C_IP: &str = "10.0.0.3";
const C_GUID: u64 = 0x0200_00ff_fe0a_0003;

/// A MAD from the attacker at `C_IP` to `to`; its answers (to `C_IP`) are
/// dropped, anything else stays on the wire.
fn inject(n: &mut Net, to_b: bool, mad: &[u8; 256]) {
    let cm = if to_b { &mut n.b } else { &mut n.a };
    cm.handle_mad(n.now, ip(C_IP), mad);
    let mut rest = Vec::new();
    while let Some(o) = cm.poll_transmit() {
        if o.dst != ip(C_IP) {
            rest.push(o);
        }
    }
    for o in rest {
        n.wire.push((to_b == (o.dst == ip(A_IP)), o.mad));
    }
}

/// The attacker's own connection to B, accepted: B's comm ID for it.
fn own_connection(n: &mut Net) -> u32 {
    let l = n.listen();
    let mut c = Cm::new(CmConfig::new(ip(C_IP), C_GUID, 99));
    let mut p = connect_params(0x33, b"mine");
    p.dst = SocketAddr::new(ip(B_IP), PORT);
    let cid = c.connect(n.now, p).unwrap();
    let mut b_id = None;
    for _ in 0..10 {
        while let Some(o) = c.poll_transmit() {
            n.b.handle_mad(n.now, ip(C_IP), &o.mad);
        }
        for e in events(&mut n.b) {
            if e.kind == EventKind::ConnectRequest {
                n.b.accept(n.now, e.id, accept_params(0x44)).unwrap();
            }
        }
        while let Some(o) = n.b.poll_transmit() {
            assert_eq!(o.dst, ip(C_IP));
            let m = CmMad::parse(&o.mad).unwrap();
            if let CmMsg::Rep(r) = &m.msg {
                b_id = Some(r.local_comm_id);
            }
            c.handle_mad(n.now, ip(B_IP), &o.mad);
        }
        if events(&mut c).iter().any(|e| e.kind == EventKind::ConnectResponse) {
            c.establish(n.now, cid).unwrap();
        }
    }
    n.b.unlisten(n.now, l).unwrap();
    b_id.expect("B answered the attacker's REQ")
}

fn rej(remote_comm_id: u32, local_comm_id: u32, msg_rejected: MsgRef) -> [u8; 256] {
    let r = Rej {
        local_comm_id,
        remote_comm_id,
        msg_rejected,
        reject_info_len: 0,
        reason: rej_reason::CONSUMER_DEFINED,
        ari: Bytes::default(),
        private_data: Bytes::default(),
    };
    CmMad::new(0x1234, CmMsg::Rej(Box::new(r))).to_bytes()
}

fn still_established(n: &mut Net, a: ConnId, b: ConnId) {
    assert_eq!(n.a.state_of(a), Some(State::Established));
    assert_eq!(n.b.state_of(b), Some(State::Established));
    assert_eq!(kinds(&mut n.a), []);
    let left: Vec<_> = events(&mut n.b).into_iter().map(|e| e.kind).collect();
    assert_eq!(left, [], "B reported {left:?}");
}

/// The attacker's connection to B narrows B's next ID (the kernel's,
/// a cyclic index XOR one random value) to 32 candidates; REJs naming
/// each, "rejected message: REQ", tore down the victim's connection.
#[test]
fn thirty_two_rejs_from_a_third_address_change_nothing() {
    let mut n = Net::new();
    let learned = own_connection(&mut n);
    n.wire.clear();
    let (a, b) = connected(&mut n);
    for t in 0..32u32 {
        let mask = if t == 31 { u32::MAX } else { (1u32 << (t + 1)) - 1 };
        inject(&mut n, true, &rej(learned ^ mask, 0, MsgRef::Req));
    }
    // Even knowing the victim's IDs, a REJ of a REQ needs a record with no
    // remote ID yet; any other needs both IDs.
    inject(&mut n, true, &rej(b.0, 0, MsgRef::Req));
    inject(&mut n, true, &rej(b.0, 0x5EED, MsgRef::Rep));
    inject(&mut n, false, &rej(a.0, 0, MsgRef::Req));
    inject(&mut n, false, &rej(a.0, 0x5EED, MsgRef::Other));
    n.run();
    still_established(&mut n, a, b);
    // The same REJ with both IDs is the peer's (the kernel takes it too).
    inject(&mut n, true, &rej(b.0, a.0, MsgRef::Other));
    assert_eq!(n.b.state_of(b), Some(State::Timewait));
}

/// REJs of a REQ still reach a connection that has no remote ID yet (the
/// passive side's REJ to our REQ).
#[test]
fn a_rej_of_our_req_still_ends_a_pending_connect() {
    let mut n = Net::new();
    let a = n.connect();
    n.drop_all();
    n.a.handle_mad(n.now, ip(B_IP), &rej(a.0, 0x77, MsgRef::Req));
    assert_eq!(kinds(&mut n.a), [(EventKind::Rejected, rej_reason::CONSUMER_DEFINED as i32)]);
}

/// Consecutive comm IDs share no pattern a connection of one's own reveals.
#[test]
fn comm_ids_are_not_a_counter() {
    let mut n = Net::new();
    n.listen();
    let ids: Vec<u32> = (0..200).map(|i| n.a.connect(n.now, connect_params(0x100 + i, b"")).unwrap().0).collect();
    let near = ids.windows(2).filter(|w| (w[0] ^ w[1]).count_ones() <= 8 || w[0].abs_diff(w[1]) < 1 << 16);
    assert!(near.count() < 3, "{ids:x?}");
}

/// 10 000 MADs of every CM attribute with random bodies, each comm ID
/// field random or one of the four live IDs, from a third address: the
/// connection stays up and still disconnects cleanly.
#[test]
fn ten_thousand_random_mads_change_nothing_on_a_live_connection() {
    let mut n = Net::new();
    let (a, b) = connected(&mut n);
    let (a_remote, b_remote) = (b.0, a.0);
    let known = [a.0, b.0, 0, u32::MAX];
    let attrs = [
        attr::REQ,
        attr::MRA,
        attr::REJ,
        attr::REP,
        attr::RTU,
        attr::DREQ,
        attr::DREP,
        attr::LAP,
        attr::APR,
        0x17,
        0x18,
    ];
    let template = CmMad::new(0, CmMsg::Rtu(Box::default())).to_bytes();
    let mut rng = KeyRng::new(2026);
    for _ in 0..10_000 {
        let mut m = template;
        for i in (8..16).chain(24..256) {
            m[i] = rng.next_u8();
        }
        let id = attrs[(rng.next_u32() % attrs.len() as u32) as usize];
        m[16..18].copy_from_slice(&id.to_be_bytes());
        let pick = |rng: &mut KeyRng| match rng.next_u32() % 3 {
            0 => rng.next_u32(),
            _ => known[(rng.next_u32() % 4) as usize],
        };
        let (local, remote) = (pick(&mut rng), pick(&mut rng));
        // Both of a connection's IDs are the peer's own message: not this attack.
        if (remote == a.0 && local == a_remote) || (remote == b.0 && local == b_remote) {
            continue;
        }
        m[24..28].copy_from_slice(&local.to_be_bytes());
        m[28..32].copy_from_slice(&remote.to_be_bytes());
        let to_b = rng.next_u32() & 1 == 1;
        inject(&mut n, to_b, &m);
    }
    n.run();
    still_established(&mut n, a, b);
    n.a.disconnect(n.now, a).unwrap();
    n.run();
    assert_eq!(kinds(&mut n.b), [(EventKind::Disconnected, 0)]);
    n.b.disconnect(n.now, b).unwrap();
    n.run();
    assert_eq!(kinds(&mut n.a), [(EventKind::Disconnected, 0)]);
}
