//! Work requests as the application posts them, and the attributes that
//! configure a queue pair (`ibv_send_wr`, `ibv_recv_wr`, `ibv_qp_attr`, …) in
//! Rust form. These are inputs to the protocol core; they carry no behaviour.

use crate::ib::{Access, Errno, Error, Gid, Mtu, QpState, QpType, Result, SendFlags, Sge};

/// `enum ibv_wr_opcode`, as far as uroce executes it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u32)]
pub enum WrOpcode {
    /// `IBV_WR_RDMA_WRITE`: writes the SGEs' bytes to remote memory.
    RdmaWrite = 0,
    /// `IBV_WR_RDMA_WRITE_WITH_IMM`: an RDMA WRITE that also consumes a
    /// receive WQE at the responder and delivers `imm_data`.
    RdmaWriteImm = 1,
    /// `IBV_WR_SEND`: a message into the responder's next receive WQE.
    Send = 2,
    /// `IBV_WR_SEND_WITH_IMM`: a SEND carrying `imm_data`.
    SendImm = 3,
    /// `IBV_WR_RDMA_READ`: reads remote memory into the SGEs.
    RdmaRead = 4,
    /// `IBV_WR_ATOMIC_CMP_AND_SWP`: at the 8-byte remote address, stores
    /// `swap` if the value there equals `compare_add`; the original value
    /// lands in the SGE.
    AtomicCmpSwp = 5,
    /// `IBV_WR_ATOMIC_FETCH_AND_ADD`: adds `compare_add` to the 8-byte
    /// remote value; the original value lands in the SGE.
    AtomicFetchAdd = 6,
    /// `IBV_WR_LOCAL_INV`: invalidates the local key in `imm_data`.
    LocalInv = 7,
    /// `IBV_WR_BIND_MW`: binds a memory window (`bind`); type 1 windows
    /// are bound this way by `ibv_bind_mw`.
    BindMw = 8,
    /// `IBV_WR_SEND_WITH_INV`: a SEND that invalidates the rkey in
    /// `imm_data` at the responder.
    SendInv = 9,
    /// `IBV_WR_DRIVER1`: a UMR that sets an indirect key's layout
    /// (`mlx5dv_wr_mr_list` / `mlx5dv_wr_mr_interleaved`).
    Umr = 11,
    /// RDMA ATOMIC WRITE (IBA 1.5 A19): 8 bytes (from the SGEs or inline)
    /// written at once to 8-byte-aligned remote memory. RC only.
    AtomicWrite = 15,
}

impl WrOpcode {
    /// The opcode of an `ibv_wr_opcode` value; `None` for one uroce does not
    /// execute.
    pub fn from_raw(v: u32) -> Option<WrOpcode> {
        use WrOpcode::*;
        Some(match v {
            0 => RdmaWrite,
            1 => RdmaWriteImm,
            2 => Send,
            3 => SendImm,
            4 => RdmaRead,
            5 => AtomicCmpSwp,
            6 => AtomicFetchAdd,
            7 => LocalInv,
            8 => BindMw,
            9 => SendInv,
            11 => Umr,
            15 => AtomicWrite,
            _ => return None,
        })
    }
    /// Compare-and-swap and fetch-and-add (not ATOMIC WRITE).
    pub fn is_atomic(self) -> bool {
        matches!(self, WrOpcode::AtomicCmpSwp | WrOpcode::AtomicFetchAdd)
    }
    /// SEND, SEND_WITH_IMM and SEND_WITH_INV.
    pub fn is_send(self) -> bool {
        matches!(self, WrOpcode::Send | WrOpcode::SendImm | WrOpcode::SendInv)
    }
    /// RDMA WRITE and RDMA WRITE_WITH_IMM (not ATOMIC WRITE).
    pub fn is_write(self) -> bool {
        matches!(self, WrOpcode::RdmaWrite | WrOpcode::RdmaWriteImm)
    }
    /// Operations that need a response carrying data (READ and atomics).
    pub fn is_read_or_atomic(self) -> bool {
        self == WrOpcode::RdmaRead || self.is_atomic()
    }
    /// Operations that take one of the responder's RDMA READ/atomic
    /// resources, so count against `max_rd_atomic`: READ, the atomics and
    /// ATOMIC WRITE (as rxe's `check_init_depth`).
    pub fn uses_rd_atomic(self) -> bool {
        self.is_read_or_atomic() || self == WrOpcode::AtomicWrite
    }
    /// Operations executed locally, without packets.
    pub fn is_local(self) -> bool {
        matches!(self, WrOpcode::LocalInv | WrOpcode::BindMw | WrOpcode::Umr)
    }

