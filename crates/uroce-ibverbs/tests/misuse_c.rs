//! Misuse through the C ABI (issue #10): a C client (tests/c/misuse.c) makes
//! every non-inline verbs call with NULL or invalid handles, in wrong
//! states, with out-of-range sizes, overflows the queues and destroys
//! objects still in use, checking each documented errno; it runs under
//! valgrind with leak checking, which must report no invalid access and no
//! definitely lost block. Skipped with a reason when verbs.h is missing;
//! without valgrind the client still runs and the leak check is skipped.

use std::path::PathBuf;
use std::process::Command;

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn have(prog: &str) -> bool {
    Command::new("sh").args(["-c", &format!("command -v {prog}")]).output().is_ok_and(|o| o.status.success())
}

#[test]
fn misuse_gets_documented_errors_without_leaks() {
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
    let exe = dir.join("misuse-test");
    let cc = Command::new("cc")
        .args(["-O1", "-g", "-Wall", "-Werror", "-o"])
        .arg(&exe)
        .arg(root().join("crates/uroce-ibverbs/tests/c/misuse.c"))
        .arg(dir.join("libibverbs.so.1"))
        .output()
        .expect("run cc");
    assert!(cc.status.success(), "cc: {}", String::from_utf8_lossy(&cc.stderr));
    let valgrind = have("valgrind");
    let mut cmd = if valgrind {
        let mut c = Command::new("timeout");
        c.args(["300", "valgrind", "--leak-check=full", "--errors-for-leak-kinds=definite", "--error-exitcode=9"]);
        c.arg(&exe);
        c
    } else {
        println!("SKIPPED the leak check: valgrind is not installed (Debian package valgrind)");
        Command::new(&exe)
    };
    let out = cmd.env("LD_LIBRARY_PATH", &dir).env("UROCE_ADDR", "127.0.0.78").output().expect("run misuse-test");
    let text = String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr);
    println!("{text}");
    assert!(out.status.success(), "misuse-test failed: {text}");
    assert!(text.contains("all ok"), "{text}");
    if valgrind {
        assert!(text.contains("ERROR SUMMARY: 0 errors"), "{text}");
        assert!(text.contains("definitely lost: 0 bytes") || text.contains("no leaks are possible"), "{text}");
    }
}
