//! The crate's layers point one way (docs/architecture.md, "Layers"):
//! each top-level module's code names only modules of its own layer or
//! below. Read from the sources: every `crate::<module>` outside tests
//! (a file's `#[cfg(test)]` part) and outside comments.

use std::path::Path;

/// Bottom first; modules of one rank may name each other.
const LAYERS: &[&[&str]] =
    &[&["wire", "ib"], &["config"], &["runtime"], &["mem"], &["proto"], &["io"], &["verbs"], &["cm"]];

fn rank(module: &str) -> Option<usize> {
    LAYERS.iter().position(|l| l.contains(&module))
}

/// The modules `crate::` names in `code` (comments and the test part cut).
fn named(code: &str) -> Vec<String> {
    let code = code.split("#[cfg(test)]").next().unwrap_or("");
    let mut out = Vec::new();
    for line in code.lines() {
        let line = line.split("//").next().unwrap_or("");
        let mut rest = line;
        while let Some(i) = rest.find("crate::") {
            rest = &rest[i + "crate::".len()..];
            let m: String = rest.chars().take_while(|c| c.is_alphanumeric() || *c == '_').collect();
            out.push(m);
        }
    }
    out
}

fn walk(dir: &Path, out: &mut Vec<std::path::PathBuf>) {
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        if p.is_dir() {
            walk(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
}

#[test]
fn no_module_names_a_layer_above_it() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    walk(&src, &mut files);
    let mut up = Vec::new();
    let mut checked = 0;
    for f in &files {
        let rel = f.strip_prefix(&src).unwrap();
        let top = rel.iter().next().unwrap().to_string_lossy().trim_end_matches(".rs").to_string();
        let Some(mine) = rank(&top) else { continue };
        checked += 1;
        for m in named(&std::fs::read_to_string(f).unwrap()) {
            if rank(&m).is_some_and(|r| r > mine) {
                up.push(format!("{} names crate::{m}", rel.display()));
            }
        }
    }
    assert!(checked > 50, "only {checked} files found under {}", src.display());
    up.sort();
    up.dedup();
    assert!(up.is_empty(), "arrows back up:\n{}", up.join("\n"));
}

#[test]
fn the_checker_sees_an_arrow_up() {
    assert_eq!(named("use crate::cm::X; // crate::io\nfn f() { crate::verbs::g() }"), ["cm", "verbs"]);
    assert!(named("/// see [`crate::cm::X`]\n").is_empty());
    assert!(named("x\n#[cfg(test)]\nmod tests { use crate::cm; }").is_empty());
}
