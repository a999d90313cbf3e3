//! The CM: arbitrary bytes as MADs (the parser, then the agent of a
//! listening device and of a connecting one), interleaved with user calls
//! and time steps taken from the input. Nothing panics, and every MAD the
//! agents send parses and re-emits to itself.
#![no_main]

use libfuzzer_sys::fuzz_target;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::time::{Duration, Instant};
use uroce::cm::mad::{CmMad, TransportType};
use uroce::cm::*;

fuzz_target!(|data: &[u8]| {
    let _ = CmMad::parse(data);
    let (ia, ib) = (IpAddr::V4(Ipv4Addr::new(10, 0, 0, 1)), IpAddr::V4(Ipv4Addr::new(10, 0, 0, 2)));
    let mut a = Cm::new(CmConfig::new(ia, 1, 1));
    let mut b = Cm::new(CmConfig::new(ib, 2, 2));
    let _ = b.listen(ListenParams { ps: PortSpace::Tcp, addr: None, port: 1, backlog: 4, xrc: false });
    let _ = b.listen(ListenParams { ps: PortSpace::Udp, addr: None, port: 1, backlog: 4, xrc: false });
    let mut now = Instant::now();
    let mut ids = Vec::new();
    for chunk in data.chunks(257) {
        let (op, rest) = chunk.split_first().unwrap_or((&0, &[]));
        let mut mad = [0u8; 256];
        mad[..4].copy_from_slice(&[1, 7, 2, 3]);
        let n = rest.len().min(252);
        mad[4..4 + n].copy_from_slice(&rest[..n]);
        match op % 8 {
            0 => b.handle_mad(now, ia, &mad),
            1 => a.handle_mad(now, ib, &mad),
            2 => {
                let p = ConnectParams {
                    ps: PortSpace::Tcp,
                    src_port: 2,
                    dst: SocketAddr::new(ib, 1),
                    qpn: 0x11 + (*op as u32),
                    transport: TransportType::Rc,
                    responder_resources: 1,
                    initiator_depth: 1,
                    flow_control: false,
                    retry_count: 7,
                    rnr_retry_count: 7,
                    srq: false,
                    traffic_class: 0,
                    private_data: rest.get(..rest.len().min(60)).unwrap_or(&[]).to_vec(),
                };
                ids.extend(a.connect(now, p).ok());
            }
            3 => now += Duration::from_millis(u64::from(*op) * 97),
            4 => {
                if let Some(e) = b.poll_event() {
                    let ap = AcceptParams { qpn: 0x22, ..Default::default() };
                    let _ = match op % 3 {
                        0 => b.accept(now, e.id, ap),
                        1 => b.reject(now, e.id, 28, rest),
                        _ => b.destroy(now, e.id),
                    };
                }
            }
            5 => {
                if let Some(&id) = ids.get(usize::from(*op) % ids.len().max(1)) {
                    let _ = match op % 4 {
                        0 => a.establish(now, id),
                        1 => a.disconnect(now, id),
                        2 => a.destroy(now, id),
                        _ => b.disconnect(now, id),
                    };
                }
            }
            _ => {}
        }
        a.handle_timeout(now);
        b.handle_timeout(now);
        // Deliver what each sends to the other; everything sent is a valid MAD.
        let mut hops = 0;
        loop {
            let (x, y) = (a.poll_transmit(), b.poll_transmit());
            if (x.is_none() && y.is_none()) || hops > 1000 {
                break;
            }
            hops += 1;
            if let Some(o) = x {
                let m = CmMad::parse(&o.mad).expect("the agent sends valid MADs");
                assert_eq!(m.to_bytes(), o.mad);
                b.handle_mad(now, ia, &o.mad);
            }
            if let Some(o) = y {
                let m = CmMad::parse(&o.mad).expect("the agent sends valid MADs");
                assert_eq!(m.to_bytes(), o.mad);
                a.handle_mad(now, ib, &o.mad);
            }
        }
        while a.poll_event().is_some() {}
    }
});
