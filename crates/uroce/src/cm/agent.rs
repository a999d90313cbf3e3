//! The CM agent of one device, sans-IO: received MADs, user calls and `now`
//! in; MADs to send, timer deadlines and rdma_cm events out. It owns the
//! listeners (by Service ID), the connection records (by local
//! communication ID), the table of remote communication IDs that detects
//! duplicates, and the retransmission and timewait timers. Its rules are
//! the Linux kernel's (`k/cm.c` for the IB CM, `k/cma.c` for what rdma_cm
//! puts around it); `shared/spec/cm.md` §5 lists them.
//!
//! Timers are kept per record; a heap of their deadlines
//! ([`super::records`]) finds the next one and those due without a scan.

use super::budget::AnswerBudget;
use super::conn::{Conn, ConnInfo, Pending, Role, State};
use super::event::{CmEvent, ConnId, ConnParam, EventKind, ListenId, Param, UdParam};
use super::mad::{
    form_tid, private_len, rej_reason, sidr_status, Bytes, CmMad, CmMsg, Drep, Dreq, MadError, Mra, MsgRef, Path, Rej,
    Rep, Req, Rtu, SidrRep, SidrReq, TransportType, MAD_LEN,
};
use super::records::Records;
use super::service::{self, CmaHdr, PortSpace};
use super::timer;
use crate::ib::{Errno, Error};
use crate::mem::KeyRng;
use std::collections::{HashMap, VecDeque};
use std::net::{IpAddr, SocketAddr};
use std::time::Instant;

/// User private data an rdma_cm REQ can carry after its 36-byte header.
pub const REQ_USER_PRIVATE: usize = private_len::REQ - CmaHdr::LEN;
/// User private data an rdma_cm SIDR_REQ can carry.
pub const SIDR_REQ_USER_PRIVATE: usize = private_len::SIDR_REQ - CmaHdr::LEN;
/// Largest listen backlog (`k/ucma.c` `max_backlog`).
pub const MAX_BACKLOG: u32 = 1024;

/// What the agent needs to know about its device.
#[derive(Debug, Clone)]
pub struct CmConfig {
    /// The device's address (its GID is the IPv4-mapped form).
    pub local_ip: IpAddr,
    /// The device's node GUID (Local CA GUID of REQ/REP).
    pub ca_guid: u64,
    /// The high word of the TIDs this agent forms (the kernel's agent number).
    pub hi_tid: u32,
    /// Seeds the communication IDs and starting PSNs.
    pub seed: u64,
    /// IBV MTU code of the path (3 = 1024 for a 1500-byte netdev).
    pub path_mtu: u8,
    /// Packet life time of the path, as an exponent (4.096 µs × 2^n): sets
    /// the REQ's retransmission interval and the local ACK timeout.
    pub packet_life_time: u8,
    /// This CA's local ACK delay, as an exponent: the REP's Target ACK
    /// Delay, and part of the active side's local ACK timeout.
    pub ca_ack_delay: u8,
}

impl CmConfig {
    /// The values rdma_cm uses on RoCE for a device at `local_ip`: TID high
    /// word 2, a 1024-byte path MTU, `timer::IBOE_PACKET_LIFETIME` and
    /// rxe's CA ACK delay.
    pub fn new(local_ip: IpAddr, ca_guid: u64, seed: u64) -> CmConfig {
        CmConfig {
            local_ip,
            ca_guid,
            hi_tid: 2,
            seed,
            path_mtu: 3,
            packet_life_time: timer::IBOE_PACKET_LIFETIME,
            ca_ack_delay: timer::CA_ACK_DELAY,
        }
    }
}

/// A listener: `rdma_listen` on a port of a port space, on one address or
/// on all (`addr: None`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ListenParams {
    /// The rdma_cm port space.
    pub ps: PortSpace,
    /// The address listened on; `None`: every address.
    pub addr: Option<IpAddr>,
    /// The port listened on (not 0).
    pub port: u16,
    /// Pending connection requests allowed; 0 or over 1024 means 1024.
    pub backlog: u32,
    /// An XRC listener (`IBV_QPT_XRC_RECV` ids): it takes XRC REQs only,
    /// and the others only RC and UC REQs, as the kernel matches a REQ's
    /// QP type against the listening id's (`cma_check_req_qp_type`).
    pub xrc: bool,
}

/// `rdma_connect` for RC, UC and XRC.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConnectParams {
    /// The rdma_cm port space.
    pub ps: PortSpace,
    /// The local port (already bound by the caller).
    pub src_port: u16,
    /// The listener's address and port.
    pub dst: SocketAddr,
    /// The number of the QP to connect (1 to 0xFF_FFFF).
    pub qpn: u32,
    /// RC, UC, or XRC (an XRC_SEND QP: the REQ offers no responder
    /// resources, retry counts or SRQ, as `k/cm.c` `cm_format_req`).
    pub transport: TransportType,
    /// The REQ's Responder Resources: RDMA Reads and atomics this side
    /// offers to serve at once.
    pub responder_resources: u8,
    /// The REQ's Initiator Depth: RDMA Reads and atomics this side wants
    /// outstanding at once.
    pub initiator_depth: u8,
    /// The REQ's end-to-end flow control bit.
    pub flow_control: bool,
    /// Transport retry count (over 7 counts as 7).
    pub retry_count: u8,
    /// RNR NAK retry count (over 7 counts as 7, which retries forever).
    pub rnr_retry_count: u8,
    /// Whether the QP receives from an SRQ.
    pub srq: bool,
    /// Traffic class of the path.
    pub traffic_class: u8,
    /// At most 56 bytes.
    pub private_data: Vec<u8>,
}

/// `rdma_accept` (RC: REP; UD: SIDR_REP with status 0).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AcceptParams {
    /// The number of the accepting QP (1 to 0xFF_FFFF).
    pub qpn: u32,
    /// RDMA Reads and atomics this side serves at once (the REP's).
    pub responder_resources: u8,
    /// RDMA Reads and atomics this side has outstanding at once (the REP's).
    pub initiator_depth: u8,
    /// The REP's end-to-end flow control bit.
    pub flow_control: bool,
    /// RNR NAK retry count the peer uses (over 7 counts as 7).
    pub rnr_retry_count: u8,
    /// Whether the QP receives from an SRQ.
    pub srq: bool,
    /// UD only.
    pub qkey: u32,
    /// At most 196 bytes (UD: 136).
    pub private_data: Vec<u8>,
}

/// `rdma_resolve_addr` + `rdma_resolve_route` + `rdma_connect` for UD: a SIDR
/// exchange asking the peer's listener for its QPN and Q_Key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SidrParams {
    /// The rdma_cm port space (a UD one).
    pub ps: PortSpace,
    /// The local port.
    pub src_port: u16,
    /// The listener's address and port.
    pub dst: SocketAddr,
    /// At most 180 bytes.
    pub private_data: Vec<u8>,
}

/// A MAD to send to QP 1 of `dst`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Outgoing {
    /// The peer's address.
    pub dst: IpAddr,
    /// The MAD, as sent.
    pub mad: [u8; MAD_LEN],
}

