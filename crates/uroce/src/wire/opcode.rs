//! The opcode table: for every BTH opcode, its name (as rxe_opcode.c), the
//! extension headers it carries, and what it means to the transport. It is the
//! single source of header layout: parse and emit both follow it.
//!
//! The connected transports share one set of operations: UC has RC's SEND and
//! WRITE opcodes at 0x20, XRC (IBA Annex A14) all of RC's up to
//! SEND_ONLY_WITH_INVALIDATE at 0xA0, its requests with an XRCETH (the
//! target's SRQ number) after the BTH.

use bitflags::bitflags;

/// A BTH opcode: transport in bits 7:5, operation in bits 4:0.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub struct Opcode(pub u8);

/// The transport an opcode belongs to.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Transport {
    /// Reliable Connected (opcodes 0x00–0x1F).
    Rc,
    /// Unreliable Connected (0x20–0x3F).
    Uc,
    /// Reliable Datagram (0x40–0x5F).
    Rd,
    /// Unreliable Datagram (0x60–0x7F).
    Ud,
    /// Congestion notification (0x80–0x9F; the RoCEv2 CNP is 0x81).
    Cnp,
    /// Extended Reliable Connected (0xA0–0xBF).
    Xrc,
    /// Any other value of bits 7:5 (6 or 7), held as that value.
    Other(u8),
}

bitflags! {
    /// What an opcode carries and means.
    #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
    pub struct OpFlags: u32 {
        /// Carries a RETH.
        const RETH = 1;
        /// Carries an AETH.
        const AETH = 1 << 1;
        /// Carries an AtomicETH.
        const ATOMIC_ETH = 1 << 2;
        /// Carries an AtomicAckETH (8 bytes: the original remote value).
        const ATOMIC_ACK_ETH = 1 << 3;
        /// Carries immediate data (ImmDt, 4 bytes).
        const IMMDT = 1 << 4;
        /// Carries an IETH (4 bytes: the R_Key to invalidate).
        const IETH = 1 << 5;
        /// Carries a DETH.
        const DETH = 1 << 6;
        /// Carries a FETH (4 bytes, FLUSH; emitted as zeros, skipped on parse).
        const FETH = 1 << 7;
        /// May carry a payload.
        const PAYLOAD = 1 << 8;
        /// First packet of a message.
        const FIRST = 1 << 9;
        /// Middle packet of a message.
        const MIDDLE = 1 << 10;
        /// Last packet of a message.
        const LAST = 1 << 11;
        /// A whole message in one packet (FIRST and LAST are set too).
        const ONLY = 1 << 12;
        /// Sent by a requester.
        const REQUEST = 1 << 13;
        /// Sent by a responder: ACK, atomic ACK, READ responses.
        const RESPONSE = 1 << 14;
        /// Consumes a receive WQE.
        const RWR = 1 << 15;
        /// The responder completes a receive WQE on it.
        const COMP = 1 << 16;
        /// A SEND.
        const SEND = 1 << 17;
        /// An RDMA WRITE.
        const WRITE = 1 << 18;
        /// An RDMA READ request or response.
        const READ = 1 << 19;
        /// An atomic request: CmpSwap or FetchAdd.
        const ATOMIC = 1 << 20;
        /// An acknowledgement: ACK or atomic ACK.
        const ACK = 1 << 21;
        /// XRC requests: the XRC SRQ number (IBA A14.3.2).
        const XRCETH = 1 << 22;
        /// RDMA ATOMIC WRITE (IBA 1.5 A19): 8 bytes written as one.
        const ATOMIC_WRITE = 1 << 23;
    }
}

/// One row of the table.
#[derive(Debug, PartialEq, Eq)]
pub struct OpInfo {
    /// Name as `rxe_opcode.c` spells it ("RC_SEND_ONLY", …).
    pub name: &'static str,
    /// Headers it carries and what it means.
    pub flags: OpFlags,
    /// BTH plus extension headers, in bytes.
    pub hdr_len: usize,
}

