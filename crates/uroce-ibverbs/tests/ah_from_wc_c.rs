//! `ibv_init_ah_from_wc` and `ibv_create_ah_from_wc` through the C ABI
//! (issue 17 §2): a C client (tests/c/ah_from_wc.c) answers a UD sender
//! with an address handle made from the receive completion and its GRH
//! area, and checks the attributes made from IPv4 and IPv6 GRH areas as
//! rdma-core 44 makes them. Skipped with a reason when verbs.h is missing.

mod c_client;

#[test]
fn address_handle_from_a_completion_answers_the_sender() {
    c_client::run("ah_from_wc", "127.0.0.87", false);
}