    /// Whether a QP of type `t` executes this operation (rxe's
    /// `RXE_SUP_*_QP_SEND_OPS_FLAGS`; XRC_SEND as RC but ATOMIC WRITE; an
    /// XRC_RECV QP sends nothing).
    pub fn allowed_on(self, t: QpType) -> bool {
        match t {
            QpType::Ud => matches!(self, WrOpcode::Send | WrOpcode::SendImm),
            QpType::Uc => !self.uses_rd_atomic() && self != WrOpcode::SendInv,
            QpType::Rc => true,
            QpType::XrcSend => self != WrOpcode::AtomicWrite,
            QpType::XrcRecv => false,
        }
    }
}

/// What each work request of a post is checked against before any of it is
/// read beyond its fixed fields: room in the queue, the SGE count and the
/// inline size the queue was created with, and the operations its QP type
/// executes. A post takes these once, under the device lock, and checks
/// WR `i` of its list before it reads that WR's SGE array or copies its
/// inline data, so a cyclic list, a huge `num_sge` or a huge inline SGE is
/// refused without allocating or reading past the caller's buffers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QueueLimits {
    /// Free slots when the post began.
    pub free: usize,
    /// Most SGEs one work request may carry.
    pub max_sge: u32,
    /// Most inline bytes one work request may carry; 0 for a receive queue.
    pub max_inline: u32,
    /// Type of the QP the queue belongs to (the send opcodes it executes).
    pub qp_type: QpType,
}

impl QueueLimits {
    /// WR number `index` (from 0) of a list needs a free slot: ENOMEM
    /// otherwise, whatever the list's shape or length.
    pub fn check_room(&self, index: usize) -> Result<()> {
        if index >= self.free {
            return Err(Error::new(Errno::ENOMEM, "post: work request list longer than the queue's free slots"));
        }
        Ok(())
    }

    /// A WR's `num_sge`, before its array is read: 0..=max_sge (EINVAL).
    pub fn check_num_sge(&self, num_sge: i64) -> Result<usize> {
        if num_sge < 0 || num_sge > i64::from(self.max_sge) {
            return Err(Error::inval("post: num_sge negative or above the queue's max_sge"));
        }
        Ok(num_sge as usize)
    }

    /// A send WR's opcode on this queue's QP type (EINVAL).
    pub fn check_opcode(&self, raw: u32) -> Result<WrOpcode> {
        let op = WrOpcode::from_raw(raw).ok_or_else(|| Error::inval(format!("post_send: unknown opcode {raw}")))?;
        if !op.allowed_on(self.qp_type) {
            return Err(Error::inval(format!("post_send: {op:?} not supported on {:?}", self.qp_type)));
        }
        Ok(op)
    }

    /// The total length of an inline WR's SGEs, before anything is copied:
    /// at most max_inline_data (an ATOMIC WRITE's 8 bytes travel in the WQE
    /// whatever the limit, as rxe's `dma.atomic_wr`).
    pub fn check_inline(&self, op: WrOpcode, total: u64) -> Result<()> {
        let limit =
            if op == WrOpcode::AtomicWrite { u64::from(self.max_inline).max(8) } else { u64::from(self.max_inline) };
        if total > limit {
            return Err(Error::inval("post_send: inline data above max_inline_data"));
        }
        Ok(())
    }
}

