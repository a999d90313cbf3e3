//! `uroce peers`: peer-memory clients. Without a subcommand, the host's
//! counters per client (the user-space `/sys/kernel/infiniband/memory_peers`):
//! what every live process publishes under
//! `<runtime dir>/<pid>/memory_peers/<client>/` plus the totals folded from
//! processes that have exited (see `uroce::mem::peer::totals`), row `all`;
//! `--processes` adds a row per live process. `uroce peers status` says
//! which clients the configuration loads, their versions, and why a client
//! is not loaded.
//!
//! Exit codes (as an init script's, `service nv_peer_mem`):
//! * `status`: 0 when every client the configuration asks to load (its
//!   `[peers] load`, all kinds without one) loads and is started; 3 when one
//!   of them does not load or is stopped, or the named client is neither
//!   configured nor loaded anywhere; 2 for a configuration that does not
//!   parse.
//! * `start`/`stop`: 0 done; 2 an unknown or invalid client name (nothing is
//!   written) or a bad configuration; 1 the state could not be written, or
//!   (start) a client is now started but cannot load, with the reason.

use serde_json::{json, Value};
use std::process::ExitCode;
use uroce::mem::peer::{loader, service, totals, PeerStats, COUNTERS};

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
    /// Which clients the configuration loads, or why not, and whether each
    /// is started (like `service nv_peer_mem status`). Exits 0 when every
    /// client to load loads and is started, 3 otherwise.
    Status { client: Option<String> },
    /// Starts a client (every configured one without a name): new
    /// registrations of running processes go through it again, and the
    /// configuration's `[peers] disabled` no longer names it.
    Start { client: Option<String> },
    /// Stops a client: no new registration of a running process goes
    /// through it (regions it backs keep working), and the configuration's
    /// `[peers] disabled` names it, so new processes start it stopped.
    Stop { client: Option<String> },
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
        Some(Sub::Status { client }) => status(a.json, client.as_deref()),
        Some(Sub::Start { client }) => start_stop(client, true),
        Some(Sub::Stop { client }) => start_stop(client, false),
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

/// The state file's entries (see `uroce::mem::peer::service`).
fn runtime_state() -> std::collections::BTreeMap<String, bool> {
    let root = uroce::runtime::runtime_dir();
    match uroce::runtime::SafeDir::open_owned(&root) {
        Ok(rt) if std::fs::symlink_metadata(&root).is_ok() => service::read_state(&rt),
        _ => Default::default(),
    }
}

/// Whether `name` is started: the state file, else the configuration.
fn started(name: &str, file: &uroce::config::ConfigFile, state: &std::collections::BTreeMap<String, bool>) -> bool {
    state.get(name).copied().unwrap_or_else(|| !file.peers.disabled.iter().any(|d| d == name))
}

