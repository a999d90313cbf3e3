//! CM MADs on the wire (IBA 13.4 MAD header, ch. 12 CM messages, as Linux
//! `drivers/infiniband/core/cm.c` forms them): a checked view over the 256
//! bytes of a MAD ([`MadView`]) and a validated representation of each CM
//! message ([`CmMad`], [`CmMsg`]) with `parse` and byte-exact `emit`.
//!
//! Parsing never panics: the view checks the length once (exactly
//! [`MAD_LEN`] bytes) and every later field access is at a constant offset
//! inside that fixed-size array. Reserved bits are ignored on parse and
//! written as zero on emit, so a MAD formed by Linux re-emits to the same
//! bytes (tested against rxe captures). Communication IDs are held as the
//! big-endian value of their four wire bytes.

use std::fmt;

/// Q_Key of the General Services Interface QP (QP 1), `IB_QP1_QKEY`.
pub const GSI_QKEY: u32 = 0x8001_0000;
/// The GSI QP number.
pub const GSI_QPN: u32 = 1;

/// Every MAD is this long.
pub const MAD_LEN: usize = 256;
/// Length of the common MAD header.
pub const MAD_HDR_LEN: usize = 24;
/// Length of the CM message after the MAD header.
pub const MSG_LEN: usize = MAD_LEN - MAD_HDR_LEN;
/// MAD base version.
pub const BASE_VERSION: u8 = 1;
/// Management class of the communication manager.
pub const MGMT_CLASS_CM: u8 = 0x07;
/// CM class version (the only one Linux registers).
pub const CM_CLASS_VERSION: u8 = 2;
/// Method "Send", used by every CM message.
pub const METHOD_SEND: u8 = 0x03;

/// CM attribute IDs (`k/ib_cm.h` `CM_*_ATTR_ID`).
pub mod attr {
    /// ClassPortInfo.
    pub const CLASS_PORT_INFO: u16 = 0x0001;
    /// Connection Request.
    pub const REQ: u16 = 0x0010;
    /// Message Receipt Acknowledgement.
    pub const MRA: u16 = 0x0011;
    /// Connection Reject.
    pub const REJ: u16 = 0x0012;
    /// Connection Reply.
    pub const REP: u16 = 0x0013;
    /// Ready To Use.
    pub const RTU: u16 = 0x0014;
    /// Disconnect Request.
    pub const DREQ: u16 = 0x0015;
    /// Disconnect Reply.
    pub const DREP: u16 = 0x0016;
    /// Service ID Resolution Request.
    pub const SIDR_REQ: u16 = 0x0017;
    /// Service ID Resolution Response.
    pub const SIDR_REP: u16 = 0x0018;
    /// Load Alternate Path.
    pub const LAP: u16 = 0x0019;
    /// Alternate Path Response.
    pub const APR: u16 = 0x001A;
}

/// Private-data capacity of each message (`k/ib_cm.h` `IB_CM_*_PRIVATE_DATA_SIZE`).
pub mod private_len {
    /// REQ private data, in bytes.
    pub const REQ: usize = 92;
    /// MRA private data, in bytes.
    pub const MRA: usize = 222;
    /// REJ private data, in bytes.
    pub const REJ: usize = 148;
    /// REP private data, in bytes.
    pub const REP: usize = 196;
    /// RTU private data, in bytes.
    pub const RTU: usize = 224;
    /// DREQ private data, in bytes.
    pub const DREQ: usize = 220;
    /// DREP private data, in bytes.
    pub const DREP: usize = 224;
    /// SIDR_REQ private data, in bytes.
    pub const SIDR_REQ: usize = 216;
    /// SIDR_REP private data, in bytes.
    pub const SIDR_REP: usize = 136;
    /// REJ Additional Reject Information and SIDR_REP Additional Information.
    pub const ARI: usize = 72;
}

/// Why bytes are not a CM MAD this CM handles.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum MadError {
    /// Not exactly 256 bytes; the length.
    #[error("MAD of {0} bytes (must be 256)")]
    BadLength(usize),
    /// BaseVersion is not 1.
    #[error("MAD base version {0} (must be 1)")]
    BadBaseVersion(u8),
    /// Management class and class version (in that order) are not the
    /// CM's.
    #[error("management class {0:#04x} version {1} is not the CM (0x07 version 2)")]
    NotCm(u8, u8),
    /// Method other than Send.
    #[error("CM method {0:#04x} (only Send 0x03)")]
    BadMethod(u8),
    /// An attribute ID this CM does not parse (LAP, APR, ClassPortInfo or
    /// unknown).
    #[error("unknown or unsupported CM attribute {0:#06x}")]
    UnknownAttribute(u16),
    /// A field out of range (what, in words).
    #[error("malformed CM message: {0}")]
    Malformed(&'static str),
    /// The output buffer is shorter than one MAD.
    #[error("buffer too small for a MAD")]
    BufferTooSmall,
}

/// A fixed-size byte field (private data, additional information).
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct Bytes<const N: usize>(pub [u8; N]);

impl<const N: usize> Default for Bytes<N> {
    fn default() -> Self {
        Bytes([0; N])
    }
}

impl<const N: usize> Bytes<N> {
    /// The field holding `data` at its start, zero-filled after it;
    /// `None` when `data` is longer than the field.
    pub fn from_prefix(data: &[u8]) -> Option<Self> {
        let mut b = [0u8; N];
        b.get_mut(..data.len())?.copy_from_slice(data);
        Some(Bytes(b))
    }
    /// The field's bytes.
    pub fn as_slice(&self) -> &[u8] {
        &self.0
    }
}

impl<const N: usize> fmt::Debug for Bytes<N> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let used = self.0.iter().rposition(|&b| b != 0).map_or(0, |i| i + 1);
        write!(f, "[{N} bytes: ")?;
        for b in &self.0[..used] {
            write!(f, "{b:02x}")?;
        }
        write!(f, "]")
    }
}

