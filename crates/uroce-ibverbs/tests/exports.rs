//! The drop-in's export list against rdma-core 44's (issue 17 §2): every
//! symbol Debian 12's libibverbs.so.1 (package libibverbs1) defines, with
//! its version and whether that version is the default (`@@`) or a compat
//! one (`@`, shown in parentheses by `objdump -T`), must be defined the same
//! way by target/dropin/libibverbs.so.1, except the ones below, each with
//! its reason (the README's "Exports" section lists them too); the drop-in
//! defines nothing beyond them but its own UROCE_* extensions and private entry
//! points (UROCE_PRIVATE uroce_cm_* for librdmacm.so.1, UROCE_MLX5_PRIVATE for
//! libmlx5.so.1). Skipped
//! with a reason when objdump or the Debian library is missing.

#[path = "../../uroce/tests/skip/mod.rs"]
#[macro_use]
mod skip;

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::process::Command;

/// Symbols of rdma-core 44 the drop-in does not define, and why.
const LEFT_OUT: &[(&str, &str)] = &[
    // The libibverbs 1.0 ABI (compat-1_0.c): wrappers over the pre-1.1
    // struct layouts (ibv_device_1_0, ibv_qp_1_0, …). Only programs linked
    // against libibverbs 1.0 (2006) bind them; none on Debian 12 does.
    ("(IBVERBS_1.0) ibv_ack_async_event", "libibverbs 1.0 ABI"),
    ("(IBVERBS_1.0) ibv_ack_cq_events", "libibverbs 1.0 ABI"),
    ("(IBVERBS_1.0) ibv_alloc_pd", "libibverbs 1.0 ABI"),
    ("(IBVERBS_1.0) ibv_attach_mcast", "libibverbs 1.0 ABI"),
    ("(IBVERBS_1.0) ibv_close_device", "libibverbs 1.0 ABI"),
    ("(IBVERBS_1.0) ibv_create_ah", "libibverbs 1.0 ABI"),
    ("(IBVERBS_1.0) ibv_create_cq", "libibverbs 1.0 ABI"),
    ("(IBVERBS_1.0) ibv_create_qp", "libibverbs 1.0 ABI"),
    ("(IBVERBS_1.0) ibv_create_srq", "libibverbs 1.0 ABI"),
    ("(IBVERBS_1.0) ibv_dealloc_pd", "libibverbs 1.0 ABI"),
    ("(IBVERBS_1.0) ibv_dereg_mr", "libibverbs 1.0 ABI"),
    ("(IBVERBS_1.0) ibv_destroy_ah", "libibverbs 1.0 ABI"),
    ("(IBVERBS_1.0) ibv_destroy_cq", "libibverbs 1.0 ABI"),
    ("(IBVERBS_1.0) ibv_destroy_qp", "libibverbs 1.0 ABI"),
    ("(IBVERBS_1.0) ibv_destroy_srq", "libibverbs 1.0 ABI"),
    ("(IBVERBS_1.0) ibv_detach_mcast", "libibverbs 1.0 ABI"),
    ("(IBVERBS_1.0) ibv_free_device_list", "libibverbs 1.0 ABI"),
    ("(IBVERBS_1.0) ibv_get_async_event", "libibverbs 1.0 ABI"),
    ("(IBVERBS_1.0) ibv_get_cq_event", "libibverbs 1.0 ABI"),
    ("(IBVERBS_1.0) ibv_get_device_guid", "libibverbs 1.0 ABI"),
    ("(IBVERBS_1.0) ibv_get_device_list", "libibverbs 1.0 ABI"),
    ("(IBVERBS_1.0) ibv_get_device_name", "libibverbs 1.0 ABI"),
    ("(IBVERBS_1.0) ibv_modify_qp", "libibverbs 1.0 ABI"),
    ("(IBVERBS_1.0) ibv_modify_srq", "libibverbs 1.0 ABI"),
    ("(IBVERBS_1.0) ibv_open_device", "libibverbs 1.0 ABI"),
    ("(IBVERBS_1.0) ibv_query_device", "libibverbs 1.0 ABI"),
    ("(IBVERBS_1.0) ibv_query_gid", "libibverbs 1.0 ABI"),
    ("(IBVERBS_1.0) ibv_query_pkey", "libibverbs 1.0 ABI"),
    ("(IBVERBS_1.0) ibv_query_port", "libibverbs 1.0 ABI"),
    ("(IBVERBS_1.0) ibv_query_qp", "libibverbs 1.0 ABI"),
    ("(IBVERBS_1.0) ibv_query_srq", "libibverbs 1.0 ABI"),
    ("(IBVERBS_1.0) ibv_reg_mr", "libibverbs 1.0 ABI"),
    ("(IBVERBS_1.0) ibv_resize_cq", "libibverbs 1.0 ABI"),
    // Provider registration of libibverbs before rdma-core 13 (compat
    // version): providers are never loaded into the drop-in.
    ("(IBVERBS_1.1) ibv_register_driver", "legacy provider registration"),
];

fn exports(lib: &std::path::Path) -> Option<BTreeSet<String>> {
    let out = Command::new("objdump").arg("-T").arg(lib).output().ok()?;
    assert!(out.status.success(), "objdump -T {}", lib.display());
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    Some(
        text.lines()
            .filter(|l| !l.contains("*UND*") && (l.contains(" DF ") || l.contains(" DO ")))
            .filter_map(|l| {
                let t: Vec<&str> = l.split_whitespace().collect();
                (t.len() >= 2).then(|| format!("{} {}", t[t.len() - 2], t[t.len() - 1]))
            })
            .collect(),
    )
}

#[test]
fn export_list_matches_rdma_core_44() {
    let real = PathBuf::from("/usr/lib/x86_64-linux-gnu/libibverbs.so.1");
    if !real.exists() {
        skip!("{} is not installed (Debian package libibverbs1)", real.display());
    }
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..");
    let target = std::env::var_os("CARGO_TARGET_DIR").map_or_else(|| root.join("target"), |t| root.join(t));
    let ours = target.join("dropin/libibverbs.so.1");
    if !ours.exists() {
        let st = Command::new(root.join("scripts/build-dropin.sh")).status().expect("run build-dropin.sh");
        assert!(st.success(), "build-dropin.sh failed");
    }
    let (Some(real), Some(ours)) = (exports(&real), exports(&ours)) else {
        skip!("objdump is not installed (Debian package binutils)");
    };
    assert!(real.len() > 150, "objdump -T of rdma-core's library gave {} symbols", real.len());
    let left_out: BTreeSet<String> = LEFT_OUT.iter().map(|(s, _)| s.to_string()).collect();
    let missing: Vec<&String> = real.difference(&ours).filter(|s| !left_out.contains(*s)).collect();
    assert!(missing.is_empty(), "rdma-core 44 exports that the drop-in lacks (or versions differently): {missing:?}");
    let stale: Vec<&String> = left_out.iter().filter(|s| ours.contains(*s) || !real.contains(*s)).collect();
    assert!(stale.is_empty(), "allow-list entries now exported, or not in rdma-core: {stale:?}");
    let extra: Vec<&String> = ours.difference(&real).filter(|s| !s.starts_with("UROCE_")).collect();
    assert!(extra.is_empty(), "exports rdma-core 44 does not have: {extra:?}");
    for s in ["IBVERBS_1.1 ibv_init_ah_from_wc", "IBVERBS_1.1 ibv_create_ah_from_wc", "IBVERBS_1.1 ibv_get_device_list"]
    {
        assert!(ours.contains(s), "{s}");
    }
}