/// What the agent counted (received MADs it dropped, what it sent).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CmStats {
    /// MADs received.
    pub received: u64,
    /// Received MADs that did not parse.
    pub malformed: u64,
    /// Received MADs of an attribute the CM does not handle (LAP, APR,
    /// ClassPortInfo, unknown).
    pub unknown_attr: u64,
    /// Valid MADs for no connection in a state to take them.
    pub unmatched: u64,
    /// Retransmitted messages of a known exchange (REQ, REP, DREQ,
    /// SIDR_REQ): answered again or dropped.
    pub duplicates: u64,
    /// REQs and SIDR_REQs dropped because the listener's backlog was full.
    pub backlog_drops: u64,
    /// REQs held for a listener that had closed moments before
    /// (`cm::park`).
    pub reqs_parked: u64,
    /// MADs queued to send, retransmissions included.
    pub sent: u64,
    /// Retransmissions of an unanswered MAD.
    pub retransmits: u64,
    /// REJs sent.
    pub rej_sent: u64,
    /// Answers to peers with no record (REJ, DREP, SIDR_REP) not sent:
    /// over the rate of the answer budget (`proto::budget`).
    pub answers_suppressed: u64,
    /// MADs the endpoint dropped because QP 1's send queue was full.
    pub send_drops: u64,
    /// Times the endpoint found QP 1 out of RTS and brought it back.
    pub qp1_restarts: u64,
}

#[derive(Debug, Clone)]
struct Listener {
    params: ListenParams,
}

/// The CM agent of one device.
pub struct Cm {
    cfg: CmConfig,
    /// Communication IDs and starting PSNs: random draws from a CSPRNG, so
    /// that IDs a peer learns from its own connections say nothing about
    /// another's (`k/cm.c` XORs a cyclic index with one random value; one
    /// connection narrows its next ID to a few candidates).
    rng: KeyRng,
    conns: Records,
    /// (remote comm ID, remote CA GUID) → local comm ID.
    remote_ids: HashMap<(u32, u64), u32>,
    /// (request ID, peer IP) of SIDR requests being answered.
    remote_sidr: HashMap<(u32, IpAddr), u32>,
    listeners: HashMap<ListenId, Listener>,
    next_listen: u32,
    transmit: VecDeque<Outgoing>,
    events: VecDeque<CmEvent>,
    stats: CmStats,
    /// Answers to peers with no record.
    answers: AnswerBudget,
    /// REQs waiting for a listener that was there a moment ago.
    park: super::park::Park,
}

fn inval(what: &'static str) -> Error {
    Error::inval(what)
}

const ETIMEDOUT: i32 = -libc::ETIMEDOUT;

impl Cm {
    /// An agent whose IDs and PSNs replay `cfg.seed` (tests, simulations).
    pub fn new(cfg: CmConfig) -> Cm {
        let rng = KeyRng::new(cfg.seed);
        Cm::with_rng(cfg, rng)
    }

    /// An agent drawing its IDs and PSNs from `rng` (a device's: seeded from
    /// the OS).
    pub(crate) fn with_rng(cfg: CmConfig, rng: KeyRng) -> Cm {
        Cm {
            cfg,
            rng,
            conns: Records::default(),
            remote_ids: HashMap::new(),
            remote_sidr: HashMap::new(),
            listeners: HashMap::new(),
            next_listen: 1,
            transmit: VecDeque::new(),
            events: VecDeque::new(),
            stats: CmStats::default(),
            answers: AnswerBudget::default(),
            park: Default::default(),
        }
    }

    /// The configuration the agent runs with.
    pub fn config(&self) -> &CmConfig {
        &self.cfg
    }
    /// What the agent counted so far.
    pub fn stats(&self) -> CmStats {
        self.stats
    }
    /// Counts what the endpoint running this agent did with QP 1.
    pub fn stats_mut(&mut self) -> &mut CmStats {
        &mut self.stats
    }

    /// MADs waiting in [`Cm::poll_transmit`].
    pub fn transmit_queued(&self) -> usize {
        self.transmit.len()
    }
    /// The next MAD to send.
    pub fn poll_transmit(&mut self) -> Option<Outgoing> {
        self.transmit.pop_front()
    }
    /// The next event for the user.
    pub fn poll_event(&mut self) -> Option<CmEvent> {
        self.events.pop_front()
    }
    /// When `handle_timeout` must next be called.
    pub fn poll_timeout(&mut self) -> Option<Instant> {
        [self.conns.next_deadline(), self.park.next_deadline()].into_iter().flatten().min()
    }

    /// What a connection negotiated (for its QP's transitions).
    pub fn conn_info(&self, id: ConnId) -> Option<&ConnInfo> {
        self.conns.get(&id.0).filter(|c| !c.destroyed).map(|c| &c.info)
    }
    /// The state of a record (tests).
    #[cfg(test)]
    pub(super) fn state_of(&self, id: ConnId) -> Option<super::conn::State> {
        self.conns.get(&id.0).map(|c| c.state)
    }
    /// Number of records (live ids and ids in timewait).
    pub fn records(&self) -> usize {
        self.conns.len()
    }

    /// A random unused nonzero ID. Records are far fewer than 2^32, so a
    /// draw almost always hits; after 64 misses a scan from the last draw
    /// (at most `conns.len() + 1` steps) ends it.
    fn alloc_comm_id(&mut self) -> u32 {
        let mut id = 0;
        for _ in 0..64 {
            id = self.rng.next_u32();
            if id != 0 && !self.conns.contains_key(&id) {
                return id;
            }
        }
        while id == 0 || self.conns.contains_key(&id) {
            id = id.wrapping_add(1);
        }
        id
    }
    fn random_psn(&mut self) -> u32 {
        self.rng.next_u32() & 0xFF_FFFF
    }

    fn send(&mut self, dst: IpAddr, mad: &CmMad) {
        self.stats.sent += 1;
        if matches!(mad.msg, CmMsg::Rej(_)) {
            self.stats.rej_sent += 1;
        }
        self.transmit.push_back(Outgoing { dst, mad: mad.to_bytes() });
    }

    /// Sends `mad` for `id` and retransmits it until answered.
    fn send_retried(&mut self, now: Instant, id: u32, mad: &CmMad) {
        let Some(c) = self.conns.get_mut(&id) else { return };
        let bytes = mad.to_bytes();
        c.pending = Some(Pending {
            mad: Box::new(bytes),
            dst: c.peer_ip,
            deadline: now + c.timeout,
            timeout: c.timeout,
            retries_left: c.max_retries,
        });
        let dst = c.peer_ip;
        self.stats.sent += 1;
        self.transmit.push_back(Outgoing { dst, mad: bytes });
    }

    fn event(&mut self, id: u32, kind: EventKind, status: i32, param: Param, private_data: Vec<u8>) {
        let Some(c) = self.conns.get(&id) else { return };
        if c.destroyed {
            return;
        }
        let listen_id = if kind == EventKind::ConnectRequest { c.listen_id } else { None };
        self.events.push_back(CmEvent { id: ConnId(id), listen_id, kind, status, param, private_data });
    }

    fn reset_to_idle(&mut self, id: u32) {
        let Some(c) = self.conns.get_mut(&id) else { return };
        c.state = State::Idle;
        c.pending = None;
        let key = (c.remote_comm_id, c.info.remote_ca_guid);
        if self.remote_ids.get(&key) == Some(&id) {
            self.remote_ids.remove(&key);
        }
        if c.destroyed {
            self.conns.remove(&id);
        }
    }

