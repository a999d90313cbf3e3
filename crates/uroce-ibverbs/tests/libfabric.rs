//! libfabric (Debian 12's libfabric1 / libfabric-bin 1.17) on uroce through
//! the drop-in libraries, unchanged: its verbs provider lists uroce's MSG,
//! XRC and DGRAM endpoints, and `fi_pingpong` runs over `-e msg`, over
//! `-e rdm` with `verbs;ofi_rxm` and over `-e dgram`, between two
//! processes of one host and between two network namespaces.
//!
//! And `tests/c/fabric.c`, what applications do with libfabric's API: over
//! MSG endpoints CM data both ways, send/recv, RMA write and read, RMA write
//! with CQ data, a CQ waited on through epoll; over RDM endpoints
//! (`verbs;ofi_rxm`) tagged messages and atomics (sum, fetching sum,
//! compare and swap), on one host and between namespaces.
//!
//! libfabric's verbs provider only offers MSG endpoints on a device whose
//! address belongs to a network interface other than `lo`, so these tests
//! give the devices the addresses of a veth pair in namespaces they make
//! (tests/netns); without `ip netns` (root) or libfabric-bin they skip.

#[path = "../../uroce/tests/skip/mod.rs"]
#[macro_use]
mod skip;
// netns loads the skip module for itself too (its SKIP lines).
#[allow(clippy::duplicate_mod)]
#[path = "../../uroce/tests/netns/mod.rs"]
mod netns;
mod support;

use std::io::BufRead;
use std::process::Command;
use std::time::Duration;
use support::{dropin_dir, have, listening_at, root, serial, Reap};

/// fi_pingpong's out-of-band TCP port (its default).
const CTRL_PORT: u16 = 47592;

/// Why libfabric cannot run here, if it cannot.
fn missing() -> Option<&'static str> {
    if !have("fi_info") || !have("fi_pingpong") {
        return Some("fi_info/fi_pingpong are not installed (Debian package libfabric-bin)");
    }
    None
}

/// `prog args` in namespace `ns` through the drop-in libraries, its device
/// at `addr`, output captured.
fn in_ns(p: &netns::Pair, ns: &str, addr: &str, prog: &str, args: &[&str]) -> Command {
    let mut c = p.exec(ns, prog, args);
    c.env("LD_LIBRARY_PATH", dropin_dir()).env("UROCE_ADDR", addr);
    for (k, _) in std::env::vars_os() {
        if k.to_string_lossy().starts_with("FI_") {
            c.env_remove(k);
        }
    }
    c
}

/// Waits (at most 20 s) until process `pid` (in its own namespace) listens
/// on TCP `port`.
fn listening_in(pid: u32, port: u16) -> bool {
    listening_at(&format!("/proc/{pid}/net"), port, Duration::from_secs(20))
}

/// Namespaces for one test: `a` and `b` joined by a veth pair, and a
/// second address (`ip_a2`) on a's end for a second process of that host.
fn namespaces(tag: &str, net: u8) -> Option<(netns::Pair, String)> {
    let p = netns::Pair::new(&skip::test_name(), tag, net, None)?;
    let ip_a2 = format!("10.77.{net}.3");
    assert!(netns::sh(&["ip", "-n", &p.a, "addr", "add", &format!("{ip_a2}/24"), "dev", &p.va]));
    Some((p, ip_a2))
}

