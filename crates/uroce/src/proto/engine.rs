//! The engine: the queue pairs of one device, packet reception checks (in
//! rxe's order), dispatch to the responder or completer, round-robin
//! transmission across queue pairs, timers and events; and the table of XRC
//! SRQs by number that XRC requests name.
//!
//! Reception is two steps: [`check_datagram`] parses a datagram and checks
//! its ICRC with nothing but the device's configuration (so a runtime runs
//! it before taking any lock), and [`Engine::handle_received`] applies the
//! checks that need the QP (rxe's order: QP, ICRC, type, P_Key, state,
//! address) and hands the packet to it. An engine may hold all of a
//! device's QPs or a shard of them: QPNs can be given by the caller
//! ([`Engine::create_qp_at`]).
//!
//! Timers live in a binary heap keyed by (deadline, QPN, generation) with
//! lazy deletion: re-arming a QP's timer pushes a new entry and makes the
//! old one stale; stale entries are dropped when they reach the top (the
//! top is never stale, so [`Engine::poll_timeout`] is a peek) or when they
//! outnumber the live ones (a rebuild). A pass costs O(log n) per timer
//! change, whatever the number of running timers.

use super::copy::{Copies, CopyJob, Parked, MAX_PARKED};
use super::qp::{Qp, QpInit};
use super::rx_ids::{IcrcCheck, RxIds};
use super::config::EngineConfig;
use super::srq::{SharedRecvQueue, XrcSrqs};
use super::wr::{QpAttr, RecvWr, SendWr};
use super::MemoryAccess;
use super::{AfterSend, Ctx, Event, Stats, Transmit};
use crate::ib::{Error, QpAttrMask, QpState, QpType, Result};
use crate::wire::{self, IpInfo, OpFlags, Packet, Transport};
use rustc_hash::FxHashMap;
use smallvec::SmallVec;
use std::cmp::Reverse;
use std::collections::{BinaryHeap, VecDeque};
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::Instant;

pub use super::qpn::{first_qpn, qpn_after};
use super::qpn::{QpnOrder, FIRST_QPN, LAST_QPN};

/// What `uroce stat` shows of a QP.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QpSummary {
    pub qpn: u32,
    pub qp_type: QpType,
    pub state: QpState,
    pub dest_qpn: u32,
    pub peer: Option<IpAddr>,
    pub stats: Stats,
}

// Items marked `allow(dead_code)` without `unstable` are the engine's
// single-packet driving API: the simulation and the engine-level tests use
// them (through `unstable`); the runtime uses the batch forms.
pub struct Engine {
    cfg: EngineConfig,
    /// The only way the engine reaches memory (see [`super::memory`]).
    mem: Arc<dyn MemoryAccess>,
    /// Looked up per packet: a fast hash. The keys are QPNs this engine
    /// assigned, so no peer can steer them into colliding. Each QP with
    /// its counters: one lookup finds both.
    qps: FxHashMap<u32, QpSlot>,
    #[cfg_attr(not(feature = "unstable"), allow(dead_code))]
    /// The QPN order keyed by `cfg.id_seed` and the next QPN in it, made on
    /// the first [`Engine::create_qp`] (a runtime picks QPNs itself).
    next_qpn: Option<(QpnOrder, u32)>,
    /// Timer entries (deadline, QPN, generation), earliest on top; see the
    /// module documentation. The top is never stale. A QP's timer is its
    /// earliest of retransmission, RNR and held-ACK deadlines.
    timers: BinaryHeap<Reverse<(Instant, u32, u64)>>,
    /// QPs whose timer runs (the live entries in `timers`).
    timed: usize,
    /// The generation of the next timer entry.
    timer_gen: u64,
    ready: Vec<u32>,
    active: VecDeque<u32>,
    events: VecDeque<Event>,
    /// What no QP owns (every received packet, drops before a QP is
    /// found) and what destroyed QPs counted; the device's counters are
    /// these plus every QP's share ([`Stats::add_qp_share`]).
    stats: Stats,
    /// When a dropped packet was last logged (warnings are rate limited).
    last_drop_log: Option<Instant>,
    /// Buffers of sent packets, reused for new ones (no allocation per
    /// packet once the pool is warm).
    spare: Vec<Vec<u8>>,
    xrc_srqs: XrcSrqs,
    /// CM answers of a device with no QP 1 (`cm::gsi`), and their PSNs.
    gsi_out: VecDeque<Transmit>,
    gsi_psn: u32,
    /// How often a device without a CM answers a MAD (not a reflector).
    gsi_answers: super::budget::AnswerBudget,
    /// An application thread may answer what arrives: ACKs may be held for
    /// it ([`Engine::set_app_active`]).
    app_active: bool,
    #[cfg_attr(not(feature = "unstable"), allow(dead_code))]
    /// The IPv4 ID the next packet likely carries (one more than the last
    /// one's: a GSO send's segments arrive in order), tried first.
    /// IPv4 IDs of received packets, per peer ([`check_datagram`]).
    rx_ids: RxIds,
    /// Copy jobs for the runtime to run ([`Engine::poll_copy`]).
    copies: VecDeque<Box<CopyJob>>,
    /// The last input asked for a copy job (read after a dispatch).
    asked: bool,
    /// ... and was answered with an RNR NAK: not parked.
    nakked: bool,
    /// Packets parked behind copy jobs, over all QPs (none: a transmit
    /// pass need not look).
    parked: usize,
}

