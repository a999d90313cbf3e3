//! Connection requests held for a listener that was there a moment ago.
//!
//! A REQ for a port nobody listens on is rejected at once (REJ 8, invalid
//! Service ID), as the kernel rejects it. Servers that listen again on a
//! port they just closed race their own clients, though: perftest's `-R`
//! server accepts its parameter connection, destroys that listener, and
//! listens anew for the QPs under test only after a final exchange, while
//! its client connects as soon as it has read that exchange. With a kernel
//! device the server nearly always wins (its ACK leaves in softirq and the
//! client's path to its REQ runs through the kernel); with user-space
//! devices on a busy host, whichever process the scheduler runs first wins,
//! and perftest 4.5-0.17 cannot recover from the REJ.
//!
//! So a REQ for a port whose listener closed less than [`GRACE`] ago waits
//! up to [`HOLD`] for a listener on that port instead: a listener that
//! comes takes it as if it had just arrived; otherwise it is rejected as
//! before, [`HOLD`] late (the peer's REQ timeout, 4.3 s, is far longer, so
//! it is not retransmitted meanwhile; a duplicate is dropped). At most
//! [`MAX`] REQs wait at once and [`CLOSED_MAX`] closed ports are
//! remembered; beyond, REQs are rejected at once.

use super::mad::Req;
use super::service::PortSpace;
use std::collections::VecDeque;
use std::net::IpAddr;
use std::time::{Duration, Instant};

/// How long after its listener closed a port still holds REQs.
pub const GRACE: Duration = Duration::from_secs(10);
/// The longest a REQ waits for a listener.
pub const HOLD: Duration = Duration::from_secs(1);
/// REQs waiting at once.
pub const MAX: usize = 16;
/// Closed ports remembered.
pub const CLOSED_MAX: usize = 16;

/// A REQ waiting for a listener.
pub(super) struct Parked {
    pub src: IpAddr,
    pub tid: u64,
    pub req: Box<Req>,
    /// When it arrived.
    pub at: Instant,
}

#[derive(Default)]
pub(super) struct Park {
    /// Ports whose listener closed, and when.
    closed: VecDeque<(PortSpace, u16, Instant)>,
    reqs: Vec<Parked>,
    /// A listener opened on a port that REQs wait for.
    opened: bool,
}

impl Park {
    /// The listener of `port` closed.
    pub fn closed(&mut self, now: Instant, ps: PortSpace, port: u16) {
        self.closed.retain(|c| (c.0, c.1) != (ps, port));
        if self.closed.len() == CLOSED_MAX {
            self.closed.pop_front();
        }
        self.closed.push_back((ps, port, now));
    }

    /// A listener opened on `port`.
    pub fn opened(&mut self, ps: PortSpace, port: u16) {
        self.closed.retain(|c| (c.0, c.1) != (ps, port));
        self.opened |= self.reqs.iter().any(|p| p.port() == Some((ps, port)));
    }

    /// Holds `req` (for `ps`, `port`, where nobody listens) if that port's
    /// listener closed lately: `Some(true)` if it waits now, `Some(false)`
    /// if it is a retransmission of one waiting (dropped), `None` if it
    /// must be answered now.
    pub fn park(&mut self, now: Instant, ps: PortSpace, port: u16, src: IpAddr, tid: u64, req: &Req) -> Option<bool> {
        self.closed.retain(|c| now.saturating_duration_since(c.2) < GRACE);
        if !self.closed.iter().any(|c| (c.0, c.1) == (ps, port)) {
            return None;
        }
        let same = |p: &Parked| (p.req.local_comm_id, p.req.local_ca_guid) == (req.local_comm_id, req.local_ca_guid);
        if self.reqs.iter().any(same) {
            return Some(false);
        }
        if self.reqs.len() >= MAX {
            return None;
        }
        self.reqs.push(Parked { src, tid, req: Box::new(req.clone()), at: now });
        Some(true)
    }

    /// When [`Park::due`] has work: at once after a listener opened for a
    /// waiting REQ, else when the first hold ends.
    pub fn next_deadline(&self) -> Option<Instant> {
        let first = self.reqs.iter().map(|p| p.at).min()?;
        Some(if self.opened { first } else { first + HOLD })
    }

    /// The REQs to look at again: all of them after a listener opened, else
    /// those whose hold ended. The caller hands back with [`Park::keep`]
    /// those that still wait.
    pub fn due(&mut self, now: Instant) -> Vec<Parked> {
        if std::mem::take(&mut self.opened) {
            return std::mem::take(&mut self.reqs);
        }
        let (due, keep) = std::mem::take(&mut self.reqs).into_iter().partition(|p| p.at + HOLD <= now);
        self.reqs = keep;
        due
    }

    /// Puts back a REQ [`Park::due`] gave, still waiting.
    pub fn keep(&mut self, p: Parked) {
        self.reqs.push(p);
    }
}

impl Parked {
    fn port(&self) -> Option<(PortSpace, u16)> {
        super::service::from_service_id(self.req.service_id)
    }
}