    fn enter_timewait(&mut self, now: Instant, id: u32) {
        let Some(c) = self.conns.get_mut(&id) else { return };
        c.state = State::Timewait;
        c.pending = None;
        c.timewait_until = Some(now + timer::duration(c.info.ack_timeout));
    }

    // ---- user calls -------------------------------------------------------

    /// `rdma_listen`. EADDRINUSE if the same port space, port and address
    /// (or a wildcard overlapping it) is already listened on.
    pub fn listen(&mut self, p: ListenParams) -> Result<ListenId, Error> {
        if p.port == 0 {
            return Err(inval("cm listen: port 0 (bind a port first)"));
        }
        let clash = self.listeners.values().any(|l| {
            l.params.ps == p.ps
                && l.params.port == p.port
                && (l.params.addr.is_none() || p.addr.is_none() || l.params.addr == p.addr)
        });
        if clash {
            return Err(Error::new(Errno::EADDRINUSE, "cm listen: port already listened on"));
        }
        let backlog = if p.backlog == 0 || p.backlog > MAX_BACKLOG { MAX_BACKLOG } else { p.backlog };
        let id = ListenId(self.next_listen);
        self.next_listen = self.next_listen.wrapping_add(1).max(1);
        self.park.opened(p.ps, p.port);
        self.listeners.insert(id, Listener { params: ListenParams { backlog, ..p } });
        Ok(id)
    }

    /// Stops a listener; connection requests it already reported stay. For
    /// a while, REQs for its port wait for a new listener (`cm::park`).
    pub fn unlisten(&mut self, now: Instant, id: ListenId) -> Result<(), Error> {
        let l = self.listeners.remove(&id).ok_or_else(|| inval("cm unlisten: no such listener"))?;
        self.park.closed(now, l.params.ps, l.params.port);
        Ok(())
    }

    fn base_info(&mut self, role: Role, ps: PortSpace, src_port: u16, dst: SocketAddr) -> ConnInfo {
        let mut info = ConnInfo::new(role, ps, SocketAddr::new(self.cfg.local_ip, src_port), dst);
        info.local_psn = self.random_psn();
        info.path_mtu = self.cfg.path_mtu;
        info
    }

    /// `rdma_connect` (RC, UC, XRC): sends a REQ, retransmitted every
    /// 2·PLT + 4096 ms (4.6 s) up to 15 times.
    pub fn connect(&mut self, now: Instant, p: ConnectParams) -> Result<ConnId, Error> {
        if p.private_data.len() > REQ_USER_PRIVATE {
            return Err(inval("rdma_connect: private data over 56 bytes"));
        }
        if p.ps.is_ud() || !matches!(p.transport, TransportType::Rc | TransportType::Uc | TransportType::Xrc) {
            return Err(inval("rdma_connect: not a connected QP type"));
        }
        let xrc = p.transport == TransportType::Xrc;
        if p.qpn == 0 || p.qpn > 0xFF_FFFF || p.dst.port() == 0 || p.dst.is_ipv4() != self.cfg.local_ip.is_ipv4() {
            return Err(inval("rdma_connect: bad QP number or destination"));
        }
        let mut info = self.base_info(Role::Active, p.ps, p.src_port, p.dst);
        info.local_qpn = p.qpn;
        info.retry_count = p.retry_count.min(7);
        info.rnr_retry_count = p.rnr_retry_count.min(7);
        info.flow_control = p.flow_control;
        info.srq = p.srq;
        info.traffic_class = p.traffic_class;
        info.flow_label = service::roce_flow_label(p.src_port, p.dst.port());
        info.ack_timeout = timer::ack_timeout(self.cfg.ca_ack_delay, self.cfg.packet_life_time);
        info.responder_resources = if xrc { 0 } else { p.responder_resources };
        info.initiator_depth = p.initiator_depth;
        info.xrc = xrc;

        let mut private = [0u8; private_len::REQ];
        let hdr = CmaHdr { src_port: p.src_port, src: self.cfg.local_ip, dst: p.dst.ip() };
        hdr.emit(&mut private).map_err(|_| inval("rdma_connect: header"))?;
        private[CmaHdr::LEN..CmaHdr::LEN + p.private_data.len()].copy_from_slice(&p.private_data);
        let id = self.alloc_comm_id();
        let req = Req {
            local_comm_id: id,
            vendor_id: 0,
            service_id: service::service_id(p.ps, p.dst.port()),
            local_ca_guid: self.cfg.ca_guid,
            local_qkey: 0,
            local_qpn: p.qpn,
            responder_resources: info.responder_resources,
            local_eecn: 0,
            initiator_depth: p.initiator_depth,
            remote_eecn: 0,
            remote_cm_response_timeout: timer::CM_RESPONSE_TIMEOUT,
            transport: p.transport,
            flow_control: p.flow_control,
            starting_psn: info.local_psn,
            local_cm_response_timeout: timer::CM_RESPONSE_TIMEOUT,
            retry_count: if xrc { 0 } else { info.retry_count },
            pkey: 0xFFFF,
            path_mtu: self.cfg.path_mtu,
            rdc_exists: false,
            rnr_retry_count: if xrc { 0 } else { info.rnr_retry_count },
            max_cm_retries: timer::MAX_CM_RETRIES,
            srq: p.srq && !xrc,
            // XRC: extended transport type 1 (`cm_req_set_qp_type`).
            ext_transport: xrc as u8,
            primary: Path {
                local_lid: 0xFFFF,
                remote_lid: 0xFFFF,
                local_gid: service::ip_to_gid(self.cfg.local_ip),
                remote_gid: service::ip_to_gid(p.dst.ip()),
                flow_label: info.flow_label,
                packet_rate: 0,
                traffic_class: p.traffic_class,
                hop_limit: info.hop_limit,
                sl: 0,
                subnet_local: false,
                local_ack_timeout: info.ack_timeout,
                sap_supported: false,
            },
            alternate: Path::default(),
            private_data: Bytes(private),
        };
        let tid = form_tid(self.cfg.hi_tid, id);
        let mut c = Conn::new(info, State::ReqSent, id, p.dst.ip());
        c.tid = tid;
        c.timeout = timer::duration(self.cfg.packet_life_time) * 2 + timer::duration(timer::CM_RESPONSE_TIMEOUT);
        c.max_retries = timer::MAX_CM_RETRIES;
        self.conns.insert(id, c);
        self.send_retried(now, id, &CmMad::new(tid, CmMsg::Req(Box::new(req))));
        Ok(ConnId(id))
    }