/// A QP and its counters (its share of the device's), counted in place by
/// the QP's work (no snapshot and delta per call).
struct QpSlot {
    qp: Qp,
    stats: Stats,
    /// Its copies that may block (`proto::copy`), lent to each input.
    copies: Copies,
}

impl QpSlot {
    fn new(qp: Qp, defer: bool) -> QpSlot {
        let copies = Copies::new(qp.qpn, defer);
        QpSlot { qp, stats: Stats::default(), copies }
    }
}

/// What became of a received packet whose QP took it.
enum Rx {
    Handled,
    /// It waits behind the QP's copy job (`proto::copy`).
    Park,
}

/// Why a packet whose QP exists is dropped (rxe's order of checks).
enum RxDrop {
    Icrc,
    State,
    Pkey,
    Addr,
}

/// A received datagram parsed and checked by [`check_datagram`].
#[derive(Debug)]
pub struct Received<'a> {
    pub src: SocketAddr,
    pub data: &'a [u8],
    /// None: malformed.
    pub pkt: Option<Packet<'a>>,
    /// The IP/UDP facts, with the IPv4 ID the ICRC verified with.
    pub ip: IpInfo,
    pub icrc: IcrcCheck,
}

/// The destination QPN of a RoCE datagram (BTH bytes 5..8), None if it is
/// too short to have one: which engine shard handles it, read before any
/// parsing.
pub fn dest_qpn(data: &[u8]) -> Option<u32> {
    let b = data.get(4..8)?;
    Some(u32::from_be_bytes([b[0], b[1], b[2], b[3]]) & 0x00FF_FFFF)
}

/// Parses a received datagram and checks its ICRC, with nothing but the
/// device's configuration and the receiver's IPv4 ID state: the expensive
/// part of reception, run before any engine is locked. For IPv4, the ICRC
/// is checked with the IP Identifications a uroce sender uses (segment k
/// of a GSO send has ID k: see `wire::icrc::find_ipv4_id`), or with an ID
/// solved from it for a peer that sends hashed IDs (Linux rxe), learned per
/// peer ([`RxIds`]), or for any peer when [`EngineConfig::ipv4_any_id`]
/// says so. Packets for QP 0 (which the engine drops unseen) skip the ICRC.
pub fn check_datagram<'a>(
    cfg: &EngineConfig,
    src: SocketAddr,
    dst: IpAddr,
    data: &'a [u8],
    ids: &mut RxIds,
) -> Received<'a> {
    let mut ip = IpInfo { src: src.ip(), dst, sport: src.port(), dport: cfg.port, ipv4_id: 0 };
    let pkt = Packet::parse(data).ok();
    let icrc = match &pkt {
        None => IcrcCheck::Bad,
        Some(p) if p.headers.bth.dest_qp == 0 => IcrcCheck::Bad,
        Some(_) => ids.check(cfg.ipv4_any_id, &mut ip, data),
    };
    Received { src, data, pkt, ip, icrc }
}

/// Most packet buffers kept for reuse: a full send window of MTU packets.
const MAX_SPARE: usize = 512;

impl std::fmt::Debug for Engine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Engine").field("addr", &self.cfg.addr).field("qps", &self.qps.len()).finish()
    }
}

impl Engine {
    pub fn new(cfg: EngineConfig, mem: Arc<dyn MemoryAccess>) -> Engine {
        Engine {
            cfg,
            mem,
            qps: FxHashMap::default(),
            next_qpn: None,
            timers: BinaryHeap::new(),
            timed: 0,
            timer_gen: 0,
            ready: Vec::new(),
            active: VecDeque::new(),
            events: VecDeque::new(),
            stats: Stats::default(),
            last_drop_log: None,
            spare: Vec::new(),
            xrc_srqs: XrcSrqs::default(),
            gsi_out: VecDeque::new(),
            gsi_psn: 0,
            gsi_answers: Default::default(),
            app_active: false,
            rx_ids: RxIds::new(),
            copies: VecDeque::new(),
            asked: false,
            nakked: false,
            parked: 0,
        }
    }

    #[cfg_attr(not(feature = "unstable"), allow(dead_code))]
    pub fn config(&self) -> &EngineConfig {
        &self.cfg
    }

    #[cfg_attr(not(feature = "unstable"), allow(dead_code))]
    pub fn memory(&self) -> &Arc<dyn MemoryAccess> {
        &self.mem
    }

    /// The device's counters (a sum over the live QPs).
    pub fn stats(&self) -> Stats {
        let mut s = self.stats;
        for q in self.qps.values() {
            s.add_qp_share(&q.stats);
        }
        s
    }

