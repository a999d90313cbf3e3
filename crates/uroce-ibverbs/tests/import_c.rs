//! Object import through the C ABI (issue #3): a C client (tests/c/import.c)
//! imports a context from a duplicate of its `cmd_fd`, then PDs, MRs and
//! device memory, moves data through the imported objects, and checks the
//! lifetime rules and errno of `src/import.rs`. It runs under valgrind with
//! leak checking when valgrind is installed: every struct the library hands
//! out must be freed exactly once. Skipped with a reason when verbs.h is
//! missing.

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

fn have(prog: &str) -> bool {
    Command::new("sh").args(["-c", &format!("command -v {prog}")]).output().is_ok_and(|o| o.status.success())
}

#[test]
fn imported_objects_share_the_originals() {
    if !std::path::Path::new("/usr/include/infiniband/verbs.h").exists() {
        println!("SKIPPED: /usr/include/infiniband/verbs.h missing (Debian package libibverbs-dev)");
        return;
    }
    let dir = dropin_dir();
    let exe = dir.join("import-test");
    let cc = Command::new("cc")
        .args(["-O1", "-g", "-Wall", "-Werror", "-o"])
        .arg(&exe)
        .arg(root().join("crates/uroce-ibverbs/tests/c/import.c"))
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
    let out = cmd.env("LD_LIBRARY_PATH", &dir).env("UROCE_ADDR", "127.0.0.83").output().expect("run import-test");
    let text = String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr);
    println!("{text}");
    assert!(out.status.success(), "import-test failed: {text}");
    assert!(text.contains("all ok"), "{text}");
    if valgrind {
        assert!(text.contains("ERROR SUMMARY: 0 errors"), "{text}");
        assert!(text.contains("definitely lost: 0 bytes") || text.contains("no leaks are possible"), "{text}");
    }
}
