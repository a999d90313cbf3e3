//! Work requests checked before they are read, and CQ overrun, through the
//! C ABI (issue 16 §3): a C client (tests/c/post_limits.c) posts cyclic WR
//! lists, `num_sge` of INT_MAX and -1 over an unmapped SGE array, an inline
//! SGE of 0xFFFFFFFF bytes and opcodes its QP type lacks, on send, receive
//! and SRQ queues, and overruns a CQ; each is refused with the documented
//! errno and `bad_wr`, without a crash or an allocation beyond the queue.
//! Skipped with a reason when verbs.h is missing.

mod c_client;

#[test]
fn work_requests_are_checked_before_they_are_read() {
    c_client::run("post_limits", "127.0.0.85", false);
}
