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
    // Every size of the series, on both sides (a result row: "64  10  =10 …").
    let row = |l: &str| l.split_whitespace().nth(2).is_some_and(|a| a.starts_with('='));
    let sizes = |t: &str| t.lines().filter(|l| row(l)).count();
    let (n, sn) = (sizes(&out), sizes(&sout));
    // Known: ofi_rxm (libfabric 1.17) crashes now and then when the peer's
    // disconnect is read before its last receive was polled (see
    // `rxm_teardown_crash`). The crashed side's table may be lost with its
    // unflushed stdout; the other side's must be whole.
    let whole = |t: &str| t.lines().any(|l| l.starts_with("1m ") && row(l));
    let teardown_crash = args.contains(&"rdm")
        && ((!ok && rxm_teardown_crash(&out) && sok && whole(&sout))
            || (!sok && rxm_teardown_crash(&sout) && ok && whole(&out)));
    if teardown_crash {
        skip::part(format!(
            "{what}: every size done, then ofi_rxm crashed at teardown (known issue): client: {out}\nserver: {sout}"
        ));
        return;
    }
    assert!(n > 0 && n == sn, "{what}: results differ: client: {out}\nserver: {sout}");
    assert!(ok && sok, "{what}: client: {out}\nserver: {sout}");
}

/// Whether `text` (a libfabric program's output) shows the known crash of
/// ofi_rxm in Debian 12's libfabric 1.17.0: a connection whose peer
/// disconnected is closed (its verbs endpoint freed) before its completion
/// queue is flushed, and a receive completion the flush then finds is
/// reposted on the freed endpoint (`rxm_close_conn` → `rxm_flush_msg_cq` →
/// `rxm_free_rx_buf` → `rxm_post_recv` → `fi_recv`, the top frame at
/// `libfabric.so.1+0xb7882` in that build). It happens when the
/// disconnect is read before the last receive was polled, on any device
/// that keeps a destroyed QP's completions (kernel rxe does, as uroce);
/// fixed upstream (commit 697688386, "prov/rxm: fix the msg_ep
/// use-after-free at connection teardown"). Only that frame counts: any
/// other crash fails the test.
fn rxm_teardown_crash(text: &str) -> bool {
    let mut lines = text.lines().skip_while(|l| !l.contains("terminated with signal 11"));
    lines.next().is_some() && lines.next().is_some_and(|top| top.contains("libfabric.so.1(+0xb7882)"))
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
    // The known crash of ofi_rxm (see `rxm_teardown_crash`): the client
    // read the server's disconnect before its last receive ("bye"), after
    // the server had finished.
    if mode == "rdm" && !ok && rxm_teardown_crash(&cout) && sok && sout.contains("fabric rdm server ok") {
        skip::part(format!("fabric rdm: the server finished, then the client's ofi_rxm crashed on its disconnect (known libfabric 1.17 bug): client: {cout}\nserver: {sout}"));
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

/// libfabric's default registration-cache monitor (`memhooks`) patches
/// libc's `munmap` and others in place when a domain opens, which crashes a
/// uroce thread that is inside one of them meanwhile (libfabric issue
/// 7569); the drop-in chooses the `userfaultfd` monitor (or none) unless
/// the application chose one (`src/libfabric.rs`). Seen from outside: a
/// patch makes its page writable for a moment, which splits libc's code
/// mapping in `/proc/<pid>/maps`.
#[test]
fn libfabric_over_the_drop_in_leaves_libc_unpatched_unless_memhooks_is_asked_for() {
    if let Some(why) = missing() {
        skip!("{why}");
    }
    let _g = serial();
    let Some(exe) = fabric_program() else { skip!("rdma/fabric.h is not installed (Debian package libfabric-dev)") };
    let Some((p, _)) = namespaces("lfm", 65) else { return };
    // The executable mappings of libc in the RDM server once its domain is open.
    let libc_code_mappings = |monitor: Option<&str>| {
        let mut c = in_ns(&p, &p.a, &p.ip_a, exe.to_str().unwrap(), &["rdm", "server", "9312"]);
        if let Some(m) = monitor {
            c.env("FI_MR_CACHE_MONITOR", m);
        }
        let mut server = Reap::new(c.spawn().unwrap());
        let out = server.0.as_mut().unwrap().stdout.take().unwrap();
        let mut lines = std::io::BufReader::new(out).lines();
        assert!(
            lines.next().and_then(Result::ok).as_deref() == Some("listening"),
            "the fabric rdm server did not come up (FI_MR_CACHE_MONITOR={monitor:?})"
        );
        let pid = server.0.as_ref().unwrap().id();
        let maps = std::fs::read_to_string(format!("/proc/{pid}/maps")).unwrap();
        maps.lines()
            .filter(|l| l.split_whitespace().nth(1).is_some_and(|perm| perm.contains('x')) && l.contains("/libc.so.6"))
            .count()
    };
    assert_eq!(libc_code_mappings(None), 1, "libc's code was patched by libfabric's memhooks monitor");
    assert!(libc_code_mappings(Some("memhooks")) > 1, "memhooks asked for, and libc's code is still one mapping");
}
