//! The CM agent on a device: a client of the device like any application.
//! [`CmEndpoint::open`] creates the device's GSI QP (QP 1, UD, Q_Key
//! 0x80010000), keeps receives posted on it, and runs the sans-IO agent
//! ([`super::Cm`]): MADs from QP 1's completions in, MADs out as inline UD
//! sends to QP 1 of the peer (BTH + DETH + ICRC built by the same engine as
//! every packet). A small thread sleeps on QP 1's completion channel until
//! a MAD arrives or the agent's next deadline; user calls send what they
//! cause at once.
//!
//! On top sits the blocking Rust API: `listen` / `get_request` / `accept`
//! on the passive side, `connect` on the active side, each returning once
//! the caller's RC QP has been moved through INIT, RTR and RTS with the
//! values the CM negotiated (as the kernel hands them to librdmacm:
//! `shared/spec/cm.md` §4.6), then `disconnect`.
//!
//! Lock order: the endpoint's state lock, then the device engine's lock
//! (taken inside the verbs calls); the device never calls back into here.

use super::agent::{AcceptParams, Cm, CmConfig, CmStats, ConnectParams, ListenParams};
use super::conn::ConnInfo;
use super::event::{CmEvent, ConnId, ConnParam, EventKind, ListenId, Param};
use super::mad::{rej_reason, TransportType, MAD_LEN};
use super::service::PortSpace;
use super::{GSI_QKEY, GSI_QPN};
use crate::ib::{Access, Errno, Error, Gid, Mtu, QpAttrMask, QpState, QpType, Result, WcOpcode, WcStatus};
use crate::lock_order::{Held, Ordered, Rank};
use crate::mem::KeyRng;
use crate::proto::wr::{AddressVector, QpAttr, QpCap, RecvWr, SendWr, UdDest, WrOpcode};
use crate::verbs::{
    CompletionChannel, CompletionQueue, Context, MemoryRegion, ProtectionDomain, QpInitAttr, QueuePair,
};
use std::collections::VecDeque;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, Weak};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// Receives kept posted on QP 1 (the kernel MAD layer's `mad_recvq_size`,
/// 512: a burst of connection requests is not dropped for want of one).
const RECV_DEPTH: usize = 512;
/// Sends QP 1 has in flight at most: its send queue. With the receives,
/// the most completions its CQ can hold unpolled (`CQ_DEPTH` leaves room).
const SEND_DEPTH: usize = 256;
const CQ_DEPTH: usize = RECV_DEPTH + SEND_DEPTH + 64;
/// Completions one pass handles before it sends what they caused: a pass
/// under a flood ends, and the state lock is released between passes.
const PASS_BUDGET: usize = RECV_DEPTH;
/// Passes of one pump; what is still queued after them is dropped (and
/// counted): the agent retransmits what matters.
const PASSES: usize = 4;
/// One receive: the 40-byte GRH area, then the MAD.
const SLOT: usize = 40 + MAD_LEN;
/// Longest sleep of the agent's thread when nothing is due. It wakes for
/// MADs (QP 1's CQ is armed), for its next deadline, and when a call of
/// another thread makes an earlier one or the endpoint stops (both
/// interrupt its sleep); after each wake it checks that QP 1 is in RTS. Every
/// way out of RTS known here leaves a completion (the failed work request,
/// or the flush of the posted receives), which wakes it; this bound is the
/// safety net for one that would not (an idle agent wakes once a minute).
const MAX_SLEEP: Duration = Duration::from_secs(60);

/// What a side asks of a connection (`struct rdma_conn_param`); the
/// default is rping's (1, 1, 7, 7, no private data).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConnOptions {
    /// RDMA Reads and atomics this side serves at once (at most the peer's
    /// initiator depth when accepting).
    pub responder_resources: u8,
    /// RDMA Reads and atomics this side has outstanding at once (at most
    /// the peer's responder resources when accepting).
    pub initiator_depth: u8,
    /// Transport retry count (`connect` only).
    pub retry_count: u8,
    /// RNR NAK retry count (7 retries forever).
    pub rnr_retry_count: u8,
    /// User private data of the REQ (at most 56 bytes) or REP (196).
    pub private_data: Vec<u8>,
}

impl Default for ConnOptions {
    fn default() -> Self {
        ConnOptions {
            responder_resources: 1,
            initiator_depth: 1,
            retry_count: 7,
            rnr_retry_count: 7,
            private_data: Vec::new(),
        }
    }
}

