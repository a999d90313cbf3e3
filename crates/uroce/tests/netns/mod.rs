//! Network namespaces joined by a veth pair, for multi-host tests on one
//! machine; and waiting for child processes. Removed on drop.
#![allow(dead_code)]

#[path = "../skip/mod.rs"]
mod skip;

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

pub fn sh(args: &[&str]) -> bool {
    Command::new(args[0])
        .args(&args[1..])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// Waits (at most `limit`) for a child; its exit success and output.
pub fn wait(mut child: Child, what: &str, limit: Duration) -> (bool, String) {
    let t = Instant::now();
    loop {
        if let Some(st) = child.try_wait().unwrap() {
            let out = child.wait_with_output().unwrap();
            let text = String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr);
            return (st.success(), text);
        }
        if t.elapsed() > limit {
            let _ = child.kill();
            let out = child.wait_with_output().unwrap();
            panic!(
                "{what} did not finish in {limit:?}:\n{}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

pub fn wait_ok(child: Child, what: &str, limit: Duration) -> String {
    let (ok, text) = wait(child, what, limit);
    assert!(ok, "{what} failed:\n{text}");
    text
}

/// Two namespaces `a` and `b` joined by veth `va`/`vb`, with IPv4
/// 10.77.<net>.1 and .2 (and optional IPv6 addresses).
pub struct Pair {
    pub a: String,
    pub b: String,
    pub va: String,
    pub vb: String,
    pub ip_a: String,
    pub ip_b: String,
}

impl Pair {
    /// None (after printing the test's SKIP line) when namespaces cannot
    /// be made; the test then returns.
    pub fn new(_test: &str, tag: &str, net: u8, v6: Option<(&str, &str)>) -> Option<Pair> {
        let id = std::process::id() % 100000;
        let (a, b) = (format!("uroce{tag}a-{id}"), format!("uroce{tag}b-{id}"));
        if !sh(&["ip", "netns", "add", &a]) {
            skip::whole("`ip netns add` is not available here (needs root and iproute2)");
            return None;
        }
        let (va, vb) = (format!("u{tag}a{id}"), format!("u{tag}b{id}"));
        let p = Pair {
            a: a.clone(),
            b: b.clone(),
            va: va.clone(),
            vb: vb.clone(),
            ip_a: format!("10.77.{net}.1"),
            ip_b: format!("10.77.{net}.2"),
        };
        assert!(sh(&["ip", "netns", "add", &b]));
        assert!(sh(&["ip", "link", "add", &va, "netns", &a, "type", "veth", "peer", "name", &vb, "netns", &b]), "veth");
        for (ns, dev, ip, n) in [(&a, &va, &p.ip_a, 1), (&b, &vb, &p.ip_b, 2)] {
            assert!(sh(&["ip", "-n", ns, "addr", "add", &format!("{ip}/24"), "dev", dev]));
            if let Some(addrs) = v6 {
                let ip6 = if n == 1 { addrs.0 } else { addrs.1 };
                assert!(sh(&["ip", "-n", ns, "-6", "addr", "add", &format!("{ip6}/64"), "dev", dev, "nodad"]));
            }
            assert!(sh(&["ip", "-n", ns, "link", "set", dev, "up"]));
            assert!(sh(&["ip", "-n", ns, "link", "set", "lo", "up"]));
        }
        if v6.is_some() {
            // Neighbour discovery starts working once the link-local
            // addresses have passed duplicate address detection (about 1 s
            // after the link comes up); before, packets to the peer vanish
            // and seven retries of a 67 ms timeout are not enough.
            for (ns, dev) in [(&a, &va), (&b, &vb)] {
                let t = std::time::Instant::now();
                while t.elapsed() < std::time::Duration::from_secs(5) {
                    let out =
                        Command::new("ip").args(["-n", ns, "-6", "addr", "show", "dev", dev, "tentative"]).output();
                    if out.is_ok_and(|o| o.status.success() && o.stdout.is_empty()) {
                        break;
                    }
                    std::thread::sleep(std::time::Duration::from_millis(50));
                }
            }
        }
        Some(p)
    }

    /// A command run inside namespace `ns`.
    pub fn exec(&self, ns: &str, prog: &str, args: &[&str]) -> Command {
        let mut c = Command::new("ip");
        c.args(["netns", "exec", ns, prog]).args(args).stdout(Stdio::piped()).stderr(Stdio::piped());
        c
    }

    /// Takes a's end of the link down or up.
    pub fn link(&self, up: bool) {
        assert!(sh(&["ip", "-n", &self.a, "link", "set", &self.va, if up { "up" } else { "down" }]));
    }
}

impl Drop for Pair {
    fn drop(&mut self) {
        sh(&["ip", "netns", "del", &self.a]);
        sh(&["ip", "netns", "del", &self.b]);
    }
}