/// A view over the bytes of one MAD, its length checked once.
#[derive(Debug, Clone, Copy)]
pub struct MadView<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> MadView<T> {
    /// The view, if `buffer` is exactly one MAD long.
    pub fn new_checked(buffer: T) -> Result<Self, MadError> {
        let n = buffer.as_ref().len();
        if n != MAD_LEN {
            return Err(MadError::BadLength(n));
        }
        Ok(MadView { buffer })
    }
    fn mad(&self) -> &[u8; MAD_LEN] {
        // Length checked in new_checked; the buffer cannot change under a shared borrow.
        self.buffer.as_ref().try_into().unwrap_or(&[0; MAD_LEN])
    }
    /// BaseVersion (byte 0).
    pub fn base_version(&self) -> u8 {
        self.mad()[0]
    }
    /// MgmtClass (byte 1).
    pub fn mgmt_class(&self) -> u8 {
        self.mad()[1]
    }
    /// ClassVersion (byte 2).
    pub fn class_version(&self) -> u8 {
        self.mad()[2]
    }
    /// Method (byte 3).
    pub fn method(&self) -> u8 {
        self.mad()[3]
    }
    /// Status (bytes 4–5).
    pub fn status(&self) -> u16 {
        u16::from_be_bytes([self.mad()[4], self.mad()[5]])
    }
    /// TransactionID (bytes 8–15).
    pub fn tid(&self) -> u64 {
        let m = self.mad();
        u64::from_be_bytes([m[8], m[9], m[10], m[11], m[12], m[13], m[14], m[15]])
    }
    /// AttributeID (bytes 16–17).
    pub fn attr_id(&self) -> u16 {
        u16::from_be_bytes([self.mad()[16], self.mad()[17]])
    }
    /// AttributeModifier (bytes 20–23).
    pub fn attr_mod(&self) -> u32 {
        let m = self.mad();
        u32::from_be_bytes([m[20], m[21], m[22], m[23]])
    }
    /// The 232 bytes of the CM message.
    pub fn message(&self) -> &[u8; MSG_LEN] {
        let m: &[u8] = &self.mad()[MAD_HDR_LEN..];
        m.try_into().unwrap_or(&[0; MSG_LEN])
    }
    /// Checks the header is a CM Send this CM handles.
    pub fn check_cm(&self) -> Result<(), MadError> {
        if self.base_version() != BASE_VERSION {
            return Err(MadError::BadBaseVersion(self.base_version()));
        }
        if self.mgmt_class() != MGMT_CLASS_CM || self.class_version() != CM_CLASS_VERSION {
            return Err(MadError::NotCm(self.mgmt_class(), self.class_version()));
        }
        if self.method() != METHOD_SEND {
            return Err(MadError::BadMethod(self.method()));
        }
        Ok(())
    }
}

// Field access over the fixed-size message: offsets are constants below
// MSG_LEN, so indexing cannot fail.
fn g8(m: &[u8; MSG_LEN], at: usize) -> u8 {
    m[at]
}
fn g16(m: &[u8; MSG_LEN], at: usize) -> u16 {
    u16::from_be_bytes([m[at], m[at + 1]])
}
fn g24(m: &[u8; MSG_LEN], at: usize) -> u32 {
    u32::from_be_bytes([0, m[at], m[at + 1], m[at + 2]])
}
fn g32(m: &[u8; MSG_LEN], at: usize) -> u32 {
    u32::from_be_bytes([m[at], m[at + 1], m[at + 2], m[at + 3]])
}
fn g64(m: &[u8; MSG_LEN], at: usize) -> u64 {
    (g32(m, at) as u64) << 32 | g32(m, at + 4) as u64
}
fn garr<const N: usize>(m: &[u8; MSG_LEN], at: usize) -> [u8; N] {
    let mut a = [0u8; N];
    a.copy_from_slice(&m[at..at + N]);
    a
}
fn s8(m: &mut [u8; MSG_LEN], at: usize, v: u8) {
    m[at] = v;
}
fn s16(m: &mut [u8; MSG_LEN], at: usize, v: u16) {
    m[at..at + 2].copy_from_slice(&v.to_be_bytes());
}
fn s24(m: &mut [u8; MSG_LEN], at: usize, v: u32) {
    m[at..at + 3].copy_from_slice(&v.to_be_bytes()[1..]);
}
fn s32(m: &mut [u8; MSG_LEN], at: usize, v: u32) {
    m[at..at + 4].copy_from_slice(&v.to_be_bytes());
}
fn s64(m: &mut [u8; MSG_LEN], at: usize, v: u64) {
    m[at..at + 8].copy_from_slice(&v.to_be_bytes());
}
fn sarr(m: &mut [u8; MSG_LEN], at: usize, v: &[u8]) {
    m[at..at + v.len()].copy_from_slice(v);
}

/// One path of a REQ (primary at msg+52, alternate at msg+96; IBA Table 106).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Path {
    /// Local port LID.
    pub local_lid: u16,
    /// Remote port LID.
    pub remote_lid: u16,
    /// Local port GID.
    pub local_gid: [u8; 16],
    /// Remote port GID.
    pub remote_gid: [u8; 16],
    /// Flow label (20 bits).
    pub flow_label: u32,
    /// Packet rate (6 bits).
    pub packet_rate: u8,
    /// Traffic class.
    pub traffic_class: u8,
    /// Hop limit.
    pub hop_limit: u8,
    /// Service level (4 bits).
    pub sl: u8,
    /// SubnetLocal: the remote port is in the local subnet.
    pub subnet_local: bool,
    /// Local ACK timeout (5 bits): 4.096 µs × 2^value.
    pub local_ack_timeout: u8,
    /// Alternate path only (bit 2 of its last byte); reserved in the primary.
    pub sap_supported: bool,
}

