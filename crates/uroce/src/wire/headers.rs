//! The Base Transport Header and the extension headers, each a plain value
//! with `parse` (from the start of a byte slice) and `emit` (into one).
//! All fields are big-endian on the wire.

use super::{Opcode, WireError};

// One bounds check and one load each (a byte at a time, every byte is
// checked on its own and the loads are not merged).
fn be16(b: &[u8], at: usize) -> u16 {
    u16::from_be_bytes(b[at..at + 2].try_into().expect("2 bytes"))
}
fn be32(b: &[u8], at: usize) -> u32 {
    u32::from_be_bytes(b[at..at + 4].try_into().expect("4 bytes"))
}
fn be64(b: &[u8], at: usize) -> u64 {
    u64::from_be_bytes(b[at..at + 8].try_into().expect("8 bytes"))
}
fn need(b: &[u8], n: usize) -> Result<(), WireError> {
    if b.len() < n {
        Err(WireError::Truncated)
    } else {
        Ok(())
    }
}

/// Base Transport Header (12 bytes).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Bth {
    /// Operation code: transport in bits 7:5, operation in bits 4:0.
    pub opcode: Opcode,
    /// Solicited Event (SE): the requester asks for a completion event.
    pub solicited: bool,
    /// Migration request (MigReq) state.
    pub mig_req: bool,
    /// Pad count (2 bits): pad bytes after the payload.
    pub pad_count: u8,
    /// Transport header version (4 bits; 0).
    pub tver: u8,
    /// Partition key (P_Key).
    pub pkey: u16,
    /// Forward Explicit Congestion Notification (FECN).
    pub fecn: bool,
    /// Backward Explicit Congestion Notification (BECN), set in a CNP.
    pub becn: bool,
    /// Destination QP number (24 bits).
    pub dest_qp: u32,
    /// Acknowledge request (AckReq): the responder is to acknowledge this
    /// packet.
    pub ack_req: bool,
    /// Packet sequence number (24 bits).
    pub psn: u32,
}

impl Bth {
    /// Length on the wire, in bytes.
    pub const LEN: usize = 12;

    /// Reads the header from the start of `b`; `Truncated` if `b` is shorter
    /// than [`Self::LEN`]. TVer is not checked here.
    pub fn parse(b: &[u8]) -> Result<Bth, WireError> {
        need(b, Self::LEN)?;
        Ok(Bth {
            opcode: Opcode(b[0]),
            solicited: b[1] & 0x80 != 0,
            mig_req: b[1] & 0x40 != 0,
            pad_count: (b[1] >> 4) & 3,
            tver: b[1] & 0x0F,
            pkey: be16(b, 2),
            fecn: b[4] & 0x80 != 0,
            becn: b[4] & 0x40 != 0,
            dest_qp: be32(b, 4) & 0x00FF_FFFF,
            ack_req: b[8] & 0x80 != 0,
            psn: be32(b, 8) & 0x00FF_FFFF,
        })
    }

    /// Writes the header to the first [`Self::LEN`] bytes of `b` (panics if
    /// `b` is shorter).
    pub fn emit(&self, b: &mut [u8]) {
        b[0] = self.opcode.0;
        b[1] = (self.solicited as u8) << 7 | (self.mig_req as u8) << 6 | (self.pad_count & 3) << 4 | (self.tver & 0x0F);
        b[2..4].copy_from_slice(&self.pkey.to_be_bytes());
        let w = (self.fecn as u32) << 31 | (self.becn as u32) << 30 | (self.dest_qp & 0x00FF_FFFF);
        b[4..8].copy_from_slice(&w.to_be_bytes());
        let w = (self.ack_req as u32) << 31 | (self.psn & 0x00FF_FFFF);
        b[8..12].copy_from_slice(&w.to_be_bytes());
    }
}

/// RDMA Extended Transport Header (16 bytes).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Reth {
    /// Virtual address of the remote buffer.
    pub va: u64,
    /// Remote key (R_Key) of the memory region.
    pub rkey: u32,
    /// DMA length: bytes the operation covers.
    pub dma_len: u32,
}

