//! Work requests as the application posts them, and the attributes that
//! configure a queue pair (`ibv_send_wr`, `ibv_recv_wr`, `ibv_qp_attr`, …) in
//! Rust form. These are inputs to the protocol core; they carry no behaviour.

use crate::ib::{Access, Errno, Error, Gid, Mtu, QpState, QpType, Result, SendFlags, Sge};

/// `enum ibv_wr_opcode`, as far as uroce executes it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u32)]
pub enum WrOpcode {
    RdmaWrite = 0,
    RdmaWriteImm = 1,
    Send = 2,
    SendImm = 3,
    RdmaRead = 4,
    AtomicCmpSwp = 5,
    AtomicFetchAdd = 6,
    LocalInv = 7,
    BindMw = 8,
    SendInv = 9,
    /// `IBV_WR_DRIVER1`: a UMR that sets an indirect key's layout
    /// (`mlx5dv_wr_mr_list` / `mlx5dv_wr_mr_interleaved`).
    Umr = 11,
    /// RDMA ATOMIC WRITE (IBA 1.5 A19): 8 bytes (from the SGEs or inline)
    /// written at once to 8-byte-aligned remote memory. RC only.
    AtomicWrite = 15,
}

impl WrOpcode {
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
    pub fn is_atomic(self) -> bool {
        matches!(self, WrOpcode::AtomicCmpSwp | WrOpcode::AtomicFetchAdd)
    }
    pub fn is_send(self) -> bool {
        matches!(self, WrOpcode::Send | WrOpcode::SendImm | WrOpcode::SendInv)
    }
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
    pub max_sge: u32,
    /// 0 for a receive queue.
    pub max_inline: u32,
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
    pub dgid: Gid,
    pub sgid_index: u8,
    pub hop_limit: u8,
    pub traffic_class: u8,
    pub flow_label: u32,
    pub sl: u8,
    pub port_num: u8,
    pub is_global: bool,
}

/// Destination of a UD send (`wr.ud`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct UdDest {
    pub av: AddressVector,
    pub remote_qpn: u32,
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
    pub wr_id: u64,
    pub opcode: WrOpcode,
    pub flags: SendFlags,
    pub sg_list: SgList,
    pub imm_data: u32,
    pub remote_addr: u64,
    pub rkey: u32,
    pub compare_add: u64,
    pub swap: u64,
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
    pub key: u32,
    pub layout: crate::mem::Layout,
}

impl SendWr {
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
    pub wr_id: u64,
    pub sg_list: SgList,
}

/// `struct ibv_qp_cap`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct QpCap {
    pub max_send_wr: u32,
    pub max_recv_wr: u32,
    pub max_send_sge: u32,
    pub max_recv_sge: u32,
    pub max_inline_data: u32,
}

/// The attribute values of `ibv_modify_qp`; which ones apply is said by a
/// [`crate::ib::QpAttrMask`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QpAttr {
    pub qp_state: QpState,
    pub cur_qp_state: QpState,
    pub path_mtu: Mtu,
    pub qkey: u32,
    pub rq_psn: u32,
    pub sq_psn: u32,
    pub dest_qp_num: u32,
    pub qp_access_flags: Access,
    pub cap: QpCap,
    pub ah_attr: AddressVector,
    pub pkey_index: u16,
    pub en_sqd_async_notify: bool,
    pub sq_draining: bool,
    pub max_rd_atomic: u8,
    pub max_dest_rd_atomic: u8,
    pub min_rnr_timer: u8,
    pub port_num: u8,
    pub timeout: u8,
    pub retry_cnt: u8,
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
