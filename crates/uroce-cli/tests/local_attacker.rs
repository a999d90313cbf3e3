//! A hostile local user against the runtime directory (issue 16 §1): as
//! root, two users are created; the attacker pre-creates the victim's
//! default runtime directory `/tmp/uroce-<victim uid>` (or a link in its
//! place) with links to a 0600 file of the victim and a `capture.request`,
//! then the victim runs `uroce demo`. The demo must refuse the directory,
//! say why on stderr, touch nothing outside it, and exit 0.

#[path = "../../uroce/tests/skip/mod.rs"]
#[macro_use]
mod skip;

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const UROCE: &str = env!("CARGO_BIN_EXE_uroce");

/// A user created for this test, removed on drop.
struct User {
    name: String,
    uid: u32,
}

impl User {
    fn create(name: &str) -> Option<User> {
        let _ = Command::new("userdel").arg(name).stderr(Stdio::null()).status();
        let ok = Command::new("useradd").args(["-M", "-s", "/usr/sbin/nologin", name]).status().ok()?.success();
        if !ok {
            return None;
        }
        let out = Command::new("id").args(["-u", name]).output().ok()?;
        let uid = String::from_utf8_lossy(&out.stdout).trim().parse().ok()?;
        Some(User { name: name.into(), uid })
    }
}

impl Drop for User {
    fn drop(&mut self) {
        let _ = Command::new("userdel").arg(&self.name).status();
    }
}