impl Path {
    fn parse(m: &[u8; MSG_LEN], at: usize) -> Path {
        let w = g32(m, at + 36);
        Path {
            local_lid: g16(m, at),
            remote_lid: g16(m, at + 2),
            local_gid: garr(m, at + 4),
            remote_gid: garr(m, at + 20),
            flow_label: w >> 12,
            packet_rate: (w & 0x3F) as u8,
            traffic_class: g8(m, at + 40),
            hop_limit: g8(m, at + 41),
            sl: g8(m, at + 42) >> 4,
            subnet_local: g8(m, at + 42) & 0x08 != 0,
            local_ack_timeout: g8(m, at + 43) >> 3,
            sap_supported: g8(m, at + 43) & 0x04 != 0,
        }
    }
    fn emit(&self, m: &mut [u8; MSG_LEN], at: usize) {
        s16(m, at, self.local_lid);
        s16(m, at + 2, self.remote_lid);
        sarr(m, at + 4, &self.local_gid);
        sarr(m, at + 20, &self.remote_gid);
        s32(m, at + 36, (self.flow_label & 0xF_FFFF) << 12 | (self.packet_rate & 0x3F) as u32);
        s8(m, at + 40, self.traffic_class);
        s8(m, at + 41, self.hop_limit);
        s8(m, at + 42, (self.sl & 0xF) << 4 | (self.subnet_local as u8) << 3);
        s8(m, at + 43, (self.local_ack_timeout & 0x1F) << 3 | (self.sap_supported as u8) << 2);
    }
}

/// Transport Service Type of a REQ.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum TransportType {
    #[default]
    /// Reliable Connected (0).
    Rc,
    /// Unreliable Connected (1).
    Uc,
    /// Reliable Datagram (2).
    Rd,
    /// Value 3, used for XRC.
    Xrc,
}

impl TransportType {
    fn from_bits(v: u8) -> TransportType {
        match v & 3 {
            0 => TransportType::Rc,
            1 => TransportType::Uc,
            2 => TransportType::Rd,
            _ => TransportType::Xrc,
        }
    }
    fn bits(self) -> u8 {
        match self {
            TransportType::Rc => 0,
            TransportType::Uc => 1,
            TransportType::Rd => 2,
            TransportType::Xrc => 3,
        }
    }
}

/// Connection Request (IBA Table 106). `Default`: every field zero, RC.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Req {
    /// Local Communication ID.
    pub local_comm_id: u32,
    /// 24 bits (ECE vendor ID).
    pub vendor_id: u32,
    /// Service ID of the service to connect to.
    pub service_id: u64,
    /// GUID of the sender's channel adapter.
    pub local_ca_guid: u64,
    /// Q_Key of the sender's QP.
    pub local_qkey: u32,
    /// Local QP number (24 bits).
    pub local_qpn: u32,
    /// Responder resources: RDMA READ and atomic requests the sender
    /// accepts outstanding.
    pub responder_resources: u8,
    /// Local EE context number (24 bits; RD only).
    pub local_eecn: u32,
    /// Initiator depth: RDMA READ and atomic requests the sender keeps
    /// outstanding.
    pub initiator_depth: u8,
    /// Remote EE context number (24 bits; RD only).
    pub remote_eecn: u32,
    /// Remote CM response timeout (5 bits): 4.096 µs × 2^value.
    pub remote_cm_response_timeout: u8,
    /// Transport service type.
    pub transport: TransportType,
    /// End-to-end flow control.
    pub flow_control: bool,
    /// 24 bits: the PSN the sender expects to receive first.
    pub starting_psn: u32,
    /// Local CM response timeout (5 bits): 4.096 µs × 2^value.
    pub local_cm_response_timeout: u8,
    /// Retry count (3 bits).
    pub retry_count: u8,
    /// Partition key.
    pub pkey: u16,
    /// 4 bits (IBV MTU code: 3 = 1024).
    pub path_mtu: u8,
    /// RDC exists (RD only).
    pub rdc_exists: bool,
    /// RNR retry count (3 bits).
    pub rnr_retry_count: u8,
    /// Maximum CM retries (4 bits).
    pub max_cm_retries: u8,
    /// The sender's QP uses an SRQ.
    pub srq: bool,
    /// Extended transport type (3 bits).
    pub ext_transport: u8,
    /// Primary path.
    pub primary: Path,
    /// Alternate path.
    pub alternate: Path,
    /// Private data.
    pub private_data: Bytes<{ private_len::REQ }>,
}

impl Req {
    fn parse(m: &[u8; MSG_LEN]) -> Req {
        Req {
            local_comm_id: g32(m, 0),
            vendor_id: g24(m, 5),
            service_id: g64(m, 8),
            local_ca_guid: g64(m, 16),
            local_qkey: g32(m, 28),
            local_qpn: g24(m, 32),
            responder_resources: g8(m, 35),
            local_eecn: g24(m, 36),
            initiator_depth: g8(m, 39),
            remote_eecn: g24(m, 40),
            remote_cm_response_timeout: g8(m, 43) >> 3,
            transport: TransportType::from_bits(g8(m, 43) >> 1),
            flow_control: g8(m, 43) & 1 != 0,
            starting_psn: g24(m, 44),
            local_cm_response_timeout: g8(m, 47) >> 3,
            retry_count: g8(m, 47) & 7,
            pkey: g16(m, 48),
            path_mtu: g8(m, 50) >> 4,
            rdc_exists: g8(m, 50) & 0x08 != 0,
            rnr_retry_count: g8(m, 50) & 7,
            max_cm_retries: g8(m, 51) >> 4,
            srq: g8(m, 51) & 0x08 != 0,
            ext_transport: g8(m, 51) & 7,
            primary: Path::parse(m, 52),
            alternate: Path::parse(m, 96),
            private_data: Bytes(garr(m, 140)),
        }
    }
    fn emit(&self, m: &mut [u8; MSG_LEN]) {
        s32(m, 0, self.local_comm_id);
        s24(m, 5, self.vendor_id & 0xFF_FFFF);
        s64(m, 8, self.service_id);
        s64(m, 16, self.local_ca_guid);
        s32(m, 28, self.local_qkey);
        s24(m, 32, self.local_qpn & 0xFF_FFFF);
        s8(m, 35, self.responder_resources);
        s24(m, 36, self.local_eecn & 0xFF_FFFF);
        s8(m, 39, self.initiator_depth);
        s24(m, 40, self.remote_eecn & 0xFF_FFFF);
        s8(m, 43, (self.remote_cm_response_timeout & 0x1F) << 3 | self.transport.bits() << 1 | self.flow_control as u8);
        s24(m, 44, self.starting_psn & 0xFF_FFFF);
        s8(m, 47, (self.local_cm_response_timeout & 0x1F) << 3 | (self.retry_count & 7));
        s16(m, 48, self.pkey);
        s8(m, 50, (self.path_mtu & 0xF) << 4 | (self.rdc_exists as u8) << 3 | (self.rnr_retry_count & 7));
        s8(m, 51, (self.max_cm_retries & 0xF) << 4 | (self.srq as u8) << 3 | (self.ext_transport & 7));
        self.primary.emit(m, 52);
        self.alternate.emit(m, 96);
        sarr(m, 140, &self.private_data.0);
    }
}

