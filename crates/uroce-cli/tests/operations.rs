//! Operations across processes: `uroce stat` (table, JSON, Prometheus)
//! watching another process's traffic, `uroce capture` switching capture in
//! a running process and around a command, `uroce peers`, configuration
//! errors, shell completions.

use serde_json::{json, Value};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

const UROCE: &str = env!("CARGO_BIN_EXE_uroce");

/// A fresh directory, removed when the test ends (its captures are tens of
/// megabytes).
struct TmpDir(PathBuf);

impl std::ops::Deref for TmpDir {
    type Target = Path;
    fn deref(&self) -> &Path {
        &self.0
    }
}

impl AsRef<std::ffi::OsStr> for TmpDir {
    fn as_ref(&self) -> &std::ffi::OsStr {
        self.0.as_os_str()
    }
}

impl Drop for TmpDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn tmpdir(tag: &str) -> TmpDir {
    let d = std::env::temp_dir().join(format!("uroce-ops-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    TmpDir(d)
}

fn uroce(rt: &Path, args: &[&str]) -> Output {
    Command::new(UROCE).args(args).env("UROCE_RUNTIME_DIR", rt).env_remove("UROCE_CONFIG").output().unwrap()
}

/// A `uroce demo` doing traffic for `secs` seconds, publishing into `rt`.
fn traffic(rt: &Path, secs: u32, port: u16, config: Option<&Path>) -> Child {
    traffic_command(rt, secs, port, config).spawn().unwrap()
}

fn traffic_command(rt: &Path, secs: u32, port: u16, config: Option<&Path>) -> Command {
    let mut c = Command::new(UROCE);
    c.args(["demo", "--duration", &secs.to_string(), "--port", &port.to_string()])
        .env("UROCE_RUNTIME_DIR", rt)
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    match config {
        Some(p) => c.env("UROCE_CONFIG", p),
        None => c.env_remove("UROCE_CONFIG"),
    };
    c
}

struct Reap(Child);
impl Drop for Reap {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn stat_json(rt: &Path) -> Value {
    let out = uroce(rt, &["stat", "--json"]);
    assert!(out.status.success());
    serde_json::from_slice(&out.stdout).unwrap()
}

/// `uroce stat --json --qps`: per-QP detail asked of each process.
fn stat_json_qps(rt: &Path) -> Value {
    let out = uroce(rt, &["stat", "--json", "--qps"]);
    assert!(out.status.success());
    serde_json::from_slice(&out.stdout).unwrap()
}

fn tx_of(v: &Value, device: &str) -> u64 {
    v["totals"][device]["tx_packets"].as_u64().unwrap_or(0)
}

/// Waits until `f` holds (at most 60 s: only a hang takes that long, however
/// busy the machine).
fn until(what: &str, mut f: impl FnMut() -> bool) {
    let t = Instant::now();
    while !f() {
        assert!(t.elapsed() < Duration::from_secs(60), "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn stat_and_capture_watch_another_process() {
    let rt = tmpdir("stat");
    let port = 31000 + (std::process::id() % 1000) as u16;
    let child = Reap(traffic(&rt, 6, port, None));
    let pid = child.0.id();
    until("the demo's counters", || tx_of(&stat_json(&rt), "demo-a") > 0);
    let first = tx_of(&stat_json(&rt), "demo-a");
    until("counters to move", || tx_of(&stat_json(&rt), "demo-a") > first);
    let v = stat_json(&rt);
    let dev = &v["processes"].as_array().unwrap().iter().find(|p| p["pid"] == pid).unwrap()["devices"][0];
    assert_eq!(dev["qp_count"], 1);
    assert!(dev.get("qps").is_none(), "per-QP detail only on request");
    let v = stat_json_qps(&rt);
    let proc_ =
        &v["processes"].as_array().unwrap().iter().find(|p| p["pid"] == pid).expect("the demo process")["devices"];
    let qps = proc_[0]["qps"].as_array().unwrap();
    assert_eq!(qps.len(), 1);
    assert_eq!(qps[0]["state"], "Rts");
    assert!(qps[0]["stats"]["tx_packets"].as_u64().unwrap() > 0, "per-QP counters");
    // Inline receive, per QP and per device.
    assert!(qps[0]["stats"]["rx_inline_recvs"].is_u64() && qps[0]["stats"]["rx_inline_bytes"].is_u64(), "{}", qps[0]);
    assert!(proc_[0]["stats"]["rx_inline_recvs"].is_u64(), "{}", proc_[0]);

    // Table and Prometheus.
    let table = String::from_utf8(uroce(&rt, &["stat", "--qps"]).stdout).unwrap();
    assert!(table.contains("demo-a") && table.contains("demo-b") && table.contains(" qp 0x"), "{table}");
    let prom = String::from_utf8(uroce(&rt, &["stat", "--prometheus"]).stdout).unwrap();
    let lines = prom.lines().map(|l| Ok(l.to_string()));
    let scrape = prometheus_parse::Scrape::parse(lines).expect("valid Prometheus text");
    let tx = scrape
        .samples
        .iter()
        .find(|s| s.metric == "uroce_tx_packets_total" && s.labels.get("device") == Some("demo-a"))
        .expect("tx sample");
    match tx.value {
        prometheus_parse::Value::Counter(c) => assert!(c > 0.0),
        ref other => panic!("not a counter: {other:?}"),
    }
    assert!(scrape.docs.contains_key("uroce_tx_packets_total"), "HELP text");
    assert!(scrape.docs.get("uroce_rx_inline_recvs_total").is_some_and(|h| h.contains("inline")), "{prom}");
    assert!(scrape.samples.iter().any(|s| s.metric == "uroce_rx_inline_bytes_total"), "{prom}");
    assert!(table.lines().next().unwrap().ends_with("inline_rx") && table.contains("inline_rx "), "{table}");
    // `rdma statistic show` layout: `link DEV/PORT` then name-value pairs.
    let rdma = String::from_utf8(uroce(&rt, &["stat", "--rdma"]).stdout).unwrap();
    let line = rdma.lines().find(|l| l.starts_with("link demo-a/1 ")).unwrap_or_else(|| panic!("{rdma}"));
    let words: Vec<&str> = line.split_whitespace().skip(2).collect();
    assert!(words.len() >= 12 && words.len() % 2 == 0, "{line}");
    let pairs: std::collections::HashMap<&str, u64> =
        words.chunks(2).map(|c| (c[0], c[1].parse::<u64>().unwrap_or_else(|_| panic!("{line}")))).collect();
    for name in ["out_of_sequence", "duplicate_request", "local_ack_timeout_err", "rnr_nak_retry_err", "tx_packets"] {
        assert!(pairs.contains_key(name), "{name}: {line}");
    }
    assert!(pairs["tx_packets"] > 0, "{line}");
    // `rdma resource show mr` layout for every region of the demo (it
    // registers a buffer on each device).
    let rdma = String::from_utf8(uroce(&rt, &["stat", "--rdma", "--qps"]).stdout).unwrap();
    let mr = rdma.lines().find(|l| l.starts_with("dev demo-a mrn ") && l.contains(" rkey ")).expect(&rdma);
    let f: Vec<&str> = mr.split_whitespace().collect();
    assert_eq!((f[4], f[6], f[8], f[10], f[12], f[14]), ("rkey", "lkey", "mrlen", "pdn", "pid", "comm"), "{mr}");
    assert_eq!(f[13], pid.to_string(), "{mr}");
    assert!(f[9].parse::<u64>().unwrap() > 0, "{mr}");

    // Capture in the running process, then stop; the file decodes clean.
    let pcap = rt.join("live.pcap");
    let out = uroce(&rt, &["capture", "--pid", &pid.to_string(), "--file", pcap.to_str().unwrap()]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    // The process answered: it captures. Stop once it has sent more.
    let started = tx_of(&stat_json(&rt), "demo-a");
    until("packets sent while capturing", || tx_of(&stat_json(&rt), "demo-a") > started + 10);
    let out = uroce(&rt, &["capture", "--pid", &pid.to_string(), "--stop"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    // A capture request never replaces an existing file.
    let out = uroce(&rt, &["capture", "--pid", &pid.to_string(), "--file", pcap.to_str().unwrap()]);
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(!out.status.success() && said.contains("capture file exists"), "{said}");
    let dec = uroce(&rt, &["decode", pcap.to_str().unwrap(), "--port", &port.to_string()]);
    let text = String::from_utf8_lossy(&dec.stdout);
    assert!(dec.status.success(), "{text}");
    assert!(text.contains("RC_RDMA_WRITE"), "{text}");
    assert!(text.contains("0 ICRC bad"), "{text}");

    // Not a uroce process.
    assert!(!uroce(&rt, &["capture", "--pid", "1", "--file", "/tmp/x.pcap"]).status.success());
    drop(child);
    until("the process's entry to go", || stat_json(&rt)["processes"].as_array().unwrap().is_empty());
}

#[test]
fn capture_around_a_command() {
    let rt = tmpdir("capcmd");
    let pcap = rt.join("cmd.pcap");
    let port = 33000 + (std::process::id() % 1000) as u16;
    let out = Command::new(UROCE)
        .args(["capture", "--file", pcap.to_str().unwrap(), "--", UROCE, "demo", "--port", &port.to_string()])
        .env("UROCE_RUNTIME_DIR", &rt)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let dec = uroce(&rt, &["decode", pcap.to_str().unwrap(), "--port", &port.to_string()]);
    assert!(dec.status.success());
    assert!(String::from_utf8_lossy(&dec.stdout).contains("RC_RDMA_READ_REQUEST"));
}

#[test]
fn peers_lists_configured_clients_of_running_processes() {
    let rt = tmpdir("peers");
    let cfg = rt.join("uroce.toml");
    let img = rt.join("ssd.img");
    std::fs::write(
        &cfg,
        format!(
            "[peers]\nload = [\"storage\"]\n[[peers.storage]]\nname = \"ssd-test\"\npath = \"{}\"\ncapacity = 65536\n",
            img.display()
        ),
    )
    .unwrap();
    let port = 35000 + (std::process::id() % 1000) as u16;
    let child = Reap(traffic(&rt, 4, port, Some(&cfg)));
    let pid = child.0.id();
    let mut peers = Value::Null;
    until("the peer client's counters", || {
        let out = uroce(&rt, &["peers", "--json", "--processes"]);
        peers = serde_json::from_slice(&out.stdout).unwrap_or(Value::Null);
        peers["processes"].as_array().is_some_and(|a| !a.is_empty())
    });
    let p = &peers["processes"][0];
    assert_eq!((&p["name"], &p["version"], &p["pid"]), (&json!("ssd-test"), &json!("1.0"), &json!(pid)));
    let total = &peers["clients"][0];
    assert_eq!((&total["name"], &total["version"]), (&json!("ssd-test"), &json!("1.0")));
    for c in [
        "num_alloc_mrs",
        "num_dealloc_mrs",
        "num_reg_pages",
        "num_dereg_pages",
        "num_reg_bytes",
        "num_dereg_bytes",
        "num_free_callbacks",
    ] {
        assert_eq!(p["counters"][c], 0, "{c}");
        assert_eq!(total["counters"][c], 0, "{c}");
    }
    // The table: rows line up with the header (numbers right-aligned under
    // their names), the host total first, then the process.
    let out = uroce(&rt, &["peers", "--processes"]);
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), 3, "{text}");
    assert!(lines[0].starts_with("pid ") && lines[0].ends_with("num_free_callbacks"), "{text}");
    assert!(lines[1].starts_with("all ") && lines[2].starts_with(&pid.to_string()), "{text}");
    assert!(lines.iter().all(|l| l.len() == lines[0].len()), "aligned:\n{text}");
    let col = lines[0].find("client").unwrap();
    assert_eq!(&lines[2][col..col + 8], "ssd-test", "{text}");
    // The process is killed (no exit handler runs): its client stays in the
    // host totals, folded by the next reader.
    drop(child);
    let out = uroce(&rt, &["peers", "--json", "--processes"]);
    let after: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(after["processes"], json!([]), "{after}");
    assert_eq!(after["clients"][0]["name"], "ssd-test", "{after}");
    assert_eq!(after["clients"][0]["exited_processes"]["num_alloc_mrs"], 0, "{after}");
    assert!(rt.join("memory_peers.exited/ssd-test").exists());
    let prom = String::from_utf8(uroce(&rt, &["stat", "--prometheus"]).stdout).unwrap();
    let scrape =
        prometheus_parse::Scrape::parse(prom.lines().map(|l| Ok(l.to_string()))).expect("valid Prometheus text");
    let m = scrape.samples.iter().find(|s| s.metric == "uroce_peer_num_alloc_mrs_total").expect(&prom);
    assert_eq!(m.labels.get("client"), Some("ssd-test"));
    assert!(img.exists(), "the storage device's file");
    // Status, as `service nv_peer_mem status`.
    let out = Command::new(UROCE).args(["peers", "status"]).env("UROCE_CONFIG", &cfg).output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}");
    assert!(text.contains("ssd-test") && text.contains("loads, version 1.0"), "{text}");
    assert!(text.contains("nv_mem") && text.contains("not loaded: not in [peers] load"), "{text}");
    let out = Command::new(UROCE).args(["peers", "status"]).env("UROCE_CONFIG", rt.join("none.toml")).output().unwrap();
    assert_eq!(out.status.code(), Some(2), "a missing UROCE_CONFIG is an error");
}

#[test]
fn bad_configuration_is_refused_with_line_and_field() {
    let rt = tmpdir("badcfg");
    let cfg = rt.join("bad.toml");
    std::fs::write(&cfg, "[[device]]\nname = \"x\"\nadress = \"127.0.0.9\"\n").unwrap();
    let out = Command::new(UROCE).args(["devices"]).env("UROCE_CONFIG", &cfg).output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains("line 3") && err.contains("adress") && err.contains("bad.toml"), "{err}");
    // A good file: its device is the one opened, the environment overrides.
    std::fs::write(&cfg, "[[device]]\nname = \"cfgdev\"\naddress = \"127.0.0.93\"\nmtu = 1024\n").unwrap();
    let out = Command::new(UROCE).args(["devices"]).env("UROCE_CONFIG", &cfg).output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}{}", String::from_utf8_lossy(&out.stderr));
    assert!(text.contains("cfgdev") && text.contains("1024"), "{text}");
    let out =
        Command::new(UROCE).args(["devices"]).env("UROCE_CONFIG", &cfg).env("UROCE_MTU", "2048").output().unwrap();
    assert!(String::from_utf8_lossy(&out.stdout).contains("2048"));
    // Every configured device is listed.
    std::fs::write(
        &cfg,
        "[[device]]\nname = \"one\"\naddress = \"127.0.0.94\"\n[[device]]\nname = \"two\"\naddress = \"127.0.0.95\"\n",
    )
    .unwrap();
    let out = Command::new(UROCE).args(["devices"]).env("UROCE_CONFIG", &cfg).output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("hca_id: one") && text.contains("hca_id: two") && text.contains("127.0.0.95"), "{text}");
}

#[test]
fn completions_and_help() {
    let out = Command::new(UROCE).args(["completions", "bash"]).output().unwrap();
    assert!(out.status.success());
    assert!(String::from_utf8_lossy(&out.stdout).contains("complete -F"));
    for sub in ["stat", "peers", "capture", "decode", "demo", "devices"] {
        let out = Command::new(UROCE).args([sub, "--help"]).output().unwrap();
        assert!(out.status.success(), "{sub} --help");
        assert!(String::from_utf8_lossy(&out.stdout).contains("Usage:"));
    }
}

/// `uroce peers stop|start [client]` (nv_peer_mem's service): the state
/// file running processes read at each registration, and the configuration's
/// `[peers] disabled` (comments kept) for new processes; `status` tells.
#[test]
fn peers_start_and_stop_a_client() {
    let rt = tmpdir("peers-svc");
    let cfg = rt.join("uroce.toml");
    let img = rt.join("ssd.img");
    std::fs::write(
        &cfg,
        format!(
            "# my devices\n[peers]\nload = [\"storage\"] # only storage\n[[peers.storage]]\nname = \"ssd-svc\"\npath = \"{}\"\ncapacity = 65536\n",
            img.display()
        ),
    )
    .unwrap();
    let run = |args: &[&str]| {
        Command::new(UROCE).args(args).env("UROCE_RUNTIME_DIR", &rt).env("UROCE_CONFIG", &cfg).output().unwrap()
    };
    let status = |_: ()| -> Value { serde_json::from_slice(&run(&["peers", "status", "--json"]).stdout).unwrap() };
    assert_eq!(status(())["clients"][0]["started"], true);
    let out = run(&["peers", "stop", "ssd-svc"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let text = std::fs::read_to_string(&cfg).unwrap();
    assert!(text.contains("# my devices") && text.contains("# only storage"), "comments kept:\n{text}");
    assert!(text.contains("disabled = [\"ssd-svc\"]"), "{text}");
    assert_eq!(std::fs::read_to_string(rt.join("memory_peers.state")).unwrap(), "ssd-svc stopped\n");
    assert_eq!(status(())["clients"][0]["started"], false);
    let out = run(&["peers", "status", "ssd-svc"]);
    assert!(String::from_utf8_lossy(&out.stdout).contains("loads, version 1.0, stopped"));
    // Without a name: every configured client.
    let out = run(&["peers", "start"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let text = std::fs::read_to_string(&cfg).unwrap();
    assert!(text.contains("disabled = []"), "{text}");
    assert_eq!(std::fs::read_to_string(rt.join("memory_peers.state")).unwrap(), "ssd-svc started\n");
    assert_eq!(status(())["clients"][0]["started"], true);
    // Bad names and unknown clients: refused, nothing written.
    assert_eq!(run(&["peers", "stop", "a/b"]).status.code(), Some(2));
    assert_eq!(run(&["peers", "status", "nope"]).status.code(), Some(3));
    let (cfg_before, state_before) =
        (std::fs::read_to_string(&cfg).unwrap(), std::fs::read_to_string(rt.join("memory_peers.state")).unwrap());
    for verb in ["stop", "start"] {
        let out = run(&["peers", verb, "nosuch"]);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{verb} nosuch: {err}");
        assert!(err.contains("unknown client \"nosuch\"") && err.contains("ssd-svc"), "{err}");
        assert!(out.stdout.is_empty(), "{verb} nosuch printed {}", String::from_utf8_lossy(&out.stdout));
    }
    assert_eq!(std::fs::read_to_string(&cfg).unwrap(), cfg_before);
    assert_eq!(std::fs::read_to_string(rt.join("memory_peers.state")).unwrap(), state_before);
    // `status`: 0 while every client to load loads and is started (nv_mem
    // is not in [peers] load here), 3 once one is stopped.
    assert_eq!(run(&["peers", "status"]).status.code(), Some(0));
    assert_eq!(run(&["peers", "status", "--json"]).status.code(), Some(0));
    assert!(run(&["peers", "stop", "ssd-svc"]).status.success());
    assert_eq!(run(&["peers", "status"]).status.code(), Some(3));
    assert_eq!(run(&["peers", "status", "--json"]).status.code(), Some(3));
    assert!(run(&["peers", "start", "ssd-svc"]).status.success());
    assert_eq!(run(&["peers", "status"]).status.code(), Some(0));
    // A known client that cannot load: start records the setting but says
    // it did not load, and fails.
    let out = run(&["peers", "start", "nv_mem"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains("nv_mem is started but does not load: not in [peers] load"), "{err}");
    // Asked to load nv_mem: status is 0 only where it loads (libcuda and a
    // GPU), else 3 with the reason.
    let text =
        std::fs::read_to_string(&cfg).unwrap().replace("load = [\"storage\"]", "load = [\"storage\", \"nv_mem\"]");
    std::fs::write(&cfg, text).unwrap();
    let v = status(());
    let nv = v["clients"].as_array().unwrap().iter().find(|c| c["name"] == "nv_mem").expect("nv_mem listed").clone();
    let out = run(&["peers", "status"]);
    let want = if nv["loaded"] == true { 0 } else { 3 };
    assert_eq!(out.status.code(), Some(want), "{nv}: {}", String::from_utf8_lossy(&out.stdout));
    if want == 3 {
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(text.lines().any(|l| l.starts_with("nv_mem ") && l.contains("not loaded: ")), "{text}");
    }
}

/// A process killed with SIGKILL runs no exit handler: its `<pid>/`
/// directory (stats.json) and its devices' link sockets stay behind until
/// the next reader (`uroce stat`) reaps them; a live process's are kept.
#[test]
fn what_a_sigkilled_process_left_is_reaped() {
    let rt = tmpdir("reap");
    let port = 37000 + (std::process::id() % 1000) as u16;
    // With the same-host link on, whatever the pass (its sockets are what
    // is reaped; UROCE_LINK=udp, the suite's second pass, makes none).
    let linked = |port| traffic_command(&rt, 120, port, None).env("UROCE_LINK", "auto").spawn().unwrap();
    let mut killed = Reap(linked(port));
    let pid = killed.0.id();
    let links = rt.join("links");
    let sockets = |dir: &Path| -> Vec<String> {
        std::fs::read_dir(dir)
            .into_iter()
            .flatten()
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .filter(|n| n.ends_with(&format!("-{port}")))
            .collect()
    };
    until("the demo's stats.json and its two link sockets", || {
        rt.join(pid.to_string()).join("stats.json").exists() && sockets(&links).len() == 2
    });
    // A live process beside it, on another port: untouched by the reaping.
    let live = Reap(linked(port + 1));
    let live_pid = live.0.id();
    until("the live demo's stats.json", || rt.join(live_pid.to_string()).join("stats.json").exists());
    killed.0.kill().unwrap(); // SIGKILL
    killed.0.wait().unwrap();
    assert!(rt.join(pid.to_string()).join("stats.json").exists(), "left behind by SIGKILL");
    assert_eq!(sockets(&links).len(), 2, "left behind by SIGKILL");
    // Link sockets are reaped once older than the reader's listing of bound
    // sockets (a second's margin): wait, bounded.
    let t = Instant::now();
    loop {
        let out = uroce(&rt, &["stat", "--json"]);
        assert!(out.status.success());
        if !rt.join(pid.to_string()).exists() && sockets(&links).is_empty() {
            break;
        }
        assert!(t.elapsed() < Duration::from_secs(60), "not reaped: {:?}", std::fs::read_dir(&*rt).map(|d| d.count()));
        std::thread::sleep(Duration::from_millis(200));
    }
    let v = stat_json(&rt);
    let pids: Vec<u64> = v["processes"].as_array().unwrap().iter().filter_map(|p| p["pid"].as_u64()).collect();
    assert_eq!(pids, vec![live_pid as u64], "{v}");
    assert!(rt.join(live_pid.to_string()).join("start_time").exists());
    let live_port = format!("-{}", port + 1);
    let kept =
        std::fs::read_dir(&links).unwrap().flatten().filter(|e| e.file_name().to_string_lossy().ends_with(&live_port));
    assert_eq!(kept.count(), 2, "the live process's link sockets are kept");
    drop(live);
}
