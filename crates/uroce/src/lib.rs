//! uroce: a user-space RoCEv2 RDMA device.
//!
//! Layers, from the bytes up:
//! - [`wire`]: RoCEv2 headers, the opcode table, the ICRC, pcap files.
//! - [`mem`]: protection domains, the key table, and the one interface that
//!   copies bytes in and out of registered memory.
//! - [`proto`]: the sans-IO transport (requester, responder, completer):
//!   packets and a `now` in, packets and timer deadlines out.
//! - [`io`]: UDP sockets, the progress thread and timers; the only module that
//!   touches the OS network.
//! - [`verbs`]: the safe, RAII Rust API built on all of the above.
//!
//! [`ib`] holds the verbs vocabulary (enums, flags, errno) shared by all.

/// A scatter/gather list ([`verbs::SgList`]) from its entries, as `vec!`
/// makes a `Vec`: `sgl![mr.sge(0, 64)]`, `sgl![sge; 3]`.
#[macro_export]
macro_rules! sgl {
    ($e:expr; $n:expr) => { $crate::verbs::SgList::from_elem($e, $n) };
    ($($e:expr),* $(,)?) => {{
        #[allow(unused_mut)]
        let mut list = $crate::verbs::SgList::new();
        $(list.push($e);)*
        list
    }};
}

pub mod cm;
pub mod config;
pub mod ib;
pub mod io;
pub mod mem;
pub mod proto;
pub mod runtime;
pub mod verbs;
pub mod wire;

/// The README's Rust example, compiled by `cargo test --doc`.
#[cfg(doctest)]
#[doc = include_str!("../../../README.md")]
pub struct ReadmeDoctests;
