//! The sans-IO transport. An [`Engine`] holds the queue pairs of one device
//! and is driven from outside: datagrams and a `now` go in
//! ([`Engine::handle_datagram`], [`Engine::handle_timeout`]), and packets,
//! timer deadlines and events come out ([`Engine::poll_transmit`],
//! [`Engine::poll_timeout`], [`Engine::poll_event`]). It owns no socket,
//! clock, thread or random source, so a simulated fabric can drive it
//! deterministically.
//!
//! Each queue pair is one [`qp::Qp`]; its three state machines live in
//! sibling files as `impl Qp` blocks: [`requester`] turns send WQEs into
//! request packets and retransmits (go-back-N), [`completer`] consumes
//! ACKs, NAKs and responses and completes send WQEs, [`responder`] executes
//! incoming requests and produces ACKs and responses.

pub mod completer;
pub mod cq;
mod engine;
pub mod psn;
pub mod qp;
pub mod requester;
pub mod responder;
pub mod srq;
mod stats;
pub mod wr;

pub use engine::{Engine, EngineConfig, QpSummary};
pub use stats::Stats;

use crate::ib::AsyncEventType;
use crate::mem::{AccessError, Memory};
use crate::wire::{self, Headers, IpInfo};
use std::collections::VecDeque;
use std::net::{IpAddr, SocketAddr};
use std::time::Instant;

/// A packet to send: the UDP payload (BTH … ICRC) and where it goes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Transmit {
    pub dst: SocketAddr,
    pub data: Vec<u8>,
}

/// What an asynchronous event is about.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EventElement {
    Qp(u32),
    Cq(u32),
    Srq(u32),
    Port(u8),
}

/// `struct ibv_async_event`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AsyncEvent {
    pub kind: AsyncEventType,
    pub element: EventElement,
}

impl AsyncEvent {
    pub fn qp(kind: AsyncEventType, qpn: u32) -> Self {
        AsyncEvent { kind, element: EventElement::Qp(qpn) }
    }
    pub fn cq(kind: AsyncEventType, cq: u32) -> Self {
        AsyncEvent { kind, element: EventElement::Cq(cq) }
    }
    pub fn srq(kind: AsyncEventType, srq: u32) -> Self {
        AsyncEvent { kind, element: EventElement::Srq(srq) }
    }
}

/// Output of the engine other than packets.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Event {
    Async(AsyncEvent),
    /// An armed completion queue got a completion: signal its channel.
    CompletionNotify(u32),
}

/// What the state machines of a QP may use while handling one input: the
/// time, the device's memory and configuration, and the engine's outputs.
pub(crate) struct Ctx<'a> {
    pub now: Instant,
    pub mem: &'a Memory,
    pub cfg: &'a EngineConfig,
    pub events: &'a mut VecDeque<Event>,
    pub stats: &'a mut Stats,
    pub ready: &'a mut Vec<u32>,
    /// Packet buffers sent and handed back ([`Engine::recycle`]).
    pub spare: &'a mut Vec<Vec<u8>>,
    /// The device's XRC SRQs by number, for XRC requests to name.
    pub xrc_srqs: &'a engine::XrcSrqs,
}

impl Ctx<'_> {
    /// Asks the engine to poll this QP for packets.
    pub fn mark_ready(&mut self, qpn: u32) {
        self.ready.push(qpn);
    }

    /// Builds one packet to `dst`: headers, then `payload_len` bytes written
    /// by `fill`, then pad and ICRC.
    pub fn build(
        &mut self,
        dst: IpAddr,
        headers: &Headers,
        payload_len: usize,
        fill: impl FnOnce(&mut [u8]) -> Result<(), AccessError>,
    ) -> Result<Transmit, AccessError> {
        let hdr_len = headers.header_len();
        let mut data = self.spare.pop().unwrap_or_default();
        data.clear();
        data.resize(wire::packet_len(hdr_len, payload_len), 0);
        let n = headers.emit(&mut data).expect("opcode table and headers agree");
        debug_assert_eq!(n, hdr_len);
        fill(&mut data[hdr_len..hdr_len + payload_len])?;
        let ip = IpInfo { src: self.cfg.addr, dst, sport: self.cfg.port, dport: self.cfg.port, ipv4_id: 0 };
        let len = wire::finish_packet(&mut data, hdr_len, payload_len, &ip).expect("buffer sized by packet_len");
        data.truncate(len);
        self.stats.tx_packets += 1;
        self.stats.tx_bytes += len as u64;
        Ok(Transmit { dst: SocketAddr::new(dst, self.cfg.port), data })
    }
}