impl Opcode {
    /// RC SEND First.
    pub const RC_SEND_FIRST: Opcode = Opcode(0x00);
    /// RC SEND Middle.
    pub const RC_SEND_MIDDLE: Opcode = Opcode(0x01);
    /// RC SEND Last.
    pub const RC_SEND_LAST: Opcode = Opcode(0x02);
    /// RC SEND Last with Immediate.
    pub const RC_SEND_LAST_IMM: Opcode = Opcode(0x03);
    /// RC SEND Only.
    pub const RC_SEND_ONLY: Opcode = Opcode(0x04);
    /// RC SEND Only with Immediate.
    pub const RC_SEND_ONLY_IMM: Opcode = Opcode(0x05);
    /// RC RDMA WRITE First.
    pub const RC_WRITE_FIRST: Opcode = Opcode(0x06);
    /// RC RDMA WRITE Middle.
    pub const RC_WRITE_MIDDLE: Opcode = Opcode(0x07);
    /// RC RDMA WRITE Last.
    pub const RC_WRITE_LAST: Opcode = Opcode(0x08);
    /// RC RDMA WRITE Last with Immediate.
    pub const RC_WRITE_LAST_IMM: Opcode = Opcode(0x09);
    /// RC RDMA WRITE Only.
    pub const RC_WRITE_ONLY: Opcode = Opcode(0x0A);
    /// RC RDMA WRITE Only with Immediate.
    pub const RC_WRITE_ONLY_IMM: Opcode = Opcode(0x0B);
    /// RC RDMA READ Request.
    pub const RC_READ_REQUEST: Opcode = Opcode(0x0C);
    /// RC RDMA READ Response First.
    pub const RC_READ_RESPONSE_FIRST: Opcode = Opcode(0x0D);
    /// RC RDMA READ Response Middle.
    pub const RC_READ_RESPONSE_MIDDLE: Opcode = Opcode(0x0E);
    /// RC RDMA READ Response Last.
    pub const RC_READ_RESPONSE_LAST: Opcode = Opcode(0x0F);
    /// RC RDMA READ Response Only.
    pub const RC_READ_RESPONSE_ONLY: Opcode = Opcode(0x10);
    /// RC Acknowledge.
    pub const RC_ACK: Opcode = Opcode(0x11);
    /// RC Atomic Acknowledge.
    pub const RC_ATOMIC_ACK: Opcode = Opcode(0x12);
    /// RC CmpSwap.
    pub const RC_COMPARE_SWAP: Opcode = Opcode(0x13);
    /// RC FetchAdd.
    pub const RC_FETCH_ADD: Opcode = Opcode(0x14);
    /// RC SEND Last with Invalidate.
    pub const RC_SEND_LAST_INV: Opcode = Opcode(0x16);
    /// RC SEND Only with Invalidate.
    pub const RC_SEND_ONLY_INV: Opcode = Opcode(0x17);
    /// RC FLUSH.
    pub const RC_FLUSH: Opcode = Opcode(0x1C);
    /// RC ATOMIC WRITE.
    pub const RC_ATOMIC_WRITE: Opcode = Opcode(0x1D);
    /// UC SEND First.
    pub const UC_SEND_FIRST: Opcode = Opcode(0x20);
    /// UC SEND Middle.
    pub const UC_SEND_MIDDLE: Opcode = Opcode(0x21);
    /// UC SEND Last.
    pub const UC_SEND_LAST: Opcode = Opcode(0x22);
    /// UC SEND Last with Immediate.
    pub const UC_SEND_LAST_IMM: Opcode = Opcode(0x23);
    /// UC SEND Only.
    pub const UC_SEND_ONLY: Opcode = Opcode(0x24);
    /// UC SEND Only with Immediate.
    pub const UC_SEND_ONLY_IMM: Opcode = Opcode(0x25);
    /// UC RDMA WRITE First.
    pub const UC_WRITE_FIRST: Opcode = Opcode(0x26);
    /// UC RDMA WRITE Middle.
    pub const UC_WRITE_MIDDLE: Opcode = Opcode(0x27);
    /// UC RDMA WRITE Last.
    pub const UC_WRITE_LAST: Opcode = Opcode(0x28);
    /// UC RDMA WRITE Last with Immediate.
    pub const UC_WRITE_LAST_IMM: Opcode = Opcode(0x29);
    /// UC RDMA WRITE Only.
    pub const UC_WRITE_ONLY: Opcode = Opcode(0x2A);
    /// UC RDMA WRITE Only with Immediate.
    pub const UC_WRITE_ONLY_IMM: Opcode = Opcode(0x2B);
    /// UD SEND Only.
    pub const UD_SEND_ONLY: Opcode = Opcode(0x64);
    /// UD SEND Only with Immediate.
    pub const UD_SEND_ONLY_IMM: Opcode = Opcode(0x65);
    /// RoCEv2 Congestion Notification Packet.
    pub const CNP: Opcode = Opcode(0x81);

