//! `uroce stat`: the counters of every process using uroce on this host,
//! read from what each publishes in the runtime directory (see
//! `uroce::verbs::publish`), as a table, JSON, or the Prometheus text format.
//!
//! The runtime directory is treated as hostile: only regular files are read
//! (opened non-blocking, never through a link, at most [`MAX_FILE`] bytes),
//! whatever else is there is reported as skipped on stderr (and under
//! `"skipped"` in JSON), and totals saturate at `u64::MAX` instead of
//! wrapping. Per-QP detail (`--qps`) is asked of each process
//! (`qps.request`) and waited for at most [`DETAIL_WAIT`].

use serde_json::{json, Map, Value};
use std::collections::BTreeMap;
use std::process::ExitCode;
use std::time::{Duration, Instant};
use uroce::runtime::SafeDir;

/// The largest statistics file read.
pub const MAX_FILE: u64 = 64 << 20;
/// How long `--qps` waits for the processes' per-QP detail.
pub const DETAIL_WAIT: Duration = Duration::from_secs(3);

#[derive(clap::Args)]
pub struct Args {
    /// Print JSON: every process as published, and totals per device name.
    #[arg(long, conflicts_with = "prometheus")]
    json: bool,
    /// Print the Prometheus text exposition format.
    #[arg(long)]
    prometheus: bool,
    /// Print as iproute2's `rdma statistic show` does for an mlx5 device
    /// (`link DEV/1 name value …`, mlx5 counter names, the device's ODP
    /// counters summed over its regions), and with --qps each
    /// ODP region as `rdma statistic mr show` (`dev DEV mrn N page_faults …`).
    #[arg(long, conflicts_with_all = ["json", "prometheus"])]
    rdma: bool,
    /// Show queue pairs and ODP regions too (asked of each process; in the
    /// table, JSON and Prometheus output).
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

/// Reads JSON file `name` of a process directory; `Err`: skipped, and why.
fn read_json(dir: &SafeDir, name: &str) -> Result<Option<Value>, String> {
    let p = dir.path().join(name);
    match dir.read_file(name, MAX_FILE, false) {
        Ok(None) => Ok(None),
        Ok(Some(b)) => serde_json::from_slice(&b).map(Some).map_err(|e| format!("{}: not JSON: {e}", p.display())),
        Err(e) => Err(format!("{}: {e}", p.display())),
    }
}

/// Every live process's published statistics (with per-QP detail when
/// `qps`), and what was skipped.
pub fn collect(device: Option<&str>, qps: bool) -> (Vec<Value>, Vec<String>) {
    let listing = uroce::runtime::live_processes();
    let mut skipped = listing.skipped;
    let mut found: Vec<(&SafeDir, Value)> = Vec::new();
    for (_, dir) in &listing.processes {
        match read_json(dir, "stats.json") {
            Ok(Some(v)) => found.push((dir, v)),
            Ok(None) => {}
            Err(e) => skipped.push(e),
        }
    }
    if qps {
        let asked: Vec<bool> = found
            .iter()
            .map(|(dir, _)| {
                let _ = dir.remove("qps.json");
                dir.write_file("qps.request", b"qps\n", 0o600).is_ok()
            })
            .collect();
        let t = Instant::now();
        let mut pending: Vec<usize> = (0..found.len()).filter(|&i| asked[i]).collect();
        while !pending.is_empty() && t.elapsed() < DETAIL_WAIT {
            pending.retain(|&i| match read_json(found[i].0, "qps.json") {
                Ok(Some(detail)) => {
                    merge_detail(&mut found[i].1, &detail);
                    false
                }
                Ok(None) => true,
                Err(e) => {
                    skipped.push(e);
                    false
                }
            });
            if !pending.is_empty() {
                std::thread::sleep(Duration::from_millis(20));
            }
        }
        for i in pending {
            skipped.push(format!("{}: no per-QP detail within {DETAIL_WAIT:?}", found[i].0.path().display()));
        }
    }
    let out = found
        .into_iter()
        .map(|(_, mut v)| {
            if let (Some(name), Some(devs)) = (device, v.get_mut("devices").and_then(Value::as_array_mut)) {
                devs.retain(|d| d["name"] == name);
            }
            v
        })
        .collect();
    (out, skipped)
}

/// Puts the `qps` and `mrs` of `detail` (a `qps.json`) into the devices of
/// `stats` of the same name.
fn merge_detail(stats: &mut Value, detail: &Value) {
    for d in stats["devices"].as_array_mut().into_iter().flatten() {
        if let Some(q) = detail["devices"].as_array().into_iter().flatten().find(|q| q["name"] == d["name"]) {
            d["qps"] = q["qps"].clone();
            d["mrs"] = q["mrs"].clone();
        }
    }
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
                    let c = e.entry(k.clone()).or_default();
                    *c = c.saturating_add(counter(v));
                }
            }
        }
    }
    t
}

