//! Pinned registration counts against RLIMIT_MEMLOCK: over the limit it
//! fails with ENOMEM and says why; VmLck grows while registered and shrinks
//! after. Root bypasses the limit (CAP_IPC_LOCK), so the limited case runs
//! in a child re-executed as user `nobody`.

use std::os::unix::process::CommandExt;
use std::process::Command;
use uroce::ib::Errno;
use uroce::verbs::*;

mod skip;

fn vm_lck_kib() -> u64 {
    let s = std::fs::read_to_string("/proc/self/status").unwrap();
    let line = s.lines().find(|l| l.starts_with("VmLck:")).unwrap();
    line.split_whitespace().nth(1).unwrap().parse().unwrap()
}

fn child_register_over_limit() {
    let ctx = Context::open(&DeviceConfig { name: "memlock-child".into(), ..DeviceConfig::loopback() }).unwrap();
    let pd = ctx.alloc_pd().unwrap();
    let e = pd.register(vec![0u8; 4 << 20], Access::LOCAL_WRITE).unwrap_err();
    assert_eq!(e.errno, Errno::ENOMEM, "{e}");
    assert!(e.to_string().contains("RLIMIT_MEMLOCK"), "{e}");
    // A small one still fits.
    pd.register(vec![0u8; 4096], Access::LOCAL_WRITE).unwrap();
    println!("child: {e}");
}

#[test]
fn pinning_counts_against_memlock() {
    if std::env::var("UROCE_MEMLOCK_CHILD").is_ok() {
        child_register_over_limit();
        return;
    }
    // VmLck grows and shrinks with a pinned registration.
    let ctx = Context::open(&DeviceConfig { name: "memlock-parent".into(), ..DeviceConfig::loopback() }).unwrap();
    let pd = ctx.alloc_pd().unwrap();
    let before = vm_lck_kib();
    let mr = pd.register(vec![1u8; 8 << 20], Access::LOCAL_WRITE).unwrap();
    assert!(vm_lck_kib() >= before + 8 * 1024 - 4, "VmLck {} -> {}", before, vm_lck_kib());
    assert!(ctx.pinned_bytes() >= 8 << 20);
    drop(mr);
    assert!(vm_lck_kib() <= before + 4);
    drop((pd, ctx));

    // SAFETY: getuid has no preconditions.
    if unsafe { libc::getuid() } != 0 {
        skip::part("the RLIMIT_MEMLOCK case needs root to switch to an unprivileged user");
        return;
    }
    let exe = std::env::current_exe().unwrap();
    let mut cmd = Command::new(exe);
    cmd.args(["--exact", "pinning_counts_against_memlock", "--nocapture"]).env("UROCE_MEMLOCK_CHILD", "1");
    // SAFETY: only async-signal-safe calls between fork and exec.
    unsafe {
        cmd.pre_exec(|| {
            let lim = libc::rlimit { rlim_cur: 1 << 20, rlim_max: 1 << 20 };
            if libc::setrlimit(libc::RLIMIT_MEMLOCK, &lim) != 0 || libc::setgid(65534) != 0 || libc::setuid(65534) != 0
            {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let out = cmd.output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "child failed:\n{text}");
    assert!(text.contains("RLIMIT_MEMLOCK"), "{text}");
}