/// A connection request a listener received. It holds its CM id: give it
/// to [`CmEndpoint::accept`] (or `accept_ud`) or [`CmEndpoint::reject`];
/// dropped unanswered, the id is destroyed and the peer gets a REJ, as
/// `rdma_destroy_id` of a request does.
#[derive(Debug)]
#[must_use = "dropping a Request rejects it"]
pub struct Request {
    /// The CM id of the request.
    pub id: ConnId,
    /// The listener that received it.
    pub listen_id: ListenId,
    /// The active side's values, turned around (`responder_resources` is
    /// what the active side's initiator depth allows here).
    pub param: ConnParam,
    /// The active's user private data (56 bytes, zero-filled).
    pub private_data: Vec<u8>,
    /// The active side's address and port.
    pub remote: SocketAddr,
    /// The endpoint that destroys the id when the request is dropped
    /// (taken by a call that answers it).
    owner: Owner,
}

/// A UD peer resolved by SIDR: where to send and with which Q_Key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UdPeer {
    /// The CM id of the SIDR exchange (destroyed once it ended).
    pub id: ConnId,
    /// The listener's address and port.
    pub addr: SocketAddr,
    /// The peer's UD QP number.
    pub qpn: u32,
    /// The Q_Key to send to it with.
    pub qkey: u32,
    /// The SIDR_REP's private data (136 bytes).
    pub private_data: Vec<u8>,
}

/// An established connection: its CM id and what was negotiated. Dropping
/// it ends the connection as `rdma_destroy_id` does (a DREQ if it is still
/// up, a DREP to the peer's DREQ) and drops its queued events; call
/// [`CmEndpoint::disconnect`] first to move the QP to ERR and wait for
/// the peer ([`CmEndpoint::wait_disconnected`]).
#[derive(Debug)]
#[must_use = "dropping a Connection ends it"]
pub struct Connection {
    /// The CM id of the connection.
    pub id: ConnId,
    /// What the CM negotiated for the connection.
    pub info: ConnInfo,
    /// The peer's private data (the REP's 196 bytes on the active side).
    pub private_data: Vec<u8>,
    /// Ends the id on drop.
    _owner: Owner,
}

/// Who destroys a CM id when its handle goes: the endpoint (weakly: an
/// endpoint dropped first has ended every id), or nobody (`default`).
#[derive(Debug, Default)]
struct Owner(Option<(Weak<Inner>, ConnId)>);

impl Owner {
    fn new(inner: &Arc<Inner>, id: ConnId) -> Owner {
        Owner(Some((Arc::downgrade(inner), id)))
    }
}

impl Drop for Owner {
    fn drop(&mut self) {
        let Some((endpoint, id)) = self.0.take() else { return };
        let Some(inner) = endpoint.upgrade() else { return };
        let mut st = inner.lock();
        st.events.retain(|e| e.id != id);
        let _ = st.cm.destroy(Instant::now(), id);
        inner.kick(&mut st);
    }
}

impl std::fmt::Debug for Inner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CmEndpoint").finish_non_exhaustive()
    }
}

// The handles are used from any thread, as the endpoint is.
const _: () = {
    const fn send_sync<T: Send + Sync>() {}
    send_sync::<CmEndpoint>();
    send_sync::<Connection>();
    send_sync::<Request>();
};

struct State {
    cm: Cm,
    events: VecDeque<CmEvent>,
    next_port: u16,
    /// Sends posted on QP 1 whose completions are not polled yet.
    sends_in_flight: usize,
    /// Until when the agent's thread sleeps (`None`: it is not asleep); a
    /// call that makes an earlier deadline interrupts it.
    sleeps_until: Option<Instant>,
}

struct Inner {
    // Dropped first: the QP before the memory and queues it uses.
    qp: QueuePair,
    recv: MemoryRegion,
    cq: CompletionQueue,
    chan: CompletionChannel,
    _pd: ProtectionDomain,
    ctx: Context,
    st: Ordered<Mutex<State>>,
    cond: Condvar,
    stop: AtomicBool,
}

/// The CM agent of one device.
pub struct CmEndpoint {
    inner: Arc<Inner>,
    thread: Option<JoinHandle<()>>,
}

fn errno(e: i32, what: &'static str) -> Error {
    Error::new(Errno(e), what)
}

/// The source address a received UD message's GRH area carries.
fn grh_source(g: &[u8]) -> Option<IpAddr> {
    if g.get(20) == Some(&0x45) {
        let a: [u8; 4] = g.get(32..36)?.try_into().ok()?;
        Some(IpAddr::V4(Ipv4Addr::from(a)))
    } else {
        let a: [u8; 16] = g.get(8..24)?.try_into().ok()?;
        let v6 = Ipv6Addr::from(a);
        Some(v6.to_ipv4_mapped().map_or(IpAddr::V6(v6), IpAddr::V4))
    }
}

