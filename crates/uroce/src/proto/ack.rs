//! The responder's delayed-ACK policy: one held ACK per QP, its deadline,
//! and what the QP has learned about whether its application answers.
//!
//! A requester sets AckReq on the last packet of every message (and on
//! every [`MAX_PKT_PER_ACK`](super::requester_state::MAX_PKT_PER_ACK)-th packet of
//! a long one); rxe answers each at once. uroce honours every AckReq too,
//! but may hold the positive ACK of a message's *last* packet for a short
//! while, as a NIC coalesces ACKs: when the application answers the
//! message (posts a request on the same QP), the held ACK leaves right
//! after that request, in the same engine pass, so the runtime sends both
//! in one GSO system call and the peer finds its data and its ACK together
//! (`ib_write_lat`, `ibv_rc_pingpong`). ACKs coalesce: a newer one replaces
//! the held one (an ACK of PSN n acknowledges every PSN up to n). NAKs, RNR
//! NAKs, READ responses and atomic responses are never held, and a held
//! ACK leaves before them.
//!
//! A held ACK leaves at the latest at its deadline, [`ack_hold_limit`]
//! after the first ACK it stands for: a fraction of the peer's local ACK
//! timeout, so that holding can never make the peer retransmit. When it
//! leaves at its deadline, the application did not answer in time: the QP
//! stops holding (it is *quiet*) until the application is seen to answer
//! within the limit of an ACK sent at once. Nothing is held unless the
//! engine's user says that an application thread is there to answer
//! ([`super::Engine::set_app_active`]: the device runtime does while an
//! application polls).

use crate::wire::Aeth;
use std::time::{Duration, Instant};

/// Longest hold whatever the peer's timeout: an answering application
/// posts within a few microseconds of its data's arrival (perftest's
/// `ib_write_lat` measures 2–10 µs half round trips on this runtime); one
/// that takes longer is not worth waiting for.
pub const ACK_HOLD_CAP: Duration = Duration::from_micros(20);

/// The hold is at most this fraction of the peer's local ACK timeout.
pub const ACK_HOLD_FRACTION: u32 = 8;

/// The longest a QP whose ACK timeout exponent is `timeout` holds an ACK:
/// `min(ACK_HOLD_CAP, T / ACK_HOLD_FRACTION)` with `T = 4.096 µs × 2^timeout`
/// (IBA 9.7.6.1.3), [`ACK_HOLD_CAP`] for 0 (no timeout).
///
/// The responder cannot see the peer's timeout; it takes its own QP's, as
/// both ends of a connection are set alike (rdma_cm gives the passive side
/// the active side's REQ Local ACK Timeout; perftest and `connect_rc` pass
/// one value to both). The peer's timer runs from its send, so an ACK held
/// for `T / 8` leaves `7/8 T` for both trips and the scheduling at both
/// ends. uroce's smallest timeout is exponent 1, 8.192 µs (no floor: see
/// [`super::requester_state::ack_timeout`]), held for 1 µs; rxe rounds its timer up
/// to whole jiffies (≥ 1 ms), so an rxe peer's timeout is ≥ 50 × the cap.
/// The cap binds from exponent 6 (262 µs) on; the default of rdma_cm
/// (17, 537 ms) and perftest (14, 67 ms) hold 20 µs.
pub fn ack_hold_limit(timeout: u8) -> Duration {
    match super::requester_state::ack_timeout(timeout) {
        Some(t) => (t / ACK_HOLD_FRACTION).min(ACK_HOLD_CAP),
        None => ACK_HOLD_CAP,
    }
}

/// One QP's held ACK and what it knows of its application.
#[derive(Debug, Default)]
pub(crate) struct DelayedAck {
    /// The ACK held back (PSN, AETH): the newest of those it coalesces.
    held: Option<(u32, Aeth)>,
    /// When it leaves at the latest.
    due: Option<Instant>,
    /// A held ACK reached its deadline: the application does not answer
    /// (in time); ACKs go at once until it is seen to.
    quiet: bool,
    /// While quiet: when the last ACK went at once.
    acked_at: Option<Instant>,
}

impl DelayedAck {
    /// The deadline of the held ACK.
    pub fn due(&self) -> Option<Instant> {
        self.due
    }