/// The address vector of `ibv_ah_attr` for RoCEv2: the GRH part matters.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct AddressVector {
    /// Destination GID (`grh.dgid`): the peer's IP address.
    pub dgid: Gid,
    /// Index of the source GID in the port's GID table (`grh.sgid_index`).
    pub sgid_index: u8,
    /// IP TTL / hop limit (`grh.hop_limit`).
    pub hop_limit: u8,
    /// IP traffic class, DSCP and ECN (`grh.traffic_class`).
    pub traffic_class: u8,
    /// IPv6 flow label, 20 bits (`grh.flow_label`).
    pub flow_label: u32,
    /// Service level (`sl`).
    pub sl: u8,
    /// Physical port number, from 1 (`port_num`).
    pub port_num: u8,
    /// Whether the GRH fields are valid (`is_global`).
    pub is_global: bool,
}

/// Destination of a UD send (`wr.ud`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct UdDest {
    /// The address handle's attributes (`wr.ud.ah`).
    pub av: AddressVector,
    /// Destination QP number (`wr.ud.remote_qpn`).
    pub remote_qpn: u32,
    /// Q_Key put in the DETH (`wr.ud.remote_qkey`).
    pub remote_qkey: u32,
}

/// A work request's scatter/gather list: up to two entries live inside the
/// request, so that the common one-SGE post allocates nothing. Build one
/// with [`sgl!`](crate::sgl), `collect()` or `SgList::new()`.
pub type SgList = smallvec::SmallVec<[Sge; 2]>;

/// A send work request. `imm_data` holds the immediate or, for SEND_WITH_INV
/// and LOCAL_INV, the rkey to invalidate.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SendWr {
    /// The application's identifier, returned in the work completion.
    pub wr_id: u64,
    /// The operation.
    pub opcode: WrOpcode,
    /// `IBV_SEND_*` flags (SIGNALED, FENCE, SOLICITED, INLINE, …).
    pub flags: SendFlags,
    /// Local memory: the data to send or write, or where READ and atomic
    /// results land.
    pub sg_list: SgList,
    /// Immediate data in host byte order, or the rkey to invalidate.
    pub imm_data: u32,
    /// Remote virtual address of RDMA and atomic operations
    /// (`wr.rdma.remote_addr`, `wr.atomic.remote_addr`).
    pub remote_addr: u64,
    /// Remote key for `remote_addr` (`wr.rdma.rkey`, `wr.atomic.rkey`).
    pub rkey: u32,
    /// Compare operand of CMP_AND_SWP, addend of FETCH_AND_ADD.
    pub compare_add: u64,
    /// Swap operand of CMP_AND_SWP.
    pub swap: u64,
    /// UD: the destination; `None` on connected QPs.
    pub ud: Option<UdDest>,
    /// XRC_SEND: the SRQ number at the target (`wr.qp_type.xrc.remote_srqn`).
    pub remote_srqn: u32,
    /// The message itself, for IBV_SEND_INLINE: copied at post time, so the
    /// SGEs' memory and keys are not used.
    pub inline: Option<Vec<u8>>,
    /// BIND_MW: the window, its new key, the region and the range.
    pub bind: Option<Box<crate::mem::BindRequest>>,
    /// UMR: the indirect key and the layout to give it.
    pub umr: Option<Box<Umr>>,
}

/// A UMR work request's payload.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Umr {
    /// The indirect key to set.
    pub key: u32,
    /// Its new layout.
    pub layout: crate::mem::Layout,
}

impl SendWr {
    /// A signaled request with no SGEs and every operand 0 or `None`.
    pub fn new(wr_id: u64, opcode: WrOpcode) -> SendWr {
        SendWr {
            wr_id,
            opcode,
            flags: SendFlags::SIGNALED,
            sg_list: SgList::new(),
            imm_data: 0,
            remote_addr: 0,
            rkey: 0,
            compare_add: 0,
            swap: 0,
            ud: None,
            remote_srqn: 0,
            inline: None,
            bind: None,
            umr: None,
        }
    }
}

