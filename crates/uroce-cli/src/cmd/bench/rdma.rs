//! The RDMA tests: both ends of one measured point (bandwidth with a full
//! pipe and selective signaling, or ping-pong latency), over RC, UC or UD
//! QPs set up through the control channel, waiting for completions by
//! polling or through a completion channel.

use super::ctrl::{Ctrl, Res, Watch};
use super::spec::{Metric, Op, Spec, Transport, Wait};
use serde_json::{json, Value};
use std::alloc::Layout;
use std::ptr::NonNull;
use std::time::{Duration, Instant};
use uroce::verbs::*;

/// One signaled WR in this many (perftest's default CQ moderation).
const SIGNAL_EVERY: u64 = 16;
/// Receives kept posted per QP by a SEND bandwidth server.
const RX_DEPTH_BW: u32 = 512;
/// Receives kept posted per QP for SEND latency.
const RX_DEPTH_LAT: u32 = 16;
/// Longest any one measured phase may take.
pub const PHASE_LIMIT: Duration = Duration::from_secs(60);
/// Longest one wait for a completion event (then the caller checks its
/// deadline or the client's `end`).
const EVENT_WAIT: Duration = Duration::from_millis(100);
/// The Q_Key of the UD tests.
const QKEY: u32 = 0x1111_1111;
/// The GRH a UD receive buffer starts with.
const GRH: usize = 40;

const ALL: Access =
    Access::LOCAL_WRITE.union(Access::REMOTE_WRITE).union(Access::REMOTE_READ).union(Access::REMOTE_ATOMIC);

fn wc0() -> Wc {
    Wc::new(0, WcStatus::Success, WcOpcode::Send, 0)
}

/// A page-aligned registered buffer the benchmark owns, so that a byte the
/// peer writes can be polled in place (write latency).
pub struct Buf {
    ptr: NonNull<u8>,
    layout: Layout,
    mr: Option<MemoryRegion>,
}

impl Buf {
    fn new(pd: &ProtectionDomain, len: usize) -> Res<Buf> {
        let layout = Layout::from_size_align(len.max(64), 4096)?;
        // SAFETY: the layout has a non-zero size.
        let p = unsafe { std::alloc::alloc_zeroed(layout) };
        let ptr = NonNull::new(p).ok_or("bench: out of memory")?;
        // SAFETY: the allocation stays valid until `drop`, which drops the
        // region (deregistration waits for the device) before freeing it.
        match unsafe { pd.register_raw(p, layout.size(), p as u64, ALL) } {
            Ok(mr) => Ok(Buf { ptr, layout, mr: Some(mr) }),
            Err(e) => {
                // SAFETY: allocated above with this layout; never registered.
                unsafe { std::alloc::dealloc(p, layout) };
                Err(e.into())
            }
        }
    }

    fn mr(&self) -> &MemoryRegion {
        self.mr.as_ref().expect("registered until drop")
    }

    fn sge(&self, off: usize, len: usize) -> Sge {
        self.mr().sge(off, len as u32)
    }

    /// Reads one byte that the device may be writing concurrently.
    #[inline]
    fn get(&self, off: usize) -> u8 {
        assert!(off < self.layout.size());
        // SAFETY: in bounds of the live allocation. The device writes this
        // memory with plain copies from another thread or from inside
        // `poll`; a volatile byte read observes either the old or the new
        // value, which is all a polling loop needs (perftest polls the same
        // way).
        unsafe { self.ptr.as_ptr().add(off).read_volatile() }
    }

    #[inline]
    fn set(&self, off: usize, v: u8) {
        assert!(off < self.layout.size());
        // SAFETY: in bounds of the live allocation. This byte is in the half
        // the device only reads (sends from); the latency loops set it before
        // posting and not again until the peer has answered, i.e. after the
        // previous message's data has left.
        unsafe { self.ptr.as_ptr().add(off).write_volatile(v) }
    }
}

impl Drop for Buf {
    fn drop(&mut self) {
        drop(self.mr.take());
        // SAFETY: allocated in `new` with this layout; the region is gone.
        unsafe { std::alloc::dealloc(self.ptr.as_ptr(), self.layout) };
    }
}

/// Offset of the receive half of a buffer for `size`-byte messages: the
/// first half is sent from, the second written into by the peer.
pub fn slot(size: usize) -> usize {
    size.max(8).div_ceil(64) * 64
}

