//! The `uroce` command's subcommands, run as a user would.

#[path = "../../uroce/tests/skip/mod.rs"]
#[macro_use]
mod skip;

use std::process::Command;

const UROCE: &str = env!("CARGO_BIN_EXE_uroce");

#[test]
fn demo_runs_and_verifies() {
    let out = Command::new(UROCE).args(["demo"]).output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}{}", String::from_utf8_lossy(&out.stderr));
    assert!(text.contains("RDMA WRITE  1 MiB A->B: Success"), "{text}");
    assert!(text.contains("read-back matches"), "{text}");
    assert!(text.contains("\"hello from uroce\""), "{text}");
    assert!(text.contains("now 15"), "{text}");
}

#[test]
fn decode_exit_codes() {
    let dir = std::env::temp_dir().join(format!("uroce-cli-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let src =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../conformance/captures/rxe/rdma_write_lat.pcap");
    let mut bytes = std::fs::read(&src).unwrap();
    let ok = Command::new(UROCE).args(["decode", src.to_str().unwrap()]).output().unwrap();
    let text = String::from_utf8_lossy(&ok.stdout);
    assert!(ok.status.success(), "{text}");
    assert!(text.contains("20 RoCE packets: 20 ICRC ok, 0 ICRC bad, 0 malformed"), "{text}");
    assert!(text.contains("RC_RDMA_WRITE_ONLY"), "{text}");
    assert!(text.contains("AETH ACK"), "{text}");
    // Flip a payload byte of the first RoCE frame (Ethernet/IPv4/UDP 4791).
    let mut off = 24;
    loop {
        let len = u32::from_le_bytes(bytes[off + 8..off + 12].try_into().unwrap()) as usize;
        let frame = off + 16;
        if bytes[frame + 36..frame + 38] == [0x12, 0xb7] {
            bytes[frame + len - 6] ^= 0xFF;
            break;
        }
        off = frame + len;
    }
    let bad = dir.join("bad.pcap");
    std::fs::write(&bad, bytes).unwrap();
    let out = Command::new(UROCE).args(["decode", bad.to_str().unwrap()]).output().unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stdout).contains("icrc=BAD"));
    let missing = Command::new(UROCE).args(["decode", "/nonexistent.pcap"]).output().unwrap();
    assert_eq!(missing.status.code(), Some(2));
}

#[test]
fn capture_of_a_demo_decodes_clean() {
    let dir = std::env::temp_dir().join(format!("uroce-cli-cap-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let cap = dir.join("x.pcap");
    let port = 40000 + (std::process::id() % 10000) as u16;
    let st = Command::new(UROCE)
        .args(["demo", "--port", &port.to_string(), "--capture", cap.to_str().unwrap()])
        .status()
        .unwrap();
    assert!(st.success());
    let out =
        Command::new(UROCE).args(["decode", cap.to_str().unwrap(), "--port", &port.to_string()]).output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}");
    assert!(text.contains(" 0 ICRC bad, 0 malformed"), "{text}");
    assert!(text.contains("RC_RDMA_READ_RESPONSE_FIRST"), "{text}");
}

/// conformance/icrc_check.py, an ICRC checker independent of uroce's code
/// (Python, dpkt, zlib's CRC-32), first reproduces its reference result on
/// the rxe captures, then finds every ICRC of a demo's capture correct. It
/// reads UDP port 4791 only: the demo's two devices use it on their own
/// 127.0.0.x addresses.
#[test]
fn independent_checker_accepts_a_demo_capture() {
    let python = "/usr/bin/python3";
    let dpkt = Command::new(python).args(["-c", "import dpkt"]).output();
    if !dpkt.is_ok_and(|o| o.status.success()) {
        skip!("python3-dpkt is not installed (Debian package python3-dpkt)");
    }
    let conformance = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../conformance");
    let checker = conformance.join("icrc_check.py");
    let mut rxe: Vec<_> =
        std::fs::read_dir(conformance.join("captures/rxe")).unwrap().map(|e| e.unwrap().path()).collect();
    rxe.sort();
    let out = Command::new(python).arg(&checker).args(&rxe).output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}");
    assert!(text.ends_with("total: icrc_ok=1653 icrc_bad=0 truncated=0 unreadable_files=0\n"), "{text}");

    let dir = std::env::temp_dir().join(format!("uroce-cli-icrc-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::os::unix::fs::DirBuilderExt::mode(&mut std::fs::DirBuilder::new(), 0o700).create(&dir).unwrap();
    let cap = dir.join("demo.pcap");
    let st = Command::new(UROCE).args(["demo", "--port", "4791", "--capture", cap.to_str().unwrap()]).output().unwrap();
    assert!(st.status.success(), "{}", String::from_utf8_lossy(&st.stderr));
    let out = Command::new(python).arg(&checker).arg(&cap).output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}");
    let total = text.lines().last().unwrap_or("");
    let ok: u32 =
        total.split_whitespace().find_map(|f| f.strip_prefix("icrc_ok=")).and_then(|v| v.parse().ok()).unwrap();
    assert!(ok > 500, "{text}");
    assert!(total.contains(" icrc_bad=0 truncated=0 unreadable_files=0"), "{text}");
    std::fs::remove_dir_all(dir).unwrap();
}

#[test]
fn devices_prints_the_device() {
    let out = Command::new(UROCE)
        .args(["devices"])
        .env("UROCE_ADDR", "127.0.0.77")
        .env("UROCE_PORT", "47917")
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}");
    assert!(text.contains("hca_id: uroce0"));
    assert!(text.contains("0000:0000:0000:0000:0000:ffff:7f00:004d, RoCE v2"), "{text}");
    let bad = Command::new(UROCE).args(["devices"]).env("UROCE_ADDR", "not-an-ip").output().unwrap();
    assert_eq!(bad.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&bad.stderr).contains("UROCE_ADDR"));
}

