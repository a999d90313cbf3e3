//! What `ibv_query_device` and `ibv_query_port` report for a uroce device.

use crate::ib::Mtu;
use crate::proto::qp::{MAX_INLINE, MAX_QP_WR, MAX_SGE};

/// Largest CQ: mlx5's (ConnectX) 2^22 - 1 rather than rxe's 32767. A uroce
/// CQ is memory that grows with the completions it holds, not a ring sized
/// up front, so a large CQ costs nothing until it fills; libfabric's
/// ofi_rxm sizes its CQ (384 + 384) × 256 = 196608 by default.
pub const MAX_CQE: u32 = 4_194_303;

/// The most RDMA READ and atomic requests a QP may have outstanding as
/// requester (`max_qp_init_rd_atom`) and accept as responder
/// (`max_qp_rd_atom`), as rxe's.
pub const MAX_RD_ATOM: u32 = 128;

/// `struct ibv_device_attr` (the fields uroce fills).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceAttr {
    /// Firmware version string: `uroce` and the crate version.
    pub fw_ver: String,
    /// Node GUID.
    pub node_guid: u64,
    /// System image GUID (the node GUID).
    pub sys_image_guid: u64,
    /// Largest region that can be registered, in bytes.
    pub max_mr_size: u64,
    /// Supported page sizes, a bit per power of two.
    pub page_size_cap: u64,
    /// IEEE vendor ID.
    pub vendor_id: u32,
    /// Vendor part ID.
    pub vendor_part_id: u32,
    /// Hardware version.
    pub hw_ver: u32,
    /// Most QPs.
    pub max_qp: u32,
    /// Most outstanding work requests on one work queue.
    pub max_qp_wr: u32,
    /// `IBV_DEVICE_*` capability bits (see [`cap`]).
    pub device_cap_flags: u32,
    /// `ibv_device_attr_ex.device_cap_flags_ex`: the 32 bits above and the
    /// extended ones (`IB_UVERBS_DEVICE_*`).
    pub device_cap_flags_ex: u64,
    /// Most SGEs per work request.
    pub max_sge: u32,
    /// Most SGEs per work request of an RD QP (`max_sge_rd`).
    pub max_sge_rd: u32,
    /// Most CQs.
    pub max_cq: u32,
    /// Most entries of one CQ.
    pub max_cqe: u32,
    /// Most memory regions.
    pub max_mr: u32,
    /// Most protection domains.
    pub max_pd: u32,
    /// Most outstanding RDMA READs and atomics one QP serves as responder.
    pub max_qp_rd_atom: u32,
    /// Most outstanding RDMA READs and atomics the device serves as
    /// responder, all QPs together.
    pub max_res_rd_atom: u32,
    /// Most outstanding RDMA READs and atomics one QP initiates.
    pub max_qp_init_rd_atom: u32,
    /// `enum ibv_atomic_cap`: 1 = IBV_ATOMIC_HCA.
    pub atomic_cap: u32,
    /// Most memory windows.
    pub max_mw: u32,
    /// Most address handles.
    pub max_ah: u32,
    /// Most SRQs.
    pub max_srq: u32,
    /// Most outstanding work requests in one SRQ.
    pub max_srq_wr: u32,
    /// Most SGEs per SRQ work request.
    pub max_srq_sge: u32,
    /// Entries of the P_Key table.
    pub max_pkeys: u16,
    /// Local CA ACK delay, 4.096 µs × 2^`local_ca_ack_delay`.
    pub local_ca_ack_delay: u8,
    /// Number of physical ports.
    pub phys_port_cnt: u8,
    /// Most bytes a send work request may carry inline (not a field of
    /// `ibv_device_attr`).
    pub max_inline_data: u32,
}

