//! The GID table through the C ABI (issue #3): a C client (tests/c/gid.c)
//! checks that the table is longer than its populated entries and that
//! `ibv_query_gid`, `ibv_query_gid_ex`, `ibv_query_gid_type` and
//! `ibv_query_gid_table` treat empty entries and indices beyond the table
//! as rdma-core 44 does on a kernel RoCE device. Skipped with a reason when
//! verbs.h is missing.

mod c_client;

#[test]
fn empty_gid_entries_read_as_with_rdma_core() {
    c_client::run("gid", "127.0.0.84", false);
}