#[test]
fn bad_environment_is_refused_naming_the_variable() {
    let cases = [
        ("UROCE_ADDR", "0.0.0.0"),
        ("UROCE_ADDR", "::"),
        ("UROCE_ADDR", "255.255.255.255"),
        ("UROCE_ADDR", "239.1.2.3"),
        ("UROCE_ADDR", "ff02::1"),
        ("UROCE_PORT", "0"),
        ("UROCE_BUSY_POLL", "maybe"),
        ("UROCE_IPV4_ANY_ID", "2"),
        ("UROCE_SEND_IN_PLACE", "nope"),
        ("UROCE_SCATTER_TO_CQE", "x"),
        ("UROCE_LOG", "uroce=loud"),
        ("UROCE_MTU", "1500"),
        ("UROCE_MTU", "9000"),
    ];
    for (k, v) in cases {
        let out = Command::new(UROCE)
            .args(["devices"])
            .env("UROCE_ADDR", "127.0.0.78")
            .env("UROCE_PORT", "47918")
            .env_remove("UROCE_CONFIG")
            .env(k, v)
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{k}={v} accepted: {err}");
        assert!(err.contains(k), "{k}={v}: {err}");
    }
    // Every subcommand refuses a log filter that does not parse.
    let out = Command::new(UROCE).args(["stat"]).env("UROCE_LOG", "uroce=loud").output().unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("UROCE_LOG"));
    // The strict booleans include yes/no.
    let out = Command::new(UROCE)
        .args(["devices"])
        .env("UROCE_ADDR", "127.0.0.78")
        .env("UROCE_PORT", "47918")
        .env("UROCE_BUSY_POLL", "yes")
        .env("UROCE_MTU", "2048")
        .env_remove("UROCE_CONFIG")
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    // MLX5_SCATTER_TO_CQE follows mlx5: only "0" disables, any other value
    // is ignored and the device is still there.
    for v in ["2", "false", "0"] {
        let out = Command::new(UROCE)
            .args(["devices"])
            .env("UROCE_ADDR", "127.0.0.78")
            .env("UROCE_PORT", "47918")
            .env("MLX5_SCATTER_TO_CQE", v)
            .env_remove("UROCE_CONFIG")
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(out.status.success(), "MLX5_SCATTER_TO_CQE={v}: {}", String::from_utf8_lossy(&out.stderr));
        assert!(text.contains("hca_id: uroce0"), "MLX5_SCATTER_TO_CQE={v}: {text}");
    }
}

#[test]
fn a_capture_file_that_cannot_be_opened_is_named() {
    let out = Command::new(UROCE)
        .args(["devices"])
        .env("UROCE_ADDR", "127.0.0.79")
        .env("UROCE_PORT", "47919")
        .env("UROCE_CAPTURE", "/nonexistent-dir/x.pcap")
        .env_remove("UROCE_CONFIG")
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(err.contains("capture file /nonexistent-dir/x.pcap") && err.contains("No such file"), "{err}");
    assert!(!err.contains("bind"), "{err}");
}

#[test]
fn a_cut_capture_decodes_every_complete_record_then_says_it_is_cut() {
    let dir = std::env::temp_dir().join(format!("uroce-cli-cut-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let cap = dir.join("whole.pcap");
    let port = 41000 + (std::process::id() % 10000) as u16;
    let st = Command::new(UROCE)
        .args(["demo", "--port", &port.to_string(), "--capture", cap.to_str().unwrap()])
        .status()
        .unwrap();
    assert!(st.success());
    let bytes = std::fs::read(&cap).unwrap();
    // Record boundaries.
    let mut ends = vec![24];
    while *ends.last().unwrap() < bytes.len() {
        let off = *ends.last().unwrap();
        ends.push(off + 16 + u32::from_le_bytes(bytes[off + 8..off + 12].try_into().unwrap()) as usize);
    }
    let n = ends.len() - 1;
    assert!(n > 10, "{n} records");
    let cut = dir.join("cut.pcap");
    for (len, whole) in [(ends[n - 1] + 7, n - 1), (ends[n - 2] + 40, n - 2), (ends[n - 1], n - 1)] {
        std::fs::write(&cut, &bytes[..len]).unwrap();
        let out =
            Command::new(UROCE).args(["decode", cut.to_str().unwrap(), "--port", &port.to_string()]).output().unwrap();
        let text = String::from_utf8_lossy(&out.stdout);
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(text.contains(&format!("#{whole} ")), "record {whole} decoded: {text}");
        assert!(text.contains(&format!("{whole} frames, ")), "{text}");
        if len == ends[whole] {
            assert_eq!(out.status.code(), Some(0), "a file ending on a record is whole: {err}");
        } else {
            assert_eq!(out.status.code(), Some(1), "{err}");
            let msg = format!("file is cut after {whole} records ({} trailing bytes)", len - ends[whole]);
            assert!(err.contains(&msg), "{err}");
        }
    }
    std::fs::remove_dir_all(&dir).unwrap();
}
