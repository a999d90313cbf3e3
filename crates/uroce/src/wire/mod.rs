//! RoCEv2 on the wire: the Base Transport Header and its extension headers,
//! one opcode table that says which headers each opcode carries, whole-packet
//! parse and emit, the ICRC as Linux rxe computes it, and pcap files.
//!
//! Parsing never panics and never trusts a length: every malformed input is
//! an error. Emission is byte-exact (tested against rxe captures and
//! hardware vectors in `shared/conformance`).

pub mod cm_service;
pub mod decode;
mod headers;
pub mod icrc;
pub mod mad;
mod opcode;
mod packet;
pub mod pcap;

pub use headers::{rnr_timer_usec, Aeth, AethKind, AtomicEth, Bth, Deth, NakCode, Reth};
pub use icrc::IpInfo;
pub use opcode::{OpFlags, OpInfo, Opcode, Transport};
pub use packet::{
    build_packet, finish_packet, finish_packet_around, finish_packet_around_with, packet_len, pad_len, Headers, Packet,
};

/// The RoCEv2 UDP destination port.
pub const ROCE_V2_PORT: u16 = 4791;
/// Length of the Base Transport Header.
pub const BTH_LEN: usize = 12;
/// Length of the invariant CRC trailer.
pub const ICRC_LEN: usize = 4;

/// Why bytes are not a valid RoCEv2 packet (or cannot be written).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum WireError {
    /// The bytes end before the headers (or the pad and ICRC) they must hold.
    #[error("packet truncated")]
    Truncated,
    /// The BTH transport header version (TVer) is not 0.
    #[error("transport header version {0} (must be 0)")]
    BadTver(u8),
    /// The opcode is reserved or not in the opcode table.
    #[error("unknown or reserved opcode {0:#04x}")]
    UnknownOpcode(u8),
    /// The length does not fit the opcode: a payload or pad on an opcode
    /// that carries none.
    #[error("length inconsistent with the opcode")]
    BadLength,
    /// The opcode carries the named extension header but [`Headers`] has
    /// none to emit.
    #[error("opcode needs a {0} header")]
    MissingHeader(&'static str),
    /// The output buffer cannot hold the headers or the packet.
    #[error("buffer too small")]
    BufferTooSmall,
}