/// Connection Reply (IBA Table 110).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rep {
    /// Local Communication ID.
    pub local_comm_id: u32,
    /// Remote Communication ID.
    pub remote_comm_id: u32,
    /// Q_Key of the sender's QP.
    pub local_qkey: u32,
    /// Local QP number (24 bits).
    pub local_qpn: u32,
    /// Vendor ID (24 bits), split over msg+15, +19, +23.
    pub vendor_id: u32,
    /// Local EE context number (24 bits; RD only).
    pub local_eecn: u32,
    /// 24 bits: the PSN the sender expects to receive first.
    pub starting_psn: u32,
    /// Responder resources: RDMA READ and atomic requests the sender
    /// accepts outstanding.
    pub responder_resources: u8,
    /// Initiator depth: RDMA READ and atomic requests the sender keeps
    /// outstanding.
    pub initiator_depth: u8,
    /// Target ACK delay (5 bits).
    pub target_ack_delay: u8,
    /// Failover accepted (2 bits).
    pub failover_accepted: u8,
    /// End-to-end flow control.
    pub flow_control: bool,
    /// RNR retry count (3 bits).
    pub rnr_retry_count: u8,
    /// The sender's QP uses an SRQ.
    pub srq: bool,
    /// GUID of the sender's channel adapter.
    pub local_ca_guid: u64,
    /// Private data.
    pub private_data: Bytes<{ private_len::REP }>,
}

impl Rep {
    fn parse(m: &[u8; MSG_LEN]) -> Rep {
        Rep {
            local_comm_id: g32(m, 0),
            remote_comm_id: g32(m, 4),
            local_qkey: g32(m, 8),
            local_qpn: g24(m, 12),
            vendor_id: (g8(m, 15) as u32) << 16 | (g8(m, 19) as u32) << 8 | g8(m, 23) as u32,
            local_eecn: g24(m, 16),
            starting_psn: g24(m, 20),
            responder_resources: g8(m, 24),
            initiator_depth: g8(m, 25),
            target_ack_delay: g8(m, 26) >> 3,
            failover_accepted: (g8(m, 26) >> 1) & 3,
            flow_control: g8(m, 26) & 1 != 0,
            rnr_retry_count: g8(m, 27) >> 5,
            srq: g8(m, 27) & 0x10 != 0,
            local_ca_guid: g64(m, 28),
            private_data: Bytes(garr(m, 36)),
        }
    }
    fn emit(&self, m: &mut [u8; MSG_LEN]) {
        s32(m, 0, self.local_comm_id);
        s32(m, 4, self.remote_comm_id);
        s32(m, 8, self.local_qkey);
        s24(m, 12, self.local_qpn & 0xFF_FFFF);
        s8(m, 15, (self.vendor_id >> 16) as u8);
        s24(m, 16, self.local_eecn & 0xFF_FFFF);
        s8(m, 19, (self.vendor_id >> 8) as u8);
        s24(m, 20, self.starting_psn & 0xFF_FFFF);
        s8(m, 23, self.vendor_id as u8);
        s8(m, 24, self.responder_resources);
        s8(m, 25, self.initiator_depth);
        s8(m, 26, (self.target_ack_delay & 0x1F) << 3 | (self.failover_accepted & 3) << 1 | self.flow_control as u8);
        s8(m, 27, (self.rnr_retry_count & 7) << 5 | (self.srq as u8) << 4);
        s64(m, 28, self.local_ca_guid);
        sarr(m, 36, &self.private_data.0);
    }
}

/// Ready To Use (Table 111), and the same layout for DREP (Table 113).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Rtu {
    /// Local Communication ID.
    pub local_comm_id: u32,
    /// Remote Communication ID.
    pub remote_comm_id: u32,
    /// Private data.
    pub private_data: Bytes<{ private_len::RTU }>,
}

/// Disconnect Reply (Table 113).
pub type Drep = Rtu;

impl Rtu {
    fn parse(m: &[u8; MSG_LEN]) -> Rtu {
        Rtu { local_comm_id: g32(m, 0), remote_comm_id: g32(m, 4), private_data: Bytes(garr(m, 8)) }
    }
    fn emit(&self, m: &mut [u8; MSG_LEN]) {
        s32(m, 0, self.local_comm_id);
        s32(m, 4, self.remote_comm_id);
        sarr(m, 8, &self.private_data.0);
    }
}

