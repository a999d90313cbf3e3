//! What `uroce bench` measures and how it is asked: the operations,
//! transports, waits and metrics of a point ([`Spec`]), the command's
//! options ([`Opts`]), and what one point measured ([`Measured`]).

use super::ctrl::Res;
use serde_json::{json, Value};
use std::path::PathBuf;

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum LinkArg {
    Udp,
    Shm,
    Auto,
}

impl LinkArg {
    pub(crate) fn name(self) -> &'static str {
        match self {
            LinkArg::Udp => "udp",
            LinkArg::Shm => "shm",
            LinkArg::Auto => "auto",
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Op {
    Write,
    Read,
    Send,
    Atomic,
}

/// The QP type of a point.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Transport {
    Rc,
    Uc,
    Ud,
}

/// How an end waits for its completions.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Wait {
    /// Busy `ibv_poll_cq` (perftest's default).
    Poll,
    /// `ibv_req_notify_cq` + a completion channel (`ibv_rc_pingpong -e`).
    Event,
}

impl Transport {
    pub(crate) fn name(self) -> &'static str {
        match self {
            Transport::Rc => "rc",
            Transport::Uc => "uc",
            Transport::Ud => "ud",
        }
    }
    /// Whether `op` exists over this transport (the verbs' rules).
    pub(crate) fn allows(self, op: Op) -> bool {
        match self {
            Transport::Rc => true,
            Transport::Uc => matches!(op, Op::Write | Op::Send),
            Transport::Ud => op == Op::Send,
        }
    }
}

impl Wait {
    pub(crate) fn name(self) -> &'static str {
        match self {
            Wait::Poll => "poll",
            Wait::Event => "event",
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Metric {
    Bw,
    Lat,
}

impl Op {
    pub(crate) fn name(self) -> &'static str {
        match self {
            Op::Write => "write",
            Op::Read => "read",
            Op::Send => "send",
            Op::Atomic => "atomic",
        }
    }
    fn parse(s: &str) -> Res<Op> {
        <Op as clap::ValueEnum>::from_str(s, false).map_err(|e| e.into())
    }
}

impl Metric {
    pub(crate) fn name(self) -> &'static str {
        match self {
            Metric::Bw => "bw",
            Metric::Lat => "lat",
        }
    }
}

#[derive(clap::Args, Clone, Debug)]
pub struct Opts {
    /// Operations (comma-separated list allowed).
    #[arg(long, value_enum, value_delimiter = ',', default_value = "write")]
    pub(crate) op: Vec<Op>,
    /// Bandwidth or latency (comma-separated list allowed).
    #[arg(long, value_enum, value_delimiter = ',', default_value = "bw")]
    pub(crate) metric: Vec<Metric>,
    /// Message size in bytes (default: 65536 for bw, 64 for lat).
    #[arg(long, conflicts_with_all = ["sizes", "sweep"])]
    pub(crate) size: Option<usize>,
    /// Several message sizes, e.g. 64,4096,65536.
    #[arg(long, value_delimiter = ',', conflicts_with = "sweep")]
    pub(crate) sizes: Vec<usize>,
    /// Powers of two from 2 bytes to 1 MiB (atomics: 8 bytes).
    #[arg(long)]
    pub(crate) sweep: bool,
    /// QP types (comma-separated list allowed): UC runs WRITE and SEND, UD
    /// SEND only (other operations are skipped for them).
    #[arg(long, value_enum, value_delimiter = ',', default_value = "rc")]
    pub(crate) transport: Vec<Transport>,
    /// How to wait for completions (comma-separated list allowed); `event`
    /// runs latency points of SEND, READ and atomics.
    #[arg(long, value_enum, value_delimiter = ',', default_value = "poll")]
    pub(crate) wait: Vec<Wait>,
    /// QPs (bandwidth tests, round-robin; latency uses one).
    #[arg(long, default_value_t = 1)]
    pub(crate) qps: usize,
    /// Messages (bw) or round trips (lat) per point (default: calibrated
    /// so a point takes about half a second).
    #[arg(long)]
    pub(crate) iters: Option<u64>,
    /// Outstanding WRs per QP for bandwidth tests.
    #[arg(long, default_value_t = 128)]
    pub(crate) tx_depth: usize,
    /// Skip the raw UDP baselines.
    #[arg(long)]
    pub(crate) no_baseline: bool,
    /// Latency: also measure the floor under a 64 B WRITE's half round trip
    /// over UDP (a RoCE WRITE datagram ping-pong with its ACK, no transport
    /// work; see `benches/udp_floor.rs`) before and after the points, and
    /// print each WRITE latency divided by it.
    #[arg(long)]
    pub(crate) floor: bool,
    /// Seconds of each UDP baseline measurement.
    #[arg(long, default_value_t = 0.5)]
    pub(crate) baseline_secs: f64,
    /// Write every point and the baselines as CSV.
    #[arg(long)]
    pub(crate) csv: Option<PathBuf>,
    /// Write every point, the baselines and the machine as JSON.
    #[arg(long)]
    pub(crate) json: Option<PathBuf>,
    /// UDP port of both devices (loopback mode; 0: a free one).
    #[arg(long, default_value_t = 0)]
    pub(crate) port: u16,
    /// The medium between same-host devices (`UROCE_LINK`): udp, shm or
    /// auto; several (e.g. `udp,shm`) run every point with each in turn,
    /// add a memcpy baseline of the same sizes and compare them.
    #[arg(long, value_enum, value_delimiter = ',')]
    pub(crate) link: Vec<LinkArg>,
    /// Loopback mode: run the server's device in this process (a thread)
    /// instead of a child process.
    #[arg(long)]
    pub(crate) in_process: bool,
}

