//! Where the application is, as far as receiving goes: the policy that says
//! who reads a device's socket, the progress thread or an application
//! thread, and how long the progress thread may sleep. Sans-IO: the I/O
//! layer reports what application threads do (a poll of a CQ, a wait on a
//! completion channel, a CQ armed or fired) with a `now`, and asks.
//!
//! It decides from what is known, not from timing alone:
//! - an application thread that polls a CQ receives for the device in its
//!   own thread (`Runtime::try_progress`); while it polled within
//!   [`POLL_GRACE`] and no CQ is armed, the progress thread leaves the
//!   socket to it rather than wake on every packet and fight over the locks;
//! - an application thread blocked in `ibv_get_cq_event` is a *waiter*: it
//!   waits on the socket (and the same-host link's doorbells) beside its
//!   channel and receives when a packet comes (one wake-up per message, as
//!   a blocking `recv`), so the progress thread leaves them to it too, and, for [`POLL_GRACE`] after a
//!   waiter that slept left, to its coming back (an application that waits
//!   in `ibv_get_cq_event` re-arms, polls and posts between two waits);
//! - otherwise an armed CQ means an application waits for a completion
//!   event in its own `poll`/`epoll` on the channel's fd (libfabric, event
//!   loops; their `ibv_get_cq_event` finds the event there and never
//!   sleeps): it is not polling, whatever it did a moment ago, so the
//!   progress thread watches the socket, and arming a CQ wakes a progress
//!   thread that slept without it.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

/// How long after an application poll the application counts as polling
/// (and as about to answer: an ACK may be held for its next post).
pub const POLL_GRACE: Duration = Duration::from_micros(500);

/// What application threads of one device are doing.
#[derive(Debug, Default)]
pub struct Presence {
    /// When an application thread last polled or left a wait (nanoseconds
    /// since [`origin`] plus one; 0: never).
    polled_at: AtomicU64,
    /// Application threads blocked on a completion channel, receiving.
    waiters: AtomicUsize,
    /// When a waiter that slept last left (as `polled_at`).
    waited_at: AtomicU64,
    /// Until when the latest waiter's sleep lasts at most (as `polled_at`):
    /// a waiter that never leaves (its thread cancelled in the wait, as
    /// `pthread_cancel` may) stops counting once it passed.
    waiter_lease: AtomicU64,
    /// CQs armed (`ibv_req_notify_cq`) whose event has not fired.
    armed: AtomicUsize,
}

/// How the progress thread may sleep.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ThreadSleep {
    /// Whether it waits on the socket (else an application thread reads it).
    pub watch_socket: bool,
    /// Longest sleep besides its timers (an application that stops polling
    /// is covered within it).
    pub cap: Option<Duration>,
}

fn origin() -> Instant {
    static O: OnceLock<Instant> = OnceLock::new();
    *O.get_or_init(Instant::now)
}

fn raw(t: Instant) -> u64 {
    t.saturating_duration_since(origin()).as_nanos() as u64 + 1
}

/// Whether `t` (as [`raw`]; 0: never) is less than [`POLL_GRACE`] before `now`.
fn within_grace(t: u64, now: Instant) -> bool {
    t != 0 && raw(now) < t.saturating_add(POLL_GRACE.as_nanos() as u64)
}

impl Presence {
    /// An application thread polled a CQ at `now`.
    pub fn polled(&self, now: Instant) {
        self.polled_at.store(raw(now), Ordering::Relaxed);
    }

    /// An application thread starts waiting on a completion channel (and
    /// the socket).
    pub fn waiter_enters(&self) {
        self.waiters.fetch_add(1, Ordering::SeqCst);
    }

    /// A waiter leaves at `now`: its application is about to poll and
    /// answer, as after a poll. `slept`: it waited (the event was not there
    /// when it came), so its application waits in `ibv_get_cq_event`.
    pub fn waiter_leaves(&self, now: Instant, slept: bool) {
        self.polled(now);
        if slept {
            self.waited_at.store(raw(now), Ordering::SeqCst);
        }
        self.waiters.fetch_sub(1, Ordering::SeqCst);
    }

    /// A waiter goes to sleep until `until` at the latest.
    pub fn waiter_sleeps_until(&self, until: Instant) {
        self.waiter_lease.fetch_max(raw(until), Ordering::SeqCst);
    }

    /// A CQ went from unarmed to armed.
    pub fn cq_armed(&self) {
        self.armed.fetch_add(1, Ordering::SeqCst);
    }

    /// An armed CQ fired its event or went away.
    pub fn cq_disarmed(&self) {
        self.armed.fetch_sub(1, Ordering::SeqCst);
    }

