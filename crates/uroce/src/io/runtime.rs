//! The runtime of one device: engine, socket, progress thread, capture.

use super::socket::{Datagram, RecvBatch, GSO_MAX_BYTES, GSO_MAX_SEGMENTS};
use super::{Capture, RoceSocket};
use crate::mem::Memory;
use crate::proto::{AfterSend, Engine, EngineConfig, Event, Transmit};
use crate::wire::IpInfo;
use smallvec::SmallVec;
use std::io;
use std::net::SocketAddr;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, RwLock, Weak};
use std::time::{Duration, Instant};

/// Receives the engine's events (completion notifications, async events).
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

/// Longest the progress thread sleeps without re-checking its timers.
const MAX_SLEEP: Duration = Duration::from_millis(200);
/// How long after an application poll the progress thread leaves the
/// socket to the application.
const APP_POLL_GRACE: Duration = Duration::from_micros(500);

/// An `Option<Instant>` readable without a lock (nanoseconds since a
/// process-wide origin; 0 = none).
#[derive(Default)]
struct AtomicInstant(std::sync::atomic::AtomicU64);

impl AtomicInstant {
    fn origin() -> Instant {
        static O: std::sync::OnceLock<Instant> = std::sync::OnceLock::new();
        *O.get_or_init(Instant::now)
    }
    fn store(&self, t: Option<Instant>, o: Ordering) {
        let v = t.map_or(0, |t| t.saturating_duration_since(Self::origin()).as_nanos() as u64 + 1);
        self.0.store(v, o);
    }
    fn load(&self, o: Ordering) -> Option<Instant> {
        match self.0.load(o) {
            0 => None,
            v => Some(Self::origin() + Duration::from_nanos(v - 1)),
        }
    }
}

/// Longest sleep while timers are pending (their granularity).
const TICK: Duration = Duration::from_millis(1);
/// Receive buffers filled per `recvmmsg` (each may hold a GRO batch), all
/// handled under one engine lock.
const RX_BATCH: usize = 64;

/// What an engine pass does with the plain ACKs that receive passes held
/// back (see [`Runtime::try_progress`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Held {
    /// Send them: explicit flushes, and the progress thread while no
    /// application calls in.
    Flush,
    /// Posts and other calls: send them right after this pass's packets,
    /// in the same system call (the application's answer, then the ACKs);
    /// keep them if it made none.
    Keep,
    /// A receive pass while an application calls in: hold this pass's own
    /// packets if they are all plain ACKs (and the application is seen to
    /// answer what it receives); keep those held earlier for at most
    /// [`ACK_HOLD_MAX`].
    HoldNew,
}

/// Longest a held ACK waits for the application to post its answer.
const ACK_HOLD_MAX: Duration = Duration::from_micros(20);
/// Longest the progress thread sleeps while ACKs are held and no
/// application polls (one that polls sends them itself).
const ACK_HOLD_WAIT: Duration = Duration::from_micros(200);
/// An application that polled a CQ this recently is taken to call again
/// soon: the progress thread holds ACKs for it.
const APP_ACTIVE: Duration = Duration::from_millis(2);

/// The receiving side's reusable storage.
struct RxState {
    batch: RecvBatch,
    /// The datagrams in its filled buffers: (buffer, offset, length, sender).
    got: Vec<(usize, usize, usize, SocketAddr)>,
    /// LINK HOOK: packets taken out of the shared-memory rings.
    shm: super::link::RxBuf,
}

/// The sending side's reusable storage.
#[derive(Default)]
struct TxState {
    /// The packets of one engine pass (kept for its capacity).
    out: Vec<Transmit>,
    /// Buffers of sent packets, handed back to the engine on its next pass.
    sent: Vec<Vec<u8>>,
    /// Plain ACKs made by receive passes while an application calls in
    /// (see [`Runtime::try_progress`]), and since when the oldest waits.
    held: Vec<Transmit>,
    held_since: Option<Instant>,
    /// Whether the application answers what it receives (it posted within
    /// ACK_HOLD_MAX of the last receive that made ACKs): only then are ACKs
    /// held. A receiver that never posts gets its ACKs out at once.
    expect_answer: bool,
    /// When a receive pass last sent the ACKs it made without holding them.
    acks_sent_at: Option<Instant>,
}

