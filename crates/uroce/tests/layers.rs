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
    if matches!(m.last().map(String::as_str), Some("mod" | "lib" | "main")) {
        m.pop();
    }
    m
}

fn ident(s: &str) -> String {
    s.chars().take_while(|c| c.is_alphanumeric() || *c == '_').collect()
}

/// A crate's source files as modules: who names whom.
struct Crate {
    files: Vec<std::path::PathBuf>,
    /// Each file's code, as [`code_of`] leaves it.
    codes: Vec<String>,
    modules: Vec<Vec<String>>,
    /// `(module, name)` → the path a `pub use` in that module gives `name`.
    reexports: std::collections::HashMap<(Vec<String>, String), Vec<String>>,
}

impl Crate {
    fn read(src: &Path) -> Crate {
        let mut files = Vec::new();
        walk(src, &mut files);
        files.sort();
        let modules: Vec<Vec<String>> = files.iter().map(|f| module_of(f.strip_prefix(src).unwrap())).collect();
        let codes = files.iter().map(|f| code_of(&std::fs::read_to_string(f).unwrap())).collect();
        let mut c = Crate { files, codes, modules, reexports: Default::default() };
        for i in 0..c.files.len() {
            let code = c.codes[i].clone();
            let me = c.modules[i].clone();
            for line in code.lines() {
                let t = line.trim_start();
                let Some(rest) = t.strip_prefix("pub ").or_else(|| t.strip_prefix("pub(crate) ")) else { continue };
                let Some(rest) = rest.strip_prefix("use ") else { continue };
                for (path, name) in c.paths_in(rest, &me) {
                    c.reexports.insert((me.clone(), name), path);
                }
            }
        }
        c
    }

    fn is_module(&self, m: &[String]) -> bool {
        self.modules.iter().any(|x| x[..] == *m)
    }

    /// The module paths one line (in module `me`) names: paths from
    /// `crate::`, `super::`, `self::` or a child module of `me`, a `{…}`
    /// group expanded one level, each with the name it ends in (an `as`
    /// alias when it has one).
    fn paths_in(&self, line: &str, me: &[String]) -> Vec<(Vec<String>, String)> {
        let b = line.as_bytes();
        let mut out = Vec::new();
        let mut at = 0;
        while at < line.len() {
            let start = at;
            let id = ident(&line[at..]);
            at += if id.is_empty() { line[at..].chars().next().map_or(1, char::len_utf8) } else { id.len() };
            let boundary =
                start == 0 || !(b[start - 1].is_ascii_alphanumeric() || b[start - 1] == b'_' || b[start - 1] == b':');
            if id.is_empty() || !boundary || !line[at..].starts_with("::") {
                continue;
            }
            let mut base: Vec<String> = match id.as_str() {
                "crate" => Vec::new(),
                "super" => me[..me.len().saturating_sub(1)].to_vec(),
                "self" => me.to_vec(),
                child if self.is_module(&[me, &[child.to_string()]].concat()) => [me, &[child.to_string()]].concat(),
                _ => continue,
            };
            let mut rest = &line[at..];
            while let Some(r) = rest.strip_prefix("::") {
                let id = ident(r);
                if id.is_empty() {
                    rest = r;
                    break;
                }
                rest = &r[id.len()..];
                if id == "super" {
                    base.pop();
                } else {
                    base.push(id);
                }
            }
            at = line.len() - rest.len();
            let alias = |item: &str| item.split(" as ").nth(1).map(|a| ident(a.trim()));
            if let Some(group) = rest.strip_prefix('{').and_then(|r| r.split('}').next()) {
                for item in group.split(',').map(str::trim) {
                    match ident(item) {
                        id if id.is_empty() || id == "self" => out.push((
                            base.clone(),
                            alias(item).unwrap_or_else(|| base.last().cloned().unwrap_or_default()),
                        )),
                        id => out.push(([base.clone(), vec![id.clone()]].concat(), alias(item).unwrap_or(id))),
                    }
                }
            } else {
                let name = alias(rest).unwrap_or_else(|| base.last().cloned().unwrap_or_default());
                out.push((base, name));
            }
        }
        out
    }

    /// The file defining what `path` names: the longest module it starts
    /// with, followed through that module's `pub use` of the next name.
    fn file_of(&self, path: &[String]) -> Option<usize> {
        let mut path = path.to_vec();
        for _ in 0..16 {
            let n = (0..=path.len()).rev().find(|&n| self.is_module(&path[..n]))?;
            match path.get(n).and_then(|name| self.reexports.get(&(path[..n].to_vec(), name.clone()))) {
                Some(to) if to[..] != path[..n + 1] => path = [to.clone(), path[n + 1..].to_vec()].concat(),
                _ => return self.modules.iter().position(|m| m[..] == path[..n]),
            }
        }
        None
    }

    /// File → files it names. A `pub use` is not an arrow (a module
    /// re-exporting a child's item depends on nothing); a path through one
    /// leads to the file that defines the item.
    fn graph(&self) -> Vec<Vec<usize>> {
        (0..self.files.len())
            .map(|i| {
                let mut to = Vec::new();
                for (line, me) in scopes(&self.codes[i], &self.modules[i]) {
                    let t = line.trim_start();
                    if t.starts_with("pub use ") || t.starts_with("pub(crate) use ") {
                        continue;
                    }
                    to.extend(self.paths_in(line, &me).iter().filter_map(|(p, _)| self.file_of(p)).filter(|&j| j != i));
                }
                to.sort();
                to.dedup();
                to
            })
            .collect()
    }
}

