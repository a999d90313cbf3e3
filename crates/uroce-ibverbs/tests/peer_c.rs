//! PeerDirect from C: a C program (tests/c/peer.c) allocating a storage
//! peer's device memory with uroce.h's `uroce_peer_alloc`, registering it
//! with a plain `ibv_reg_mr`, doing RDMA into and out of it, invalidating it
//! and checking the client's counters, on the drop-in library. Skipped with
//! a reason when verbs.h is not installed.

mod c_client;

#[test]
fn peer_memory_through_the_c_abi() {
    c_client::run("peer", "127.0.0.86", false);
}
