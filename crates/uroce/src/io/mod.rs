//! Everything that touches the operating system's network: the UDP socket of
//! a device, the progress thread that feeds received datagrams and timer
//! expiries to the sans-IO [`crate::proto::Engine`], and packet capture.
//!
//! A [`Runtime`] owns one engine behind a mutex. Application threads post work
//! through [`Runtime::pump`], which runs the engine and sends what it produced
//! in the caller's thread (lowest latency); the progress thread does the same
//! for received packets and timers, so the device makes progress without the
//! application calling in. A single transmit lock keeps each QP's packets in
//! order on the wire.

pub mod capture;
pub mod faults;
pub mod link;
pub mod netdev;
mod runtime;
mod socket;

pub use capture::Capture;
pub use runtime::{EventSink, Runtime, RuntimeConfig};
pub use socket::{set_udp_segment, RoceSocket, SegmentControl};
