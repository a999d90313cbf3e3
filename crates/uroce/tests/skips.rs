//! Skips are counted as skips: a test that skips through tests/skip prints
//! exactly one `SKIP <test>: <reason>` line, and scripts/test-summary.sh (the
//! end of scripts/test.sh) moves it from libtest's passes to the skips,
//! lists partial skips, and fails a CI run on a skip for something not
//! installed.

#[macro_use]
mod skip;

use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// A directory of this test's own (0700, created new).
fn own_dir(tag: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("uroce-skips-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::DirBuilder::new().mode(0o700).create(&dir).unwrap();
    dir
}

fn write_new(path: &Path, text: &str) {
    use std::io::Write;
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW)
        .open(path)
        .unwrap();
    f.write_all(text.as_bytes()).unwrap();
}

fn summary(log: &Path, ci: bool) -> Output {
    let mut c = Command::new(root().join("scripts/test-summary.sh"));
    c.arg(log).env_remove("CI");
    if ci {
        c.env("CI", "true");
    }
    c.output().unwrap()
}

fn last_line(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).lines().last().unwrap_or("").to_string()
}

/// Run as a child by `a_skipping_test_counts_as_skipped`: skips.
#[test]
fn child_that_skips() {
    if std::env::var_os("UROCE_SKIPS_CHILD").is_none() {
        return;
    }
    skip!("the child skips, as asked");
}

#[test]
fn a_skipping_test_counts_as_skipped() {
    let exe = std::env::current_exe().unwrap();
    let out = Command::new(exe)
        .args(["--exact", "child_that_skips", "--show-output", "--test-threads", "1"])
        .env("UROCE_SKIPS_CHILD", "1")
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(out.status.success(), "{text}");
    let lines: Vec<&str> = text.lines().filter(|l| l.starts_with("SKIP")).collect();
    assert_eq!(lines, ["SKIP child_that_skips: the child skips, as asked"], "{text}");
    assert!(text.contains("test result: ok. 1 passed; 0 failed; 0 ignored"), "{text}");
    let dir = own_dir("child");
    let log = dir.join("log");
    write_new(&log, &text);
    let s = summary(&log, false);
    assert!(s.status.success(), "{}", String::from_utf8_lossy(&s.stdout));
    assert_eq!(last_line(&s), "0 passed, 0 failed, 1 skipped");
    std::fs::remove_dir_all(dir).unwrap();
}

#[test]
fn summary_moves_skips_lists_parts_and_fails_ci_on_not_installed() {
    let dir = own_dir("summary");
    let log = dir.join("log");
    write_new(
        &log,
        "test result: ok. 5 passed; 0 failed; 1 ignored; 0 measured; 0 filtered out; finished in 0.01s\n\
         ---- a stdout ----\n\
         SKIP a: tshark is not installed (Debian package tshark)\n\
         SKIP-PART b: the leak check: valgrind is not installed (Debian package valgrind)\n\
         test result: ok. 3 passed; 0 failed; 0 ignored; 0 measured; 0 filtered out; finished in 0.01s\n\
         SKIP c: libcuda.so.1 not loadable\n",
    );
    let s = summary(&log, false);
    let text = String::from_utf8_lossy(&s.stdout).to_string();
    assert!(s.status.success(), "{text}");
    // 8 passed for libtest, 2 of them whole skips; 1 ignored.
    assert_eq!(last_line(&s), "6 passed, 0 failed, 3 skipped", "{text}");
    assert!(text.contains("  SKIP c: libcuda.so.1 not loadable"), "{text}");
    assert!(text.contains("  SKIP-PART b: the leak check"), "{text}");
    let ci = summary(&log, true);
    let text = String::from_utf8_lossy(&ci.stdout).to_string();
    assert!(!ci.status.success(), "{text}");
    assert!(text.contains("an install step is missing"), "{text}");
    assert_eq!(last_line(&ci), "6 passed, 0 failed, 3 skipped", "{text}");
    std::fs::remove_dir_all(dir).unwrap();
}
