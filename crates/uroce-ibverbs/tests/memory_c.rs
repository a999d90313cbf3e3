//! The memory features through the C ABI: C programs (tests/c/memory.c,
//! tests/c/pinned.c) built against Debian's verbs.h and the drop-in's
//! uroce.h, run on the drop-in library. Skipped with a reason when verbs.h
//! is not installed.

mod c_client;

#[test]
fn odp_mkeys_and_dmabuf_through_the_c_abi() {
    c_client::run("memory", "127.0.0.71", false);
}

/// Issue 28 §1: after munmap and a new mapping at the address, a WRITE
/// through the old key never lands in the new mapping and a READ never
/// returns its bytes; 10 000 rounds with threads mapping meanwhile.
#[test]
fn pinned_memory_keeps_its_pages_through_the_c_abi() {
    c_client::run("pinned", "127.0.0.193", false);
}