/// One end of a test: QPs, their CQ and the buffer.
pub struct Endpoint {
    qps: Vec<QueuePair>,
    cq: CompletionQueue,
    /// The CQ's channel (`--wait event`; the CQ is armed while waiting).
    channel: Option<CompletionChannel>,
    transport: Transport,
    /// UD: where the peer's QP is (set by `connect`).
    ud: std::sync::OnceLock<UdDest>,
    buf: Buf,
    slot: usize,
    psn: u32,
    tx_depth: u32,
    rx_depth: u32,
}

impl Endpoint {
    pub fn new(ctx: &Context, pd: &ProtectionDomain, spec: &Spec) -> Res<Endpoint> {
        // A UD receive takes the GRH before the message.
        let slot = slot(spec.size + if spec.transport == Transport::Ud { GRH } else { 0 });
        let buf = Buf::new(pd, 2 * slot)?;
        let tx_depth = match spec.metric {
            Metric::Bw => spec.tx_depth as u32,
            Metric::Lat => 4 * SIGNAL_EVERY as u32,
        };
        let rx_depth = match (spec.op, spec.metric) {
            (Op::Send, Metric::Bw) => RX_DEPTH_BW,
            (Op::Send, Metric::Lat) => RX_DEPTH_LAT,
            _ => 1,
        };
        let qps = spec.qps.max(1);
        let cqe = qps as u32 * (tx_depth + rx_depth) + 16;
        if cqe > 32767 {
            return Err(format!("--qps {qps} × --tx-depth {tx_depth} needs a CQ larger than 32767").into());
        }
        let channel = match spec.wait {
            Wait::Poll => None,
            Wait::Event => Some(ctx.create_comp_channel()?),
        };
        let cq = ctx.create_cq(cqe, channel.as_ref())?;
        if channel.is_some() {
            cq.req_notify(false)?;
        }
        let mut attr = QpInitAttr::rc(&cq, &cq);
        attr.qp_type = match spec.transport {
            Transport::Rc => QpType::Rc,
            Transport::Uc => QpType::Uc,
            Transport::Ud => QpType::Ud,
        };
        attr.cap.max_send_wr = tx_depth;
        attr.cap.max_recv_wr = rx_depth;
        attr.cap.max_send_sge = 1;
        attr.cap.max_recv_sge = 1;
        let qps = (0..qps).map(|_| pd.create_qp(&attr)).collect::<Result<Vec<_>, _>>()?;
        let t = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
        let psn = (std::process::id() ^ t.subsec_nanos()) & 0xFF_FFFF;
        let (transport, ud) = (spec.transport, std::sync::OnceLock::new());
        Ok(Endpoint { qps, cq, channel, transport, ud, buf, slot, psn, tx_depth, rx_depth })
    }

    pub fn info(&self, ctx: &Context) -> Res<Value> {
        Ok(json!({
            "gid": ctx.query_gid(0)?.0.to_vec(),
            "qpns": self.qps.iter().map(|q| q.qp_num()).collect::<Vec<_>>(),
            "psn": self.psn,
            "rkey": self.buf.mr().rkey(),
            "addr": self.buf.mr().iova(),
        }))
    }

    pub fn connect(&self, peer: &Peer) -> Res<()> {
        if peer.qpns.len() != self.qps.len() {
            return Err("bench: the peer has a different number of QPs".into());
        }
        if self.transport == Transport::Ud {
            return self.connect_ud(peer);
        }
        for (qp, &rqpn) in self.qps.iter().zip(&peer.qpns) {
            qp.connect_rc(&peer.gid, rqpn, self.psn, peer.psn)?;
        }
        Ok(())
    }

    /// UD: each QP to RTS with the tests' Q_Key; sends go to the peer's
    /// first QP.
    fn connect_ud(&self, peer: &Peer) -> Res<()> {
        for qp in &self.qps {
            let mut a = QpAttr { port_num: 1, qkey: QKEY, sq_psn: self.psn, ..QpAttr::default() };
            for (cur, next) in
                [(QpState::Reset, QpState::Init), (QpState::Init, QpState::Rtr), (QpState::Rtr, QpState::Rts)]
            {
                a.qp_state = next;
                qp.modify(&a, QpAttrMask::STATE | uroce::proto::qp::required_attributes(QpType::Ud, cur, next))?;
            }
        }
        let av = AddressVector { dgid: peer.gid, is_global: true, hop_limit: 64, port_num: 1, ..Default::default() };
        let _ = self.ud.set(UdDest { av, remote_qpn: peer.qpns[0], remote_qkey: QKEY });
        Ok(())
    }

