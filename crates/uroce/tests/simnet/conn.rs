//! One reliable connection between the two simulated nodes, RC or XRC: it
//! creates and connects the QPs, posts receives where its transport takes
//! them, and addresses its requests.
//!
//! * RC: an RC QP on each node; the responder's receive queue holds the
//!   receives, which complete on its node's `cq`. The responder's QP also
//!   has a send queue (a window owner binds and invalidates through it).
//! * XRC: an XRC_SEND QP on the requester's node, an XRC_RECV QP of domain
//!   [`XRCD`] on the responder's, and an XRC SRQ of that domain that every
//!   request names (`remote_srqn`). The SRQ holds the receives and the
//!   keys are checked against its PD; its receives complete on the
//!   responder node's `xrc_cq`. The XRC_RECV QP has no send queue.

use super::node::{Node, PD};
use std::net::IpAddr;
use std::sync::Arc;
use std::time::Instant;
use uroce::ib::{Access, Gid, Mtu, QpState, QpType, Sge};
use uroce::proto::qp::{required_attributes, QpInit};
use uroce::proto::srq::{RecvWqe, SharedRecvQueue, XrcSrq};
use uroce::proto::wr::{AddressVector, QpAttr, QpCap, RecvWr, SendWr};

/// The XRC domain of every XRC SRQ and XRC_RECV QP.
pub const XRCD: u32 = 7;
/// Depth of every send queue, receive queue and SRQ, and their SGEs.
const DEPTH: u32 = 512;
const SGES: u32 = 4;

pub struct Conn {
    /// Node indices (0: A, 1: B) of the requester and the responder.
    pub req: usize,
    pub resp: usize,
    pub req_qpn: u32,
    pub resp_qpn: u32,
    /// XRC: the responder's SRQ, which every request names.
    pub srq: Option<Arc<SharedRecvQueue>>,
}

/// How a connection is set up: its transport, first PSNs, path MTU, and
/// retransmission settings.
#[derive(Debug, Clone, Copy)]
pub struct ConnParams {
    pub xrc: bool,
    /// First PSN of the requester's send queue, and of the responder's.
    pub psns: (u32, u32),
    pub mtu: Mtu,
    /// ACK timeout exponent and retry count of the requester (and, for RC,
    /// of the responder's send queue).
    pub retry: (u8, u8),
}

impl Conn {
    /// Creates the QPs (the requester's first) and brings both to RTS.
    pub fn new(nodes: &mut [Node; 2], req: usize, now: Instant, p: ConnParams) -> Conn {
        let resp = 1 - req;
        let (req_qpn, resp_qpn, srq) = if p.xrc {
            let node = &mut nodes[resp];
            let srq = SharedRecvQueue::new(node.next_srqn(), PD, DEPTH, SGES, 0);
            let srq = Arc::new(srq.with_xrc(XrcSrq { xrcd: XRCD, cq: node.xrc_cq.clone() }));
            node.engine.register_xrc_srq(&srq);
            let req_qpn = create_qp(&mut nodes[req], QpType::XrcSend);
            (req_qpn, nodes[resp].engine.create_xrc_recv_qp(XRCD, true).unwrap(), Some(srq))
        } else {
            (create_qp(&mut nodes[req], QpType::Rc), create_qp(&mut nodes[resp], QpType::Rc), None)
        };
        let (req_ip, resp_ip) = (nodes[req].ip, nodes[resp].ip);
        let (p_req, p_resp) = p.psns;
        connect(&mut nodes[req], req_qpn, now, resp_ip, resp_qpn, (p_req, p_resp), p.mtu, p.retry);
        connect(&mut nodes[resp], resp_qpn, now, req_ip, req_qpn, (p_resp, p_req), p.mtu, p.retry);
        Conn { req, resp, req_qpn, resp_qpn, srq }
    }

    pub fn is_xrc(&self) -> bool {
        self.srq.is_some()
    }

    /// Posts a receive of one SGE: to the XRC SRQ, or to the RC
    /// responder's receive queue.
    pub fn post_recv(&self, nodes: &mut [Node; 2], now: Instant, wr_id: u64, sge: Sge) {
        match &self.srq {
            Some(srq) => assert!(srq.post(RecvWqe { wr_id, sges: uroce::sgl![sge] }), "the XRC SRQ is full"),
            None => nodes[self.resp]
                .engine
                .post_recv(now, self.resp_qpn, RecvWr { wr_id, sg_list: uroce::sgl![sge] })
                .unwrap(),
        }
    }

    /// Names the XRC SRQ in a request (nothing for RC).
    pub fn address(&self, wr: &mut SendWr) {
        if let Some(srq) = &self.srq {
            wr.remote_srqn = srq.handle;
        }
    }
}

fn create_qp(node: &mut Node, qp_type: QpType) -> u32 {
    let cap =
        QpCap { max_send_wr: DEPTH, max_recv_wr: DEPTH, max_send_sge: SGES, max_recv_sge: SGES, max_inline_data: 64 };
    let init = QpInit {
        qp_type,
        pd: PD,
        send_cq: node.cq.clone(),
        recv_cq: node.cq.clone(),
        srq: None,
        cap,
        sq_sig_all: false,
        scatter_to_cqe: true,
    };
    node.engine.create_qp(init).unwrap()
}

/// INIT → RTR → RTS towards `peer`'s QP `peer_qpn`, each step with the
/// attributes the QP's type requires there (for RC: the same as
/// `ibv_modify_qp` users pass).
#[allow(clippy::too_many_arguments)]
fn connect(
    node: &mut Node,
    qpn: u32,
    now: Instant,
    peer: IpAddr,
    peer_qpn: u32,
    psns: (u32, u32),
    mtu: Mtu,
    retry: (u8, u8),
) {
    let t = node.engine.qp(qpn).expect("the QP").qp_type;
    let mask = |from, to| uroce::ib::QpAttrMask::STATE | required_attributes(t, from, to);
    let remote = Access::REMOTE_READ | Access::REMOTE_WRITE | Access::REMOTE_ATOMIC;
    let mut a = QpAttr {
        qp_state: QpState::Init,
        port_num: 1,
        qp_access_flags: Access::LOCAL_WRITE | remote,
        ..QpAttr::default()
    };
    node.engine.modify_qp(now, qpn, &a, mask(QpState::Reset, QpState::Init)).unwrap();
    a.qp_state = QpState::Rtr;
    a.path_mtu = mtu;
    a.dest_qp_num = peer_qpn;
    a.rq_psn = psns.1;
    a.max_dest_rd_atomic = 8;
    a.min_rnr_timer = 1;
    a.ah_attr =
        AddressVector { dgid: Gid::from_ip(peer), is_global: true, hop_limit: 64, port_num: 1, ..Default::default() };
    node.engine.modify_qp(now, qpn, &a, mask(QpState::Init, QpState::Rtr)).unwrap();
    a.qp_state = QpState::Rts;
    (a.timeout, a.retry_cnt) = retry;
    a.rnr_retry = 7;
    a.sq_psn = psns.0;
    a.max_rd_atomic = 8;
    node.engine.modify_qp(now, qpn, &a, mask(QpState::Rtr, QpState::Rts)).unwrap();
}
