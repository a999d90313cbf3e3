//! The rsockets wire format of rdma-core 44 (librdmacm/rsocket.c,
//! librdmacm/docs/rsocket): the connection private data (`struct
//! rs_conn_data`), the target SGL entries (`struct rs_sge`) a peer RDMA
//! writes into, and the 32-bit immediate messages (`op << 29 | data`).

/// `rs_conn_data.version`.
pub const VERSION: u8 = 1;
/// Sender is big endian: SGL entries it writes are in its byte order.
pub const FLAG_NET: u8 = 1;
/// The sender has an iomap area after its target SGL.
pub const FLAG_IOMAP: u8 = 2;
/// Entries of the target SGL (`RS_SGL_SIZE`).
pub const SGL_SIZE: u32 = 2;
/// Bytes of `struct rs_conn_data`.
pub const CONN_DATA_LEN: usize = 40;
/// Largest transfer one write carries (`RS_MAX_TRANSFER`).
pub const MAX_TRANSFER: u32 = 65536;
/// First write of a send (`RS_OLAP_START_SIZE`), doubled up to `MAX_TRANSFER`.
pub const OLAP_START: u32 = 2048;
/// Send-buffer low-water mark (`RS_SNDLOWAT`).
pub const SNDLOWAT: u32 = 2048;
/// Send-queue entries kept for control messages (`RS_QP_CTRL_SIZE`).
pub const QP_CTRL_SIZE: u32 = 4;
pub const QP_MIN_SIZE: u16 = 16;
pub const QP_MAX_SIZE: u16 = 0xFFFE;
/// Bytes of a control message's payload (`RS_MAX_CTRL_MSG` = one `rs_sge`).
pub const MAX_CTRL_MSG: u32 = 16;

/// Bytes of `struct rs_iomap` (offset, then an `rs_sge`).
pub const IOMAP_LEN: usize = 24;

/// Message types (immediate bits 31:29).
pub const OP_DATA: u32 = 0;
pub const OP_WRITE: u32 = 2;
pub const OP_SGL: u32 = 4;
pub const OP_IOMAP_SGL: u32 = 6;
pub const OP_CTRL: u32 = 7;
/// Control messages (data of `OP_CTRL`).
pub const CTRL_DISCONNECT: u32 = 0;
pub const CTRL_KEEPALIVE: u32 = 1;
pub const CTRL_SHUTDOWN: u32 = 2;

/// Receive work requests carry bit 63 in their `wr_id`.
pub const WR_ID_RECV: u64 = 1 << 63;

pub fn msg(op: u32, data: u32) -> u32 {
    (op << 29) | (data & 0x1FFF_FFFF)
}
pub fn msg_op(m: u32) -> u32 {
    m >> 29
}
pub fn msg_data(m: u32) -> u32 {
    m & 0x1FFF_FFFF
}

/// `struct rs_sge`: in host order in memory (or the peer's, see FLAG_NET).
#[repr(C)]
#[derive(Clone, Copy, Default, Debug, PartialEq, Eq)]
pub struct RsSge {
    pub addr: u64,
    pub key: u32,
    pub length: u32,
}

impl RsSge {
    pub fn swapped(self) -> RsSge {
        RsSge { addr: self.addr.swap_bytes(), key: self.key.swap_bytes(), length: self.length.swap_bytes() }
    }
}

/// `struct rs_conn_data` (all multi-byte fields big endian on the wire).
#[derive(Clone, Copy, Default, Debug, PartialEq, Eq)]
pub struct ConnData {
    pub version: u8,
    pub flags: u8,
    pub credits: u16,
    pub target_iomap_size: u8,
    pub target_sgl: RsSge,
    pub data_buf: RsSge,
}

impl ConnData {
    pub fn encode(&self) -> [u8; CONN_DATA_LEN] {
        let mut b = [0u8; CONN_DATA_LEN];
        b[0] = self.version;
        b[1] = self.flags;
        b[2..4].copy_from_slice(&self.credits.to_be_bytes());
        // b[4..7] reserved, zero.
        b[7] = self.target_iomap_size;
        for (off, s) in [(8, self.target_sgl), (24, self.data_buf)] {
            b[off..off + 8].copy_from_slice(&s.addr.to_be_bytes());
            b[off + 8..off + 12].copy_from_slice(&s.key.to_be_bytes());
            b[off + 12..off + 16].copy_from_slice(&s.length.to_be_bytes());
        }
        b
    }

    /// Whether a peer's data can be used: version 1, a target SGL of 1 to
    /// 64 entries (rsockets sends 2) and a first buffer.
    pub fn usable(&self) -> bool {
        self.version == VERSION && (1..=64).contains(&self.target_sgl.length) && self.data_buf.length > 0
    }

    /// None when shorter than the structure.
    pub fn decode(b: &[u8]) -> Option<ConnData> {
        if b.len() < CONN_DATA_LEN {
            return None;
        }
        let sge = |o: usize| RsSge {
            addr: u64::from_be_bytes(b[o..o + 8].try_into().unwrap_or_default()),
            key: u32::from_be_bytes(b[o + 8..o + 12].try_into().unwrap_or_default()),
            length: u32::from_be_bytes(b[o + 12..o + 16].try_into().unwrap_or_default()),
        };
        Some(ConnData {
            version: b[0],
            flags: b[1],
            credits: u16::from_be_bytes([b[2], b[3]]),
            target_iomap_size: b[7],
            target_sgl: sge(8),
            data_buf: sge(24),
        })
    }
}

/// `rs_value_to_scale` / `rs_scale_to_value` (the iomap size in 8 bits).
pub fn value_to_scale(value: u32, bits: u32) -> u32 {
    if value <= 1 << (bits - 1) {
        value
    } else {
        (1 << (bits - 1)) | (value >> bits)
    }
}
pub fn scale_to_value(value: u32, bits: u32) -> u32 {
    if value <= 1 << (bits - 1) {
        value
    } else {
        (value & !(1 << (bits - 1))) << bits
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn conn_data_layout_is_rdma_cores() {
        let c = ConnData {
            version: 1,
            flags: FLAG_IOMAP,
            credits: 384,
            target_iomap_size: 0,
            target_sgl: RsSge { addr: 0x1122_3344_5566_7788, key: 0xAABB_CCDD, length: 2 },
            data_buf: RsSge { addr: 0x10, key: 7, length: 65536 },
        };
        let b = c.encode();
        assert_eq!(&b[..8], &[1, 2, 0x01, 0x80, 0, 0, 0, 0]);
        assert_eq!(&b[8..16], &[0x11, 0x22, 0x33, 0x44, 0x55, 0x66, 0x77, 0x88]);
        assert_eq!(&b[16..24], &[0xAA, 0xBB, 0xCC, 0xDD, 0, 0, 0, 2]);
        assert_eq!(&b[36..40], &[0, 1, 0, 0]);
        assert_eq!(ConnData::decode(&b), Some(c));
        assert_eq!(ConnData::decode(&b[..39]), None);
        assert!(c.usable());
        let mut bad = c;
        bad.target_sgl.length = 0;
        assert!(!bad.usable());
        bad = c;
        bad.version = 2;
        assert!(!bad.usable());
    }

    #[test]
    fn immediate_encoding() {
        assert_eq!(msg(OP_SGL, 400), 0x8000_0190);
        assert_eq!(msg(OP_CTRL, CTRL_SHUTDOWN), 0xE000_0002);
        assert_eq!(msg_op(0xE000_0002), OP_CTRL);
        assert_eq!(msg_data(msg(OP_DATA, 65536)), 65536);
        assert_eq!(std::mem::size_of::<RsSge>(), 16);
    }
}
