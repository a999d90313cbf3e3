//! The runtime of one device: its engine shards, media, progress thread
//! and capture.
//!
//! A device's QPs are spread over [`SHARDS`] engines
//! by QP number, each behind its own locks (see [`super::shard`]): posts,
//! receives and completions on QPs of different shards run in parallel.
//! A receive pass parses and checks every datagram (ICRC included) before
//! it takes any lock, then hands each shard its packets, in arrival order,
//! under that shard's locks once per batch. Events are delivered after
//! every lock is released. Packets travel by the device's media
//! (`io::medium`: the same-host link, then UDP for what no other medium
//! takes), which the runtime drives without knowing which it has. The lock order is in docs/architecture.md
//! ("Locks").

use super::copier::{Copier, JobDone};
use super::shard::{shard_of, AtomicInstant, Shard, SHARDS};
use super::medium::{Medium, PeerStats, Runs, RxBuffer};
use super::socket::{GSO_MAX_BYTES, GSO_MAX_SEGMENTS};
use super::{Capture, RoceSocket};
use crate::ib::{Errno, Error, Result};
use crate::lock_order::{Ordered, Rank};
use crate::mem::Memory;
use crate::proto::presence::{Presence, POLL_GRACE};
use crate::proto::qp::QpInit;
use crate::proto::srq::SharedRecvQueue;
use crate::proto::{
    check_datagram, dest_qpn, first_qpn, qpn_after, AfterSend, CopyJob, Engine, EngineConfig, Event, QpSummary, Received, RxIds, Stats,
    Transmit,
};
use crate::wire::IpInfo;
use smallvec::SmallVec;
use std::io;
use std::net::SocketAddr;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, RwLock, Weak};
use std::time::{Duration, Instant};

/// Receives the engine's events (completion notifications, async events).
/// Called with no lock of the runtime held: it may call into the device,
/// and drop it.
pub trait EventSink: Send + Sync {
    fn event(&self, ev: Event);
}

#[derive(Debug, Clone)]
pub struct RuntimeConfig {
    pub engine: EngineConfig,
    /// Write every packet sent and received to this pcap file.
    pub capture: Option<PathBuf>,
    /// Spin on the socket instead of sleeping (lower latency, one busy core).
    pub busy_poll: bool,
    /// Inject faults into received packets (testing).
    pub faults: Option<super::faults::FaultConfig>,
}

/// Longest the progress thread sleeps when nothing is due: every new
/// deadline earlier than its sleep wakes it (`sleeping_until`), as do
/// shutdown, an armed CQ while it sleeps blind, and the media's packets,
/// so an idle device's thread wakes once a minute (was every 200 ms).
const MAX_SLEEP: Duration = Duration::from_secs(60);
/// Longest one sleep of an application thread waiting on a completion
/// channel (`wait_receiving`): its lease as the receiver ends with it, so a
/// waiter cancelled in its sleep (`pthread_cancel` in `ibv_get_cq_event`)
/// leaves the media to the progress thread at most this long.
const WAIT_SLICE: Duration = Duration::from_millis(200);
/// Longest sleep while timers are pending (their granularity).
const TICK: Duration = Duration::from_millis(1);
/// Most QPs of a device.
const MAX_QPS: usize = 0x10000;

/// The receiving side's reusable storage.
struct RxState {
    /// Each medium's receive buffer, in the order of `Runtime::media`.
    bufs: Vec<Box<dyn RxBuffer>>,
    /// A pass's datagrams by shard: (shard, index), sorted stably.
    order: Vec<(u16, u32)>,
    /// IPv4 IDs of received datagrams, per peer (see [`check_datagram`]).
    rx_ids: RxIds,
}

pub struct Runtime {
    cfg: EngineConfig,
    shards: Box<[Shard]>,
    /// Each shard's earliest timer as of its last pass, side by side (eight
    /// cache lines that an empty poll reads).
    deadlines: Box<[AtomicInstant]>,
    /// The next QP number to try (shared by the shards, so that numbers
    /// stay unique and start where the device's seed says).
    next_qpn: AtomicU32,
    qp_count: AtomicUsize,
    /// Receive buffers; holding the lock makes a thread the receiver.
    rx: Ordered<Mutex<RxState>>,
    /// The device's UDP address (its identity on every medium).
    local: SocketAddr,
    /// The media, in the order they are offered packets: UDP, which takes
    /// every run left, last.
    media: Box<[Box<dyn Medium>]>,
    wake: OwnedFd,
    sink: RwLock<Option<Weak<dyn EventSink>>>,
    /// Packet capture, switchable while running (`uroce capture`).
    capture: RwLock<Option<Capture>>,
    capturing: AtomicBool,
    faults: Option<super::faults::FaultLayer>,
    busy_poll: bool,
    shutdown: AtomicBool,
    /// Until when the progress thread sleeps (none while awake). The
    /// thread stores it before it reads the shards' deadlines a last time,
    /// and a pass stores its shard's deadline before it reads this (both
    /// sequentially consistent): either the pass sees the sleep and wakes
    /// the thread for an earlier deadline, or the thread sees the deadline.
    sleeping_until: AtomicInstant,
    /// What application threads do: the policy of who reads the socket
    /// (`proto::presence`).
    presence: Arc<Presence>,
    /// Whether the progress thread sleeps without the socket in its set (an
    /// armed CQ then wakes it).
    blind: AtomicBool,
    thread: Mutex<Option<std::thread::JoinHandle<()>>>,
    /// Runs the engines' copy jobs outside every lock (`io::copier`).
    copier: Arc<Copier>,
    me: Weak<Runtime>,
}

