//! Everything that touches the operating system's network: the media that
//! carry a device's packets ([`medium`]: UDP, `udp`, over the device's
//! socket, and the same-host memory [`link`]), the progress thread that
//! feeds received packets and timer expiries to the sans-IO
//! [`crate::proto::Engine`], and packet capture.
//!
//! A [`Runtime`] spreads a device's QPs over engine shards by QP number, each
//! behind its own locks. Application threads post work through
//! [`Runtime::pump`], which runs the QP's shard and sends what it produced in
//! the caller's thread (lowest latency); the progress thread does the same
//! for received packets and timers, so the device makes progress without the
//! application calling in. A shard's send lock keeps each QP's packets in
//! order on the wire; QPs of other shards do not wait for it.

pub mod capture;
mod copier;
pub mod faults;
pub mod link;
pub mod medium;
pub mod netdev;
mod runtime;
mod shard;
mod socket;
mod udp;

pub use capture::Capture;
pub use runtime::{EventSink, Runtime, RuntimeConfig};
pub use socket::RoceSocket;
#[cfg(feature = "unstable")]
pub use socket::{set_udp_segment, SegmentControl};
