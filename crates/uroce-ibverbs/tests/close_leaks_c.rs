//! `ibv_close_device` with leaked objects (issue 17 §2): a C client
//! (tests/c/close_leaks.c) leaks a QP, SRQ, CQ, AH, memory window, MR and PD, closes the
//! device, and checks that the device is gone (its progress thread ended,
//! its UDP port free) and that a new open on the same address works.
//! Skipped with a reason when verbs.h is missing.

mod c_client;

#[test]
fn close_releases_leaked_objects_and_the_device() {
    c_client::run("close_leaks", "127.0.0.89", false);
}