fn start_stop(client: Option<String>, start: bool) -> ExitCode {
    let verb = if start { "start" } else { "stop" };
    let loaded = match uroce::config::ConfigFile::load() {
        Ok(f) => f,
        Err(e) => {
            eprintln!("uroce peers {verb}: {e}");
            return ExitCode::from(2);
        }
    };
    let names: Vec<String> = match client {
        Some(c) => vec![c],
        None => {
            let file = loaded.as_ref().map(|(f, _)| f.clone()).unwrap_or_default();
            loader::evaluate(&file, false).into_iter().filter(|s| s.loaded).map(|s| s.name).collect()
        }
    };
    if let Some(n) = names.iter().find(|n| !service::valid_name(n)) {
        eprintln!("uroce peers {verb}: invalid client name {n:?} (1 to 63 bytes, no '/' or space)");
        return ExitCode::from(2);
    }
    if names.is_empty() {
        eprintln!("uroce peers {verb}: no client is configured to load; name one");
        return ExitCode::from(2);
    }
    // Only clients that exist: configured (of a known kind), or loaded in a
    // running process; a misspelt name must not be written anywhere.
    let file = loaded.as_ref().map(|(f, _)| f.clone()).unwrap_or_default();
    let statuses: Vec<_> =
        loader::evaluate(&file, false).into_iter().filter(|s| loader::KINDS.contains(&s.kind.as_str())).collect();
    let running = collect();
    let known = |n: &str| statuses.iter().any(|s| s.name == n) || running.iter().any(|p| p["name"] == n);
    if let Some(n) = names.iter().find(|n| !known(n)) {
        let mut all: Vec<&str> = statuses.iter().map(|s| s.name.as_str()).collect();
        all.extend(running.iter().filter_map(|p| p["name"].as_str()));
        all.sort_unstable();
        all.dedup();
        eprintln!(
            "uroce peers {verb}: unknown client {n:?}: neither configured nor loaded in a running process (clients: {})",
            all.join(", ")
        );
        return ExitCode::from(2);
    }
    // Running processes: the state file of the runtime directory.
    let root = uroce::runtime::runtime_dir();
    let access = match &loaded {
        Some((f, _)) if f.stats.world_readable => uroce::runtime::Access::WorldReadable,
        _ => uroce::runtime::Access::Private,
    };
    let r = uroce::runtime::SafeDir::create_or_open(&root, access)
        .map_err(|e| e.to_string())
        .and_then(|rt| service::set_state(&rt, &names, start, access.file_mode()).map_err(|e| e.to_string()));
    if let Err(e) = r {
        eprintln!("uroce peers {verb}: {e}");
        return ExitCode::FAILURE;
    }
    // New processes: the configuration file's `[peers] disabled`.
    match &loaded {
        Some((_, path)) => {
            if let Err(e) = persist(path, &names, start) {
                eprintln!("uroce peers {verb}: {}: {e}", path.display());
                return ExitCode::FAILURE;
            }
            println!(
                "{}: {} (running processes and {})",
                names.join(", "),
                if start { "started" } else { "stopped" },
                path.display()
            );
        }
        None => println!(
            "{}: {} in running processes (no configuration file: new processes use the defaults)",
            names.join(", "),
            if start { "started" } else { "stopped" }
        ),
    }
    // Started is a setting; a client that cannot load serves nothing until
    // it can: say so, and fail as a service whose start did not take.
    let mut code = ExitCode::SUCCESS;
    if start {
        for n in &names {
            let loads_here = statuses.iter().any(|s| &s.name == n && s.loaded);
            if !loads_here && !running.iter().any(|p| p["name"] == n.as_str()) {
                let why = statuses.iter().find(|s| &s.name == n).and_then(|s| s.reason.clone());
                eprintln!(
                    "uroce peers start: {n} is started but does not load: {}; no registration goes through it until it loads",
                    why.as_deref().unwrap_or("not configured")
                );
                code = ExitCode::FAILURE;
            }
        }
    }
    code
}

/// Adds `names` to (stop) or removes them from (start) `[peers] disabled`
/// of the configuration file, keeping the rest of it (comments included);
/// the file is replaced atomically (new file beside it, then rename).
fn persist(path: &std::path::Path, names: &[String], start: bool) -> Result<(), String> {
    use std::io::Write;
    use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
    let meta = std::fs::symlink_metadata(path).map_err(|e| e.to_string())?;
    if !meta.file_type().is_file() {
        return Err("not a regular file (not followed)".into());
    }
    if meta.len() > 1 << 20 {
        return Err("larger than 1 MiB".into());
    }
    let text = std::fs::read_to_string(path).map_err(|e| e.to_string())?;
    let mut doc: toml_edit::DocumentMut = text.parse().map_err(|e| format!("{e}"))?;
    let peers = doc.entry("peers").or_insert(toml_edit::table());
    let peers = peers.as_table_mut().ok_or("`peers` is not a table")?;
    let list = peers.entry("disabled").or_insert(toml_edit::value(toml_edit::Array::new()));
    let arr = list.as_array_mut().ok_or("`peers.disabled` is not an array")?;
    for n in names {
        arr.retain(|v| v.as_str() != Some(n));
        if !start {
            arr.push(n.as_str());
        }
    }
    let out = doc.to_string();
    // The result must still be a valid configuration.
    uroce::config::ConfigFile::parse(&out, path).map_err(|e| format!("the edited file would not parse: {e}"))?;
    let dir = path.parent().filter(|p| !p.as_os_str().is_empty()).unwrap_or(std::path::Path::new("."));
    let tmp = dir.join(format!(
        ".{}.{}.tmp",
        path.file_name().and_then(|n| n.to_str()).unwrap_or("uroce.toml"),
        std::process::id()
    ));
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .custom_flags(libc::O_NOFOLLOW)
        .mode(meta.permissions().mode() & 0o777)
        .open(&tmp)
        .map_err(|e| format!("{}: {e}", tmp.display()))?;
    let r = f.write_all(out.as_bytes()).and_then(|()| f.sync_all()).and_then(|()| std::fs::rename(&tmp, path));
    if let Err(e) = r {
        let _ = std::fs::remove_file(&tmp);
        return Err(e.to_string());
    }
    Ok(())
}

