//! UCX (Debian 12's ucx-utils, UCX 1.13.1) on uroce through the drop-in
//! library, unchanged and with no workaround in its environment: `ucx_info -d`
//! lists uroce0 with rc_verbs and ud_verbs, and `ucx_perftest` server and
//! client (two processes on loopback, each with its own device) finish over
//! `ud_verbs` and over `rc_verbs,ud_verbs` with ucp_put_bw, ucp_am_lat,
//! tag_lat and tag_bw, 20 runs in a row for each transport set.
//!
//! UCX only lists a verbs device whose `/dev/infiniband/<dev_name>` is an
//! accessible character device: uroce's dev_name is "../null", which needs
//! the directory /dev/infiniband (scripts/setup-ucx.sh, root, once; test.sh
//! runs it). Without it, or without ucx-utils, the tests skip (tests/skip).

#[path = "../../uroce/tests/skip/mod.rs"]
#[macro_use]
mod skip;
mod support;

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};
use support::{dropin_dir, have, listening, root, serial, Reap};

/// Why UCX cannot run here, if it cannot: the tests skip with it.
fn missing() -> Option<&'static str> {
    if !have("ucx_info") || !have("ucx_perftest") {
        return Some("ucx_info/ucx_perftest is not installed (Debian package ucx-utils)");
    }
    let ok =
        Command::new(root().join("scripts/setup-ucx.sh")).arg("--check").output().is_ok_and(|o| o.status.success());
    if !ok {
        return Some("/dev/infiniband is not installed (scripts/setup-ucx.sh, as root, once)");
    }
    None
}

/// A UCX program through the drop-in library, its device at `addr`, output
/// captured. Nothing of UCX's own configuration but what is given here.
fn ucx_command(prog: &str, addr: &str) -> Command {
    let mut c = Command::new(prog);
    for (k, _) in std::env::vars_os() {
        if k.to_string_lossy().starts_with("UCX_") {
            c.env_remove(k);
        }
    }
    c.env("LD_LIBRARY_PATH", dropin_dir()).env("UROCE_ADDR", addr).stdout(Stdio::piped()).stderr(Stdio::piped());
    c
}

/// A child killed if the test ends before it is waited for.
/// Waits at most `limit` for the child; (exited successfully, how it
/// ended, its output). A child still running then is killed.
fn wait(mut reap: Reap, limit: Duration) -> (bool, String, String) {
    let child = reap.0.as_mut().unwrap();
    let t = Instant::now();
    let status = loop {
        if let Some(st) = child.try_wait().unwrap() {
            break Some(st);
        }
        if t.elapsed() > limit {
            let _ = child.kill();
            break None;
        }
        std::thread::sleep(Duration::from_millis(5));
    };
    let out = reap.0.take().unwrap().wait_with_output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr);
    let how = status.map_or_else(|| format!("still running after {limit:?}: killed"), |s| s.to_string());
    (status.is_some_and(|s| s.success()), how, text)
}

#[test]
fn ucx_info_lists_uroce_with_rc_and_ud_verbs() {
    let _serial = serial();
    if let Some(why) = missing() {
        skip!("{why}");
    }
    let out = ucx_command("ucx_info", "127.0.0.141").arg("-d").output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}{}", String::from_utf8_lossy(&out.stderr));
    // "# Memory domain: uroce0", then its transports, each with its device.
    let md: Vec<&str> = text
        .lines()
        .skip_while(|l| l.trim() != "# Memory domain: uroce0")
        .skip(1)
        .take_while(|l| !l.contains("# Memory domain:"))
        .map(str::trim)
        .collect();
    assert!(!md.is_empty(), "ucx_info -d lists no memory domain uroce0:\n{text}");
    for tl in ["rc_verbs", "ud_verbs"] {
        let at = md.iter().position(|l| *l == format!("#      Transport: {tl}"));
        let at = at.unwrap_or_else(|| panic!("no transport {tl} on uroce0:\n{}", md.join("\n")));
        assert_eq!(md.get(at + 1).copied(), Some("#         Device: uroce0:1"), "{}", md.join("\n"));
    }
}

/// One ucx_perftest run: a server and a client through the drop-in, with
/// `tls` forced (the default would carry same-host traffic over shared
/// memory), on uroce0 only. Returns the client's "Final:" line.
fn perftest(tls: &str, test: &str, port: u16) -> String {
    let limit = Duration::from_secs(20);
    let env = |c: &mut Command| {
        c.env("UCX_TLS", tls).env("UCX_NET_DEVICES", "uroce0:1");
    };
    let mut server = ucx_command("ucx_perftest", "127.0.0.143");
    env(&mut server);
    let server = Reap(Some(server.args(["-p", &port.to_string()]).spawn().unwrap()));
    assert!(listening(port), "{tls} {test}: the ucx_perftest server never listened on TCP port {port}");
    let mut client = ucx_command("ucx_perftest", "127.0.0.144");
    env(&mut client);
    // Latency with UCX's default 8-byte messages; bandwidth with 64 KiB ones.
    let size = if test.ends_with("_bw") { "65536" } else { "8" };
    client.args(["127.0.0.1", "-p", &port.to_string(), "-t", test, "-n", "1000", "-s", size]);
    let (ok, how, text) = wait(Reap(Some(client.spawn().unwrap())), limit);
    let (sok, show, stext) = wait(server, limit);
    assert!(ok && sok, "UCX_TLS={tls} {test}: client {how}, server {show}\n--- client:\n{text}\n--- server:\n{stext}");
    text.lines().find(|l| l.starts_with("Final:")).unwrap_or_else(|| panic!("{tls} {test}: no result:\n{text}")).into()
}

/// 20 runs in a row for each transport set, cycling through the four
/// tests (5 runs of each), 40 in all: a crash (at teardown, say) or a hang of
/// either process fails. About 1 s a run on a quiet machine; each is
/// bounded (20 s), the whole not (beside other work it took 6 s a run).
#[test]
fn ucx_perftest_runs_over_ud_verbs_and_rc_verbs() {
    let _serial = serial();
    if let Some(why) = missing() {
        skip!("{why}");
    }
    let started = Instant::now();
    let mut port = 19600;
    for tls in ["ud_verbs", "rc_verbs,ud_verbs"] {
        for run in 0..20 {
            let test = ["ucp_put_bw", "ucp_am_lat", "tag_lat", "tag_bw"][run % 4];
            port += 1;
            let result = perftest(tls, test, port);
            if run < 4 {
                println!("UCX_TLS={tls} {test}: {result}");
            }
        }
    }
    println!("{} runs took {:?}", port - 19600, started.elapsed());
}
