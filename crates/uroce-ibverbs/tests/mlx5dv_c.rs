//! The drop-in libmlx5.so.1 (issue 20 §3) through C: tests/c/mlx5dv.c,
//! built against Debian's verbs.h and mlx5dv.h and linked with both drop-in
//! libraries: mlx5dv_is_supported, mlx5dv_create_qp's per-QP
//! DISABLE_SCATTER_TO_CQE (seed 001), mkeys by UMR (mlx5dv_wr_mr_list,
//! _mr_interleaved, _mkey_configure and its setters) used by RDMA READ and
//! WRITE, and clean failures of the rest. Skipped with a reason when verbs.h
//! or mlx5dv.h is not installed; under valgrind's leak checker when installed.

#[path = "../../uroce/tests/skip/mod.rs"]
#[macro_use]
mod skip;

// c_client loads the skip module for itself too.
#[allow(clippy::duplicate_mod)]
mod c_client;

#[test]
fn mlx5dv_through_the_drop_in_libmlx5() {
    if !std::path::Path::new("/usr/include/infiniband/mlx5dv.h").exists() {
        skip!("mlx5dv.h is not installed (Debian package libibverbs-dev)");
    }
    c_client::run_with_libs("mlx5dv", "127.0.0.152", true, &["libmlx5.so.1"]);
}