    pub fn qp(&self, qpn: u32) -> Option<&Qp> {
        self.qps.get(&qpn).map(|s| &s.qp)
    }

    /// Every QP with its state and counters, by QP number.
    pub fn qp_summaries(&self) -> Vec<QpSummary> {
        let mut v: Vec<QpSummary> = self
            .qps
            .values()
            .map(|QpSlot { qp: q, stats, .. }| QpSummary {
                qpn: q.qpn,
                qp_type: q.qp_type,
                state: q.state(),
                dest_qpn: q.attr.dest_qp_num,
                peer: (q.qp_type != QpType::Ud).then(|| q.attr.ah_attr.dgid.to_ip()),
                stats: *stats,
            })
            .collect();
        v.sort_by_key(|q| q.qpn);
        v
    }

    pub fn qp_count(&self) -> usize {
        self.qps.len()
    }

    /// Runs `f` on a QP with a context over the engine's other parts.
    fn with_qp<R>(&mut self, now: Instant, qpn: u32, f: impl FnOnce(&mut Qp, &mut Ctx) -> R) -> Option<R> {
        self.with_qp_then(now, qpn, f, |_, _, _| {})
    }

    /// [`Engine::with_qp`], then `then` on the QP, its result and the
    /// queue of QPs to poll, once the QP is scheduled: all on one lookup
    /// of the QP (one hash lookup per packet, not one per step).
    fn with_qp_then<R>(
        &mut self,
        now: Instant,
        qpn: u32,
        f: impl FnOnce(&mut Qp, &mut Ctx) -> R,
        then: impl FnOnce(&mut Qp, &R, &mut VecDeque<u32>),
    ) -> Option<R> {
        let QpSlot { qp, stats, copies } = self.qps.get_mut(&qpn)?;
        let mut ctx = Ctx {
            now,
            mem: &*self.mem,
            cfg: &self.cfg,
            events: &mut self.events,
            stats,
            ready: &mut self.ready,
            spare: &mut self.spare,
            xrc_srqs: &self.xrc_srqs,
            app_active: self.app_active,
            copy: copies,
        };
        let r = f(qp, &mut ctx);
        self.nakked = std::mem::take(&mut ctx.copy.nakked);
        if let Some(job) = ctx.copy.job.take() {
            // The input asked for a copy job (`proto::copy`).
            ctx.stats.copies_deferred += 1;
            ctx.copy.waiting = Some(job.id);
            self.copies.push_back(job);
            self.asked = true;
        }
        let next = qp.next_timeout();
        let timer_moved = next != qp.timer_key.map(|k| k.0);
        if timer_moved {
            match (qp.timer_key.is_some(), next.is_some()) {
                (false, true) => self.timed += 1,
                (true, false) => self.timed -= 1,
                _ => {}
            }
            qp.timer_key = next.map(|t| {
                self.timer_gen += 1;
                self.timers.push(Reverse((t, qpn, self.timer_gen)));
                (t, self.timer_gen)
            });
        }
        // What `f` marked ready is (in practice always) this QP: queued
        // here, without looking it up again; any other goes through
        // `schedule`, in the order it was marked.
        if self.ready.iter().all(|&q| q == qpn) {
            if !self.ready.is_empty() {
                self.ready.clear();
                if !qp.queued {
                    qp.queued = true;
                    self.active.push_back(qpn);
                }
            }
            then(qp, &r, &mut self.active);
            if timer_moved {
                self.prune_timers();
            }
        } else {
            if timer_moved {
                self.prune_timers();
            }
            self.schedule();
            if let Some(QpSlot { qp, .. }) = self.qps.get_mut(&qpn) {
                then(qp, &r, &mut self.active);
            }
        }
        Some(r)
    }

    /// Whether a timer-heap entry is its QP's live one.
    fn timer_live(&self, (t, qpn, gen): (Instant, u32, u64)) -> bool {
        self.qps.get(&qpn).is_some_and(|s| s.qp.timer_key == Some((t, gen)))
    }

    /// Drops stale entries from the top of the timer heap, and rebuilds it
    /// when stale entries outnumber live ones (re-armed timers whose old
    /// deadlines lie behind a live earlier one).
    fn prune_timers(&mut self) {
        if self.timers.len() > 2 * self.timed + 64 {
            let heap = std::mem::take(&mut self.timers);
            let live: Vec<_> = heap.into_vec().into_iter().filter(|e| self.timer_live(e.0)).collect();
            self.timers = BinaryHeap::from(live);
        }
        while let Some(&Reverse(top)) = self.timers.peek() {
            if self.timer_live(top) {
                break;
            }
            self.timers.pop();
        }
    }

    fn schedule(&mut self) {
        for qpn in self.ready.drain(..) {
            if let Some(QpSlot { qp, .. }) = self.qps.get_mut(&qpn) {
                if !qp.queued {
                    qp.queued = true;
                    self.active.push_back(qpn);
                }
            }
        }
    }

