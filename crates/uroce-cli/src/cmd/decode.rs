//! `uroce decode FILE.pcap`: each RoCE packet's headers and ICRC verdict.
//! Exit status: 0 all ICRCs correct, 1 a bad ICRC or malformed packet,
//! 2 the file cannot be read.

use std::process::ExitCode;

#[derive(clap::Args)]
pub struct Args {
    /// A classic pcap file (Ethernet, Linux SLL/SLL2 or raw IP).
    file: std::path::PathBuf,
    /// UDP port of the RoCE traffic.
    #[arg(long, default_value_t = uroce::wire::ROCE_V2_PORT)]
    port: u16,
}

pub fn run(a: Args) -> ExitCode {
    let f = match std::fs::File::open(&a.file) {
        Ok(f) => f,
        Err(e) => {
            eprintln!("uroce decode: {}: {e}", a.file.display());
            return ExitCode::from(2);
        }
    };
    let mut out = std::io::stdout().lock();
    match uroce::wire::decode::decode_pcap(std::io::BufReader::new(f), a.port, &mut out) {
        Ok(s) if s.icrc_bad == 0 && s.malformed == 0 => ExitCode::SUCCESS,
        Ok(_) => ExitCode::from(1),
        Err(e) => {
            eprintln!("uroce decode: {}: {e}", a.file.display());
            ExitCode::from(2)
        }
    }
}
