//! The GID table through the C ABI (issue #3): a C client (tests/c/gid.c)
//! checks that the table is longer than its populated entries and that
//! `ibv_query_gid`, `ibv_query_gid_ex`, `ibv_query_gid_type` and
//! `ibv_query_gid_table` treat empty entries and indices beyond the table
//! as rdma-core 44 does on a kernel RoCE device. Skipped with a reason when
//! verbs.h is missing.

use std::path::PathBuf;
use std::process::Command;

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// scripts/build-dropin.sh's output directory (under $CARGO_TARGET_DIR when
/// set), built when the library is missing.
fn dropin_dir() -> PathBuf {
    let target = std::env::var_os("CARGO_TARGET_DIR").map_or_else(|| root().join("target"), |t| root().join(t));
    let dir = target.join("dropin");
    if !dir.join("libibverbs.so.1").exists() {
        let st = Command::new(root().join("scripts/build-dropin.sh")).status().expect("run build-dropin.sh");
        assert!(st.success(), "build-dropin.sh failed");
    }
    dir
}

#[test]
fn empty_gid_entries_read_as_with_rdma_core() {
    if !std::path::Path::new("/usr/include/infiniband/verbs.h").exists() {
        println!("SKIPPED: /usr/include/infiniband/verbs.h missing (Debian package libibverbs-dev)");
        return;
    }
    let dir = dropin_dir();
    let exe = dir.join("gid-test");
    let cc = Command::new("cc")
        .args(["-O1", "-g", "-Wall", "-Werror", "-o"])
        .arg(&exe)
        .arg(root().join("crates/uroce-ibverbs/tests/c/gid.c"))
        .arg(dir.join("libibverbs.so.1"))
        .output()
        .expect("run cc");
    assert!(cc.status.success(), "cc: {}", String::from_utf8_lossy(&cc.stderr));
    let out =
        Command::new(&exe).env("LD_LIBRARY_PATH", &dir).env("UROCE_ADDR", "127.0.0.84").output().expect("run gid-test");
    let text = String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr);
    println!("{text}");
    assert!(out.status.success(), "gid-test failed: {text}");
    assert!(text.contains("all ok"), "{text}");
}