    /// `rdma_accept`: REP for a connection request (passive RC), SIDR_REP
    /// with status 0 for a UD request.
    pub fn accept(&mut self, now: Instant, id: ConnId, p: AcceptParams) -> Result<(), Error> {
        let c = self.conns.get(&id.0).filter(|c| !c.destroyed).ok_or_else(|| inval("rdma_accept: no such id"))?;
        match c.state {
            State::ReqRcvd => {}
            State::SidrReqRcvd => return self.sidr_reply(id.0, sidr_status::SUCCESS, p.qpn, p.qkey, &p.private_data),
            _ => return Err(inval("rdma_accept: no connection request pending")),
        }
        let private = Bytes::<{ private_len::REP }>::from_prefix(&p.private_data)
            .ok_or_else(|| inval("rdma_accept: private data over 196 bytes"))?;
        if p.qpn == 0 || p.qpn > 0xFF_FFFF {
            return Err(inval("rdma_accept: bad QP number"));
        }
        let cfg_guid = self.cfg.ca_guid;
        let ack_delay = self.cfg.ca_ack_delay;
        let Some(c) = self.conns.get_mut(&id.0) else { return Err(inval("rdma_accept: no such id")) };
        c.info.local_qpn = p.qpn;
        c.info.responder_resources = p.responder_resources;
        c.info.initiator_depth = p.initiator_depth;
        c.info.flow_control = p.flow_control;
        c.info.srq = p.srq;
        // An XRC target's REP names its QP in the Local EE Context Number
        // field, says SRQ, and offers no initiator depth or flow control
        // (`k/cm.c` `cm_format_rep`).
        let xrc = c.info.xrc;
        let rep = Rep {
            local_comm_id: c.local_comm_id,
            remote_comm_id: c.remote_comm_id,
            local_qkey: 0,
            local_qpn: if xrc { 0 } else { p.qpn },
            vendor_id: 0,
            local_eecn: if xrc { p.qpn } else { 0 },
            starting_psn: c.info.local_psn,
            responder_resources: p.responder_resources,
            initiator_depth: if xrc { 0 } else { p.initiator_depth },
            target_ack_delay: ack_delay,
            failover_accepted: 0,
            flow_control: p.flow_control && !xrc,
            rnr_retry_count: p.rnr_retry_count.min(7),
            srq: p.srq || xrc,
            local_ca_guid: cfg_guid,
            private_data: private,
        };
        c.state = State::RepSent;
        let tid = c.tid;
        self.send_retried(now, id.0, &CmMad::new(tid, CmMsg::Rep(Box::new(rep))));
        Ok(())
    }

    /// `rdma_reject`: REJ with `reason` (rdma_cm sends 28 "consumer
    /// defined") to a pending request or, on the active side, to a REP;
    /// SIDR_REP "rejected" to a UD request.
    pub fn reject(&mut self, _now: Instant, id: ConnId, reason: u16, private_data: &[u8]) -> Result<(), Error> {
        let c = self.conns.get(&id.0).filter(|c| !c.destroyed).ok_or_else(|| inval("rdma_reject: no such id"))?;
        let msg_rejected = match c.state {
            State::ReqRcvd => MsgRef::Req,
            State::RepRcvd => MsgRef::Rep,
            State::SidrReqRcvd => return self.sidr_reply(id.0, sidr_status::REJECT, 0, 0, private_data),
            _ => return Err(inval("rdma_reject: nothing to reject")),
        };
        let private = Bytes::<{ private_len::REJ }>::from_prefix(private_data)
            .ok_or_else(|| inval("rdma_reject: private data over 148 bytes"))?;
        self.send_rej(id.0, msg_rejected, reason, &[], private);
        self.reset_to_idle(id.0);
        Ok(())
    }

    fn send_rej(&mut self, id: u32, msg_rejected: MsgRef, reason: u16, ari: &[u8], private: Bytes<148>) {
        let Some(c) = self.conns.get(&id) else { return };
        let rej = Rej {
            local_comm_id: c.local_comm_id,
            remote_comm_id: c.remote_comm_id,
            msg_rejected,
            reject_info_len: ari.len().min(private_len::ARI) as u8,
            reason,
            ari: Bytes::from_prefix(ari).unwrap_or_default(),
            private_data: private,
        };
        let (dst, tid) = (c.peer_ip, c.tid);
        self.send(dst, &CmMad::new(tid, CmMsg::Rej(Box::new(rej))));
    }

    /// `rdma_establish` / the library's answer to a REP: sends the RTU.
    pub fn establish(&mut self, _now: Instant, id: ConnId) -> Result<(), Error> {
        let c = self.conns.get_mut(&id.0).filter(|c| !c.destroyed).ok_or_else(|| inval("rdma_establish: no id"))?;
        if c.state != State::RepRcvd {
            return Err(inval("rdma_establish: no REP received"));
        }
        c.state = State::Established;
        let rtu = Rtu { local_comm_id: c.local_comm_id, remote_comm_id: c.remote_comm_id, ..Rtu::default() };
        let (dst, tid) = (c.peer_ip, c.tid);
        self.send(dst, &CmMad::new(tid, CmMsg::Rtu(Box::new(rtu))));
        Ok(())
    }

    /// `rdma_notify(IBV_EVENT_COMM_EST)`: data arrived before the RTU.
    pub fn notify_established(&mut self, _now: Instant, id: ConnId) -> Result<(), Error> {
        let c = self.conns.get_mut(&id.0).filter(|c| !c.destroyed).ok_or_else(|| inval("rdma_notify: no id"))?;
        match c.state {
            State::RepSent | State::MraRepRcvd => {
                c.state = State::Established;
                c.pending = None;
                self.event(id.0, EventKind::Established, 0, Param::None, Vec::new());
                Ok(())
            }
            State::Established => Ok(()),
            _ => Err(inval("rdma_notify: not awaiting an RTU")),
        }
    }

    /// `rdma_disconnect`: DREQ from an established connection, DREP to a
    /// received DREQ.
    pub fn disconnect(&mut self, now: Instant, id: ConnId) -> Result<(), Error> {
        let c = self.conns.get(&id.0).filter(|c| !c.destroyed).ok_or_else(|| inval("rdma_disconnect: no id"))?;
        match c.state {
            State::Established => {
                self.send_dreq(now, id.0, true);
                Ok(())
            }
            State::DreqRcvd => {
                self.send_drep(now, id.0);
                Ok(())
            }
            _ => Err(inval("rdma_disconnect: not connected")),
        }
    }

    fn send_dreq(&mut self, now: Instant, id: u32, retried: bool) {
        let Some(c) = self.conns.get_mut(&id) else { return };
        let dreq = Dreq {
            local_comm_id: c.local_comm_id,
            remote_comm_id: c.remote_comm_id,
            remote_qpn: c.info.remote_qpn,
            private_data: Bytes::default(),
        };
        c.state = State::DreqSent;
        let mad = CmMad::new(form_tid(self.cfg.hi_tid, c.local_comm_id), CmMsg::Dreq(Box::new(dreq)));
        if retried {
            self.send_retried(now, id, &mad);
        } else {
            let dst = c.peer_ip;
            self.send(dst, &mad);
        }
    }

    fn drep_of(c: &Conn) -> CmMad {
        let drep = Drep { local_comm_id: c.local_comm_id, remote_comm_id: c.remote_comm_id, ..Drep::default() };
        CmMad::new(c.dreq_tid, CmMsg::Drep(Box::new(drep)))
    }

    fn send_drep(&mut self, now: Instant, id: u32) {
        let Some(c) = self.conns.get(&id) else { return };
        let (dst, mad) = (c.peer_ip, Self::drep_of(c));
        self.send(dst, &mad);
        self.enter_timewait(now, id);
    }