pub struct Runtime {
    engine: Mutex<Engine>,
    /// Receive buffers; holding the lock makes a thread the receiver.
    rx: Mutex<RxState>,
    socket: RoceSocket,
    /// Held while a thread runs the engine and sends what it produced, so
    /// that packets leave in the order the engine made them.
    tx: Mutex<TxState>,
    wake: OwnedFd,
    sink: RwLock<Option<Weak<dyn EventSink>>>,
    /// Packet capture, switchable while running (`uroce capture`).
    capture: RwLock<Option<Capture>>,
    capturing: AtomicBool,
    faults: Option<super::faults::FaultLayer>,
    busy_poll: bool,
    shutdown: AtomicBool,
    /// Until when the progress thread sleeps (none while awake); stored
    /// under the engine lock, so a pass that changed the engine after the
    /// thread looked at it sees the sleep and wakes it for an earlier
    /// deadline.
    sleeping_until: AtomicInstant,
    /// When an application thread last polled for completions.
    app_poll_at: AtomicInstant,
    /// When a receive pass should send the held ACKs, if no answer of the
    /// application's has taken them along before; `None` while none are
    /// held (read without the transmit lock).
    held_due: AtomicInstant,
    /// The engine's earliest timer as of its last pass, so that an empty
    /// poll needs no engine lock (timers armed outside a pass are the
    /// progress thread's to find).
    next_deadline: AtomicInstant,
    thread: Mutex<Option<std::thread::JoinHandle<()>>>,
    /// LINK HOOK: the same-host shared-memory link (see `io::link`); None
    /// when off (`UROCE_LINK=udp`) or not available.
    link: Option<super::link::Links>,
}

