//! The librdmacm API (rdma-core 44, `<rdma/rdma_cma.h>`) on uroce's CM
//! agent (`uroce::cm::CmEndpoint`, QP 1 of each device). The functions are
//! exported from libibverbs.so.1 under private names (`uroce_cm_<name>`,
//! version node `UROCE_PRIVATE`); the drop-in librdmacm.so.1
//! (crates/uroce-rdmacm) exports the public names with librdmacm's symbol
//! versions and jumps here, so both drop-ins share one uroce instance.
//!
//! Bottom to top: [`state`] holds the devices, the ids and the one CM lock;
//! [`sockaddr`] converts addresses; [`channel`] owns event channels and
//! events; [`ids`] makes ids and moves their QPs; [`dev`] opens the devices'
//! CM agents and runs the thread that routes their events to the ids; [`id`]
//! has the calls on ids; [`addrinfo`] `rdma_getaddrinfo`; [`other`] the
//! exports that fail cleanly (multicast, ECE); [`rsocket`] rsockets (stream
//! sockets over RDMA, rdma-core 44's protocol). No file names one above it
//! (`crates/uroce/tests/layers.rs`).

mod addrinfo;
mod channel;
mod dev;
mod id;
mod ids;
mod other;
mod rsocket;
mod sockaddr;
mod state;