impl Reth {
    /// Length on the wire, in bytes.
    pub const LEN: usize = 16;
    /// Reads the header from the start of `b`; `Truncated` if `b` is shorter
    /// than [`Self::LEN`].
    pub fn parse(b: &[u8]) -> Result<Reth, WireError> {
        need(b, Self::LEN)?;
        Ok(Reth { va: be64(b, 0), rkey: be32(b, 8), dma_len: be32(b, 12) })
    }
    /// Writes the header to the first [`Self::LEN`] bytes of `b` (panics if
    /// `b` is shorter).
    pub fn emit(&self, b: &mut [u8]) {
        b[0..8].copy_from_slice(&self.va.to_be_bytes());
        b[8..12].copy_from_slice(&self.rkey.to_be_bytes());
        b[12..16].copy_from_slice(&self.dma_len.to_be_bytes());
    }
}

/// NAK codes of the AETH syndrome (type 11).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum NakCode {
    /// PSN sequence error.
    PsnSequence = 0,
    /// Invalid request.
    InvalidRequest = 1,
    /// Remote access error.
    RemoteAccess = 2,
    /// Remote operational error.
    RemoteOperational = 3,
    /// Invalid RD request.
    InvalidRdRequest = 4,
}

impl NakCode {
    /// The code of value `v`; `None` for reserved values.
    pub fn from_u8(v: u8) -> Option<NakCode> {
        Some(match v {
            0 => NakCode::PsnSequence,
            1 => NakCode::InvalidRequest,
            2 => NakCode::RemoteAccess,
            3 => NakCode::RemoteOperational,
            4 => NakCode::InvalidRdRequest,
            _ => return None,
        })
    }
    /// The code's name as the IBA spells it ("PSN Sequence Error", …).
    pub fn name(self) -> &'static str {
        match self {
            NakCode::PsnSequence => "PSN Sequence Error",
            NakCode::InvalidRequest => "Invalid Request",
            NakCode::RemoteAccess => "Remote Access Error",
            NakCode::RemoteOperational => "Remote Operational Error",
            NakCode::InvalidRdRequest => "Invalid RD Request",
        }
    }
}

/// What an AETH syndrome says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AethKind {
    /// ACK (syndrome bits 6:5 = 0).
    Ack {
        /// Credit count (5 bits; 0x1F: invalid).
        credits: u8,
    },
    /// RNR NAK (bits 6:5 = 1).
    RnrNak {
        /// RNR timer code (5 bits, see [`rnr_timer_usec`]).
        timer: u8,
    },
    /// NAK (bits 6:5 = 3) with a defined NAK code.
    Nak(NakCode),
    /// Any other syndrome (bits 6:5 = 2, or a reserved NAK code): the whole
    /// syndrome.
    Reserved(u8),
}

/// ACK Extended Transport Header (4 bytes).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Aeth {
    /// Syndrome: the kind in bits 6:5 (0 ACK, 1 RNR NAK, 3 NAK), the credit
    /// count, RNR timer code or NAK code in bits 4:0.
    pub syndrome: u8,
    /// Message sequence number (24 bits).
    pub msn: u32,
}