/// A file's code: its test part (from the first `#[cfg(test)]`) and its
/// comments cut.
fn code_of(file: &str) -> String {
    let code = file.split("#[cfg(test)]").next().unwrap_or("");
    code.lines().map(|l| l.split("//").next().unwrap_or("")).collect::<Vec<_>>().join("\n")
}

/// Each line of `code` with the module it is in: the file's module `base`,
/// and within it any inline `mod name { … }` (braces counted).
fn scopes<'a>(code: &'a str, base: &[String]) -> Vec<(&'a str, Vec<String>)> {
    let mut inline: Vec<(String, i64)> = Vec::new();
    let mut depth = 0i64;
    let mut out = Vec::new();
    for line in code.lines() {
        let me = [base.to_vec(), inline.iter().map(|(n, _)| n.clone()).collect()].concat();
        out.push((line, me));
        let t = line.trim_start();
        let t = t.strip_prefix("pub ").or_else(|| t.strip_prefix("pub(crate) ")).unwrap_or(t);
        if let Some(r) = t.strip_prefix("mod ") {
            if r[ident(r).len()..].trim_start().starts_with('{') {
                inline.push((ident(r), depth));
            }
        }
        depth += line.matches('{').count() as i64 - line.matches('}').count() as i64;
        while inline.last().is_some_and(|&(_, d)| depth <= d) {
            inline.pop();
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

/// The files of each crate of the workspace name each other without a
/// circle. Each file's paths (`crate::`, `super::`, `self::`, a child
/// module's), resolved to the file that defines what they name (through
/// re-exports), form a graph with no cycle: a type and the code working on
/// it may live in two files, the state below the work
/// (`proto::requester_state` under `proto::qp` under `proto::requester`),
/// and a `mod.rs` that uses its children holds nothing they use.
#[test]
fn no_files_name_each_other_in_a_circle() {
    let crates = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let mut circles = Vec::new();
    for name in ["uroce", "uroce-ibverbs", "uroce-cli"] {
        let src = crates.join(name).join("src");
        let c = Crate::read(&src);
        let graph = c.graph();
        assert!(
            graph.iter().map(Vec::len).sum::<usize>() >= c.files.len().saturating_sub(2),
            "{name}: too few arrows found: the reader is broken"
        );
        if let Some(circle) = a_circle(&graph) {
            let names: Vec<String> =
                circle.iter().map(|&i| c.files[i].strip_prefix(&src).unwrap().display().to_string()).collect();
            circles.push(format!("{name}: {} → back to the first", names.join(" → ")));
        }
    }
    assert!(circles.is_empty(), "files name each other in a circle:\n{}", circles.join("\n"));
}

/// A crate made of `files` (path, code) in a temporary directory.
fn crate_of(files: &[(&str, &str)]) -> (Crate, tempdir::Dir) {
    let dir = tempdir::Dir::new();
    for (path, code) in files {
        let p = dir.path().join(path);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(p, code).unwrap();
    }
    (Crate::read(dir.path()), dir)
}

#[test]
fn the_circle_checker_sees_a_circle() {
    let (c, _dir) = crate_of(&[
        ("lib.rs", "mod proto;\nmod wire;\n"),
        ("wire.rs", "pub struct Bth;\n"),
        ("proto/mod.rs", "mod qp;\nmod requester;\npub use qp::Qp;\n"),
        ("proto/qp.rs", "pub struct Qp;\n"),
        ("proto/requester.rs", "use super::Qp; // crate::wire\nfn f() { crate::wire::Bth; }\n"),
    ]);
    let me = ["proto".to_string(), "qp".to_string()];
    let names = |v: &[(Vec<String>, String)]| v.iter().map(|(p, n)| (p.join("::"), n.clone())).collect::<Vec<_>>();
    assert_eq!(
        names(&c.paths_in("use super::requester::{Requester as R, self}; crate::wire::Bth::x()", &me)),
        [
            ("proto::requester::Requester".into(), "R".into()),
            ("proto::requester".into(), "requester".into()),
            ("wire::Bth::x".into(), "x".into())
        ]
    );
    assert_eq!(names(&c.paths_in("use super::super::wire::Bth;", &me)), [("wire::Bth".into(), "Bth".into())]);
    // `super::Qp` is qp.rs's (through proto's re-export), not mod.rs's; a
    // re-export names nothing.
    let file = |f: &str| c.files.iter().position(|p| p.ends_with(f)).unwrap();
    let g = c.graph();
    assert_eq!(g[file("proto/requester.rs")], [file("proto/qp.rs"), file("wire.rs")]);
    assert!(g[file("proto/mod.rs")].is_empty());
    // A child module's path, and a path inside an inline module.
    let code = "mod imp {\n    fn f() { super::X; }\n}\nfn g() { qp::Qp; }\n";
    let lines = scopes(code, &["proto".to_string()]);
    assert_eq!(lines[1].1, ["proto", "imp"]);
    assert_eq!(lines[3].1, ["proto"]);
    assert_eq!(names(&c.paths_in(lines[3].0, &lines[3].1)), [("proto::qp::Qp".into(), "Qp".into())]);
    assert_eq!(a_circle(&[vec![1], vec![2], vec![0]]), Some(vec![0, 1, 2]));
    assert_eq!(a_circle(&[vec![1, 2], vec![2], vec![]]), None);
}

/// A temporary directory removed on drop.
mod tempdir {
    pub struct Dir(std::path::PathBuf);

    impl Dir {
        pub fn new() -> Dir {
            static N: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
            let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            // Cargo's own directory for integration tests, not a shared /tmp.
            let p =
                std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("layers-{}-{n}", std::process::id()));
            std::fs::create_dir(&p).unwrap();
            Dir(p)
        }

        pub fn path(&self) -> &std::path::Path {
            &self.0
        }
    }

    impl Drop for Dir {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }
}
