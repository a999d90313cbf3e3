//! What the engine hands its user to send: a [`Transmit`] (a packet and its
//! destination, its payload possibly left in registered memory:
//! [`InPlace`]), and the [`AfterSend`] mark of a packet that completions
//! wait for.

use super::memory::PayloadHold;
use crate::wire;
use std::net::SocketAddr;

/// Payloads shorter than this are copied into the packet even when they
/// could be sent in place: below it, the copy costs less than the kernel's
/// handling of two more iovecs.
pub const IN_PLACE_MIN: usize = 1024;

/// A packet to send and where it goes. Its UDP payload (BTH … ICRC) is
/// `data`; for a packet sent in place ([`EngineConfig::send_in_place`](super::EngineConfig::send_in_place)) it is
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

/// A packet that completions wait for (see [`Engine::sent`](super::Engine::sent)): an
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
    /// call that carried it has returned, give this to [`Engine::sent`](super::Engine::sent).
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
