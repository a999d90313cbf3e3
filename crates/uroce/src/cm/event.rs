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
    /// `rdma_resolve_addr` completed.
    AddrResolved = 0,
    /// `rdma_resolve_addr` failed.
    AddrError = 1,
    /// `rdma_resolve_route` completed.
    RouteResolved = 2,
    /// `rdma_resolve_route` failed.
    RouteError = 3,
    /// Passive side: a new connection request (a REQ, or a SIDR_REQ for a UD
    /// listener).
    ConnectRequest = 4,
    /// Active side: a REP accepted the request; the user moves its QP and
    /// establishes the connection (the RTU).
    ConnectResponse = 5,
    /// An error occurred while establishing the connection, on either side.
    ConnectError = 6,
    /// The peer did not answer a request (status a negative errno), or a
    /// SIDR_REP refused the UD request (status the SIDR_REP status).
    Unreachable = 7,
    /// The peer rejected a connection request or response (status the
    /// REJ's reason).
    Rejected = 8,
    /// The connection is established (for a UD id: a SIDR_REP accepted).
    Established = 9,
    /// The connection was disconnected.
    Disconnected = 10,
    /// The device the id is on was removed; the id must be destroyed.
    DeviceRemoval = 11,
    /// `rdma_join_multicast` completed.
    MulticastJoin = 12,
    /// Joining a multicast group failed, or a joined group was lost.
    MulticastError = 13,
    /// The network device the id resolved to changed its hardware address.
    AddrChange = 14,
    /// The connection left timewait: its QP may be reused.
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
    /// RDMA Reads and atomics this side may have to serve at once: the
    /// peer's initiator depth.
    pub responder_resources: u8,
    /// RDMA Reads and atomics this side may have outstanding: the peer's
    /// responder resources.
    pub initiator_depth: u8,
    /// The peer's end-to-end flow control bit (REQ or REP).
    pub flow_control: bool,
    /// Transport retry count (0..7), as the REQ carries it.
    pub retry_count: u8,
    /// RNR NAK retry count (0..7; 7 retries forever).
    pub rnr_retry_count: u8,
    /// Whether the peer's QP receives from an SRQ.
    pub srq: bool,
    /// The peer's QP number.
    pub qp_num: u32,
}

/// `struct rdma_ud_param` less the address handle (built by the user from
/// the connection's addresses).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct UdParam {
    /// The peer's UD QP number.
    pub qp_num: u32,
    /// The Q_Key to send to it with.
    pub qkey: u32,
}

/// The parameter union of `struct rdma_cm_event`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Param {
    /// No parameters.
    None,
    /// `param.conn`: CONNECT_REQUEST and CONNECT_RESPONSE of a connected id.
    Conn(ConnParam),
    /// `param.ud`: ESTABLISHED of a UD id (CONNECT_REQUEST of a UD listener
    /// carries it zeroed).
    Ud(UdParam),
}

/// One event for the user of the CM.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CmEvent {
    /// The connection or SIDR exchange the event is about.
    pub id: ConnId,
    /// The listener a CONNECT_REQUEST matched.
    pub listen_id: Option<ListenId>,
    /// What happened.
    pub kind: EventKind,
    /// 0, a REJ reason or SIDR status (positive), or a negative errno.
    pub status: i32,
    /// The event's parameters.
    pub param: Param,
    /// The private data as the kernel reports it: the whole field of the
    /// message (56, 196, 148, 180 or 136 bytes), or empty.
    pub private_data: Vec<u8>,
}