    #[cfg_attr(not(feature = "unstable"), allow(dead_code))]
    pub fn create_qp(&mut self, init: QpInit) -> Result<u32> {
        self.insert_qp(|qpn| Qp::new(qpn, init))
    }

    /// The GSI QP (QP 1, a UD QP) of the device's CM agent: the one QP
    /// number no `create_qp` hands out. EBUSY if it exists.
    pub fn create_gsi_qp(&mut self, init: QpInit) -> Result<u32> {
        let qpn = crate::wire::mad::GSI_QPN;
        if init.qp_type != QpType::Ud {
            return Err(Error::inval("create_gsi_qp: QP 1 is a UD QP"));
        }
        if self.qps.contains_key(&qpn) {
            return Err(Error::new(crate::ib::Errno::EBUSY, "create_gsi_qp: QP 1 exists"));
        }
        self.qps.insert(qpn, QpSlot::new(Qp::new(qpn, init)?, self.cfg.defer_blocking_copies));
        Ok(qpn)
    }

    #[cfg_attr(not(feature = "unstable"), allow(dead_code))]
    /// An XRC_RECV QP of XRC domain `xrcd`: its receives come from the
    /// domain's SRQs, named by each request (see [`Engine::register_xrc_srq`]).
    pub fn create_xrc_recv_qp(&mut self, xrcd: u32, scatter_to_cqe: bool) -> Result<u32> {
        self.insert_qp(|qpn| Ok(Qp::new_xrc_recv(qpn, xrcd, scatter_to_cqe)))
    }

    /// Creates a QP with the number `qpn`, chosen by the caller (a runtime
    /// that shards a device's QPs over engines). EBUSY if it is taken.
    pub fn create_qp_at(&mut self, qpn: u32, init: QpInit) -> Result<()> {
        self.insert_qp_at(qpn, |qpn| Qp::new(qpn, init))
    }

    /// [`Engine::create_xrc_recv_qp`] with the number `qpn`.
    pub fn create_xrc_recv_qp_at(&mut self, qpn: u32, xrcd: u32, scatter_to_cqe: bool) -> Result<()> {
        self.insert_qp_at(qpn, |qpn| Ok(Qp::new_xrc_recv(qpn, xrcd, scatter_to_cqe)))
    }

    fn insert_qp_at(&mut self, qpn: u32, make: impl FnOnce(u32) -> Result<Qp>) -> Result<()> {
        if !(FIRST_QPN..=LAST_QPN).contains(&qpn) {
            return Err(Error::inval("create_qp: QP number out of range"));
        }
        if self.qps.contains_key(&qpn) {
            return Err(Error::new(crate::ib::Errno::EBUSY, "create_qp: QP number taken"));
        }
        self.qps.insert(qpn, QpSlot::new(make(qpn)?, self.cfg.defer_blocking_copies));
        Ok(())
    }

    /// Gives the next free QP number to `make` and keeps its QP.
    fn insert_qp(&mut self, make: impl FnOnce(u32) -> Result<Qp>) -> Result<u32> {
        if self.qps.len() >= 0x10000 {
            return Err(Error::new(crate::ib::Errno::ENOMEM, "create_qp: too many QPs"));
        }
        let seed = self.cfg.id_seed;
        let (order, next) = self.next_qpn.get_or_insert_with(|| {
            let order = QpnOrder::new(&mut crate::mem::KeyRng::new(seed));
            let first = order.first(seed);
            (order, first)
        });
        // Fewer than 0x10000 QPs: a free number comes within as many steps.
        let mut qpn = *next;
        while self.qps.contains_key(&qpn) {
            qpn = order.after(qpn);
        }
        let qp = make(qpn)?;
        *next = order.after(qpn);
        self.qps.insert(qpn, QpSlot::new(qp, self.cfg.defer_blocking_copies));
        Ok(qpn)
    }

    /// Whether a QP numbered `qpn` exists.
    pub fn has_qp(&self, qpn: u32) -> bool {
        self.qps.contains_key(&qpn)
    }

    /// Makes an XRC SRQ reachable by its number (`srq.handle`).
    pub fn register_xrc_srq(&mut self, srq: &Arc<SharedRecvQueue>) {
        self.xrc_srqs.insert(srq.handle, Arc::downgrade(srq));
    }

    pub fn unregister_xrc_srq(&mut self, srqn: u32) {
        self.xrc_srqs.remove(&srqn);
    }

    /// Says whether an application thread is about to answer what arrives
    /// (it polls for completions): only then do QPs hold ACKs for the
    /// answer (see `proto::ack`). Off by default: a user of the engine that
    /// says nothing gets every ACK at once. The device runtime says it on
    /// each receive pass; a simulation whose applications are always there
    /// turns it on once.
    pub fn set_app_active(&mut self, active: bool) {
        self.app_active = active;
    }

    /// Whether some QP holds an ACK (see `proto::ack`).
    pub fn has_held_acks(&self) -> bool {
        self.qps.values().any(|s| s.qp.resp.ack.is_held())
    }