/// Disconnect Request (Table 112).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Dreq {
    /// Local Communication ID.
    pub local_comm_id: u32,
    /// Remote Communication ID.
    pub remote_comm_id: u32,
    /// 24 bits: the receiver's QPN.
    pub remote_qpn: u32,
    /// Private data.
    pub private_data: Bytes<{ private_len::DREQ }>,
}

impl Dreq {
    fn parse(m: &[u8; MSG_LEN]) -> Dreq {
        Dreq {
            local_comm_id: g32(m, 0),
            remote_comm_id: g32(m, 4),
            remote_qpn: g24(m, 8),
            private_data: Bytes(garr(m, 12)),
        }
    }
    fn emit(&self, m: &mut [u8; MSG_LEN]) {
        s32(m, 0, self.local_comm_id);
        s32(m, 4, self.remote_comm_id);
        s24(m, 8, self.remote_qpn & 0xFF_FFFF);
        sarr(m, 12, &self.private_data.0);
    }
}

/// Which message a REJ or MRA refers to (2 bits).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MsgRef {
    /// The REQ (0).
    Req,
    /// The REP (1).
    Rep,
    /// Another message (2).
    Other,
    /// Reserved value 3.
    Reserved,
}

impl MsgRef {
    fn from_bits(v: u8) -> MsgRef {
        match v & 3 {
            0 => MsgRef::Req,
            1 => MsgRef::Rep,
            2 => MsgRef::Other,
            _ => MsgRef::Reserved,
        }
    }
    fn bits(self) -> u8 {
        match self {
            MsgRef::Req => 0,
            MsgRef::Rep => 1,
            MsgRef::Other => 2,
            MsgRef::Reserved => 3,
        }
    }
}

/// REJ reasons rdma_cm users meet (`k/ib_cm.h` `ib_cm_rej_reason`).
pub mod rej_reason {
    /// No QP available.
    pub const NO_QP: u16 = 1;
    /// Timeout.
    pub const TIMEOUT: u16 = 4;
    /// Invalid Service ID.
    pub const INVALID_SERVICE_ID: u16 = 8;
    /// Stale connection.
    pub const STALE_CONN: u16 = 10;
    /// Invalid GID.
    pub const INVALID_GID: u16 = 12;
    /// Consumer-defined reason.
    pub const CONSUMER_DEFINED: u16 = 28;
    /// Vendor option not supported.
    pub const VENDOR_OPTION_NOT_SUPPORTED: u16 = 35;
}

/// Connection Reject (Table 108).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rej {
    /// Local Communication ID.
    pub local_comm_id: u32,
    /// Remote Communication ID.
    pub remote_comm_id: u32,
    /// Which message is rejected.
    pub msg_rejected: MsgRef,
    /// Length of the additional reject information (7 bits, at most 72).
    pub reject_info_len: u8,
    /// Reject reason (see [`rej_reason`]).
    pub reason: u16,
    /// Additional reject information; only the first `reject_info_len` bytes
    /// count.
    pub ari: Bytes<{ private_len::ARI }>,
    /// Private data.
    pub private_data: Bytes<{ private_len::REJ }>,
}

impl Rej {
    fn parse(m: &[u8; MSG_LEN]) -> Result<Rej, MadError> {
        let reject_info_len = g8(m, 9) >> 1;
        if reject_info_len as usize > private_len::ARI {
            return Err(MadError::Malformed("REJ reject info length over 72"));
        }
        Ok(Rej {
            local_comm_id: g32(m, 0),
            remote_comm_id: g32(m, 4),
            msg_rejected: MsgRef::from_bits(g8(m, 8) >> 6),
            reject_info_len,
            reason: g16(m, 10),
            ari: Bytes(garr(m, 12)),
            private_data: Bytes(garr(m, 84)),
        })
    }
    fn emit(&self, m: &mut [u8; MSG_LEN]) {
        s32(m, 0, self.local_comm_id);
        s32(m, 4, self.remote_comm_id);
        s8(m, 8, self.msg_rejected.bits() << 6);
        s8(m, 9, (self.reject_info_len.min(private_len::ARI as u8) & 0x7F) << 1);
        s16(m, 10, self.reason);
        sarr(m, 12, &self.ari.0);
        sarr(m, 84, &self.private_data.0);
    }
    /// The additional reject information actually carried.
    pub fn ari(&self) -> &[u8] {
        &self.ari.0[..(self.reject_info_len as usize).min(private_len::ARI)]
    }
}

/// Message Receipt Acknowledgement (Table 107).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Mra {
    /// Local Communication ID.
    pub local_comm_id: u32,
    /// Remote Communication ID.
    pub remote_comm_id: u32,
    /// Which message is acknowledged.
    pub msg_mraed: MsgRef,
    /// Service timeout (5 bits): 4.096 µs × 2^value.
    pub service_timeout: u8,
    /// Private data.
    pub private_data: Bytes<{ private_len::MRA }>,
}

impl Mra {
    fn parse(m: &[u8; MSG_LEN]) -> Mra {
        Mra {
            local_comm_id: g32(m, 0),
            remote_comm_id: g32(m, 4),
            msg_mraed: MsgRef::from_bits(g8(m, 8) >> 6),
            service_timeout: g8(m, 9) >> 3,
            private_data: Bytes(garr(m, 10)),
        }
    }
    fn emit(&self, m: &mut [u8; MSG_LEN]) {
        s32(m, 0, self.local_comm_id);
        s32(m, 4, self.remote_comm_id);
        s8(m, 8, self.msg_mraed.bits() << 6);
        s8(m, 9, (self.service_timeout & 0x1F) << 3);
        sarr(m, 10, &self.private_data.0);
    }
}

/// Service ID Resolution Request (Table 119).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SidrReq {
    /// Request ID, echoed in the SIDR_REP.
    pub request_id: u32,
    /// Partition key.
    pub pkey: u16,
    /// Service ID to resolve.
    pub service_id: u64,
    /// Private data.
    pub private_data: Bytes<{ private_len::SIDR_REQ }>,
}

