//! Live statistics for other processes. While a process has devices open,
//! a thread looks at their counters every `[stats] interval_ms` and keeps
//! `<runtime dir>/<pid>/stats.json` (see `runtime::dir`) current, where
//! `uroce stat` finds and aggregates them. The same thread serves requests
//! that `uroce` leaves in that directory:
//!
//! * `capture.request` (`start PATH` or `stop`) switches packet capture of
//!   every device of the process, answered in `capture.status`;
//! * `qps.request` asks for the per-QP and per-MR detail, answered by
//!   writing `qps.json` once.
//!
//! Cost: `stats.json` holds only what is per device (counters, sizes, the
//! number of QPs), and is rewritten only when that changed since the last
//! write. An idle process therefore costs one pass adding up the devices'
//! counters per period and no I/O, whatever the number of QPs; per-QP detail
//! (which is proportional to the number of QPs) is built only when a reader
//! asks for it (`uroce stat --qps`). A request file is obeyed only if it is
//! a regular file owned by this process's uid (the directory itself was
//! checked, see `runtime::dir`); a capture file is always a new file
//! (`capture file exists` otherwise).
//!
//! Device start also loads the configured peer-memory clients.

use super::device::DeviceShared;
use crate::config::ConfigFile;
use crate::proto::Stats;
use serde_json::{json, Map, Value};
use std::sync::{Arc, Mutex, OnceLock, Weak};
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

/// The runtime's process directory (see `crate::runtime`), opened with
/// the peer-memory counters' keeper registered: they outlive the
/// process directories this process removes.
fn process_dir() -> Option<&'static crate::runtime::ProcessDir> {
    crate::runtime::set_keeper(crate::mem::peer::totals::fold_process);
    crate::runtime::process_dir()
}

/// Writes a file of this process's directory (see [`process_dir`]).
fn write_process_file(subdirs: &[&str], name: &str, contents: &str) -> std::io::Result<()> {
    crate::runtime::set_keeper(crate::mem::peer::totals::fold_process);
    crate::runtime::write_process_file(subdirs, name, contents)
}

