//! Two processes: over loopback on one host (each picks its own 127.0.0.x),
//! and across two network namespaces joined by a veth pair.

use std::process::{Command, Stdio};
use std::time::Duration;

const PEER: &str = env!("CARGO_BIN_EXE_uroce-rc-peer");

mod netns;

use netns::{wait_ok, Pair};

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
    let Some(p) = Pair::new(test, tag, if tag == "6" { 6 } else { 0 }, v6) else { return };
    let (ua, ub) = match v6 {
        Some((x, y)) => (x.to_string(), y.to_string()),
        None => (p.ip_a.clone(), p.ip_b.clone()),
    };
    let server = p.exec(&p.b, PEER, &["--server", "18515"]).env("UROCE_ADDR", &ub).spawn().unwrap();
    let client =
        p.exec(&p.a, PEER, &["--client", &format!("{}:18515", p.ip_b)]).env("UROCE_ADDR", &ua).spawn().unwrap();
    wait_ok(client, &format!("{test}: client"), Duration::from_secs(60));
    wait_ok(server, &format!("{test}: server"), Duration::from_secs(10));
}
