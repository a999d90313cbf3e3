//! What the CM part of the library holds, below every file that works with
//! it: the devices' CM agents ([`Dev`]), the ids' public structs ([`UId`])
//! and private state ([`IdState`]), and the one lock over all of it.

use crate::ffi::cma::*;
use crate::ffi::*;
use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::{Arc, Condvar, LazyLock, Mutex, MutexGuard};
use uroce::cm::{CmEndpoint, ConnId, ListenId};
use uroce::lock_order::{Held, Ordered, Rank};

/// All CM state of the process: one lock (then an agent's lock inside it;
/// a channel's queue lock is taken last), first in the lock order
/// (`uroce::lock_order`, checked in debug builds).
pub(crate) static STATE: LazyLock<Ordered<Mutex<Global>>> =
    LazyLock::new(|| Ordered::new(Rank::RdmacmState, Mutex::new(Global::new())));
/// Signalled when an event is acked (destroy and migrate wait for it).
pub(crate) static ACKED: Condvar = Condvar::new();

pub(crate) fn lock() -> Held<MutexGuard<'static, Global>> {
    STATE.lock_unpoisoned()
}

pub struct Dev {
    pub ip: IpAddr,
    /// The `ibv_context` and `ibv_pd` of the device (never closed: ids may
    /// point to them until the process ends).
    pub ctx: usize,
    pub pd: usize,
    pub ep: Arc<CmEndpoint>,
    /// The XRC domain of the device's XRC_RECV ids and their SRQs, opened
    /// on first use and never closed (librdmacm's `ucma_get_xrcd`); 0 until
    /// then.
    pub xrcd: usize,
}

pub struct Global {
    pub devs: Vec<Dev>,
    /// Live ids by their `UId` address.
    pub ids: HashMap<usize, IdState>,
    pub by_conn: HashMap<(usize, ConnId), usize>,
    pub by_listen: HashMap<(usize, ListenId), usize>,
    pub next_serial: u64,
}

impl Global {
    pub fn new() -> Global {
        Global {
            devs: Vec::new(),
            ids: HashMap::new(),
            by_conn: HashMap::new(),
            by_listen: HashMap::new(),
            next_serial: 1,
        }
    }
}

/// `rdma_create_ep`'s QP attributes, kept for `rdma_get_request`.
#[derive(Clone, Copy)]
pub struct EpAttr(pub ibv_qp_init_attr);
// SAFETY: plain values and the application's object pointers, only used
// under the state lock and given back to the verbs calls.
unsafe impl Send for EpAttr {}

#[repr(C)]
pub struct UId {
    pub id: rdma_cm_id,
    /// The one path record `route.path_rec` points to.
    pub path: ibv_sa_path_rec,
}

/// What the library knows of an id besides its public part.
#[derive(Default)]
pub struct IdState {
    pub serial: u64,
    /// Events read by the application and not yet acked.
    pub unacked: u32,
    pub dev: Option<usize>,
    pub conn: Option<ConnId>,
    pub listen: Option<ListenId>,
    /// A private channel: calls wait for their event.
    pub sync: bool,
    /// The library reported CONNECT_ERROR: later REJECTED/DISCONNECTED dropped.
    pub conn_error: bool,
    /// CQs and channels `rdma_create_qp` made (destroyed with the QP).
    pub own_cqs: bool,
    /// `rdma_create_ep`'s QP attributes, for the ids `rdma_get_request` returns.
    pub ep_attr: Option<EpAttr>,
    pub reuse: bool,
    pub tos: u8,
    /// RDMA_OPTION_ID_ACK_TIMEOUT: the QP's local ACK timeout at RTS
    /// instead of the path's (`rdma_set_ack_timeout`).
    pub ack_timeout: Option<u8>,
}