    /// `rdma_destroy_id`: what the kernel sends for the id's state (a REJ,
    /// one DREQ, a DREP), then no more events; the record stays through
    /// timewait to catch late messages.
    pub fn destroy(&mut self, now: Instant, id: ConnId) -> Result<(), Error> {
        let c = self.conns.get(&id.0).filter(|c| !c.destroyed).ok_or_else(|| inval("rdma_destroy_id: no id"))?;
        let state = c.state;
        match state {
            State::ReqSent | State::MraReqRcvd => {
                let guid = self.cfg.ca_guid.to_be_bytes();
                self.send_rej(id.0, MsgRef::Other, rej_reason::TIMEOUT, &guid, Bytes::default());
            }
            State::ReqRcvd => self.send_rej(id.0, MsgRef::Req, rej_reason::CONSUMER_DEFINED, &[], Bytes::default()),
            State::RepRcvd => self.send_rej(id.0, MsgRef::Rep, rej_reason::CONSUMER_DEFINED, &[], Bytes::default()),
            State::RepSent | State::MraRepRcvd => {
                self.send_rej(id.0, MsgRef::Other, rej_reason::CONSUMER_DEFINED, &[], Bytes::default())
            }
            State::Established => self.send_dreq(now, id.0, false),
            State::DreqRcvd => self.send_drep(now, id.0),
            State::SidrReqRcvd => {
                let _ = self.sidr_reply(id.0, sidr_status::REJECT, 0, 0, &[]);
            }
            State::Idle | State::Timewait | State::DreqSent | State::SidrReqSent => {}
        }
        if let Some(c) = self.conns.get_mut(&id.0) {
            c.destroyed = true;
        }
        match state {
            State::Established | State::DreqSent | State::RepSent | State::MraRepRcvd => self.enter_timewait(now, id.0),
            State::DreqRcvd | State::Timewait => {}
            _ => self.reset_to_idle(id.0),
        }
        Ok(())
    }

    /// Destroys every id the user still holds, as closing the kernel's
    /// rdma_cm file does when a process exits: each sends what its state
    /// needs (a DREQ for an established connection, a REJ for a pending one).
    pub fn destroy_all(&mut self, now: Instant) {
        let mut live: Vec<u32> = self.conns.iter().filter(|(_, c)| !c.destroyed).map(|(&id, _)| id).collect();
        live.sort_unstable();
        for id in live {
            let _ = self.destroy(now, ConnId(id));
        }
        self.listeners.clear();
    }

    /// SIDR for a UD id: sends a SIDR_REQ, every 4096 ms up to 15 times.
    pub fn sidr_resolve(&mut self, now: Instant, p: SidrParams) -> Result<ConnId, Error> {
        if p.private_data.len() > SIDR_REQ_USER_PRIVATE {
            return Err(inval("rdma_connect: UD private data over 180 bytes"));
        }
        if p.dst.port() == 0 || p.dst.is_ipv4() != self.cfg.local_ip.is_ipv4() {
            return Err(inval("rdma_connect: bad destination"));
        }
        let info = self.base_info(Role::Active, p.ps, p.src_port, p.dst);
        let mut private = [0u8; private_len::SIDR_REQ];
        let hdr = CmaHdr { src_port: p.src_port, src: self.cfg.local_ip, dst: p.dst.ip() };
        hdr.emit(&mut private).map_err(|_| inval("rdma_connect: header"))?;
        private[CmaHdr::LEN..CmaHdr::LEN + p.private_data.len()].copy_from_slice(&p.private_data);
        let id = self.alloc_comm_id();
        let req = SidrReq {
            request_id: id,
            pkey: 0xFFFF,
            service_id: service::service_id(p.ps, p.dst.port()),
            private_data: Bytes(private),
        };
        let tid = form_tid(self.cfg.hi_tid, id);
        let mut c = Conn::new(info, State::SidrReqSent, id, p.dst.ip());
        c.tid = tid;
        c.timeout = timer::duration(timer::SIDR_TIMEOUT);
        c.max_retries = timer::SIDR_RETRIES;
        self.conns.insert(id, c);
        self.send_retried(now, id, &CmMad::new(tid, CmMsg::SidrReq(Box::new(req))));
        Ok(ConnId(id))
    }

    fn sidr_reply(&mut self, id: u32, status: u8, qpn: u32, qkey: u32, private: &[u8]) -> Result<(), Error> {
        let private = Bytes::<{ private_len::SIDR_REP }>::from_prefix(private)
            .ok_or_else(|| inval("rdma_accept: UD private data over 136 bytes"))?;
        if status == sidr_status::SUCCESS && (qpn == 0 || qpn > 0xFF_FFFF) {
            return Err(inval("rdma_accept: bad QP number"));
        }
        let Some(c) = self.conns.get_mut(&id) else { return Err(inval("rdma_accept: no such id")) };
        c.info.local_qpn = qpn;
        c.info.qkey = qkey;
        let rep = SidrRep {
            request_id: c.remote_comm_id,
            status,
            add_info_len: 0,
            qpn,
            service_id: service::service_id(c.info.ps, c.info.local.port()),
            qkey,
            add_info: Bytes::default(),
            private_data: private,
        };
        c.state = State::Idle;
        let (dst, tid, key) = (c.peer_ip, c.tid, (c.remote_comm_id, c.peer_ip));
        self.remote_sidr.remove(&key);
        self.send(dst, &CmMad::new(tid, CmMsg::SidrRep(Box::new(rep))));
        Ok(())
    }

    // ---- timers -----------------------------------------------------------

    /// Retransmits, gives up, and leaves timewait, for every deadline ≤ `now`.
    pub fn handle_timeout(&mut self, now: Instant) {
        for id in self.conns.due(now) {
            self.timeout_one(now, id);
            self.conns.touch(id);
        }
        for p in self.park.due(now) {
            let listened = self.match_listener(p.req.service_id, p.req.private_data.as_slice()).is_ok();
            if listened || p.at + super::park::HOLD <= now {
                self.take_req(now, p.src, p.tid, &p.req, false);
            } else {
                self.park.keep(p);
            }
        }
    }

    fn timeout_one(&mut self, now: Instant, id: u32) {
        let Some(c) = self.conns.get_mut(&id) else { return };
        if let Some(p) = c.pending.as_mut().filter(|p| p.deadline <= now) {
            if p.retries_left > 0 {
                p.retries_left -= 1;
                p.deadline = now + p.timeout;
                let out = Outgoing { dst: p.dst, mad: *p.mad };
                self.stats.sent += 1;
                self.stats.retransmits += 1;
                self.transmit.push_back(out);
            } else {
                c.pending = None;
                self.send_error(now, id);
            }
            return;
        }
        let Some(c) = self.conns.get_mut(&id) else { return };
        if c.timewait_until.is_some_and(|t| t <= now) {
            c.timewait_until = None;
            let key = (c.remote_comm_id, c.info.remote_ca_guid);
            if self.remote_ids.get(&key) == Some(&id) {
                self.remote_ids.remove(&key);
            }
            if c.destroyed {
                self.conns.remove(&id);
            } else {
                c.state = State::Idle;
                self.event(id, EventKind::TimewaitExit, 0, Param::None, Vec::new());
            }
        }
    }

