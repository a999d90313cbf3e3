//! Helpers shared by the socket tests: device pairs on loopback, connected
//! RC endpoints, work request builders.
#![allow(dead_code)]

use std::net::{IpAddr, Ipv4Addr};
use std::sync::atomic::{AtomicU16, Ordering};
use std::time::Duration;
use uroce::verbs::*;

pub const T: Duration = Duration::from_secs(10);

/// Two devices on 127.0.0.1/127.0.0.2 sharing a port no other test uses.
pub fn pair_with(capture: Option<std::path::PathBuf>) -> (Context, Context) {
    static NEXT: AtomicU16 = AtomicU16::new(0);
    for _ in 0..50 {
        let port = 20000 + (std::process::id() as u16 % 1000) * 16 + NEXT.fetch_add(1, Ordering::Relaxed) % 16;
        let mut a = DeviceConfig::at(&format!("lo-a-{port}"), IpAddr::V4(Ipv4Addr::new(127, 0, 0, 1)), port);
        let b = DeviceConfig::at(&format!("lo-b-{port}"), IpAddr::V4(Ipv4Addr::new(127, 0, 0, 2)), port);
        a.capture = capture.clone();
        if let (Ok(a), Ok(b)) = (Context::open(&a), Context::open(&b)) {
            return (a, b);
        }
    }
    panic!("no free port pair");
}

pub struct End {
    pub ctx: Context,
    pub pd: ProtectionDomain,
    pub cq: CompletionQueue,
    pub qp: QueuePair,
}

pub fn end(ctx: Context) -> End {
    let pd = ctx.alloc_pd().unwrap();
    let cq = ctx.create_cq(1024, None).unwrap();
    let qp = pd.create_qp(&QpInitAttr::rc(&cq, &cq)).unwrap();
    End { ctx, pd, cq, qp }
}

pub fn connected(capture: Option<std::path::PathBuf>) -> (End, End) {
    let (a, b) = pair_with(capture);
    let (a, b) = (end(a), end(b));
    a.qp.connect_rc(&b.ctx.query_gid(0).unwrap(), b.qp.qp_num(), 100, 200).unwrap();
    b.qp.connect_rc(&a.ctx.query_gid(0).unwrap(), a.qp.qp_num(), 200, 100).unwrap();
    (a, b)
}

pub fn wr(id: u64, op: WrOpcode, sge: Sge) -> SendWr {
    let mut w = SendWr::new(id, op);
    w.sg_list = uroce::sgl![sge];
    w
}

/// The next asynchronous event of `ctx`, waiting at most 5 s (events are
/// delivered just after the completions that caused them).
pub fn next_async_event(ctx: &Context) -> Option<AsyncEvent> {
    let t = std::time::Instant::now();
    while t.elapsed() < Duration::from_secs(5) {
        if let Some(e) = ctx.try_async_event() {
            return Some(e);
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    None
}

/// Waits until `f` holds; panics with `what` after 60 s, which only a hang
/// takes, however busy the machine.
pub fn wait_until(what: &str, mut f: impl FnMut() -> bool) {
    let t = std::time::Instant::now();
    while !f() {
        assert!(t.elapsed() < Duration::from_secs(60), "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(1));
    }
}