impl std::fmt::Debug for Runtime {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Runtime").field("local", &self.local).finish_non_exhaustive()
    }
}

impl Runtime {
    /// Binds the device's socket and starts its progress thread.
    pub fn start(cfg: RuntimeConfig, mem: Arc<Memory>) -> io::Result<Arc<Runtime>> {
        let socket = RoceSocket::bind(SocketAddr::new(cfg.engine.addr, cfg.engine.port))?;
        // SAFETY: eventfd has no memory preconditions; we own the new fd.
        let fd = unsafe { libc::eventfd(0, libc::EFD_NONBLOCK | libc::EFD_CLOEXEC) };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: fd is a fresh descriptor that nothing else owns.
        let wake = unsafe { OwnedFd::from_raw_fd(fd) };
        let capture = match &cfg.capture {
            Some(p) => Some(Capture::create(p)?),
            None => None,
        };
        let mut cfg = cfg;
        // Copies that may block run on the copy workers (`io::copier`).
        cfg.engine.defer_blocking_copies = true;
        let shards = (0..SHARDS).map(|_| Shard::new(Engine::new(cfg.engine.clone(), mem.clone()))).collect();
        let local = socket.local_addr();
        // The same-host link first (it takes the runs for linked peers),
        // UDP last (it takes the rest).
        let mut media: Vec<Box<dyn Medium>> = Vec::new();
        if let Some(l) = super::link::Links::start(local, wake.as_raw_fd())? {
            media.push(Box::new(l));
        }
        media.push(Box::new(super::udp::Udp::new(socket)));
        let copier = Arc::new(Copier::new(mem.clone()));
        let rt = Arc::new_cyclic(|me| Runtime {
            copier,
            me: me.clone(),
            next_qpn: AtomicU32::new(first_qpn(cfg.engine.id_seed)),
            cfg: cfg.engine,
            shards,
            deadlines: (0..SHARDS).map(|_| AtomicInstant::default()).collect(),
            qp_count: AtomicUsize::new(0),
            rx: Ordered::new(
                Rank::Rx,
                Mutex::new(RxState {
                    bufs: media.iter().map(|m| m.rx_buffer()).collect(),
                    order: Vec::new(),
                    rx_ids: RxIds::new(),
                }),
            ),
            local,
            media: media.into_boxed_slice(),
            wake,
            sink: RwLock::new(None),
            capturing: AtomicBool::new(capture.is_some()),
            capture: RwLock::new(capture),
            faults: cfg.faults.map(super::faults::FaultLayer::new),
            busy_poll: cfg.busy_poll,
            shutdown: AtomicBool::new(false),
            sleeping_until: AtomicInstant::default(),
            presence: Arc::default(),
            blind: AtomicBool::new(false),
            thread: Mutex::new(None),
        });
        let weak = Arc::downgrade(&rt);
        let handle = std::thread::Builder::new().name("uroce-progress".into()).spawn(move || progress_loop(weak))?;
        *rt.thread.lock().unwrap() = Some(handle);
        Ok(rt)
    }

    pub fn local_addr(&self) -> SocketAddr {
        self.local
    }

    /// Per-peer medium and counters, from the media that keep them (the
    /// same-host link: empty when it is off).
    pub fn link_stats(&self) -> Vec<PeerStats> {
        self.media.iter().flat_map(|m| m.peer_stats()).collect()
    }