    /// Sends every held ACK now (the device is closing).
    pub fn flush_acks(&mut self, now: Instant) {
        let held: SmallVec<[u32; 8]> =
            self.qps.values().filter(|s| s.qp.resp.ack.is_held()).map(|s| s.qp.qpn).collect();
        for qpn in held {
            self.with_qp(now, qpn, |qp, ctx| {
                if qp.resp.release_held_ack() {
                    ctx.mark_ready(qp.qpn);
                }
            });
        }
    }

    /// The held ACK of a QP that is going away (destroyed or reset), built
    /// now and queued to go: the application often destroys its QP right
    /// after its last receive, and what it received stays acknowledged.
    fn part_with_held_ack(&mut self, qpn: u32) {
        let Some(due) = self.qps.get(&qpn).and_then(|s| s.qp.resp.ack.due()) else { return };
        // The packet needs no clock: the deadline stands in for `now`.
        if let Some(Some(t)) = self.with_qp(due, qpn, |qp, ctx| qp.take_held_ack_packet(ctx)) {
            self.gsi_out.push_back(t);
        }
    }

    pub fn destroy_qp(&mut self, qpn: u32) -> Result<()> {
        self.part_with_held_ack(qpn);
        let slot = self.qps.remove(&qpn).ok_or_else(|| Error::inval("destroy_qp: no such QP"))?;
        self.parked -= slot.copies.parked.len();
        if slot.qp.timer_key.is_some() {
            self.timed -= 1;
            self.prune_timers();
        }
        self.stats.add_qp_share(&slot.stats);
        Ok(())
    }

    pub fn modify_qp(&mut self, now: Instant, qpn: u32, attr: &QpAttr, mask: QpAttrMask) -> Result<()> {
        if mask.contains(QpAttrMask::STATE) && attr.qp_state == QpState::Reset {
            // Reset forgets the responder's state: its held ACK leaves first.
            // (A refused transition has nothing held for long anyway.)
            self.part_with_held_ack(qpn);
        }
        let r = self
            .with_qp(now, qpn, |qp, ctx| qp.modify(ctx, attr, mask))
            .unwrap_or_else(|| Err(Error::inval("modify_qp: no such QP")));
        if r.is_ok() && mask.contains(QpAttrMask::STATE) && attr.qp_state == QpState::Reset {
            // What waited for a copy job goes with the QP's state.
            if let Some(s) = self.qps.get_mut(&qpn) {
                self.parked -= s.copies.clear();
            }
        }
        r
    }

    #[cfg_attr(not(feature = "unstable"), allow(dead_code))]
    pub fn post_send(&mut self, now: Instant, qpn: u32, wr: SendWr) -> Result<()> {
        self.with_qp(now, qpn, |qp, ctx| qp.post_send(ctx, wr))
            .unwrap_or_else(|| Err(Error::inval("post_send: no such QP")))
    }

    /// Posts a list of send WRs in order, stopping at the first refused
    /// one: `Err((i, e))` says that WR `i` (and none after it) was refused,
    /// the ones before it posted. One QP lookup and one accounting pass for
    /// the list, as `ibv_post_send` of a chained list is one doorbell.
    pub fn post_send_list(
        &mut self,
        now: Instant,
        qpn: u32,
        wrs: impl IntoIterator<Item = SendWr>,
    ) -> std::result::Result<(), (usize, Error)> {
        self.with_qp(now, qpn, |qp, ctx| {
            for (i, wr) in wrs.into_iter().enumerate() {
                qp.post_send(ctx, wr).map_err(|e| (i, e))?;
            }
            Ok(())
        })
        .unwrap_or_else(|| Err((0, Error::inval("post_send: no such QP"))))
    }

    /// [`Engine::post_send_list`] for receive WRs.
    pub fn post_recv_list(
        &mut self,
        now: Instant,
        qpn: u32,
        wrs: impl IntoIterator<Item = RecvWr>,
    ) -> std::result::Result<(), (usize, Error)> {
        self.with_qp(now, qpn, |qp, ctx| {
            for (i, wr) in wrs.into_iter().enumerate() {
                qp.post_recv(ctx, wr).map_err(|e| (i, e))?;
            }
            Ok(())
        })
        .unwrap_or_else(|| Err((0, Error::inval("post_recv: no such QP"))))
    }

    #[cfg_attr(not(feature = "unstable"), allow(dead_code))]
    pub fn post_recv(&mut self, now: Instant, qpn: u32, wr: RecvWr) -> Result<()> {
        self.with_qp(now, qpn, |qp, ctx| qp.post_recv(ctx, wr))
            .unwrap_or_else(|| Err(Error::inval("post_recv: no such QP")))
    }