/// fi_pingpong server in `sns` at `saddr`, client in `cns` at `caddr`,
/// with `args`; both must finish and print their results table.
/// A device address may be an interface's name (`UROCE_ADDR=<interface>`);
/// the client is then told the server's `ip`.
fn pingpong(p: &netns::Pair, (sns, sdev, saddr): (&str, &str, &str), (cns, caddr): (&str, &str), args: &[&str]) {
    let what = format!("fi_pingpong {}", args.join(" "));
    let mut server = Reap::new(in_ns(p, sns, sdev, "fi_pingpong", args).spawn().unwrap());
    let pid = server.0.as_ref().unwrap().id();
    assert!(listening_in(pid, CTRL_PORT), "{what}: the server never listened on TCP {CTRL_PORT}");
    let mut cargs = args.to_vec();
    cargs.push(saddr);
    let client = Reap::new(in_ns(p, cns, caddr, "fi_pingpong", &cargs).spawn().unwrap());
    let (ok, out) = { client }.wait(&what, Duration::from_secs(120));
    let (sok, sout) = server.wait(&what, Duration::from_secs(30));
    // Every size of the series, on both sides.
    let sizes = |t: &str| t.lines().filter(|l| l.split_whitespace().nth(2).is_some_and(|a| a.starts_with('='))).count();
    let (n, sn) = (sizes(&out), sizes(&sout));
    // Known: ofi_rxm (libfabric 1.17) sometimes crashes while it closes its
    // connections after the last transfer (README, "libfabric"): a use of
    // a freed fid in the main thread's fi_close. The crashed side's table
    // may be lost with its unflushed stdout; the other side's must be whole.
    let crashed = |t: &str| t.contains("terminated with signal 11") || t.contains("signal: 11");
    let whole = |t: &str| {
        t.lines().any(|l| l.starts_with("1m ") && l.split_whitespace().nth(2).is_some_and(|a| a.starts_with('=')))
    };
    let teardown_crash = args.contains(&"rdm")
        && ((!ok && crashed(&out) && sok && whole(&sout)) || (!sok && crashed(&sout) && ok && whole(&out)));
    if teardown_crash {
        skip::part(format!(
            "{what}: every size done, then ofi_rxm crashed at teardown (known issue): client: {out}\nserver: {sout}"
        ));
        return;
    }
    assert!(n > 0 && n == sn, "{what}: results differ: client: {out}\nserver: {sout}");
    assert!(ok && sok, "{what}: client: {out}\nserver: {sout}");
}

/// The three endpoint types, each with the sizes 64 B to 1 MiB (MSG, RDM)
/// or what fits a datagram, few iterations each.
fn pingpong_all(p: &netns::Pair, server: (&str, &str, &str), client: (&str, &str)) {
    pingpong(p, server, client, &["-p", "verbs", "-e", "msg", "-I", "20"]);
    pingpong(p, server, client, &["-p", "verbs;ofi_rxm", "-e", "rdm", "-I", "10"]);
    pingpong(p, server, client, &["-p", "verbs", "-e", "dgram", "-I", "20"]);
}

#[test]
fn fi_info_lists_msg_xrc_and_dgram_endpoints() {
    if let Some(why) = missing() {
        skip!("{why}");
    }
    let _g = serial();
    let Some((p, _)) = namespaces("lfi", 61) else { return };
    // No hints (FI_PROVIDER selects verbs): XRC is listed only then, as
    // its endpoints need hints with a shared receive context.
    let mut c = in_ns(&p, &p.a, &p.ip_a, "fi_info", &[]);
    c.env("FI_PROVIDER", "verbs");
    let out = c.output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "fi_info: {text}");
    for (domain, kind, proto) in [
        ("uroce0", "FI_EP_MSG", "FI_PROTO_RDMA_CM_IB_RC"),
        ("uroce0-xrc", "FI_EP_MSG", "FI_PROTO_RDMA_CM_IB_XRC"),
        ("uroce0-dgram", "FI_EP_DGRAM", "FI_PROTO_IB_UD"),
    ] {
        let found = text.split("provider: ").any(|e| {
            e.contains(&format!("domain: {domain}\n")) && e.contains(kind) && e.contains(&format!("protocol: {proto}"))
        });
        assert!(found, "fi_info lists no {domain} {kind} {proto}:\n{text}");
    }
    // And `-p "verbs;ofi_rxm"` the RDM endpoint over it.
    let out = in_ns(&p, &p.a, &p.ip_a, "fi_info", &["-p", "verbs;ofi_rxm"]).output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success() && text.contains("FI_EP_RDM") && text.contains("domain: uroce0"), "{text}");
}

#[test]
fn fi_pingpong_msg_rdm_dgram_on_one_host() {
    if let Some(why) = missing() {
        skip!("{why}");
    }
    let _g = serial();
    let Some((p, ip_a2)) = namespaces("lf1", 62) else { return };
    pingpong_all(&p, (&p.a, &p.ip_a, &p.ip_a), (&p.a, &ip_a2));
}

