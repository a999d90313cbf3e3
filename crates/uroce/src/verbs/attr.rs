//! What `ibv_query_device` and `ibv_query_port` report for a uroce device.

use crate::ib::Mtu;
use crate::proto::qp::{MAX_INLINE, MAX_QP_WR, MAX_SGE};

/// `struct ibv_device_attr` (the fields uroce fills).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceAttr {
    pub fw_ver: String,
    pub node_guid: u64,
    pub sys_image_guid: u64,
    pub max_mr_size: u64,
    pub page_size_cap: u64,
    pub vendor_id: u32,
    pub vendor_part_id: u32,
    pub hw_ver: u32,
    pub max_qp: u32,
    pub max_qp_wr: u32,
    pub device_cap_flags: u32,
    /// `ibv_device_attr_ex.device_cap_flags_ex`: the 32 bits above and the
    /// extended ones (`IB_UVERBS_DEVICE_*`).
    pub device_cap_flags_ex: u64,
    pub max_sge: u32,
    pub max_sge_rd: u32,
    pub max_cq: u32,
    pub max_cqe: u32,
    pub max_mr: u32,
    pub max_pd: u32,
    pub max_qp_rd_atom: u32,
    pub max_res_rd_atom: u32,
    pub max_qp_init_rd_atom: u32,
    /// `enum ibv_atomic_cap`: 1 = IBV_ATOMIC_HCA.
    pub atomic_cap: u32,
    pub max_mw: u32,
    pub max_ah: u32,
    pub max_srq: u32,
    pub max_srq_wr: u32,
    pub max_srq_sge: u32,
    pub max_pkeys: u16,
    pub local_ca_ack_delay: u8,
    pub phys_port_cnt: u8,
    pub max_inline_data: u32,
}

/// `IBV_DEVICE_*` capability bits uroce has.
pub mod cap {
    pub const BAD_PKEY_CNTR: u32 = 1 << 1;
    pub const SYS_IMAGE_GUID: u32 = 1 << 11;
    pub const RC_RNR_NAK_GEN: u32 = 1 << 12;
    pub const N_NOTIFY_CQ: u32 = 1 << 14;
    pub const PORT_ACTIVE_EVENT: u32 = 1 << 10;
    pub const MEM_WINDOW: u32 = 1 << 17;
    pub const XRC: u32 = 1 << 20;
    pub const MEM_MGT_EXTENSIONS: u32 = 1 << 21;
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
            max_cqe: crate::verbs::cq::MAX_CQE,
            max_mr: 0x40000,
            max_pd: 0x10000,
            max_qp_rd_atom: 128,
            max_res_rd_atom: 128 * 0x10000,
            max_qp_init_rd_atom: 128,
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
    pub max_mtu: Mtu,
    pub active_mtu: Mtu,
    pub gid_tbl_len: u32,
    pub port_cap_flags: u32,
    pub max_msg_sz: u32,
    pub pkey_tbl_len: u16,
    pub active_width: u8,
    pub active_speed: u8,
    /// `IBV_LINK_LAYER_ETHERNET` = 2.
    pub link_layer: u8,
    /// 5 = LinkUp.
    pub phys_state: u8,
}
