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
//! incoming requests and produces ACKs and responses, holding an ACK
//! briefly for the application's answer ([`ack`]: a timer like the
//! requester's).
//!
//! Memory is reached only through [`MemoryAccess`] ([`memory`]): key checks,
//! copies, atomics, window binds and invalidations, UMRs. The device gives
//! the engine its `mem::Memory`; a simulation may give it a wrapper that
//! injects faults. A payload sent in place leaves in a [`Transmit`] as a
//! [`PayloadHold`] (raw bytes and the token that keeps them registered), so
//! the I/O layer below sees no memory type.

mod ack;
pub(crate) mod budget;
pub mod completer;
pub mod copy;
pub mod cq;
pub mod gsi;
mod engine;
pub mod qpn;
pub mod memory;
pub mod presence;
pub mod psn;
pub mod qp;
pub mod requester;
mod requester_state;
pub mod responder;
mod responder_state;
pub mod rx_ids;
pub mod srq;
mod stats;
pub mod wr;

#[cfg(feature = "unstable")]
pub use ack::{ack_hold_limit, ACK_HOLD_CAP, ACK_HOLD_FRACTION};
pub use engine::{check_datagram, dest_qpn, first_qpn, qpn_after, Engine, EngineConfig, QpSummary, Received};
#[cfg(feature = "unstable")]
pub use engine::XrcSrqs;
pub use copy::CopyJob;
pub use memory::{MemoryAccess, PayloadHold};
pub use rx_ids::RxIds;
#[cfg(feature = "unstable")]
pub use rx_ids::IcrcCheck;
pub use stats::Stats;

use crate::ib::AsyncEventType;
use crate::mem::{AccessError, Span};
use copy::{CopyError, Copies, Fingerprint};
use smallvec::SmallVec;
use crate::wire::{self, Headers, IpInfo};
use std::collections::VecDeque;
use std::net::{IpAddr, SocketAddr};
use std::time::Instant;

/// A packet to send and where it goes. Its UDP payload (BTH … ICRC) is
/// `data`; for a packet sent in place ([`EngineConfig::send_in_place`]) it is
/// `data[..at]` (the headers), the application's registered bytes, then
/// `data[at..]` (pad and ICRC), the kernel gathering the three.
#[derive(Debug)]
pub struct Transmit {
    pub dst: SocketAddr,
    pub data: Vec<u8>,
    /// The payload left in registered memory, and where it goes in `data`.
    pub in_place: Option<InPlace>,
}

/// The payload of a packet sent in place: raw bytes and the token that
/// keeps them registered ([`PayloadHold`]), no memory type. Packed so that
/// a [`Transmit`], moved several times per packet, stays within 128 bytes
/// (a larger one is moved by a `memcpy` call: +12 % CPU per 64 B message
/// measured).
#[derive(Debug)]
pub struct InPlace {
    pub bytes: PayloadHold,
    /// Where the payload goes in `data` (bits 0..8: after the headers, at
    /// most 60 bytes) and the sending QP (bits 8..32).
    at_qpn: u32,
    /// For an unreliable QP's packet: its number ([`AfterSend`]); 0: none.
    seq: u32,
}

// The size the comment on `InPlace` promises (a larger `Transmit` is moved
// by a `memcpy` call).
const _: () = assert!(std::mem::size_of::<Transmit>() <= 128);

impl InPlace {
    pub(crate) fn new(at: usize, bytes: PayloadHold) -> InPlace {
        debug_assert!(at < 256);
        InPlace { bytes, at_qpn: at as u32, seq: 0 }
    }

    /// Where the payload goes in the packet's `data`.
    pub fn at(&self) -> usize {
        (self.at_qpn & 0xFF) as usize
    }
}

