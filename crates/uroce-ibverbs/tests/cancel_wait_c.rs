//! A thread cancelled inside `ibv_get_cq_event` (tests/c/cancel_wait.c):
//! an RDMA WRITE from another process into one that no longer calls uroce
//! lands, and the idle progress thread then sleeps (a waiter's claim on
//! the packets lasts one sleep, at most 200 ms; the progress thread's own
//! idle sleep is 60 s: a claim as long kept it waking every 500 µs).
//! Skipped with a reason when verbs.h is missing.

mod c_client;

#[test]
fn a_cancelled_waiter_does_not_stop_the_device_receiving() {
    c_client::run("cancel_wait", "127.0.0.96", false);
}
