//! Object import through the C ABI (issue #3): a C client (tests/c/import.c)
//! imports a context from a duplicate of its `cmd_fd`, then PDs, MRs and
//! device memory, moves data through the imported objects, and checks the
//! lifetime rules and errno of `src/import.rs`. It runs under valgrind with
//! leak checking when valgrind is installed: every struct the library hands
//! out must be freed exactly once. Skipped with a reason when verbs.h is
//! missing.

mod c_client;

#[test]
fn imported_objects_share_the_originals() {
    c_client::run("import", "127.0.0.83", true);
}
