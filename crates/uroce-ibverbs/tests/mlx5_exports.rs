//! The drop-in libmlx5.so.1's exports against rdma-core 44's (issue 20 §3):
//! exactly the symbols of Debian 12's libmlx5.so.1 (package
//! ibverbs-providers), each with its MLX5_1.x version and default/compat
//! state, SONAME libmlx5.so.1 and NEEDED libibverbs.so.1. Skipped with a
//! reason when objdump or the Debian library is missing.

#[path = "../../uroce/tests/skip/mod.rs"]
#[macro_use]
mod skip;

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::process::Command;

const DEBIAN: &str = "/usr/lib/x86_64-linux-gnu/libmlx5.so.1";

/// "VERSION name" of each defined MLX5_* symbol (compat versions in
/// parentheses, as objdump -T prints them).
fn exports(lib: &std::path::Path) -> Option<BTreeSet<String>> {
    let out = Command::new("objdump").arg("-T").arg(lib).output().ok()?;
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    Some(
        text.lines()
            .filter(|l| !l.contains("*UND*") && !l.contains("*ABS*") && l.contains("MLX5_"))
            .filter_map(|l| {
                let f: Vec<&str> = l.split_whitespace().collect();
                (f.len() >= 2).then(|| format!("{} {}", f[f.len() - 2], f[f.len() - 1]))
            })
            .collect(),
    )
}

#[test]
fn libmlx5_exports_match_rdma_core_44() {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..");
    let target = std::env::var_os("CARGO_TARGET_DIR").map_or_else(|| root.join("target"), |t| root.join(t));
    let ours = target.join("dropin/libmlx5.so.1");
    if !ours.exists() {
        let st = Command::new(root.join("scripts/build-dropin.sh")).status().expect("run build-dropin.sh");
        assert!(st.success(), "build-dropin.sh failed");
    }
    if !std::path::Path::new(DEBIAN).exists() {
        skip!("{DEBIAN} is not installed (Debian package ibverbs-providers)");
    }
    let (Some(real), Some(mine)) = (exports(std::path::Path::new(DEBIAN)), exports(&ours)) else {
        skip!("objdump is not installed (Debian package binutils)");
    };
    assert!(real.len() > 100, "objdump -T of rdma-core's libmlx5 gave {} symbols", real.len());
    let missing: Vec<_> = real.difference(&mine).collect();
    let extra: Vec<_> = mine.difference(&real).collect();
    assert!(missing.is_empty() && extra.is_empty(), "missing {missing:?}, extra {extra:?}");
    let dynamic = Command::new("readelf").arg("-d").arg(&ours).output().expect("readelf");
    let d = String::from_utf8_lossy(&dynamic.stdout);
    assert!(d.contains("Library soname: [libmlx5.so.1]"), "{d}");
    assert!(d.contains("Shared library: [libibverbs.so.1]"), "{d}");
}