    /// Retries exhausted (`k/cm.c` `cm_process_send_error`).
    fn send_error(&mut self, now: Instant, id: u32) {
        let Some(c) = self.conns.get(&id) else { return };
        match c.state {
            State::ReqSent | State::MraReqRcvd | State::RepSent | State::MraRepRcvd | State::SidrReqSent => {
                let private = if c.state == State::SidrReqSent { vec![0; private_len::SIDR_REP] } else { Vec::new() };
                self.event(id, EventKind::Unreachable, ETIMEDOUT, Param::None, private);
                self.reset_to_idle(id);
            }
            State::DreqSent => {
                self.enter_timewait(now, id);
                self.report_disconnect(id, ETIMEDOUT);
            }
            _ => {}
        }
    }

    fn report_disconnect(&mut self, id: u32, status: i32) {
        let Some(c) = self.conns.get_mut(&id) else { return };
        if !c.disconnect_reported {
            c.disconnect_reported = true;
            self.event(id, EventKind::Disconnected, status, Param::None, Vec::new());
        }
    }

    // ---- received MADs ----------------------------------------------------

    /// One MAD received on QP 1 from `src` (the IP the packet came from).
    pub fn handle_mad(&mut self, now: Instant, src: IpAddr, bytes: &[u8]) {
        self.stats.received += 1;
        let mad = match CmMad::parse(bytes) {
            Ok(m) => m,
            Err(MadError::UnknownAttribute(_)) => {
                self.stats.unknown_attr += 1;
                return;
            }
            Err(_) => {
                self.stats.malformed += 1;
                return;
            }
        };
        let tid = mad.tid;
        let handled = match mad.msg {
            CmMsg::Req(r) => self.on_req(now, src, tid, &r),
            CmMsg::Rep(r) => self.on_rep(now, src, tid, &r),
            CmMsg::Rtu(r) => self.on_rtu(&r),
            CmMsg::Rej(r) => self.on_rej(now, &r),
            CmMsg::Mra(m) => self.on_mra(now, &m),
            CmMsg::Dreq(d) => self.on_dreq(now, src, tid, &d),
            CmMsg::Drep(d) => self.on_drep(now, &d),
            CmMsg::SidrReq(s) => self.on_sidr_req(now, src, tid, &s),
            CmMsg::SidrRep(s) => self.on_sidr_rep(&s),
        };
        if !handled {
            self.stats.unmatched += 1;
        }
    }

    /// A REJ for a request no record holds (`k/cm.c` `cm_issue_rej`).
    #[allow(clippy::too_many_arguments)]
    fn issue_rej(&mut self, now: Instant, dst: IpAddr, tid: u64, local: u32, remote: u32, msg: MsgRef, reason: u16) {
        let rej = Rej {
            local_comm_id: local,
            remote_comm_id: remote,
            msg_rejected: msg,
            reject_info_len: 0,
            reason,
            ari: Bytes::default(),
            private_data: Bytes::default(),
        };
        self.answer(now, dst, &CmMad::new(tid, CmMsg::Rej(Box::new(rej))));
    }

    /// Sends an answer to a peer with no record, if the budget allows.
    fn answer(&mut self, now: Instant, dst: IpAddr, mad: &CmMad) {
        if self.answers.take(now) {
            self.send(dst, mad);
        } else {
            self.stats.answers_suppressed += 1;
        }
    }

    fn find_live_qpn(&self, qpn: u32, guid: u64, except: u32) -> Option<u32> {
        self.conns
            .iter()
            .find(|(&id, c)| {
                id != except && c.state.holds_qp() && c.info.remote_qpn == qpn && c.info.remote_ca_guid == guid
            })
            .map(|(&id, _)| id)
    }

    fn pending_requests(&self, l: ListenId) -> usize {
        self.conns.values().filter(|c| c.listen_id == Some(l) && c.state == State::ReqRcvd && !c.destroyed).count()
    }

    /// The listener for a request: `Err(reason)` for the REJ (8 no
    /// listener, 28 refused after the Service ID matched).
    fn match_listener(&self, sid: u64, private: &[u8]) -> Result<(ListenId, PortSpace, u16, CmaHdr), u16> {
        let (ps, port) = service::from_service_id(sid).ok_or(rej_reason::INVALID_SERVICE_ID)?;
        let mut on_port = self.listeners.iter().filter(|(_, l)| l.params.ps == ps && l.params.port == port).peekable();
        if on_port.peek().is_none() {
            return Err(rej_reason::INVALID_SERVICE_ID);
        }
        let hdr = CmaHdr::parse(private).map_err(|_| rej_reason::CONSUMER_DEFINED)?;
        if hdr.dst != self.cfg.local_ip || hdr.src.is_ipv4() != hdr.dst.is_ipv4() {
            return Err(rej_reason::CONSUMER_DEFINED);
        }
        let mut best = None;
        for (&id, l) in on_port {
            match l.params.addr {
                Some(a) if a == hdr.dst => return Ok((id, ps, port, hdr)),
                None => best = Some(id),
                _ => {}
            }
        }
        best.map(|id| (id, ps, port, hdr)).ok_or(rej_reason::CONSUMER_DEFINED)
    }

    fn on_req(&mut self, now: Instant, src: IpAddr, tid: u64, r: &Req) -> bool {
        self.take_req(now, src, tid, r, true)
    }

