//! MPI over UCX over uroce: Debian 12's Open MPI 4.1 (`--mca pml ucx`) and
//! MPICH 4.0 (ch4:ucx) run tests/c/mpi_pingpong.c, two ranks on this host,
//! each rank with its own uroce device (127.0.0.241/242 for Open MPI,
//! .243/.244 for MPICH) through the drop-in library. Rank 0 sends 8 B, 4 KiB
//! and 1 MiB messages (5 of each, each with its own byte pattern), rank 1
//! checks every byte and echoes, rank 0 checks the echo.
//!
//! UCX is held to `UCX_TLS=rc_verbs,ud_verbs,self` on `uroce0:1` (no shared
//! memory, no TCP), and `UCX_LOG_LEVEL=info` must show each rank's
//! endpoint to the other on `rc_verbs/uroce0:1` and nothing but uroce and
//! `self`. A second run in which rank 1 flips one byte of an echo must fail
//! with the program's exit code for a wrong byte (and its report, when the
//! launcher forwards the output): the check is seen to catch it.
//!
//! UCX's registration cache is on (its default). Before uroce made its own
//! remaps of registered memory by system call (`mem::own`), UCX's memory
//! hooks took them for the application's and both MPIs died in the 1 MiB
//! round (the buffer's first pages left read-only); this test failed every
//! time then.
//!
//! Needs openmpi-bin/libopenmpi-dev, mpich/libmpich-dev and /dev/infiniband
//! (scripts/setup-ucx.sh); without them the tests skip (tests/skip).

#[path = "../../uroce/tests/skip/mod.rs"]
#[macro_use]
mod skip;
mod support;

use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};
use support::{dropin_dir, have, root, serial, wait_output};

/// One MPI implementation: its Debian packages and suffixed tools.
struct Mpi {
    name: &'static str,
    cc: &'static str,
    run: &'static str,
    packages: &'static str,
    addrs: [&'static str; 2],
}

const OPENMPI: Mpi = Mpi {
    name: "openmpi",
    cc: "mpicc.openmpi",
    run: "mpirun.openmpi",
    packages: "openmpi-bin libopenmpi-dev",
    addrs: ["127.0.0.241", "127.0.0.242"],
};

const MPICH: Mpi = Mpi {
    name: "mpich",
    cc: "mpicc.mpich",
    run: "mpiexec.mpich",
    packages: "mpich libmpich-dev",
    addrs: ["127.0.0.243", "127.0.0.244"],
};

/// What every rank's UCX gets: uroce's transports only, logged at info.
const UCX_ENV: [(&str, &str); 3] =
    [("UCX_TLS", "rc_verbs,ud_verbs,self"), ("UCX_NET_DEVICES", "uroce0:1"), ("UCX_LOG_LEVEL", "info")];

/// How long one mpirun may take (about 2 s on a quiet machine).
const LIMIT: Duration = Duration::from_secs(90);

/// Why `mpi` cannot run here, if it cannot: the test skips with it.
fn missing(mpi: &Mpi) -> Option<String> {
    if !have(mpi.cc) || !have(mpi.run) {
        return Some(format!("{}/{} is not installed (Debian packages {})", mpi.cc, mpi.run, mpi.packages));
    }
    let ok =
        Command::new(root().join("scripts/setup-ucx.sh")).arg("--check").output().is_ok_and(|o| o.status.success());
    if !ok {
        return Some("/dev/infiniband is not installed (scripts/setup-ucx.sh, as root, once)".into());
    }
    None
}

/// tests/c/mpi_pingpong.c built with `mpi`'s compiler into the drop-in
/// folder; `None` when mpi.h is missing (its -dev package is not installed).
fn program(mpi: &Mpi) -> Option<PathBuf> {
    let exe = dropin_dir().join(format!("mpi-pingpong-{}", mpi.name));
    let cc = Command::new(mpi.cc)
        .args(["-O1", "-g", "-Wall", "-Werror", "-o"])
        .arg(&exe)
        .arg(root().join("crates/uroce-ibverbs/tests/c/mpi_pingpong.c"))
        .output()
        .expect("run mpicc");
    let err = String::from_utf8_lossy(&cc.stderr);
    if !cc.status.success() && err.contains("mpi.h: No such file") {
        return None;
    }
    assert!(cc.status.success(), "{}: {err}", mpi.cc);
    Some(exe)
}

/// The launcher's command line: two application contexts of one rank each,
/// each with its own UROCE_ADDR.
fn command(mpi: &Mpi, exe: &str, args: &[&str]) -> Command {
    let mut c = Command::new(mpi.run);
    let lib = dropin_dir().to_str().unwrap().to_string();
    if mpi.name == "openmpi" {
        // UCX's PML (Debian's openmpi-mca-params.conf disables it), no BTL
        // that could carry data; `-x` holds for its own context only.
        c.args([
            "--allow-run-as-root",
            "--oversubscribe",
            "--mca",
            "pml",
            "ucx",
            "--mca",
            "btl",
            "^vader,tcp,openib,uct",
        ]);
        for (i, addr) in mpi.addrs.iter().enumerate() {
            if i > 0 {
                c.arg(":");
            }
            c.args(["-np", "1", "-x", &format!("LD_LIBRARY_PATH={lib}"), "-x", &format!("UROCE_ADDR={addr}")]);
            for (k, v) in UCX_ENV {
                c.args(["-x", &format!("{k}={v}")]);
            }
            c.arg(exe).args(args);
        }
    } else {
        c.args(["-genv", "LD_LIBRARY_PATH", &lib]);
        for (k, v) in UCX_ENV {
            c.args(["-genv", k, v]);
        }
        for (i, addr) in mpi.addrs.iter().enumerate() {
            if i > 0 {
                c.arg(":");
            }
            c.args(["-n", "1", "-env", "UROCE_ADDR", addr, exe]).args(args);
        }
    }
    for (k, _) in std::env::vars_os() {
        if k.to_string_lossy().starts_with("UCX_") {
            c.env_remove(k);
        }
    }
    // Its own process group: a launcher that hangs is killed with its ranks.
    c.stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::piped()).process_group(0);
    c
}

