//! The memory features through the C ABI: a C program (tests/c/memory.c)
//! built against Debian's verbs.h and the drop-in's uroce.h, run on the
//! drop-in library. Skipped with a reason when verbs.h is not installed.

mod c_client;

#[test]
fn odp_mkeys_and_dmabuf_through_the_c_abi() {
    c_client::run("memory", "127.0.0.71", false);
}
