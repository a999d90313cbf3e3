//! Seed 003's declarations where the seed puts them: tests/c/seed_verbs.c
//! includes only <infiniband/verbs.h>, is compiled with `-I<dropin>/include`
//! alone (the drop-in's infiniband/verbs.h: the system header through
//! #include_next plus ibv_rereg_mr_interleaved / ibv_rereg_mr_sg) and runs
//! on the drop-in: a matrix column and a composite region read through the
//! new keys, and the entry limits with errno; again with
//! MLX5_SCATTER_TO_CQE=2 / false / 0 (mlx5 ignores all but "0": the device
//! stays). uroce.h named by its path, with and without that -I, still
//! declares the seed's verbs (with cc, and clang when installed). Skipped
//! with a reason when verbs.h is not installed.

mod c_client;

use std::process::Command;

#[test]
fn a_seed_style_program_builds_with_the_dropin_include_dir_alone() {
    if !c_client::run_dropin_include("seed_verbs", "127.0.0.153", false) {
        return;
    }
    // mlx5's MLX5_SCATTER_TO_CQE: any value but "0" is ignored, so with
    // "2" (or "false") the device is still there and works.
    let dir = c_client::dropin().unwrap();
    for v in ["2", "false", "0"] {
        let out = Command::new(dir.join("seed_verbs-test"))
            .env("LD_LIBRARY_PATH", &dir)
            .env("UROCE_ADDR", "127.0.0.153")
            .env("MLX5_SCATTER_TO_CQE", v)
            .output()
            .expect("run the C client");
        let text = String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success() && text.contains("all ok"), "MLX5_SCATTER_TO_CQE={v}: {text}");
    }
}

#[test]
fn uroce_h_by_its_path_declares_the_seed_verbs() {
    let Some(dir) = c_client::dropin() else { return };
    let src = dir.join("uroce_h_by_path.c");
    let header = dir.join("include/uroce.h");
    std::fs::write(
        &src,
        format!(
            "#include \"{}\"\nint f(struct ibv_mr *m, struct ibv_sge *s, struct ibv_mr_interleaved *e)\n\
             {{ return ibv_rereg_mr_sg(m, 0, 1, s) + ibv_rereg_mr_interleaved(m, 0, 1, 1, e); }}\n",
            header.display()
        ),
    )
    .unwrap();
    let have = |c: &str| Command::new(c).arg("--version").output().is_ok_and(|o| o.status.success());
    let compilers: Vec<&str> = ["cc", "clang"].into_iter().filter(|c| have(c)).collect();
    let include = ["-I".to_string(), dir.join("include").display().to_string()];
    for (cc, extra) in compilers.iter().flat_map(|c| [(c, &[][..]), (c, &include[..])]) {
        let out = Command::new(cc)
            .args(["-Wall", "-Werror", "-c", "-o", "/dev/null"])
            .args(extra)
            .arg(&src)
            .output()
            .expect("run cc");
        assert!(out.status.success(), "{cc} {extra:?}: {}", String::from_utf8_lossy(&out.stderr));
    }
}