/// A published counter: a number up to `u64::MAX` (larger saturates).
fn counter(v: &Value) -> u64 {
    v.as_u64().unwrap_or_else(|| if v.as_f64().is_some_and(|f| f >= u64::MAX as f64) { u64::MAX } else { 0 })
}

fn drops(s: &Value) -> u64 {
    s.as_object()
        .into_iter()
        .flatten()
        .filter(|(k, _)| k.starts_with("rx_drop_"))
        .fold(0u64, |a, (_, v)| a.saturating_add(counter(v)))
}

/// The columns of the `uroce stat` table: name, right-aligned, minimum width.
const COLUMNS: [(&str, bool, u16); 11] = [
    ("pid", true, 8),
    ("device", false, 12),
    ("tx_packets", true, 12),
    ("tx_bytes", true, 14),
    ("rx_packets", true, 12),
    ("rx_bytes", true, 14),
    ("retrans", true, 8),
    ("naks", true, 6),
    ("drops", true, 6),
    ("odp_flt", true, 8),
    ("inline_rx", true, 10),
];

fn table(procs: &[Value], qps: bool) -> String {
    // Each device row, and the detail lines printed under it.
    let mut rows: Vec<Vec<String>> = Vec::new();
    let mut details: Vec<String> = Vec::new();
    let row = |pid: &str, name: &str, s: &Value, odp: &Value| {
        let g = |k: &str| counter(&s[k]);
        vec![
            pid.to_string(),
            name.to_string(),
            g("tx_packets").to_string(),
            g("tx_bytes").to_string(),
            g("rx_packets").to_string(),
            g("rx_bytes").to_string(),
            g("retransmits").to_string(),
            g("naks_sent").saturating_add(g("naks_received")).to_string(),
            drops(s).to_string(),
            odp["page_faults"].as_u64().unwrap_or(0).to_string(),
            g("rx_inline_recvs").to_string(),
        ]
    };
    for p in procs {
        let pid = p["pid"].to_string();
        for d in p["devices"].as_array().into_iter().flatten() {
            rows.push(row(&pid, d["name"].as_str().unwrap_or("?"), &d["stats"], &d["odp"]));
            let mut o = link_lines(&d["links"]);
            if qps {
                for q in d["qps"].as_array().into_iter().flatten() {
                    let g = |k: &str| q["stats"][k].as_u64().unwrap_or(0);
                    o.push_str(&format!(
                        "{:>8}   qp {:#08x} {:<3} {:<4} -> {:#08x} @ {}  tx {} rx {} retrans {} inline_rx {} ({} B)\n",
                        "",
                        q["qpn"].as_u64().unwrap_or(0),
                        q["type"].as_str().unwrap_or(""),
                        q["state"].as_str().unwrap_or(""),
                        q["dest_qpn"].as_u64().unwrap_or(0),
                        q["peer"].as_str().unwrap_or("-"),
                        g("tx_packets"),
                        g("rx_packets"),
                        g("retransmits"),
                        g("rx_inline_recvs"),
                        g("rx_inline_bytes")
                    ));
                }
                for m in d["mrs"].as_array().into_iter().flatten().filter(|m| m["odp"].is_object()) {
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
            details.push(o);
        }
    }
    let t = totals(procs);
    if procs.len() > 1 {
        for (name, c) in &t {
            let s = Value::Object(c.iter().map(|(k, v)| (k.clone(), json!(v))).collect::<Map<_, _>>());
            rows.push(row("total", name, &s, &s));
            details.push(String::new());
        }
    }
    let cols: Vec<super::table::Col> =
        COLUMNS.iter().map(|&(name, right, min)| super::table::Col { name, right, min }).collect();
    let mut o = String::new();
    let lines = super::table::lines(&cols, &rows, 1);
    for (i, l) in lines.iter().enumerate() {
        o.push_str(l);
        o.push('\n');
        if let Some(d) = i.checked_sub(1).and_then(|k| details.get(k)) {
            o.push_str(d);
        }
    }
    if procs.is_empty() {
        o.push_str("(no process is using uroce)\n");
    }
    o
}

/// One line per peer of a device: the medium (the same-host shared-memory
/// link or UDP) and the packets and bytes each carried.
fn link_lines(links: &Value) -> String {
    let mut o = String::new();
    for l in links.as_array().into_iter().flatten() {
        let g = |k: &str| counter(&l[k]);
        let pid = l["pid"].as_u64().map(|p| format!(" pid {p}")).unwrap_or_default();
        o.push_str(&format!(
            "{:>8}   link -> {} by {}{pid}: memory tx {} ({} B) rx {} ({} B), udp tx {} ({} B) rx {} ({} B), ring-full drops {}\n",
            "",
            l["peer"].as_str().unwrap_or("?"),
            l["medium"].as_str().unwrap_or("?"),
            g("shm_tx_packets"),
            g("shm_tx_bytes"),
            g("shm_rx_packets"),
            g("shm_rx_bytes"),
            g("udp_tx_packets"),
            g("udp_tx_bytes"),
            g("udp_rx_packets"),
            g("udp_rx_bytes"),
            g("ring_full_drops"),
        ));
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
        "rx_inline_recvs" => "receives completed inline (scatter-to-CQE, copied at poll time)",
        "rx_inline_bytes" => "message bytes of receives completed inline",
        "copies_deferred" => "copies that might block (peer memory, ODP faults) run by copy workers outside the engine",
        "fault_rnr_naks" => "RNR NAKs answering requests that met an ODP page fault (as mlx5)",
        "timeouts_behind_copies" => "retransmission timeouts not counted: the QP waited for its own copy job",
        "rx_drop_busy" => "received packets dropped: too many waited behind their QP's copy job",
        "rx_icrc_solved_id" => {
            "IPv4 packets accepted with an IP ID solved from the ICRC (peers that send hashed IDs, rxe)"
        }
        "rx_icrc_peers_learned" => "peers learned to send hashed IPv4 IDs (Linux rxe)",
        "rx_icrc_solved_refused" => "IPv4 packets whose ID solved but whose sender uses uroce's IDs: dropped",
        n if n.starts_with("rx_drop_") => "received packets dropped, by reason",
        n if n.starts_with("page_") => "on-demand paging counters (mlx5 meanings)",
        _ => "uroce transport counter",
    }
}

/// A label value of the Prometheus text format: `\\`, `"` and newline
/// escaped.
fn label(v: &str) -> String {
    v.replace('\\', "\\\\").replace('"', "\\\"").replace('\n', "\\n")
}

/// The Prometheus text exposition format 0.0.4, hand-written: see "Hand-written
/// or library" in docs/architecture.md for why not prometheus-client.
fn prometheus(procs: &[Value]) -> String {
    // Group samples by metric so each gets one HELP/TYPE header.
    let mut metrics: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for p in procs {
        let pid = p["pid"].to_string();
        for d in p["devices"].as_array().into_iter().flatten() {
            let dev = label(d["name"].as_str().unwrap_or("?"));
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
    o.push_str(&peer_metrics(&uroce::mem::peer::totals::host().totals));
    o
}

/// uroce counters under the mlx5 hw_counters names of the same meaning
/// (`/sys/class/infiniband/mlx5_*/ports/1/hw_counters`, shown by `rdma
/// statistic show`); the others follow under uroce's names.
const MLX5_NAMES: [(&str, &str); 6] = [
    ("out_of_buffer", "rx_drop_no_recv"),
    ("out_of_sequence", "rx_out_of_sequence"),
    ("duplicate_request", "rx_duplicates"),
    ("rnr_nak_retry_err", "rnr_naks_received"),
    ("local_ack_timeout_err", "timeouts"),
    ("packet_seq_err", "seq_naks_received"),
];

/// `rdma statistic show` / `rdma statistic mr show` layout: one line per
/// device port (`link DEV/1 `, then `name value ` pairs, the device's ODP
/// counters last), and with `mrs`
/// one per ODP region (`dev DEV mrn N `, then mlx5's ODP counter pairs),
/// then every region as `rdma resource show mr` prints it (`dev DEV mrn N
/// rkey 0x.. lkey 0x.. mrlen N pdn N pid N comm NAME`).
fn rdma_format(procs: &[Value], mrs: bool) -> String {
    let mut o = String::new();
    for p in procs {
        let pid = p["pid"].as_u64().unwrap_or(0);
        // iproute2 prints the task's comm: the program's file name.
        let comm = p["program"].as_str().and_then(|s| s.rsplit('/').next()).unwrap_or("?").to_string();
        for d in p["devices"].as_array().into_iter().flatten() {
            let dev = d["name"].as_str().unwrap_or("?");
            let st = &d["stats"];
            o.push_str(&format!("link {dev}/1 "));
            for (mlx5, ours) in MLX5_NAMES {
                o.push_str(&format!("{mlx5} {} ", counter(&st[ours])));
            }
            for (k, v) in st.as_object().into_iter().flatten() {
                if !MLX5_NAMES.iter().any(|(_, ours)| ours == k) {
                    o.push_str(&format!("{k} {} ", counter(v)));
                }
            }
            // The device's ODP counters (mlx5's names; the sums over every
            // ODP region of the device, deregistered ones included), always
            // all five, as mlx5's device-level ODP statistic.
            for (k, _) in uroce::mem::OdpStats::default().fields() {
                o.push_str(&format!("{k} {} ", counter(&d["odp"][k])));
            }
            o.push('\n');
            if mrs {
                let regions: Vec<&Value> = d["mrs"].as_array().into_iter().flatten().collect();
                for m in regions.iter().filter(|m| m["odp"].is_object()) {
                    // mlx5's mrn is the mkey index: the key without its 8-bit tag.
                    o.push_str(&format!("dev {dev} mrn {} ", m["key"].as_u64().unwrap_or(0) >> 8));
                    for (k, v) in m["odp"].as_object().into_iter().flatten() {
                        o.push_str(&format!("{k} {} ", counter(v)));
                    }
                    o.push('\n');
                }
                for m in &regions {
                    let key = m["key"].as_u64().unwrap_or(0);
                    o.push_str(&format!(
                        "dev {dev} mrn {} rkey {key:#x} lkey {key:#x} mrlen {} pdn {} pid {pid} comm {comm}\n",
                        key >> 8,
                        m["length"].as_u64().unwrap_or(0),
                        m["pd"].as_u64().unwrap_or(0),
                    ));
                }
            }
        }
    }
    o
}

/// The host's peer-memory totals per client (`uroce peers`, row `all`):
/// `uroce_peer_<counter>_total{client=...}`.
fn peer_metrics(totals: &[uroce::mem::peer::PeerStats]) -> String {
    let mut o = String::new();
    for (i, c) in uroce::mem::peer::COUNTERS.iter().enumerate() {
        if totals.is_empty() {
            break;
        }
        o.push_str(&format!(
            "# HELP uroce_peer_{c}_total peer-memory {c} of this host (live and exited processes)\n\
             # TYPE uroce_peer_{c}_total counter\n"
        ));
        for t in totals {
            let client = label(&t.name);
            o.push_str(&format!("uroce_peer_{c}_total{{client=\"{client}\"}} {}\n", t.counters()[i].1));
        }
    }
    o
}

fn report(a: &Args) -> String {
    let (procs, skipped) = collect(a.device.as_deref(), a.qps);
    for s in &skipped {
        eprintln!("uroce stat: skipped {s}");
    }
    if a.json {
        let t = totals(&procs);
        serde_json::to_string_pretty(&json!({ "processes": procs, "totals": t, "skipped": skipped })).unwrap() + "\n"
    } else if a.prometheus {
        prometheus(&procs)
    } else if a.rdma {
        rdma_format(&procs, a.qps)
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_table_shows_each_peer_by_medium() {
        let procs = vec![json!({ "pid": 7, "devices": [{
            "name": "uroce0", "stats": { "tx_packets": 5 }, "odp": {},
            "links": [
                { "peer": "127.0.0.2:4791", "medium": "shm", "pid": 8, "shm_tx_packets": 40, "shm_tx_bytes": 4000,
                  "udp_tx_packets": 2, "udp_tx_bytes": 200 },
                { "peer": "10.0.0.9:4791", "medium": "udp", "pid": null, "udp_rx_packets": 3, "udp_rx_bytes": 60 },
            ],
        }]})];
        let t = table(&procs, false);
        assert!(
            t.contains("link -> 127.0.0.2:4791 by shm pid 8: memory tx 40 (4000 B) rx 0 (0 B), udp tx 2 (200 B)"),
            "{t}"
        );
        assert!(
            t.contains("link -> 10.0.0.9:4791 by udp: memory tx 0 (0 B) rx 0 (0 B), udp tx 0 (0 B) rx 3 (60 B)"),
            "{t}"
        );
    }

    #[test]
    fn the_table_keeps_its_columns_and_rows_line_up() {
        let procs = vec![
            json!({ "pid": 7, "devices": [{ "name": "uroce0", "stats": { "tx_packets": 5, "rx_bytes": u64::MAX }, "odp": {},
                    "qps": [{ "qpn": 17, "type": "RC", "state": "Rts", "dest_qpn": 18, "peer": "127.0.0.1", "stats": {} }] }] }),
            json!({ "pid": 12345, "devices": [{ "name": "uroce0", "stats": { "tx_packets": 1 }, "odp": {} }] }),
        ];
        let t = table(&procs, true);
        let lines: Vec<&str> = t.lines().collect();
        // The header as the hand-written formatter printed it.
        assert_eq!(
            lines[0],
            format!(
                "{:>8} {:<12} {:>12} {:>14} {:>12} {:>14} {:>8} {:>6} {:>6} {:>8} {:>10}",
                "pid",
                "device",
                "tx_packets",
                "tx_bytes",
                "rx_packets",
                "rx_bytes",
                "retrans",
                "naks",
                "drops",
                "odp_flt",
                "inline_rx"
            )
            .replace("      rx_bytes", "            rx_bytes"),
            "{t}"
        );
        assert!(lines[1].starts_with("       7 uroce0       ") && lines[1].contains(&u64::MAX.to_string()), "{t}");
        assert!(lines[2].starts_with("           qp 0x000011 RC  Rts  -> 0x000012 @ 127.0.0.1"), "{t}");
        assert!(lines[3].starts_with("   12345 uroce0 ") && lines[4].starts_with("   total uroce0 "), "{t}");
        // Rows line up with the header, widened for the largest number.
        for l in [lines[1], lines[3], lines[4]] {
            assert_eq!(l.len(), lines[0].len(), "{t}");
        }
    }

    #[test]
    fn prometheus_label_values_are_escaped() {
        let procs = vec![json!({ "pid": 7, "devices": [{ "name": "a\"b\\c\nd", "stats": { "tx_packets": 5 } }] })];
        let p = prometheus(&procs);
        assert!(
            p.contains("# HELP uroce_tx_packets_total RoCE packets sent\n# TYPE uroce_tx_packets_total counter\n"),
            "{p}"
        );
        assert!(p.contains(r#"uroce_tx_packets_total{pid="7",device="a\"b\\c\nd"} 5"#), "{p}");
    }

    #[test]
    fn rdma_layout_of_devices_and_odp_regions() {
        let procs = vec![json!({ "pid": 7, "program": "/usr/bin/ib_write_bw", "devices": [{
            "name": "uroce0",
            "stats": { "tx_packets": 5, "rx_out_of_sequence": 2, "timeouts": 1 },
            "odp": { "page_faults": 4, "page_faults_handled": 2, "page_invalidations": 1,
                     "page_invalidations_handled": 1, "page_prefetch": 8 },
            "mrs": [
                { "key": 0x1234, "pd": 2, "length": 8192, "odp": { "page_faults": 3, "page_invalidations": 1 } },
                { "key": 0x2a07, "pd": 2, "length": 4096, "odp": null },
            ],
        }]})];
        let out = rdma_format(&procs, true);
        let lines: Vec<&str> = out.lines().collect();
        assert_eq!(lines.len(), 4, "{out}");
        assert!(lines[0].starts_with("link uroce0/1 out_of_buffer 0 out_of_sequence 2 "), "{out}");
        assert!(lines[0].contains(" local_ack_timeout_err 1 ") && lines[0].contains(" tx_packets 5 "), "{out}");
        // The device's ODP counters, as mlx5's device-level statistic.
        assert!(
            lines[0].ends_with(
                "tx_packets 5 page_faults 4 page_faults_handled 2 page_invalidations 1 \
                 page_invalidations_handled 1 page_prefetch 8 "
            ),
            "{out}"
        );
        assert!(!lines[0].contains("rx_out_of_sequence"), "named once, as mlx5 names it: {out}");
        assert_eq!(lines[1], "dev uroce0 mrn 18 page_faults 3 page_invalidations 1 ");
        // Every region as `rdma resource show mr` lists it.
        assert_eq!(lines[2], "dev uroce0 mrn 18 rkey 0x1234 lkey 0x1234 mrlen 8192 pdn 2 pid 7 comm ib_write_bw");
        assert_eq!(lines[3], "dev uroce0 mrn 42 rkey 0x2a07 lkey 0x2a07 mrlen 4096 pdn 2 pid 7 comm ib_write_bw");
        assert_eq!(rdma_format(&procs, false).lines().count(), 1);
        // A process that published no ODP counters: zeros, never missing.
        let bare = vec![json!({ "pid": 8, "devices": [{ "name": "uroce1", "stats": {} }] })];
        assert_eq!(
            rdma_format(&bare, false),
            "link uroce1/1 out_of_buffer 0 out_of_sequence 0 duplicate_request 0 rnr_nak_retry_err 0 \
             local_ack_timeout_err 0 packet_seq_err 0 page_faults 0 page_faults_handled 0 page_invalidations 0 \
             page_invalidations_handled 0 page_prefetch 0 \n"
        );
    }
}
