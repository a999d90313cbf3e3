//! The link as a medium (`io::medium`): the runtime's view of [`Links`].

use super::{Links, RxBuf};
use crate::io::medium::{Medium, PeerStats, Runs, RxBuffer};
use crate::proto::Transmit;
use std::any::Any;
use std::net::SocketAddr;
use std::os::fd::RawFd;
use std::time::Instant;

impl RxBuffer for RxBuf {
    fn len(&self) -> usize {
        self.pkts.len()
    }

    fn get(&self, i: usize) -> (SocketAddr, &[u8]) {
        let (from, off, len) = self.pkts[i];
        (from, &self.data[off..off + len])
    }

    fn as_any_mut(&mut self) -> &mut dyn Any {
        self
    }
}

impl Medium for Links {
    fn name(&self) -> &'static str {
        "shm"
    }

    /// The runs for linked peers go through their rings; the others stay
    /// (UDP takes them).
    fn send(&self, pkts: &[Transmit], runs: &mut Runs) {
        runs.retain(|r| !Links::send(self, &pkts[r.clone()]));
    }

    fn rx_buffer(&self) -> Box<dyn RxBuffer> {
        Box::<RxBuf>::default()
    }

    fn recv(&self, buf: &mut dyn RxBuffer, _now: Instant, _others_active: bool) {
        if let Some(b) = buf.as_any_mut().downcast_mut::<RxBuf>() {
            b.clear();
            self.drain(b);
        }
    }

    fn active(&self, now: Instant) -> bool {
        Links::active(self, now)
    }

    fn holding(&self) -> bool {
        Links::holding(self)
    }

    fn count_elsewhere(&self, pkts: &mut dyn Iterator<Item = (SocketAddr, usize)>) {
        self.count_udp_rx(pkts);
    }

    fn poll_fd(&self) -> RawFd {
        Links::poll_fd(self)
    }

    fn sleep(&self) -> bool {
        Links::sleep(self)
    }

    fn woke(&self, rung: bool) {
        Links::woke(self, rung)
    }

    fn polled(&self) {
        Links::polled(self)
    }

    fn peer_stats(&self) -> Vec<PeerStats> {
        self.stats()
    }

    fn counters(&self) -> Vec<(&'static str, u64)> {
        let t = self.totals();
        vec![
            ("links", t.links as u64),
            ("max_links", t.max_links as u64),
            ("links_refused_cap", t.refused_cap),
            ("links_refused_claim", t.refused_claim),
            ("links_refused_bad", t.refused_bad),
        ]
    }
}
