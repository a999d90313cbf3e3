//! The InfiniBand communication manager as rdma_cm uses it on RoCE, sans-IO:
//! CM MADs on the wire ([`mad`]), the rdma_cm Service ID and private-data
//! header ([`service`]), timer values ([`timer`]), and the agent of one
//! device ([`Cm`]): listeners and connection records driven by received
//! MADs, user calls and `now`, producing MADs, deadlines and rdma_cm events
//! ([`event`]). All of that is sans-IO; [`CmEndpoint`] runs it on a device
//! (QP 1) and gives Rust users listen / accept / connect returning
//! connected QPs.

mod agent;
mod conn;
mod endpoint;
pub mod event;
mod park;
mod records;
pub mod timer;

#[cfg(test)]
mod hostile_tests;
#[cfg(test)]
mod tests;

pub use agent::{
    AcceptParams, Cm, CmConfig, CmStats, ConnectParams, ListenParams, Outgoing, SidrParams, MAX_BACKLOG,
    REQ_USER_PRIVATE, SIDR_REQ_USER_PRIVATE,
};
pub use conn::{ConnInfo, Role};
pub use endpoint::{CmEndpoint, ConnOptions, Connection, Request, UdPeer};
pub use event::{CmEvent, ConnId, ConnParam, EventKind, ListenId, Param, UdParam};
pub use mad::{CmMad, CmMsg, MadError, MadView};
pub use service::{CmaHdr, PortSpace};

// The CM's wire formats (MADs, the rdma_cm IP service) live in `wire`, and
// the answers of a device without QP 1 in `proto`, below the engine that
// uses them; they keep their names here.
pub(crate) use crate::proto::budget;
pub use crate::proto::gsi;
pub use crate::wire::cm_service as service;
pub use crate::wire::mad;
pub use crate::wire::mad::{GSI_QKEY, GSI_QPN};
/// Q_Key rdma_cm gives UD ids of RDMA_PS_UDP / RDMA_PS_IB (`RDMA_UDP_QKEY`).
pub const RDMA_UDP_QKEY: u32 = 0x0123_4567;