    /// Each medium's device-wide counters, by medium name.
    pub fn medium_counters(&self) -> Vec<(&'static str, Vec<(&'static str, u64)>)> {
        self.media.iter().map(|m| (m.name(), m.counters())).collect()
    }

    pub fn set_sink(&self, sink: Weak<dyn EventSink>) {
        *self.sink.write().unwrap() = Some(sink);
    }

    /// The configuration every shard's engine has.
    pub fn config(&self) -> &EngineConfig {
        &self.cfg
    }

    fn shard(&self, qpn: u32) -> &Shard {
        &self.shards[shard_of(qpn)]
    }

    /// Runs `f` on the engine shard holding QP `qpn`, for queries (no
    /// packets, no timers). Holds that shard's engine lock only.
    pub fn query<R>(&self, qpn: u32, f: impl FnOnce(&Engine) -> R) -> R {
        f(&self.shard(qpn).engine.lock())
    }

    /// Runs `f` on the engine shard holding QP `qpn`, then sends what it
    /// produced and delivers its events (after releasing the locks).
    pub fn pump<R>(&self, qpn: u32, f: impl FnOnce(&mut Engine, Instant) -> R) -> R {
        let mut events = Vec::new();
        let r = self.run(shard_of(qpn), &mut events, f);
        self.dispatch(events);
        r
    }

    /// Creates a QP with the next free QP number (unique across shards).
    pub fn create_qp(&self, init: QpInit) -> Result<u32> {
        self.new_qp(|e, qpn| e.create_qp_at(qpn, init.clone()))
    }

    /// An XRC_RECV QP of XRC domain `xrcd` (see
    /// [`Engine::create_xrc_recv_qp`]).
    pub fn create_xrc_recv_qp(&self, xrcd: u32, scatter_to_cqe: bool) -> Result<u32> {
        self.new_qp(|e, qpn| e.create_xrc_recv_qp_at(qpn, xrcd, scatter_to_cqe))
    }

    /// The GSI QP (QP 1) of the device's CM agent (see
    /// [`Engine::create_gsi_qp`]).
    pub fn create_gsi_qp(&self, init: QpInit) -> Result<u32> {
        self.claim_qp()?;
        let r = self.shard(crate::wire::mad::GSI_QPN).engine.lock().create_gsi_qp(init);
        if r.is_err() {
            self.qp_count.fetch_sub(1, Ordering::Relaxed);
        }
        r
    }

    fn claim_qp(&self) -> Result<()> {
        if self.qp_count.fetch_add(1, Ordering::Relaxed) >= MAX_QPS {
            self.qp_count.fetch_sub(1, Ordering::Relaxed);
            return Err(Error::new(Errno::ENOMEM, "create_qp: too many QPs"));
        }
        Ok(())
    }

    /// Gives `make` the next QP number that its shard does not hold, under
    /// that shard's engine lock. At most `MAX_QPS` numbers are taken, so a
    /// free one comes within `MAX_QPS + 1` tries (twice that bounds the
    /// tries that concurrent creations take from each other).
    fn new_qp(&self, make: impl FnOnce(&mut Engine, u32) -> Result<()>) -> Result<u32> {
        self.claim_qp()?;
        for _ in 0..2 * (MAX_QPS + 1) {
            let qpn = self.next_qpn.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |q| Some(qpn_after(q)));
            let qpn = qpn.unwrap_or_else(|q| q);
            let mut e = self.shard(qpn).engine.lock();
            if e.has_qp(qpn) {
                continue;
            }
            let r = make(&mut e, qpn).map(|()| qpn);
            if r.is_err() {
                self.qp_count.fetch_sub(1, Ordering::Relaxed);
            }
            return r;
        }
        self.qp_count.fetch_sub(1, Ordering::Relaxed);
        Err(Error::new(Errno::ENOMEM, "create_qp: no free QP number"))
    }

    /// Destroys a QP; what it acknowledged leaves as it goes (the engine
    /// queues the ACK it held, and this pass sends it: an application
    /// often destroys its QPs right after its last receive, then exits).
    pub fn destroy_qp(&self, qpn: u32) -> Result<()> {
        let mut events = Vec::new();
        let r = self.run(shard_of(qpn), &mut events, |e, _| e.destroy_qp(qpn));
        if r.is_ok() {
            self.qp_count.fetch_sub(1, Ordering::Relaxed);
        }
        self.dispatch(events);
        r
    }

    /// Makes an XRC SRQ reachable by its number in every shard (an XRC
    /// request names it, whichever QP it reaches).
    pub fn register_xrc_srq(&self, srq: &Arc<SharedRecvQueue>) {
        for s in self.shards.iter() {
            s.engine.lock().register_xrc_srq(srq);
        }
    }

    pub fn unregister_xrc_srq(&self, srqn: u32) {
        for s in self.shards.iter() {
            s.engine.lock().unregister_xrc_srq(srqn);
        }
    }

    /// The device's counters: the sum over the shards.
    pub fn stats(&self) -> Stats {
        let mut s = Stats::default();
        for sh in self.shards.iter() {
            s.add(&sh.engine.lock().stats());
        }
        s
    }

    pub fn qp_count(&self) -> usize {
        self.shards.iter().map(|s| s.engine.lock().qp_count()).sum()
    }

    /// Every QP with its state and counters, by QP number.
    pub fn qp_summaries(&self) -> Vec<QpSummary> {
        let mut v: Vec<QpSummary> = self.shards.iter().flat_map(|s| s.engine.lock().qp_summaries()).collect();
        v.sort_by_key(|q| q.qpn);
        v
    }

    /// The earliest timer of the device as of each shard's last pass.
    pub fn next_timeout(&self) -> Option<Instant> {
        self.deadlines.iter().filter_map(|d| d.load(Ordering::SeqCst)).min()
    }

    /// Runs `f` on shard `s`'s engine under its send lock, sends what it
    /// produced (under the send lock still: each QP's packets in order) and
    /// collects its events into `events`, for the caller to deliver after
    /// it released every lock.
    fn run<R>(&self, s: usize, events: &mut Vec<Event>, f: impl FnOnce(&mut Engine, Instant) -> R) -> R {
        let shard = &self.shards[s];
        let mut tx = shard.tx.lock();
        let now = Instant::now();
        let mut out = std::mem::take(&mut tx.out);
        let mut jobs: SmallVec<[Box<CopyJob>; 1]> = SmallVec::new();
        let (r, deadline) = {
            let mut e = shard.engine.lock();
            for buf in tx.sent.drain(..) {
                e.recycle(buf);
            }
            let r = f(&mut e, now);
            while let Some(t) = e.poll_transmit(now) {
                out.push(t);
            }
            while let Some(ev) = e.poll_event() {
                events.push(ev);
            }
            while let Some(j) = e.poll_copy() {
                jobs.push(j);
            }
            (r, e.poll_timeout())
        };
        self.deadlines[s].store(deadline, Ordering::SeqCst);
        let after: SmallVec<[AfterSend; 4]> = out.iter().filter_map(Transmit::after_send).collect();
        self.send_all(&mut out);
        if !after.is_empty() {
            // The kernel has the bytes of the packets sent in place: their
            // sends may complete (and the application reuse the buffers).
            let mut e = shard.engine.lock();
            e.sent(now, after);
            while let Some(ev) = e.poll_event() {
                events.push(ev);
            }
        }
        tx.sent.extend(out.drain(..).map(|t| t.data));
        tx.out = out;
        drop(tx);
        if !jobs.is_empty() {
            self.copier.submit(jobs, self.me.clone());
        }
        if let Some(d) = deadline {
            // Asleep past the new deadline: wake. Awake (None): it will see
            // the deadline (see `progress_once`). While an application thread
            // receives (polls, or waits on the socket), its own passes fire
            // due timers (a held ACK's among them, armed on every message it
            // is to answer): no wake-up, which would cost it a context switch
            // per message, as long as the thread's sleep was planned for that
            // application (at most `presence::POLL_GRACE`, after which it
            // takes the timers over from an application that stopped
            // calling). A longer sleep began before the application came: it
            // is woken once, and plans anew.
            let asleep = self.sleeping_until.load(Ordering::SeqCst);
            let covered = |s| s <= now + POLL_GRACE + TICK && self.presence.app_receives(now);
            if asleep.is_some_and(|s| d < s && !covered(s)) {
                self.wake();
            }
        }
        r
    }

    /// Starts capturing every packet into a new pcap file at `path`
    /// (replacing a capture in progress), or stops with `None`.
    pub fn set_capture(&self, path: Option<&std::path::Path>) -> io::Result<()> {
        let c = path.map(Capture::create).transpose()?;
        let mut g = self.capture.write().unwrap();
        self.capturing.store(c.is_some(), Ordering::Release);
        *g = c;
        Ok(())
    }

    /// Whether packets are being captured.
    pub fn is_capturing(&self) -> bool {
        self.capturing.load(Ordering::Acquire)
    }

    /// Sends packets in order: runs for one destination (see [`gso_runs`])
    /// go to the first medium that carries them (UDP, last, takes every run
    /// left, as GSO sends batched into `sendmmsg` calls).
    fn send_all(&self, out: &mut [Transmit]) {
        let mut runs: Runs = gso_runs(out);
        for r in &runs {
            self.record_sent(&out[r.clone()]);
        }
        for m in self.media.iter() {
            if runs.is_empty() {
                break;
            }
            m.send(out, &mut runs);
        }
    }

    /// Capture records a GSO send's packets, the k-th with IP ID k.
    fn record_sent(&self, batch: &[Transmit]) {
        let guard = self.capturing.load(Ordering::Acquire).then(|| self.capture.read().unwrap());
        if let Some(c) = guard.as_deref().and_then(|c| c.as_ref()) {
            let local = self.local;
            for (k, t) in batch.iter().enumerate() {
                let id = if t.dst.is_ipv4() { k as u16 } else { 0 };
                let ip =
                    IpInfo { src: local.ip(), dst: t.dst.ip(), sport: local.port(), dport: t.dst.port(), ipv4_id: id };
                c.record(&ip, &t.bytes());
            }
        }
    }

    /// Delivers events to the sink; called with no lock held.
    fn dispatch(&self, events: Vec<Event>) {
        if events.is_empty() {
            return;
        }
        let sink = self.sink.read().unwrap().as_ref().and_then(|w| w.upgrade());
        if let Some(sink) = sink {
            for ev in events {
                sink.event(ev);
            }
        }
    }

    fn wake(&self) {
        let one: u64 = 1;
        // SAFETY: writes 8 bytes from a valid u64 to our eventfd.
        unsafe { libc::write(self.wake.as_raw_fd(), (&one as *const u64).cast(), 8) };
    }

    /// Stops the progress thread (also done on drop), after sending the
    /// ACKs held for an answer that will not come. Callable from an event
    /// callback: callbacks run after every lock is released.
    pub fn shutdown(&self) {
        let mut events = Vec::new();
        for s in 0..self.shards.len() {
            if self.shards[s].engine.lock().has_held_acks() {
                self.run(s, &mut events, |e, now| e.flush_acks(now));
            }
        }
        self.dispatch(events);
        self.shutdown.store(true, Ordering::SeqCst);
        self.copier.shutdown();
        self.wake();
        let h = self.thread.lock().unwrap().take();
        if let Some(h) = h {
            if h.thread().id() != std::thread::current().id() {
                let _ = h.join();
            }
        }
        if let Some(c) = self.capture.read().unwrap().as_ref() {
            c.flush();
        }
    }

    pub fn capture_flush(&self) {
        if let Some(c) = self.capture.read().unwrap().as_ref() {
            c.flush();
        }
    }

    /// Receives and handles what the socket holds, and fires due timers, in
    /// the calling thread, unless another thread is receiving. Called by
    /// pollers of an empty CQ: with busy-polling applications on few cores,
    /// waiting for the progress thread to be scheduled would cost
    /// milliseconds. Returns whether anything was received.
    ///
    /// The engines are told that an application is there to answer
    /// ([`Engine::set_app_active`]): a QP may hold an ACK for the answer, to
    /// go right after it in the same system call (`proto::ack`). An ACK
    /// sent at once would cost the application a system call between the
    /// data's arrival and its view of it, and would reach the peer before
    /// the answer; a NIC sends it beside the host's work, and uroce's host
    /// is the application thread.
    pub fn try_progress(&self) -> bool {
        let now = Instant::now();
        self.presence.polled(now);
        let mut events = Vec::new();
        let got = match self.rx.try_lock() {
            Some(mut rx) => self.receive(&mut rx, now, true, &mut events),
            None => return false,
        };
        self.dispatch(events);
        got
    }

    /// What application threads of this device do (CQs count their arm
    /// state in it).
    pub fn presence(&self) -> &Arc<Presence> {
        &self.presence
    }

    /// A CQ of this device was armed: an application waits for its event.
    /// A progress thread asleep without the socket (left to a poller) is
    /// woken to watch it, unless a waiter reads it.
    pub fn cq_armed(&self) {
        if self.blind.load(Ordering::SeqCst) && !self.presence.app_receives(Instant::now()) {
            self.wake();
        }
    }

    /// Waits, in an application thread, until `fd` (a completion channel's)
    /// is readable, receiving for the device meanwhile: the thread sleeps
    /// on the media (the socket, the same-host link's doorbells) beside
    /// `fd` and runs a receive pass when a packet comes or a timer is due,
    /// so a completion it produces wakes nobody else, and the progress
    /// thread leaves the media to it (`proto::presence`). Returns true once `fd` is readable (or `ready`
    /// says so after a pass) or the device shuts down, false at `deadline`;
    /// fails as `ppoll` does (EINTR: a signal came, as a blocking `read` of
    /// `fd` would report it).
    pub fn wait_receiving(
        &self,
        fd: std::os::fd::RawFd,
        deadline: Option<Instant>,
        ready: impl Fn() -> bool,
    ) -> io::Result<bool> {
        self.presence.waiter_enters();
        let mut slept = false;
        // A busy-polling progress thread reads the media itself.
        let media = !self.busy_poll;
        let mut fds: SmallVec<[libc::pollfd; 4]> = std::iter::once(fd)
            .chain(self.media.iter().map(|m| m.poll_fd()).filter(|_| media))
            .map(|fd| libc::pollfd { fd, events: libc::POLLIN, revents: 0 })
            .collect();
        let r = loop {
            if self.shutdown.load(Ordering::SeqCst) {
                break Ok(true);
            }
            let now = Instant::now();
            let mut timeout = self.sleep_for(now, None).min(WAIT_SLICE);
            if let Some(d) = deadline {
                if now >= d {
                    break Ok(false);
                }
                timeout = timeout.min(d - now);
            }
            self.presence.waiter_sleeps_until(now + timeout + TICK);
            // Announced to the media as the progress thread's sleep is (a
            // same-host peer then rings the doorbell); packets already
            // waiting cancel it.
            if media && self.media.iter().fold(false, |w, m| m.sleep() | w) {
                timeout = Duration::ZERO;
            }
            for p in fds.iter_mut() {
                p.revents = 0;
            }
            let ts = libc::timespec { tv_sec: timeout.as_secs() as _, tv_nsec: timeout.subsec_nanos() as _ };
            // SAFETY: fds is a valid array of `fds.len()` pollfd; ts a valid timespec.
            let n = unsafe { libc::ppoll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, &ts, std::ptr::null()) };
            if media {
                for (m, p) in self.media.iter().zip(&fds[1..]) {
                    m.woke(p.revents != 0);
                }
            }
            if n < 0 {
                break Err(io::Error::last_os_error());
            }
            if fds[0].revents != 0 {
                break Ok(true);
            }
            slept = true;
            // Another thread receiving (the progress thread, woken by the
            // same datagram) completes what it brings: its event wakes us.
            if let Some(mut rx) = self.rx.try_lock() {
                let mut events = Vec::new();
                self.receive(&mut rx, Instant::now(), true, &mut events);
                drop(rx);
                self.dispatch(events);
                if ready() {
                    break Ok(true);
                }
            } else {
                let mut one = [libc::pollfd { fd, events: libc::POLLIN, revents: 0 }];
                let ts = libc::timespec { tv_sec: 0, tv_nsec: 50_000 };
                // SAFETY: one valid pollfd; ts a valid timespec.
                unsafe { libc::ppoll(one.as_mut_ptr(), 1, &ts, std::ptr::null()) };
            }
        };
        self.presence.waiter_leaves(Instant::now(), slept);
        r
    }

    /// Whether some shard's timer is due at `now`.
    fn timer_due(&self, now: Instant) -> bool {
        let now = AtomicInstant::raw(now);
        self.deadlines.iter().any(|d| d.is_due(now))
    }

    /// Receives what the media hold, and runs the engines on it and on due
    /// timers; `now` is the caller's recent clock reading, `app_active`
    /// whether an application thread is there to answer what arrives.
    /// Events go to `events`, for the caller to deliver once it released
    /// `rx`.
    fn receive(&self, rx: &mut RxState, now: Instant, app_active: bool, events: &mut Vec<Event>) -> bool {
        let RxState { bufs, order, rx_ids } = rx;
        // In order: a medium that reads by system call may skip a read
        // while one before it delivers (see `io::udp`).
        // A medium that holds packets back for a later one (a new link)
        // has the later ones read in full.
        let (mut active, mut holding) = (false, false);
        for (m, b) in self.media.iter().zip(bufs.iter_mut()) {
            m.recv(b.as_mut(), now, active && !holding);
            active |= !b.is_empty() || m.active(now);
            holding |= m.holding();
        }
        let all = || bufs.iter().flat_map(|b| (0..b.len()).map(|i| b.get(i)));
        let n: usize = bufs.iter().map(|b| b.len()).sum();
        let guard = self.capturing.load(Ordering::Acquire).then(|| self.capture.read().unwrap());
        if let Some(c) = guard.as_deref().and_then(|c| c.as_ref()) {
            // Packets of every medium get the same synthesized headers.
            for (from, data) in all() {
                let local = self.local;
                let mut ip =
                    IpInfo { src: from.ip(), dst: local.ip(), sport: from.port(), dport: local.port(), ipv4_id: 0 };
                // The pcap needs the real ID for the ICRC to check out.
                use crate::wire::icrc;
                ip.ipv4_id = icrc::find_ipv4_id(&ip, data, 0).or_else(|| icrc::solve_ipv4_id(&ip, data)).unwrap_or(0);
                c.record(&ip, data);
            }
        }
        drop(guard);
        if self.media.len() > 1 {
            for (k, m) in self.media.iter().enumerate() {
                let mut others = bufs
                    .iter()
                    .enumerate()
                    .filter(|&(j, _)| j != k)
                    .flat_map(|(_, b)| (0..b.len()).map(|i| b.get(i)))
                    .map(|(from, d)| (from, d.len()));
                m.count_elsewhere(&mut others);
            }
        }
        let due = self.timer_due(now);
        if let Some(f) = &self.faults {
            // Through the fault layer: owned copies, some dropped, held back,
            // duplicated or corrupted.
            let mut owned = Vec::with_capacity(n);
            f.release(now, &mut owned);
            for (from, data) in all() {
                f.receive(now, from, data, &mut owned);
            }
            if owned.is_empty() && !due {
                return n > 0;
            }
            let items: Vec<(SocketAddr, &[u8])> = owned.iter().map(|(from, d)| (*from, &d[..])).collect();
            self.deliver(now, &items, order, rx_ids, app_active, events);
            return true;
        }
        if n == 0 && !due {
            return false;
        }
        let items: SmallVec<[(SocketAddr, &[u8]); 8]> = all().collect();
        self.deliver(now, &items, order, rx_ids, app_active, events);
        n > 0
    }

    /// Hands received datagrams to their shards: grouped by shard (a stable
    /// sort on the destination QPN, read without parsing: each QP's
    /// datagrams stay in arrival order), the smallest groups first (a
    /// latency-sensitive QP's one packet does not wait behind another
    /// QP's bulk in the same batch), each group parsed and checked
    /// (ICRC) before its shard is locked, then handled under the lock,
    /// once per batch. Then fires the due timers of every shard.
    fn deliver(
        &self,
        now: Instant,
        items: &[(SocketAddr, &[u8])],
        order: &mut Vec<(u16, u32)>,
        rx_ids: &mut RxIds,
        app_active: bool,
        events: &mut Vec<Event>,
    ) {
        let local = self.local.ip();
        order.clear();
        order.extend(items.iter().enumerate().map(|(i, (_, d))| (shard_of(dest_qpn(d).unwrap_or(0)) as u16, i as u32)));
        order.sort_by_key(|&(s, _)| s); // stable
        let mut groups: SmallVec<[&[(u16, u32)]; 8]> = order.chunk_by(|a, b| a.0 == b.0).collect();
        groups.sort_by_key(|g| g.len()); // stable
        for group in groups {
            let checked: SmallVec<[Received; 4]> = group
                .iter()
                .map(|&(_, k)| {
                    let (from, data) = items[k as usize];
                    check_datagram(&self.cfg, from, local, data, rx_ids)
                })
                .collect();
            self.run(usize::from(group[0].0), events, |e, now| {
                e.set_app_active(app_active);
                for r in &checked {
                    e.handle_received(now, r);
                }
                if e.poll_timeout().is_some_and(|t| t <= now) {
                    e.handle_timeout(now);
                }
            });
        }
        let raw_now = AtomicInstant::raw(now);
        for (s, d) in self.deadlines.iter().enumerate() {
            if d.is_due(raw_now) {
                self.run(s, events, |e, now| {
                    if e.poll_timeout().is_some_and(|t| t <= now) {
                        e.handle_timeout(now);
                    }
                });
            }
        }
    }

    #[cfg(feature = "unstable")]
    /// Counters of the fault layer, when one is configured.
    pub fn fault_stats(&self) -> Option<super::faults::FaultStats> {
        self.faults.as_ref().map(|f| f.stats())
    }

    /// How long the progress thread may sleep at `now` (at most `cap`).
    fn sleep_for(&self, now: Instant, cap: Option<Duration>) -> Duration {
        let next =
            [self.next_timeout(), self.faults.as_ref().and_then(|f| f.next_release())].into_iter().flatten().min();
        // With timers pending, wake at least every TICK: then a new, later
        // deadline (a retransmission timer armed by a post) needs no
        // eventfd wake-up, which on two cores costs the poster a context
        // switch per operation.
        let mut timeout = match next {
            Some(d) => d.saturating_duration_since(now).min(TICK),
            None => MAX_SLEEP,
        };
        if let Some(c) = cap {
            timeout = timeout.min(c);
        }
        timeout
    }

    /// One round of the progress loop; returns false when shutting down.
    fn progress_once(&self) -> bool {
        if self.shutdown.load(Ordering::SeqCst) {
            return false;
        }
        let now = Instant::now();
        // While an application thread receives for us (it polls a CQ,
        // `try_progress`, or waits on the socket, `wait_receiving`), leave
        // the socket to it instead of waking on every packet and fighting
        // over the locks (`proto::presence`).
        let mut plan = self.presence.thread_sleep(now);
        if !plan.watch_socket && !self.busy_poll {
            self.blind.store(true, Ordering::SeqCst);
            // A CQ armed before it could see `blind` (see `cq_armed`).
            plan = self.presence.thread_sleep(now);
            self.blind.store(!plan.watch_socket, Ordering::SeqCst);
        }
        let app_polling = !plan.watch_socket;
        let mut timeout = self.sleep_for(now, plan.cap);
        if !self.busy_poll {
            self.sleeping_until.store(Some(now + timeout), Ordering::SeqCst);
            // A pass that published an earlier deadline before it could see
            // the sleep (see `sleeping_until`).
            let again = self.sleep_for(now, plan.cap);
            if again < timeout {
                timeout = again;
                self.sleeping_until.store(Some(now + timeout), Ordering::SeqCst);
            }
        }
        // A sleep that nobody else's receiving covers is announced to the
        // media (a peer then rings its doorbell); packets already waiting
        // cancel it. An application thread that polls a CQ drains every
        // medium; one that waits on a completion channel
        // (`wait_receiving`) sleeps on every medium itself.
        let media_sleep = !self.busy_poll && !app_polling;
        if media_sleep {
            let waiting = self.media.iter().fold(false, |w, m| m.sleep() | w);
            if waiting {
                timeout = Duration::ZERO;
            }
        } else if self.presence.app_polls(now) {
            for m in self.media.iter() {
                m.polled(); // a poller finds the packets: no doorbell
            }
        }
        if !self.busy_poll {
            let mut fds: SmallVec<[libc::pollfd; 4]> = std::iter::once(self.wake.as_raw_fd())
                .chain(self.media.iter().map(|m| m.poll_fd()))
                .map(|fd| libc::pollfd { fd, events: libc::POLLIN, revents: 0 })
                .collect();
            // The wake eventfd, then the media, unless an application
            // thread receives from them.
            let nfds = if media_sleep { fds.len() } else { 1 };
            let ts = libc::timespec { tv_sec: timeout.as_secs() as _, tv_nsec: timeout.subsec_nanos() as _ };
            // SAFETY: fds is a valid array of at least `nfds` pollfd; ts a valid timespec.
            unsafe { libc::ppoll(fds.as_mut_ptr(), nfds as libc::nfds_t, &ts, std::ptr::null()) };
            self.sleeping_until.store(None, Ordering::SeqCst);
            self.blind.store(false, Ordering::SeqCst);
            if media_sleep {
                for (m, p) in self.media.iter().zip(&fds[1..]) {
                    m.woke(p.revents != 0);
                }
            }
            if fds[0].revents != 0 {
                let mut v: u64 = 0;
                // SAFETY: reads 8 bytes into a valid u64 from our eventfd.
                unsafe { libc::read(self.wake.as_raw_fd(), (&mut v as *mut u64).cast(), 8) };
            }
        }
        if self.shutdown.load(Ordering::SeqCst) {
            return false;
        }
        // An application thread holding the receive lock is receiving, and
        // its pass handles due timers too: do not queue behind it.
        let rx = if app_polling { self.rx.try_lock() } else { Some(self.rx.lock()) };
        let mut events = Vec::new();
        // While an application calls in, its next post is near: the engines
        // may hold this pass's ACKs for it too (`proto::ack` bounds the hold).
        let now = Instant::now();
        let app_active = self.presence.app_active(now);
        let got = rx.is_some_and(|mut rx| self.receive(&mut rx, now, app_active, &mut events));
        self.dispatch(events);
        if self.busy_poll && !got {
            std::hint::spin_loop();
        }
        true
    }
}