impl Aeth {
    /// Length on the wire, in bytes.
    pub const LEN: usize = 4;
    /// An ACK with "invalid credit" (0x1F), as rxe sends.
    pub fn ack(msn: u32) -> Aeth {
        Aeth { syndrome: 0x1F, msn: msn & 0x00FF_FFFF }
    }
    /// An RNR NAK with RNR timer code `timer` (5 bits, see [`rnr_timer_usec`]).
    pub fn rnr_nak(timer: u8, msn: u32) -> Aeth {
        Aeth { syndrome: 0x20 | (timer & 0x1F), msn: msn & 0x00FF_FFFF }
    }
    /// A NAK with `code`.
    pub fn nak(code: NakCode, msn: u32) -> Aeth {
        Aeth { syndrome: 0x60 | code as u8, msn: msn & 0x00FF_FFFF }
    }
    /// What the syndrome says.
    pub fn kind(&self) -> AethKind {
        let v = self.syndrome & 0x1F;
        match (self.syndrome >> 5) & 3 {
            0 => AethKind::Ack { credits: v },
            1 => AethKind::RnrNak { timer: v },
            3 => NakCode::from_u8(v).map_or(AethKind::Reserved(self.syndrome), AethKind::Nak),
            _ => AethKind::Reserved(self.syndrome),
        }
    }
    /// Reads the header from the start of `b`; `Truncated` if `b` is shorter
    /// than [`Self::LEN`].
    pub fn parse(b: &[u8]) -> Result<Aeth, WireError> {
        need(b, Self::LEN)?;
        Ok(Aeth { syndrome: b[0], msn: be32(b, 0) & 0x00FF_FFFF })
    }
    /// Writes the header to the first [`Self::LEN`] bytes of `b` (panics if
    /// `b` is shorter).
    pub fn emit(&self, b: &mut [u8]) {
        b[0..4].copy_from_slice(&((self.syndrome as u32) << 24 | (self.msn & 0x00FF_FFFF)).to_be_bytes());
    }
}

/// Atomic Extended Transport Header (28 bytes, packed).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AtomicEth {
    /// Virtual address of the 8-byte remote operand.
    pub va: u64,
    /// Remote key (R_Key) of the memory region.
    pub rkey: u32,
    /// Swap (CmpSwap) or add (FetchAdd) data.
    pub swap_add: u64,
    /// Compare data (CmpSwap).
    pub compare: u64,
}

impl AtomicEth {
    /// Length on the wire, in bytes.
    pub const LEN: usize = 28;
    /// Reads the header from the start of `b`; `Truncated` if `b` is shorter
    /// than [`Self::LEN`].
    pub fn parse(b: &[u8]) -> Result<AtomicEth, WireError> {
        need(b, Self::LEN)?;
        Ok(AtomicEth { va: be64(b, 0), rkey: be32(b, 8), swap_add: be64(b, 12), compare: be64(b, 20) })
    }
    /// Writes the header to the first [`Self::LEN`] bytes of `b` (panics if
    /// `b` is shorter).
    pub fn emit(&self, b: &mut [u8]) {
        b[0..8].copy_from_slice(&self.va.to_be_bytes());
        b[8..12].copy_from_slice(&self.rkey.to_be_bytes());
        b[12..20].copy_from_slice(&self.swap_add.to_be_bytes());
        b[20..28].copy_from_slice(&self.compare.to_be_bytes());
    }
}

/// Datagram Extended Transport Header (8 bytes).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Deth {
    /// Queue key (Q_Key).
    pub qkey: u32,
    /// Source QP number (24 bits).
    pub src_qp: u32,
}

impl Deth {
    /// Length on the wire, in bytes.
    pub const LEN: usize = 8;
    /// Reads the header from the start of `b`; `Truncated` if `b` is shorter
    /// than [`Self::LEN`].
    pub fn parse(b: &[u8]) -> Result<Deth, WireError> {
        need(b, Self::LEN)?;
        Ok(Deth { qkey: be32(b, 0), src_qp: be32(b, 4) & 0x00FF_FFFF })
    }
    /// Writes the header to the first [`Self::LEN`] bytes of `b` (panics if
    /// `b` is shorter).
    pub fn emit(&self, b: &mut [u8]) {
        b[0..4].copy_from_slice(&self.qkey.to_be_bytes());
        b[4..8].copy_from_slice(&(self.src_qp & 0x00FF_FFFF).to_be_bytes());
    }
}

pub(crate) fn read_u32(b: &[u8]) -> Result<u32, WireError> {
    need(b, 4)?;
    Ok(be32(b, 0))
}

pub(crate) fn read_u64(b: &[u8]) -> Result<u64, WireError> {
    need(b, 8)?;
    Ok(be64(b, 0))
}

