//! Capture files are complete at process exit whatever the application
//! leaks (issue 17 §2): a child process opens a device with capture on, does
//! RDMA, leaks every object (the device never drops its capture) and exits;
//! the pcap must hold every packet, ending on a record boundary.

mod common;

use common::*;
use std::process::Command;
use uroce::verbs::*;
use uroce::wire::pcap::PcapReader;

const CHILD: &str = "UROCE_CAPTURE_EXIT_CHILD";

/// In the child: traffic, then leak everything and exit.
fn child(path: &str) {
    let (a, b) = connected(Some(path.into()));
    let len = 64 * 1024;
    let all = Access::LOCAL_WRITE | Access::REMOTE_WRITE | Access::REMOTE_READ;
    let src = a.pd.register(vec![7u8; len], all).unwrap();
    let dst = b.pd.register(vec![0u8; len], all).unwrap();
    for i in 0..20 {
        let mut w = wr(i, WrOpcode::RdmaWrite, src.sge(0, len as u32 - i as u32 * 100));
        w.remote_addr = dst.iova();
        w.rkey = dst.rkey();
        a.qp.post_send(&w).unwrap();
        let wc = a.cq.wait(1, T).unwrap();
        assert_eq!(wc[0].status, WcStatus::Success);
    }
    let s = a.ctx.stats();
    println!("packets {}", s.tx_packets + s.rx_packets);
    std::mem::forget((src, dst, a, b));
    std::process::exit(0);
}

#[test]
fn a_leaked_device_leaves_a_complete_capture() {
    if let Ok(p) = std::env::var(CHILD) {
        child(&p);
        return;
    }
    let dir = std::env::temp_dir().join(format!("uroce-capture-exit-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    // No statistics publisher (whose period also flushes): only the exit hook.
    let cfg = dir.join("uroce.toml");
    std::fs::write(&cfg, "[stats]\npublish = false\n").unwrap();
    let pcap = dir.join("leak.pcap");
    let out = Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "a_leaked_device_leaves_a_complete_capture", "--nocapture"])
        .env(CHILD, &pcap)
        .env("UROCE_CONFIG", &cfg)
        .env("UROCE_RUNTIME_DIR", dir.join("rt"))
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}{}", String::from_utf8_lossy(&out.stderr));
    let want: usize = text
        .lines()
        .find_map(|l| l.strip_prefix("packets "))
        .and_then(|n| n.trim().parse().ok())
        .unwrap_or_else(|| panic!("no packet count: {text}"));
    assert!(want > 20 * 16, "{want}");
    let mut r = PcapReader::new(std::fs::File::open(&pcap).unwrap()).unwrap();
    let mut frames = 0;
    for f in r.by_ref() {
        f.unwrap_or_else(|e| panic!("after {frames} records: {e}"));
        frames += 1;
    }
    assert_eq!(r.cut(), None);
    assert!(frames >= want, "{frames} records, {want} packets sent and received");
    println!("{frames} records for {want} packets");
    std::fs::remove_dir_all(&dir).unwrap();
}