impl Drop for Runtime {
    fn drop(&mut self) {
        self.shutdown.store(true, Ordering::SeqCst);
        self.copier.shutdown();
    }
}

impl JobDone for Runtime {
    /// A copy worker ran `job`: its QP takes the result and goes on.
    fn job_done(&self, job: Box<CopyJob>) {
        self.pump(job.qpn(), |e, now| e.copy_done(now, job));
    }
}

/// Splits packets, in order, into the runs that go as one UDP GSO send each
/// (each segment keeps its own headers and ICRC; for IPv4 the k-th segment
/// of a send carries IP ID k, so its ICRC is rewritten here).
///
/// A run is for one destination and ends at a longer packet: GSO needs
/// equal segments but for a shorter last one, and a multi-packet message's
/// FIRST packet is 16 bytes longer (its RETH). An answer and the ACKs made
/// with it share a run: the kernel delivers a GSO send's
/// segments together at its end, so a peer that waits for both its data and
/// its send completion (perftest's `ib_write_lat`, `ibv_rc_pingpong`) has
/// them at once. Sent as separate messages, the answer would arrive ≈ 0.35 µs
/// sooner and the ACK ≈ 1.5 µs later: `ib_write_lat` measured 1.5–2 µs more.
fn gso_runs(out: &mut [Transmit]) -> SmallVec<[std::ops::Range<usize>; 8]> {
    let mut runs = SmallVec::new();
    let mut i = 0;
    while i < out.len() {
        let (dst, seg) = (out[i].dst, out[i].len());
        let mut j = i + 1;
        let mut bytes = seg;
        while j < out.len()
            && j - i < GSO_MAX_SEGMENTS
            && out[j].dst == dst
            && out[j].len() <= seg
            && bytes + out[j].len() <= GSO_MAX_BYTES
        {
            bytes += out[j].len();
            j += 1;
            if out[j - 1].len() < seg {
                break; // a shorter segment ends a GSO send
            }
        }
        if dst.is_ipv4() {
            for (k, t) in out[i..j].iter_mut().enumerate().skip(1) {
                t.set_ipv4_id(k as u16);
            }
        }
        runs.push(i..j);
        i = j;
    }
    runs
}

