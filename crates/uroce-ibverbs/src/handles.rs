//! What each C object of this library is in memory, and nothing more: the
//! `#[repr(C)]` structs whose first field is the C object an application
//! holds (`ibv_context`, `ibv_pd`, `ibv_qp_ex`, …), and the state they
//! embed. A C pointer converts back with a cast. Like the kernel rxe's
//! `rxe_verbs.h`, this file sits below every file that works with the objects; their functions
//! (and the methods of these types) live with the verbs that use them.
//! Device memory's struct is in `dm_memory.rs`, beside the allocation it
//! owns.

use crate::dm_memory::DmRef;
use crate::ffi::*;
use std::collections::{HashMap, HashSet};
use std::ffi::{c_int, c_void};
use std::os::fd::OwnedFd;
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};
use uroce::ib::Wc;
use uroce::verbs::{
    AddressHandle, AddressVector, CompletionChannel, CompletionQueue, Context, DeviceConfig, IndirectKey, MemoryRegion,
    MemoryWindow, ProtectionDomain, QueuePair, SendWr, SharedReceiveQueue, Xrcd,
};

/// An `ibv_device` followed by its configuration.
#[repr(C)]
pub struct UDevice {
    pub dev: ibv_device,
    pub cfg: DeviceConfig,
}

/// An `ibv_context` embedded in a `verbs_context`, followed by uroce's part.
#[repr(C)]
pub struct UContext {
    pub vctx: verbs_context,
    pub ctx: Context,
    /// CQ handle → `ibv_cq` pointer, for completion channel events.
    pub cqs: Mutex<HashMap<u32, usize>>,
    /// QP number → `ibv_qp` pointer, for asynchronous events.
    pub qps: Mutex<HashMap<u32, usize>>,
    /// SRQ handle → `ibv_srq` pointer, for asynchronous events.
    pub srqs: Mutex<HashMap<u32, usize>>,
    /// Completion events delivered per CQ (by its pointer), not yet waited
    /// for by its destruction.
    pub comp_reported: Mutex<HashMap<usize, u32>>,
    /// Address handles (their `UAh`s), released by `ibv_close_device`.
    pub ahs: Mutex<HashSet<usize>>,
    /// Memory windows (their `UMw`s), likewise.
    pub mws: Mutex<HashSet<usize>>,
    /// Asynchronous events delivered per object (by its pointer), not yet
    /// waited for by its destruction (`events.rs`).
    pub events_reported: Mutex<HashMap<usize, u32>>,
    /// The `cmd_fd` and the objects shared with imported contexts (`import.rs`).
    pub share: Share,
}

impl UContext {
    /// The `UContext` of an `ibv_context` this library returned.
    pub unsafe fn from_ctx<'a>(ctx: *mut ibv_context) -> &'a UContext {
        let off = std::mem::offset_of!(verbs_context, context);
        // SAFETY: every ibv_context we hand out is the `context` field of the
        // `vctx` field (at offset 0) of a live UContext.
        unsafe { &*((ctx as *mut u8).sub(off) as *const UContext) }
    }
}

/// An `ibv_pd` (or a parent domain's) followed by uroce's PD.
#[repr(C)]
pub struct UPd {
    pub pd: ibv_pd,
    pub inner: Option<ProtectionDomain>,
    /// A parent domain: it stands for its parent PD and frees without EBUSY.
    pub parent_domain: bool,
}

/// An `ibv_mr` followed by the region it names.
#[repr(C)]
pub struct UMr {
    pub mr: ibv_mr,
    pub inner: Option<MemoryRegion>,
    /// For a device-memory region: keeps the allocation busy.
    pub dm: Option<DmRef>,
}

/// An `ibv_comp_channel` followed by uroce's channel.
#[repr(C)]
pub struct UChannel {
    pub ch: ibv_comp_channel,
    pub inner: Option<CompletionChannel>,
}

/// An `ibv_cq_ex` followed by uroce's CQ.
#[repr(C)]
pub struct UCq {
    /// An `ibv_cq_ex`, whose first part is the `ibv_cq` (`ibv_cq_ex_to_cq`
    /// is a cast); its polling functions are set by `ibv_create_cq_ex`.
    pub cq: ibv_cq_ex,
    pub inner: Option<CompletionQueue>,
    /// The completion `start_poll`/`next_poll` took (`cq_ex.rs`).
    pub cur: Current,
}

/// An `ibv_qp_ex` followed by uroce's QP and its builders' state.
#[repr(C)]
pub struct UQp {
    pub qp: ibv_qp_ex,
    pub inner: Option<QueuePair>,
    /// The work requests of the `ibv_wr_*` builders since `wr_start` (`qp_ex.rs`).
    pub batch: Batch,
    /// `struct mlx5dv_qp_ex` of this QP, made by `mlx5dv_create_qp` (`mlx5dv/`).
    pub mlx5: OnceLock<Box<DvQp>>,
}

/// An address handle: `ibv_ah` followed by uroce's.
#[repr(C)]
pub struct UAh {
    pub ah: ibv_ah,
    /// The address (read by every UD post).
    pub av: AddressVector,
    /// The handle, which keeps its PD; None once `ibv_close_device`
    /// released what the context owned.
    pub inner: Option<AddressHandle>,
}

/// An `ibv_srq` followed by uroce's SRQ.
#[repr(C)]
pub struct USrq {
    pub srq: ibv_srq,
    pub inner: Option<SharedReceiveQueue>,
}

/// An `ibv_xrcd` followed by uroce's XRC domain.
#[repr(C)]
pub struct UXrcd {
    pub xrcd: ibv_xrcd,
    pub inner: Option<Xrcd>,
}

