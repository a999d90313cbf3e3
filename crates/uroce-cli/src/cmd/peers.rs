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

/// Every live process's published peer counters.
fn collect() -> Vec<Value> {
    let mut out = Vec::new();
    for (pid, dir) in uroce::runtime::live_processes() {
        let Ok(rd) = std::fs::read_dir(dir.join("memory_peers")) else { continue };
        let mut names: Vec<_> = rd.flatten().filter(|e| e.path().is_dir()).map(|e| e.path()).collect();
        names.sort();
        for p in names {
            let read = |f: &str| std::fs::read_to_string(p.join(f)).unwrap_or_default().trim().to_string();
            let mut c = serde_json::Map::new();
            for name in COUNTERS {
                c.insert(name.to_string(), json!(read(name).parse::<u64>().unwrap_or(0)));
            }
            out.push(json!({
                "pid": pid,
                "name": p.file_name().unwrap().to_string_lossy(),
                "version": read("version"),
                "counters": c,
            }));
        }
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
