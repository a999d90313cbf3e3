//! uroce: a user-space RoCEv2 RDMA device.
//!
//! Rust applications use [`verbs`] (the safe, RAII verbs API), [`cm`]
//! (connections through the RDMA connection manager), [`peer`] (peer-memory
//! clients), [`ib`] (the verbs vocabulary: enums, flags, errno), [`wire`]
//! (RoCEv2 headers, the opcode table, the ICRC, pcap files) and [`config`].
//!
//! Inside, from the bytes up: `wire`; `mem` (protection domains, the key
//! table, and the one interface that copies bytes in and out of registered
//! memory); `proto` (the sans-IO transport: requester, responder, completer;
//! packets and a `now` in, packets and timer deadlines out); `io` (UDP
//! sockets, the progress thread and timers; the only module that touches the
//! OS network); `verbs` on top. Those internal modules are public only with
//! the `unstable` feature, which uroce's own drop-in libraries, command,
//! tests and fuzz targets use; nothing behind it is a stable API.

// Every item of the public API is documented (the internal modules, public
// only with `unstable`, are not held to it).
#![cfg_attr(not(feature = "unstable"), warn(missing_docs, unnameable_types))]

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

// The public API: what a Rust application uses.
pub mod cm;
pub mod config;
pub mod ib;
pub mod verbs;
pub mod wire;
/// Peer-memory clients (PeerDirect): the interface a client implements and
/// the registry of loaded clients.
pub use mem::peer;

/// Declares internal modules: public with the `unstable` feature (uroce's
/// own drop-in libraries, command, tests and fuzz targets), private to the
/// crate without it, so that `cargo doc` shows a Rust user the API above.
/// No blanket `allow`: what only the `unstable` users call is compiled
/// only with it (`#[cfg(feature = "unstable")]` on the item), and
/// `scripts/test.sh` builds the crate without the feature under
/// `-D warnings`.
macro_rules! internal {
    ($($(#[$m:meta])* $name:ident;)*) => {$(
        $(#[$m])*
        #[cfg(feature = "unstable")]
        pub mod $name;
        $(#[$m])*
        #[cfg(not(feature = "unstable"))]
        mod $name;
    )*};
}

// (Each module's own `//!` docs say what it owns: an outer doc here would
// make rustdoc resolve their links from the crate root.)
internal! {
    lock_order;
    io;
    mem;
    proto;
    runtime;
}

/// The README's Rust example, compiled by `cargo test --doc`.
#[cfg(doctest)]
#[doc = include_str!("../../../README.md")]
pub struct ReadmeDoctests;
