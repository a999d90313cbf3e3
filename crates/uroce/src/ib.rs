//! The verbs vocabulary: enums, flags and small value types of the InfiniBand
//! Architecture as libibverbs (rdma-core 44) numbers them.
//!
//! Every other module speaks in these types, and their discriminants are the
//! libibverbs values, so the C ABI converts with a cast and nothing else.

use bitflags::bitflags;

/// An errno value, as every verbs call reports failure.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Errno(pub i32);

impl Errno {
    /// Operation not permitted.
    pub const EPERM: Errno = Errno(libc::EPERM);
    /// No such file or directory.
    pub const ENOENT: Errno = Errno(libc::ENOENT);
    /// Input/output error.
    pub const EIO: Errno = Errno(libc::EIO);
    /// Resource temporarily unavailable.
    pub const EAGAIN: Errno = Errno(libc::EAGAIN);
    /// Cannot allocate memory.
    pub const ENOMEM: Errno = Errno(libc::ENOMEM);
    /// Permission denied.
    pub const EACCES: Errno = Errno(libc::EACCES);
    /// Bad address.
    pub const EFAULT: Errno = Errno(libc::EFAULT);
    /// Device or resource busy.
    pub const EBUSY: Errno = Errno(libc::EBUSY);
    /// File exists.
    pub const EEXIST: Errno = Errno(libc::EEXIST);
    /// No such device.
    pub const ENODEV: Errno = Errno(libc::ENODEV);
    /// Invalid argument.
    pub const EINVAL: Errno = Errno(libc::EINVAL);
    /// No space left on device.
    pub const ENOSPC: Errno = Errno(libc::ENOSPC);
    /// Function not implemented.
    pub const ENOSYS: Errno = Errno(libc::ENOSYS);
    /// No data available.
    pub const ENODATA: Errno = Errno(libc::ENODATA);
    /// Operation not supported.
    pub const EOPNOTSUPP: Errno = Errno(libc::EOPNOTSUPP);
    /// Address already in use.
    pub const EADDRINUSE: Errno = Errno(libc::EADDRINUSE);
    /// Cannot assign requested address.
    pub const EADDRNOTAVAIL: Errno = Errno(libc::EADDRNOTAVAIL);
    /// Operation not supported (the same value as `EOPNOTSUPP` on Linux).
    pub const ENOTSUP: Errno = Errno(libc::ENOTSUP);
}

impl std::fmt::Display for Errno {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} (errno {})", std::io::Error::from_raw_os_error(self.0), self.0)
    }
}

/// The error of a verbs call: the errno a real device returns, and why.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{what}: {errno}")]
pub struct Error {
    /// The errno the call fails with.
    pub errno: Errno,
    /// What failed, and why (for messages).
    pub what: std::borrow::Cow<'static, str>,
}

impl Error {
    /// An error with `errno`, described by `what`.
    pub fn new(errno: Errno, what: impl Into<std::borrow::Cow<'static, str>>) -> Self {
        Error { errno, what: what.into() }
    }
    /// An EINVAL error described by `what`.
    pub fn inval(what: impl Into<std::borrow::Cow<'static, str>>) -> Self {
        Self::new(Errno::EINVAL, what)
    }
}

impl From<Error> for std::io::Error {
    fn from(e: Error) -> Self {
        std::io::Error::new(std::io::Error::from_raw_os_error(e.errno.0).kind(), e)
    }
}

/// The result of a verbs call.
pub type Result<T, E = Error> = std::result::Result<T, E>;

