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
pub use crate::mem::{InterleavedEntry, Layout, MwType};
pub use crate::proto::wr::{AddressVector, QpAttr, QpCap, QueueLimits, RecvWr, SendWr, SgList, UdDest, WrOpcode};
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