    /// A REQ, arrived or (`may_park` false) done waiting for a listener.
    fn take_req(&mut self, now: Instant, src: IpAddr, tid: u64, r: &Req, may_park: bool) -> bool {
        if let Some(&id) = self.remote_ids.get(&(r.local_comm_id, r.local_ca_guid)) {
            self.stats.duplicates += 1;
            let Some(c) = self.conns.get(&id) else { return false };
            match c.state {
                State::ReqRcvd => {
                    let mra = Mra {
                        local_comm_id: c.local_comm_id,
                        remote_comm_id: c.remote_comm_id,
                        msg_mraed: MsgRef::Req,
                        service_timeout: timer::MRA_SERVICE_TIMEOUT,
                        private_data: Bytes::default(),
                    };
                    let (dst, tid) = (c.peer_ip, c.tid);
                    self.send(dst, &CmMad::new(tid, CmMsg::Mra(Box::new(mra))));
                }
                State::Timewait => {
                    self.issue_rej(now, src, tid, 0, r.local_comm_id, MsgRef::Req, rej_reason::STALE_CONN);
                }
                _ => {}
            }
            return true;
        }
        if let Some(old) = self.find_live_qpn(r.local_qpn, r.local_ca_guid, 0) {
            self.issue_rej(now, src, tid, 0, r.local_comm_id, MsgRef::Req, rej_reason::STALE_CONN);
            if self.conns.get(&old).is_some_and(|c| c.state == State::Established) {
                self.send_dreq(now, old, true);
            }
            return true;
        }
        let (lid, ps, port, hdr) = match self.match_listener(r.service_id, r.private_data.as_slice()) {
            Ok(m) => m,
            Err(reason) => {
                let parked = match service::from_service_id(r.service_id) {
                    Some((ps, port)) if may_park && reason == rej_reason::INVALID_SERVICE_ID => {
                        self.park.park(now, ps, port, src, tid, r)
                    }
                    _ => None,
                };
                match parked {
                    Some(true) => self.stats.reqs_parked += 1,
                    Some(false) => self.stats.duplicates += 1,
                    None => self.issue_rej(now, src, tid, 0, r.local_comm_id, MsgRef::Req, reason),
                }
                return true;
            }
        };
        // The REQ's QP type must be the listener's: XRC (extended type 1)
        // for an XRC listener, RC or UC for the others.
        let xrc = r.transport == TransportType::Xrc && r.ext_transport == 1;
        let xrc_listener = self.listeners.get(&lid).is_some_and(|l| l.params.xrc);
        let fits = match xrc_listener {
            true => xrc,
            false => matches!(r.transport, TransportType::Rc | TransportType::Uc),
        };
        if ps.is_ud() || !fits {
            self.issue_rej(now, src, tid, 0, r.local_comm_id, MsgRef::Req, rej_reason::CONSUMER_DEFINED);
            return true;
        }
        let backlog = self.listeners.get(&lid).map_or(0, |l| l.params.backlog as usize);
        if self.pending_requests(lid) >= backlog {
            // The kernel drops the REQ without a REJ: the active retries.
            self.stats.backlog_drops += 1;
            return true;
        }
        let mut info = self.base_info(Role::Passive, ps, port, SocketAddr::new(hdr.src, hdr.src_port));
        info.local = SocketAddr::new(hdr.dst, port);
        info.remote_qpn = r.local_qpn;
        info.remote_psn = r.starting_psn;
        info.remote_ca_guid = r.local_ca_guid;
        info.responder_resources = r.initiator_depth;
        info.initiator_depth = r.responder_resources;
        info.flow_control = r.flow_control;
        info.srq = r.srq;
        info.retry_count = r.retry_count;
        info.rnr_retry_count = r.rnr_retry_count;
        info.xrc = xrc;
        info.path_mtu = r.path_mtu.min(self.cfg.path_mtu);
        info.flow_label = r.primary.flow_label;
        info.hop_limit = r.primary.hop_limit;
        info.traffic_class = r.primary.traffic_class;
        info.ack_timeout = r.primary.local_ack_timeout;
        let id = self.alloc_comm_id();
        let mut c = Conn::new(info, State::ReqRcvd, id, src);
        c.remote_comm_id = r.local_comm_id;
        c.listen_id = Some(lid);
        c.tid = tid;
        c.timeout = timer::duration(r.local_cm_response_timeout);
        c.max_retries = r.max_cm_retries;
        self.conns.insert(id, c);
        self.remote_ids.insert((r.local_comm_id, r.local_ca_guid), id);
        let param = ConnParam {
            responder_resources: r.initiator_depth,
            initiator_depth: r.responder_resources,
            flow_control: r.flow_control,
            retry_count: r.retry_count,
            rnr_retry_count: r.rnr_retry_count,
            srq: r.srq,
            qp_num: r.local_qpn,
        };
        let private = r.private_data.0[CmaHdr::LEN..].to_vec();
        self.event(id, EventKind::ConnectRequest, 0, Param::Conn(param), private);
        true
    }

    fn on_rep(&mut self, now: Instant, src: IpAddr, tid: u64, r: &Rep) -> bool {
        let Some(c) = self.conns.get(&r.remote_comm_id) else { return false };
        let id = c.local_comm_id;
        match c.state {
            State::ReqSent | State::MraReqRcvd => {}
            State::Established if c.remote_comm_id == r.local_comm_id => {
                self.stats.duplicates += 1;
                let rtu = Rtu { local_comm_id: c.local_comm_id, remote_comm_id: c.remote_comm_id, ..Rtu::default() };
                let (dst, tid) = (c.peer_ip, c.tid);
                self.send(dst, &CmMad::new(tid, CmMsg::Rtu(Box::new(rtu))));
                return true;
            }
            State::RepRcvd if c.remote_comm_id == r.local_comm_id => {
                self.stats.duplicates += 1;
                let mra = Mra {
                    local_comm_id: c.local_comm_id,
                    remote_comm_id: c.remote_comm_id,
                    msg_mraed: MsgRef::Rep,
                    service_timeout: timer::MRA_SERVICE_TIMEOUT,
                    private_data: Bytes::default(),
                };
                let (dst, tid) = (c.peer_ip, c.tid);
                self.send(dst, &CmMad::new(tid, CmMsg::Mra(Box::new(mra))));
                return true;
            }
            _ => return false,
        }
        // An XRC target names its QP in the Local EECN field.
        let qpn = if c.info.xrc { r.local_eecn } else { r.local_qpn };
        let known = self.remote_ids.get(&(r.local_comm_id, r.local_ca_guid)).is_some_and(|&o| o != id);
        if known || self.find_live_qpn(qpn, r.local_ca_guid, id).is_some() {
            self.issue_rej(now, src, tid, r.remote_comm_id, r.local_comm_id, MsgRef::Rep, rej_reason::STALE_CONN);
            if let Some(old) = self.find_live_qpn(qpn, r.local_ca_guid, id) {
                if self.conns.get(&old).is_some_and(|c| c.state == State::Established) {
                    self.send_dreq(now, old, true);
                }
            }
            return true;
        }
        let plt = self.cfg.packet_life_time;
        let Some(c) = self.conns.get_mut(&id) else { return false };
        c.remote_comm_id = r.local_comm_id;
        c.pending = None;
        c.state = State::RepRcvd;
        c.peer_ip = src;
        let i = &mut c.info;
        i.remote_qpn = qpn;
        i.remote_psn = r.starting_psn;
        i.remote_ca_guid = r.local_ca_guid;
        i.responder_resources = r.initiator_depth;
        i.initiator_depth = r.responder_resources;
        i.flow_control = r.flow_control;
        i.srq = r.srq;
        i.rnr_retry_count = r.rnr_retry_count;
        i.ack_timeout = timer::ack_timeout(r.target_ack_delay, plt);
        let param = ConnParam {
            responder_resources: r.initiator_depth,
            initiator_depth: r.responder_resources,
            flow_control: r.flow_control,
            retry_count: i.retry_count,
            rnr_retry_count: r.rnr_retry_count,
            srq: r.srq,
            qp_num: qpn,
        };
        self.remote_ids.insert((r.local_comm_id, r.local_ca_guid), id);
        self.event(id, EventKind::ConnectResponse, 0, Param::Conn(param), r.private_data.0.to_vec());
        true
    }

    fn on_rtu(&mut self, r: &Rtu) -> bool {
        let Some(c) = self.conns.get_mut(&r.remote_comm_id) else { return false };
        if c.remote_comm_id != r.local_comm_id || !matches!(c.state, State::RepSent | State::MraRepRcvd) {
            return false;
        }
        c.state = State::Established;
        c.pending = None;
        let id = c.local_comm_id;
        self.event(id, EventKind::Established, 0, Param::None, Vec::new());
        true
    }

