//! Runs a C client of tests/c/ on the drop-in library: compiles it against
//! Debian's verbs.h (and uroce.h), runs it with the library first on the
//! loader's path, and checks it printed "all ok". With `check_leaks` it runs
//! under valgrind's leak checker when valgrind is installed: no error and no
//! definitely lost block. Returns false (after printing the test's SKIP
//! line, tests/skip) when verbs.h is missing; the test then ends.

#[path = "../../../uroce/tests/skip/mod.rs"]
mod skip;

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
    let built = ["libibverbs.so.1", "libmlx5.so.1", "include/infiniband/uroce_noncontig.h"];
    if !built.iter().all(|f| dir.join(f).exists()) {
        let st = Command::new(root().join("scripts/build-dropin.sh")).status().expect("run build-dropin.sh");
        assert!(st.success(), "build-dropin.sh failed");
    }
    dir
}

fn have(prog: &str) -> bool {
    Command::new("sh").args(["-c", &format!("command -v {prog}")]).output().is_ok_and(|o| o.status.success())
}

/// Compiles and runs `tests/c/<name>.c` with `UROCE_ADDR=addr`.
#[allow(dead_code)]
pub fn run(name: &str, addr: &str, check_leaks: bool) -> bool {
    run_with_libs(name, addr, check_leaks, &[])
}

/// As [`run`], linking also the drop-in libraries `libs` of target/dropin
/// (e.g. "libmlx5.so.1").
#[allow(dead_code)]
pub fn run_with_libs(name: &str, addr: &str, check_leaks: bool, libs: &[&str]) -> bool {
    run_full(name, addr, check_leaks, libs, None)
}

/// As [`run`], compiled as a user of the installed drop-in would: with
/// `-I<dropin>/include` (build-dropin.sh's copy of the headers) instead of
/// the source tree's include directory.
#[allow(dead_code)]
pub fn run_dropin_include(name: &str, addr: &str, check_leaks: bool) -> bool {
    run_full(name, addr, check_leaks, &[], Some(dropin_dir().join("include")))
}

/// The drop-in's directory (built when missing), or None after printing
/// the test's SKIP line when verbs.h is not installed.
#[allow(dead_code)]
pub fn dropin() -> Option<PathBuf> {
    if !std::path::Path::new("/usr/include/infiniband/verbs.h").exists() {
        skip::whole("verbs.h is not installed (Debian package libibverbs-dev)");
        return None;
    }
    Some(dropin_dir())
}

fn run_full(name: &str, addr: &str, check_leaks: bool, libs: &[&str], include: Option<PathBuf>) -> bool {
    let Some(dir) = dropin() else { return false };
    let include = include.unwrap_or_else(|| root().join("crates/uroce-ibverbs/include"));
    let exe = dir.join(format!("{name}-test"));
    let cc = Command::new("cc")
        .args(["-O1", "-g", "-Wall", "-Werror", "-o"])
        .arg(&exe)
        .arg(root().join(format!("crates/uroce-ibverbs/tests/c/{name}.c")))
        .arg("-I")
        .arg(&include)
        .arg(dir.join("libibverbs.so.1"))
        .args(libs.iter().map(|l| dir.join(l)))
        .output()
        .expect("run cc");
    assert!(cc.status.success(), "cc: {}", String::from_utf8_lossy(&cc.stderr));
    let valgrind = check_leaks && have("valgrind");
    if check_leaks && !valgrind {
        skip::part("the leak check: valgrind is not installed (Debian package valgrind)");
    }
    let mut cmd = if valgrind {
        let mut c = Command::new("timeout");
        // --fair-sched=yes: valgrind runs one thread at a time, and its
        // default (unfair) lock lets a thread spinning on ibv_poll_cq keep it
        // for seconds while the progress thread, holding the receive lock
        // the spinner needs, waits (the C clients then saw no completion
        // for 20 s in about one run in seven).
        c.args([
            "300",
            "valgrind",
            "--fair-sched=yes",
            "--leak-check=full",
            "--errors-for-leak-kinds=definite",
            "--error-exitcode=9",
        ]);
        c.arg(&exe);
        c
    } else {
        Command::new(&exe)
    };
    let out = cmd.env("LD_LIBRARY_PATH", &dir).env("UROCE_ADDR", addr).output().expect("run the C client");
    let text = String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr);
    println!("{text}");
    assert!(out.status.success(), "{name}-test failed: {text}");
    assert!(text.contains("all ok"), "{text}");
    if valgrind {
        assert!(text.contains("ERROR SUMMARY: 0 errors"), "{text}");
        assert!(text.contains("definitely lost: 0 bytes") || text.contains("no leaks are possible"), "{text}");
    }
    true
}