/// Runs the victim's `uroce demo` through `sh`, which prepares the
/// attacker's directory for the pid the demo will have (`$$`: `exec` keeps
/// it), then becomes the victim. Returns (exit code, stderr).
fn run_victim(setup: &str, victim: &User, port: u16) -> (Option<i32>, String) {
    let script = format!(
        "{setup}\nexec setpriv --reuid={uid} --regid={uid} --clear-groups {UROCE} demo --port {port} --duration 1",
        uid = victim.uid
    );
    let mut child = Command::new("sh")
        .args(["-ec", &script])
        .env_remove("UROCE_RUNTIME_DIR")
        .env_remove("XDG_RUNTIME_DIR")
        .env_remove("UROCE_CONFIG")
        .env_remove("XDG_CONFIG_HOME")
        .env("HOME", "/nonexistent")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let t = Instant::now();
    loop {
        if let Some(st) = child.try_wait().unwrap() {
            let mut err = String::new();
            std::io::Read::read_to_string(child.stderr.as_mut().unwrap(), &mut err).unwrap();
            return (st.code(), err);
        }
        if t.elapsed() > Duration::from_secs(60) {
            let _ = child.kill();
            let _ = child.wait();
            panic!("the victim's demo did not finish within 60 s");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Paths removed on drop (also when an assertion fails).
struct Cleanup(Vec<PathBuf>);
impl Drop for Cleanup {
    fn drop(&mut self) {
        for p in &self.0 {
            let _ = std::fs::remove_dir_all(p);
            let _ = std::fs::remove_file(p);
        }
    }
}

struct Victim {
    dir: PathBuf,
    secret: PathBuf,
    mtime: i64,
}

const SECRET: &[u8] = b"the victim's secret\n";

impl Victim {
    fn untouched(&self) {
        assert_eq!(std::fs::read(&self.secret).unwrap(), SECRET, "the victim's file was overwritten");
        assert_eq!(std::fs::metadata(&self.secret).unwrap().mtime(), self.mtime, "the victim's file was written");
        let extra: Vec<_> = std::fs::read_dir(&self.dir).unwrap().flatten().map(|e| e.file_name()).collect();
        assert_eq!(extra, vec![std::ffi::OsString::from("secret")], "files created next to the victim's file");
    }
}

#[test]
fn another_users_runtime_directory_is_refused_and_nothing_outside_is_touched() {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        skip!("needs root (to create users)");
    }
    let has = |t: &str| {
        Command::new("sh").args(["-c", &format!("command -v {t}")]).output().is_ok_and(|o| o.status.success())
    };
    if !["useradd", "userdel", "setpriv"].iter().all(|t| has(t)) {
        skip!("useradd, userdel or setpriv is not installed (Debian packages passwd, util-linux)");
    }
    let tag = std::process::id() % 100_000;
    let (Some(attacker), Some(victim)) = (User::create(&format!("uratk{tag}")), User::create(&format!("urvic{tag}")))
    else {
        skip!("useradd failed");
    };
    // The victim's private file, in a directory of the victim.
    let vdir = PathBuf::from(format!("/tmp/uroce-victim-{tag}"));
    let _ = std::fs::remove_dir_all(&vdir);
    std::fs::create_dir(&vdir).unwrap();
    let secret = vdir.join("secret");
    std::fs::write(&secret, SECRET).unwrap();
    std::fs::set_permissions(&secret, std::fs::Permissions::from_mode(0o600)).unwrap();
    std::fs::set_permissions(&vdir, std::fs::Permissions::from_mode(0o700)).unwrap();
    std::os::unix::fs::lchown(&secret, Some(victim.uid), Some(victim.uid)).unwrap();
    std::os::unix::fs::lchown(&vdir, Some(victim.uid), Some(victim.uid)).unwrap();
    let v = Victim { dir: vdir.clone(), mtime: std::fs::metadata(&secret).unwrap().mtime(), secret: secret.clone() };
    let rt = PathBuf::from(format!("/tmp/uroce-{}", victim.uid));
    let _cleanup = Cleanup(vec![rt.clone(), vdir.clone()]);
    let port = 20000 + (std::process::id() % 20000) as u16;
    let (a, s, pcap) = (&attacker.name, secret.display(), vdir.join("stolen.pcap"));
    let pcap = pcap.display();

    // 1. The attacker's directory, world-writable, with links for the pid
    //    the victim's process will have and a capture request.
    let _ = std::fs::remove_dir_all(&rt);
    let setup = format!(
        "rt={rt}; mkdir -m 0777 $rt; d=$rt/$$; mkdir -m 0777 $d
         for f in stats.json stats.tmp .stats.json.$$.tmp capture.status .capture.status.$$.tmp; do ln -s {s} $d/$f; done
         echo 'start {pcap}' > $d/capture.request
         chown -hR {a} $rt",
        rt = rt.display()
    );
    let (code, err) = run_victim(&setup, &victim, port);
    assert_eq!(code, Some(0), "{err}");
    assert!(err.contains("not publishing statistics"), "{err}");
    assert!(
        err.contains(&rt.display().to_string()) && err.contains(&format!("owned by uid {}", attacker.uid)),
        "{err}"
    );
    v.untouched();
    assert_eq!(std::fs::symlink_metadata(&rt).unwrap().uid(), attacker.uid, "the attacker's directory is left alone");

    // 2. The same with the directory the attacker's own but not writable by
    //    others (still not the victim's).
    std::fs::remove_dir_all(&rt).unwrap();
    let setup = setup.replace("mkdir -m 0777", "mkdir -m 0755");
    let (code, err) = run_victim(&setup, &victim, port);
    assert_eq!(code, Some(0), "{err}");
    assert!(err.contains(&format!("owned by uid {}", attacker.uid)), "{err}");
    v.untouched();

    // 3. A link in place of the directory, to a directory of the victim.
    std::fs::remove_dir_all(&rt).unwrap();
    let setup = format!("ln -s {vd} {rt}; chown -h {a} {rt}", vd = vdir.display(), rt = rt.display());
    let (code, err) = run_victim(&setup, &victim, port);
    assert_eq!(code, Some(0), "{err}");
    assert!(err.contains("not publishing statistics") && err.contains("symbolic link"), "{err}");
    v.untouched();
    std::fs::remove_file(&rt).unwrap();

    // 4. Control: with no attacker, the victim's process creates its own
    //    directory 0700 and publishes (and removes its entry at exit).
    let (code, err) = run_victim("true", &victim, port);
    assert_eq!(code, Some(0), "{err}");
    assert!(!err.contains("not publishing"), "{err}");
    let md = std::fs::metadata(&rt).unwrap();
    assert_eq!((md.uid(), md.mode() & 0o777), (victim.uid, 0o700));
}
