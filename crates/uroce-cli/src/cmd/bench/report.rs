//! Results: the table, CSV, JSON and the machine description.

use super::spec::{percentile, Measured, Metric, Opts, Spec, Wait};
use super::udp::{PingPong, Stream};
use serde_json::{json, Value};
use std::fmt::Write as _;
use std::net::SocketAddr;
use uroce::verbs::Context;

/// One row of results.
#[derive(Debug, Clone)]
pub struct Row {
    /// The operation, with its transport and wait ([`Spec::label`]).
    pub op: String,
    pub metric: &'static str,
    pub size: usize,
    pub qps: usize,
    pub iters: u64,
    /// Gb/s (bw) or µs (lat: the median, half or full round trip).
    pub result: f64,
    pub unit: &'static str,
    /// The matching raw UDP figure, in the same unit.
    pub baseline: Option<f64>,
    /// result / baseline.
    pub ratio: Option<f64>,
    /// M messages/s (bw).
    pub mmsgs: f64,
    /// Latency percentiles in the result's unit.
    pub p99: Option<f64>,
    pub min: Option<f64>,
    pub retransmits: u64,
    pub timeouts: u64,
    pub secs: f64,
    /// The UDP datagram size the bw baseline used.
    pub segment: Option<usize>,
}

pub struct Report {
    server_machine: Value,
    mtu: usize,
    pub streams: Vec<Stream>,
    pub pingpong: Option<PingPong>,
    /// The blocking-`recv` ping-pong, the baseline of `--wait event` rows.
    pub pingpong_blocking: Option<PingPong>,
    rows: Vec<Row>,
}

impl Report {
    pub fn new(server_machine: Value, mtu: usize) -> Report {
        Report { server_machine, mtu, streams: Vec::new(), pingpong: None, pingpong_blocking: None, rows: Vec::new() }
    }

    pub fn add(&mut self, spec: &Spec, m: Measured, segment: usize) -> Row {
        let row = match spec.metric {
            Metric::Bw => {
                let gbps = m.iters as f64 * spec.size as f64 * 8.0 / m.secs / 1e9;
                let base = self.streams.iter().find(|s| s.segment == segment).map(|s| s.gbps);
                Row {
                    op: spec.label(),
                    metric: "bw",
                    size: spec.size,
                    qps: spec.qps,
                    iters: m.iters,
                    result: gbps,
                    unit: "Gb/s",
                    baseline: base,
                    ratio: base.map(|b| gbps / b),
                    mmsgs: m.iters as f64 / m.secs / 1e6,
                    p99: None,
                    min: None,
                    retransmits: m.retransmits,
                    timeouts: m.timeouts,
                    secs: m.secs,
                    segment: base.map(|_| segment),
                }
            }
            Metric::Lat => {
                let div = if spec.half_rtt() { 2.0 } else { 1.0 };
                let med = percentile(&m.rtt_us, 50.0) / div;
                let pp = match spec.wait {
                    Wait::Poll => &self.pingpong,
                    Wait::Event => &self.pingpong_blocking,
                };
                let base = pp.as_ref().map(|p| percentile(&p.rtt_us, 50.0) / div);
                Row {
                    op: spec.label(),
                    metric: "lat",
                    size: spec.size,
                    qps: 1,
                    iters: m.iters,
                    result: med,
                    unit: if spec.half_rtt() { "us half-RTT" } else { "us RTT" },
                    baseline: base,
                    ratio: base.map(|b| med / b),
                    mmsgs: m.iters as f64 / m.secs / 1e6,
                    p99: Some(percentile(&m.rtt_us, 99.0) / div),
                    min: Some(percentile(&m.rtt_us, 0.0) / div),
                    retransmits: m.retransmits,
                    timeouts: m.timeouts,
                    secs: m.secs,
                    segment: None,
                }
            }
        };
        self.rows.push(row.clone());
        row
    }

    pub fn csv(&self) -> String {
        let mut s = String::from(
            "op,metric,size,qps,iters,result,unit,baseline,ratio,msg_rate_mps,p99,min,retransmits,seconds\n",
        );
        let opt = |v: Option<f64>| v.map(|x| format!("{x:.4}")).unwrap_or_default();
        for r in &self.rows {
            let _ = writeln!(
                s,
                "{},{},{},{},{},{:.4},{},{},{},{:.4},{},{},{},{:.4}",
                r.op,
                r.metric,
                r.size,
                r.qps,
                r.iters,
                r.result,
                r.unit,
                opt(r.baseline),
                opt(r.ratio),
                r.mmsgs,
                opt(r.p99),
                opt(r.min),
                r.retransmits,
                r.secs
            );
        }
        for b in &self.streams {
            let _ = writeln!(s, "udp-gso-gro-stream,bw,{},1,,{:.4},Gb/s,,,{:.4},,,,", b.segment, b.gbps, b.mpps);
        }
        let pps = [("udp-busy-poll-pingpong", &self.pingpong), ("udp-blocking-pingpong", &self.pingpong_blocking)];
        for (name, p) in pps.iter().filter_map(|(n, p)| p.as_ref().map(|p| (n, p))) {
            let _ = writeln!(
                s,
                "{name},lat,{},1,{},{:.4},us half-RTT,,,,{:.4},{:.4},,",
                super::udp::PING_BYTES,
                p.iters,
                percentile(&p.rtt_us, 50.0) / 2.0,
                percentile(&p.rtt_us, 99.0) / 2.0,
                percentile(&p.rtt_us, 0.0) / 2.0
            );
        }
        s
    }