/// One test point.
#[derive(Clone, Debug)]
pub struct Spec {
    pub op: Op,
    pub transport: Transport,
    pub wait: Wait,
    pub metric: Metric,
    pub size: usize,
    pub qps: usize,
    pub tx_depth: usize,
}

impl Spec {
    pub(crate) fn to_json(&self) -> Value {
        json!({
            "op": self.op.name(), "transport": self.transport.name(), "wait": self.wait.name(),
            "metric": self.metric.name(), "size": self.size,
            "qps": self.qps, "tx_depth": self.tx_depth,
        })
    }
    pub(crate) fn from_json(v: &Value) -> Res<Spec> {
        let num = |k: &str| v[k].as_u64().map(|x| x as usize).ok_or_else(|| format!("bench: spec lacks {k}"));
        let spec = Spec {
            op: Op::parse(v["op"].as_str().unwrap_or(""))?,
            transport: <Transport as clap::ValueEnum>::from_str(v["transport"].as_str().unwrap_or("rc"), false)?,
            wait: <Wait as clap::ValueEnum>::from_str(v["wait"].as_str().unwrap_or("poll"), false)?,
            metric: if v["metric"] == "lat" { Metric::Lat } else { Metric::Bw },
            size: num("size")?,
            qps: num("qps")?,
            tx_depth: num("tx_depth")?,
        };
        spec.validate()?;
        Ok(spec)
    }
    pub(crate) fn validate(&self) -> Res<()> {
        if self.size == 0 || self.size > 1 << 30 {
            return Err(format!("bench: message size {} outside 1..=1 GiB", self.size).into());
        }
        if self.qps == 0 || self.qps > 1024 || self.tx_depth == 0 || self.tx_depth > 16384 {
            return Err("bench: --qps must be 1..=1024 and --tx-depth 1..=16384".into());
        }
        if !self.transport.allows(self.op) {
            return Err(format!("bench: no {} over {}", self.op.name(), self.transport.name()).into());
        }
        if self.wait == Wait::Event && (self.metric != Metric::Lat || self.op == Op::Write) {
            return Err("bench: --wait event runs latency points of send, read and atomic".into());
        }
        if self.transport == Transport::Ud && self.size > 4096 {
            return Err(format!("bench: a UD message is one packet (at most 4096 bytes, not {})", self.size).into());
        }
        Ok(())
    }
    /// Latency reported as half the round trip (WRITE, SEND) or all of it.
    pub(crate) fn half_rtt(&self) -> bool {
        matches!(self.op, Op::Write | Op::Send)
    }
    /// The row's name: the operation, with its transport and wait when not
    /// RC and polling (`ud-send`, `send-ev`).
    pub fn label(&self) -> String {
        let mut s = String::new();
        if self.transport != Transport::Rc {
            s += self.transport.name();
            s += "-";
        }
        s += self.op.name();
        if self.wait == Wait::Event {
            s += "-ev";
        }
        s
    }
}

/// What one point measured.
#[derive(Debug, Clone)]
pub struct Measured {
    pub iters: u64,
    pub secs: f64,
    /// Round trips in µs, sorted (latency tests).
    pub rtt_us: Vec<f64>,
    pub retransmits: u64,
    pub timeouts: u64,
}

/// Nearest-rank percentile of sorted values.
pub fn percentile(sorted: &[f64], q: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let i = ((q / 100.0 * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len()) - 1;
    sorted[i]
}