/// A packet that completions wait for (see [`Engine::sent`]): an
/// unreliable (UD, UC) send completes when its packets have been handed to
/// the kernel, and one sent in place is handed over by the send call, which
/// copies the application's bytes; completing it earlier would let an
/// application reuse its buffer while the kernel may still read it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AfterSend {
    pub(crate) qpn: u32,
    /// The QP's count of such packets (wrapping, never 0), this one's.
    pub(crate) seq: u32,
}

impl Transmit {
    /// The UDP payload's length.
    pub fn len(&self) -> usize {
        self.data.len() + self.in_place.as_ref().map_or(0, |p| p.bytes.len())
    }

    #[cfg(any(test, feature = "unstable"))]
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The UDP payload in its three pieces (the last two empty unless the
    /// payload is sent in place).
    pub(crate) fn parts(&self) -> [&[u8]; 3] {
        match &self.in_place {
            // SAFETY: the bytes are only handed to the kernel (or copied)
            // and any content is acceptable (see `PayloadHold::as_slice`).
            Some(p) => [&self.data[..p.at()], unsafe { p.bytes.as_slice() }, &self.data[p.at()..]],
            None => [&self.data, &[], &[]],
        }
    }

    /// The UDP payload as one slice (gathered when sent in place, through a
    /// fault-tolerant copy: payload bytes the application unmapped since
    /// read as zeros, and the kernel refuses to send such a packet).
    pub fn bytes(&self) -> std::borrow::Cow<'_, [u8]> {
        match &self.in_place {
            Some(p) => {
                let mut v = Vec::with_capacity(self.len());
                v.extend_from_slice(&self.data[..p.at()]);
                let start = v.len();
                if !p.bytes.read_tolerant(false, &mut |c| v.extend_from_slice(c)) {
                    v.resize(start + p.bytes.len(), 0);
                    v[start..].fill(0);
                }
                v.extend_from_slice(&self.data[p.at()..]);
                std::borrow::Cow::Owned(v)
            }
            None => std::borrow::Cow::Borrowed(&self.data),
        }
    }

    /// Completions wait for this packet to reach the kernel: once the send
    /// call that carried it has returned, give this to [`Engine::sent`].
    pub fn after_send(&self) -> Option<AfterSend> {
        let p = self.in_place.as_ref().filter(|p| p.seq != 0)?;
        Some(AfterSend { qpn: p.at_qpn >> 8, seq: p.seq })
    }

    /// Marks this packet (sent in place by `qpn`) as the one completions
    /// numbered `seq` wait for.
    pub(crate) fn set_after_send(&mut self, qpn: u32, seq: u32) {
        if let Some(p) = &mut self.in_place {
            p.at_qpn = (qpn & 0x00FF_FFFF) << 8 | (p.at_qpn & 0xFF);
            p.seq = seq;
        }
    }

    /// Rewrites the ICRC for an IPv4 Identification of `id` instead of 0
    /// (the k-th segment of a UDP GSO send carries ID k).
    pub fn set_ipv4_id(&mut self, id: u16) {
        let len = self.len();
        let n = self.data.len();
        if n >= 4 {
            wire::icrc::rewrite_for_ipv4_id(&mut self.data[n - 4..], len, id);
        }
    }
}

/// What an asynchronous event is about.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EventElement {
    /// A queue pair, by QP number.
    Qp(u32),
    /// A completion queue, by its handle.
    Cq(u32),
    /// A shared receive queue, by SRQ number.
    Srq(u32),
    /// A port, by number (1 on uroce).
    Port(u8),
}

/// `struct ibv_async_event`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AsyncEvent {
    /// What happened (`event_type`).
    pub kind: AsyncEventType,
    /// To what (`element`).
    pub element: EventElement,
}

