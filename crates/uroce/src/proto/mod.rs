//! The sans-IO transport. An [`Engine`] holds the queue pairs of one device
//! and is driven from outside: datagrams and a `now` go in
//! ([`Engine::handle_datagram`], [`Engine::handle_timeout`]), and packets,
//! timer deadlines and events come out ([`Engine::poll_transmit`],
//! [`Engine::poll_timeout`], [`Engine::poll_event`]). It owns no socket,
//! clock, thread or random source, so a simulated fabric can drive it
//! deterministically.
//!
//! Each queue pair is one [`qp::Qp`]; its three state machines live in
//! sibling files as `impl Qp` blocks: [`requester`] turns send WQEs into
//! request packets and retransmits (go-back-N), [`completer`] consumes
//! ACKs, NAKs and responses and completes send WQEs, [`responder`] executes
//! incoming requests and produces ACKs and responses, holding an ACK
//! briefly for the application's answer ([`ack`]: a timer like the
//! requester's).
//!
//! Memory is reached only through [`MemoryAccess`] ([`memory`]): key checks,
//! copies, atomics, window binds and invalidations, UMRs. The device gives
//! the engine its `mem::Memory`; a simulation may give it a wrapper that
//! injects faults. A payload sent in place leaves in a [`Transmit`] as a
//! [`PayloadHold`] (raw bytes and the token that keeps them registered), so
//! the I/O layer below sees no memory type.

mod ack;
pub(crate) mod budget;
pub mod completer;
mod config;
pub mod copy;
pub mod cq;
mod ctx;
pub mod gsi;
mod engine;
mod event;
pub mod qpn;
pub mod memory;
pub mod presence;
pub mod psn;
pub mod qp;
pub mod requester;
mod requester_state;
pub mod responder;
mod responder_state;
pub mod rx_ids;
pub mod srq;
mod stats;
mod transmit;
pub mod wr;

#[cfg(feature = "unstable")]
pub use ack::{ack_hold_limit, ACK_HOLD_CAP, ACK_HOLD_FRACTION};
pub use config::EngineConfig;
pub(crate) use ctx::Ctx;
pub use engine::{check_datagram, dest_qpn, first_qpn, qpn_after, Engine, QpSummary, Received};
pub use event::{AsyncEvent, Event, EventElement};
pub use transmit::{AfterSend, Transmit};
#[cfg(feature = "unstable")]
pub use transmit::{InPlace, IN_PLACE_MIN};
#[cfg(feature = "unstable")]
pub use srq::XrcSrqs;
pub use copy::CopyJob;
pub use memory::MemoryAccess;
#[cfg(feature = "unstable")]
pub use memory::PayloadHold;
pub use rx_ids::RxIds;
#[cfg(feature = "unstable")]
pub use rx_ids::IcrcCheck;
pub use stats::Stats;
