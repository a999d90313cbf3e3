//! fork and the drop-in (issue 17 §3, pyverbs' test_fork): a C client
//! (tests/c/fork.c) checks that `ibv_is_fork_initialized()` answers
//! IBV_FORK_UNNEEDED and `ibv_fork_init()` succeeds, and that a child
//! forked with a device open leaves the parent's device working. Skipped
//! with a reason when verbs.h is missing.

mod c_client;

#[test]
fn fork_is_unneeded_and_leaves_the_parent_working() {
    c_client::run("fork", "127.0.0.88", false);
}
