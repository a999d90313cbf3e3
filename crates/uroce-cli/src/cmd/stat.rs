//! `uroce stat`: the counters of every process using uroce on this host,
//! read from what each publishes in the runtime directory (see
//! `uroce::verbs::publish`), as a table, JSON, or the Prometheus text format.

use serde_json::{json, Map, Value};
use std::collections::BTreeMap;
use std::process::ExitCode;
use std::time::Duration;

#[derive(clap::Args)]
pub struct Args {
    /// Print JSON: every process as published, and totals per device name.
    #[arg(long, conflicts_with = "prometheus")]
    json: bool,
    /// Print the Prometheus text exposition format.
    #[arg(long)]
    prometheus: bool,
    /// Show queue pairs and ODP regions too.
    #[arg(long)]
    qps: bool,
    /// Only devices of this name.
    #[arg(long)]
    device: Option<String>,
    /// Print again every SECS seconds (until interrupted, or --count times).
    #[arg(long, value_name = "SECS")]
    watch: Option<f64>,
    /// With --watch: stop after this many reports.
    #[arg(long)]
    count: Option<u64>,
}

/// Every live process's published statistics.
pub fn collect(device: Option<&str>) -> Vec<Value> {
    let mut out = Vec::new();
    for (_, dir) in uroce::runtime::live_processes() {
        let Ok(text) = std::fs::read_to_string(dir.join("stats.json")) else { continue };
        let Ok(mut v) = serde_json::from_str::<Value>(&text) else { continue };
        if let (Some(name), Some(devs)) = (device, v.get_mut("devices").and_then(Value::as_array_mut)) {
            devs.retain(|d| d["name"] == name);
        }
        out.push(v);
    }
    out
}

/// Sums of each device's counters over processes, by device name.
fn totals(procs: &[Value]) -> BTreeMap<String, BTreeMap<String, u64>> {
    let mut t: BTreeMap<String, BTreeMap<String, u64>> = BTreeMap::new();
    for p in procs {
        for d in p["devices"].as_array().into_iter().flatten() {
            let name = d["name"].as_str().unwrap_or("?").to_string();
            let e = t.entry(name).or_default();
            for section in ["stats", "odp"] {
                for (k, v) in d[section].as_object().into_iter().flatten() {
                    *e.entry(k.clone()).or_default() += v.as_u64().unwrap_or(0);
                }
            }
        }
    }
    t
}

fn drops(s: &Value) -> u64 {
    s.as_object().into_iter().flatten().filter(|(k, _)| k.starts_with("rx_drop_")).filter_map(|(_, v)| v.as_u64()).sum()
}

fn table(procs: &[Value], qps: bool) -> String {
    let mut o = String::new();
    let hdr = format!(
        "{:>8} {:<12} {:>12} {:>14} {:>12} {:>14} {:>8} {:>6} {:>6} {:>8}\n",
        "pid", "device", "tx_packets", "tx_bytes", "rx_packets", "rx_bytes", "retrans", "naks", "drops", "odp_flt"
    );
    o.push_str(&hdr);
    let row = |pid: &str, name: &str, s: &Value, odp: &Value| {
        let g = |k: &str| s[k].as_u64().unwrap_or(0);
        format!(
            "{:>8} {:<12} {:>12} {:>14} {:>12} {:>14} {:>8} {:>6} {:>6} {:>8}\n",
            pid,
            name,
            g("tx_packets"),
            g("tx_bytes"),
            g("rx_packets"),
            g("rx_bytes"),
            g("retransmits"),
            g("naks_sent") + g("naks_received"),
            drops(s),
            odp["page_faults"].as_u64().unwrap_or(0)
        )
    };
    for p in procs {
        let pid = p["pid"].to_string();
        for d in p["devices"].as_array().into_iter().flatten() {
            o.push_str(&row(&pid, d["name"].as_str().unwrap_or("?"), &d["stats"], &d["odp"]));
            if qps {
                for q in d["qps"].as_array().into_iter().flatten() {
                    let g = |k: &str| q["stats"][k].as_u64().unwrap_or(0);
                    o.push_str(&format!(
                        "{:>8}   qp {:#08x} {:<3} {:<4} -> {:#08x} @ {}  tx {} rx {} retrans {}\n",
                        "",
                        q["qpn"].as_u64().unwrap_or(0),
                        q["type"].as_str().unwrap_or(""),
                        q["state"].as_str().unwrap_or(""),
                        q["dest_qpn"].as_u64().unwrap_or(0),
                        q["peer"].as_str().unwrap_or("-"),
                        g("tx_packets"),
                        g("rx_packets"),
                        g("retransmits")
                    ));
                }
                for m in d["mrs"].as_array().into_iter().flatten() {
                    let f = |k: &str| m["odp"][k].as_u64().unwrap_or(0);
                    o.push_str(&format!(
                        "{:>8}   mr {:#010x} ODP faults {} ({} events) invalidations {} ({} events) prefetch {}\n",
                        "",
                        m["key"].as_u64().unwrap_or(0),
                        f("page_faults"),
                        f("page_faults_handled"),
                        f("page_invalidations"),
                        f("page_invalidations_handled"),
                        f("page_prefetch")
                    ));
                }
            }
        }
    }
    let t = totals(procs);
    if procs.len() > 1 {
        for (name, c) in &t {
            let s = Value::Object(c.iter().map(|(k, v)| (k.clone(), json!(v))).collect::<Map<_, _>>());
            o.push_str(&row("total", name, &s, &s));
        }
    }
    if procs.is_empty() {
        o.push_str("(no process is using uroce)\n");
    }
    o
}

