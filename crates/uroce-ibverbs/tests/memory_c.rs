//! The memory features through the C ABI: a C program (tests/c/memory.c)
//! built against Debian's verbs.h and the drop-in's uroce.h, run on the
//! drop-in library. Skipped with a reason when verbs.h is not installed.

use std::path::PathBuf;
use std::process::Command;

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
}

#[test]
fn odp_mkeys_and_dmabuf_through_the_c_abi() {
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
    let exe = dir.join("memory-test");
    let cc = Command::new("cc")
        .args(["-O1", "-g", "-Wall", "-Werror", "-o"])
        .arg(&exe)
        .arg(root().join("crates/uroce-ibverbs/tests/c/memory.c"))
        .arg("-I")
        .arg(root().join("crates/uroce-ibverbs/include"))
        .arg(dir.join("libibverbs.so.1"))
        .output()
        .expect("run cc");
    assert!(cc.status.success(), "cc: {}", String::from_utf8_lossy(&cc.stderr));
    let out = Command::new(&exe)
        .env("LD_LIBRARY_PATH", &dir)
        .env("UROCE_ADDR", "127.0.0.71")
        .output()
        .expect("run memory-test");
    let text = String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr);
    println!("{text}");
    assert!(out.status.success(), "memory-test failed: {text}");
    assert!(text.contains("all ok"));
}