macro_rules! c_enum {
    ($(#[$m:meta])* pub enum $name:ident { $($(#[$vm:meta])* $v:ident = $n:expr),* $(,)? }) => {
        $(#[$m])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
        #[repr(u32)]
        pub enum $name { $($(#[$vm])* $v = $n),* }
        impl $name {
            /// The libibverbs value.
            pub fn to_raw(self) -> u32 { self as u32 }
            /// From a libibverbs value; `None` when out of range.
            pub fn from_raw(v: u32) -> Option<Self> {
                match v { $(x if x == $n => Some($name::$v),)* _ => None }
            }
        }
    };
}

c_enum! {
    /// `enum ibv_qp_type`. An XRC connection has two halves: XRC_SEND, the
    /// initiator (a send queue only), and XRC_RECV, the target in an XRC
    /// domain (no queues: each request names one of the domain's SRQs).
    pub enum QpType {
        /// `IBV_QPT_RC`: reliable connected.
        Rc = 2,
        /// `IBV_QPT_UC`: unreliable connected.
        Uc = 3,
        /// `IBV_QPT_UD`: unreliable datagram.
        Ud = 4,
        /// `IBV_QPT_XRC_SEND`: the initiator half of XRC.
        XrcSend = 9,
        /// `IBV_QPT_XRC_RECV`: the target half of XRC.
        XrcRecv = 10,
    }
}

impl QpType {
    /// The reliable connected service: RC and both halves of XRC
    /// acknowledge, retry and execute in order.
    pub fn is_reliable(self) -> bool {
        matches!(self, QpType::Rc | QpType::XrcSend | QpType::XrcRecv)
    }

    /// A connected type, which the connection manager connects: every
    /// type but UD.
    pub fn is_connected(self) -> bool {
        self != QpType::Ud
    }
}

c_enum! {
    /// `enum ibv_qp_state`.
    pub enum QpState {
        /// `IBV_QPS_RESET`: reset state.
        Reset = 0,
        /// `IBV_QPS_INIT`: initialized state.
        Init = 1,
        /// `IBV_QPS_RTR`: ready to receive state.
        Rtr = 2,
        /// `IBV_QPS_RTS`: ready to send state.
        Rts = 3,
        /// `IBV_QPS_SQD`: send queue drain state.
        Sqd = 4,
        /// `IBV_QPS_SQE`: send queue error state.
        Sqe = 5,
        /// `IBV_QPS_ERR`: error state.
        Err = 6,
    }
}

c_enum! {
    /// `enum ibv_mtu`.
    pub enum Mtu {
        /// `IBV_MTU_256`: 256 bytes.
        Mtu256 = 1,
        /// `IBV_MTU_512`: 512 bytes.
        Mtu512 = 2,
        /// `IBV_MTU_1024`: 1024 bytes.
        Mtu1024 = 3,
        /// `IBV_MTU_2048`: 2048 bytes.
        Mtu2048 = 4,
        /// `IBV_MTU_4096`: 4096 bytes.
        Mtu4096 = 5,
    }
}

impl Mtu {
    /// The MTU in bytes.
    pub fn bytes(self) -> u32 {
        128 << (self as u32)
    }
    /// The largest IB MTU not above `bytes` (clamped to 256..4096).
    pub fn from_bytes_floor(bytes: u32) -> Mtu {
        match bytes {
            0..=511 => Mtu::Mtu256,
            512..=1023 => Mtu::Mtu512,
            1024..=2047 => Mtu::Mtu1024,
            2048..=4095 => Mtu::Mtu2048,
            _ => Mtu::Mtu4096,
        }
    }
}

c_enum! {
    /// `enum ibv_wc_status`.
    pub enum WcStatus {
        /// The work request (and the unsignaled ones posted before it)
        /// completed; its buffers may be reused.
        Success = 0,
        /// Local length error: a message longer than the port's maximum, or
        /// longer than the receive buffer that took it.
        LocLenErr = 1,
        /// Local QP operation error: the work request is inconsistent with
        /// its QP (an opcode its transport lacks, an AH of another PD).
        LocQpOpErr = 2,
        /// Local EE context operation error (RD only).
        LocEecOpErr = 3,
        /// Local protection error: the scatter/gather list names no memory
        /// region valid for the operation.
        LocProtErr = 4,
        /// Work request flushed: outstanding when the QP entered the error
        /// state.
        WrFlushErr = 5,
        /// Memory window bind error.
        MwBindErr = 6,
        /// Bad response error: the responder returned an unexpected
        /// transport opcode.
        BadRespErr = 7,
        /// Local access error: a protection error on a local buffer while
        /// executing the peer's RDMA Write with Immediate.
        LocAccessErr = 8,
        /// Remote invalid request error: the responder found the request
        /// invalid (an operation its QP does not allow, a length over 2^31).
        RemInvReqErr = 9,
        /// Remote access error: a protection error on the remote buffer of
        /// an RDMA Read, RDMA Write or atomic.
        RemAccessErr = 10,
        /// Remote operation error: the responder could not complete the
        /// operation.
        RemOpErr = 11,
        /// Transport retry counter exceeded: the peer sent no ACK or NAK.
        RetryExcErr = 12,
        /// RNR retry counter exceeded: the peer kept answering RNR NAK (no
        /// receive posted).
        RnrRetryExcErr = 13,
        /// Local RDD violation error (RD only).
        LocRddViolErr = 14,
        /// Remote invalid RD request (RD only).
        RemInvRdReqErr = 15,
        /// Remote aborted error: the responder aborted the operation.
        RemAbortErr = 16,
        /// Invalid EE context number (RD only).
        InvEecnErr = 17,
        /// Invalid EE context state (RD only).
        InvEecStateErr = 18,
        /// Fatal error.
        FatalErr = 19,
        /// Response timeout error.
        RespTimeoutErr = 20,
        /// General error: none of the above.
        GeneralErr = 21,
        /// Tag matching error.
        TmErr = 22,
        /// Tag matching: rendezvous left to software.
        TmRndvIncomplete = 23,
    }
}

impl WcStatus {
    /// The text of `ibv_wc_status_str`.
    pub fn as_str(self) -> &'static str {
        use WcStatus::*;
        match self {
            Success => "success",
            LocLenErr => "local length error",
            LocQpOpErr => "local QP operation error",
            LocEecOpErr => "local EE context operation error",
            LocProtErr => "local protection error",
            WrFlushErr => "Work Request Flushed Error",
            MwBindErr => "memory management operation error",
            BadRespErr => "bad response error",
            LocAccessErr => "local access error",
            RemInvReqErr => "remote invalid request error",
            RemAccessErr => "remote access error",
            RemOpErr => "remote operation error",
            RetryExcErr => "transport retry counter exceeded",
            RnrRetryExcErr => "RNR retry counter exceeded",
            LocRddViolErr => "local RDD violation error",
            RemInvRdReqErr => "remote invalid RD request",
            RemAbortErr => "aborted error",
            InvEecnErr => "invalid EE context number",
            InvEecStateErr => "invalid EE context state",
            FatalErr => "fatal error",
            RespTimeoutErr => "response timeout error",
            GeneralErr => "general error",
            TmErr => "TM error",
            TmRndvIncomplete => "TM software rendezvous",
        }
    }
}

c_enum! {
    /// `enum ibv_wc_opcode`.
    pub enum WcOpcode {
        /// A send (with or without immediate) completed.
        Send = 0,
        /// An RDMA Write (with or without immediate) completed.
        RdmaWrite = 1,
        /// An RDMA Read completed.
        RdmaRead = 2,
        /// An atomic compare and swap completed.
        CompSwap = 3,
        /// An atomic fetch and add completed.
        FetchAdd = 4,
        /// A memory window bind completed.
        BindMw = 5,
        /// A local invalidate completed.
        LocalInv = 6,
        /// A TSO (segmentation offload) send completed.
        Tso = 7,
        /// An atomic write completed.
        AtomicWrite = 9,
        /// A send (with or without immediate) was received.
        Recv = 128,
        /// An RDMA Write with immediate consumed a receive request.
        RecvRdmaWithImm = 129,
        /// `IBV_WC_DRIVER1`, mlx5's `MLX5DV_WC_UMR`.
        Umr = 135,
    }
}

bitflags! {
    /// `enum ibv_access_flags`.
    #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
    pub struct Access: u32 {
        /// Local write access (required with remote write or atomic).
        const LOCAL_WRITE = 1;
        /// Remote write access.
        const REMOTE_WRITE = 1 << 1;
        /// Remote read access.
        const REMOTE_READ = 1 << 2;
        /// Remote atomic access.
        const REMOTE_ATOMIC = 1 << 3;
        /// Memory windows may be bound to the region.
        const MW_BIND = 1 << 4;
        /// Addressed by byte offset from the region's start, not by virtual
        /// address.
        const ZERO_BASED = 1 << 5;
        /// On-demand paging region.
        const ON_DEMAND = 1 << 6;
        /// Huge pages are guaranteed (explicit on-demand paging only).
        const HUGETLB = 1 << 7;
        /// The device may relax the order in which data reaches the region.
        const RELAXED_ORDERING = 1 << 20;
    }
}

/// Entries in the port's GID table. As on a real RoCE port (rxe has 1024,
/// mlx5 256), the table is longer than what is populated: uroce fills index
/// 0 only. Short, so that programs walking the table (perftest's choice of
/// GID, `ibv_devinfo -v`) stay quick. An empty entry within the table is
/// ENODATA, an index past it EINVAL, as the kernel's `rdma_get_gid_attr`.
pub const GID_TABLE_LEN: u32 = 16;

/// The error for source GID index `index` of a table whose first
/// `populated` entries are set: `None` when the entry is usable.
pub fn check_sgid_index(index: u32, populated: usize, what: &str) -> Option<Error> {
    if (index as usize) < populated {
        None
    } else if index < GID_TABLE_LEN {
        Some(Error::new(Errno::ENODATA, format!("{what}: GID entry {index} is empty")))
    } else {
        Some(Error::inval(format!("{what}: sgid_index {index} is past the GID table")))
    }
}

/// `IBV_ACCESS_OPTIONAL_RANGE`: bits a device without them silently ignores.
pub const ACCESS_OPTIONAL_RANGE: u32 = 0x3FF0_0000;

bitflags! {
    /// `enum ibv_send_flags`.
    #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
    pub struct SendFlags: u32 {
        /// Fence indicator: wait for prior RDMA Reads and atomics (RC).
        const FENCE = 1;
        /// Generate a completion (when the QP does not signal all).
        const SIGNALED = 1 << 1;
        /// Solicited event indicator (Send and RDMA Write with immediate).
        const SOLICITED = 1 << 2;
        /// Copy the gather list's data into the request; lkeys are not
        /// checked (Send and RDMA Write).
        const INLINE = 1 << 3;
        /// Offload the IPv4 and TCP/UDP checksums.
        const IP_CSUM = 1 << 4;
    }
}

bitflags! {
    /// `enum ibv_wc_flags`.
    #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
    pub struct WcFlags: u32 {
        /// A GRH precedes the data in the receive buffer (UD).
        const GRH = 1;
        /// `imm_data` holds immediate data.
        const WITH_IMM = 1 << 1;
        /// The IPv4 header and TCP/UDP checksums were verified.
        const IP_CSUM_OK = 1 << 2;
        /// `imm_data` holds the rkey the message invalidated.
        const WITH_INV = 1 << 3;
        /// Tag matching: a synchronization is requested.
        const TM_SYNC_REQ = 1 << 4;
        /// Tag matching: the message matched a posted tag.
        const TM_MATCH = 1 << 5;
        /// Tag matching: the matched message's data is in place.
        const TM_DATA_VALID = 1 << 6;
    }
}

bitflags! {
    /// `enum ibv_qp_attr_mask`.
    #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
    pub struct QpAttrMask: u32 {
        /// `qp_state` is set.
        const STATE = 1;
        /// `cur_qp_state` is set.
        const CUR_STATE = 1 << 1;
        /// `en_sqd_async_notify` is set.
        const EN_SQD_ASYNC_NOTIFY = 1 << 2;
        /// `qp_access_flags` is set.
        const ACCESS_FLAGS = 1 << 3;
        /// `pkey_index` is set.
        const PKEY_INDEX = 1 << 4;
        /// `port_num` is set.
        const PORT = 1 << 5;
        /// `qkey` is set.
        const QKEY = 1 << 6;
        /// `ah_attr` (the primary path) is set.
        const AV = 1 << 7;
        /// `path_mtu` is set.
        const PATH_MTU = 1 << 8;
        /// `timeout` (local ACK timeout) is set.
        const TIMEOUT = 1 << 9;
        /// `retry_cnt` is set.
        const RETRY_CNT = 1 << 10;
        /// `rnr_retry` is set.
        const RNR_RETRY = 1 << 11;
        /// `rq_psn` is set.
        const RQ_PSN = 1 << 12;
        /// `max_rd_atomic` is set.
        const MAX_QP_RD_ATOMIC = 1 << 13;
        /// The alternate path (`alt_ah_attr`, `alt_pkey_index`, `alt_port_num`, `alt_timeout`) is set.
        const ALT_PATH = 1 << 14;
        /// `min_rnr_timer` is set.
        const MIN_RNR_TIMER = 1 << 15;
        /// `sq_psn` is set.
        const SQ_PSN = 1 << 16;
        /// `max_dest_rd_atomic` is set.
        const MAX_DEST_RD_ATOMIC = 1 << 17;
        /// `path_mig_state` is set.
        const PATH_MIG_STATE = 1 << 18;
        /// `cap` is set.
        const CAP = 1 << 19;
        /// `dest_qp_num` is set.
        const DEST_QPN = 1 << 20;
        /// `rate_limit` is set.
        const RATE_LIMIT = 1 << 25;
    }
}

c_enum! {
    /// `enum ibv_event_type`.
    pub enum AsyncEventType {
        /// A CQ is in error (overrun).
        CqErr = 0,
        /// An error occurred on a QP and it moved to the error state.
        QpFatal = 1,
        /// Invalid request local work queue error on a QP.
        QpReqErr = 2,
        /// Local access violation error on a QP.
        QpAccessErr = 3,
        /// Communication was established on a QP (data arrived in RTR).
        CommEst = 4,
        /// A QP's send queue was drained of outstanding messages (SQD).
        SqDrained = 5,
        /// A connection migrated to the alternate path.
        PathMig = 6,
        /// A connection failed to migrate to the alternate path.
        PathMigErr = 7,
        /// The device is in the fatal state.
        DeviceFatal = 8,
        /// The link of a port became active.
        PortActive = 9,
        /// The link of a port became unavailable.
        PortErr = 10,
        /// A port's LID changed.
        LidChange = 11,
        /// A port's P_Key table changed.
        PkeyChange = 12,
        /// A port's subnet manager changed.
        SmChange = 13,
        /// An error occurred on an SRQ.
        SrqErr = 14,
        /// An SRQ's receive count fell below its limit.
        SrqLimitReached = 15,
        /// The last WQE of a QP attached to an SRQ was reached.
        QpLastWqeReached = 16,
        /// The subnet manager asked a port's clients to register again.
        ClientReregister = 17,
        /// A port's GID table changed.
        GidChange = 18,
        /// An error occurred on a WQ and it moved to the error state.
        WqFatal = 19,
    }
}

/// A 16-byte GID. For RoCEv2 it is an IPv6 address, or an IPv4 address mapped
/// as `::ffff:a.b.c.d`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Gid(pub [u8; 16]);

impl Gid {
    /// The GID of `ip` (an IPv4 address v4-mapped).
    pub fn from_ip(ip: std::net::IpAddr) -> Gid {
        match ip {
            std::net::IpAddr::V4(v4) => Gid(v4.to_ipv6_mapped().octets()),
            std::net::IpAddr::V6(v6) => Gid(v6.octets()),
        }
    }
    /// The IP address this GID stands for (v4-mapped GIDs give IPv4).
    pub fn to_ip(self) -> std::net::IpAddr {
        let v6 = std::net::Ipv6Addr::from(self.0);
        match v6.to_ipv4_mapped() {
            Some(v4) => std::net::IpAddr::V4(v4),
            None => std::net::IpAddr::V6(v6),
        }
    }
    /// Whether this GID stands for `ip`: `self.to_ip() == ip`, without
    /// building the address (a check made on every received packet).
    #[inline]
    pub fn is_ip(self, ip: std::net::IpAddr) -> bool {
        match ip {
            std::net::IpAddr::V4(v4) => self.0 == v4.to_ipv6_mapped().octets(),
            // A v4-mapped GID stands for an IPv4 address, never this one.
            std::net::IpAddr::V6(v6) => self.0 == v6.octets() && v6.to_ipv4_mapped().is_none(),
        }
    }
    /// Whether all 16 bytes are zero.
    pub fn is_zero(self) -> bool {
        self.0 == [0; 16]
    }
}

/// Scatter/gather element: `struct ibv_sge`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Sge {
    /// Start address of the buffer.
    pub addr: u64,
    /// Length of the buffer in bytes.
    pub length: u32,
    /// Local key of the memory region the buffer is in.
    pub lkey: u32,
}

/// A work completion: `struct ibv_wc`. `imm_data` holds the immediate (or the
/// invalidated rkey) as the 32-bit value carried on the wire, in host order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Wc {
    /// The `wr_id` of the completed work request.
    pub wr_id: u64,
    /// How the operation ended.
    pub status: WcStatus,
    /// The operation that completed.
    pub opcode: WcOpcode,
    /// Vendor error syndrome.
    pub vendor_err: u32,
    /// Number of bytes transferred.
    pub byte_len: u32,
    /// Immediate data or invalidated rkey (see above), with `WITH_IMM` or
    /// `WITH_INV` in `wc_flags`.
    pub imm_data: u32,
    /// Number of the local QP the work request was posted to.
    pub qp_num: u32,
    /// Number of the remote QP that sent the message (UD).
    pub src_qp: u32,
    /// Flags of the completion.
    pub wc_flags: WcFlags,
    /// P_Key index (GSI QPs).
    pub pkey_index: u16,
    /// Source LID.
    pub slid: u16,
    /// Service level.
    pub sl: u8,
    /// DLID path bits.
    pub dlid_path_bits: u8,
}

impl Wc {
    /// A completion of these values, every other field zero or empty.
    pub fn new(wr_id: u64, status: WcStatus, opcode: WcOpcode, qp_num: u32) -> Wc {
        Wc {
            wr_id,
            status,
            opcode,
            vendor_err: 0,
            byte_len: 0,
            imm_data: 0,
            qp_num,
            src_qp: 0,
            wc_flags: WcFlags::empty(),
            pkey_index: 0,
            slid: 0,
            sl: 0,
            dlid_path_bits: 0,
        }
    }
}

/// Most outstanding RDMA Reads and atomics a QP may be given, as initiator
/// (`max_rd_atomic`) or responder (`max_dest_rd_atomic`); more is EINVAL.
pub const MAX_RD_ATOMIC: u32 = 128;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn is_ip_is_to_ip_compared() {
        let ips: Vec<std::net::IpAddr> = ["192.168.1.2", "192.168.1.3", "::ffff:192.168.1.2", "fe80::1", "::1", "::"]
            .iter()
            .map(|s| s.parse().unwrap())
            .collect();
        for &g in &ips {
            let gid = Gid::from_ip(g);
            for &ip in &ips {
                assert_eq!(gid.is_ip(ip), gid.to_ip() == ip, "GID of {g}, address {ip}");
            }
        }
    }

    #[test]
    fn gid_roundtrip_v4_and_v6() {
        let v4: std::net::IpAddr = "192.168.1.2".parse().unwrap();
        let g = Gid::from_ip(v4);
        assert_eq!(&g.0[10..], &[0xff, 0xff, 192, 168, 1, 2]);
        assert_eq!(g.to_ip(), v4);
        let v6: std::net::IpAddr = "fe80::1".parse().unwrap();
        assert_eq!(Gid::from_ip(v6).to_ip(), v6);
    }

    #[test]
    fn mtu_values() {
        assert_eq!(Mtu::Mtu1024.bytes(), 1024);
        assert_eq!(Mtu::from_raw(5), Some(Mtu::Mtu4096));
        assert_eq!(Mtu::from_raw(6), None);
        assert_eq!(Mtu::from_bytes_floor(1500 - 80), Mtu::Mtu1024);
    }
}