impl AsyncEvent {
    /// An event of QP `qpn`.
    pub fn qp(kind: AsyncEventType, qpn: u32) -> Self {
        AsyncEvent { kind, element: EventElement::Qp(qpn) }
    }
    /// An event of CQ `cq`.
    pub fn cq(kind: AsyncEventType, cq: u32) -> Self {
        AsyncEvent { kind, element: EventElement::Cq(cq) }
    }
    /// An event of SRQ `srq`.
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

/// Payloads shorter than this are copied into the packet even when they
/// could be sent in place: below it, the copy costs less than the kernel's
/// handling of two more iovecs.
pub const IN_PLACE_MIN: usize = 1024;

/// What the state machines of a QP may use while handling one input: the
/// time, the device's memory and configuration, and the engine's outputs.
pub(crate) struct Ctx<'a> {
    pub now: Instant,
    pub mem: &'a dyn MemoryAccess,
    pub cfg: &'a EngineConfig,
    pub events: &'a mut VecDeque<Event>,
    pub stats: &'a mut Stats,
    pub ready: &'a mut Vec<u32>,
    /// Packet buffers sent and handed back ([`Engine::recycle`]).
    pub spare: &'a mut Vec<Vec<u8>>,
    /// The device's XRC SRQs by number, for XRC requests to name.
    pub xrc_srqs: &'a engine::XrcSrqs,
    /// An application thread may answer what arrives (see
    /// [`Engine::set_app_active`]): ACKs may be held for it.
    pub app_active: bool,
    /// The QP's copies that may block ([`copy`]).
    pub copy: &'a mut Copies,
}

/// Builds one packet to `dst` (see [`Ctx::build`]) from the parts of a
/// context it needs, so that `fill` may borrow the others.
#[allow(clippy::too_many_arguments)]
fn build_packet<E>(
    spare: &mut Vec<Vec<u8>>,
    cfg: &EngineConfig,
    stats: &mut Stats,
    dst: IpAddr,
    headers: &Headers,
    payload_len: usize,
    fill: impl FnOnce(&mut [u8]) -> Result<(), E>,
) -> Result<Transmit, E> {
    let hdr_len = headers.header_len();
    let mut data = spare.pop().unwrap_or_default();
    data.clear();
    data.resize(wire::packet_len(hdr_len, payload_len), 0);
    let n = headers.emit(&mut data).expect("opcode table and headers agree");
    debug_assert_eq!(n, hdr_len);
    if let Err(e) = fill(&mut data[hdr_len..hdr_len + payload_len]) {
        spare.push(data);
        return Err(e);
    }
    let ip = IpInfo { src: cfg.addr, dst, sport: cfg.port, dport: cfg.port, ipv4_id: 0 };
    let len = wire::finish_packet(&mut data, hdr_len, payload_len, &ip).expect("buffer sized by packet_len");
    data.truncate(len);
    stats.tx_packets += 1;
    stats.tx_bytes += len as u64;
    Ok(Transmit { dst: SocketAddr::new(dst, cfg.port), data, in_place: None })
}

