//! The InfiniBand communication manager as rdma_cm uses it on RoCE: CM MADs
//! on the wire ([`mad`]), the rdma_cm Service ID and private-data header
//! ([`service`]). Everything here is sans-IO: bytes in, bytes out.

pub mod mad;
pub mod service;

pub use mad::{CmMad, CmMsg, MadError, MadView};
pub use service::{CmaHdr, PortSpace};

/// Q_Key of the General Services Interface QP (QP 1), `IB_QP1_QKEY`.
pub const GSI_QKEY: u32 = 0x8001_0000;
/// The GSI QP number.
pub const GSI_QPN: u32 = 1;
/// Q_Key rdma_cm gives UD ids of RDMA_PS_UDP / RDMA_PS_IB (`RDMA_UDP_QKEY`).
pub const RDMA_UDP_QKEY: u32 = 0x0123_4567;