impl SidrReq {
    fn parse(m: &[u8; MSG_LEN]) -> SidrReq {
        SidrReq { request_id: g32(m, 0), pkey: g16(m, 4), service_id: g64(m, 8), private_data: Bytes(garr(m, 16)) }
    }
    fn emit(&self, m: &mut [u8; MSG_LEN]) {
        s32(m, 0, self.request_id);
        s16(m, 4, self.pkey);
        s64(m, 8, self.service_id);
        sarr(m, 16, &self.private_data.0);
    }
}

/// SIDR_REP status values (`k/ib_cm.h` `ib_cm_sidr_status`).
pub mod sidr_status {
    /// The service was found.
    pub const SUCCESS: u8 = 0;
    /// Service ID not supported.
    pub const UNSUPPORTED: u8 = 1;
    /// Rejected by the service.
    pub const REJECT: u8 = 2;
    /// No QP available.
    pub const NO_QP: u8 = 3;
    /// Redirect.
    pub const REDIRECT: u8 = 4;
    /// Unsupported version.
    pub const UNSUPPORTED_VERSION: u8 = 5;
}

/// Service ID Resolution Response (Table 120).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SidrRep {
    /// Request ID of the SIDR_REQ answered.
    pub request_id: u32,
    /// Status (see [`sidr_status`]).
    pub status: u8,
    /// Length of the additional information, at most 72.
    pub add_info_len: u8,
    /// QP number of the service (24 bits).
    pub qpn: u32,
    /// Service ID resolved.
    pub service_id: u64,
    /// Q_Key of the service's QP.
    pub qkey: u32,
    /// Additional information; only the first `add_info_len` bytes count.
    pub add_info: Bytes<{ private_len::ARI }>,
    /// Private data.
    pub private_data: Bytes<{ private_len::SIDR_REP }>,
}

impl SidrRep {
    fn parse(m: &[u8; MSG_LEN]) -> Result<SidrRep, MadError> {
        let add_info_len = g8(m, 5);
        if add_info_len as usize > private_len::ARI {
            return Err(MadError::Malformed("SIDR_REP additional info length over 72"));
        }
        Ok(SidrRep {
            request_id: g32(m, 0),
            status: g8(m, 4),
            add_info_len,
            qpn: g24(m, 8),
            service_id: g64(m, 12),
            qkey: g32(m, 20),
            add_info: Bytes(garr(m, 24)),
            private_data: Bytes(garr(m, 96)),
        })
    }
    fn emit(&self, m: &mut [u8; MSG_LEN]) {
        s32(m, 0, self.request_id);
        s8(m, 4, self.status);
        s8(m, 5, self.add_info_len.min(private_len::ARI as u8));
        s24(m, 8, self.qpn & 0xFF_FFFF);
        s64(m, 12, self.service_id);
        s32(m, 20, self.qkey);
        sarr(m, 24, &self.add_info.0);
        sarr(m, 96, &self.private_data.0);
    }
}

/// A CM message of one of the attributes this CM handles.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CmMsg {
    /// Connection Request.
    Req(Box<Req>),
    /// Message Receipt Acknowledgement.
    Mra(Box<Mra>),
    /// Connection Reject.
    Rej(Box<Rej>),
    /// Connection Reply.
    Rep(Box<Rep>),
    /// Ready To Use.
    Rtu(Box<Rtu>),
    /// Disconnect Request.
    Dreq(Box<Dreq>),
    /// Disconnect Reply.
    Drep(Box<Drep>),
    /// Service ID Resolution Request.
    SidrReq(Box<SidrReq>),
    /// Service ID Resolution Response.
    SidrRep(Box<SidrRep>),
}

impl CmMsg {
    /// The message's attribute ID (see [`attr`]).
    pub fn attr_id(&self) -> u16 {
        match self {
            CmMsg::Req(_) => attr::REQ,
            CmMsg::Mra(_) => attr::MRA,
            CmMsg::Rej(_) => attr::REJ,
            CmMsg::Rep(_) => attr::REP,
            CmMsg::Rtu(_) => attr::RTU,
            CmMsg::Dreq(_) => attr::DREQ,
            CmMsg::Drep(_) => attr::DREP,
            CmMsg::SidrReq(_) => attr::SIDR_REQ,
            CmMsg::SidrRep(_) => attr::SIDR_REP,
        }
    }
    /// The message's name as the IBA and tshark spell it.
    pub fn name(&self) -> &'static str {
        attr_name(self.attr_id())
    }
}

/// The name of a CM attribute ID ("ClassPortInfo", "REQ", …, "?" if unknown).
pub fn attr_name(id: u16) -> &'static str {
    match id {
        attr::CLASS_PORT_INFO => "ClassPortInfo",
        attr::REQ => "REQ",
        attr::MRA => "MRA",
        attr::REJ => "REJ",
        attr::REP => "REP",
        attr::RTU => "RTU",
        attr::DREQ => "DREQ",
        attr::DREP => "DREP",
        attr::SIDR_REQ => "SIDR_REQ",
        attr::SIDR_REP => "SIDR_REP",
        attr::LAP => "LAP",
        attr::APR => "APR",
        _ => "?",
    }
}

/// A whole CM MAD: header fields that vary plus the message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CmMad {
    /// TransactionID.
    pub tid: u64,
    /// 0 on rxe; newer kernels carry ECE options here in REQ/REP.
    pub attr_mod: u32,
    /// The CM message.
    pub msg: CmMsg,
}

impl CmMad {
    /// A MAD of `msg` with TransactionID `tid` and AttributeModifier 0.
    pub fn new(tid: u64, msg: CmMsg) -> CmMad {
        CmMad { tid, attr_mod: 0, msg }
    }

