//! `uroce decode FILE.pcap`: each RoCE packet's headers and ICRC verdict.
//! A file cut short (a capture whose writer died, a partial copy) is decoded
//! up to its last complete record, then stderr says `file is cut after N
//! records (M trailing bytes)`.
//! Exit status: 0 all ICRCs correct, 1 a bad ICRC, a malformed packet or a
//! cut file, 2 the file cannot be read (or is not a pcap file).

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
        Ok(s) if s.cut.is_some() => {
            eprintln!("uroce decode: {}: {}", a.file.display(), s.cut.unwrap());
            ExitCode::from(1)
        }
        Ok(s) if s.icrc_bad == 0 && s.malformed == 0 => ExitCode::SUCCESS,
        Ok(_) => ExitCode::from(1),
        Err(e) => {
            eprintln!("uroce decode: {}: {e}", a.file.display());
            ExitCode::from(2)
        }
    }
}