    #[cfg_attr(not(feature = "unstable"), allow(dead_code))]
    /// Handles one received UDP datagram: `src` is the sender, `dst` the
    /// local address it was sent to. [`check_datagram`] then
    /// [`Engine::handle_received`].
    pub fn handle_datagram(&mut self, now: Instant, src: SocketAddr, dst: IpAddr, data: &[u8]) {
        let r = check_datagram(&self.cfg, src, dst, data, &mut self.rx_ids);
        self.handle_received(now, &r);
    }

    /// Handles a datagram that [`check_datagram`] parsed and checked: the
    /// checks that need the QP, then the QP's work. An engine holding a
    /// shard of the device's QPs gets the datagrams for its QPs (by
    /// [`dest_qpn`]; those with none, any one engine).
    pub fn handle_received(&mut self, now: Instant, r: &Received) {
        let (src, data) = (r.src, r.data);
        self.stats.rx_packets += 1;
        self.stats.rx_bytes += data.len() as u64;
        let Some(pkt) = &r.pkt else {
            self.stats.rx_drop_malformed += 1;
            self.log_drop(now, src, "malformed");
            return;
        };
        // (By reference: a copy of the whole BTH or IpInfo reads it back
        // wider than `check_datagram` wrote it, a store-forwarding stall
        // that was a quarter of this function's time.)
        let bth = &pkt.headers.bth;
        let icrc = r.icrc;
        let ip = &r.ip;
        // The checks that need the QP, and its work, on one lookup of it.
        self.asked = false;
        let verdict = if bth.dest_qp == 0 {
            None
        } else {
            self.with_qp(now, bth.dest_qp, |qp, ctx| {
                if icrc.is_bad() {
                    return Err(RxDrop::Icrc);
                }
                let flags = bth.opcode.info().map_or(OpFlags::empty(), |i| i.flags);
                let is_response = flags.contains(OpFlags::RESPONSE);
                // An XRC initiator only takes responses, an XRC target only requests.
                let type_ok = match (bth.opcode.transport(), qp.qp_type) {
                    (Transport::Rc, QpType::Rc) | (Transport::Uc, QpType::Uc) | (Transport::Ud, QpType::Ud) => true,
                    (Transport::Xrc, QpType::XrcSend) => is_response,
                    (Transport::Xrc, QpType::XrcRecv) => !is_response,
                    _ => false,
                };
                if !type_ok {
                    return Err(RxDrop::State);
                }
                if bth.pkey & 0x7FFF != 0x7FFF {
                    return Err(RxDrop::Pkey);
                }
                let state_ok = match qp.state() {
                    QpState::Rtr => !is_response,
                    QpState::Rts | QpState::Sqd => true,
                    _ => false,
                };
                if !state_ok {
                    return Err(RxDrop::State);
                }
                if qp.qp_type != QpType::Ud && !qp.attr.ah_attr.dgid.is_ip(ip.src) {
                    return Err(RxDrop::Addr);
                }
                ctx.stats.rx_packets += 1;
                ctx.stats.rx_bytes += data.len() as u64;
                if ctx.copy.waiting.is_some() {
                    // The request whose page fault the job serves, sent
                    // again: another RNR NAK. Anything else: behind the
                    // QP's copy job, in order.
                    if !is_response && qp.fault_rnr_again(ctx, bth.psn) {
                        return Ok(Rx::Handled);
                    }
                    return Ok(Rx::Park);
                }
                qp.dispatch(ctx, pkt, is_response, ip, data.len());
                Ok(Rx::Handled)
            })
        };
        let Some(verdict) = verdict else {
            self.stats.rx_drop_no_qp += 1;
            let response = bth.opcode.info().is_some_and(|i| i.flags.contains(crate::wire::OpFlags::RESPONSE));
            if response {
                // An ACK or response that reaches a requester after its QP
                // was destroyed: routine at teardown (counted, not a warning).
                tracing::debug!(%src, qpn = bth.dest_qp, "dropped a response for a QP that no longer exists");
            } else if bth.dest_qp == crate::wire::mad::GSI_QPN {
                self.answer_without_cm(now, src, pkt, !icrc.is_bad());
            } else {
                self.log_drop(now, src, "no such QP");
            }
            return;
        };
        match icrc {
            IcrcCheck::GsoId => self.stats.rx_icrc_gso_id += 1,
            IcrcCheck::Solved => self.stats.rx_icrc_solved_id += 1,
            IcrcCheck::Learned => {
                self.stats.rx_icrc_solved_id += 1;
                self.stats.rx_icrc_peers_learned += 1;
            }
            IcrcCheck::Refused => self.stats.rx_icrc_solved_refused += 1,
            IcrcCheck::Zero | IcrcCheck::Bad => {}
        }
        match verdict {
            Ok(Rx::Handled) if self.asked && self.nakked => {}
            Ok(Rx::Handled) if self.asked => {
                // It asked for a copy job: it runs again, first, when the
                // job is done.
                self.park(bth.dest_qp, r, true);
            }
            Ok(Rx::Handled) => {}
            Ok(Rx::Park) => self.park(bth.dest_qp, r, false),
            Err(RxDrop::Icrc) => {
                self.stats.rx_drop_icrc += 1;
                self.log_drop(now, src, "bad ICRC");
            }
            Err(RxDrop::State) => self.stats.rx_drop_state += 1,
            Err(RxDrop::Pkey) => {
                self.stats.rx_drop_pkey += 1;
                self.log_drop(now, src, "P_Key");
            }
            Err(RxDrop::Addr) => {
                self.stats.rx_drop_addr += 1;
                self.log_drop(now, src, "source address does not match the QP's address vector");
            }
        }
    }

