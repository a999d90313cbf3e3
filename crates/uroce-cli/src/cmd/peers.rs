//! `uroce peers`: peer-memory clients. Without a subcommand, the host's
//! counters per client (the user-space `/sys/kernel/mm/memory_peers`):
//! what every live process publishes under
//! `<runtime dir>/<pid>/memory_peers/<client>/` plus the totals folded from
//! processes that have exited (see `uroce::mem::peer::totals`), row `all`;
//! `--processes` adds a row per live process. `uroce peers status` says
//! which clients the configuration loads, their versions, and why a client
//! is not loaded.

use serde_json::{json, Value};
use std::process::ExitCode;
use uroce::mem::peer::{loader, totals, PeerStats, COUNTERS};

#[derive(clap::Args)]
pub struct Args {
    #[command(subcommand)]
    cmd: Option<Sub>,
    /// Print JSON.
    #[arg(long, global = true)]
    json: bool,
    /// Also show each live process's own counters.
    #[arg(long)]
    processes: bool,
}

#[derive(clap::Subcommand)]
enum Sub {
    /// Which clients the configuration loads, or why not (like
    /// `service nv_peer_mem status`).
    Status,
}

/// Every live process's published peer counters (for `status`).
fn collect() -> Vec<Value> {
    let h = totals::host();
    h.processes.iter().map(|(pid, s)| json!({ "pid": pid, "name": s.name })).collect()
}

fn counters_json(s: &PeerStats) -> Value {
    let mut c = serde_json::Map::new();
    for (n, v) in s.counters() {
        c.insert(n.to_string(), json!(v));
    }
    Value::Object(c)
}

/// Rows under a header, each column as wide as its widest cell: text
/// columns left-aligned, numbers right-aligned.
fn table(header: &[&str], rows: &[Vec<String>], text_cols: usize) -> String {
    let mut w: Vec<usize> = header.iter().map(|h| h.len()).collect();
    for r in rows {
        for (i, c) in r.iter().enumerate() {
            w[i] = w[i].max(c.chars().count());
        }
    }
    let line = |cells: Vec<&str>| {
        let mut l = String::new();
        for (i, c) in cells.iter().enumerate() {
            if i > 0 {
                l.push_str("  ");
            }
            if i < text_cols {
                l.push_str(&format!("{c:<width$}", width = w[i]));
            } else {
                l.push_str(&format!("{c:>width$}", width = w[i]));
            }
        }
        l.trim_end().to_string() + "\n"
    };
    let mut out = line(header.to_vec());
    for r in rows {
        out.push_str(&line(r.iter().map(String::as_str).collect()));
    }
    out
}

pub fn run(a: Args) -> ExitCode {
    match a.cmd {
        Some(Sub::Status) => status(a.json),
        None => {
            let h = totals::host();
            for s in &h.skipped {
                eprintln!("uroce peers: skipped {s}");
            }
            if a.json {
                let clients: Vec<Value> = h
                    .totals
                    .iter()
                    .map(|s| {
                        let exited = h.exited.iter().find(|e| e.name == s.name).cloned().unwrap_or_default();
                        json!({ "name": s.name, "version": s.version, "counters": counters_json(s),
                                "exited_processes": counters_json(&exited) })
                    })
                    .collect();
                let mut v = json!({ "clients": clients });
                if a.processes {
                    v["processes"] = h
                        .processes
                        .iter()
                        .map(|(pid, s)| json!({ "pid": pid, "name": s.name, "version": s.version, "counters": counters_json(s) }))
                        .collect();
                }
                println!("{}", serde_json::to_string_pretty(&v).unwrap());
                return ExitCode::SUCCESS;
            }
            let mut header = vec!["pid", "client", "version"];
            header.extend(COUNTERS);
            let row = |pid: String, s: &PeerStats| {
                let mut r = vec![pid, s.name.clone(), s.version.clone()];
                r.extend(s.counters().iter().map(|(_, v)| v.to_string()));
                r
            };
            let mut rows: Vec<Vec<String>> = h.totals.iter().map(|s| row("all".into(), s)).collect();
            if a.processes {
                rows.extend(h.processes.iter().map(|(pid, s)| row(pid.to_string(), s)));
            }
            print!("{}", table(&header, &rows, 3));
            if h.totals.is_empty() {
                println!("(no process has used a peer-memory client)");
            }
            ExitCode::SUCCESS
        }
    }
}

fn status(as_json: bool) -> ExitCode {
    let file = match uroce::config::ConfigFile::load() {
        Ok(f) => f,
        Err(e) => {
            eprintln!("uroce peers: {e}");
            return ExitCode::from(2);
        }
    };
    let path = file.as_ref().map(|(_, p)| p.display().to_string());
    let file = file.map(|(f, _)| f).unwrap_or_default();
    let st = loader::evaluate(&file, false);
    let running: Vec<Value> = collect().into_iter().map(|p| json!({"pid": p["pid"], "name": p["name"]})).collect();
    if as_json {
        let v = json!({ "config": path, "clients": st, "loaded_in": running });
        println!("{}", serde_json::to_string_pretty(&v).unwrap());
        return ExitCode::SUCCESS;
    }
    println!("configuration: {}", path.as_deref().unwrap_or("none (defaults)"));
    for s in &st {
        if s.loaded {
            println!("{:<16} {:<8} loads, version {}", s.name, s.kind, s.version.as_deref().unwrap_or("?"));
        } else {
            println!("{:<16} {:<8} not loaded: {}", s.name, s.kind, s.reason.as_deref().unwrap_or("?"));
        }
    }
    for r in &running {
        println!("loaded in process {}: {}", r["pid"], r["name"].as_str().unwrap_or(""));
    }
    ExitCode::SUCCESS
}