impl std::fmt::Debug for Runtime {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Runtime").field("local", &self.socket.local_addr()).finish_non_exhaustive()
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
        // LINK HOOK: advertise this device for same-host peers; peers ring
        // our wake eventfd as their doorbell.
        let link = super::link::Links::start(socket.local_addr(), wake.as_raw_fd())?;
        let rt = Arc::new(Runtime {
            engine: Mutex::new(Engine::new(cfg.engine, mem)),
            rx: Mutex::new(RxState {
                batch: RecvBatch::new(RX_BATCH, 65536),
                got: Vec::with_capacity(RX_BATCH),
                shm: Default::default(),
            }),
            socket,
            tx: Mutex::new(TxState { expect_answer: true, ..TxState::default() }),
            wake,
            sink: RwLock::new(None),
            capturing: AtomicBool::new(capture.is_some()),
            capture: RwLock::new(capture),
            faults: cfg.faults.map(super::faults::FaultLayer::new),
            busy_poll: cfg.busy_poll,
            shutdown: AtomicBool::new(false),
            sleeping_until: AtomicInstant::default(),
            app_poll_at: AtomicInstant::default(),
            held_due: AtomicInstant::default(),
            next_deadline: AtomicInstant::default(),
            thread: Mutex::new(None),
            link,
        });
        let weak = Arc::downgrade(&rt);
        let handle = std::thread::Builder::new().name("uroce-progress".into()).spawn(move || progress_loop(weak))?;
        *rt.thread.lock().unwrap() = Some(handle);
        Ok(rt)
    }

    pub fn local_addr(&self) -> SocketAddr {
        self.socket.local_addr()
    }

    /// LINK HOOK: per-peer medium and counters of the shared-memory link
    /// (empty when it is off).
    pub fn link_stats(&self) -> Vec<super::link::LinkStats> {
        self.link.as_ref().map(|l| l.stats()).unwrap_or_default()
    }

    pub fn set_sink(&self, sink: Weak<dyn EventSink>) {
        *self.sink.write().unwrap() = Some(sink);
    }

    /// The engine, for queries and setup calls that produce no packets.
    pub fn engine(&self) -> MutexGuard<'_, Engine> {
        self.engine.lock().unwrap()
    }

    /// Runs `f` on the engine, then sends what it produced and delivers its
    /// events. Held ACKs (see [`Runtime::try_progress`]) go right after what
    /// it produced, or stay held if it produced nothing.
    pub fn pump<R>(&self, f: impl FnOnce(&mut Engine, Instant) -> R) -> R {
        self.pump_with(Held::Keep, f)
    }

    fn pump_with<R>(&self, held: Held, f: impl FnOnce(&mut Engine, Instant) -> R) -> R {
        let mut tx = self.tx.lock().unwrap();
        let now = Instant::now();
        let mut out = std::mem::take(&mut tx.out);
        out.append(&mut tx.held);
        let earlier = out.len();
        let mut events = Vec::new();
        let (r, deadline) = {
            let mut e = self.engine.lock().unwrap();
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
            (r, e.poll_timeout())
        };
        let made = &out[earlier..];
        let only_acks = !made.is_empty() && made.iter().all(Transmit::is_plain_ack);
        let (keep_earlier, hold_made) = match held {
            Held::Flush => (false, false),
            Held::Keep if made.is_empty() => (true, false),
            Held::Keep => {
                tx.expect_answer |= tx.acks_sent_at.is_some_and(|t| now < t + ACK_HOLD_MAX);
                // The answer first, then the ACKs, in one system call: the
                // peer sees its data before the ACK it may be waiting on
                // (unless this pass made responses, which follow the ACKs).
                if earlier > 0 && out[earlier..].iter().all(Transmit::is_request) {
                    out.rotate_left(earlier);
                }
                (false, false)
            }
            Held::HoldNew => {
                let young = tx.held_since.is_some_and(|t| now < t + ACK_HOLD_MAX);
                if earlier > 0 && !young {
                    // Waited in vain: this application does not answer.
                    tx.expect_answer = false;
                }
                let hold_made = only_acks && tx.expect_answer;
                if only_acks && !hold_made {
                    tx.acks_sent_at = Some(now);
                }
                // Responses go at once, after the ACKs before them.
                (young && (made.is_empty() || hold_made), hold_made)
            }
        };
        // `tx.held` is empty here; what it gets stays in the order made.
        if keep_earlier {
            tx.held.extend(out.drain(..earlier));
        } else {
            tx.held_since = None;
        }
        if hold_made {
            let from = if keep_earlier { 0 } else { earlier };
            tx.held.extend(out.drain(from..));
        }
        if tx.held.is_empty() {
            tx.held_since = None;
        } else if tx.held_since.is_none() {
            tx.held_since = Some(now);
        }
        self.held_due.store(tx.held_since.map(|t| t + ACK_HOLD_MAX), Ordering::Release);
        self.next_deadline.store(deadline, Ordering::Relaxed);
        let after: SmallVec<[AfterSend; 4]> = out.iter().filter_map(Transmit::after_send).collect();
        self.send_all(&mut out);
        if !after.is_empty() {
            // The kernel has the bytes of the packets sent in place: their
            // sends may complete (and the application reuse the buffers).
            let mut e = self.engine.lock().unwrap();
            e.sent(now, after);
            while let Some(ev) = e.poll_event() {
                events.push(ev);
            }
        }
        tx.sent.extend(out.drain(..).map(|t| t.data));
        tx.out = out;
        self.dispatch(events);
        if let Some(d) = deadline {
            // Asleep past the new deadline: wake. Awake (None): it will see
            // the deadline (see `progress_once`).
            if self.sleeping_until.load(Ordering::Acquire).is_some_and(|s| d < s) {
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

    /// Sends packets in order, batching runs for one destination into UDP
    /// GSO sends (see [`gso_runs`]) and the GSO sends into `sendmmsg` calls.
    fn send_all(&self, out: &mut [Transmit]) {
        let runs = gso_runs(out);
        for r in &runs {
            self.record_sent(&out[r.clone()]);
        }
        let segs: SmallVec<[Datagram; 8]> = out.iter().map(|t| Datagram::new(t.parts())).collect();
        // LINK HOOK: a run for a linked peer goes through its ring instead.
        let groups: SmallVec<[(SocketAddr, &[Datagram]); 8]> = runs
            .into_iter()
            .filter(|r| !self.link.as_ref().is_some_and(|l| l.send(&out[r.clone()])))
            .map(|r| (out[r.start].dst, &segs[r]))
            .collect();
        if groups.is_empty() {
            return;
        }
        self.send_with_retry(&groups);
    }

    /// Capture records a GSO send's packets, the k-th with IP ID k.
    fn record_sent(&self, batch: &[Transmit]) {
        let guard = self.capturing.load(Ordering::Acquire).then(|| self.capture.read().unwrap());
        if let Some(c) = guard.as_deref().and_then(|c| c.as_ref()) {
            let local = self.socket.local_addr();
            for (k, t) in batch.iter().enumerate() {
                let id = if t.dst.is_ipv4() { k as u16 } else { 0 };
                let ip =
                    IpInfo { src: local.ip(), dst: t.dst.ip(), sport: local.port(), dport: t.dst.port(), ipv4_id: id };
                c.record(&ip, &t.bytes());
            }
        }
    }

    fn send_with_retry(&self, mut groups: &[(SocketAddr, &[Datagram])]) {
        let mut attempt = 0;
        while !groups.is_empty() && attempt < 64 {
            match self.socket.send_groups(groups) {
                Ok(n) => groups = &groups[n..],
                Err(e) if matches!(e.raw_os_error(), Some(libc::EAGAIN) | Some(libc::ENOBUFS)) => {
                    attempt += 1;
                    if attempt > 8 {
                        std::thread::sleep(Duration::from_micros(20));
                    } else {
                        std::thread::yield_now();
                    }
                }
                Err(e) => {
                    // Loss is recovered by the transport; say why once in a
                    // while, and go on with the other destinations.
                    tracing::debug!(dst = %groups[0].0, "send failed: {e}");
                    groups = &groups[1..];
                }
            }
        }
        if !groups.is_empty() {
            tracing::debug!("send buffer full; packets dropped");
        }
    }

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

    /// Stops the progress thread (also done on drop).
    pub fn shutdown(&self) {
        self.flush_held();
        self.shutdown.store(true, Ordering::SeqCst);
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
    /// The plain ACKs this makes are held (see `Held`): the application's
    /// next post sends them right after its own packets, in the same system
    /// call; not taken along within `ACK_HOLD_MAX` (20 µs), they go with the
    /// next receive pass, and the progress thread sends what is held when it
    /// wakes. An ACK sent at once would cost the application a system call
    /// between the data's arrival and its view of it, and would reach the
    /// peer before the answer; a NIC sends it beside the host's work, and
    /// uroce's host is the application thread.
    pub fn try_progress(&self) -> bool {
        let now = Instant::now();
        self.app_poll_at.store(Some(now), Ordering::Relaxed);
        let Ok(mut rx) = self.rx.try_lock() else { return false };
        self.receive(&mut rx, now, true)
    }

    /// Whether ACKs are held (see [`Runtime::try_progress`]).
    fn acks_held(&self) -> bool {
        self.held_due.load(Ordering::Acquire).is_some()
    }

    /// Sends the ACKs that an application thread's receive held.
    pub fn flush_held(&self) {
        if self.acks_held() {
            self.pump_with(Held::Flush, |_, _| {});
        }
    }

    /// Receives what the socket holds and runs the engine on it, on due
    /// timers and on held ACKs; `now` is the caller's recent clock reading.
    fn receive(&self, rx: &mut RxState, now: Instant, hold_acks: bool) -> bool {
        let RxState { batch, got, shm } = rx;
        got.clear();
        if let Err(e) = self.socket.recv_batch(batch) {
            tracing::debug!("receive failed: {e}");
        }
        // LINK HOOK: also take what the shared-memory rings hold.
        shm.clear();
        if let Some(l) = &self.link {
            l.drain(shm);
        }
        let held = if hold_acks { Held::HoldNew } else { Held::Flush };
        // A pass for held ACKs alone only when they are to go: while they
        // wait, an empty poll stays cheap.
        let send_held = match self.held_due.load(Ordering::Acquire) {
            Some(due) => !hold_acks || due <= now,
            None => false,
        };
        let local = self.socket.local_addr();
        for (b, r) in batch.filled().iter().enumerate() {
            match r.seg {
                None => got.push((b, 0, r.len, r.from)),
                Some(seg) => {
                    // GRO merged datagrams: split them. Each IPv4 segment
                    // carries the ID its sender's GSO send gave it (see
                    // wire::icrc::find_ipv4_id); the engine finds which
                    // while it checks the ICRC.
                    for off in (0..r.len).step_by(seg) {
                        got.push((b, off, seg.min(r.len - off), r.from));
                    }
                }
            }
        }
        let guard = self.capturing.load(Ordering::Acquire).then(|| self.capture.read().unwrap());
        if let Some(c) = guard.as_deref().and_then(|c| c.as_ref()) {
            let udp = got.iter().map(|&(b, off, n, from)| (from, &batch.bytes(b)[off..off + n]));
            // LINK HOOK: packets by memory get the same synthesized headers.
            for (from, data) in udp.chain(shm.iter()) {
                let mut ip =
                    IpInfo { src: from.ip(), dst: local.ip(), sport: from.port(), dport: local.port(), ipv4_id: 0 };
                // The pcap needs the real ID for the ICRC to check out.
                ip.ipv4_id = crate::wire::icrc::find_ipv4_id(&ip, data, 0).unwrap_or(0);
                c.record(&ip, data);
            }
        }
        drop(guard);
        if let Some(l) = self.link.as_ref().filter(|_| !got.is_empty()) {
            l.count_udp_rx(got.iter().map(|&(_, _, n, from)| (from, n)));
        }
        if let Some(f) = &self.faults {
            // Through the fault layer: owned copies, some dropped, held back,
            // duplicated or corrupted.
            let mut owned = Vec::with_capacity(got.len());
            f.release(now, &mut owned);
            for &(b, off, n, from) in got.iter() {
                f.receive(now, from, &batch.bytes(b)[off..off + n], &mut owned);
            }
            for (from, data) in shm.iter() {
                f.receive(now, from, data, &mut owned);
            }
            let due = self.next_deadline.load(Ordering::Relaxed).is_some_and(|t| t <= now);
            if owned.is_empty() && !due && !send_held {
                return !got.is_empty() || !shm.is_empty();
            }
            self.pump_with(held, |e, now| {
                for (from, data) in &owned {
                    e.handle_datagram(now, *from, local.ip(), data);
                }
                if e.poll_timeout().is_some_and(|t| t <= now) {
                    e.handle_timeout(now);
                }
            });
            return true;
        }
        let due = self.next_deadline.load(Ordering::Relaxed).is_some_and(|t| t <= now);
        if got.is_empty() && shm.is_empty() && !due && !send_held {
            return false;
        }
        self.pump_with(held, |e, now| {
            for &(b, off, n, from) in got.iter() {
                e.handle_datagram(now, from, local.ip(), &batch.bytes(b)[off..off + n]);
            }
            for (from, data) in shm.iter() {
                e.handle_datagram(now, from, local.ip(), data);
            }
            if e.poll_timeout().is_some_and(|t| t <= now) {
                e.handle_timeout(now);
            }
        });
        !got.is_empty() || !shm.is_empty()
    }

    /// Counters of the fault layer, when one is configured.
    pub fn fault_stats(&self) -> Option<super::faults::FaultStats> {
        self.faults.as_ref().map(|f| f.stats())
    }

    /// One round of the progress loop; returns false when shutting down.
    fn progress_once(&self) -> bool {
        if self.shutdown.load(Ordering::SeqCst) {
            return false;
        }
        let now = Instant::now();
        // While an application thread polls a CQ of this device it receives
        // for us (`try_progress`): leave the socket to it instead of waking
        // on every packet and fighting over the locks.
        let app_polling = self.app_poll_at.load(Ordering::Relaxed).is_some_and(|t| now < t + APP_POLL_GRACE);
        let timeout = {
            // Computed and published under the engine lock, so that `pump`
            // either sees this sleep (and wakes us for an earlier deadline)
            // or changed the engine before we looked.
            let e = self.engine.lock().unwrap();
            let deadline = e.poll_timeout();
            self.next_deadline.store(deadline, Ordering::Relaxed);
            // With timers pending, wake at least every TICK: then a new,
            // later deadline (a retransmission timer armed by a post) needs
            // no eventfd wake-up, which on two cores costs the poster a
            // context switch per operation.
            let next = [deadline, self.faults.as_ref().and_then(|f| f.next_release())].into_iter().flatten().min();
            let mut timeout = match next {
                Some(d) => d.saturating_duration_since(now).min(TICK),
                None => MAX_SLEEP,
            };
            if app_polling {
                timeout = timeout.min(APP_POLL_GRACE);
            }
            if !app_polling && self.acks_held() {
                // (While the application polls, its own passes send them.)
                timeout = timeout.min(ACK_HOLD_WAIT);
            }
            if !self.busy_poll {
                self.sleeping_until.store(Some(now + timeout), Ordering::Release);
            }
            timeout
        };
        // LINK HOOK: a sleep that nobody else's polling covers is announced
        // in the rings (producers then ring the wake eventfd); packets
        // already there cancel it.
        let link_sleeps = !self.busy_poll && !app_polling && self.link.is_some();
        let timeout = match &self.link {
            Some(l) if link_sleeps && l.sleep() => Duration::ZERO,
            Some(l) if !link_sleeps => {
                l.woke(); // a poller finds the packets: no doorbell
                timeout
            }
            _ => timeout,
        };
        if !self.busy_poll {
            let mut fds = [
                libc::pollfd { fd: self.wake.as_raw_fd(), events: libc::POLLIN, revents: 0 },
                libc::pollfd { fd: self.socket.as_raw_fd(), events: libc::POLLIN, revents: 0 },
            ];
            let nfds = if app_polling { 1 } else { 2 };
            let ts = libc::timespec { tv_sec: timeout.as_secs() as _, tv_nsec: timeout.subsec_nanos() as _ };
            // SAFETY: fds is a valid array of at least `nfds` pollfd; ts a valid timespec.
            unsafe { libc::ppoll(fds.as_mut_ptr(), nfds, &ts, std::ptr::null()) };
            self.sleeping_until.store(None, Ordering::Release);
            if let Some(l) = self.link.as_ref().filter(|_| link_sleeps) {
                l.woke(); // LINK HOOK
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
        // its pass handles due timers and held ACKs too: do not queue behind
        // it.
        let rx = if app_polling { self.rx.try_lock().ok() } else { Some(self.rx.lock().unwrap()) };
        // While an application calls in, its next receive pass is near: hold
        // the plain ACKs of this pass for it too (this thread sends them
        // itself after at most ACK_HOLD_WAIT), so that they leave after the
        // application's answer. An application that spins on its buffer and
        // polls a CQ only for its own send completions (perftest's
        // `ib_write_lat`) then finds the peer's next message received by
        // the time its completion comes, instead of waiting for this thread.
        let now = Instant::now();
        let app_active = self.app_poll_at.load(Ordering::Relaxed).is_some_and(|t| now < t + APP_ACTIVE);
        let got = rx.is_some_and(|mut rx| self.receive(&mut rx, now, app_active));
        if self.busy_poll && !got {
            std::hint::spin_loop();
        }
        true
    }
}

impl Drop for Runtime {
    fn drop(&mut self) {
        self.shutdown.store(true, Ordering::SeqCst);
    }
}

/// Splits packets, in order, into the runs that go as one UDP GSO send each
/// (each segment keeps its own headers and ICRC; for IPv4 the k-th segment
/// of a send carries IP ID k, so its ICRC is rewritten here).
///
/// A run is for one destination and ends at a longer packet: GSO needs
/// equal segments but for a shorter last one, and a multi-packet message's
/// FIRST packet is 16 bytes longer (its RETH). An answer and the ACKs held
/// for it (see [`Held::Keep`]) share a run: the kernel delivers a GSO send's
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