/// `IBV_DEVICE_*` capability bits uroce has.
pub mod cap {
    /// `IBV_DEVICE_BAD_PKEY_CNTR`: packets with a bad P_Key are counted.
    pub const BAD_PKEY_CNTR: u32 = 1 << 1;
    /// `IBV_DEVICE_SYS_IMAGE_GUID`: `sys_image_guid` is set.
    pub const SYS_IMAGE_GUID: u32 = 1 << 11;
    /// `IBV_DEVICE_RC_RNR_NAK_GEN`: RC QPs send RNR NAKs.
    pub const RC_RNR_NAK_GEN: u32 = 1 << 12;
    /// `IBV_DEVICE_N_NOTIFY_CQ`.
    pub const N_NOTIFY_CQ: u32 = 1 << 14;
    /// `IBV_DEVICE_PORT_ACTIVE_EVENT`: the device raises
    /// `IBV_EVENT_PORT_ACTIVE`.
    pub const PORT_ACTIVE_EVENT: u32 = 1 << 10;
    /// `IBV_DEVICE_MEM_WINDOW`: memory windows.
    pub const MEM_WINDOW: u32 = 1 << 17;
    /// `IBV_DEVICE_XRC`: the XRC transport.
    pub const XRC: u32 = 1 << 20;
    /// `IBV_DEVICE_MEM_MGT_EXTENSIONS`: the memory management extensions
    /// (local invalidate, SEND with invalidate, type 2 windows).
    pub const MEM_MGT_EXTENSIONS: u32 = 1 << 21;
    /// `IBV_DEVICE_MEM_WINDOW_TYPE_2B`: type 2B memory windows.
    pub const MEM_WINDOW_TYPE_2B: u32 = 1 << 24;
    /// `IB_UVERBS_DEVICE_ATOMIC_WRITE` (extended flags only).
    pub const ATOMIC_WRITE: u64 = 1 << 40;
}

impl DeviceAttr {
    pub(crate) fn for_device(guid: u64) -> DeviceAttr {
        let device_cap_flags = cap::BAD_PKEY_CNTR
            | cap::SYS_IMAGE_GUID
            | cap::RC_RNR_NAK_GEN
            | cap::N_NOTIFY_CQ
            | cap::PORT_ACTIVE_EVENT
            | cap::MEM_WINDOW
            | cap::XRC
            | cap::MEM_MGT_EXTENSIONS
            | cap::MEM_WINDOW_TYPE_2B;
        DeviceAttr {
            fw_ver: concat!("uroce ", env!("CARGO_PKG_VERSION")).to_string(),
            node_guid: guid,
            sys_image_guid: guid,
            max_mr_size: u64::MAX,
            page_size_cap: 0xffff_f000,
            // Linux rxe's vendor id: non-zero (consumers check it) and claimed by
            // no hardware provider (mlx5dv and efadv gate on theirs).
            vendor_id: 0xFF_FFFF,
            vendor_part_id: 0,
            hw_ver: 0,
            max_qp: 0x10000,
            max_qp_wr: MAX_QP_WR,
            device_cap_flags,
            device_cap_flags_ex: device_cap_flags as u64 | cap::ATOMIC_WRITE,
            max_sge: MAX_SGE,
            max_sge_rd: MAX_SGE,
            max_cq: 0x10000,
            max_cqe: MAX_CQE,
            max_mr: 0x40000,
            max_pd: 0x10000,
            max_qp_rd_atom: MAX_RD_ATOM,
            max_res_rd_atom: MAX_RD_ATOM * 0x10000,
            max_qp_init_rd_atom: MAX_RD_ATOM,
            atomic_cap: 1,
            max_mw: 0x10000,
            max_ah: 0x8000,
            max_srq: 0x4000,
            max_srq_wr: MAX_QP_WR,
            max_srq_sge: MAX_SGE,
            max_pkeys: 1,
            local_ca_ack_delay: 15,
            phys_port_cnt: 1,
            max_inline_data: MAX_INLINE,
        }
    }
}

/// `struct ibv_port_attr` (the fields that vary).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PortAttr {
    /// `enum ibv_port_state`: 4 = ACTIVE.
    pub state: u32,
    /// Largest MTU the port supports.
    pub max_mtu: Mtu,
    /// The MTU in use (the device's configured MTU).
    pub active_mtu: Mtu,
    /// Entries of the GID table.
    pub gid_tbl_len: u32,
    /// `IBV_PORT_*` capability bits.
    pub port_cap_flags: u32,
    /// Largest message, in bytes.
    pub max_msg_sz: u32,
    /// Entries of the P_Key table.
    pub pkey_tbl_len: u16,
    /// Link width code (`IBV_WIDTH_*`; 2 = 4X). Nominal: uroce has no link.
    pub active_width: u8,
    /// Link speed code (`IBV_SPEED_*`). Nominal: uroce has no link.
    pub active_speed: u8,
    /// `IBV_LINK_LAYER_ETHERNET` = 2.
    pub link_layer: u8,
    /// 5 = LinkUp.
    pub phys_state: u8,
}
