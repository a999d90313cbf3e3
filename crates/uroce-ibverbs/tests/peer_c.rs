//! PeerDirect from C: a C program (tests/c/peer.c) allocating a storage
//! peer's device memory with uroce.h's `uroce_peer_alloc`, registering it
//! with a plain `ibv_reg_mr`, doing RDMA into and out of it, invalidating it
//! and checking the client's counters, on the drop-in library. Skipped with
//! a reason when verbs.h is not installed.

mod c_client;

/// Then the README's example (one test: both use the built drop-in and
/// must not rebuild it concurrently).
#[test]
fn peer_memory_through_the_c_abi() {
    if c_client::run("peer", "127.0.0.86", false) {
        the_readme_example_compiles_and_runs();
    }
}

/// The README's PeerDirect example, extracted from between its markers,
/// compiled against the drop-in and run with the configuration it names.
fn the_readme_example_compiles_and_runs() {
    let root = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..");
    let readme = std::fs::read_to_string(root.join("README.md")).unwrap();
    let block = readme
        .split_once("<!-- peer-example -->\n```c\n")
        .and_then(|(_, rest)| rest.split_once("```\n<!-- /peer-example -->"))
        .expect("the README's peer example between its markers")
        .0;
    let target = std::env::var_os("CARGO_TARGET_DIR").map_or_else(|| root.join("target"), |t| root.join(t));
    let dropin = target.join("dropin");
    let work = std::env::temp_dir().join(format!("uroce-readme-peer-{}", std::process::id()));
    std::fs::create_dir_all(&work).unwrap();
    let src = work.join("peer.c");
    std::fs::write(&src, block).unwrap();
    let exe = work.join("peer");
    let cc = std::process::Command::new("cc")
        .args(["-O1", "-Wall", "-Werror", "-o"])
        .arg(&exe)
        .arg(&src)
        .arg("-I")
        .arg(root.join("crates/uroce-ibverbs/include"))
        .arg(dropin.join("libibverbs.so.1"))
        .output()
        .unwrap();
    assert!(cc.status.success(), "cc: {}", String::from_utf8_lossy(&cc.stderr));
    let cfg = work.join("uroce.toml");
    std::fs::write(
        &cfg,
        format!(
            "[peers]\nload = [\"storage\"]\n[[peers.storage]]\nname = \"ssd0\"\npath = \"{}\"\ncapacity = 1048576\n",
            work.join("ssd0.img").display()
        ),
    )
    .unwrap();
    let out = std::process::Command::new(&exe)
        .env("LD_LIBRARY_PATH", &dropin)
        .env("UROCE_ADDR", "127.0.0.87")
        .env("UROCE_CONFIG", &cfg)
        .env("UROCE_RUNTIME_DIR", work.join("run"))
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success() && text.contains(": hello, device"), "{text}");
    let _ = std::fs::remove_dir_all(&work);
}
