//! `uroce capture`: packet capture (pcap, decoded by Wireshark/tshark as
//! RoCEv2) of a running process, or of a command that `uroce` starts.
//!
//! * `uroce capture --pid PID --file F`: every device of process PID starts
//!   writing to F (further devices to `F.<device>`); `--stop` ends it.
//! * `uroce capture --file F -- CMD ARGS…`: runs CMD with capture to F.

use std::path::PathBuf;
use std::process::{Command, ExitCode};
use std::time::{Duration, Instant};

#[derive(clap::Args)]
pub struct Args {
    /// The process to capture (a process using uroce on this host).
    #[arg(long, conflicts_with = "command")]
    pid: Option<u32>,
    /// pcap file to write (`%p` = the captured process's id).
    #[arg(long, required_unless_present = "stop")]
    file: Option<PathBuf>,
    /// Stop capturing in process --pid.
    #[arg(long, requires = "pid")]
    stop: bool,
    /// A command to run with capture on.
    #[arg(last = true)]
    command: Vec<String>,
}

pub fn run(a: Args) -> ExitCode {
    if let Some(pid) = a.pid {
        return remote(pid, a.file, a.stop);
    }
    let Some(file) = a.file else { return usage("--file is needed") };
    let Some((prog, args)) = a.command.split_first() else { return usage("give --pid PID or -- COMMAND") };
    match Command::new(prog).args(args).env("UROCE_CAPTURE", &file).status() {
        Ok(st) => ExitCode::from(st.code().unwrap_or(1).clamp(0, 255) as u8),
        Err(e) => {
            eprintln!("uroce capture: {prog}: {e}");
            ExitCode::from(127)
        }
    }
}

fn usage(msg: &str) -> ExitCode {
    eprintln!("uroce capture: {msg} (see uroce capture --help)");
    ExitCode::from(2)
}

fn remote(pid: u32, file: Option<PathBuf>, stop: bool) -> ExitCode {
    let root = uroce::runtime::runtime_dir();
    // The request is written only into a directory of this user, checked,
    // through its descriptor (see uroce::runtime).
    let dir = match uroce::runtime::SafeDir::open_owned(&root).and_then(|d| d.subdir(&pid.to_string(), None)) {
        Ok(d) if uroce::runtime::process_alive(pid) && d.contains("stats.json") => d,
        Ok(_) => {
            eprintln!(
                "uroce capture: process {pid} is not using uroce (nothing in {})",
                root.join(pid.to_string()).display()
            );
            return ExitCode::FAILURE;
        }
        Err(e) => {
            eprintln!("uroce capture: process {pid}: {e}");
            return ExitCode::FAILURE;
        }
    };
    let request = match (stop, file) {
        (true, _) => "stop".to_string(),
        (false, Some(f)) => {
            let f = PathBuf::from(f.to_string_lossy().replace("%p", &pid.to_string()));
            let f = if f.is_absolute() { f } else { std::env::current_dir().unwrap_or_default().join(f) };
            format!("start {}", f.display())
        }
        (false, None) => return usage("--file is needed"),
    };
    let _ = dir.remove("capture.status");
    if let Err(e) = dir.write_file("capture.request", request.as_bytes(), 0o600) {
        eprintln!("uroce capture: {}: {e}", dir.path().join("capture.request").display());
        return ExitCode::FAILURE;
    }
    let t = Instant::now();
    while t.elapsed() < Duration::from_secs(5) {
        match dir.read_file("capture.status", 4096, true) {
            Ok(Some(s)) => {
                let s = String::from_utf8_lossy(&s);
                let s = s.trim();
                println!("process {pid}: {s}");
                return if s.starts_with("error") { ExitCode::FAILURE } else { ExitCode::SUCCESS };
            }
            Ok(None) => {}
            Err(e) => {
                eprintln!("uroce capture: {}: {e}", dir.path().join("capture.status").display());
                return ExitCode::FAILURE;
            }
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    eprintln!("uroce capture: process {pid} did not answer within 5 s (statistics publishing off?)");
    ExitCode::FAILURE
}