    /// Parses one MAD (exactly 256 bytes). LAP/APR, ClassPortInfo and
    /// unknown attributes are `UnknownAttribute` (the CM drops them).
    pub fn parse(b: &[u8]) -> Result<CmMad, MadError> {
        let v = MadView::new_checked(b)?;
        v.check_cm()?;
        let m = v.message();
        let msg = match v.attr_id() {
            attr::REQ => CmMsg::Req(Box::new(Req::parse(m))),
            attr::MRA => CmMsg::Mra(Box::new(Mra::parse(m))),
            attr::REJ => CmMsg::Rej(Box::new(Rej::parse(m)?)),
            attr::REP => CmMsg::Rep(Box::new(Rep::parse(m))),
            attr::RTU => CmMsg::Rtu(Box::new(Rtu::parse(m))),
            attr::DREQ => CmMsg::Dreq(Box::new(Dreq::parse(m))),
            attr::DREP => CmMsg::Drep(Box::new(Drep::parse(m))),
            attr::SIDR_REQ => CmMsg::SidrReq(Box::new(SidrReq::parse(m))),
            attr::SIDR_REP => CmMsg::SidrRep(Box::new(SidrRep::parse(m)?)),
            other => return Err(MadError::UnknownAttribute(other)),
        };
        Ok(CmMad { tid: v.tid(), attr_mod: v.attr_mod(), msg })
    }

    /// Writes the MAD into the first 256 bytes of `b`.
    pub fn emit(&self, b: &mut [u8]) -> Result<(), MadError> {
        let out: &mut [u8; MAD_LEN] =
            b.get_mut(..MAD_LEN).and_then(|s| s.try_into().ok()).ok_or(MadError::BufferTooSmall)?;
        out.fill(0);
        out[0] = BASE_VERSION;
        out[1] = MGMT_CLASS_CM;
        out[2] = CM_CLASS_VERSION;
        out[3] = METHOD_SEND;
        out[8..16].copy_from_slice(&self.tid.to_be_bytes());
        out[16..18].copy_from_slice(&self.msg.attr_id().to_be_bytes());
        out[20..24].copy_from_slice(&self.attr_mod.to_be_bytes());
        let m: &mut [u8; MSG_LEN] = (&mut out[MAD_HDR_LEN..]).try_into().map_err(|_| MadError::BufferTooSmall)?;
        match &self.msg {
            CmMsg::Req(x) => x.emit(m),
            CmMsg::Mra(x) => x.emit(m),
            CmMsg::Rej(x) => x.emit(m),
            CmMsg::Rep(x) => x.emit(m),
            CmMsg::Rtu(x) => x.emit(m),
            CmMsg::Dreq(x) => x.emit(m),
            CmMsg::Drep(x) => x.emit(m),
            CmMsg::SidrReq(x) => x.emit(m),
            CmMsg::SidrRep(x) => x.emit(m),
        }
        Ok(())
    }

    /// The MAD as 256 bytes.
    pub fn to_bytes(&self) -> [u8; MAD_LEN] {
        let mut b = [0u8; MAD_LEN];
        // Cannot fail: the buffer is exactly one MAD.
        let _ = self.emit(&mut b);
        b
    }
}

/// One line naming a MAD and its main fields (for `uroce decode`).
pub fn summarize(mad: &[u8]) -> String {
    let m = match CmMad::parse(mad) {
        Ok(m) => m,
        Err(MadError::UnknownAttribute(id)) => {
            return format!("CM {} (attribute {id:#06x}, not handled)", attr_name(id))
        }
        Err(e) => return format!("MAD: {e}"),
    };
    let ids = |l: u32, r: u32| format!("lcid={l:#010x} rcid={r:#010x}");
    let body = match &m.msg {
        CmMsg::Req(r) => {
            let hdr = super::cm_service::CmaHdr::parse(r.private_data.as_slice())
                .map_or_else(|e| format!(" ({e})"), |h| format!(" ip {}:{} -> {}", h.src, h.src_port, h.dst));
            format!(
                "lcid={:#010x} sid={:#018x} guid={:#018x} qpn={:#08x} psn={:#08x} rr={} id={} retry={} rnr={} \
                 mtu={} flow={:#07x} ack_timeout={}{hdr}",
                r.local_comm_id,
                r.service_id,
                r.local_ca_guid,
                r.local_qpn,
                r.starting_psn,
                r.responder_resources,
                r.initiator_depth,
                r.retry_count,
                r.rnr_retry_count,
                r.path_mtu,
                r.primary.flow_label,
                r.primary.local_ack_timeout
            )
        }
        CmMsg::Rep(r) => format!(
            "{} qpn={:#08x} psn={:#08x} rr={} id={} rnr={} tad={} guid={:#018x}",
            ids(r.local_comm_id, r.remote_comm_id),
            r.local_qpn,
            r.starting_psn,
            r.responder_resources,
            r.initiator_depth,
            r.rnr_retry_count,
            r.target_ack_delay,
            r.local_ca_guid
        ),
        CmMsg::Rtu(r) | CmMsg::Drep(r) => ids(r.local_comm_id, r.remote_comm_id),
        CmMsg::Dreq(d) => format!("{} remote_qpn={:#08x}", ids(d.local_comm_id, d.remote_comm_id), d.remote_qpn),
        CmMsg::Rej(r) => format!(
            "{} reason={} msg={:?} ari_len={}",
            ids(r.local_comm_id, r.remote_comm_id),
            r.reason,
            r.msg_rejected,
            r.reject_info_len
        ),
        CmMsg::Mra(x) => format!(
            "{} msg={:?} service_timeout={}",
            ids(x.local_comm_id, x.remote_comm_id),
            x.msg_mraed,
            x.service_timeout
        ),
        CmMsg::SidrReq(x) => format!("req_id={:#010x} sid={:#018x}", x.request_id, x.service_id),
        CmMsg::SidrRep(x) => {
            format!("req_id={:#010x} status={} qpn={:#08x} qkey={:#010x}", x.request_id, x.status, x.qpn, x.qkey)
        }
    };
    format!("CM {} tid={:#018x} {body}", m.msg.name(), m.tid)
}