    /// Completions into `wcs`: one poll, or with a channel, as
    /// `ibv_rc_pingpong -e`: wait for the CQ's event (at most EVENT_WAIT:
    /// then none), arm the CQ again and poll once.
    fn completions(&self, wcs: &mut [Wc]) -> Res<usize> {
        let Some(ch) = &self.channel else { return Ok(self.cq.poll(wcs)?) };
        if ch.wait(EVENT_WAIT)?.is_none() {
            return Ok(0);
        }
        self.cq.req_notify(false)?;
        Ok(self.cq.poll(wcs)?)
    }

    /// Fills every receive queue (SEND tests).
    pub fn post_receives(&self, size: usize) -> Res<()> {
        if self.rx_depth <= 1 {
            return Ok(());
        }
        for (i, qp) in self.qps.iter().enumerate() {
            self.repost(qp, i, size, self.rx_depth as usize)?;
        }
        Ok(())
    }

    fn repost(&self, qp: &QueuePair, i: usize, size: usize, n: usize) -> Res<()> {
        let len = size + if self.transport == Transport::Ud { GRH } else { 0 };
        let wr = RecvWr { wr_id: i as u64, sg_list: uroce::sgl![self.buf.sge(self.slot, len)] };
        qp.post_recv_list(std::iter::repeat_n(wr, n)).map_err(|(_, e)| e)?;
        Ok(())
    }

    fn debug(&self) -> String {
        self.qps.first().map(|q| q.debug_state()).unwrap_or_default()
    }
}

/// What the other end told us.
pub struct Peer {
    gid: Gid,
    qpns: Vec<u32>,
    psn: u32,
    rkey: u32,
    addr: u64,
}

impl Peer {
    pub fn from_json(v: &Value) -> Res<Peer> {
        let gid: Vec<u8> = serde_json::from_value(v["gid"].clone())?;
        let gid = Gid(gid.try_into().map_err(|_| "bench: bad GID from peer")?);
        let qpns: Vec<u32> = serde_json::from_value(v["qpns"].clone())?;
        let num = |k: &str| v[k].as_u64().ok_or_else(|| format!("bench: peer info lacks {k}"));
        Ok(Peer { gid, qpns, psn: num("psn")? as u32, rkey: num("rkey")? as u32, addr: num("addr")? })
    }
}

fn check(wc: &Wc, ep: &Endpoint, what: &str) -> Res<()> {
    if wc.status != WcStatus::Success {
        return Err(format!("{what}: completion {:?} ({:?}); QP: {}", wc.status, wc.opcode, ep.debug()).into());
    }
    Ok(())
}

/// The send WR of test `spec` number `k` (1-based) on QP `qi`.
fn send_wr(spec: &Spec, ep: &Endpoint, peer: &Peer, qi: usize, k: u64, signaled: bool) -> SendWr {
    let (opcode, local, remote, len) = match spec.op {
        Op::Write => (WrOpcode::RdmaWrite, 0, peer_slot(spec, peer), spec.size),
        Op::Read => (WrOpcode::RdmaRead, ep.slot, peer.addr, spec.size),
        Op::Send => (WrOpcode::Send, 0, 0, spec.size),
        Op::Atomic => (WrOpcode::AtomicFetchAdd, ep.slot, peer_slot(spec, peer), 8),
    };
    let mut w = SendWr::new((qi as u64) << 32 | k, opcode);
    w.flags = if signaled { SendFlags::SIGNALED } else { SendFlags::empty() };
    w.sg_list = uroce::sgl![ep.buf.sge(local, len)];
    if spec.op != Op::Send {
        w.remote_addr = remote;
        w.rkey = peer.rkey;
    }
    w.ud = ep.ud.get().copied();
    w.compare_add = 1;
    w
}

fn peer_slot(spec: &Spec, peer: &Peer) -> u64 {
    peer.addr + slot(spec.size) as u64
}

