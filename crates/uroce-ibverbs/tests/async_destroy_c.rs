//! Asynchronous events and destruction through the C ABI (issue 17 §2): a
//! C client (tests/c/async_destroy.c) checks that `ibv_destroy_qp`,
//! `ibv_destroy_cq` and `ibv_destroy_srq` wait (in a thread) until a
//! delivered event about the object is acknowledged, and that an event queued about an object that
//! is then destroyed is never delivered. Skipped with a reason when
//! verbs.h is missing.

mod c_client;

#[test]
fn no_event_for_a_destroyed_object_and_destroy_waits_for_acks() {
    c_client::run("async_destroy", "127.0.0.86", false);
}