#[test]
fn fi_pingpong_msg_rdm_dgram_between_two_namespaces() {
    if let Some(why) = missing() {
        skip!("{why}");
    }
    let _g = serial();
    let Some((p, _)) = namespaces("lf2", 63) else { return };
    // The devices named by their interfaces (UROCE_ADDR=<veth>).
    pingpong_all(&p, (&p.a, &p.va, &p.ip_a), (&p.b, &p.vb));
}

/// tests/c/fabric.c, built against Debian's libfabric-dev.
fn fabric_program() -> Option<std::path::PathBuf> {
    if !std::path::Path::new("/usr/include/rdma/fabric.h").exists() {
        return None;
    }
    let exe = dropin_dir().join("fabric-test");
    let cc = Command::new("cc")
        .args(["-O1", "-g", "-Wall", "-Werror", "-o"])
        .arg(&exe)
        .arg(root().join("crates/uroce-ibverbs/tests/c/fabric.c"))
        .arg("-lfabric")
        .output()
        .expect("run cc");
    assert!(cc.status.success(), "cc: {}", String::from_utf8_lossy(&cc.stderr));
    Some(exe)
}

/// fabric.c's `mode` (msg, rdm) server in `sns` at `saddr` and client in
/// `cns` at `caddr`; the client starts once the server says it listens.
fn fabric(p: &netns::Pair, exe: &str, mode: &str, (sns, saddr): (&str, &str), (cns, caddr): (&str, &str)) {
    const PORT: &str = "9311";
    let mut server = Reap::new(in_ns(p, sns, saddr, exe, &[mode, "server", PORT]).spawn().unwrap());
    let out = server.0.as_mut().unwrap().stdout.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    let lines = std::thread::spawn(move || {
        let mut all = String::new();
        for l in std::io::BufReader::new(out).lines().map_while(Result::ok) {
            if l == "listening" {
                let _ = tx.send(());
            }
            all += &l;
            all.push('\n');
        }
        all
    });
    if rx.recv_timeout(Duration::from_secs(30)).is_err() {
        let (_, err) = server.wait("fabric server", Duration::from_secs(1));
        panic!("fabric {mode} server never listened: {}{err}", lines.join().unwrap_or_default());
    }
    let client = Reap::new(in_ns(p, cns, caddr, exe, &[mode, "client", saddr, PORT]).spawn().unwrap());
    let (ok, cout) = { client }.wait("fabric client", Duration::from_secs(60));
    let (sok, serr) = server.wait("fabric server", Duration::from_secs(30));
    let sout = lines.join().unwrap_or_default() + &serr;
    // The known crash of ofi_rxm's teardown (see `pingpong`): every transfer
    // done on both sides, then one side died of SIGSEGV in its fi_close.
    let done = |t: &str| {
        t.contains(&format!("fabric {mode} client transfers done"))
            || t.contains(&format!("fabric {mode} server transfers done"))
    };
    let crashed = |ok: bool, t: &str| !ok && (t.contains("terminated with signal 11") || t.contains("signal: 11"));
    if mode == "rdm" && done(&cout) && done(&sout) && (crashed(ok, &cout) || crashed(sok, &sout)) && (ok || sok) {
        skip::part(format!("fabric rdm: every transfer done, then ofi_rxm crashed at teardown (known issue): client: {cout}\nserver: {sout}"));
        return;
    }
    assert!(ok && sok, "fabric {mode}: client: {cout}\nserver: {sout}");
    assert!(cout.contains(&format!("fabric {mode} client ok")), "{cout}");
    assert!(sout.contains(&format!("fabric {mode} server ok")), "{sout}");
}

#[test]
fn libfabric_api_msg_and_rdm_on_one_host_and_between_namespaces() {
    if let Some(why) = missing() {
        skip!("{why}");
    }
    let _g = serial();
    let Some(exe) = fabric_program() else { skip!("rdma/fabric.h is not installed (Debian package libfabric-dev)") };
    let exe = exe.to_str().unwrap();
    let Some((p, ip_a2)) = namespaces("lfc", 64) else { return };
    for mode in ["msg", "rdm"] {
        fabric(&p, exe, mode, (&p.a, &p.ip_a), (&p.a, &ip_a2));
        fabric(&p, exe, mode, (&p.a, &p.ip_a), (&p.b, &p.ip_b));
    }
}
