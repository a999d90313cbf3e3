//! GPU memory from C (tests/c/gpu.c): a `cuMemAlloc` buffer registered with
//! a plain `ibv_reg_mr` through the drop-in, claimed by the nv_mem client,
//! written and read by RDMA, invalidated by `cuMemFree`. Run twice: on a
//! fake `libcuda.so.1` built here (crates/uroce/tests/fake_cuda, host
//! memory behind the driver API), so that CI runs the whole path, and on the
//! system's CUDA driver, which is skipped where no GPU is (the program exits
//! 77). On 2026-11-26 the second ran on an NVIDIA H200 (driver 580.159.04).

#[path = "../../uroce/tests/skip/mod.rs"]
#[macro_use]
mod skip;
mod support;

use std::path::{Path, PathBuf};
use std::process::Command;
use support::{dropin_dir, root, serial};

/// Compiles gpu.c against the drop-in into `dir`; None (after the skip
/// line) where cc or verbs.h is missing.
fn build(dir: &Path) -> Option<PathBuf> {
    if !Path::new("/usr/include/infiniband/verbs.h").exists() {
        skip::whole("verbs.h is not installed (Debian package libibverbs-dev)");
        return None;
    }
    let exe = dir.join("gpu-test");
    let c = root().join("crates/uroce-ibverbs/tests/c");
    let cc = Command::new("cc")
        .args(["-O1", "-g", "-Wall", "-Werror", "-o"])
        .arg(&exe)
        .arg(c.join("gpu.c"))
        .arg("-I")
        .arg(&c)
        .arg(dropin_dir().join("libibverbs.so.1"))
        .arg("-ldl")
        .output()
        .expect("run cc");
    assert!(cc.status.success(), "cc: {}", String::from_utf8_lossy(&cc.stderr));
    Some(exe)
}

/// A fresh 0700 work directory with a runtime directory inside.
fn workdir(tag: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("uroce-gpu-c-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(dir.join("run")).unwrap();
    use std::os::unix::fs::PermissionsExt;
    for d in [&dir, &dir.join("run")] {
        std::fs::set_permissions(d, std::fs::Permissions::from_mode(0o700)).unwrap();
    }
    dir
}

/// Runs the program with `lib_path` first on the loader's path; its exit
/// status and output.
fn run(exe: &Path, dir: &Path, lib_path: &str, addr: &str) -> (Option<i32>, String) {
    let out = Command::new("timeout")
        .arg("120")
        .arg(exe)
        .env("LD_LIBRARY_PATH", lib_path)
        .env("UROCE_ADDR", addr)
        .env("UROCE_RUNTIME_DIR", dir.join("run"))
        .env_remove("UROCE_CONFIG")
        .output()
        .expect("run gpu-test");
    let text = String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr);
    (out.status.code(), text)
}

#[test]
fn gpu_memory_through_the_c_abi_on_a_fake_libcuda() {
    let _g = serial();
    let dir = workdir("fake");
    let Some(exe) = build(&dir) else { return };
    let cc = Command::new("cc")
        .args(["-shared", "-fPIC", "-O1", "-Wall", "-Werror", "-o"])
        .arg(dir.join("libcuda.so.1"))
        .arg(root().join("crates/uroce/tests/fake_cuda/libcuda.c"))
        .output()
        .expect("run cc");
    assert!(cc.status.success(), "cc: {}", String::from_utf8_lossy(&cc.stderr));
    let libs = format!("{}:{}", dropin_dir().display(), dir.display());
    let (code, text) = run(&exe, &dir, &libs, "127.0.0.92");
    let _ = std::fs::remove_dir_all(&dir);
    assert_eq!(code, Some(0), "{text}");
    assert!(text.contains("all ok"), "{text}");
}

#[test]
fn gpu_memory_through_the_c_abi() {
    let _g = serial();
    let dir = workdir("gpu");
    let Some(exe) = build(&dir) else { return };
    let (code, text) = run(&exe, &dir, &dropin_dir().display().to_string(), "127.0.0.93");
    let _ = std::fs::remove_dir_all(&dir);
    if code == Some(77) {
        skip!("{}", text.lines().find(|l| l.starts_with("SKIP")).unwrap_or("no GPU").trim_start_matches("SKIP "));
    }
    assert_eq!(code, Some(0), "{text}");
    assert!(text.contains("all ok"), "{text}");
}