    /// Keeps a copy of a received packet behind its QP's copy job (`first`:
    /// the packet that asked for it, ahead of those that came since).
    fn park(&mut self, qpn: u32, r: &Received, first: bool) {
        let Some(QpSlot { stats, copies, .. }) = self.qps.get_mut(&qpn) else { return };
        if copies.parked.len() >= MAX_PARKED {
            stats.rx_drop_busy += 1;
            return;
        }
        let p = Parked { ip: r.ip, data: r.data.to_vec() };
        self.parked += 1;
        if first {
            copies.parked.push_front(p);
        } else {
            copies.parked.push_back(p);
        }
    }

    /// The next copy job to run ([`CopyJob::run`], with no lock held that
    /// this engine's users need), then to give back to
    /// [`Engine::copy_done`]. Only an engine that defers blocking copies
    /// ([`EngineConfig::defer_blocking_copies`]) makes them.
    pub fn poll_copy(&mut self) -> Option<Box<CopyJob>> {
        self.copies.pop_front()
    }

    #[cfg_attr(not(feature = "unstable"), allow(dead_code))]
    /// Whether copy jobs wait to be taken.
    pub fn has_copies(&self) -> bool {
        !self.copies.is_empty()
    }

    /// A copy job ran: its QP takes the result and runs again what waited
    /// for it: the packets parked behind it, in order, until one asks for
    /// another job; or first, when one waited, its next packet build (the
    /// parked packets run after that poll: see [`Engine::poll_transmit`]).
    /// A job whose QP is gone, or was reset since, is dropped.
    pub fn copy_done(&mut self, now: Instant, job: Box<CopyJob>) {
        let qpn = job.qpn;
        let Some(QpSlot { copies, .. }) = self.qps.get_mut(&qpn) else { return };
        if copies.waiting != Some(job.id) {
            return;
        }
        copies.waiting = None;
        copies.put(job.into_done());
        if !std::mem::take(&mut copies.build_waits) {
            self.resume(now, qpn);
        }
        // A packet build waiting for a read goes on; the QP's outputs too.
        if self.qps.get(&qpn).is_some_and(|s| s.copies.waiting.is_none()) {
            self.ready.push(qpn);
            self.schedule();
        }
    }

    /// Runs a QP's parked packets again, in order, until one asks for a
    /// copy job. (They were checked and counted when they arrived; each
    /// state machine checks the QP's state again.)
    fn resume(&mut self, now: Instant, qpn: u32) {
        loop {
            let Some(QpSlot { copies, .. }) = self.qps.get_mut(&qpn) else { return };
            if copies.waiting.is_some() {
                return;
            }
            let Some(p) = copies.parked.pop_front() else { return };
            self.parked -= 1;
            let Ok(pkt) = Packet::parse(&p.data) else { continue };
            let is_response = pkt.headers.bth.opcode.info().is_some_and(|i| i.flags.contains(OpFlags::RESPONSE));
            self.asked = false;
            self.with_qp(now, qpn, |qp, ctx| qp.dispatch(ctx, &pkt, is_response, &p.ip, p.data.len()));
            // Answered with an RNR NAK (a page fault): the requester sends
            // it again; not parked.
            if !std::mem::take(&mut self.asked) || self.nakked {
                continue;
            }
            if let Some(QpSlot { copies, .. }) = self.qps.get_mut(&qpn) {
                // It asked for a job in turn: first again.
                copies.parked.push_front(p);
                self.parked += 1;
            }
        }
    }

    /// A CM MAD to a device whose process runs no CM (no QP 1): answered
    /// as the kernel answers for an agent without state (`cm::gsi`), at
    /// most at the rate of `cm::budget` (the kernel answers every one).
    fn answer_without_cm(&mut self, now: Instant, src: SocketAddr, pkt: &Packet, icrc_ok: bool) {
        let deth_ok = pkt.headers.deth.is_some_and(|d| d.qkey == crate::wire::mad::GSI_QKEY);
        if pkt.headers.bth.opcode != wire::Opcode::UD_SEND_ONLY || !deth_ok {
            return;
        }
        let Some(answer) = super::gsi::answer_unhandled(pkt.payload).filter(|_| icrc_ok) else { return };
        if !self.gsi_answers.take(now) {
            return;
        }
        let h = super::gsi::mad_headers(self.gsi_psn);
        self.gsi_psn = (self.gsi_psn + 1) & 0xFF_FFFF;
        let out = IpInfo { src: self.cfg.addr, dst: src.ip(), sport: self.cfg.port, dport: self.cfg.port, ipv4_id: 0 };
        let mut buf = vec![0u8; wire::packet_len(h.header_len(), crate::wire::mad::MAD_LEN)];
        if let Ok(n) = wire::build_packet(&h, &answer.to_bytes(), &out, &mut buf) {
            buf.truncate(n);
            self.stats.tx_packets += 1;
            self.stats.tx_bytes += n as u64;
            self.gsi_out.push_back(Transmit {
                dst: SocketAddr::new(src.ip(), self.cfg.port),
                data: buf,
                in_place: None,
            });
        }
    }