    fn recent(&self, now: Instant) -> bool {
        within_grace(self.polled_at.load(Ordering::Relaxed), now)
    }

    /// Whether a waiter is there, or one that slept left within the grace.
    fn waiting(&self, now: Instant) -> bool {
        let lease = self.waiter_lease.load(Ordering::SeqCst);
        (self.waiters.load(Ordering::SeqCst) > 0 && raw(now) < lease)
            || within_grace(self.waited_at.load(Ordering::SeqCst), now)
    }

    /// Whether an application thread polls (lately, and waits for no event).
    pub fn app_polls(&self, now: Instant) -> bool {
        self.armed.load(Ordering::SeqCst) == 0 && self.recent(now)
    }

    /// Whether an application thread reads the socket: one polls, or a
    /// waiter waits on it. Its passes fire due timers, so a new deadline
    /// need not wake the progress thread.
    pub fn app_receives(&self, now: Instant) -> bool {
        self.waiting(now) || self.app_polls(now)
    }

    /// Whether the application is there to answer what arrives (an ACK
    /// may be held for its next post, see `proto::ack`).
    pub fn app_active(&self, now: Instant) -> bool {
        self.waiting(now) || self.recent(now)
    }

    /// How the progress thread sleeps at `now`.
    pub fn thread_sleep(&self, now: Instant) -> ThreadSleep {
        let receives = self.app_receives(now);
        ThreadSleep { watch_socket: !receives, cap: receives.then_some(POLL_GRACE) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A `now` not before the clock's origin (an instant read before the
    /// origin is set would clamp to it).
    fn start() -> Instant {
        origin();
        Instant::now()
    }

    #[test]
    fn nobody_there_the_thread_watches_the_socket_without_a_cap() {
        let p = Presence::default();
        let now = start();
        assert_eq!(p.thread_sleep(now), ThreadSleep { watch_socket: true, cap: None });
        assert!(!p.app_active(now));
    }

    #[test]
    fn a_poll_leaves_the_socket_to_the_application_for_the_grace() {
        let p = Presence::default();
        let now = start();
        p.polled(now);
        assert_eq!(p.thread_sleep(now), ThreadSleep { watch_socket: false, cap: Some(POLL_GRACE) });
        assert!(p.app_active(now));
        let later = now + POLL_GRACE;
        assert_eq!(p.thread_sleep(later), ThreadSleep { watch_socket: true, cap: None }, "stopped polling");
    }

    #[test]
    fn an_armed_cq_means_the_application_waits_for_an_event_not_polls() {
        let p = Presence::default();
        let now = start();
        p.polled(now);
        p.cq_armed();
        assert!(!p.app_polls(now));
        assert!(p.thread_sleep(now).watch_socket, "the event depends on someone receiving");
        assert!(p.app_active(now), "it answers once woken");
        p.cq_disarmed();
        assert!(!p.thread_sleep(now).watch_socket);
    }

    #[test]
    fn a_waiter_holds_the_socket_even_with_its_cq_armed() {
        let p = Presence::default();
        let now = start();
        p.cq_armed();
        p.waiter_enters();
        p.waiter_sleeps_until(now + 20 * POLL_GRACE);
        let later = now + 10 * POLL_GRACE;
        assert_eq!(p.thread_sleep(later), ThreadSleep { watch_socket: false, cap: Some(POLL_GRACE) });
        assert!(p.app_receives(later) && p.app_active(later));
        p.waiter_leaves(later, true);
        p.cq_armed(); // re-armed after the event, as ibv_rc_pingpong -e
        assert!(!p.app_polls(later));
        assert!(!p.thread_sleep(later).watch_socket, "it comes back to wait");
        assert!(p.thread_sleep(later + POLL_GRACE).watch_socket, "it did not come back");
    }

    #[test]
    fn a_waiter_cancelled_in_its_sleep_stops_counting_when_the_sleep_would_end() {
        let p = Presence::default();
        let now = start();
        p.waiter_enters();
        p.waiter_sleeps_until(now + POLL_GRACE);
        assert!(!p.thread_sleep(now).watch_socket);
        // Never leaves.
        assert!(p.thread_sleep(now + POLL_GRACE).watch_socket);
    }

    #[test]
    fn a_wait_that_found_its_event_says_nothing_of_the_next() {
        let p = Presence::default();
        let now = start();
        p.cq_armed();
        p.waiter_enters();
        p.waiter_leaves(now, false); // poll said readable; get_event took it
        assert!(p.thread_sleep(now).watch_socket, "the application waits in its own poll");
    }
}