    pub fn json(&self, opts: &Opts, server: SocketAddr, ctx: &Context) -> Value {
        let results: Vec<Value> = self
            .rows
            .iter()
            .map(|r| {
                json!({
                    "op": r.op, "metric": r.metric, "size": r.size, "qps": r.qps, "iters": r.iters,
                    "result": r.result, "unit": r.unit, "baseline": r.baseline, "ratio": r.ratio,
                    "msg_rate_mps": r.mmsgs, "p99": r.p99, "min": r.min,
                    "baseline_segment": r.segment,
                    "retransmits": r.retransmits, "timeouts": r.timeouts, "seconds": r.secs,
                })
            })
            .collect();
        let streams: Vec<Value> = self
            .streams
            .iter()
            .map(|b| json!({ "segment": b.segment, "gbps": b.gbps, "mpps": b.mpps, "sender_gbps": b.sent_gbps }))
            .collect();
        json!({
            "tool": "uroce bench",
            "version": env!("CARGO_PKG_VERSION"),
            "machine": machine(),
            "server_machine": self.server_machine,
            "setup": {
                "client_device": ctx.local_addr().to_string(),
                "server_control": server.to_string(),
                "path_mtu": self.mtu,
                "tx_depth": opts.tx_depth,
                "signal_every": 16,
                "polling": "busy (CQ), or a completion channel for `-ev` rows",
                "latency": "median; write/send: half round trip, read/atomic: full round trip",
            },
            "baselines": {
                "udp_stream": streams,
                "udp_pingpong": self.pingpong.as_ref().map(PingPong::to_json),
                "udp_pingpong_blocking": self.pingpong_blocking.as_ref().map(PingPong::to_json),
            },
            "results": results,
        })
    }
}

pub fn header() {
    println!(
        "\n{:<10} {:<4} {:>8} {:>4} {:>10} {:<12} {:>9} {:>7}  detail",
        "op", "test", "size", "qps", "result", "unit", "baseline", "ratio"
    );
}

pub fn row(r: &Row) {
    let base = r.baseline.map(|b| format!("{b:.2}")).unwrap_or_else(|| "-".into());
    let ratio = r.ratio.map(|b| format!("{b:.3}")).unwrap_or_else(|| "-".into());
    let detail = match r.p99 {
        Some(p) => format!("p99 {p:.2} us, {} iters", r.iters),
        None => format!("{:.3} M msg/s, {} iters", r.mmsgs, r.iters),
    };
    let detail = if r.retransmits > 0 { format!("{detail}, {} retransmits", r.retransmits) } else { detail };
    println!(
        "{:<10} {:<4} {:>8} {:>4} {:>10.3} {:<12} {:>9} {:>7}  {detail}",
        r.op, r.metric, r.size, r.qps, r.result, r.unit, base, ratio
    );
}

fn read_trim(path: &str) -> String {
    std::fs::read_to_string(path).map(|s| s.trim().to_string()).unwrap_or_default()
}

/// Cores, kernel, CPU, host and the date (UTC).
pub fn machine() -> Value {
    let cpu = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("model name"))
                .map(|l| l.split(':').nth(1).unwrap_or("").trim().to_string())
        })
        .unwrap_or_default();
    json!({
        "cores": std::thread::available_parallelism().map(|n| n.get()).unwrap_or(0),
        "kernel": read_trim("/proc/sys/kernel/osrelease"),
        "cpu": cpu,
        "hostname": read_trim("/proc/sys/kernel/hostname"),
        "date": utc_now(),
    })
}

/// `YYYY-MM-DDTHH:MM:SSZ` for now.
fn utc_now() -> String {
    let t = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default().as_secs() as i64;
    let (days, rem) = (t.div_euclid(86400), t.rem_euclid(86400));
    // Days to civil date (Howard Hinnant's algorithm).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!("{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}Z", rem / 3600, rem % 3600 / 60, rem % 60)
}
