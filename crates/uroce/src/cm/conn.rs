//! One CM connection's record: its state (the ib_cm states of `k/cm.c`),
//! its identifiers, the negotiated values a QP needs to reach RTS, and the
//! one MAD it may be retransmitting. The transitions live in `agent.rs`,
//! which owns every record.

use super::event::ListenId;
use super::service::PortSpace;
use std::net::{IpAddr, SocketAddr};
use std::time::{Duration, Instant};

/// The ib_cm connection states. rdma_cm always prepares a delayed MRA, so
/// `ReqRcvd` and `RepRcvd` behave as the kernel's MRA_REQ_SENT and
/// MRA_REP_SENT (a duplicate is answered with that MRA).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum State {
    /// Nothing in progress (rejected, failed, or a finished SIDR exchange).
    Idle,
    ReqSent,
    MraReqRcvd,
    ReqRcvd,
    RepSent,
    MraRepRcvd,
    RepRcvd,
    Established,
    DreqSent,
    DreqRcvd,
    Timewait,
    SidrReqSent,
    SidrReqRcvd,
}

impl State {
    /// Whether the record holds a connection whose QP pair is in use (the
    /// kernel's "remote QPN" table: stale-connection detection).
    pub(crate) fn holds_qp(self) -> bool {
        matches!(
            self,
            State::RepSent
                | State::MraRepRcvd
                | State::RepRcvd
                | State::Established
                | State::DreqSent
                | State::DreqRcvd
        )
    }
}

/// Which side of the connection this is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// The side that sent the REQ (or SIDR_REQ): `rdma_connect`.
    Active,
    /// The side whose listener received it: `rdma_accept`.
    Passive,
}

/// Everything negotiated for a connection that its QP needs (INIT → RTR →
/// RTS as `k/cm.c` `cm_init_qp_*_attr` hands it to librdmacm).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConnInfo {
    /// Which side this is.
    pub role: Role,
    /// The rdma_cm port space of the Service ID.
    pub ps: PortSpace,
    /// This side's address and port.
    pub local: SocketAddr,
    /// The peer's address and port.
    pub remote: SocketAddr,
    /// This side's QP number; 0 until the user gave it.
    pub local_qpn: u32,
    /// 0 until the peer's REQ/REP told it.
    pub remote_qpn: u32,
    /// The PSN this side expects to receive first (its QP's `rq_psn`).
    pub local_psn: u32,
    /// The PSN the peer expects first (this QP's `sq_psn`).
    pub remote_psn: u32,
    /// The peer's CA GUID (the Local CA GUID of its REQ/REP).
    pub remote_ca_guid: u64,
    /// RTR `max_dest_rd_atomic`.
    pub responder_resources: u8,
    /// RTS `max_rd_atomic`.
    pub initiator_depth: u8,
    /// The end-to-end flow control bit of the REQ/REP exchange.
    pub flow_control: bool,
    /// The SRQ bit of the REQ/REP exchange.
    pub srq: bool,
    /// RTS `retry_cnt`: transport retries (0..7).
    pub retry_count: u8,
    /// RTS `rnr_retry`: RNR NAK retries (0..7; 7 retries forever).
    pub rnr_retry_count: u8,
    /// IBV MTU code.
    pub path_mtu: u8,
    /// The path's flow label (RTR address vector).
    pub flow_label: u32,
    /// The path's hop limit (RTR address vector).
    pub hop_limit: u8,
    /// The path's traffic class (RTR address vector).
    pub traffic_class: u8,
    /// The path's local ACK timeout (RTS `timeout`; also the timewait).
    pub ack_timeout: u8,
    /// UD: the peer's Q_Key from SIDR_REP.
    pub qkey: u32,
    /// XRC: this side's QP is an XRC initiator (active) or target (passive).
    pub xrc: bool,
}

impl ConnInfo {
    pub(crate) fn new(role: Role, ps: PortSpace, local: SocketAddr, remote: SocketAddr) -> ConnInfo {
        ConnInfo {
            role,
            ps,
            local,
            remote,
            local_qpn: 0,
            remote_qpn: 0,
            local_psn: 0,
            remote_psn: 0,
            remote_ca_guid: 0,
            responder_resources: 0,
            initiator_depth: 0,
            flow_control: false,
            srq: false,
            retry_count: 0,
            rnr_retry_count: 0,
            path_mtu: 3,
            flow_label: 0,
            hop_limit: 64,
            traffic_class: 0,
            ack_timeout: 0,
            qkey: 0,
            xrc: false,
        }
    }
}

/// A MAD awaiting its answer, retransmitted until answered or out of retries.
#[derive(Debug, Clone)]
pub(crate) struct Pending {
    pub mad: Box<[u8; super::mad::MAD_LEN]>,
    pub dst: IpAddr,
    pub deadline: Instant,
    pub timeout: Duration,
    pub retries_left: u8,
}

/// The CM's record of one connection.
#[derive(Debug, Clone)]
pub(crate) struct Conn {
    pub info: ConnInfo,
    pub state: State,
    pub local_comm_id: u32,
    pub remote_comm_id: u32,
    /// Where replies go: the IP the peer's messages come from.
    pub peer_ip: IpAddr,
    pub listen_id: Option<ListenId>,
    /// TID of the REQ / SIDR_REQ (REP, RTU, MRA and REJ reuse it).
    pub tid: u64,
    /// TID of the DREQ received (the DREP echoes it).
    pub dreq_tid: u64,
    /// Retransmission interval and count for this connection's requests.
    pub timeout: Duration,
    pub max_retries: u8,
    pub pending: Option<Pending>,
    pub timewait_until: Option<Instant>,
    /// The user destroyed the id: no more events; freed after timewait.
    pub destroyed: bool,
    pub disconnect_reported: bool,
}

impl Conn {
    pub(crate) fn new(info: ConnInfo, state: State, local_comm_id: u32, peer_ip: IpAddr) -> Conn {
        Conn {
            info,
            state,
            local_comm_id,
            remote_comm_id: 0,
            peer_ip,
            listen_id: None,
            tid: 0,
            dreq_tid: 0,
            timeout: Duration::ZERO,
            max_retries: 0,
            pending: None,
            timewait_until: None,
            destroyed: false,
            disconnect_reported: false,
        }
    }

    /// The earliest instant this record needs attention.
    pub(crate) fn deadline(&self) -> Option<Instant> {
        match (self.pending.as_ref().map(|p| p.deadline), self.timewait_until) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }
}