/// The TransactionID Linux forms for a CM request sent by the agent
/// `hi_tid`: the low word is the local comm ID's wire bytes read as a
/// little-endian integer (`k/cm.c` `cm_form_tid` on x86).
pub fn form_tid(hi_tid: u32, local_comm_id: u32) -> u64 {
    (hi_tid as u64) << 32 | local_comm_id.swap_bytes() as u64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_length_but_256_is_refused() {
        for n in [0, 1, 24, 255, 257, 4096] {
            assert_eq!(CmMad::parse(&vec![0u8; n]), Err(MadError::BadLength(n)));
        }
    }

    #[test]
    fn header_checks_in_order() {
        let mut b = [0u8; MAD_LEN];
        assert_eq!(CmMad::parse(&b), Err(MadError::BadBaseVersion(0)));
        b[0] = 1;
        b[1] = 0x07;
        b[2] = 1;
        assert_eq!(CmMad::parse(&b), Err(MadError::NotCm(7, 1)));
        b[2] = 2;
        b[3] = 0x01;
        assert_eq!(CmMad::parse(&b), Err(MadError::BadMethod(1)));
        b[3] = 3;
        b[17] = 0x19;
        assert_eq!(CmMad::parse(&b), Err(MadError::UnknownAttribute(attr::LAP)));
        b[17] = 0x14;
        assert!(matches!(CmMad::parse(&b).unwrap().msg, CmMsg::Rtu(_)));
    }

    #[test]
    fn rej_and_sidr_rep_lengths_are_checked() {
        let rej = CmMad::new(
            1,
            CmMsg::Rej(Box::new(Rej {
                local_comm_id: 0,
                remote_comm_id: 0x1234,
                msg_rejected: MsgRef::Req,
                reject_info_len: 8,
                reason: rej_reason::INVALID_SERVICE_ID,
                ari: Bytes::from_prefix(&[1, 2, 3, 4, 5, 6, 7, 8]).unwrap(),
                private_data: Bytes::default(),
            })),
        );
        let mut b = rej.to_bytes();
        assert_eq!(b[24 + 9], 8 << 1);
        assert_eq!(u16::from_be_bytes([b[34], b[35]]), 8);
        assert_eq!(CmMad::parse(&b).unwrap(), rej);
        b[24 + 9] = 73 << 1;
        assert!(matches!(CmMad::parse(&b), Err(MadError::Malformed(_))));

        let rep = CmMad::new(
            2,
            CmMsg::SidrRep(Box::new(SidrRep {
                request_id: 7,
                status: sidr_status::SUCCESS,
                add_info_len: 0,
                qpn: 0x11,
                service_id: 0x0111_0000 + 7,
                qkey: 0x0123_4567,
                add_info: Bytes::default(),
                private_data: Bytes::from_prefix(b"hello").unwrap(),
            })),
        );
        let mut b = rep.to_bytes();
        assert_eq!(CmMad::parse(&b).unwrap(), rep);
        b[24 + 5] = 73;
        assert!(matches!(CmMad::parse(&b), Err(MadError::Malformed(_))));
    }

    #[test]
    fn rep_vendor_id_is_split_over_three_bytes() {
        let mut b = [0u8; MAD_LEN];
        b[..4].copy_from_slice(&[1, 7, 2, 3]);
        b[17] = 0x13;
        b[24 + 15] = 0xAA;
        b[24 + 19] = 0xBB;
        b[24 + 23] = 0xCC;
        let m = CmMad::parse(&b).unwrap();
        let CmMsg::Rep(r) = &m.msg else { panic!() };
        assert_eq!(r.vendor_id, 0xAABBCC);
        assert_eq!(r.local_qpn, 0);
        assert_eq!(r.starting_psn, 0);
        assert_eq!(m.to_bytes(), b);
    }

    #[test]
    fn tid_low_word_is_the_comm_id_bytes_reversed() {
        // rdma_cm#1: comm ID wire bytes 64 c0 c5 6d, TID 00 00 00 02 6d c5 c0 64.
        assert_eq!(form_tid(2, 0x64c0_c56d).to_be_bytes(), [0, 0, 0, 2, 0x6d, 0xc5, 0xc0, 0x64]);
    }

    #[test]
    fn bytes_from_prefix_refuses_overflow() {
        assert!(Bytes::<4>::from_prefix(&[1, 2, 3, 4, 5]).is_none());
        assert_eq!(Bytes::<4>::from_prefix(&[1, 2]).unwrap().0, [1, 2, 0, 0]);
    }

    mod fuzz {
        use super::super::*;
        use proptest::prelude::*;

        proptest! {
            #![proptest_config(ProptestConfig { cases: 2048, ..ProptestConfig::default() })]

            #[test]
            fn arbitrary_bytes_never_panic(b in proptest::collection::vec(any::<u8>(), 0..300)) {
                let _ = CmMad::parse(&b);
            }

            #[test]
            fn any_cm_mad_parses_to_a_fixed_point(
                attr_lo in 0x0eu8..0x1c,
                tid in any::<u64>(),
                body in proptest::collection::vec(any::<u8>(), MSG_LEN),
            ) {
                let mut b = [0u8; MAD_LEN];
                b[..4].copy_from_slice(&[1, 7, 2, 3]);
                b[8..16].copy_from_slice(&tid.to_be_bytes());
                b[17] = attr_lo;
                b[MAD_HDR_LEN..].copy_from_slice(&body);
                if let Ok(m) = CmMad::parse(&b) {
                    prop_assert_eq!(m.tid, tid);
                    let again = CmMad::parse(&m.to_bytes()).unwrap();
                    prop_assert_eq!(&again, &m);
                    prop_assert_eq!(again.to_bytes(), m.to_bytes());
                }
            }
        }
    }
}
