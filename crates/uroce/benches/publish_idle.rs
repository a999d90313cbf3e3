//! The CPU an idle process spends publishing statistics (issue 16 §5): one
//! device holding 20 000 connected QPs that carry no traffic, statistics
//! publishing on (every 500 ms, the default). Measured as the process's
//! user + system CPU time (`/proc/self/stat`) over 10 s, in two phases of
//! the same run:
//!
//! * `now`: the publisher as it is (rewrites `stats.json` only when the
//!   per-device counters changed; per-QP detail only on request);
//! * `full every period`: in addition, what the publisher did before —
//!   the whole snapshot with every QP serialized and written (tmp + rename)
//!   every 500 ms.
//!
//! Run: `cargo bench -p uroce --bench publish_idle` (QPS=N to change 20 000).

use std::net::{IpAddr, Ipv4Addr};
use std::time::{Duration, Instant};
use uroce::verbs::*;

/// This process's user + system CPU time, in seconds.
fn cpu() -> f64 {
    let s = std::fs::read_to_string("/proc/self/stat").unwrap();
    let rest = &s[s.rfind(')').unwrap() + 2..];
    let f: Vec<&str> = rest.split(' ').collect();
    // Fields 14 and 15 (utime, stime) are the 12th and 13th after the name.
    let ticks: f64 = f[11].parse::<f64>().unwrap() + f[12].parse::<f64>().unwrap();
    // SAFETY: sysconf has no preconditions.
    ticks / unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64
}

fn measure(secs: u64, mut each_period: impl FnMut()) -> f64 {
    let (c0, t0) = (cpu(), Instant::now());
    while t0.elapsed() < Duration::from_secs(secs) {
        each_period();
        std::thread::sleep(Duration::from_millis(500));
    }
    (cpu() - c0) / t0.elapsed().as_secs_f64()
}

fn main() {
    let n: usize = std::env::var("QPS").ok().and_then(|v| v.parse().ok()).unwrap_or(20_000);
    let rt = std::env::temp_dir().join(format!("uroce-publish-bench-{}", std::process::id()));
    std::env::set_var("UROCE_RUNTIME_DIR", &rt);
    std::env::remove_var("UROCE_CONFIG");
    let port = 30000 + (std::process::id() % 1000) as u16;
    let a = Context::open(&DeviceConfig::at("pub-a", IpAddr::V4(Ipv4Addr::new(127, 0, 0, 31)), port)).unwrap();
    let pd = a.alloc_pd().unwrap();
    let cq = a.create_cq(16, None).unwrap();
    let peer = Gid::from_ip(IpAddr::V4(Ipv4Addr::new(127, 0, 0, 32)));
    let t = Instant::now();
    let qps: Vec<QueuePair> = (0..n)
        .map(|i| {
            let q = pd.create_qp(&QpInitAttr::rc(&cq, &cq)).unwrap();
            q.connect_rc(&peer, 0x100000 + i as u32, 5, 5).unwrap();
            q
        })
        .collect();
    println!("{n} idle RC QPs in RTS ({:.1} s to create)", t.elapsed().as_secs_f64());
    std::thread::sleep(Duration::from_secs(1));
    let stats = rt.join(std::process::id().to_string()).join("stats.json");
    println!("stats.json: {} bytes", std::fs::metadata(&stats).map(|m| m.len()).unwrap_or(0));
    let now = measure(10, || {});
    let full = rt.join("full.json");
    let mut bytes = 0;
    let old = measure(10, || {
        let s = uroce::verbs::publish::snapshot().to_string();
        bytes = s.len();
        let tmp = full.with_extension("tmp");
        std::fs::write(&tmp, &s).unwrap();
        std::fs::rename(&tmp, &full).unwrap();
    });
    println!("full snapshot: {bytes} bytes");
    println!(
        "CPU of the idle process: now {:.2} % of a core, with the full snapshot every 500 ms {:.2} %",
        now * 100.0,
        old * 100.0
    );
    drop(qps);
    let _ = std::fs::remove_dir_all(&rt);
}
