//! `uroce stat` and `uroce peers` read a runtime directory that anyone may
//! have filled: a FIFO named `stats.json` must not hang them, links are not
//! followed, what is skipped is reported, and totals saturate instead of
//! wrapping (issue 16 §5).

use serde_json::{json, Value};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

const UROCE: &str = env!("CARGO_BIN_EXE_uroce");

/// A live process (its pid names a runtime entry), killed on drop.
struct Sleeper(Child);
impl Sleeper {
    fn new() -> Sleeper {
        Sleeper(Command::new("sleep").arg("60").spawn().unwrap())
    }
    fn pid(&self) -> u32 {
        self.0.id()
    }
}
impl Drop for Sleeper {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A runtime directory for the test, removed on drop.
struct Rt(PathBuf);
impl Drop for Rt {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn rt(tag: &str) -> Rt {
    let d = std::env::temp_dir().join(format!("uroce-hostile-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    Rt(d)
}

/// Runs `uroce ARGS` with the runtime directory `rt`, killed after 10 s.
fn uroce_bounded(rt: &Path, args: &[&str]) -> Output {
    let mut c = Command::new(UROCE)
        .args(args)
        .env("UROCE_RUNTIME_DIR", rt)
        .env_remove("UROCE_CONFIG")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let t = Instant::now();
    while c.try_wait().unwrap().is_none() {
        if t.elapsed() > Duration::from_secs(10) {
            let _ = c.kill();
            let _ = c.wait();
            panic!("uroce {args:?} hung (killed after 10 s)");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    c.wait_with_output().unwrap()
}

fn stats(tx: u64, rx_bytes: u64) -> String {
    json!({"pid": 1, "devices": [{"name": "x", "stats": {"tx_packets": tx, "rx_bytes": rx_bytes,
        "rx_drop_a": u64::MAX, "rx_drop_b": 1, "naks_sent": u64::MAX, "naks_received": 3}, "odp": {}}]})
    .to_string()
}

#[test]
fn fifo_and_links_are_skipped_and_totals_saturate() {
    let guard = rt("stat");
    let rt = guard.0.clone();
    let (p1, p2, p3, p4) = (Sleeper::new(), Sleeper::new(), Sleeper::new(), Sleeper::new());
    for p in [&p1, &p2, &p3, &p4] {
        std::fs::create_dir(rt.join(p.pid().to_string())).unwrap();
    }
    std::fs::write(rt.join(p1.pid().to_string()).join("stats.json"), stats(u64::MAX - 5, u64::MAX)).unwrap();
    std::fs::write(rt.join(p2.pid().to_string()).join("stats.json"), stats(10, 1)).unwrap();
    let fifo = rt.join(p3.pid().to_string()).join("stats.json");
    let c = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
    // SAFETY: a NUL-terminated path.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
    let outside = rt.join("outside.json");
    std::fs::write(&outside, stats(1000, 1000)).unwrap();
    std::os::unix::fs::symlink(&outside, rt.join(p4.pid().to_string()).join("stats.json")).unwrap();

    let out = uroce_bounded(&rt, &["stat", "--json"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["processes"].as_array().unwrap().len(), 2, "the FIFO and the link are not read");
    assert_eq!(v["totals"]["x"]["tx_packets"], u64::MAX, "saturated, not wrapped");
    assert_eq!(v["totals"]["x"]["rx_bytes"], u64::MAX);
    assert!(err.contains(&format!("{}: is not a regular file", fifo.display())), "{err}");
    assert!(err.contains("symbolic link"), "{err}");
    assert_eq!(v["skipped"].as_array().unwrap().len(), 2, "{v}");
    // The table (which adds drops and NAKs) saturates too.
    let out = uroce_bounded(&rt, &["stat"]);
    let table = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(table.contains(&u64::MAX.to_string()), "{table}");
    let out = uroce_bounded(&rt, &["stat", "--prometheus"]);
    assert!(out.status.success());

    // `uroce peers` the same way: a FIFO counter file, a link for a client.
    let peers = rt.join(p1.pid().to_string()).join("memory_peers");
    std::fs::create_dir_all(peers.join("ssd0")).unwrap();
    std::fs::write(peers.join("ssd0/version"), "1.0\n").unwrap();
    let c = std::ffi::CString::new(peers.join("ssd0/num_alloc_mrs").to_str().unwrap()).unwrap();
    // SAFETY: a NUL-terminated path.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
    std::os::unix::fs::symlink(&rt, peers.join("evil")).unwrap();
    let out = uroce_bounded(&rt, &["peers", "--json", "--processes"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["processes"].as_array().unwrap().len(), 1, "{v}");
    assert_eq!(v["processes"][0]["version"], "1.0");
    assert_eq!(v["clients"][0]["counters"]["num_alloc_mrs"], 0, "the FIFO is not read: {v}");
    assert!(err.contains("num_alloc_mrs: is not a regular file") && err.contains("evil: is a symbolic link"), "{err}");
}
