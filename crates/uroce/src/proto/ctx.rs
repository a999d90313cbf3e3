//! What the state machines of a QP work with while they handle one input
//! ([`Ctx`]): the time, the device's memory and configuration, and the
//! engine's outputs; and how they build packets from it.

use super::config::EngineConfig;
use super::copy::{CopyError, Copies, Fingerprint};
use super::event::Event;
use super::memory::{MemoryAccess, PayloadHold};
use super::srq::XrcSrqs;
use super::stats::Stats;
use super::transmit::{InPlace, Transmit, IN_PLACE_MIN};
use crate::mem::{AccessError, Span};
use crate::wire::{self, Headers, IpInfo};
use smallvec::SmallVec;
use std::collections::VecDeque;
use std::net::{IpAddr, SocketAddr};
use std::time::Instant;

/// What the state machines of a QP may use while handling one input: the
/// time, the device's memory and configuration, and the engine's outputs.
pub(crate) struct Ctx<'a> {
    pub now: Instant,
    pub mem: &'a dyn MemoryAccess,
    pub cfg: &'a EngineConfig,
    pub events: &'a mut VecDeque<Event>,
    pub stats: &'a mut Stats,
    pub ready: &'a mut Vec<u32>,
    /// Packet buffers sent and handed back ([`Engine::recycle`](super::Engine::recycle)).
    pub spare: &'a mut Vec<Vec<u8>>,
    /// The device's XRC SRQs by number, for XRC requests to name.
    pub xrc_srqs: &'a XrcSrqs,
    /// An application thread may answer what arrives (see
    /// [`Engine::set_app_active`](super::Engine::set_app_active)): ACKs may be held for it.
    pub app_active: bool,
    /// The QP's copies that may block ([`copy`](super::copy)).
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
    /// copied now or by a job (see [`copy`](super::copy)).
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
