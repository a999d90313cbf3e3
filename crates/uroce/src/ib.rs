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
    pub const EPERM: Errno = Errno(libc::EPERM);
    pub const ENOENT: Errno = Errno(libc::ENOENT);
    pub const EIO: Errno = Errno(libc::EIO);
    pub const EAGAIN: Errno = Errno(libc::EAGAIN);
    pub const ENOMEM: Errno = Errno(libc::ENOMEM);
    pub const EACCES: Errno = Errno(libc::EACCES);
    pub const EFAULT: Errno = Errno(libc::EFAULT);
    pub const EBUSY: Errno = Errno(libc::EBUSY);
    pub const EEXIST: Errno = Errno(libc::EEXIST);
    pub const ENODEV: Errno = Errno(libc::ENODEV);
    pub const EINVAL: Errno = Errno(libc::EINVAL);
    pub const ENOSPC: Errno = Errno(libc::ENOSPC);
    pub const ENOSYS: Errno = Errno(libc::ENOSYS);
    pub const ENODATA: Errno = Errno(libc::ENODATA);
    pub const EOPNOTSUPP: Errno = Errno(libc::EOPNOTSUPP);
    pub const EADDRINUSE: Errno = Errno(libc::EADDRINUSE);
    pub const EADDRNOTAVAIL: Errno = Errno(libc::EADDRNOTAVAIL);
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
    pub errno: Errno,
    pub what: std::borrow::Cow<'static, str>,
}

impl Error {
    pub fn new(errno: Errno, what: impl Into<std::borrow::Cow<'static, str>>) -> Self {
        Error { errno, what: what.into() }
    }
    pub fn inval(what: impl Into<std::borrow::Cow<'static, str>>) -> Self {
        Self::new(Errno::EINVAL, what)
    }
}

impl From<Error> for std::io::Error {
    fn from(e: Error) -> Self {
        std::io::Error::new(std::io::Error::from_raw_os_error(e.errno.0).kind(), e)
    }
}

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
    pub enum QpType { Rc = 2, Uc = 3, Ud = 4, XrcSend = 9, XrcRecv = 10 }
}

impl QpType {
    /// The reliable connected service: RC and both halves of XRC
    /// acknowledge, retry and execute in order.
    pub fn is_reliable(self) -> bool {
        matches!(self, QpType::Rc | QpType::XrcSend | QpType::XrcRecv)
    }
}

c_enum! {
    /// `enum ibv_qp_state`.
    pub enum QpState { Reset = 0, Init = 1, Rtr = 2, Rts = 3, Sqd = 4, Sqe = 5, Err = 6 }
}

c_enum! {
    /// `enum ibv_mtu`.
    pub enum Mtu { Mtu256 = 1, Mtu512 = 2, Mtu1024 = 3, Mtu2048 = 4, Mtu4096 = 5 }
}

impl Mtu {
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
        Success = 0, LocLenErr = 1, LocQpOpErr = 2, LocEecOpErr = 3, LocProtErr = 4,
        WrFlushErr = 5, MwBindErr = 6, BadRespErr = 7, LocAccessErr = 8, RemInvReqErr = 9,
        RemAccessErr = 10, RemOpErr = 11, RetryExcErr = 12, RnrRetryExcErr = 13,
        LocRddViolErr = 14, RemInvRdReqErr = 15, RemAbortErr = 16, InvEecnErr = 17,
        InvEecStateErr = 18, FatalErr = 19, RespTimeoutErr = 20, GeneralErr = 21,
        TmErr = 22, TmRndvIncomplete = 23,
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
        Send = 0, RdmaWrite = 1, RdmaRead = 2, CompSwap = 3, FetchAdd = 4, BindMw = 5,
        LocalInv = 6, Tso = 7, AtomicWrite = 9, Recv = 128, RecvRdmaWithImm = 129,
        /// `IBV_WC_DRIVER1`, mlx5's `MLX5DV_WC_UMR`.
        Umr = 135,
    }
}