/// A receive work request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RecvWr {
    /// The application's identifier, returned in the work completion.
    pub wr_id: u64,
    /// Where the incoming message is scattered.
    pub sg_list: SgList,
}

/// `struct ibv_qp_cap`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct QpCap {
    /// Most outstanding work requests in the send queue.
    pub max_send_wr: u32,
    /// Most outstanding work requests in the receive queue.
    pub max_recv_wr: u32,
    /// Most SGEs per send work request.
    pub max_send_sge: u32,
    /// Most SGEs per receive work request.
    pub max_recv_sge: u32,
    /// Most bytes a send work request may carry inline.
    pub max_inline_data: u32,
}

/// The attribute values of `ibv_modify_qp`; which ones apply is said by a
/// [`crate::ib::QpAttrMask`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QpAttr {
    /// The state to move to (modify) or the current state (query).
    pub qp_state: QpState,
    /// The state the caller assumes the QP is in (`IBV_QP_CUR_STATE`).
    pub cur_qp_state: QpState,
    /// Path MTU: the largest payload of one packet.
    pub path_mtu: Mtu,
    /// Q_Key of a UD QP.
    pub qkey: u32,
    /// Receive queue PSN: the first PSN expected (24 bits).
    pub rq_psn: u32,
    /// Send queue PSN: the PSN of the first packet sent (24 bits).
    pub sq_psn: u32,
    /// The remote QP number of a connected QP.
    pub dest_qp_num: u32,
    /// Remote operations the QP accepts as responder (REMOTE_WRITE,
    /// REMOTE_READ, REMOTE_ATOMIC).
    pub qp_access_flags: Access,
    /// The queues' sizes.
    pub cap: QpCap,
    /// The primary path to the remote QP of a connected QP.
    pub ah_attr: AddressVector,
    /// Index of the P_Key in the port's table.
    pub pkey_index: u16,
    /// Whether to raise `IBV_EVENT_SQ_DRAINED` when the QP in SQD has
    /// drained its send queue.
    pub en_sqd_async_notify: bool,
    /// Query: whether the QP in SQD is still draining its send queue.
    pub sq_draining: bool,
    /// Most outstanding RDMA READs and atomics this QP sends as initiator.
    pub max_rd_atomic: u8,
    /// Most outstanding RDMA READs and atomics this QP serves as responder.
    pub max_dest_rd_atomic: u8,
    /// RNR NAK timer code (IBA table 45) this QP's RNR NAKs ask the
    /// requester to wait.
    pub min_rnr_timer: u8,
    /// Physical port number, from 1.
    pub port_num: u8,
    /// Local ACK timeout, 4.096 µs × 2^`timeout`; 0 waits forever.
    pub timeout: u8,
    /// Retransmissions after a timeout or sequence NAK before the QP fails
    /// (3 bits).
    pub retry_cnt: u8,
    /// Retries after an RNR NAK before the QP fails (3 bits; 7 retries
    /// forever).
    pub rnr_retry: u8,
}

impl Default for QpAttr {
    fn default() -> Self {
        QpAttr {
            qp_state: QpState::Reset,
            cur_qp_state: QpState::Reset,
            path_mtu: Mtu::Mtu256,
            qkey: 0,
            rq_psn: 0,
            sq_psn: 0,
            dest_qp_num: 0,
            qp_access_flags: Access::empty(),
            cap: QpCap::default(),
            ah_attr: AddressVector::default(),
            pkey_index: 0,
            en_sqd_async_notify: false,
            sq_draining: false,
            max_rd_atomic: 0,
            max_dest_rd_atomic: 0,
            min_rnr_timer: 0,
            port_num: 1,
            timeout: 0,
            retry_cnt: 0,
            rnr_retry: 0,
        }
    }
}