impl Inner {
    fn lock(&self) -> Held<MutexGuard<'_, State>> {
        self.st.lock_unpoisoned()
    }

    fn post_recv_slot(&self, slot: usize) -> Result<()> {
        self.qp.post_recv(&RecvWr { wr_id: slot as u64, sg_list: crate::sgl![self.recv.sge(slot * SLOT, SLOT as u32)] })
    }

    /// Posts a MAD; false if QP 1 did not take it.
    fn send_mad(&self, dst: IpAddr, mad: &[u8; MAD_LEN]) -> bool {
        let mut w = SendWr::new(0, WrOpcode::Send);
        w.inline = Some(mad.to_vec());
        let av = AddressVector {
            dgid: Gid::from_ip(dst),
            is_global: true,
            hop_limit: 64,
            port_num: 1,
            ..Default::default()
        };
        w.ud = Some(UdDest { av, remote_qpn: GSI_QPN, remote_qkey: GSI_QKEY });
        match self.qp.post_send(&w) {
            Ok(()) => true,
            Err(e) => {
                tracing::debug!(%dst, "cm: could not send a MAD: {e}");
                false
            }
        }
    }

    /// Handles at most `PASS_BUDGET` completions: received MADs go to the
    /// agent (and their receives are posted again), sends are retired.
    /// Returns whether a completion said QP 1 failed.
    fn poll_completions(&self, st: &mut State, now: Instant) -> bool {
        let mut failed = false;
        let mut mad = [0u8; SLOT];
        for _ in 0..PASS_BUDGET {
            let Some(wc) = self.cq.poll_one() else { break };
            if !matches!(wc.status, WcStatus::Success | WcStatus::WrFlushErr) {
                failed = true;
            }
            if wc.opcode != WcOpcode::Recv {
                st.sends_in_flight = st.sends_in_flight.saturating_sub(1);
                continue;
            }
            let slot = wc.wr_id as usize;
            if slot >= RECV_DEPTH {
                continue;
            }
            if wc.status == WcStatus::Success
                && wc.byte_len as usize == SLOT
                && self.recv.read_at(slot * SLOT, &mut mad).is_ok()
            {
                if let Some(src) = grh_source(&mad[..40]) {
                    st.cm.handle_mad(now, src, &mad[40..]);
                }
            }
            if wc.status != WcStatus::WrFlushErr {
                let _ = self.post_recv_slot(slot);
            }
        }
        failed
    }

    /// Posts queued MADs while QP 1's send queue has room (so its CQ
    /// cannot overrun). Returns whether a post failed.
    fn send_queued(&self, st: &mut State) -> bool {
        while st.sends_in_flight < SEND_DEPTH {
            let Some(o) = st.cm.poll_transmit() else { return false };
            if !self.send_mad(o.dst, &o.mad) {
                st.cm.stats_mut().send_drops += 1;
                return true;
            }
            st.sends_in_flight += 1;
        }
        false
    }

    /// QP 1 back to RTS if it left it (a bug or an overrun we did not
    /// foresee must not end the CM for good): RESET, INIT, RTR, RTS, and
    /// every receive posted again.
    fn restart_qp1(&self, st: &mut State) {
        if self.qp.state() == QpState::Rts {
            return;
        }
        tracing::warn!("cm: QP 1 left RTS; bringing it back");
        st.cm.stats_mut().qp1_restarts += 1;
        // Completions of the old life (flushes) are dropped with it.
        while self.cq.poll_one().is_some() {}
        st.sends_in_flight = 0;
        let r = (|| {
            self.qp.modify(&QpAttr { qp_state: QpState::Reset, ..QpAttr::default() }, QpAttrMask::STATE)?;
            move_gsi_to_rts(&self.qp)?;
            (0..RECV_DEPTH).try_for_each(|slot| self.post_recv_slot(slot))
        })();
        if let Err(e) = r {
            tracing::warn!("cm: could not bring QP 1 back: {e}");
        }
    }

    /// One pump: passes of received MADs, timers and MADs to send, until
    /// nothing is queued or `PASSES` are done (the rest is dropped and
    /// counted); then QP 1's health and the events. Returns whether events
    /// were added.
    fn pump(&self, st: &mut State) -> bool {
        let now = Instant::now();
        let mut failed = false;
        for _ in 0..PASSES {
            failed |= self.poll_completions(st, now);
            if st.cm.poll_timeout().is_some_and(|t| t <= now) {
                st.cm.handle_timeout(now);
            }
            failed |= self.send_queued(st);
            if failed || st.cm.transmit_queued() == 0 {
                break;
            }
        }
        while st.cm.poll_transmit().is_some() {
            st.cm.stats_mut().send_drops += 1;
        }
        if failed {
            self.restart_qp1(st);
        }
        let mut any = false;
        while let Some(e) = st.cm.poll_event() {
            st.events.push_back(e);
            any = true;
        }
        any
    }

    /// A pass after a user call: what it caused leaves now; a deadline it
    /// made earlier than the agent's thread's wake-up wakes the thread.
    fn kick(&self, st: &mut State) {
        if self.pump(st) {
            self.cond.notify_all();
        }
        if let (Some(next), Some(wake)) = (st.cm.poll_timeout(), st.sleeps_until) {
            if next < wake {
                st.sleeps_until = None;
                self.chan.interrupt();
            }
        }
    }

    /// The agent's thread: a pass, then sleep until a MAD arrives on QP 1
    /// (its CQ armed, and polled once more to close the race), the next
    /// deadline (an earlier one made meanwhile interrupts the sleep, see
    /// `kick`), `stop` (which interrupts it too) or `MAX_SLEEP`; after each
    /// wake, QP 1's state is checked.
    fn run(&self) {
        while !self.stop.load(Ordering::SeqCst) {
            let sleep = {
                let mut st = self.lock();
                st.sleeps_until = None;
                self.restart_qp1(&mut st);
                self.kick(&mut st);
                let _ = self.cq.req_notify(false);
                self.kick(&mut st);
                let now = Instant::now();
                let wake = st.cm.poll_timeout().map_or(now + MAX_SLEEP, |t| t.min(now + MAX_SLEEP));
                // Published under the lock: a call after it sees the sleep.
                st.sleeps_until = Some(wake);
                wake.saturating_duration_since(now)
            };
            if !sleep.is_zero() && !self.stop.load(Ordering::SeqCst) {
                let _ = self.chan.wait(sleep);
            }
        }
    }

    /// Waits for the first queued event `pick` takes.
    fn wait_event(&self, timeout: Duration, mut pick: impl FnMut(&CmEvent) -> bool) -> Result<CmEvent> {
        let deadline = Instant::now() + timeout;
        let mut st = self.lock();
        loop {
            if let Some(i) = st.events.iter().position(&mut pick) {
                return st.events.remove(i).ok_or_else(|| errno(libc::EIO, "cm: event vanished"));
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(errno(libc::ETIMEDOUT, "cm: timed out waiting for the peer"));
            }
            // Every pass that queues events notifies (`kick`): no need to
            // wake before the deadline to look.
            st = st.wait_timeout(&self.cond, left).0;
        }
    }
}

