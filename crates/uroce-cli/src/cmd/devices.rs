//! `uroce devices`: the device this process opens with the current
//! configuration, its port and GID, like `ibv_devinfo`.

use std::process::ExitCode;
use uroce::verbs::{Context, DeviceConfig};

#[derive(clap::Args)]
pub struct Args {}

pub fn run(_: Args) -> ExitCode {
    let list = match DeviceConfig::list_from_env() {
        Ok(l) => l,
        Err(e) => {
            eprintln!("uroce devices: {e}");
            return ExitCode::from(2);
        }
    };
    let mut status = ExitCode::SUCCESS;
    for cfg in list {
        if let Err(e) = show(&cfg) {
            eprintln!("uroce devices: {}: {e}", cfg.name);
            status = ExitCode::FAILURE;
        }
    }
    status
}

/// Opens one device (its own address, as a verbs program would) and prints it.
fn show(cfg: &DeviceConfig) -> Result<(), uroce::ib::Error> {
    let ctx = Context::open(cfg)?;
    let d = ctx.query_device();
    let p = ctx.query_port(1)?;
    let gid = ctx.query_gid(0)?;
    println!("hca_id: {}", ctx.name());
    println!("\ttransport:\t\tInfiniBand (0)");
    println!("\tfw_ver:\t\t\t{}", d.fw_ver);
    println!("\tnode_guid:\t\t{:016x}", d.node_guid);
    println!("\tvendor_id:\t\t{:#x}", d.vendor_id);
    println!(
        "\tmax_qp:\t\t\t{}\n\tmax_qp_wr:\t\t{}\n\tmax_sge:\t\t{}\n\tmax_cqe:\t\t{}\n\tmax_mr:\t\t\t{}\n\tmax_mw:\t\t\t{}",
        d.max_qp, d.max_qp_wr, d.max_sge, d.max_cqe, d.max_mr, d.max_mw
    );
    println!("\tdevice_cap_flags:\t{:#010x}", d.device_cap_flags);
    println!(
        "\todp:\t\t\texplicit, implicit; RC send/recv/write/read/atomic/srq_recv, UC send/recv/write, UD send/recv"
    );
    println!("\tpeer memory:\t\t{}", {
        let s = uroce::mem::peer::client_stats();
        if s.is_empty() {
            "no client loaded".to_string()
        } else {
            s.iter().map(|c| c.name.clone()).collect::<Vec<_>>().join(", ")
        }
    });
    println!("\tport:\t1");
    println!("\t\tstate:\t\t\tPORT_ACTIVE (4)");
    println!("\t\tmax_mtu:\t\t{} ({})", p.max_mtu.bytes(), p.max_mtu.to_raw());
    println!("\t\tactive_mtu:\t\t{} ({})", p.active_mtu.bytes(), p.active_mtu.to_raw());
    println!("\t\tlink_layer:\t\tEthernet");
    let g: Vec<String> = gid.0.chunks(2).map(|c| format!("{:02x}{:02x}", c[0], c[1])).collect();
    println!("\t\tGID[0]:\t\t\t{}, RoCE v2  ({} udp {})", g.join(":"), ctx.local_addr().ip(), ctx.local_addr().port());
    Ok(())
}
