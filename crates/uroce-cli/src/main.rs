//! The `uroce` command. Each subcommand lives in its own file under `cmd/`.

mod cmd;

use clap::{Parser, Subcommand};
use std::process::ExitCode;

#[derive(Parser)]
#[command(name = "uroce", version, about = "A user-space RoCEv2 RDMA device")]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Print every RoCE packet of a pcap file and check its ICRC.
    Decode(cmd::decode::Args),
    /// Two devices on loopback doing RDMA WRITE, READ, SEND and atomics.
    Demo(cmd::demo::Args),
    /// Show the device this process would open (like ibv_devinfo).
    Devices(cmd::devices::Args),
    /// Counters of every process using uroce: table, JSON or Prometheus.
    Stat(cmd::stat::Args),
    /// Peer-memory clients: per-client counters, or `status`.
    Peers(cmd::peers::Args),
    /// Packet capture of a running process or of a command.
    Capture(cmd::capture::Args),
    /// Benchmark (perftest-like), with raw UDP baselines in the same run.
    Bench(Box<cmd::bench::Args>),
    /// Print a shell completion script (bash, zsh, fish, elvish, powershell).
    Completions { shell: clap_complete::Shell },
}

fn main() -> ExitCode {
    // A UROCE_LOG that does not parse is refused, not replaced by a default.
    let filter = match std::env::var("UROCE_LOG").ok().filter(|v| !v.is_empty()) {
        None => tracing_subscriber::EnvFilter::new("warn"),
        Some(v) => match tracing_subscriber::EnvFilter::try_new(&v) {
            Ok(f) => f,
            Err(e) => {
                eprintln!("uroce: UROCE_LOG: not a log filter ({e}): {v}");
                return ExitCode::from(2);
            }
        },
    };
    tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr).init();
    let cli = Cli::parse();
    match cli.cmd {
        Cmd::Decode(a) => cmd::decode::run(a),
        Cmd::Demo(a) => cmd::demo::run(a),
        Cmd::Devices(a) => cmd::devices::run(a),
        Cmd::Stat(a) => cmd::stat::run(a),
        Cmd::Peers(a) => cmd::peers::run(a),
        Cmd::Capture(a) => cmd::capture::run(a),
        Cmd::Bench(a) => cmd::bench::run(*a),
        Cmd::Completions { shell } => {
            use clap::CommandFactory;
            clap_complete::generate(shell, &mut Cli::command(), "uroce", &mut std::io::stdout());
            ExitCode::SUCCESS
        }
    }
}