/// Client bandwidth: `iters` messages round-robin over the QPs, each QP
/// keeping `tx_depth` WRs outstanding, one in SIGNAL_EVERY signaled.
/// Returns the time from the first post to the last completion.
pub fn bw(ep: &Endpoint, peer: &Peer, spec: &Spec, iters: u64) -> Res<Duration> {
    let q = ep.qps.len();
    let target: Vec<u64> = (0..q as u64).map(|i| iters / q as u64 + u64::from(i < iters % q as u64)).collect();
    let tx = u64::from(ep.tx_depth);
    let sig = SIGNAL_EVERY.min(tx);
    let (mut posted, mut done) = (vec![0u64; q], vec![0u64; q]);
    let mut left = iters;
    let mut wcs = [wc0(); 64];
    let start = Instant::now();
    let deadline = start + PHASE_LIMIT;
    let mut spins = 0u64;
    while left > 0 {
        for qi in 0..q {
            let room = tx - (posted[qi] - done[qi]);
            let remaining = target[qi] - posted[qi];
            let n = room.min(remaining);
            if n > 0 && (n >= sig || n == remaining) {
                let first = posted[qi] + 1;
                let wrs = (first..first + n).map(|k| send_wr(spec, ep, peer, qi, k, k % sig == 0 || k == target[qi]));
                ep.qps[qi].post_send_list(wrs).map_err(|(_, e)| e)?;
                posted[qi] += n;
            }
        }
        let n = ep.cq.poll(&mut wcs)?;
        for wc in &wcs[..n] {
            check(wc, ep, "bw")?;
            let qi = (wc.wr_id >> 32) as usize;
            let k = wc.wr_id & 0xFFFF_FFFF;
            left -= k - done[qi];
            done[qi] = k;
        }
        spins += 1;
        if spins % 1024 == 0 && Instant::now() > deadline {
            return Err(format!(
                "bw: no progress within {PHASE_LIMIT:?} ({} of {iters} done); QP: {}",
                iters - left,
                ep.debug()
            )
            .into());
        }
    }
    Ok(start.elapsed())
}

/// Client latency: `iters` round trips on the first QP; returns each
/// round trip in µs. `n` counts write-latency exchanges across phases (the
/// value of the polled byte).
pub fn lat(ep: &Endpoint, peer: &Peer, spec: &Spec, iters: u64, n: &mut u64) -> Res<Vec<f64>> {
    let qp = &ep.qps[0];
    let last = spec.size - 1;
    let mut rtt = Vec::with_capacity(iters as usize);
    let mut wcs = [wc0(); 16];
    let deadline = Instant::now() + PHASE_LIMIT;
    let every = if ep.channel.is_some() { 1 } else { 1024 };
    let timeout = |spins: &mut u64, what: &str| -> Res<()> {
        *spins += 1;
        if *spins % every == 0 && Instant::now() > deadline {
            return Err(format!("{what}: no answer within {PHASE_LIMIT:?}; QP: {}", ep.debug()).into());
        }
        Ok(())
    };
    for _ in 0..iters {
        *n += 1;
        let signaled = *n % SIGNAL_EVERY == 0;
        let mut spins = 0;
        let t0;
        match spec.op {
            Op::Write => {
                let v = *n as u8;
                ep.buf.set(last, v);
                t0 = Instant::now();
                qp.post_send(&send_wr(spec, ep, peer, 0, *n, signaled))?;
                while ep.buf.get(ep.slot + last) != v {
                    let k = ep.cq.poll(&mut wcs)?;
                    for wc in &wcs[..k] {
                        check(wc, ep, "write lat")?;
                    }
                    timeout(&mut spins, "write lat")?;
                }
            }
            Op::Send => {
                t0 = Instant::now();
                qp.post_send(&send_wr(spec, ep, peer, 0, *n, signaled))?;
                let mut got = false;
                while !got {
                    let k = ep.completions(&mut wcs)?;
                    for wc in &wcs[..k] {
                        check(wc, ep, "send lat")?;
                        if wc.opcode == WcOpcode::Recv {
                            got = true;
                            ep.repost(qp, 0, spec.size, 1)?;
                        }
                    }
                    if !got {
                        timeout(&mut spins, "send lat")?;
                    }
                }
            }
            Op::Read | Op::Atomic => {
                t0 = Instant::now();
                qp.post_send(&send_wr(spec, ep, peer, 0, *n, true))?;
                loop {
                    let k = ep.completions(&mut wcs[..1])?;
                    if k > 0 {
                        check(&wcs[0], ep, "lat")?;
                        break;
                    }
                    timeout(&mut spins, "lat")?;
                }
            }
        }
        rtt.push(t0.elapsed().as_secs_f64() * 1e6);
    }
    // Reap the last signaled completions so the next phase starts clean
    // (an event they raised stays counted: the next wait takes it and
    // finds nothing, as `ibv_rc_pingpong -e` may).
    while let Some(wc) = ep.cq.poll_one() {
        check(&wc, ep, "lat")?;
    }
    Ok(rtt)
}