fn status(as_json: bool, only: Option<&str>) -> ExitCode {
    let file = match uroce::config::ConfigFile::load() {
        Ok(f) => f,
        Err(e) => {
            eprintln!("uroce peers: {e}");
            return ExitCode::from(2);
        }
    };
    let path = file.as_ref().map(|(_, p)| p.display().to_string());
    let file = file.map(|(f, _)| f).unwrap_or_default();
    let state = runtime_state();
    let st: Vec<_> = loader::evaluate(&file, false).into_iter().filter(|s| only.is_none_or(|o| o == s.name)).collect();
    let running: Vec<Value> = collect().into_iter().filter(|p| only.is_none_or(|o| p["name"] == o)).collect();
    if as_json {
        let clients: Vec<Value> = st
            .iter()
            .map(|s| {
                let mut v = serde_json::to_value(s).unwrap();
                v["started"] = json!(started(&s.name, &file, &state));
                v
            })
            .collect();
        let v = json!({ "config": path, "clients": clients, "loaded_in": running });
        println!("{}", serde_json::to_string_pretty(&v).unwrap());
        return status_code(&st, &file, &state, only, &running);
    }
    println!("configuration: {}", path.as_deref().unwrap_or("none (defaults)"));
    for s in &st {
        let run = if started(&s.name, &file, &state) { "started" } else { "stopped" };
        if s.loaded {
            println!("{:<16} {:<8} loads, version {}, {run}", s.name, s.kind, s.version.as_deref().unwrap_or("?"));
        } else {
            println!("{:<16} {:<8} not loaded: {}", s.name, s.kind, s.reason.as_deref().unwrap_or("?"));
        }
    }
    for r in &running {
        println!("loaded in process {}: {}", r["pid"], r["name"].as_str().unwrap_or(""));
    }
    if only.is_some() && st.is_empty() && running.is_empty() {
        println!("{}: not configured and not loaded in any process", only.unwrap_or(""));
    }
    status_code(&st, &file, &state, only, &running)
}

/// `status`'s exit code (module docs): 3, as an init script's status of a
/// service that is not running, when a client the configuration asks to
/// load does not load or is stopped, or the named one exists nowhere.
fn status_code(
    st: &[loader::ClientStatus],
    file: &uroce::config::ConfigFile,
    state: &std::collections::BTreeMap<String, bool>,
    only: Option<&str>,
    running: &[Value],
) -> ExitCode {
    if only.is_some() && st.is_empty() && running.is_empty() {
        return ExitCode::from(3);
    }
    let wanted = |kind: &str| file.peers.load.as_ref().is_none_or(|l| l.iter().any(|k| k == kind));
    let down = st.iter().any(|s| wanted(&s.kind) && (!s.loaded || !started(&s.name, file, state)));
    if down {
        ExitCode::from(3)
    } else {
        ExitCode::SUCCESS
    }
}