fn progress_loop(rt: Weak<Runtime>) {
    loop {
        let Some(rt) = rt.upgrade() else { return };
        if !rt.progress_once() {
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::Opcode;

    /// A packet of `len` bytes with `op` (an ACK's AETH syndrome is 0: ACK).
    fn packet(op: Opcode, len: usize, dst: &str) -> Transmit {
        let mut data = vec![0u8; len];
        data[0] = op.0;
        Transmit { dst: dst.parse().unwrap(), data, in_place: None }
    }

    fn runs(out: &mut [Transmit]) -> Vec<std::ops::Range<usize>> {
        gso_runs(out).into_vec()
    }

    /// A sink that calls back into the runtime from the callback (a pump
    /// on the same shard, the device-wide queries, a receive pass) and then
    /// tears it down as the verbs layer's device does when its last handle
    /// goes (shutdown, drop): a callback run under any of the runtime's
    /// locks would deadlock here.
    struct Reenter {
        rt: Mutex<Option<Arc<Runtime>>>,
        qpn: u32,
        seen: std::sync::atomic::AtomicUsize,
    }

    impl EventSink for Reenter {
        fn event(&self, _ev: Event) {
            self.seen.fetch_add(1, Ordering::SeqCst);
            let rt = self.rt.lock().unwrap().take();
            if let Some(rt) = rt {
                rt.pump(self.qpn, |e, _| assert!(e.has_qp(self.qpn)));
                assert_eq!(rt.qp_count(), 1);
                let _ = (rt.stats(), rt.qp_summaries(), rt.next_timeout());
                rt.try_progress();
                rt.destroy_qp(self.qpn).unwrap();
                rt.shutdown();
                drop(rt);
            }
        }
    }

    #[test]
    fn a_callback_may_reenter_the_runtime_and_drop_its_last_reference() {
        use crate::ib::{QpAttrMask, QpState, QpType};
        use crate::proto::cq::CompletionQueue;
        use crate::proto::wr::{QpAttr, QpCap, RecvWr};
        let mut ecfg = EngineConfig::new("127.0.0.1".parse().unwrap(), 0, crate::ib::Mtu::Mtu1024);
        ecfg.id_seed = 7;
        let cfg = RuntimeConfig { engine: ecfg, capture: None, busy_poll: false, faults: None };
        let rt = Runtime::start(cfg, Memory::new()).unwrap();
        let cq = Arc::new(CompletionQueue::new(1, 16));
        let cap = QpCap { max_send_wr: 4, max_recv_wr: 4, max_send_sge: 1, max_recv_sge: 1, max_inline_data: 0 };
        let init = QpInit {
            qp_type: QpType::Rc,
            pd: 1,
            send_cq: cq.clone(),
            recv_cq: cq.clone(),
            srq: None,
            cap,
            sq_sig_all: false,
            scatter_to_cqe: false,
        };
        let qpn = rt.create_qp(init).unwrap();
        let init_attr = QpAttr { qp_state: QpState::Init, port_num: 1, ..QpAttr::default() };
        let mask = QpAttrMask::STATE | QpAttrMask::PKEY_INDEX | QpAttrMask::PORT | QpAttrMask::ACCESS_FLAGS;
        rt.pump(qpn, |e, now| e.modify_qp(now, qpn, &init_attr, mask)).unwrap();
        rt.pump(qpn, |e, now| e.post_recv(now, qpn, RecvWr { wr_id: 1, sg_list: Default::default() })).unwrap();
        let sink = Arc::new(Reenter { rt: Mutex::new(Some(rt.clone())), qpn, seen: Default::default() });
        let dyn_sink: Arc<dyn EventSink> = sink.clone();
        rt.set_sink(Arc::downgrade(&dyn_sink));
        cq.arm(false);
        let weak = Arc::downgrade(&rt);
        // The flush completion's notification runs the sink in the thread
        // that pumps, which then holds the last reference.
        let pumping = rt.clone();
        drop(rt);
        let err = QpAttr { qp_state: QpState::Err, ..QpAttr::default() };
        let (tx, rx) = std::sync::mpsc::channel();
        let worker = std::thread::spawn(move || {
            pumping.pump(qpn, |e, now| e.modify_qp(now, qpn, &err, QpAttrMask::STATE)).unwrap();
            drop(pumping);
            tx.send(()).unwrap();
        });
        rx.recv_timeout(Duration::from_secs(10)).expect("deadlock: a callback ran under a runtime lock");
        worker.join().unwrap();
        assert_eq!(sink.seen.load(Ordering::SeqCst), 1, "one completion notification");
        assert!(weak.upgrade().is_none(), "the sink dropped the last reference");
    }

    const A: &str = "127.0.0.2:4791";
    const B: &str = "127.0.0.3:4791";

    #[test]
    fn equal_packets_for_one_destination_share_a_send_with_a_shorter_last() {
        let w = |len| packet(Opcode::RC_WRITE_MIDDLE, len, A);
        let mut out = vec![w(4124), w(4124), w(4124), w(1000), w(1000)];
        assert_eq!(runs(&mut out), [0..4, 4..5]);
        let mut out = vec![w(100), w(116), packet(Opcode::RC_WRITE_MIDDLE, 100, B)];
        assert_eq!(runs(&mut out), [0..1, 1..2, 2..3], "a longer packet or another destination ends a run");
    }

    #[test]
    fn an_answer_and_the_acks_after_it_share_a_send() {
        let mut out =
            vec![packet(Opcode::RC_WRITE_ONLY, 108, A), packet(Opcode::RC_ACK, 20, A), packet(Opcode::RC_ACK, 20, A)];
        let ack_icrc = out[1].data[16..].to_vec();
        assert_eq!(runs(&mut out), vec![0..2_usize, 2..3], "a shorter segment ends a send");
        assert_ne!(out[1].data[16..], ack_icrc[..], "the ACK is the send's second segment: IPv4 ID 1");
    }

    #[test]
    fn the_kth_segment_of_a_send_gets_the_icrc_for_ipv4_id_k() {
        let mut out: Vec<_> = (0..3).map(|_| packet(Opcode::RC_WRITE_MIDDLE, 64, A)).collect();
        let before: Vec<Vec<u8>> = out.iter().map(|t| t.data.clone()).collect();
        assert_eq!(runs(&mut out), vec![0..3_usize]);
        assert_eq!(out[0].data, before[0]);
        for k in 1..3 {
            let mut want = before[k].clone();
            crate::wire::icrc::rewrite_for_ipv4_id(&mut want[60..], 64, k as u16);
            assert_eq!(out[k].data, want);
            assert_ne!(out[k].data, before[k]);
        }
    }
}
