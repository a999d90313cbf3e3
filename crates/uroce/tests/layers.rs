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

/// The module path of a source file (`proto/qp.rs` → `[proto, qp]`;
/// `mem/mod.rs` → `[mem]`; `lib.rs` → `[]`).
fn module_of(rel: &Path) -> Vec<String> {
    let mut m: Vec<String> = rel.iter().map(|c| c.to_string_lossy().trim_end_matches(".rs").to_string()).collect();
    if matches!(m.last().map(String::as_str), Some("mod" | "lib")) {
        m.pop();
    }
    m
}

/// The module paths `code` (in module `me`) names through `crate::`,
/// `super::` or `self::`, a `{…}` group expanded one level (comments and
/// the test part cut). A facade's `pub use child::X` names no path this
/// way: a module's mod.rs declaring and re-exporting its files is not an
/// arrow.
fn paths_named(code: &str, me: &[String]) -> Vec<Vec<String>> {
    let code = code.split("#[cfg(test)]").next().unwrap_or("");
    let code: String = code.lines().map(|l| l.split("//").next().unwrap_or("")).collect::<Vec<_>>().join("\n");
    let ident = |s: &str| s.chars().take_while(|c| c.is_alphanumeric() || *c == '_').collect::<String>();
    let mut out = Vec::new();
    let b = code.as_bytes();
    for root in ["crate::", "super::", "self::"] {
        let mut from = 0;
        while let Some(i) = code[from..].find(root).map(|i| i + from) {
            from = i + root.len();
            if i > 0 && (b[i - 1].is_ascii_alphanumeric() || b[i - 1] == b'_' || b[i - 1] == b':') {
                continue;
            }
            let mut base: Vec<String> = match root {
                "crate::" => Vec::new(),
                "super::" => me[..me.len().saturating_sub(1)].to_vec(),
                _ => me.to_vec(),
            };
            let mut rest = &code[from..];
            loop {
                let id = ident(rest);
                if id.is_empty() {
                    break;
                }
                rest = &rest[id.len()..];
                if id == "super" {
                    base.pop();
                } else {
                    base.push(id);
                }
                match rest.strip_prefix("::") {
                    Some(r) => rest = r,
                    None => break,
                }
            }
            if let Some(group) = rest.strip_prefix('{').and_then(|r| r.split('}').next()) {
                for item in group.split(',') {
                    match ident(item.trim()) {
                        id if id.is_empty() || id == "self" => out.push(base.clone()),
                        id => out.push([base.clone(), vec![id]].concat()),
                    }
                }
            } else {
                out.push(base);
            }
        }
    }
    out
}

/// A circle among the files of `graph` (file → files it names), if any.
fn a_circle(graph: &[Vec<usize>]) -> Option<Vec<usize>> {
    fn visit(v: usize, g: &[Vec<usize>], state: &mut [u8], stack: &mut Vec<usize>) -> Option<Vec<usize>> {
        state[v] = 1;
        stack.push(v);
        for &w in &g[v] {
            if state[w] == 1 {
                let at = stack.iter().position(|&x| x == w).unwrap();
                return Some(stack[at..].to_vec());
            }
            if state[w] == 0 {
                if let Some(c) = visit(w, g, state, stack) {
                    return Some(c);
                }
            }
        }
        stack.pop();
        state[v] = 2;
        None
    }
    let mut state = vec![0u8; graph.len()];
    (0..graph.len()).find_map(|v| if state[v] == 0 { visit(v, graph, &mut state, &mut Vec::new()) } else { None })
}

/// The files name each other without a circle: each file's `crate::`,
/// `super::` and `self::` paths, resolved to the file that defines the
/// longest module they start with, form a graph with no cycle (a type and
/// the code working on it may live in two files, the state below the
/// work: `proto::requester_state` under `proto::qp` under
/// `proto::requester`).
#[test]
fn no_files_name_each_other_in_a_circle() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    walk(&src, &mut files);
    files.sort();
    let modules: Vec<Vec<String>> = files.iter().map(|f| module_of(f.strip_prefix(&src).unwrap())).collect();
    let graph: Vec<Vec<usize>> = files
        .iter()
        .enumerate()
        .map(|(i, f)| {
            let mut to: Vec<usize> = paths_named(&std::fs::read_to_string(f).unwrap(), &modules[i])
                .iter()
                .filter_map(|p| (0..=p.len()).rev().find_map(|n| modules.iter().position(|m| m[..] == p[..n])))
                .filter(|&j| j != i)
                .collect();
            to.sort();
            to.dedup();
            to
        })
        .collect();
    assert!(graph.iter().map(Vec::len).sum::<usize>() > 100, "too few arrows found: the reader is broken");
    if let Some(c) = a_circle(&graph) {
        let names: Vec<String> =
            c.iter().map(|&i| files[i].strip_prefix(&src).unwrap().display().to_string()).collect();
        panic!("files name each other in a circle: {} → back to the first", names.join(" → "));
    }
}

#[test]
fn the_circle_checker_sees_a_circle() {
    let me = ["proto".to_string(), "qp".to_string()];
    assert_eq!(
        paths_named("use super::requester::{Requester, self};\nfn f() { crate::wire::Bth::x() }", &me),
        [vec!["wire", "Bth", "x"], vec!["proto", "requester", "Requester"], vec!["proto", "requester"]]
    );
    assert_eq!(paths_named("use super::super::ib::Wc; // crate::io", &me), [vec!["ib", "Wc"]]);
    assert_eq!(a_circle(&[vec![1], vec![2], vec![0]]), Some(vec![0, 1, 2]));
    assert_eq!(a_circle(&[vec![1, 2], vec![2], vec![]]), None);
}