/// QP 1 from RESET to RTS (Q_Key 0x80010000, port 1).
fn move_gsi_to_rts(qp: &QueuePair) -> Result<()> {
    let mut a = QpAttr { qp_state: QpState::Init, port_num: 1, qkey: GSI_QKEY, ..QpAttr::default() };
    qp.modify(&a, QpAttrMask::STATE | QpAttrMask::PKEY_INDEX | QpAttrMask::PORT | QpAttrMask::QKEY)?;
    a.qp_state = QpState::Rtr;
    qp.modify(&a, QpAttrMask::STATE)?;
    a.qp_state = QpState::Rts;
    qp.modify(&a, QpAttrMask::STATE | QpAttrMask::SQ_PSN)
}

/// The RTR/RTS attributes of a CM connection, moved on `qp`
/// (`k/cm.c` `cm_init_qp_*_attr`).
fn move_qp(qp: &QueuePair, info: &ConnInfo, dev_mtu: Mtu) -> Result<()> {
    let t = qp.qp_type();
    if !t.is_connected() {
        return Err(Error::inval("cm: only RC, UC and XRC QPs are connected by the CM"));
    }
    let required = |cur, next| QpAttrMask::STATE | crate::proto::qp::required_attributes(t, cur, next);
    let mut access = Access::REMOTE_WRITE;
    if info.responder_resources > 0 {
        access |= Access::REMOTE_READ | Access::REMOTE_ATOMIC;
    }
    let mut a =
        QpAttr { qp_state: QpState::Init, pkey_index: 0, port_num: 1, qp_access_flags: access, ..QpAttr::default() };
    let cur = qp.state();
    if cur != QpState::Reset && cur != QpState::Init {
        return Err(Error::inval("cm: the QP must be in RESET or INIT"));
    }
    // INIT → INIT too (the QP rdma_create_qp left in INIT): the access
    // flags, P_Key index and port are set either way, as librdmacm does.
    qp.modify(&a, required(cur, QpState::Init) | QpAttrMask::ACCESS_FLAGS | QpAttrMask::PKEY_INDEX | QpAttrMask::PORT)?;
    a.qp_state = QpState::Rtr;
    a.path_mtu = Mtu::from_raw(info.path_mtu as u32).unwrap_or(Mtu::Mtu1024).min_by_bytes(dev_mtu);
    a.dest_qp_num = info.remote_qpn;
    a.rq_psn = info.local_psn;
    a.max_dest_rd_atomic = info.responder_resources;
    a.min_rnr_timer = 0;
    a.ah_attr = AddressVector {
        dgid: Gid::from_ip(info.remote.ip()),
        is_global: true,
        hop_limit: info.hop_limit,
        traffic_class: info.traffic_class,
        flow_label: info.flow_label,
        port_num: 1,
        ..Default::default()
    };
    qp.modify(&a, required(QpState::Init, QpState::Rtr))?;
    a.qp_state = QpState::Rts;
    a.sq_psn = info.remote_psn;
    a.timeout = info.ack_timeout;
    a.retry_cnt = info.retry_count;
    a.rnr_retry = info.rnr_retry_count;
    a.max_rd_atomic = info.initiator_depth;
    qp.modify(&a, required(QpState::Rtr, QpState::Rts))
}