    /// The table row, or None for reserved and unknown opcodes.
    pub fn info(self) -> Option<&'static OpInfo> {
        TABLE[self.0 as usize].as_ref()
    }

    /// The transport, from bits 7:5.
    pub fn transport(self) -> Transport {
        match self.0 >> 5 {
            0 => Transport::Rc,
            1 => Transport::Uc,
            2 => Transport::Rd,
            3 => Transport::Ud,
            4 => Transport::Cnp,
            5 => Transport::Xrc,
            t => Transport::Other(t),
        }
    }

    /// The UC opcode of an RC SEND/WRITE opcode; other opcodes unchanged.
    pub fn to_uc(self) -> Opcode {
        if self.0 <= 0x0B {
            Opcode(self.0 + 0x20)
        } else {
            self
        }
    }

    /// The XRC opcode of an RC opcode up to SEND_ONLY_WITH_INVALIDATE; other
    /// opcodes unchanged.
    pub fn to_xrc(self) -> Opcode {
        if self.0 <= 0x17 {
            Opcode(self.0 + 0xA0)
        } else {
            self
        }
    }
}

use OpFlags as F;

const fn row(name: &'static str, flags: OpFlags, hdr_len: usize) -> Option<OpInfo> {
    Some(OpInfo { name, flags, hdr_len })
}

const SEND: OpFlags = F::SEND.union(F::REQUEST).union(F::PAYLOAD).union(F::RWR);
const WRITE: OpFlags = F::WRITE.union(F::REQUEST).union(F::PAYLOAD);
const RRESP: OpFlags = F::READ.union(F::RESPONSE).union(F::PAYLOAD);
const ONLY: OpFlags = F::FIRST.union(F::LAST).union(F::ONLY);
const SEND_LAST: OpFlags = SEND.union(F::LAST).union(F::COMP);
const SEND_ONLY: OpFlags = SEND.union(ONLY).union(F::COMP);

/// The connected transports, whose rows share one definition.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Connected {
    Rc,
    Uc,
    Xrc,
}