impl UXrcd {
    /// The domain handle of an `ibv_xrcd` of this library (NULL: None).
    pub unsafe fn from_ptr<'a>(xrcd: *mut ibv_xrcd) -> Option<&'a Xrcd> {
        // SAFETY: every ibv_xrcd we hand out is the first field of a UXrcd.
        unsafe { (xrcd as *const UXrcd).as_ref() }?.inner.as_ref()
    }
}

/// An `ibv_mw` followed by uroce's window.
#[repr(C)]
pub struct UMw {
    pub mw: ibv_mw,
    /// None once `ibv_close_device` released what the context owned.
    pub inner: Option<MemoryWindow>,
}

/// The completion the last `start_poll`/`next_poll` took.
#[derive(Default)]
pub struct Current(Mutex<Option<Wc>>);

impl Current {
    pub(crate) fn set(&self, wc: Option<Wc>) {
        *self.0.lock().unwrap_or_else(|e| e.into_inner()) = wc;
    }

    pub(crate) fn get(&self) -> Option<Wc> {
        *self.0.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// The work requests built since `wr_start`, and the first error.
#[derive(Default)]
pub struct Batch(Mutex<Pending>);

impl Batch {
    pub(crate) fn lock(&self) -> MutexGuard<'_, Pending> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }
}

#[derive(Default)]
pub(crate) struct Pending {
    pub(crate) wrs: Vec<SendWr>,
    pub(crate) err: c_int,
}

/// The first argument of every `mlx5dv_qp_ex` builder.
pub(crate) type Mqp = *mut Mlx5dvQpEx;

/// `struct mlx5dv_qp_ex` of rdma-core 44. No pointer is NULL: builders of
/// operations the QP was not created with (`send_ops_flags`) and those
/// uroce lacks (DC addresses, signature, raw WQEs, memcpy, crypto) latch
/// EOPNOTSUPP, returned by `ibv_wr_complete` (an mlx5 QP would call NULL).
#[repr(C)]
pub struct Mlx5dvQpEx {
    pub comp_mask: u64,
    pub wr_set_dc_addr: *const c_void,
    pub wr_mr_interleaved: Option<unsafe extern "C" fn(Mqp, *mut UMkey, u32, u32, u16, *const UroceMrInterleaved)>,
    pub wr_mr_list: Option<unsafe extern "C" fn(Mqp, *mut UMkey, u32, u16, *const ibv_sge)>,
    pub wr_mkey_configure: Option<unsafe extern "C" fn(Mqp, *mut UMkey, u8, *const MkeyConfAttr)>,
    pub wr_set_mkey_access_flags: Option<unsafe extern "C" fn(Mqp, u32)>,
    pub wr_set_mkey_layout_list: Option<unsafe extern "C" fn(Mqp, u16, *const ibv_sge)>,
    pub wr_set_mkey_layout_interleaved: Option<unsafe extern "C" fn(Mqp, u32, u16, *const UroceMrInterleaved)>,
    pub wr_set_mkey_sig_block: *const c_void,
    pub wr_raw_wqe: *const c_void,
    pub wr_set_dc_addr_stream: *const c_void,
    pub wr_memcpy: *const c_void,
    pub wr_set_mkey_crypto: *const c_void,
}

/// `struct mlx5dv_mkey_conf_attr`.
#[repr(C)]
pub struct MkeyConfAttr {
    pub conf_flags: u32,
    pub comp_mask: u64,
}

/// An mkey configuration in progress (`wr_mkey_configure` until its last setter).
pub(crate) struct Conf {
    pub(crate) key: u32,
    pub(crate) max_entries: u32,
    pub(crate) remaining: u8,
    pub(crate) access_set: bool,
    pub(crate) layout_set: bool,
}

/// The `struct mlx5dv_qp_ex` of a QP (first, for the callbacks' cast), its
/// QP, and the configuration in progress.
#[repr(C)]
pub struct DvQp {
    pub dv: Mlx5dvQpEx,
    pub(crate) qp: *mut ibv_qp_ex,
    /// The `MLX5DV_QP_EX_WITH_*` the QP was created with.
    pub(crate) ops: u64,
    pub(crate) conf: Mutex<Option<Conf>>,
}

// SAFETY: `qp` names the QP that owns this struct; the callbacks take the
// batch's lock before touching the QP's state.
unsafe impl Send for DvQp {}

// SAFETY: as above.
unsafe impl Sync for DvQp {}

/// `struct uroce_mkey` of uroce.h: the C view first, then the key.
#[repr(C)]
pub struct UMkey {
    pub lkey: u32,
    pub rkey: u32,
    pub max_entries: u32,
    pub(crate) key: IndirectKey,
}

/// `struct uroce_mr_interleaved` (= `struct mlx5dv_mr_interleaved`).
#[repr(C)]
#[derive(Clone, Copy)]
pub struct UroceMrInterleaved {
    pub addr: u64,
    pub bytes_count: u32,
    pub bytes_skip: u32,
    pub lkey: u32,
}

/// What a kernel keeps in an open uverbs file: the device, and (through the
/// table) the objects created through the contexts that share it.
pub struct ContextFile {
    pub(crate) id: u64,
    /// `st_dev`, `st_ino` of the memfd.
    pub(crate) key: (u64, u64),
    /// The `ibv_device` (a leaked `UDevice`).
    pub(crate) device: usize,
    pub(crate) ctx: Context,
}

/// A context's part: its file, and the `cmd_fd` it closes.
pub struct Share {
    // Dropped before `cmd_fd`: the memfd's inode (the file's key) outlives
    // the file's entry in the table.
    pub(crate) file: Arc<ContextFile>,
    pub(crate) cmd_fd: OwnedFd,
}
