//! QP 1 against a flood (docs/reliability.md, "Hostile peers"): 200 000 CM
//! REQs sent from a third loopback address as fast as one core sends them,
//! each a valid packet (the project's own `wire` and `cm::mad` builders).
//! The flood overran QP 1's completion queue and moved QP 1 to ERR for good;
//! now the agent polls while it answers, drops what does not fit, answers
//! unknown peers at a bounded rate, and afterwards a legitimate client
//! connects, with the process's RSS bounded.

mod common;

use common::*;
use std::net::{IpAddr, SocketAddr, UdpSocket};
use std::time::{Duration, Instant};
use uroce::cm::gsi::mad_headers;
use uroce::cm::mad::Req;
use uroce::cm::{CmEndpoint, CmMad, CmMsg, ConnOptions};
use uroce::verbs::*;
use uroce::wire::{build_packet, packet_len, IpInfo};

const PORT: u16 = 7174;
const FLOOD: usize = 200_000;

fn rss_kib() -> u64 {
    let s = std::fs::read_to_string("/proc/self/status").unwrap();
    s.lines().find_map(|l| l.strip_prefix("VmRSS:")).and_then(|v| v.trim().split(' ').next()?.parse().ok()).unwrap()
}

/// `n` distinct REQs from `src` to `dst` (its UDP port `port`), as packets.
fn reqs(n: u32, src: IpAddr, dst: IpAddr, port: u16) -> Vec<Vec<u8>> {
    (0..n)
        .map(|i| {
            let req = Req {
                local_comm_id: 0x1000 + i,
                service_id: 0x0106_0000 | u64::from(PORT),
                local_ca_guid: 0xbad0_0000_0000_0000 | u64::from(i),
                local_qpn: 0x100 + i,
                starting_psn: i,
                responder_resources: 1,
                initiator_depth: 1,
                remote_cm_response_timeout: 20,
                local_cm_response_timeout: 20,
                retry_count: 7,
                rnr_retry_count: 7,
                max_cm_retries: 15,
                pkey: 0xFFFF,
                path_mtu: 3,
                ..Req::default()
            };
            let mad = CmMad::new(u64::from(i), CmMsg::Req(Box::new(req))).to_bytes();
            let h = mad_headers(i);
            let ip = IpInfo { src, dst, sport: port, dport: port, ipv4_id: 0 };
            let mut buf = vec![0u8; packet_len(h.header_len(), mad.len())];
            let len = build_packet(&h, &mad, &ip, &mut buf).unwrap();
            buf.truncate(len);
            buf
        })
        .collect()
}

#[test]
fn qp1_survives_a_req_flood_and_serves_a_client_after() {
    let (ca, cb) = pair_with(None);
    let (ea, eb) = (CmEndpoint::open(&ca).unwrap(), CmEndpoint::open(&cb).unwrap());
    let dst = cb.local_addr();
    let attacker: IpAddr = "127.0.0.3".parse().unwrap();
    let sock = UdpSocket::bind(SocketAddr::new(attacker, dst.port())).unwrap();
    let packets = reqs(1024, attacker, dst.ip(), dst.port());
    // A listener on the port: the REQs name it, so each would get a REJ
    // (no CM header) or a record; both are what a flood costs.
    let listen = eb.listen(PORT, 16).unwrap();
    let rss_before = rss_kib();
    let start = Instant::now();
    let mut sent = 0;
    while sent < FLOOD && start.elapsed() < Duration::from_secs(120) {
        // A full socket buffer (ENOBUFS/EAGAIN) is the flood's own limit.
        if sock.send_to(&packets[sent % packets.len()], dst).is_ok() {
            sent += 1;
        }
    }
    let rate = sent as f64 / start.elapsed().as_secs_f64();
    // The agent has read everything it will: its received count settles.
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut last = eb.stats().received;
    loop {
        std::thread::sleep(Duration::from_millis(200));
        let now = eb.stats().received;
        if now == last || Instant::now() > deadline {
            break;
        }
        last = now;
    }
    let rss_after = rss_kib();
    let st = eb.stats();
    println!(
        "flood: {sent} REQs at {rate:.0}/s; agent received {}, answers suppressed {}, sends dropped {}, \
         QP 1 restarts {}; RSS {rss_before} -> {rss_after} KiB",
        st.received, st.answers_suppressed, st.send_drops, st.qp1_restarts
    );
    assert_eq!(sent, FLOOD, "the flood was sent");
    // Loopback drops what the device's socket buffer cannot hold; most
    // still reaches the agent.
    assert!(st.received > 20_000, "the agent saw the flood: {}", st.received);
    assert_eq!(st.qp1_restarts, 0, "QP 1 never left RTS");
    assert!(st.rej_sent < 5_000, "REJs to the flooder are rate-limited: {}", st.rej_sent);
    assert!(rss_after < rss_before + 64 * 1024, "RSS {rss_before} -> {rss_after} KiB");

    // A legitimate client connects.
    let (a, b) = (end(ca), end(cb));
    CmEndpoint::init_qp(&b.qp).unwrap();
    let server = std::thread::scope(|s| {
        let server = s.spawn(|| {
            let req = eb.get_request(listen, 4 * T).unwrap();
            eb.accept(req, &b.qp, &ConnOptions::default(), T).unwrap()
        });
        let conn = ea.connect(&a.qp, SocketAddr::new(dst.ip(), PORT), &ConnOptions::default(), 4 * T).unwrap();
        assert_eq!(a.qp.state(), QpState::Rts);
        (conn, server.join().unwrap())
    });
    assert_eq!(server.1.info.remote_qpn, a.qp.qp_num());
}