/// The row of operation `op` (0x00..0x1F) of a connected transport: RC has
/// them all, UC 0x00..0x0B, XRC 0x00..0x17 with an XRCETH on requests.
const fn connected(op: u8, t: Connected) -> Option<OpInfo> {
    macro_rules! n {
        ($rc:literal, $uc:literal, $xrc:literal) => {
            match t {
                Connected::Rc => $rc,
                Connected::Uc => $uc,
                Connected::Xrc => $xrc,
            }
        };
        ($rc:literal, $xrc:literal) => {
            n!($rc, "", $xrc)
        };
    }
    let info = match op {
        0x00 => row(n!("RC_SEND_FIRST", "UC_SEND_FIRST", "XRC_SEND_FIRST"), SEND.union(F::FIRST), 12),
        0x01 => row(n!("RC_SEND_MIDDLE", "UC_SEND_MIDDLE", "XRC_SEND_MIDDLE"), SEND.union(F::MIDDLE), 12),
        0x02 => row(n!("RC_SEND_LAST", "UC_SEND_LAST", "XRC_SEND_LAST"), SEND_LAST, 12),
        0x03 => row(
            n!("RC_SEND_LAST_WITH_IMMEDIATE", "UC_SEND_LAST_WITH_IMMEDIATE", "XRC_SEND_LAST_WITH_IMMEDIATE"),
            SEND_LAST.union(F::IMMDT),
            16,
        ),
        0x04 => row(n!("RC_SEND_ONLY", "UC_SEND_ONLY", "XRC_SEND_ONLY"), SEND_ONLY, 12),
        0x05 => row(
            n!("RC_SEND_ONLY_WITH_IMMEDIATE", "UC_SEND_ONLY_WITH_IMMEDIATE", "XRC_SEND_ONLY_WITH_IMMEDIATE"),
            SEND_ONLY.union(F::IMMDT),
            16,
        ),
        0x06 => row(
            n!("RC_RDMA_WRITE_FIRST", "UC_RDMA_WRITE_FIRST", "XRC_RDMA_WRITE_FIRST"),
            WRITE.union(F::FIRST).union(F::RETH),
            28,
        ),
        0x07 => {
            row(n!("RC_RDMA_WRITE_MIDDLE", "UC_RDMA_WRITE_MIDDLE", "XRC_RDMA_WRITE_MIDDLE"), WRITE.union(F::MIDDLE), 12)
        }
        0x08 => row(n!("RC_RDMA_WRITE_LAST", "UC_RDMA_WRITE_LAST", "XRC_RDMA_WRITE_LAST"), WRITE.union(F::LAST), 12),
        0x09 => row(
            n!(
                "RC_RDMA_WRITE_LAST_WITH_IMMEDIATE",
                "UC_RDMA_WRITE_LAST_WITH_IMMEDIATE",
                "XRC_RDMA_WRITE_LAST_WITH_IMMEDIATE"
            ),
            WRITE.union(F::LAST).union(F::IMMDT).union(F::RWR).union(F::COMP),
            16,
        ),
        0x0A => row(
            n!("RC_RDMA_WRITE_ONLY", "UC_RDMA_WRITE_ONLY", "XRC_RDMA_WRITE_ONLY"),
            WRITE.union(ONLY).union(F::RETH),
            28,
        ),
        0x0B => row(
            n!(
                "RC_RDMA_WRITE_ONLY_WITH_IMMEDIATE",
                "UC_RDMA_WRITE_ONLY_WITH_IMMEDIATE",
                "XRC_RDMA_WRITE_ONLY_WITH_IMMEDIATE"
            ),
            WRITE.union(ONLY).union(F::RETH).union(F::IMMDT).union(F::RWR).union(F::COMP),
            32,
        ),
        _ if matches!(t, Connected::Uc) => None,
        0x0C => row(
            n!("RC_RDMA_READ_REQUEST", "XRC_RDMA_READ_REQUEST"),
            F::READ.union(F::REQUEST).union(ONLY).union(F::RETH),
            28,
        ),
        0x0D => row(
            n!("RC_RDMA_READ_RESPONSE_FIRST", "XRC_RDMA_READ_RESPONSE_FIRST"),
            RRESP.union(F::FIRST).union(F::AETH),
            16,
        ),
        0x0E => row(n!("RC_RDMA_READ_RESPONSE_MIDDLE", "XRC_RDMA_READ_RESPONSE_MIDDLE"), RRESP.union(F::MIDDLE), 12),
        0x0F => row(
            n!("RC_RDMA_READ_RESPONSE_LAST", "XRC_RDMA_READ_RESPONSE_LAST"),
            RRESP.union(F::LAST).union(F::AETH),
            16,
        ),
        0x10 => {
            row(n!("RC_RDMA_READ_RESPONSE_ONLY", "XRC_RDMA_READ_RESPONSE_ONLY"), RRESP.union(ONLY).union(F::AETH), 16)
        }
        0x11 => row(n!("RC_ACKNOWLEDGE", "XRC_ACKNOWLEDGE"), F::ACK.union(F::RESPONSE).union(ONLY).union(F::AETH), 16),
        0x12 => row(
            n!("RC_ATOMIC_ACKNOWLEDGE", "XRC_ATOMIC_ACKNOWLEDGE"),
            F::ACK.union(F::RESPONSE).union(ONLY).union(F::AETH).union(F::ATOMIC_ACK_ETH),
            24,
        ),
        0x13 => row(
            n!("RC_COMPARE_SWAP", "XRC_COMPARE_SWAP"),
            F::ATOMIC.union(F::REQUEST).union(ONLY).union(F::ATOMIC_ETH),
            40,
        ),
        0x14 => {
            row(n!("RC_FETCH_ADD", "XRC_FETCH_ADD"), F::ATOMIC.union(F::REQUEST).union(ONLY).union(F::ATOMIC_ETH), 40)
        }
        0x16 => row(n!("RC_SEND_LAST_WITH_INVALIDATE", "XRC_SEND_LAST_WITH_INVALIDATE"), SEND_LAST.union(F::IETH), 16),
        0x17 => row(n!("RC_SEND_ONLY_WITH_INVALIDATE", "XRC_SEND_ONLY_WITH_INVALIDATE"), SEND_ONLY.union(F::IETH), 16),
        _ if matches!(t, Connected::Xrc) => None,
        0x1C => row("RC_FLUSH", F::REQUEST.union(ONLY).union(F::FETH).union(F::RETH), 32),
        0x1D => {
            row("RC_ATOMIC_WRITE", F::ATOMIC_WRITE.union(F::REQUEST).union(ONLY).union(F::RETH).union(F::PAYLOAD), 28)
        }
        _ => None,
    };
    // An XRC request names the target's SRQ in an XRCETH, right after the BTH.
    match info {
        Some(i) if matches!(t, Connected::Xrc) && i.flags.contains(F::REQUEST) => {
            row(i.name, i.flags.union(F::XRCETH), i.hdr_len + 4)
        }
        other => other,
    }
}

