//! `uroce devices`: the device this process opens with the current
//! configuration, its port and GID, like `ibv_devinfo`.

use std::process::ExitCode;
use uroce::verbs::{Context, DeviceConfig};

#[derive(clap::Args)]
pub struct Args {}

pub fn run(_: Args) -> ExitCode {
    let cfg = match DeviceConfig::from_env() {
        Ok(c) => c,
        Err(e) => {
            eprintln!("uroce devices: {e}");
            return ExitCode::from(2);
        }
    };
    let ctx = match Context::open(&cfg) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("uroce devices: {e}");
            return ExitCode::FAILURE;
        }
    };
    let d = ctx.query_device();
    let p = ctx.query_port(1).expect("port 1 exists");
    let gid = ctx.query_gid(0).expect("GID 0 exists");
    println!("hca_id: {}", ctx.name());
    println!("\ttransport:\t\tInfiniBand (0)");
    println!("\tfw_ver:\t\t\t{}", d.fw_ver);
    println!("\tnode_guid:\t\t{:016x}", d.node_guid);
    println!(
        "\tmax_qp:\t\t\t{}\n\tmax_qp_wr:\t\t{}\n\tmax_sge:\t\t{}\n\tmax_cqe:\t\t{}",
        d.max_qp, d.max_qp_wr, d.max_sge, d.max_cqe
    );
    println!("\tport:\t1");
    println!("\t\tstate:\t\t\tPORT_ACTIVE (4)");
    println!("\t\tmax_mtu:\t\t{} ({})", p.max_mtu.bytes(), p.max_mtu.to_raw());
    println!("\t\tactive_mtu:\t\t{} ({})", p.active_mtu.bytes(), p.active_mtu.to_raw());
    println!("\t\tlink_layer:\t\tEthernet");
    let g: Vec<String> = gid.0.chunks(2).map(|c| format!("{:02x}{:02x}", c[0], c[1])).collect();
    println!("\t\tGID[0]:\t\t\t{}, RoCE v2  ({} udp {})", g.join(":"), ctx.local_addr().ip(), ctx.local_addr().port());
    ExitCode::SUCCESS
}