    /// The record a REJ is for (`k/cm.c` `cm_acquire_rejected_id`): by the
    /// sender's CA GUID and comm ID for a timeout REJ; by our comm ID while
    /// we know no remote one yet for a REJ of our REQ; by both comm IDs
    /// otherwise. A REJ of a REQ cannot reach a connection past REQ_SENT.
    fn rejected_id(&self, r: &Rej) -> Option<u32> {
        if r.reason == rej_reason::TIMEOUT {
            // The kernel reads the GUID whatever the ARI length says.
            let g: [u8; 8] = r.ari.0.get(..8)?.try_into().ok()?;
            let id = *self.remote_ids.get(&(r.local_comm_id, u64::from_be_bytes(g)))?;
            return self.conns.get(&id).filter(|c| c.remote_comm_id == r.local_comm_id).map(|c| c.local_comm_id);
        }
        let remote = if r.msg_rejected == MsgRef::Req { 0 } else { r.local_comm_id };
        self.conns.get(&r.remote_comm_id).filter(|c| c.remote_comm_id == remote).map(|c| c.local_comm_id)
    }

    fn on_rej(&mut self, now: Instant, r: &Rej) -> bool {
        let id = self.rejected_id(r);
        let Some(id) = id else { return false };
        let Some(state) = self.conns.get(&id).map(|c| c.state) else { return false };
        let stale = r.reason == rej_reason::STALE_CONN;
        match state {
            State::ReqSent | State::MraReqRcvd | State::RepSent | State::MraRepRcvd | State::ReqRcvd => {
                if stale {
                    self.enter_timewait(now, id);
                }
            }
            State::DreqSent | State::RepRcvd | State::Established => self.enter_timewait(now, id),
            _ => return false,
        }
        self.event(id, EventKind::Rejected, r.reason as i32, Param::None, r.private_data.0.to_vec());
        if !stale && !matches!(state, State::DreqSent | State::RepRcvd | State::Established) {
            self.reset_to_idle(id);
        }
        true
    }

    fn on_mra(&mut self, now: Instant, m: &Mra) -> bool {
        let Some(c) = self.conns.get_mut(&m.remote_comm_id) else { return false };
        let next = match (m.msg_mraed, c.state) {
            (MsgRef::Req, State::ReqSent) => State::MraReqRcvd,
            (MsgRef::Rep, State::RepSent) if c.remote_comm_id == m.local_comm_id => State::MraRepRcvd,
            _ => return false,
        };
        c.state = next;
        let wait = timer::duration(m.service_timeout) + timer::duration(c.info.ack_timeout);
        if let Some(p) = c.pending.as_mut() {
            p.deadline = now + wait;
        }
        true
    }

    fn on_dreq(&mut self, now: Instant, src: IpAddr, tid: u64, d: &Dreq) -> bool {
        let found = self.conns.get(&d.remote_comm_id).filter(|c| c.remote_comm_id == d.local_comm_id);
        let Some(c) = found else {
            // Unknown: answer with a DREP, IDs swapped (`k/cm.c` `cm_issue_drep`).
            let drep = Drep { local_comm_id: d.remote_comm_id, remote_comm_id: d.local_comm_id, ..Drep::default() };
            self.answer(now, src, &CmMad::new(tid, CmMsg::Drep(Box::new(drep))));
            return false;
        };
        if d.remote_qpn != c.info.local_qpn {
            return false;
        }
        let id = c.local_comm_id;
        match c.state {
            State::RepSent | State::MraRepRcvd | State::DreqSent | State::Established => {}
            State::Timewait => {
                let mut c2 = c.clone();
                c2.dreq_tid = tid;
                let (dst, mad) = (c2.peer_ip, Self::drep_of(&c2));
                self.stats.duplicates += 1;
                self.send(dst, &mad);
                return true;
            }
            State::DreqRcvd => {
                self.stats.duplicates += 1;
                return true;
            }
            _ => return false,
        }
        let Some(c) = self.conns.get_mut(&id) else { return false };
        c.pending = None;
        c.dreq_tid = tid;
        c.state = State::DreqRcvd;
        let destroyed = c.destroyed;
        if destroyed {
            // Destroyed while a DREQ was on its way: answer it now.
            self.send_drep(now, id);
        } else {
            self.report_disconnect(id, 0);
        }
        true
    }

    fn on_drep(&mut self, now: Instant, d: &Drep) -> bool {
        let Some(c) = self.conns.get(&d.remote_comm_id) else { return false };
        if c.remote_comm_id != d.local_comm_id || !matches!(c.state, State::DreqSent | State::DreqRcvd) {
            return false;
        }
        let id = c.local_comm_id;
        self.enter_timewait(now, id);
        self.report_disconnect(id, 0);
        true
    }

    fn on_sidr_req(&mut self, now: Instant, src: IpAddr, tid: u64, s: &SidrReq) -> bool {
        if self.remote_sidr.contains_key(&(s.request_id, src)) {
            self.stats.duplicates += 1;
            return true;
        }
        let refuse = |cm: &mut Cm, status: u8| {
            let rep = SidrRep {
                request_id: s.request_id,
                status,
                add_info_len: 0,
                qpn: 0,
                service_id: s.service_id,
                qkey: 0,
                add_info: Bytes::default(),
                private_data: Bytes::default(),
            };
            cm.answer(now, src, &CmMad::new(tid, CmMsg::SidrRep(Box::new(rep))));
        };
        let (lid, ps, port, hdr) = match self.match_listener(s.service_id, s.private_data.as_slice()) {
            Ok(m) => m,
            Err(rej_reason::INVALID_SERVICE_ID) => {
                refuse(self, sidr_status::UNSUPPORTED);
                return true;
            }
            Err(_) => {
                refuse(self, sidr_status::REJECT);
                return true;
            }
        };
        if !ps.is_ud() {
            refuse(self, sidr_status::REJECT);
            return true;
        }
        let backlog = self.listeners.get(&lid).map_or(0, |l| l.params.backlog as usize);
        let pending = self
            .conns
            .values()
            .filter(|c| c.listen_id == Some(lid) && c.state == State::SidrReqRcvd && !c.destroyed)
            .count();
        if pending >= backlog {
            self.stats.backlog_drops += 1;
            return true;
        }
        let mut info = self.base_info(Role::Passive, ps, port, SocketAddr::new(hdr.src, hdr.src_port));
        info.local = SocketAddr::new(hdr.dst, port);
        let id = self.alloc_comm_id();
        let mut c = Conn::new(info, State::SidrReqRcvd, id, src);
        c.remote_comm_id = s.request_id;
        c.listen_id = Some(lid);
        c.tid = tid;
        self.conns.insert(id, c);
        self.remote_sidr.insert((s.request_id, src), id);
        let private = s.private_data.0[CmaHdr::LEN..].to_vec();
        self.event(id, EventKind::ConnectRequest, 0, Param::Ud(UdParam::default()), private);
        true
    }

    fn on_sidr_rep(&mut self, s: &SidrRep) -> bool {
        let Some(c) = self.conns.get_mut(&s.request_id) else { return false };
        if c.state != State::SidrReqSent {
            return false;
        }
        c.state = State::Idle;
        c.pending = None;
        c.info.remote_qpn = s.qpn;
        c.info.qkey = s.qkey;
        let id = c.local_comm_id;
        let private = s.private_data.0.to_vec();
        if s.status == sidr_status::SUCCESS {
            let ud = UdParam { qp_num: s.qpn, qkey: s.qkey };
            self.event(id, EventKind::Established, 0, Param::Ud(ud), private);
        } else {
            self.event(id, EventKind::Unreachable, s.status as i32, Param::None, private);
        }
        true
    }
}