const fn build() -> [Option<OpInfo>; 256] {
    let mut t = [const { None }; 256];
    let mut op = 0;
    while op < 0x20 {
        t[op] = connected(op as u8, Connected::Rc);
        t[op + 0x20] = connected(op as u8, Connected::Uc);
        t[op + 0xA0] = connected(op as u8, Connected::Xrc);
        op += 1;
    }
    t[0x64] = row("UD_SEND_ONLY", SEND_ONLY.union(F::DETH), 20);
    t[0x65] = row("UD_SEND_ONLY_WITH_IMMEDIATE", SEND_ONLY.union(F::DETH).union(F::IMMDT), 24);
    t[0x81] = row("CNP", F::empty(), 12 + 16);
    t
}

static TABLE: [Option<OpInfo>; 256] = build();

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn header_lengths_match_the_spec() {
        // wire.md §4: (opcode, header length).
        let expect = [
            (0x00, 12),
            (0x01, 12),
            (0x02, 12),
            (0x03, 16),
            (0x04, 12),
            (0x05, 16),
            (0x06, 28),
            (0x07, 12),
            (0x08, 12),
            (0x09, 16),
            (0x0A, 28),
            (0x0B, 32),
            (0x0C, 28),
            (0x0D, 16),
            (0x0E, 12),
            (0x0F, 16),
            (0x10, 16),
            (0x11, 16),
            (0x12, 24),
            (0x13, 40),
            (0x14, 40),
            (0x16, 16),
            (0x17, 16),
            (0x1C, 32),
            (0x1D, 28),
            (0x64, 20),
            (0x65, 24),
        ];
        for (op, len) in expect {
            let rc = Opcode(op).info().unwrap();
            assert_eq!(rc.hdr_len, len, "opcode {op:#x}");
            if op <= 0x0B {
                assert_eq!(Opcode(op).to_uc().info().unwrap().hdr_len, len);
            }
            if op <= 0x17 {
                // Annex A14: requests gain the 4-byte XRCETH, responses do not.
                let xrc = Opcode(op).to_xrc().info().unwrap();
                let extra = if rc.flags.contains(F::REQUEST) { 4 } else { 0 };
                assert_eq!(xrc.hdr_len, len + extra, "{}", xrc.name);
                assert_eq!(xrc.flags - F::XRCETH, rc.flags, "{}", xrc.name);
            }
        }
        for reserved in [0x15u8, 0x18, 0x2C, 0x40, 0x63, 0x66, 0xB5, 0xBC, 0xBD, 0xFF] {
            assert!(Opcode(reserved).info().is_none(), "{reserved:#x}");
        }
    }

    #[test]
    fn flags_are_consistent() {
        for op in 0..=255u8 {
            let Some(i) = Opcode(op).info() else { continue };
            let f = i.flags;
            let ext = [
                (F::RETH, 16),
                (F::AETH, 4),
                (F::ATOMIC_ETH, 28),
                (F::ATOMIC_ACK_ETH, 8),
                (F::IMMDT, 4),
                (F::IETH, 4),
                (F::DETH, 8),
                (F::FETH, 4),
                (F::XRCETH, 4),
            ];
            let sum: usize = ext.iter().filter(|(x, _)| f.contains(*x)).map(|(_, n)| n).sum();
            if op != 0x81 {
                assert_eq!(12 + sum, i.hdr_len, "{}", i.name);
            }
            assert!(!(f.contains(F::REQUEST) && f.contains(F::RESPONSE)), "{}", i.name);
            if f.contains(F::ONLY) {
                assert!(f.contains(F::FIRST | F::LAST), "{}", i.name);
            }
            if f.contains(F::COMP) {
                assert!(f.contains(F::LAST), "{}", i.name);
            }
        }
        assert_eq!(Opcode::UC_WRITE_ONLY.info().unwrap().name, "UC_RDMA_WRITE_ONLY");
        assert_eq!(Opcode(0x24).transport(), Transport::Uc);
        assert_eq!(Opcode::UD_SEND_ONLY.transport(), Transport::Ud);
        assert_eq!(Opcode::RC_SEND_ONLY.to_xrc(), Opcode(0xA4));
        assert_eq!(Opcode(0xA4).transport(), Transport::Xrc);
        assert_eq!(Opcode(0xA4).info().unwrap().name, "XRC_SEND_ONLY");
        assert_eq!(Opcode(0xB1).info().unwrap().name, "XRC_ACKNOWLEDGE");
        assert_eq!(Opcode::RC_ATOMIC_WRITE.to_xrc(), Opcode::RC_ATOMIC_WRITE);
        assert!(Opcode::RC_ATOMIC_WRITE.info().unwrap().flags.contains(F::ATOMIC_WRITE | F::PAYLOAD));
    }
}
