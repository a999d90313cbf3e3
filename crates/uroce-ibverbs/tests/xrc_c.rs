//! XRC and RDMA ATOMIC WRITE through the C ABI: a C program (tests/c/xrc.c)
//! built against Debian's verbs.h, run on the drop-in library (built by
//! scripts/build-dropin.sh into `$CARGO_TARGET_DIR/dropin`, or
//! `target/dropin`). Skipped with a reason when verbs.h or cc is missing.

use std::path::PathBuf;
use std::process::Command;

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
}

#[test]
fn xrc_and_atomic_write_through_the_c_abi() {
    if !std::path::Path::new("/usr/include/infiniband/verbs.h").exists() {
        println!("SKIPPED: /usr/include/infiniband/verbs.h missing (Debian package libibverbs-dev)");
        return;
    }
    let dir =
        std::env::var_os("CARGO_TARGET_DIR").map_or_else(|| root().join("target"), |t| root().join(t)).join("dropin");
    if !dir.join("libibverbs.so.1").exists() {
        let st = Command::new(root().join("scripts/build-dropin.sh")).status().expect("run build-dropin.sh");
        assert!(st.success(), "build-dropin.sh failed");
    }
    let exe = dir.join("xrc-test");
    let cc = Command::new("cc")
        .args(["-O1", "-g", "-Wall", "-Werror", "-o"])
        .arg(&exe)
        .arg(root().join("crates/uroce-ibverbs/tests/c/xrc.c"))
        .arg(dir.join("libibverbs.so.1"))
        .output()
        .expect("run cc");
    assert!(cc.status.success(), "cc: {}", String::from_utf8_lossy(&cc.stderr));
    let out =
        Command::new(&exe).env("LD_LIBRARY_PATH", &dir).env("UROCE_ADDR", "127.0.0.79").output().expect("run xrc-test");
    let text = String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr);
    println!("{text}");
    assert!(out.status.success(), "xrc-test failed: {text}");
    assert!(text.contains("all ok"));
}
