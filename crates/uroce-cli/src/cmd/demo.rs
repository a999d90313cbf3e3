//! Two uroce devices in one process, on loopback, doing RDMA: WRITE, READ,
//! SEND with immediate and atomics over real UDP sockets, with every
//! packet checked by its ICRC. Prints what happened.
//!
//! Run: `uroce demo` (or `cargo run --release -p uroce-cli -- demo`).

use std::net::{IpAddr, Ipv4Addr};
use std::time::{Duration, Instant};

use uroce::verbs::*;

#[derive(clap::Args)]
pub struct Args {
    /// UDP port both demo devices use (0: derived from the process id).
    #[arg(long, default_value_t = 0)]
    port: u16,
    /// Write device A's packets (both directions) to this pcap file.
    #[arg(long)]
    capture: Option<std::path::PathBuf>,
    /// Then keep doing RDMA WRITE and READ for this many seconds (traffic
    /// for `uroce stat` and `uroce capture` to watch).
    #[arg(long, default_value_t = 0)]
    duration: u64,
}

pub fn run(a: Args) -> std::process::ExitCode {
    match demo(a) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("uroce demo: {e}");
            std::process::ExitCode::FAILURE
        }
    }
}

fn demo(a: Args) -> Result<(), Box<dyn std::error::Error>> {
    let duration = Duration::from_secs(a.duration);
    let port = if a.port != 0 { a.port } else { 10000 + (std::process::id() % 20000) as u16 };
    let mut ca = DeviceConfig::at("demo-a", IpAddr::V4(Ipv4Addr::new(127, 0, 0, 1)), port);
    // `uroce capture -- uroce demo` sets UROCE_CAPTURE.
    ca.capture = a.capture.clone().or_else(|| std::env::var_os("UROCE_CAPTURE").map(Into::into));
    let a = Context::open(&ca)?;
    let b = Context::open(&DeviceConfig::at("demo-b", IpAddr::V4(Ipv4Addr::new(127, 0, 0, 2)), port))?;
    println!("device A: {} at {}  GID {}", a.name(), a.local_addr(), a.query_gid(0)?.to_ip());
    println!("device B: {} at {}  GID {}", b.name(), b.local_addr(), b.query_gid(0)?.to_ip());

    let (pa, pb) = (a.alloc_pd()?, b.alloc_pd()?);
    let (cqa, cqb) = (a.create_cq(64, None)?, b.create_cq(64, None)?);
    let (qa, qb) = (pa.create_qp(&QpInitAttr::rc(&cqa, &cqa))?, pb.create_qp(&QpInitAttr::rc(&cqb, &cqb))?);
    qa.connect_rc(&b.query_gid(0)?, qb.qp_num(), 1000, 2000)?;
    qb.connect_rc(&a.query_gid(0)?, qa.qp_num(), 2000, 1000)?;
    println!("RC QP {:#x} <-> QP {:#x} connected (path MTU 4096)\n", qa.qp_num(), qb.qp_num());

    let all = Access::LOCAL_WRITE | Access::REMOTE_WRITE | Access::REMOTE_READ | Access::REMOTE_ATOMIC;
    let len = 1 << 20;
    let data: Vec<u8> = (0..len).map(|i| (i % 251) as u8).collect();
    let src = pa.register(data.clone(), all)?;
    let dst = pb.register(vec![0u8; len], all)?;
    let back = pa.register(vec![0u8; len], all)?;

    let t = Instant::now();
    let mut w = SendWr::new(1, WrOpcode::RdmaWrite);
    w.sg_list = uroce::sgl![src.sge(0, len as u32)];
    w.remote_addr = dst.iova();
    w.rkey = dst.rkey();
    qa.post_send(&w)?;
    let wc = cqa.wait(1, Duration::from_secs(10))?[0];
    let el = t.elapsed();
    println!(
        "RDMA WRITE  1 MiB A->B: {:?}, {:.2} Gb/s, B's memory {}",
        wc.status,
        len as f64 * 8.0 / el.as_secs_f64() / 1e9,
        if dst.to_vec() == data { "matches" } else { "DIFFERS" }
    );

    let t = Instant::now();
    let mut r = SendWr::new(2, WrOpcode::RdmaRead);
    r.sg_list = uroce::sgl![back.sge(0, len as u32)];
    r.remote_addr = dst.iova();
    r.rkey = dst.rkey();
    qa.post_send(&r)?;
    let wc = cqa.wait(1, Duration::from_secs(10))?[0];
    let el = t.elapsed();
    println!(
        "RDMA READ   1 MiB B->A: {:?}, {:.2} Gb/s, read-back {}",
        wc.status,
        len as f64 * 8.0 / el.as_secs_f64() / 1e9,
        if back.to_vec() == data { "matches" } else { "DIFFERS" }
    );

    let rx = pb.register(vec![0u8; 64], Access::LOCAL_WRITE)?;
    qb.post_recv(&RecvWr { wr_id: 7, sg_list: uroce::sgl![rx.sge(0, 64)] })?;
    let msg = pa.register(b"hello from uroce".to_vec(), Access::empty())?;
    let mut s = SendWr::new(3, WrOpcode::SendImm);
    s.sg_list = uroce::sgl![msg.sge(0, 16)];
    s.imm_data = 0x1234_5678;
    qa.post_send(&s)?;
    let rc = cqb.wait(1, Duration::from_secs(10))?[0];
    cqa.wait(1, Duration::from_secs(10))?;
    println!(
        "SEND+IMM    A->B: {:?}, {} bytes {:?}, imm {:#x}",
        rc.status,
        rc.byte_len,
        String::from_utf8_lossy(&rx.to_vec()[..rc.byte_len as usize]),
        rc.imm_data
    );

    let counter = pb.register(vec![0u8; 8], all)?;
    let old = pa.register(vec![0u8; 8], all)?;
    for i in 0..3u64 {
        let mut f = SendWr::new(10 + i, WrOpcode::AtomicFetchAdd);
        f.sg_list = uroce::sgl![old.sge(0, 8)];
        f.remote_addr = counter.iova();
        f.rkey = counter.rkey();
        f.compare_add = 5;
        qa.post_send(&f)?;
        cqa.wait(1, Duration::from_secs(10))?;
    }
    let mut c = [0u8; 8];
    counter.read_at(0, &mut c)?;
    println!("FETCH_ADD   3 x +5 on B's counter: now {}", u64::from_ne_bytes(c));

    if !duration.is_zero() {
        println!("\nRDMA WRITE + READ of 64 KiB for {duration:?} (watch with `uroce stat`) ...");
        let t = Instant::now();
        let mut n = 0u64;
        while t.elapsed() < duration {
            let mut w = SendWr::new(100, WrOpcode::RdmaWrite);
            w.sg_list = uroce::sgl![src.sge(0, 65536)];
            w.remote_addr = dst.iova();
            w.rkey = dst.rkey();
            qa.post_send(&w)?;
            let mut r = SendWr::new(101, WrOpcode::RdmaRead);
            r.sg_list = uroce::sgl![back.sge(0, 65536)];
            r.remote_addr = dst.iova();
            r.rkey = dst.rkey();
            qa.post_send(&r)?;
            let mut got = 0;
            while got < 2 {
                got += cqa.wait(2 - got, Duration::from_secs(10))?.len();
            }
            n += 2;
            std::thread::sleep(Duration::from_millis(5));
        }
        println!("{n} operations");
    }

    let s = a.stats();
    a.flush_capture();
    println!(
        "\ndevice A sent {} packets ({} bytes), received {}; retransmits {}, ICRC drops {}",
        s.tx_packets, s.tx_bytes, s.rx_packets, s.retransmits, s.rx_drop_icrc
    );
    Ok(())
}