impl CmEndpoint {
    /// Starts the CM agent of `ctx`'s device: QP 1 with its receives.
    /// EBUSY if the device already has one.
    pub fn open(ctx: &Context) -> Result<CmEndpoint> {
        let pd = ctx.alloc_pd()?;
        let chan = ctx.create_internal_comp_channel()?;
        let cq = ctx.create_cq(CQ_DEPTH as u32, Some(&chan))?;
        let attr = QpInitAttr {
            cap: QpCap {
                max_send_wr: SEND_DEPTH as u32,
                max_recv_wr: RECV_DEPTH as u32,
                max_send_sge: 1,
                max_recv_sge: 1,
                max_inline_data: MAD_LEN as u32,
            },
            ..QpInitAttr::ud(&cq, &cq)
        };
        let qp = pd.create_gsi_qp(&attr)?;
        move_gsi_to_rts(&qp)?;
        let recv = pd.register(vec![0u8; RECV_DEPTH * SLOT], Access::LOCAL_WRITE)?;
        let attr = ctx.query_device();
        let ip = ctx.local_addr().ip();
        // Communication IDs and PSNs a peer cannot predict.
        let seed = crate::mem::os_random_u64();
        let mut cfg = CmConfig::new(ip, attr.node_guid, seed);
        cfg.path_mtu = ctx.query_port(1)?.active_mtu.to_raw() as u8;
        let next_port = 32768 + (seed % 28000) as u16;
        let inner = Arc::new(Inner {
            qp,
            recv,
            cq,
            chan,
            _pd: pd,
            ctx: ctx.clone(),
            st: Ordered::new(
                Rank::CmEndpoint,
                Mutex::new(State {
                    cm: Cm::with_rng(cfg, KeyRng::from_os()),
                    events: VecDeque::new(),
                    next_port,
                    sends_in_flight: 0,
                    sleeps_until: None,
                }),
            ),
            cond: Condvar::new(),
            stop: AtomicBool::new(false),
        });
        for slot in 0..RECV_DEPTH {
            inner.post_recv_slot(slot)?;
        }
        let t = inner.clone();
        let thread = std::thread::Builder::new()
            .name("uroce-cm".into())
            .spawn(move || t.run())
            .map_err(|e| errno(e.raw_os_error().unwrap_or(libc::EAGAIN), "cm: cannot start its thread"))?;
        Ok(CmEndpoint { inner, thread: Some(thread) })
    }

    /// What `rdma_create_qp` does to a new RC/UC QP: RESET → INIT (P_Key
    /// index 0, port 1, no remote access until the CM connects it), so
    /// receives can be posted before connecting.
    pub fn init_qp(qp: &QueuePair) -> Result<()> {
        let t = qp.qp_type();
        if !t.is_connected() {
            return Err(Error::inval("cm: only RC, UC and XRC QPs are connected by the CM"));
        }
        let a = QpAttr { qp_state: QpState::Init, pkey_index: 0, port_num: 1, ..QpAttr::default() };
        let mask = QpAttrMask::STATE | crate::proto::qp::required_attributes(t, QpState::Reset, QpState::Init);
        qp.modify(&a, mask)
    }

