//! The librdmacm API (rdma-core 44, `<rdma/rdma_cma.h>`) on uroce's CM
//! agent (`uroce::cm::CmEndpoint`, QP 1 of each device). The functions are
//! exported from libibverbs.so.1 under private names (`uroce_cm_<name>`,
//! version node `UROCE_PRIVATE`); the drop-in librdmacm.so.1
//! (crates/uroce-rdmacm) exports the public names with librdmacm's symbol
//! versions and jumps here, so both drop-ins share one uroce instance.
//!
//! [`channel`] owns event channels and events, [`id`] the `rdma_cm_id`s
//! and the calls on them, [`dev`] the devices' CM agents and the thread
//! that routes their events to the ids, [`addrinfo`] `rdma_getaddrinfo`,
//! [`other`] the exports that fail cleanly (multicast, ECE), [`rsocket`]
//! rsockets (stream sockets over RDMA, rdma-core 44's protocol).

mod addrinfo;
mod channel;
mod dev;
mod id;
mod other;
mod rsocket;

use std::sync::{Condvar, LazyLock, Mutex, MutexGuard};
use uroce::lock_order::{Held, Ordered, Rank};

/// All CM state of the process: one lock (then an agent's lock inside it;
/// a channel's queue lock is taken last), first in the lock order
/// (`uroce::lock_order`, checked in debug builds).
pub(crate) static STATE: LazyLock<Ordered<Mutex<dev::Global>>> =
    LazyLock::new(|| Ordered::new(Rank::RdmacmState, Mutex::new(dev::Global::new())));
/// Signalled when an event is acked (destroy and migrate wait for it).
pub(crate) static ACKED: Condvar = Condvar::new();

pub(crate) fn lock() -> Held<MutexGuard<'static, dev::Global>> {
    STATE.lock_unpoisoned()
}
