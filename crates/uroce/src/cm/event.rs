//! What the CM tells its user: rdma_cm events (`enum rdma_cm_event_type`,
//! numbered as `<rdma/rdma_cma.h>`) with the status and parameters the
//! Linux kernel reports for each (`k/cma.c` `cma_ib_handler`,
//! `cma_ib_req_handler`, `cma_sidr_rep_handler`).

/// A connection (or SIDR exchange) of the CM: its local communication ID.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ConnId(pub u32);

/// A listener of the CM.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ListenId(pub u32);

/// `enum rdma_cm_event_type`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u32)]
pub enum EventKind {
    AddrResolved = 0,
    AddrError = 1,
    RouteResolved = 2,
    RouteError = 3,
    ConnectRequest = 4,
    ConnectResponse = 5,
    ConnectError = 6,
    Unreachable = 7,
    Rejected = 8,
    Established = 9,
    Disconnected = 10,
    DeviceRemoval = 11,
    MulticastJoin = 12,
    MulticastError = 13,
    AddrChange = 14,
    TimewaitExit = 15,
}

impl EventKind {
    /// The name `rdma_event_str` returns.
    pub fn name(self) -> &'static str {
        match self {
            EventKind::AddrResolved => "RDMA_CM_EVENT_ADDR_RESOLVED",
            EventKind::AddrError => "RDMA_CM_EVENT_ADDR_ERROR",
            EventKind::RouteResolved => "RDMA_CM_EVENT_ROUTE_RESOLVED",
            EventKind::RouteError => "RDMA_CM_EVENT_ROUTE_ERROR",
            EventKind::ConnectRequest => "RDMA_CM_EVENT_CONNECT_REQUEST",
            EventKind::ConnectResponse => "RDMA_CM_EVENT_CONNECT_RESPONSE",
            EventKind::ConnectError => "RDMA_CM_EVENT_CONNECT_ERROR",
            EventKind::Unreachable => "RDMA_CM_EVENT_UNREACHABLE",
            EventKind::Rejected => "RDMA_CM_EVENT_REJECTED",
            EventKind::Established => "RDMA_CM_EVENT_ESTABLISHED",
            EventKind::Disconnected => "RDMA_CM_EVENT_DISCONNECTED",
            EventKind::DeviceRemoval => "RDMA_CM_EVENT_DEVICE_REMOVAL",
            EventKind::MulticastJoin => "RDMA_CM_EVENT_MULTICAST_JOIN",
            EventKind::MulticastError => "RDMA_CM_EVENT_MULTICAST_ERROR",
            EventKind::AddrChange => "RDMA_CM_EVENT_ADDR_CHANGE",
            EventKind::TimewaitExit => "RDMA_CM_EVENT_TIMEWAIT_EXIT",
        }
    }
}

/// `struct rdma_conn_param` as an event reports it (from the peer's point
/// of view turned around: responder resources = the peer's initiator depth).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ConnParam {
    pub responder_resources: u8,
    pub initiator_depth: u8,
    pub flow_control: bool,
    pub retry_count: u8,
    pub rnr_retry_count: u8,
    pub srq: bool,
    pub qp_num: u32,
}

/// `struct rdma_ud_param` less the address handle (built by the user from
/// the connection's addresses).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct UdParam {
    pub qp_num: u32,
    pub qkey: u32,
}

/// The parameter union of `struct rdma_cm_event`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Param {
    None,
    Conn(ConnParam),
    Ud(UdParam),
}

/// One event for the user of the CM.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CmEvent {
    pub id: ConnId,
    /// The listener a CONNECT_REQUEST matched.
    pub listen_id: Option<ListenId>,
    pub kind: EventKind,
    /// 0, a REJ reason or SIDR status (positive), or a negative errno.
    pub status: i32,
    pub param: Param,
    /// The private data as the kernel reports it: the whole field of the
    /// message (56, 196, 148, 180 or 136 bytes), or empty.
    pub private_data: Vec<u8>,
}
