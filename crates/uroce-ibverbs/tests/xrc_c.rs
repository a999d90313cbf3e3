//! XRC and RDMA ATOMIC WRITE through the C ABI: a C program (tests/c/xrc.c)
//! built against Debian's verbs.h, run on the drop-in library (built by
//! scripts/build-dropin.sh into `$CARGO_TARGET_DIR/dropin`, or
//! `target/dropin`). Skipped with a reason when verbs.h or cc is missing.

mod c_client;

#[test]
fn xrc_and_atomic_write_through_the_c_abi() {
    c_client::run("xrc", "127.0.0.79", true);
}
