//! Two uroce devices in one process connect an RC QP pair through the
//! connection manager (REQ/REP/RTU on QP 1, as rdma_cm does), exchange
//! `count` pings, and disconnect (DREQ/DREP).
//!
//! `cargo run --example cm_ping [count] [port]` (devices on 127.0.0.1 and
//! 127.0.0.2, UDP port `port`, default 24791).

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::time::{Duration, Instant};
use uroce::cm::{CmEndpoint, ConnOptions};
use uroce::ib::Error;
use uroce::verbs::*;

const T: Duration = Duration::from_secs(10);
const CM_PORT: u16 = 7174;

struct Side {
    ctx: Context,
    _pd: ProtectionDomain,
    cq: CompletionQueue,
    qp: QueuePair,
    buf: MemoryRegion,
}

fn side(last: u8, port: u16) -> Result<Side, Error> {
    let ctx =
        Context::open(&DeviceConfig::at(&format!("cm-ping-{last}"), IpAddr::V4(Ipv4Addr::new(127, 0, 0, last)), port))?;
    let pd = ctx.alloc_pd()?;
    let cq = ctx.create_cq(64, None)?;
    let qp = pd.create_qp(&QpInitAttr::rc(&cq, &cq))?;
    CmEndpoint::init_qp(&qp)?;
    let buf = pd.register(vec![0u8; 64], Access::LOCAL_WRITE)?;
    Ok(Side { ctx, _pd: pd, cq, qp, buf })
}

fn post_recv(s: &Side) -> Result<(), Error> {
    s.qp.post_recv(&RecvWr { wr_id: 1, sg_list: uroce::sgl![s.buf.sge(0, 64)] })
}

fn send(s: &Side) -> Result<(), Error> {
    let mut w = SendWr::new(2, WrOpcode::Send);
    w.sg_list = uroce::sgl![s.buf.sge(0, 64)];
    w.flags = SendFlags::SIGNALED;
    s.qp.post_send(&w)
}

fn main() -> Result<(), Error> {
    let mut args = std::env::args().skip(1);
    let count: u32 = args.next().and_then(|a| a.parse().ok()).unwrap_or(1000);
    let port: u16 = args.next().and_then(|a| a.parse().ok()).unwrap_or(24791);
    let (a, b) = (side(1, port)?, side(2, port)?);
    let (cma, cmb) = (CmEndpoint::open(&a.ctx)?, CmEndpoint::open(&b.ctx)?);
    let listen = cmb.listen(CM_PORT, 8)?;
    let dst = SocketAddr::new(b.ctx.local_addr().ip(), CM_PORT);
    let t0 = Instant::now();
    let (ca, cb) = std::thread::scope(|s| {
        let server = s.spawn(|| {
            let req = cmb.get_request(listen, T)?;
            cmb.accept(req, &b.qp, &ConnOptions::default(), T)
        });
        let ca = cma.connect(&a.qp, dst, &ConnOptions::default(), T);
        let cb = server.join().unwrap_or_else(|_| Err(Error::inval("server thread panicked")));
        Ok::<_, Error>((ca?, cb?))
    })?;
    println!(
        "connected in {:?}: local QP {:#x} <-> remote QP {:#x}, PSNs {:#x}/{:#x}",
        t0.elapsed(),
        ca.info.local_qpn,
        ca.info.remote_qpn,
        ca.info.local_psn,
        ca.info.remote_psn
    );
    let t1 = Instant::now();
    for _ in 0..count {
        post_recv(&b)?;
        post_recv(&a)?;
        send(&a)?;
        b.cq.wait(1, T)?;
        send(&b)?;
        a.cq.wait(2, T)?;
        b.cq.wait(1, T)?;
    }
    let rtt = t1.elapsed() / count.max(1);
    println!("{count} ping-pongs, {rtt:?} per round trip");
    cma.disconnect(&ca, &a.qp)?;
    cmb.wait_disconnected(&cb, T)?;
    cmb.disconnect(&cb, &b.qp)?;
    cma.wait_disconnected(&ca, T)?;
    // Dropping the connections ends their CM ids.
    drop((ca, cb));
    println!("disconnected; CM counters: {:?}", cma.stats());
    Ok(())
}
