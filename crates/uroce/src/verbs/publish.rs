//! Live statistics for other processes: while a process has devices open,
//! a thread writes their counters to `<runtime dir>/<pid>/stats.json` (see
//! [`crate::runtime`]) every `[stats] interval_ms`, where `uroce stat` finds
//! and aggregates them. The same thread serves `uroce capture`: a request
//! file `<pid>/capture.request` (`start PATH` or `stop`) switches packet
//! capture of every device of the process, answered in `capture.status`.
//!
//! Device start also loads the configured peer-memory clients.

use super::context::DeviceShared;
use crate::config::ConfigFile;
use crate::proto::Stats;
use serde_json::{json, Map, Value};
use std::sync::{Mutex, OnceLock, Weak};
use std::time::{Duration, SystemTime};

fn devices() -> &'static Mutex<Vec<Weak<DeviceShared>>> {
    static D: OnceLock<Mutex<Vec<Weak<DeviceShared>>>> = OnceLock::new();
    D.get_or_init(Default::default)
}

/// Called when a device starts in this process.
pub(crate) fn device_started(dev: &std::sync::Arc<DeviceShared>) {
    let file = match ConfigFile::load() {
        Ok(f) => f.map(|(f, _)| f).unwrap_or_default(),
        Err(e) => {
            tracing::warn!("{e}; statistics and peer clients use defaults");
            ConfigFile::default()
        }
    };
    for s in crate::mem::peer::loader::load_configured(&file) {
        match (&s.loaded, &s.reason) {
            (true, _) => tracing::info!(name = %s.name, "peer-memory client loaded"),
            (false, Some(r)) => tracing::debug!(name = %s.name, "peer-memory client not loaded: {r}"),
            _ => {}
        }
    }
    let mut d = devices().lock().unwrap();
    d.retain(|w| w.strong_count() > 0);
    d.push(std::sync::Arc::downgrade(dev));
    drop(d);
    if file.stats.publish {
        start(Duration::from_millis(file.stats.interval_ms));
    }
}

fn start(period: Duration) {
    static STARTED: OnceLock<()> = OnceLock::new();
    if STARTED.set(()).is_err() {
        return;
    }
    let r = std::thread::Builder::new().name("uroce-publish".into()).spawn(move || loop {
        publish_now();
        serve_capture_request();
        std::thread::sleep(period);
    });
    if let Err(e) = r {
        tracing::warn!("statistics publisher not started: {e}");
    }
}

fn stats_json(s: &Stats) -> Value {
    Value::Object(s.fields().iter().map(|(k, v)| (k.to_string(), json!(v))).collect::<Map<_, _>>())
}

fn odp_json(s: &crate::mem::OdpStats) -> Value {
    Value::Object(s.fields().iter().map(|(k, v)| (k.to_string(), json!(v))).collect::<Map<_, _>>())
}

/// The counters of every open device of this process.
pub fn snapshot() -> Value {
    let live: Vec<_> = devices().lock().unwrap().iter().filter_map(Weak::upgrade).collect();
    let devs: Vec<Value> = live
        .iter()
        .map(|d| {
            let (stats, qps) = {
                let e = d.rt.engine();
                (e.stats(), e.qp_summaries())
            };
            let qps: Vec<Value> = qps
                .iter()
                .map(|q| {
                    json!({
                        "qpn": q.qpn,
                        "type": format!("{:?}", q.qp_type),
                        "state": format!("{:?}", q.state),
                        "dest_qpn": q.dest_qpn,
                        "peer": q.peer.map(|p| p.to_string()),
                        "stats": stats_json(&q.stats),
                    })
                })
                .collect();
            let mrs: Vec<Value> =
                d.mem.odp_regions().iter().map(|(key, s)| json!({ "key": key, "odp": odp_json(s) })).collect();
            json!({
                "name": d.name,
                "address": d.addr.ip().to_string(),
                "port": d.addr.port(),
                "mtu": d.mtu.bytes(),
                "capture": d.rt.is_capturing(),
                "stats": stats_json(&stats),
                "odp": odp_json(&d.mem.odp_stats()),
                "pinned_bytes": d.mem.pinned_bytes(),
                "qps": qps,
                "mrs": mrs,
            })
        })
        .collect();
    let now = SystemTime::now().duration_since(SystemTime::UNIX_EPOCH).unwrap_or_default();
    json!({
        "pid": std::process::id(),
        "program": std::env::args().next().unwrap_or_default(),
        "time_ms": now.as_millis() as u64,
        "devices": devs,
    })
}

/// Writes `stats.json` now.
pub fn publish_now() {
    let path = crate::runtime::process_dir().join("stats.json");
    if let Err(e) = crate::runtime::write_file(&path, &snapshot().to_string()) {
        tracing::debug!("cannot publish statistics to {}: {e}", path.display());
    }
}

fn serve_capture_request() {
    let dir = crate::runtime::process_dir();
    let req = dir.join("capture.request");
    let Ok(text) = std::fs::read_to_string(&req) else { return };
    let _ = std::fs::remove_file(&req);
    let live: Vec<_> = devices().lock().unwrap().iter().filter_map(Weak::upgrade).collect();
    let text = text.trim();
    let answer = if text == "stop" {
        for d in &live {
            let _ = d.rt.set_capture(None);
        }
        "stopped".to_string()
    } else if let Some(path) = text.strip_prefix("start ") {
        let mut errors = Vec::new();
        for (i, d) in live.iter().enumerate() {
            // One file per device: the first gets the path as given.
            let p = if i == 0 { path.to_string() } else { format!("{path}.{}", d.name) };
            if let Err(e) = d.rt.set_capture(Some(std::path::Path::new(&p))) {
                errors.push(format!("{}: {p}: {e}", d.name));
            }
        }
        if errors.is_empty() {
            format!("capturing {} device(s) to {path}", live.len())
        } else {
            format!("error: {}", errors.join("; "))
        }
    } else {
        format!("error: unknown request {text:?}")
    };
    let _ = crate::runtime::write_file(&dir.join("capture.status"), &format!("{answer}\n"));
    publish_now();
}