    /// What the agent counted.
    pub fn stats(&self) -> CmStats {
        self.inner.lock().cm.stats()
    }

    /// The endpoint's QP 1, for tests that break it on purpose (see
    /// `restart_qp1`).
    #[cfg(feature = "unstable")]
    #[doc(hidden)]
    pub fn gsi_qp(&self) -> &QueuePair {
        &self.inner.qp
    }

    /// `rdma_listen` on `port` of RDMA_PS_TCP, any address of the device.
    pub fn listen(&self, port: u16, backlog: u32) -> Result<ListenId> {
        self.inner.lock().cm.listen(ListenParams { ps: PortSpace::Tcp, addr: None, port, backlog, xrc: false })
    }

    /// `rdma_listen` on `port` of RDMA_PS_UDP: answers SIDR requests.
    pub fn listen_ud(&self, port: u16, backlog: u32) -> Result<ListenId> {
        self.inner.lock().cm.listen(ListenParams { ps: PortSpace::Udp, addr: None, port, backlog, xrc: false })
    }

    /// Waits for a connection request on `listen` (RC, or UD: then
    /// `param` is empty and the private data 180 bytes).
    pub fn get_request(&self, listen: ListenId, timeout: Duration) -> Result<Request> {
        let e =
            self.inner.wait_event(timeout, |e| e.kind == EventKind::ConnectRequest && e.listen_id == Some(listen))?;
        let param = match e.param {
            Param::Conn(p) => p,
            _ => ConnParam::default(),
        };
        let remote = self.inner.lock().cm.conn_info(e.id).map(|i| i.remote);
        let remote = remote.ok_or_else(|| errno(libc::ECONNABORTED, "cm: the request went away"))?;
        let owner = Owner::new(&self.inner, e.id);
        Ok(Request { id: e.id, listen_id: listen, param, private_data: e.private_data, remote, owner })
    }

    /// `rdma_accept`: moves `qp` to RTS for the request, sends the REP and
    /// waits for the RTU (or data: the caller may call [`Self::notify`]).
    /// On failure the request's id is destroyed (a REJ if still pending).
    pub fn accept(&self, req: Request, qp: &QueuePair, opts: &ConnOptions, timeout: Duration) -> Result<Connection> {
        let dev_mtu = self.inner.ctx.query_port(1)?.active_mtu;
        {
            let mut st = self.inner.lock();
            let mut info = st.cm.conn_info(req.id).cloned().ok_or_else(|| Error::inval("rdma_accept: no request"))?;
            let rr = opts.responder_resources.min(req.param.responder_resources);
            let id = opts.initiator_depth.min(req.param.initiator_depth);
            info.responder_resources = rr;
            info.initiator_depth = id;
            info.local_qpn = qp.qp_num();
            if let Err(e) = move_qp(qp, &info, dev_mtu) {
                let _ = st.cm.reject(Instant::now(), req.id, rej_reason::CONSUMER_DEFINED, &[]);
                self.inner.kick(&mut st);
                return Err(e);
            }
            let p = AcceptParams {
                qpn: qp.qp_num(),
                responder_resources: rr,
                initiator_depth: id,
                flow_control: false,
                rnr_retry_count: opts.rnr_retry_count,
                srq: false,
                qkey: 0,
                private_data: opts.private_data.clone(),
            };
            st.cm.accept(Instant::now(), req.id, p)?;
            self.inner.kick(&mut st);
        }
        let e = self.inner.wait_event(timeout, |e| e.id == req.id && e.kind != EventKind::ConnectRequest)?;
        self.result(req.id, e, Vec::new(), req.owner)
    }

    /// `rdma_accept` of a UD request: tells the peer `qp`'s number and
    /// the rdma_cm Q_Key (0x01234567, which `qp` must have); the request's
    /// id then ends (a SIDR exchange has no connection).
    pub fn accept_ud(&self, req: Request, qp: &QueuePair, private_data: &[u8]) -> Result<()> {
        if qp.qp_type() != QpType::Ud {
            return Err(Error::inval("rdma_accept: a UD request needs a UD QP"));
        }
        let p = AcceptParams {
            qpn: qp.qp_num(),
            qkey: super::RDMA_UDP_QKEY,
            private_data: private_data.to_vec(),
            ..AcceptParams::default()
        };
        let mut st = self.inner.lock();
        st.cm.accept(Instant::now(), req.id, p)?;
        self.inner.kick(&mut st);
        // (Dropping `req` destroys its id.)
        Ok(())
    }

