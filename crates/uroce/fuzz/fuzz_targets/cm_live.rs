//! The CM, stateful: two agents connect (REQ/REP/RTU), then a third
//! address sends arbitrary MADs against the live connection, interleaved
//! with time steps. Each MAD's comm ID fields are taken from the input or
//! set to one of the connection's four IDs. Nothing panics, and neither side
//! reports anything (REJECTED, DISCONNECTED, ...) unless a MAD carried both
//! of that side's comm IDs (`k/cm.c` matching; docs/reliability.md,
//! "Hostile peers"). Afterwards the connection still disconnects cleanly.
#![no_main]

use libfuzzer_sys::fuzz_target;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::time::{Duration, Instant};
use uroce::cm::mad::{CmMad, CmMsg, TransportType};
use uroce::cm::*;

fn deliver(a: &mut Cm, b: &mut Cm, ia: IpAddr, ib: IpAddr, now: Instant) {
    for _ in 0..100 {
        let (x, y) = (a.poll_transmit(), b.poll_transmit());
        if x.is_none() && y.is_none() {
            return;
        }
        if let Some(o) = x {
            b.handle_mad(now, ia, &o.mad);
        }
        if let Some(o) = y {
            a.handle_mad(now, ib, &o.mad);
        }
    }
}

/// Drops what an agent sends to the attacker, keeps the rest queued.
fn drop_to(cm: &mut Cm, attacker: IpAddr) -> Vec<[u8; 256]> {
    std::iter::from_fn(|| cm.poll_transmit()).filter(|o| o.dst != attacker).map(|o| o.mad).collect()
}

fuzz_target!(|data: &[u8]| {
    let (ia, ib) = (IpAddr::V4(Ipv4Addr::new(10, 0, 0, 1)), IpAddr::V4(Ipv4Addr::new(10, 0, 0, 2)));
    let ic = IpAddr::V4(Ipv4Addr::new(10, 0, 0, 3));
    let mut now = Instant::now();
    let mut a = Cm::new(CmConfig::new(ia, 1, 1));
    let mut b = Cm::new(CmConfig::new(ib, 2, 2));
    b.listen(ListenParams { ps: PortSpace::Tcp, addr: None, port: 1, backlog: 4, xrc: false }).unwrap();
    let p = ConnectParams {
        ps: PortSpace::Tcp,
        src_port: 2,
        dst: SocketAddr::new(ib, 1),
        qpn: 0x11,
        transport: TransportType::Rc,
        responder_resources: 1,
        initiator_depth: 1,
        flow_control: false,
        retry_count: 7,
        rnr_retry_count: 7,
        srq: false,
        traffic_class: 0,
        private_data: Vec::new(),
    };
    let ida = a.connect(now, p).unwrap();
    deliver(&mut a, &mut b, ia, ib, now);
    let idb = b.poll_event().unwrap().id;
    b.accept(now, idb, AcceptParams { qpn: 0x22, ..Default::default() }).unwrap();
    deliver(&mut a, &mut b, ia, ib, now);
    a.poll_event().unwrap();
    a.establish(now, ida).unwrap();
    deliver(&mut a, &mut b, ia, ib, now);
    b.poll_event().unwrap();
    assert!(a.poll_event().is_none() && b.poll_event().is_none());
    let known = [ida.0, idb.0, 0, u32::MAX];

    for chunk in data.chunks(256) {
        let (op, rest) = chunk.split_first().unwrap_or((&0, &[]));
        if op % 16 == 15 {
            // Time passes (less than the CM's timeouts: the connection has
            // no timer while established).
            now += Duration::from_millis(u64::from(*op) * 13);
            a.handle_timeout(now);
            b.handle_timeout(now);
            continue;
        }
        let mut mad = [0u8; 256];
        mad[..4].copy_from_slice(&[1, 7, 2, 3]);
        let n = rest.len().min(252);
        mad[4..4 + n].copy_from_slice(&rest[..n]);
        // Attribute IDs 0x10..=0x1A (REQ .. APR) mostly.
        if op & 0x10 == 0 {
            mad[16..18].copy_from_slice(&u16::from(0x10 + op % 11).to_be_bytes());
        }
        let pick = (op >> 5) & 7;
        if pick & 1 == 1 {
            mad[24..28].copy_from_slice(&known[(pick >> 1) as usize % 4].to_be_bytes());
        }
        if pick & 2 == 2 {
            mad[28..32].copy_from_slice(&known[(pick >> 2) as usize % 4].to_be_bytes());
        }
        let local = u32::from_be_bytes(mad[24..28].try_into().unwrap());
        let remote = u32::from_be_bytes(mad[28..32].try_into().unwrap());
        let to_b = op & 0x80 != 0;
        // Both of the receiving side's IDs: the peer's own message, allowed.
        let both = if to_b { remote == idb.0 && local == ida.0 } else { remote == ida.0 && local == idb.0 };
        // A REQ naming the other side's CA GUID and QPN is the standard's
        // stale-connection rule (rejected, and the live connection is
        // disconnected: docs/reliability.md, "Hostile peers").
        let (guid, qpn) = if to_b { (1, 0x11) } else { (2, 0x22) };
        let stale = matches!(CmMad::parse(&mad), Ok(CmMad { msg: CmMsg::Req(ref r), .. })
            if r.local_ca_guid == guid && r.local_qpn == qpn);
        if stale {
            return;
        }
        let (cm, other) = if to_b { (&mut b, &mut a) } else { (&mut a, &mut b) };
        cm.handle_mad(now, ic, &mad);
        let out = drop_to(cm, ic);
        if both {
            return; // the connection may change now; nothing more to check
        }
        if let Some(e) = cm.poll_event() {
            panic!("a MAD without both comm IDs changed the connection: {e:?}");
        }
        // What it sent to the peer (an MRA, a repeated RTU) changes nothing there.
        let peer_ip = if to_b { ib } else { ia };
        for m in out {
            let _ = CmMad::parse(&m).expect("the agent sends valid MADs");
            other.handle_mad(now, peer_ip, &m);
        }
        let _ = drop_to(other, ic);
        if let Some(e) = other.poll_event() {
            panic!("an answer to an attacker's MAD changed the peer: {e:?}");
        }
    }
    a.disconnect(now, ida).unwrap();
    deliver(&mut a, &mut b, ia, ib, now);
    assert_eq!(b.poll_event().map(|e| e.kind), Some(EventKind::Disconnected));
});
