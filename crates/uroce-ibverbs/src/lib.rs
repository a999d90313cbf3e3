//! A drop-in `libibverbs.so.1` for rdma-core 44 (Debian 12), backed by uroce.
//!
//! Unmodified verbs programs load it through `LD_LIBRARY_PATH` and run on a
//! uroce device. Struct layouts come from Debian's `verbs.h` through bindgen
//! ([`ffi`]); every exported function carries its rdma-core symbol version
//! (`libibverbs.map`, linked by `scripts/build-dropin.sh`). The library is
//! built with `panic = "abort"` (profile `dropin`): no Rust panic unwinds
//! into C.
//!
//! Each C object (`ibv_pd`, `ibv_cq`, …) is the first field of a `#[repr(C)]`
//! Rust struct that also holds the uroce handle (all of them in `handles.rs`,
//! below the files that work with them); a C pointer converts back with a
//! cast. Invalid arguments return the errno real libibverbs returns.

#![allow(clippy::missing_safety_doc)] // every export's contract is verbs.h's

pub mod ffi;

mod ah_from_wc;
mod cq_ex;
mod datapath;
mod device;
mod dm;
mod dm_memory;
mod domain;
mod errno;
mod events;
mod ext;
mod handles;
mod import;
mod libfabric;
mod mlx5dv;
mod mw;
mod noncontig;
mod objects;
mod peer;
mod qp_ex;
mod rdmacm;
mod share;
mod srq;
mod strings;
mod stubs;
mod xrcd;