    pub fn is_held(&self) -> bool {
        self.held.is_some()
    }

    /// Offers the ACK of `psn`: held when `limit` allows (Some) and the QP is
    /// not quiet, else given back to go now (it replaces a held one).
    pub fn offer(&mut self, now: Instant, limit: Option<Duration>, psn: u32, aeth: Aeth) -> Option<(u32, Aeth)> {
        match limit {
            Some(limit) if !self.quiet => {
                self.held = Some((psn, aeth));
                self.due.get_or_insert(now + limit);
                None
            }
            _ => {
                if self.quiet {
                    self.acked_at = Some(now);
                }
                self.take();
                Some((psn, aeth))
            }
        }
    }

    /// The held ACK, to go now.
    pub fn take(&mut self) -> Option<(u32, Aeth)> {
        self.due = None;
        self.held.take()
    }

    /// The held ACK if its deadline has passed: the application did not
    /// answer in time, so the QP turns quiet.
    pub fn expire(&mut self, now: Instant) -> Option<(u32, Aeth)> {
        if self.due.is_some_and(|d| d <= now) {
            // (A post soon after does not count as an answer: it came later
            // than the limit after the data.)
            self.quiet = true;
            self.acked_at = None;
            return self.take();
        }
        None
    }

    /// The application posted a request: if it came within `limit` of an
    /// ACK sent at once, it answers, and ACKs are held again.
    /// (`limit` is asked for only while quiet: not on every post.)
    pub fn posted(&mut self, now: Instant, limit: impl FnOnce() -> Duration) {
        if self.quiet && self.acked_at.is_some_and(|t| now <= t + limit()) {
            self.quiet = false;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_hold_is_an_eighth_of_the_timeout_up_to_the_cap() {
        assert_eq!(ack_hold_limit(0), ACK_HOLD_CAP);
        assert_eq!(ack_hold_limit(1), Duration::from_nanos(8192 / 8));
        assert_eq!(ack_hold_limit(5), Duration::from_nanos((4096 << 5) / 8));
        assert_eq!(ack_hold_limit(6), ACK_HOLD_CAP);
        assert_eq!(ack_hold_limit(14), ACK_HOLD_CAP);
        for t in 1..=31 {
            assert!(ack_hold_limit(t) * ACK_HOLD_FRACTION <= super::super::requester_state::ack_timeout(t).unwrap());
        }
    }

    #[test]
    fn coalesces_expires_goes_quiet_and_learns_again() {
        let t0 = Instant::now();
        let us = Duration::from_micros;
        let mut d = DelayedAck::default();
        assert_eq!(d.offer(t0, Some(us(20)), 5, Aeth::ack(1)), None);
        assert_eq!(d.offer(t0 + us(5), Some(us(20)), 6, Aeth::ack(2)), None);
        assert_eq!(d.due(), Some(t0 + us(20)), "the first held ACK sets the deadline");
        assert_eq!(d.expire(t0 + us(19)), None);
        assert_eq!(d.expire(t0 + us(20)), Some((6, Aeth::ack(2))), "one ACK, for the newest PSN");
        assert_eq!(d.due(), None);
        // Quiet: the next goes at once.
        assert_eq!(d.offer(t0 + us(30), Some(us(20)), 7, Aeth::ack(3)), Some((7, Aeth::ack(3))));
        // A post long after does not end it; one soon after an ACK does.
        d.posted(t0 + us(100), || us(20));
        assert_eq!(d.offer(t0 + us(110), Some(us(20)), 8, Aeth::ack(4)), Some((8, Aeth::ack(4))));
        d.posted(t0 + us(115), || us(20));
        assert_eq!(d.offer(t0 + us(120), Some(us(20)), 9, Aeth::ack(5)), None);
        assert_eq!(d.take(), Some((9, Aeth::ack(5))));
        // No limit (the runtime says nobody answers): at once, not quiet.
        assert_eq!(d.offer(t0 + us(130), None, 10, Aeth::ack(6)), Some((10, Aeth::ack(6))));
        assert_eq!(d.offer(t0 + us(140), Some(us(20)), 11, Aeth::ack(7)), None);
    }
}