impl Ctx<'_> {
    /// Asks the engine to poll this QP for packets.
    pub fn mark_ready(&mut self, qpn: u32) {
        self.ready.push(qpn);
    }

    /// Builds one packet to `dst`: headers, then `payload_len` bytes written
    /// by `fill`, then pad and ICRC.
    pub fn build<E>(
        &mut self,
        dst: IpAddr,
        headers: &Headers,
        payload_len: usize,
        fill: impl FnOnce(&mut [u8]) -> Result<(), E>,
    ) -> Result<Transmit, E> {
        build_packet(self.spare, self.cfg, self.stats, dst, headers, payload_len, fill)
    }

    /// Whether a payload of `len` bytes would be sent in place (see
    /// [`Ctx::build_from`]); a copied one may be read straight from its key
    /// ([`Ctx::build_read_local`]).
    pub fn sends_in_place(&self, len: u64) -> bool {
        self.cfg.send_in_place && len >= IN_PLACE_MIN as u64
    }

    /// Builds one packet to `dst` whose payload is all of `span`: sent in
    /// place when the engine may and the span is one run of pinned host
    /// memory of at least [`IN_PLACE_MIN`] bytes, else copied (now, or by a
    /// job when the copy may block: `fp` names the request).
    pub fn build_from(
        &mut self,
        dst: IpAddr,
        headers: &Headers,
        span: Span,
        fp: Fingerprint,
    ) -> Result<Transmit, CopyError> {
        let span = if self.cfg.send_in_place && span.len() >= IN_PLACE_MIN {
            match self.mem.pin_for_send(span) {
                Ok(bytes) => return Ok(self.build_in_place(dst, headers, bytes)?),
                Err(span) => span,
            }
        } else {
            span
        };
        let mut spans = SmallVec::new();
        spans.push(span);
        self.build_copied(dst, headers, spans, fp)
    }

    /// Builds one packet to `dst` whose payload is `spans`' bytes in order,
    /// copied now or by a job (see [`copy`]).
    pub fn build_copied(
        &mut self,
        dst: IpAddr,
        headers: &Headers,
        spans: SmallVec<[Span; 2]>,
        fp: Fingerprint,
    ) -> Result<Transmit, CopyError> {
        let len = spans.iter().map(Span::len).sum();
        let (mem, copy) = (self.mem, &mut *self.copy);
        build_packet(self.spare, self.cfg, self.stats, dst, headers, len, |buf| copy.read(mem, fp, spans, buf))
    }

    /// Builds one packet to `dst` whose payload is `len` bytes read through
    /// local key `key` at `iova` (checked and read in one call where the
    /// memory allows, else as [`Ctx::build_copied`]).
    #[allow(clippy::too_many_arguments)]
    pub fn build_read_local(
        &mut self,
        dst: IpAddr,
        headers: &Headers,
        key: u32,
        pd: u32,
        iova: u64,
        len: usize,
        fp: Fingerprint,
    ) -> Result<Transmit, CopyError> {
        let mem = self.mem;
        if !self.copy.holds(fp) {
            let r = self.build(dst, headers, len, |buf| match mem.read_local(key, pd, iova, buf)? {
                true => Ok(()),
                false => Err(CopyError::Deferred),
            });
            if !matches!(r, Err(CopyError::Deferred)) {
                return r;
            }
        }
        // The copy may block, or a copy job read it: through the slot.
        let span = mem.resolve(key, pd, iova, len as u64, crate::mem::Want::LocalRead)?;
        let mut spans = SmallVec::new();
        spans.push(span);
        self.build_copied(dst, headers, spans, fp)
    }

    /// The packet with its payload left in place; a fault when the payload
    /// could not be read for the ICRC (the application unmapped or
    /// protected it since it was checked: a copy would fail the same way).
    fn build_in_place(
        &mut self,
        dst: IpAddr,
        headers: &Headers,
        payload: PayloadHold,
    ) -> Result<Transmit, AccessError> {
        let hdr_len = headers.header_len();
        let mut data = self.spare.pop().unwrap_or_default();
        data.clear();
        data.resize(wire::packet_len(hdr_len, payload.len()) - payload.len(), 0);
        let n = headers.emit(&mut data).expect("opcode table and headers agree");
        debug_assert_eq!(n, hdr_len);
        let ip = IpInfo { src: self.cfg.addr, dst, sport: self.cfg.port, dport: self.cfg.port, ipv4_id: 0 };
        // The ICRC reads the payload in place, fault-tolerantly (see
        // `PayloadSource::read_tolerant`).
        let built = wire::finish_packet_around_with(&mut data, hdr_len, payload.len(), &ip, |h| {
            payload.read_tolerant(true, &mut |p| h.update(p))
        });
        let Some(len) = built.expect("buffer sized by packet_len") else {
            self.spare.push(data);
            return Err(AccessError::Fault);
        };
        self.stats.tx_packets += 1;
        self.stats.tx_bytes += len as u64;
        Ok(Transmit { dst: SocketAddr::new(dst, self.cfg.port), data, in_place: Some(InPlace::new(hdr_len, payload)) })
    }
}