bitflags! {
    /// `enum ibv_access_flags`.
    #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
    pub struct Access: u32 {
        const LOCAL_WRITE = 1;
        const REMOTE_WRITE = 1 << 1;
        const REMOTE_READ = 1 << 2;
        const REMOTE_ATOMIC = 1 << 3;
        const MW_BIND = 1 << 4;
        const ZERO_BASED = 1 << 5;
        const ON_DEMAND = 1 << 6;
        const HUGETLB = 1 << 7;
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
        const FENCE = 1;
        const SIGNALED = 1 << 1;
        const SOLICITED = 1 << 2;
        const INLINE = 1 << 3;
        const IP_CSUM = 1 << 4;
    }
}

bitflags! {
    /// `enum ibv_wc_flags`.
    #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
    pub struct WcFlags: u32 {
        const GRH = 1;
        const WITH_IMM = 1 << 1;
        const IP_CSUM_OK = 1 << 2;
        const WITH_INV = 1 << 3;
        const TM_SYNC_REQ = 1 << 4;
        const TM_MATCH = 1 << 5;
        const TM_DATA_VALID = 1 << 6;
    }
}

bitflags! {
    /// `enum ibv_qp_attr_mask`.
    #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
    pub struct QpAttrMask: u32 {
        const STATE = 1;
        const CUR_STATE = 1 << 1;
        const EN_SQD_ASYNC_NOTIFY = 1 << 2;
        const ACCESS_FLAGS = 1 << 3;
        const PKEY_INDEX = 1 << 4;
        const PORT = 1 << 5;
        const QKEY = 1 << 6;
        const AV = 1 << 7;
        const PATH_MTU = 1 << 8;
        const TIMEOUT = 1 << 9;
        const RETRY_CNT = 1 << 10;
        const RNR_RETRY = 1 << 11;
        const RQ_PSN = 1 << 12;
        const MAX_QP_RD_ATOMIC = 1 << 13;
        const ALT_PATH = 1 << 14;
        const MIN_RNR_TIMER = 1 << 15;
        const SQ_PSN = 1 << 16;
        const MAX_DEST_RD_ATOMIC = 1 << 17;
        const PATH_MIG_STATE = 1 << 18;
        const CAP = 1 << 19;
        const DEST_QPN = 1 << 20;
        const RATE_LIMIT = 1 << 25;
    }
}

c_enum! {
    /// `enum ibv_event_type`.
    pub enum AsyncEventType {
        CqErr = 0, QpFatal = 1, QpReqErr = 2, QpAccessErr = 3, CommEst = 4, SqDrained = 5,
        PathMig = 6, PathMigErr = 7, DeviceFatal = 8, PortActive = 9, PortErr = 10,
        LidChange = 11, PkeyChange = 12, SmChange = 13, SrqErr = 14, SrqLimitReached = 15,
        QpLastWqeReached = 16, ClientReregister = 17, GidChange = 18, WqFatal = 19,
    }
}

/// A 16-byte GID. For RoCEv2 it is an IPv6 address, or an IPv4 address mapped
/// as `::ffff:a.b.c.d`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Gid(pub [u8; 16]);

impl Gid {
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
    pub fn is_zero(self) -> bool {
        self.0 == [0; 16]
    }
}

/// Scatter/gather element: `struct ibv_sge`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Sge {
    pub addr: u64,
    pub length: u32,
    pub lkey: u32,
}

/// A work completion: `struct ibv_wc`. `imm_data` holds the immediate (or the
/// invalidated rkey) as the 32-bit value carried on the wire, in host order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Wc {
    pub wr_id: u64,
    pub status: WcStatus,
    pub opcode: WcOpcode,
    pub vendor_err: u32,
    pub byte_len: u32,
    pub imm_data: u32,
    pub qp_num: u32,
    pub src_qp: u32,
    pub wc_flags: WcFlags,
    pub pkey_index: u16,
    pub slid: u16,
    pub sl: u8,
    pub dlid_path_bits: u8,
}

impl Wc {
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

/// The IB path MTU enum values 256..4096 as bytes, rounding attr values.
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
