//! Two processes: over loopback on one host (each picks its own 127.0.0.x),
//! and across two network namespaces joined by a veth pair.

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const PEER: &str = env!("CARGO_BIN_EXE_uroce-rc-peer");

fn wait_ok(mut child: std::process::Child, what: &str, limit: Duration) {
    let t = Instant::now();
    loop {
        if let Some(st) = child.try_wait().unwrap() {
            let out = child.wait_with_output().unwrap();
            assert!(
                st.success(),
                "{what} failed: {}\n{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
            return;
        }
        if t.elapsed() > limit {
            let _ = child.kill();
            panic!("{what} did not finish in {limit:?}");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn two_processes_on_loopback() {
    let tcp = 30000 + (std::process::id() % 20000) as u16;
    // Distinct addresses, as two processes started by hand get by default.
    let server = Command::new(PEER)
        .args(["--server", &tcp.to_string()])
        .env("UROCE_ADDR", "127.0.0.11")
        .env("UROCE_PORT", (tcp + 1).to_string())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let client = Command::new(PEER)
        .args(["--client", &format!("127.0.0.1:{tcp}")])
        .env("UROCE_ADDR", "127.0.0.12")
        .env("UROCE_PORT", (tcp + 1).to_string())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    wait_ok(client, "client", Duration::from_secs(60));
    wait_ok(server, "server", Duration::from_secs(10));
}

fn sh(args: &[&str]) -> bool {
    Command::new(args[0])
        .args(&args[1..])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// Removes the namespaces even if the test fails.
struct Netns(Vec<String>);

impl Drop for Netns {
    fn drop(&mut self) {
        for n in &self.0 {
            sh(&["ip", "netns", "del", n]);
        }
    }
}

#[test]
fn rc_across_network_namespaces_over_veth() {
    netns_pair("rc_across_network_namespaces_over_veth", "4", None);
}

/// The same over IPv6 (RoCEv2 GIDs are the IPv6 addresses; the ICRC covers
/// the IPv6 header). The out-of-band TCP exchange stays on IPv4.
#[test]
fn rc_across_network_namespaces_over_veth_ipv6() {
    netns_pair("rc_across_network_namespaces_over_veth_ipv6", "6", Some(("fd75:726f:6365::1", "fd75:726f:6365::2")));
}

fn netns_pair(test: &str, tag: &str, v6: Option<(&str, &str)>) {
    let id = std::process::id() % 100000;
    let (a, b) = (format!("uroce{tag}a-{id}"), format!("uroce{tag}b-{id}"));
    if !sh(&["ip", "netns", "add", &a]) {
        println!("SKIP {test}: `ip netns add` is not available here (needs root and iproute2)");
        return;
    }
    let _guard = Netns(vec![a.clone(), b.clone()]);
    assert!(sh(&["ip", "netns", "add", &b]));
    let (va, vb) = (format!("u{tag}a{id}"), format!("u{tag}b{id}"));
    assert!(sh(&["ip", "link", "add", &va, "netns", &a, "type", "veth", "peer", "name", &vb, "netns", &b]), "veth");
    let v4 = |n: u8| format!("10.77.{}.{n}", if tag == "6" { 6 } else { 0 });
    for (ns, dev, n) in [(&a, &va, 1u8), (&b, &vb, 2u8)] {
        assert!(sh(&["ip", "-n", ns, "addr", "add", &format!("{}/24", v4(n)), "dev", dev]));
        if let Some(addrs) = v6 {
            let ip = if n == 1 { addrs.0 } else { addrs.1 };
            assert!(sh(&["ip", "-n", ns, "-6", "addr", "add", &format!("{ip}/64"), "dev", dev, "nodad"]));
        }
        assert!(sh(&["ip", "-n", ns, "link", "set", dev, "up"]));
        assert!(sh(&["ip", "-n", ns, "link", "set", "lo", "up"]));
    }
    let (ua, ub) = match v6 {
        Some((x, y)) => (x.to_string(), y.to_string()),
        None => (v4(1), v4(2)),
    };
    let server = Command::new("ip")
        .args(["netns", "exec", &b, PEER, "--server", "18515"])
        .env("UROCE_ADDR", &ub)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let client = Command::new("ip")
        .args(["netns", "exec", &a, PEER, "--client", &format!("{}:18515", v4(2))])
        .env("UROCE_ADDR", &ua)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    wait_ok(client, &format!("{test}: client"), Duration::from_secs(60));
    wait_ok(server, &format!("{test}: server"), Duration::from_secs(10));
}
