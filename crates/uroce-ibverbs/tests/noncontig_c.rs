//! Seed 003's non-contiguous registration verbs through the C ABI: the
//! seed's two examples (a matrix column with rows over 64 KiB; a composite
//! region over N MRs) as tests/c/noncontig.c, built against Debian's
//! verbs.h and uroce.h, run on the drop-in library. Skipped with a reason
//! when verbs.h is not installed; under valgrind's leak checker when installed.

mod c_client;

#[test]
fn rereg_mr_interleaved_and_sg_through_the_c_abi() {
    c_client::run("noncontig", "127.0.0.151", true);
}