    /// A warning for a dropped packet, at most one per second (the counters
    /// have them all).
    fn log_drop(&mut self, now: Instant, src: SocketAddr, reason: &str) {
        if self.last_drop_log.is_none_or(|t| now.saturating_duration_since(t) >= std::time::Duration::from_secs(1)) {
            self.last_drop_log = Some(now);
            tracing::warn!(%src, "dropped a packet: {reason} (see `uroce stat` for counts)");
        }
    }

    /// The next packet to send, round-robin over queue pairs; responses of a
    /// QP go before its requests.
    pub fn poll_transmit(&mut self, now: Instant) -> Option<Transmit> {
        if let Some(t) = self.gsi_out.pop_front() {
            return Some(t);
        }
        while let Some(qpn) = self.active.pop_front() {
            let t = self.with_qp_then(
                now,
                qpn,
                |qp, ctx| {
                    qp.queued = false;
                    qp.poll_packet(ctx)
                },
                |qp, t, active| {
                    let Some((_, ack_next)) = t else { return };
                    if *ack_next {
                        // The ACK held for this request goes right after it
                        // (one GSO send: see `proto::ack`).
                        active.retain(|&q| q != qpn);
                        qp.queued = true;
                        active.push_front(qpn);
                    } else if !qp.queued {
                        qp.queued = true;
                        active.push_back(qpn);
                    }
                },
            );
            if self.parked > 0
                && self.qps.get(&qpn).is_some_and(|s| s.copies.waiting.is_none() && !s.copies.parked.is_empty())
            {
                // Its packet build went first (`copy_done`): now what was
                // parked.
                self.resume(now, qpn);
            }
            if let Some(Some((t, _))) = t {
                return Some(t);
            }
        }
        None
    }

    /// Says that packets were handed to the kernel (the send call that
    /// carried them returned, whatever it returned): the unreliable sends'
    /// completions that waited for them are delivered (see [`AfterSend`]).
    /// A consumer of [`Transmit`]s of an engine that sends in place calls
    /// this with each one's `after_send`.
    pub fn sent(&mut self, now: Instant, packets: impl IntoIterator<Item = AfterSend>) {
        for a in packets {
            self.with_qp(now, a.qpn, |qp, ctx| qp.on_sent(ctx, a.seq));
        }
    }

    /// Gives back the buffer of a packet that was sent (a [`Transmit`]'s
    /// `data`), to be reused for a later packet.
    pub fn recycle(&mut self, buf: Vec<u8>) {
        if self.spare.len() < MAX_SPARE {
            self.spare.push(buf);
        }
    }

    #[cfg_attr(not(feature = "unstable"), allow(dead_code))]
    /// Whether some QP may have a packet to send.
    pub fn has_transmit(&self) -> bool {
        !self.active.is_empty() || !self.gsi_out.is_empty()
    }

    /// The earliest timer deadline, if any (the heap's top: O(1)).
    pub fn poll_timeout(&self) -> Option<Instant> {
        self.timers.peek().map(|e| e.0 .0)
    }

    /// Fires every timer due at `now`, earliest first (then by QPN).
    pub fn handle_timeout(&mut self, now: Instant) {
        let mut due: SmallVec<[u32; 8]> = SmallVec::new();
        while let Some(&Reverse(top)) = self.timers.peek() {
            if top.0 > now {
                break;
            }
            self.timers.pop();
            if self.timer_live(top) {
                due.push(top.1);
            }
        }
        for qpn in due {
            // Its entry is gone: fired, the QP's timer is re-entered below
            // (by `with_qp`) if it still runs.
            if let Some(QpSlot { qp, .. }) = self.qps.get_mut(&qpn) {
                if qp.timer_key.take().is_some() {
                    self.timed -= 1;
                }
            }
            self.with_qp(now, qpn, |qp, ctx| {
                qp.on_ack_timer(ctx);
                qp.on_timer(ctx);
            });
        }
        self.prune_timers();
    }

    pub fn poll_event(&mut self) -> Option<Event> {
        self.events.pop_front()
    }

    #[cfg_attr(not(feature = "unstable"), allow(dead_code))]
    /// The wire packet length of a message of `len` bytes on this engine (for
    /// sizing buffers).
    pub fn max_packet_len(&self) -> usize {
        wire::packet_len(wire::BTH_LEN + 28, self.cfg.mtu.bytes().max(4096) as usize)
    }
}