/// Runs the launcher for at most [`LIMIT`]: whether it succeeded, its output.
fn run(mpi: &Mpi, exe: &str, args: &[&str]) -> (bool, String) {
    let c = command(mpi, exe, args).spawn().unwrap();
    let pgid = c.id() as i32;
    let (ok, text) = wait_output(c, mpi.run, LIMIT);
    // Ranks left behind (a launcher killed at the limit) would hold the
    // addresses: end the whole group.
    // SAFETY: a signal to the process group this test created.
    unsafe { libc::kill(-pgid, libc::SIGKILL) };
    (ok, text)
}

/// The UCX endpoint configurations in `text` (`ep_cfg[N]: tag(...) ...`),
/// with the pid of the rank that logged each.
fn endpoints(text: &str) -> Vec<(String, String)> {
    text.lines()
        .filter_map(|l| {
            let (_, cfg) = l.split_once("ep_cfg[")?;
            let (_, lanes) = cfg.split_once(": ")?;
            // "[1795969155.729758] [vm:16615:0]  ucp_worker.c:..."
            let pid = l.split('[').nth(2)?.split(':').nth(1)?.to_string();
            Some((pid, lanes.trim().to_string()))
        })
        .collect()
}

fn pingpong(mpi: &Mpi) {
    let _serial = serial();
    if let Some(why) = missing(mpi) {
        skip!("{why}");
    }
    let Some(exe) = program(mpi) else { skip!("mpi.h is not installed (Debian packages {})", mpi.packages) };
    let exe = exe.to_str().unwrap();
    let started = Instant::now();
    let (ok, text) = run(mpi, exe, &[]);
    let took = started.elapsed();
    assert!(ok && text.contains("mpi pingpong ok"), "{} ping-pong failed:\n{text}", mpi.name);
    let eps = endpoints(&text);
    // Every lane of every endpoint is uroce's or UCX's loopback to itself.
    for (pid, lanes) in &eps {
        let other = lanes
            .split(|c: char| c == '(' || c == ')' || c.is_whitespace())
            .filter(|w| w.contains('/'))
            .find(|w| !["rc_verbs/uroce0:1", "ud_verbs/uroce0:1"].contains(w) && !w.starts_with("self/"));
        assert!(other.is_none(), "{}: rank {pid} has an endpoint over {other:?}: {lanes}\n{text}", mpi.name);
    }
    // Each rank reaches the other (an endpoint without `self`) over rc_verbs on uroce0.
    let mut peers: Vec<&str> = eps
        .iter()
        .filter(|(_, l)| l.contains("tag(rc_verbs/uroce0:1)") && !l.contains("self/"))
        .map(|(p, _)| p.as_str())
        .collect();
    peers.sort_unstable();
    peers.dedup();
    assert_eq!(peers.len(), 2, "{}: not both ranks have an endpoint on rc_verbs/uroce0:1:\n{text}", mpi.name);
    println!("{}: ping-pong over uroce in {took:?}; endpoints: {eps:?}", mpi.name);

    // The same with one byte of rank 1's last 4 KiB echo flipped: rank 0
    // must see it and abort the job with the program's code for a wrong
    // byte, 3, which nothing else in it exits with (MPICH's launcher
    // sometimes loses part of the ranks' output when one aborts: the exit
    // status says it).
    let (ok, text) = run(mpi, exe, &["corrupt"]);
    assert!(!ok && !text.contains("mpi pingpong ok"), "{}: a corrupted echo was not seen:\n{text}", mpi.name);
    assert!(text.contains("exit status: 3"), "{}: the corrupted run failed otherwise:\n{text}", mpi.name);
}

#[test]
fn open_mpi_pingpong_runs_over_ucx_on_uroce() {
    pingpong(&OPENMPI);
}

#[test]
fn mpich_pingpong_runs_over_ucx_on_uroce() {
    pingpong(&MPICH);
}
