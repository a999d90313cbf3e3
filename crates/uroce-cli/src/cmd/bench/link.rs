//! `uroce bench --link udp,shm[,auto]`: the same points over each medium
//! between same-host devices in turn (each with its own server), a memcpy
//! baseline of the same sizes measured in the same run, and a table of the
//! ratios the same-host link is judged by (shm / udp bandwidth, latency and
//! message rate; shm / memcpy bandwidth).

use super::ctrl::Res;
use super::report::Row;
use super::spec::{LinkArg, Metric, Opts};
use std::time::{Duration, Instant};
use uroce::verbs::Context;

/// Sets `UROCE_LINK` for this process (and the server it spawns) from the
/// first `--link`, before any device opens.
pub fn set_env(opts: &Opts) {
    if let Some(l) = opts.link.first() {
        std::env::set_var("UROCE_LINK", l.name());
    }
}

/// Runs the points (`run`) with each `--link` in turn, then the memcpy baseline,
/// and prints the comparison.
pub fn compare(opts: &Opts, run: impl Fn(&Opts) -> Res<Vec<Row>>) -> Res<()> {
    let mut runs: Vec<(LinkArg, Vec<Row>)> = Vec::new();
    for &l in &opts.link {
        println!("\n=== link {} ({}) ===", l.name(), if opts.in_process { "one process" } else { "two processes" });
        // Before the server starts (a child inherits it; one in this
        // process reads it when its device opens).
        std::env::set_var("UROCE_LINK", l.name());
        runs.push((l, run(opts)?));
    }
    let mut sizes: Vec<usize> =
        runs.iter().flat_map(|(_, r)| r.iter().filter(|r| r.metric == "bw").map(|r| r.size)).collect();
    sizes.sort_unstable();
    sizes.dedup();
    let memcpy: Vec<(usize, f64)> = sizes.iter().map(|&s| (s, memcpy_gbps(s, opts.baseline_secs))).collect();
    for (s, g) in &memcpy {
        println!("baseline: memcpy of {s} bytes (cache-warm buffers): {g:.2} Gb/s");
    }
    println!("\n{:<10} {:<4} {:>8}  per link (and ratios)", "op", "test", "size");
    let Some((_, first)) = runs.first() else { return Ok(()) };
    for (i, r0) in first.iter().enumerate() {
        let mut line = format!("{:<10} {:<4} {:>8} ", r0.op, r0.metric, r0.size);
        for (l, rows) in &runs {
            if let Some(r) = rows.get(i) {
                if r.metric == "bw" {
                    line += &format!(" {}: {:.2} Gb/s {:.3} Mmsg/s;", l.name(), r.result, r.mmsgs);
                } else {
                    line += &format!(" {}: {:.2} {};", l.name(), r.result, r.unit);
                }
            }
        }
        let get = |k: LinkArg| runs.iter().find(|(l, _)| *l == k).and_then(|(_, rows)| rows.get(i));
        if let (Some(u), Some(m)) = (get(LinkArg::Udp), get(LinkArg::Shm)) {
            if r0.metric == Metric::Bw.name() {
                line += &format!(" shm/udp bw {:.2}x, msg rate {:.2}x", m.result / u.result, m.mmsgs / u.mmsgs);
                if let Some((_, g)) = memcpy.iter().find(|(s, _)| *s == r0.size) {
                    line += &format!(", shm/memcpy {:.2}", m.result / g);
                }
            } else {
                line += &format!(" shm/udp latency {:.2}x", m.result / u.result);
            }
        }
        println!("{line}");
    }
    Ok(())
}

/// Gb/s of `memcpy` between two `size`-byte buffers for about `secs`.
fn memcpy_gbps(size: usize, secs: f64) -> f64 {
    let src = vec![0x5au8; size];
    let mut dst = vec![0u8; size];
    let t = Instant::now();
    let mut n = 0u64;
    let until = Duration::from_secs_f64(secs.max(0.05));
    while t.elapsed() < until {
        for _ in 0..64 {
            dst.copy_from_slice(std::hint::black_box(&src));
            std::hint::black_box(&mut dst);
        }
        n += 64;
    }
    (n * size as u64) as f64 * 8.0 / t.elapsed().as_secs_f64() / 1e9
}

/// Which medium carried the client's packets, per peer.
pub fn print_media(ctx: &Context) {
    for l in ctx.link_stats() {
        let c = |k: &str| l.counters.iter().find(|(n, _)| *n == k).map_or(0, |(_, v)| *v);
        println!(
            "link to {}: {} now; by memory {} packets ({} bytes) sent, {} received; by UDP {} sent, {} received; {} dropped on a full ring",
            l.peer,
            l.medium,
            c("shm_tx_packets"),
            c("shm_tx_bytes"),
            c("shm_rx_packets"),
            c("udp_tx_packets"),
            c("udp_rx_packets"),
            c("ring_full_drops"),
        );
    }
}