/// Help texts of the exported metrics.
fn help(name: &str) -> &'static str {
    match name {
        "tx_packets" => "RoCE packets sent",
        "tx_bytes" => "UDP payload bytes sent",
        "rx_packets" => "RoCE packets received",
        "rx_bytes" => "UDP payload bytes received",
        "retransmits" => "packets sent again (go-back-N)",
        "timeouts" => "retransmission timer expiries",
        n if n.starts_with("rx_drop_") => "received packets dropped, by reason",
        n if n.starts_with("page_") => "on-demand paging counters (mlx5 meanings)",
        _ => "uroce transport counter",
    }
}

fn prometheus(procs: &[Value]) -> String {
    // Group samples by metric so each gets one HELP/TYPE header.
    let mut metrics: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for p in procs {
        let pid = p["pid"].to_string();
        for d in p["devices"].as_array().into_iter().flatten() {
            let dev = d["name"].as_str().unwrap_or("?");
            for section in ["stats", "odp"] {
                for (k, v) in d[section].as_object().into_iter().flatten() {
                    metrics
                        .entry(k.clone())
                        .or_default()
                        .push(format!("uroce_{k}_total{{pid=\"{pid}\",device=\"{dev}\"}} {}", v.as_u64().unwrap_or(0)));
                }
            }
            for q in d["qps"].as_array().into_iter().flatten() {
                for (k, v) in q["stats"].as_object().into_iter().flatten() {
                    metrics.entry(format!("qp_{k}")).or_default().push(format!(
                        "uroce_qp_{k}_total{{pid=\"{pid}\",device=\"{dev}\",qpn=\"{}\"}} {}",
                        q["qpn"].as_u64().unwrap_or(0),
                        v.as_u64().unwrap_or(0)
                    ));
                }
            }
        }
    }
    let mut o = String::new();
    for (k, samples) in metrics {
        let base = k.strip_prefix("qp_").unwrap_or(&k);
        o.push_str(&format!("# HELP uroce_{k}_total {}\n# TYPE uroce_{k}_total counter\n", help(base)));
        for s in samples {
            o.push_str(&s);
            o.push('\n');
        }
    }
    o
}

fn report(a: &Args) -> String {
    let procs = collect(a.device.as_deref());
    if a.json {
        let t = totals(&procs);
        serde_json::to_string_pretty(&json!({ "processes": procs, "totals": t })).unwrap() + "\n"
    } else if a.prometheus {
        prometheus(&procs)
    } else {
        table(&procs, a.qps)
    }
}

pub fn run(a: Args) -> ExitCode {
    match a.watch {
        None => print!("{}", report(&a)),
        Some(secs) => {
            if !secs.is_finite() || secs <= 0.0 {
                eprintln!("uroce stat: --watch needs a positive number of seconds");
                return ExitCode::from(2);
            }
            let mut n = 0u64;
            loop {
                print!("{}", report(&a));
                n += 1;
                if a.count.is_some_and(|c| n >= c) {
                    break;
                }
                println!();
                std::thread::sleep(Duration::from_secs_f64(secs));
            }
        }
    }
    ExitCode::SUCCESS
}