    /// `rdma_resolve_addr` + `rdma_connect` of a UD id (RDMA_PS_UDP): asks
    /// the listener at `dst` for its QP by SIDR.
    pub fn resolve_ud(&self, dst: SocketAddr, private_data: &[u8], timeout: Duration) -> Result<UdPeer> {
        let id = {
            let mut st = self.inner.lock();
            st.next_port = if st.next_port >= 60999 { 32768 } else { st.next_port + 1 };
            let p = super::agent::SidrParams {
                ps: PortSpace::Udp,
                src_port: st.next_port,
                dst,
                private_data: private_data.to_vec(),
            };
            let id = st.cm.sidr_resolve(Instant::now(), p)?;
            self.inner.kick(&mut st);
            id
        };
        let e = self.inner.wait_event(timeout, |e| e.id == id);
        let _ = self.with_cm(|cm, now| cm.destroy(now, id));
        let e = e?;
        match (e.kind, e.param) {
            (EventKind::Established, Param::Ud(u)) => {
                Ok(UdPeer { id, addr: dst, qpn: u.qp_num, qkey: u.qkey, private_data: e.private_data })
            }
            (EventKind::Unreachable, _) if e.status < 0 => Err(errno(-e.status, "cm: the peer did not answer")),
            _ => Err(errno(libc::ECONNREFUSED, "cm: the peer refused the UD request")),
        }
    }

    /// `rdma_reject` with private data; the request's id then ends.
    pub fn reject(&self, req: Request, private_data: &[u8]) -> Result<()> {
        let mut st = self.inner.lock();
        st.cm.reject(Instant::now(), req.id, rej_reason::CONSUMER_DEFINED, private_data)?;
        self.inner.kick(&mut st);
        Ok(())
    }

    /// `rdma_connect` from an ephemeral port to `dst` (RDMA_PS_TCP): sends
    /// the REQ, moves `qp` to RTS on the REP, sends the RTU.
    pub fn connect(
        &self,
        qp: &QueuePair,
        dst: SocketAddr,
        opts: &ConnOptions,
        timeout: Duration,
    ) -> Result<Connection> {
        let transport = match qp.qp_type() {
            QpType::Rc => TransportType::Rc,
            QpType::Uc => TransportType::Uc,
            _ => return Err(Error::inval("rdma_connect: only RC and UC QPs connect")),
        };
        let id = {
            let mut st = self.inner.lock();
            st.next_port = if st.next_port >= 60999 { 32768 } else { st.next_port + 1 };
            let p = ConnectParams {
                ps: PortSpace::Tcp,
                src_port: st.next_port,
                dst,
                qpn: qp.qp_num(),
                transport,
                responder_resources: opts.responder_resources,
                initiator_depth: opts.initiator_depth,
                flow_control: false,
                retry_count: opts.retry_count,
                rnr_retry_count: opts.rnr_retry_count,
                srq: false,
                traffic_class: 0,
                private_data: opts.private_data.clone(),
            };
            let id = st.cm.connect(Instant::now(), p)?;
            self.inner.kick(&mut st);
            id
        };
        let e = match self.inner.wait_event(timeout, |e| e.id == id) {
            Ok(e) => e,
            Err(err) => {
                let _ = self.with_cm(|cm, now| cm.destroy(now, id));
                return Err(err);
            }
        };
        if e.kind != EventKind::ConnectResponse {
            let r = self.result(id, e, Vec::new(), Owner::default());
            let _ = self.with_cm(|cm, now| cm.destroy(now, id));
            return r;
        }
        let dev_mtu = self.inner.ctx.query_port(1)?.active_mtu;
        let mut st = self.inner.lock();
        let info = st.cm.conn_info(id).cloned().ok_or_else(|| errno(libc::ECONNABORTED, "rdma_connect: gone"))?;
        if let Err(err) = move_qp(qp, &info, dev_mtu) {
            // The library's CONNECT_ERROR: destroying the id rejects the REP.
            let _ = st.cm.destroy(Instant::now(), id);
            return Err(err);
        }
        let owner = Owner::new(&self.inner, id);
        if let Err(err) = st.cm.establish(Instant::now(), id) {
            drop(st);
            drop(owner);
            return Err(err);
        }
        self.inner.kick(&mut st);
        Ok(Connection { id, info, private_data: e.private_data, _owner: owner })
    }