/// RNR NAK timer codes in µs (IBA table; rxe's 61410 for code 25 is a typo).
pub fn rnr_timer_usec(code: u8) -> u32 {
    const T: [u32; 32] = [
        655360, 10, 20, 30, 40, 60, 80, 120, 160, 240, 320, 480, 640, 960, 1280, 1920, 2560, 3840, 5120, 7680, 10240,
        15360, 20480, 30720, 40960, 61440, 81920, 122880, 163840, 245760, 327680, 491520,
    ];
    T[(code & 0x1F) as usize]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bth_bytes() {
        // BTH of the PcapPlusPlus READ request vector.
        let b = [0x0c, 0x00, 0xff, 0xff, 0x00, 0x00, 0x00, 0x11, 0x80, 0x54, 0xcb, 0x63];
        let h = Bth::parse(&b).unwrap();
        assert_eq!((h.opcode, h.pkey, h.dest_qp, h.ack_req, h.psn), (Opcode(0x0c), 0xffff, 0x11, true, 0x54cb63));
        let mut out = [0u8; 12];
        h.emit(&mut out);
        assert_eq!(out, b);
        let cnp = [0x81, 0x00, 0xff, 0xff, 0x40, 0x00, 0x01, 0x18, 0, 0, 0, 0];
        let h = Bth::parse(&cnp).unwrap();
        assert!(h.becn && !h.fecn);
        assert_eq!(h.dest_qp, 0x118);
        h.emit(&mut out);
        assert_eq!(out, cnp);
        let f = Bth { solicited: true, mig_req: true, pad_count: 3, tver: 0, ..h };
        f.emit(&mut out);
        assert_eq!(out[1], 0xF0);
    }

    #[test]
    fn extension_headers_roundtrip_and_bytes() {
        let r = Reth { va: 0x0000_7fee_260f_b000, rkey: 0x2b8, dma_len: 0x10000 };
        let mut b = [0u8; 16];
        r.emit(&mut b);
        assert_eq!(b, [0, 0, 0x7f, 0xee, 0x26, 0x0f, 0xb0, 0, 0, 0, 2, 0xb8, 0, 1, 0, 0]);
        assert_eq!(Reth::parse(&b).unwrap(), r);
        let a = AtomicEth { va: 1, rkey: 2, swap_add: 3, compare: 4 };
        let mut b = [0u8; 28];
        a.emit(&mut b);
        assert_eq!(b[11], 2);
        assert_eq!(b[19], 3);
        assert_eq!(b[27], 4);
        assert_eq!(AtomicEth::parse(&b).unwrap(), a);
        let d = Deth { qkey: 0x1111_1111, src_qp: 0x22 };
        let mut b = [0u8; 8];
        d.emit(&mut b);
        assert_eq!(b, [0x11, 0x11, 0x11, 0x11, 0, 0, 0, 0x22]);
        assert_eq!(Deth::parse(&b).unwrap(), d);
        assert_eq!(Reth::parse(&[0u8; 15]), Err(WireError::Truncated));
    }

    #[test]
    fn aeth_syndromes() {
        assert_eq!(Aeth::ack(5).kind(), AethKind::Ack { credits: 0x1F });
        assert_eq!(Aeth::rnr_nak(14, 5).kind(), AethKind::RnrNak { timer: 14 });
        assert_eq!(Aeth::nak(NakCode::RemoteAccess, 1).syndrome, 0x62);
        assert_eq!(Aeth { syndrome: 0x65, msn: 0 }.kind(), AethKind::Reserved(0x65));
        assert_eq!(Aeth { syndrome: 0x40, msn: 0 }.kind(), AethKind::Reserved(0x40));
        let mut b = [0u8; 4];
        Aeth::nak(NakCode::PsnSequence, 0x123456).emit(&mut b);
        assert_eq!(b, [0x60, 0x12, 0x34, 0x56]);
        assert_eq!(rnr_timer_usec(14), 1280);
        assert_eq!(rnr_timer_usec(25), 61440);
        assert_eq!(rnr_timer_usec(0), 655360);
    }
}