fn start(period: Duration) {
    static STARTED: OnceLock<()> = OnceLock::new();
    if STARTED.set(()).is_err() {
        return;
    }
    if process_dir().is_none() {
        // Refused (and said so): nothing is published, no request is read.
        return;
    }
    let r = std::thread::Builder::new().name("uroce-publish".into()).spawn(move || {
        let mut last = String::new();
        loop {
            publish_if_changed(&mut last);
            serve_capture_request();
            serve_qps_request();
            crate::io::capture::flush_all();
            std::thread::sleep(period);
        }
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

/// Per peer: the medium (`shm` while the same-host link is up, else
/// `udp`), the peer's pid while linked, and packets and bytes by each.
fn links_json(links: &[crate::io::link::LinkStats]) -> Value {
    Value::Array(
        links
            .iter()
            .map(|l| {
                let mut m: Map<String, Value> = l.counters.iter().map(|(k, v)| (k.to_string(), json!(v))).collect();
                m.insert("peer".into(), json!(l.peer.to_string()));
                m.insert("medium".into(), json!(l.medium.as_str()));
                m.insert("pid".into(), json!(l.pid));
                Value::Object(m)
            })
            .collect(),
    )
}

fn live() -> Vec<Arc<DeviceShared>> {
    devices().lock().unwrap().iter().filter_map(Weak::upgrade).collect()
}

/// The per-device counters of every open device (no per-QP detail).
fn devices_json() -> Value {
    let devs: Vec<Value> = live()
        .iter()
        .map(|d| {
            let (stats, qp_count) = { (d.rt.stats(), d.rt.qp_count()) };
            json!({
                "name": d.name,
                "address": d.addr.ip().to_string(),
                "port": d.addr.port(),
                "mtu": d.mtu.bytes(),
                "capture": d.rt.is_capturing(),
                "stats": stats_json(&stats),
                "odp": odp_json(&d.mem.odp_stats()),
                "pinned_bytes": d.mem.pinned_bytes(),
                "qp_count": qp_count,
                "links": links_json(&d.rt.link_stats()),
            })
        })
        .collect();
    Value::Array(devs)
}

/// The QPs and ODP regions of every open device.
fn detail_json() -> Value {
    let devs: Vec<Value> = live()
        .iter()
        .map(|d| {
            let qps = d.rt.qp_summaries();
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
            let mrs: Vec<Value> = d
                .mem
                .region_summaries()
                .iter()
                .map(|r| json!({ "key": r.key, "pd": r.pd, "length": r.length, "odp": r.odp.as_ref().map(odp_json) }))
                .collect();
            json!({ "name": d.name, "qps": qps, "mrs": mrs })
        })
        .collect();
    Value::Array(devs)
}

fn header(devices: Value) -> Value {
    let now = SystemTime::now().duration_since(SystemTime::UNIX_EPOCH).unwrap_or_default();
    json!({
        "pid": std::process::id(),
        "program": std::env::args().next().unwrap_or_default(),
        "time_ms": now.as_millis() as u64,
        "devices": devices,
    })
}

/// The counters of every open device of this process, with per-QP detail
/// (for uroce's own benchmarks: `unstable`).
#[cfg(feature = "unstable")]
pub fn snapshot() -> Value {
    let mut devs = devices_json();
    for (d, q) in devs.as_array_mut().into_iter().flatten().zip(detail_json().as_array().into_iter().flatten()) {
        d["qps"] = q["qps"].clone();
        d["mrs"] = q["mrs"].clone();
    }
    header(devs)
}

fn write(name: &str, v: &Value) {
    if let Err(e) = write_process_file(&[], name, &v.to_string()) {
        tracing::debug!("cannot publish {name}: {e}");
    }
}

/// Rewrites `stats.json` if the per-device counters differ from `last`
/// (what was written last).
fn publish_if_changed(last: &mut String) {
    let devs = devices_json().to_string();
    if devs != *last {
        write("stats.json", &header(serde_json::from_str(&devs).unwrap_or_default()));
        *last = devs;
    }
}

/// Writes `stats.json` now.
pub fn publish_now() {
    write("stats.json", &header(devices_json()));
}

/// Takes request file `name` if it is a regular file of this user.
fn take_request(name: &str) -> Option<String> {
    let d = process_dir()?.dir();
    let r = d.read_file(name, 4096, true);
    if !matches!(r, Ok(None)) {
        let _ = d.remove(name);
    }
    match r {
        Ok(Some(b)) => Some(String::from_utf8_lossy(&b).trim().to_string()),
        Ok(None) => None,
        Err(e) => {
            tracing::warn!("{name} ignored: {e}");
            None
        }
    }
}

fn serve_qps_request() {
    if take_request("qps.request").is_some() {
        write("qps.json", &header(detail_json()));
    }
}

fn serve_capture_request() {
    let Some(text) = take_request("capture.request") else { return };
    let live = live();
    let answer = if text == "stop" {
        for d in &live {
            let _ = d.rt.set_capture(None);
        }
        // The writers finish the files off every lock: answer once they have.
        crate::io::capture::settle();
        "stopped".to_string()
    } else if let Some(path) = text.strip_prefix("start ") {
        let mut errors = Vec::new();
        for (i, d) in live.iter().enumerate() {
            // One file per device: the first gets the path as given.
            let p = if i == 0 { path.to_string() } else { format!("{path}.{}", d.name) };
            let p = std::path::Path::new(&p);
            // A new file, created here (O_EXCL, 0600, no link followed): the
            // device's capture then reopens this empty file of ours.
            let r = crate::io::Capture::create_new(p).and_then(|c| {
                drop(c);
                d.rt.set_capture(Some(p))
            });
            if let Err(e) = r {
                errors.push(format!("{}: {e}", d.name));
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
    if let Err(e) = write_process_file(&[], "capture.status", &format!("{answer}\n")) {
        tracing::debug!("cannot answer a capture request: {e}");
    }
    publish_now();
}
