//! Issue 30's table rerun: the programs RDMA users run first, through the
//! drop-in libraries, two processes each, waiting for completions by
//! polling and through a completion channel (`-e`; qperf's default), over
//! RC, UC and UD. No timing is asserted as such: each event-driven or UC/UD
//! figure must stay within [`BOUND`] × the polled RC figure of the same
//! run, which catches the 10–50× collapses issue 30 found (an application
//! blocked in `ibv_get_cq_event` while the progress thread left the socket
//! to it) on a machine however busy. The figures are printed.
//! Programs that are not installed are skipped with a printed reason.
//!
//! The medium is the test command's pass's: the same-host link in the
//! first, UDP in the second (`UROCE_LINK=udp`). Over the link the
//! event-driven path was 8–12 × the polled one until a thread waiting on a
//! completion channel slept on the link's doorbells too (issue 30,
//! docs/benchmarks.md).

#[path = "../../uroce/tests/skip/mod.rs"]
#[macro_use]
mod skip;

mod support;

use std::time::Duration;
use support::*;

/// Most a figure may be, in multiples of the same run's polled one.
const BOUND: f64 = 10.0;

/// Runs `prog` (an ibv_*_pingpong) as server and client with `extra`
/// options on both; the client's µs per iteration (a round trip).
fn usec_per_iter(prog: &str, tcp: u16, extra: &[&str]) -> f64 {
    let iters = "2000";
    let args = |client: bool| {
        let mut a: Vec<String> = ["-g", "0", "-p", &tcp.to_string(), "-s", "64", "-n", iters, "-r", "64"]
            .iter()
            .map(|s| s.to_string())
            .collect();
        a.extend(extra.iter().map(|s| s.to_string()));
        if client {
            a.push("127.0.0.1".into());
        }
        a
    };
    let mut server = Reap::new(dropin_command(prog, "127.0.0.81").args(args(false)).spawn().unwrap());
    assert!(listening(tcp), "{prog}: the server never listened on TCP port {tcp}");
    let mut client = Reap::new(dropin_command(prog, "127.0.0.82").args(args(true)).spawn().unwrap());
    let what = format!("{prog} {extra:?}");
    let (ok, text) = client.wait(&what, Duration::from_secs(120));
    assert!(ok, "{what} client: {text}");
    let (ok, stext) = server.wait(&what, Duration::from_secs(60));
    assert!(ok, "{what} server: {stext}");
    let us = text
        .lines()
        .find_map(|l| l.strip_suffix(" usec/iter")?.rsplit(' ').next()?.parse::<f64>().ok())
        .unwrap_or_else(|| panic!("{what}: no usec/iter in {text}"));
    println!("{what}: {us:.2} usec/iter");
    us
}

/// `measure` against `polled` measured just before it, in up to three
/// alternating pairs: the first pair within [`BOUND`] passes. A collapse
/// of the kind issue 30 found is there in every pair; a burst of another
/// process's work on a busy machine is not (a loaded run once saw the
/// polled UD figure at 10.5 × a polled RC figure taken a minute earlier).
fn check(what: &str, mut measure: impl FnMut() -> f64, mut polled: impl FnMut() -> f64) {
    let mut pairs = Vec::new();
    for _ in 0..3 {
        let p = polled();
        let v = measure();
        pairs.push(format!("{v:.1} µs against {p:.1} µs"));
        if v <= BOUND * p {
            println!("{what}: within {BOUND} × the polled RC figure ({})", pairs.join("; "));
            return;
        }
    }
    panic!("{what}: more than {BOUND} × the polled RC figure in each of 3 alternating pairs: {}", pairs.join("; "));
}

#[test]
fn event_driven_uc_and_ud_pingpongs_stay_near_polled_rc() {
    let _serial = serial();
    let progs = ["ibv_rc_pingpong", "ibv_uc_pingpong", "ibv_ud_pingpong"];
    if !progs.iter().all(|p| have(p)) {
        skip!("ibv_*_pingpong is not installed (Debian package ibverbs-utils)");
    }
    // Each run its own TCP port (a port just closed may linger).
    let port = std::cell::Cell::new(19400);
    let next = || {
        port.set(port.get() + 1);
        port.get()
    };
    for prog in progs {
        for extra in [&[][..], &["-e"][..]] {
            if prog == "ibv_rc_pingpong" && extra.is_empty() {
                continue;
            }
            check(
                &format!("{prog} {extra:?}"),
                || usec_per_iter(prog, next(), extra),
                || usec_per_iter("ibv_rc_pingpong", next(), &[]),
            );
        }
    }
}

/// qperf's `rc_lat` waits on a completion channel unless told to poll
/// (`-cp1`): both, against the same run's polled figure. RoCE needs its
/// RDMA CM mode (`-cm1`; the client names the server's device address).
#[test]
fn qperf_rc_lat_event_driven_stays_near_polled() {
    let _serial = serial();
    if !have("qperf") {
        skip!("qperf is not installed (Debian package qperf)");
    }
    let lp = "19480";
    let server = Reap::new(dropin_command("qperf", "127.0.0.83").args(["-lp", lp]).spawn().unwrap());
    assert!(listening(19480), "qperf: the server never listened on TCP port {lp}");
    let run = |extra: &[&str]| -> f64 {
        let mut c = dropin_command("qperf", "127.0.0.84");
        c.args(["-lp", lp, "-cm1", "-t", "1", "-m", "64"]).args(extra).args(["127.0.0.83", "rc_lat"]);
        let what = format!("qperf rc_lat {extra:?}");
        let (ok, text) = Reap::new(c.spawn().unwrap()).wait(&what, Duration::from_secs(60));
        assert!(ok, "{what}: {text}");
        let l =
            text.lines().find(|l| l.trim_start().starts_with("latency")).unwrap_or_else(|| panic!("{what}: {text}"));
        let mut w = l.split('=').nth(1).unwrap_or("").split_whitespace();
        let (v, unit) = (w.next().and_then(|v| v.parse::<f64>().ok()), w.next().unwrap_or(""));
        let v = v.unwrap_or_else(|| panic!("{what}: no latency in {text}"));
        let us = match unit {
            "ns" => v / 1000.0,
            "ms" => v * 1000.0,
            "sec" => v * 1e6,
            _ => v,
        };
        println!("{what}: {us:.2} us");
        us
    };
    check("qperf rc_lat (completion channel)", || run(&[]), || run(&["-cp1"]));
    drop(server.into_inner_killed());
}