/// Server side of one point: set up, connect to the client, then be the
/// passive or active peer the test needs until the client's `end`.
pub fn serve(ctrl: &mut Ctrl, ctx: &Context, pd: &ProtectionDomain, msg: &Value) -> Res<()> {
    let spec = Spec::from_json(&msg["spec"])?;
    let peer = Peer::from_json(&msg["info"])?;
    let ep = Endpoint::new(ctx, pd, &spec)?;
    ep.connect(&peer)?;
    ep.post_receives(spec.size)?;
    let watch = ctrl.watch_end()?;
    ctrl.send(&json!({ "info": ep.info(ctx)? }))?;
    let r = match (spec.op, spec.metric) {
        (Op::Write, Metric::Lat) => serve_write_lat(&ep, &peer, &spec, &watch),
        (Op::Send, Metric::Lat) => serve_send_lat(&ep, &peer, &spec, &watch),
        (Op::Send, Metric::Bw) => serve_send_bw(&ep, &spec, &watch),
        _ => serve_passive(&ep, &watch),
    };
    // Wait for the end even after an error, so the reply pairs with it.
    while !watch.done() {
        std::thread::sleep(Duration::from_millis(1));
    }
    watch.join()?;
    match r {
        Ok(()) => ctrl.send(&json!({ "ok": true })),
        Err(e) => ctrl.send(&json!({ "error": e.to_string() })),
    }
}

/// One-sided tests: keep polling, which drives the device from this thread.
fn serve_passive(ep: &Endpoint, watch: &Watch) -> Res<()> {
    let mut wcs = [wc0(); 16];
    while !watch.done() {
        let n = ep.completions(&mut wcs)?;
        for wc in &wcs[..n] {
            check(wc, ep, "server")?;
        }
    }
    Ok(())
}

fn serve_send_bw(ep: &Endpoint, spec: &Spec, watch: &Watch) -> Res<()> {
    let mut wcs = [wc0(); 64];
    let mut again = vec![0usize; ep.qps.len()];
    while !watch.done() {
        let n = ep.cq.poll(&mut wcs)?;
        for wc in &wcs[..n] {
            check(wc, ep, "send bw server")?;
            if wc.opcode == WcOpcode::Recv {
                again[wc.wr_id as usize] += 1;
            }
        }
        for (i, k) in again.iter_mut().enumerate() {
            if *k >= 16 || (*k > 0 && n == 0) {
                ep.repost(&ep.qps[i], i, spec.size, *k)?;
                *k = 0;
            }
        }
    }
    Ok(())
}

fn serve_write_lat(ep: &Endpoint, peer: &Peer, spec: &Spec, watch: &Watch) -> Res<()> {
    let last = spec.size - 1;
    let mut wcs = [wc0(); 16];
    let mut n = 0u64;
    loop {
        n += 1;
        let v = n as u8;
        while ep.buf.get(ep.slot + last) != v {
            if watch.done() {
                return Ok(());
            }
            let k = ep.cq.poll(&mut wcs)?;
            for wc in &wcs[..k] {
                check(wc, ep, "write lat server")?;
            }
        }
        ep.buf.set(last, v);
        ep.qps[0].post_send(&send_wr(spec, ep, peer, 0, n, n % SIGNAL_EVERY == 0))?;
    }
}

fn serve_send_lat(ep: &Endpoint, peer: &Peer, spec: &Spec, watch: &Watch) -> Res<()> {
    let mut wcs = [wc0(); 16];
    let mut n = 0u64;
    while !watch.done() {
        let k = ep.completions(&mut wcs)?;
        for wc in &wcs[..k] {
            check(wc, ep, "send lat server")?;
            if wc.opcode == WcOpcode::Recv {
                n += 1;
                ep.repost(&ep.qps[0], 0, spec.size, 1)?;
                ep.qps[0].post_send(&send_wr(spec, ep, peer, 0, n, n % SIGNAL_EVERY == 0))?;
            }
        }
    }
    Ok(())
}
