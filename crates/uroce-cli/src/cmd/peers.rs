//! `uroce peers`: peer-memory clients. Without a subcommand, the counters
//! every process using uroce publishes under
//! `<runtime dir>/<pid>/memory_peers/<client>/` (the user-space
//! `/sys/kernel/mm/memory_peers`); `uroce peers status` says which clients
//! the configuration loads, their versions, and why a client is not loaded.

use serde_json::{json, Value};
use std::process::ExitCode;
use uroce::mem::peer::{loader, COUNTERS};

#[derive(clap::Args)]
pub struct Args {
    #[command(subcommand)]
    cmd: Option<Sub>,
    /// Print JSON.
    #[arg(long, global = true)]
    json: bool,
}

#[derive(clap::Subcommand)]
enum Sub {
    /// Which clients the configuration loads, or why not (like
    /// `service nv_peer_mem status`).
    Status,
}

/// Every live process's published peer counters. The runtime directory is
/// read as `uroce stat` reads it: no link followed, regular files of at
/// most 4 KiB only; what is skipped is said on stderr.
fn collect() -> Vec<Value> {
    let mut out = Vec::new();
    let listing = uroce::runtime::live_processes();
    let mut skipped = listing.skipped;
    for (pid, dir) in &listing.processes {
        let Ok(peers) = dir.subdir_for_reading("memory_peers") else { continue };
        let mut names = peers.entries();
        names.sort();
        for name in names {
            let p = match peers.subdir_for_reading(&name) {
                Ok(p) => p,
                Err(e) => {
                    skipped.push(e.to_string());
                    continue;
                }
            };
            let mut read = |f: &str| match p.read_file(f, 4096, false) {
                Ok(b) => String::from_utf8_lossy(&b.unwrap_or_default()).trim().to_string(),
                Err(e) => {
                    skipped.push(format!("{}: {e}", p.path().join(f).display()));
                    String::new()
                }
            };
            let mut c = serde_json::Map::new();
            for counter in COUNTERS {
                c.insert(counter.to_string(), json!(read(counter).parse::<u64>().unwrap_or(0)));
            }
            let version = read("version");
            out.push(json!({ "pid": pid, "name": name, "version": version, "counters": c }));
        }
    }
    for s in &skipped {
        eprintln!("uroce peers: skipped {s}");
    }
    out
}

pub fn run(a: Args) -> ExitCode {
    match a.cmd {
        Some(Sub::Status) => status(a.json),
        None => {
            let peers = collect();
            if a.json {
                println!("{}", serde_json::to_string_pretty(&peers).unwrap());
                return ExitCode::SUCCESS;
            }
            print!("{:>8} {:<16} {:<8}", "pid", "client", "version");
            for c in COUNTERS {
                print!(" {:>18}", c);
            }
            println!();
            for p in &peers {
                print!(
                    "{:>8} {:<16} {:<8}",
                    p["pid"],
                    p["name"].as_str().unwrap_or(""),
                    p["version"].as_str().unwrap_or("")
                );
                for c in COUNTERS {
                    print!(" {:>18}", p["counters"][c]);
                }
                println!();
            }
            if peers.is_empty() {
                println!("(no process has peer-memory clients loaded)");
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