    /// The connection `e` made of `id`, whose end `owner` destroys.
    fn result(&self, id: ConnId, e: CmEvent, private_data: Vec<u8>, owner: Owner) -> Result<Connection> {
        match e.kind {
            EventKind::Established | EventKind::ConnectResponse => {
                let info = self.inner.lock().cm.conn_info(id).cloned();
                let info = info.ok_or_else(|| errno(libc::ECONNABORTED, "cm: connection gone"))?;
                Ok(Connection { id, info, private_data, _owner: owner })
            }
            EventKind::Rejected => Err(errno(libc::ECONNREFUSED, "cm: the peer rejected the connection")),
            EventKind::Unreachable if e.status < 0 => Err(errno(-e.status, "cm: the peer did not answer")),
            _ => Err(errno(libc::ECONNABORTED, "cm: connection failed")),
        }
    }

    /// `rdma_notify(COMM_EST)`: data arrived on a passive QP before the RTU.
    pub fn notify(&self, id: ConnId) -> Result<()> {
        self.with_cm(|cm, now| cm.notify_established(now, id))
    }

    /// `rdma_disconnect`: `qp` to ERR, then DREQ (or DREP to the peer's DREQ).
    pub fn disconnect(&self, conn: &Connection, qp: &QueuePair) -> Result<()> {
        let a = QpAttr { qp_state: QpState::Err, ..QpAttr::default() };
        qp.modify(&a, QpAttrMask::STATE)?;
        let mut st = self.inner.lock();
        st.cm.disconnect(Instant::now(), conn.id)?;
        self.inner.kick(&mut st);
        Ok(())
    }

    /// Waits for the peer's disconnect (DISCONNECTED) of `conn`.
    pub fn wait_disconnected(&self, conn: &Connection, timeout: Duration) -> Result<i32> {
        self.inner.wait_event(timeout, |e| e.id == conn.id && e.kind == EventKind::Disconnected).map(|e| e.status)
    }

    /// The next event of `id` of one of `kinds` (for callers that drive
    /// the state machine themselves).
    pub fn wait_event(&self, id: ConnId, kinds: &[EventKind], timeout: Duration) -> Result<CmEvent> {
        self.inner.wait_event(timeout, |e| e.id == id && kinds.contains(&e.kind))
    }

    /// The next event of any id, waiting at most `timeout` (None if none
    /// came): for a caller that routes events itself (the drop-in
    /// librdmacm's event channels). Events are not also kept for the
    /// blocking calls above; use one style per endpoint.
    pub fn next_event(&self, timeout: Duration) -> Option<CmEvent> {
        self.inner.wait_event(timeout, |_| true).ok()
    }

    /// Runs `f` on the agent (for callers that drive it themselves), then
    /// sends what it caused at once.
    pub fn with_cm<R>(&self, f: impl FnOnce(&mut Cm, Instant) -> R) -> R {
        let mut st = self.inner.lock();
        let r = f(&mut st.cm, Instant::now());
        self.inner.kick(&mut st);
        r
    }

    /// Moves `qp` (RESET or INIT) through INIT, RTR and RTS with what the
    /// CM negotiated for a connection (`shared/spec/cm.md` §4.6), as
    /// librdmacm does with the kernel's attributes.
    pub fn connect_qp(&self, qp: &QueuePair, info: &ConnInfo) -> Result<()> {
        let dev_mtu = self.inner.ctx.query_port(1)?.active_mtu;
        move_qp(qp, info, dev_mtu)
    }

    /// An unused ephemeral port of this agent (32768..60999, in turn).
    pub fn ephemeral_port(&self) -> u16 {
        let mut st = self.inner.lock();
        st.next_port = if st.next_port >= 60999 { 32768 } else { st.next_port + 1 };
        st.next_port
    }

    /// `rdma_destroy_id`: what the state needs on the wire, then no events.
    pub fn destroy(&self, id: ConnId) -> Result<()> {
        let mut st = self.inner.lock();
        st.events.retain(|e| e.id != id);
        st.cm.destroy(Instant::now(), id)?;
        self.inner.kick(&mut st);
        Ok(())
    }
}

impl Drop for CmEndpoint {
    fn drop(&mut self) {
        self.inner.stop.store(true, Ordering::SeqCst);
        self.inner.chan.interrupt();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        // As a process exit closes the kernel's rdma_cm file: every id is
        // destroyed, and its last words (a DREQ, a REJ) leave before QP 1 goes.
        let mut st = self.inner.lock();
        st.cm.destroy_all(Instant::now());
        self.inner.pump(&mut st);
    }
}

impl std::fmt::Debug for CmEndpoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CmEndpoint").field("addr", &self.inner.ctx.local_addr()).finish()
    }
}
