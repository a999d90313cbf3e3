//! The safe Rust verbs API: RAII handles over one device runtime.
//!
//! ```no_run
//! use uroce::verbs::*;
//! # fn main() -> Result<(), uroce::ib::Error> {
//! let ctx = Context::open(&DeviceConfig::loopback())?;
//! let pd = ctx.alloc_pd()?;
//! let mr = pd.register(vec![0u8; 4096], Access::LOCAL_WRITE | Access::REMOTE_WRITE)?;
//! let cq = ctx.create_cq(64, None)?;
//! let qp = pd.create_qp(&QpInitAttr::rc(&cq, &cq))?;
//! # let _ = (mr, qp); Ok(()) }
//! ```
//!
//! Dropping a handle destroys the object. Objects that others depend on
//! (a PD with MRs, a CQ used by a QP) stay alive while referenced; the
//! explicit `destroy`/`dealloc` methods report EBUSY instead, as verbs do.

mod attr;
mod config;
mod context;
mod cq;
mod device;
mod mr;
mod mw;
mod pd;
/// Live statistics for `uroce stat` (internal: public with `unstable`).
#[cfg(feature = "unstable")]
pub mod publish;
#[cfg(not(feature = "unstable"))]
mod publish;
mod qp;
mod srq;
mod xrcd;

pub use crate::ib::{Access, Gid, Mtu, QpAttrMask, QpState, QpType, SendFlags, Sge, Wc, WcFlags, WcOpcode, WcStatus};
pub use crate::io::medium::{LinkMedium, PeerStats as LinkStats};
pub use crate::mem::odp::{Advice, OdpStats};
pub use crate::mem::{BindRequest, InterleavedEntry, Layout, LayoutKind, MwType};
pub use crate::proto::wr::{AddressVector, QpAttr, QpCap, QueueLimits, RecvWr, SendWr, SgList, UdDest, Umr, WrOpcode};
pub use crate::proto::{AsyncEvent, EventElement, Stats};
pub use attr::{cap, DeviceAttr, PortAttr, MAX_RD_ATOM};
pub use config::DeviceConfig;
pub use context::{CompletionChannel, Context};
pub use cq::CompletionQueue;
pub use mr::MemoryRegion;
pub use mw::MemoryWindow;
pub use pd::{AddressHandle, IndirectKey, ProtectionDomain};
pub use qp::{QpInitAttr, QueuePair};
pub use srq::SharedReceiveQueue;
pub use xrcd::Xrcd;

// Every handle may be shared between threads and sent to another, as
// libibverbs' objects may (their calls are thread-safe): checked here.
const _: () = {
    const fn send_sync<T: Send + Sync>() {}
    send_sync::<Context>();
    send_sync::<CompletionChannel>();
    send_sync::<CompletionQueue>();
    send_sync::<ProtectionDomain>();
    send_sync::<MemoryRegion>();
    send_sync::<MemoryWindow>();
    send_sync::<AddressHandle>();
    send_sync::<IndirectKey>();
    send_sync::<QueuePair>();
    send_sync::<SharedReceiveQueue>();
    send_sync::<Xrcd>();
};
