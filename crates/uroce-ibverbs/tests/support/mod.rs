//! What the tests that run real programs through the drop-in libraries
//! share: the libraries' folder (built when missing), commands that load
//! them, children that are killed if a test fails before waiting for them,
//! bounded waits, and one-at-a-time servers.
#![allow(dead_code)]

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// Tests that start servers and clients run one at a time: two CPUs.
static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

pub fn serial() -> std::sync::MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

pub fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// target/dropin, with libibverbs.so.1, librdmacm.so.1 and libmlx5.so.1
/// (scripts/build-dropin.sh builds them when one is missing).
pub fn dropin_dir() -> PathBuf {
    let dir =
        std::env::var_os("CARGO_TARGET_DIR").map_or_else(|| root().join("target"), |t| root().join(t)).join("dropin");
    if ["libibverbs.so.1", "librdmacm.so.1", "libmlx5.so.1"].iter().any(|l| !dir.join(l).exists()) {
        let st = Command::new(root().join("scripts/build-dropin.sh")).status().expect("run build-dropin.sh");
        assert!(st.success(), "build-dropin.sh failed");
    }
    dir
}

/// Whether `prog` is on the PATH.
pub fn have(prog: &str) -> bool {
    Command::new("sh")
        .args(["-c", &format!("command -v {prog}")])
        .stdout(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// `prog` run through the drop-in libraries, its device at `addr`, its
/// output captured.
pub fn dropin_command(prog: impl AsRef<std::ffi::OsStr>, addr: &str) -> Command {
    let mut c = Command::new(prog);
    c.env("LD_LIBRARY_PATH", dropin_dir()).env("UROCE_ADDR", addr).stdout(Stdio::piped()).stderr(Stdio::piped());
    c
}

/// Waits at most `limit` for a child to exit; whether it succeeded, and its
/// output (a child still running then is killed, and the output says so).
///
/// Its pipes are read while it runs: a child that writes more than a pipe
/// holds (64 KiB: valgrind's leak report, say) would otherwise block on the
/// write and never exit.
pub fn wait_output(mut child: Child, what: &str, limit: Duration) -> (bool, String) {
    fn drain(r: Option<impl std::io::Read + Send + 'static>) -> std::thread::JoinHandle<Vec<u8>> {
        std::thread::spawn(move || {
            let mut v = Vec::new();
            if let Some(mut r) = r {
                let _ = r.read_to_end(&mut v);
            }
            v
        })
    }
    let (out, err) = (drain(child.stdout.take()), drain(child.stderr.take()));
    let t = Instant::now();
    let st = loop {
        if let Some(st) = child.try_wait().unwrap() {
            break Some(st);
        }
        if t.elapsed() > limit {
            let _ = child.kill();
            break None;
        }
        std::thread::sleep(Duration::from_millis(10));
    };
    let _ = child.wait();
    let (out, err) = (out.join().unwrap_or_default(), err.join().unwrap_or_default());
    let text = String::from_utf8_lossy(&out).to_string() + &String::from_utf8_lossy(&err);
    match st {
        Some(st) if st.success() => (true, text),
        Some(st) => (false, format!("{text}\n[{what}: {st}]")),
        None => (false, format!("{what} did not finish in {limit:?}: {text}")),
    }
}

/// A child process killed if the test fails before it is waited for (a
/// server left behind would hold its device address and TCP port and fail
/// later tests).
pub struct Reap(pub Option<Child>);

impl Reap {
    pub fn new(child: Child) -> Reap {
        Reap(Some(child))
    }

    /// Waits for the child as [`wait_output`] does.
    pub fn wait(&mut self, what: &str, limit: Duration) -> (bool, String) {
        wait_output(self.0.take().expect("a child not yet waited for"), what, limit)
    }

    /// The child, not reaped any more.
    pub fn into_inner(mut self) -> Child {
        self.0.take().expect("a child not yet waited for")
    }

    /// The child, killed (its output can still be read).
    pub fn into_inner_killed(self) -> Child {
        let mut c = self.into_inner();
        let _ = c.kill();
        c
    }
}

impl Drop for Reap {
    fn drop(&mut self) {
        if let Some(c) = &mut self.0 {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// Waits (at most 10 s) until a socket listens on TCP `port`, read from
/// /proc/net/tcp{,6}: servers that accept a single connection (perftest,
/// UCX's) are not probed by connecting.
pub fn listening(port: u16) -> bool {
    listening_at("/proc/net", port, Duration::from_secs(10))
}

/// Waits (at most `limit`) until a socket listens on TCP `port` in the
/// tables `tcp` and `tcp6` of `net` (`/proc/net`, or `/proc/<pid>/net` for
/// a process in another namespace).
pub fn listening_at(net: &str, port: u16, limit: Duration) -> bool {
    let suffix = format!(":{port:04X}");
    let t = Instant::now();
    while t.elapsed() < limit {
        for table in ["tcp", "tcp6"] {
            let text = std::fs::read_to_string(format!("{net}/{table}")).unwrap_or_default();
            // sl local_address rem_address st ...; st 0A is LISTEN.
            let listens = text.lines().skip(1).any(|l| {
                let f: Vec<&str> = l.split_whitespace().collect();
                f.len() > 3 && f[1].ends_with(&suffix) && f[3] == "0A"
            });
            if listens {
                return true;
            }
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    false
}

/// Waits (at most 10 s) until a uroce device has bound UDP 4791 on `addr`
/// (the server's rdma_bind_addr opened it; rdma_listen follows at once),
/// then a little longer.
pub fn device_up(addr: &str) -> bool {
    let ip: std::net::Ipv4Addr = addr.parse().unwrap();
    let want = format!("{:08X}:12B7", u32::from_le_bytes(ip.octets()));
    let t = Instant::now();
    while t.elapsed() < Duration::from_secs(10) {
        let text = std::fs::read_to_string("/proc/net/udp").unwrap_or_default();
        if text.lines().skip(1).any(|l| l.split_whitespace().nth(1) == Some(want.as_str())) {
            std::thread::sleep(Duration::from_millis(300));
            return true;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    false
}

/// The stacks of every thread of process `pid` (by gdb, when installed):
/// what a test that found a child hung prints.
pub fn stacks(pid: u32) -> String {
    let out = Command::new("gdb")
        .args(["-q", "-batch", "-p", &pid.to_string(), "-ex", "thread apply all bt 20"])
        .stdin(Stdio::null())
        .output();
    match out {
        Ok(o) => String::from_utf8_lossy(&o.stdout)
            .lines()
            .filter(|l| l.starts_with('#') || l.starts_with("Thread"))
            .collect::<Vec<_>>()
            .join("\n"),
        Err(e) => format!("(gdb: {e})"),
    }
}

/// A child whose output (stdout and stderr, interleaved as they come) is
/// read while it runs, so a test can wait for a line before acting: the
/// moment something happens, not a fixed time after the start.
pub struct Watched {
    child: Reap,
    text: std::sync::Arc<std::sync::Mutex<String>>,
    readers: Vec<std::thread::JoinHandle<()>>,
}

impl Watched {
    pub fn spawn(mut cmd: Command) -> Watched {
        use std::io::Read;
        let mut child = cmd.spawn().unwrap();
        let text = std::sync::Arc::new(std::sync::Mutex::new(String::new()));
        let mut readers = Vec::new();
        let pipes: [Option<Box<dyn Read + Send>>; 2] = [
            child.stdout.take().map(|p| Box::new(p) as Box<dyn Read + Send>),
            child.stderr.take().map(|p| Box::new(p) as Box<dyn Read + Send>),
        ];
        for mut p in pipes.into_iter().flatten() {
            let text = text.clone();
            readers.push(std::thread::spawn(move || {
                let mut buf = [0u8; 4096];
                while let Ok(n @ 1..) = p.read(&mut buf) {
                    text.lock().unwrap().push_str(&String::from_utf8_lossy(&buf[..n]));
                }
            }));
        }
        Watched { child: Reap::new(child), text, readers }
    }

    /// The output so far.
    pub fn text(&self) -> String {
        self.text.lock().unwrap().clone()
    }

    /// Waits until the output contains `needle` (true) or the child exits
    /// without it (false); panics after `limit`, which only a hang reaches.
    pub fn wait_for(&mut self, needle: &str, limit: Duration) -> bool {
        let t = Instant::now();
        loop {
            if self.text().contains(needle) {
                return true;
            }
            let c = self.child.0.as_mut().expect("not finished");
            if c.try_wait().unwrap().is_some() {
                self.join_readers();
                return self.text().contains(needle);
            }
            if t.elapsed() >= limit {
                let stacks = stacks(c.id());
                panic!("no {needle:?} within {limit:?}:\n{}\n--- its threads:\n{stacks}", self.text());
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    fn join_readers(&mut self) {
        for r in self.readers.drain(..) {
            let _ = r.join();
        }
    }

    /// Waits at most `limit` for the child to exit (killing it then): whether
    /// it succeeded, and all its output.
    pub fn finish(self, limit: Duration) -> (bool, String) {
        let Watched { child, text, readers } = self;
        let mut c = child.into_inner();
        let t = Instant::now();
        let st = loop {
            if let Some(st) = c.try_wait().unwrap() {
                break Some(st);
            }
            if t.elapsed() > limit {
                let _ = c.kill();
                let _ = c.wait();
                break None;
            }
            std::thread::sleep(Duration::from_millis(10));
        };
        for r in readers {
            let _ = r.join();
        }
        let text = text.lock().unwrap().clone();
        match st {
            Some(st) => (st.success(), text),
            None => (false, format!("still running after {limit:?}: killed\n{text}")),
        }
    }
}
