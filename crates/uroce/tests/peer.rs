//! PeerDirect with the storage peer: RDMA into and out of a file through
//! `ibv_reg_mr` on device addresses, invalidation when the allocation is
//! freed, the 8 per-peer counters and their published files, and the
//! restrictions (no rereg, no memory windows).

mod common;

use common::*;
use std::sync::Arc;
use std::time::Duration;
use uroce::ib::Errno;
use uroce::mem::peer::{self, storage::StoragePeer};
use uroce::verbs::*;

const T: Duration = Duration::from_secs(5);

fn runtime_dir() -> std::path::PathBuf {
    static DIR: std::sync::OnceLock<std::path::PathBuf> = std::sync::OnceLock::new();
    DIR.get_or_init(|| {
        if let (Ok(_), Some(d)) = (std::env::var("UROCE_PEER_CHILD"), std::env::var_os("UROCE_RUNTIME_DIR")) {
            return d.into(); // a child process of the exit test: its parent's directory
        }
        let d = std::env::temp_dir().join(format!("uroce-peer-test-{}", std::process::id()));
        std::env::set_var("UROCE_RUNTIME_DIR", &d);
        d
    })
    .clone()
}

fn storage(name: &str) -> (StoragePeer, tempfile_path::Path) {
    let path = tempfile_path::Path::new(name);
    let peer = StoragePeer::open(name, &path.0, 1 << 20).unwrap();
    peer::register_client(Arc::new(peer.clone())).unwrap();
    (peer, path)
}

/// A temporary file path removed on drop.
mod tempfile_path {
    pub struct Path(pub std::path::PathBuf);
    impl Path {
        pub fn new(name: &str) -> Path {
            Path(std::env::temp_dir().join(format!("uroce-{name}-{}.img", std::process::id())))
        }
    }
    impl Drop for Path {
        fn drop(&mut self) {
            let _ = std::fs::remove_file(&self.0);
        }
    }
}

fn stats(name: &str) -> peer::PeerStats {
    peer::client_stats().into_iter().find(|s| s.name == name).unwrap()
}

/// The seed's arithmetic: regions on the peer, device pages and bytes mapped.
#[track_caller]
fn assert_adds_up(s: &peer::PeerStats, regions: u64, pages: u64, bytes: u64) {
    assert!(s.num_alloc_mrs >= s.num_dealloc_mrs && s.num_reg_pages >= s.num_dereg_pages, "{s:?}");
    assert!(s.num_reg_bytes >= s.num_dereg_bytes, "{s:?}");
    assert_eq!((s.regions(), s.mapped_pages(), s.mapped_bytes()), (regions, pages, bytes), "{s:?}");
}

fn published(name: &str, counter: &str) -> String {
    let p = runtime_dir().join(std::process::id().to_string()).join("memory_peers").join(name).join(counter);
    std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}

const RW: Access = Access::LOCAL_WRITE.union(Access::REMOTE_WRITE).union(Access::REMOTE_READ);

#[test]
fn rdma_lands_in_storage_and_counters_follow() {
    runtime_dir();
    let (dev, path) = storage("ssd0");
    let (a, b) = connected(None);
    let len = 64 * 1024;
    let daddr = dev.alloc(len).unwrap();
    // SAFETY: a device address claimed by the storage peer; the CPU never
    // dereferences it.
    let mr = unsafe { b.pd.register_raw(daddr as *mut u8, len as usize, daddr, RW) }.unwrap();
    let s = stats("ssd0");
    assert_eq!((s.num_alloc_mrs, s.num_reg_pages, s.num_reg_bytes), (1, 16, len));
    assert_eq!(published("ssd0", "num_reg_pages"), "16\n");
    assert_eq!(published("ssd0", "version"), "1.0\n");
    assert_eq!(b.ctx.pinned_bytes(), 0, "peer memory is not pinned host memory");
    // Selection: with the peer loaded, host buffers still register as host
    // memory (pinned), and the peer's counters do not move.
    let host = b.pd.register(vec![0u8; 8192], RW).unwrap();
    assert!(b.ctx.pinned_bytes() >= 8192, "a host buffer is pinned host memory");
    assert_eq!(stats("ssd0").num_alloc_mrs, 1);
    drop(host);
    // RDMA WRITE lands in the file.
    let data: Vec<u8> = (0..len as usize).map(|i| (i % 241) as u8).collect();
    let src = a.pd.register(data.clone(), Access::empty()).unwrap();
    let mut w = wr(1, WrOpcode::RdmaWrite, src.sge(0, len as u32));
    w.remote_addr = daddr;
    w.rkey = mr.rkey();
    a.qp.post_send(&w).unwrap();
    assert_eq!(a.cq.wait(1, T).unwrap()[0].status, WcStatus::Success);
    let mut back = vec![0u8; len as usize];
    dev.read(daddr, &mut back).unwrap();
    assert_eq!(back, data);
    let file = std::fs::read(&path.0).unwrap();
    // The first allocation starts at file offset 0.
    assert_eq!(&file[..len as usize], &data[..]);
    // RDMA READ comes from it, including an atomic.
    dev.write(daddr + 8, &77u64.to_ne_bytes()).unwrap();
    let dst = a.pd.register(vec![0u8; 16], Access::LOCAL_WRITE).unwrap();
    let mut r = wr(2, WrOpcode::RdmaRead, dst.sge(0, 16));
    r.remote_addr = daddr;
    r.rkey = mr.rkey();
    a.qp.post_send(&r).unwrap();
    assert_eq!(a.cq.wait(1, T).unwrap()[0].status, WcStatus::Success);
    assert_eq!(&dst.to_vec()[8..], &77u64.to_ne_bytes());
    // Restrictions: no rereg, no windows.
    let mut mr = mr;
    assert_eq!(mr.rereg_access(Access::LOCAL_WRITE).unwrap_err().errno, Errno::EOPNOTSUPP);
    // Deregistration without invalidation: pages and bytes come back.
    assert_adds_up(&stats("ssd0"), 1, 16, len);
    drop(mr);
    let s = stats("ssd0");
    assert_eq!((s.num_dealloc_mrs, s.num_dereg_pages, s.num_dereg_bytes, s.num_free_callbacks), (1, 16, len, 0));
    assert_adds_up(&s, 0, 0, 0);
    let one =
        std::fs::read_to_string(runtime_dir().join(std::process::id().to_string()).join("memory_peers/ssd0/counters"))
            .unwrap();
    assert_eq!(peer::PeerStats::from_text("ssd0", &one), s, "the one-file form holds one moment");
    assert_eq!(published("ssd0", "num_dereg_bytes"), format!("{len}\n"));
    dev.free(daddr).unwrap();
    assert_eq!(stats("ssd0").num_free_callbacks, 0, "no region was registered over it any more");
}

#[test]
fn freeing_registered_storage_invalidates_the_region() {
    runtime_dir();
    let (dev, _path) = storage("ssd1");
    let (a, b) = connected(None);
    let daddr = dev.alloc(8192).unwrap();
    // SAFETY: a device address claimed by the storage peer.
    let mr = unsafe { b.pd.register_raw(daddr as *mut u8, 8192, daddr, RW | Access::MW_BIND) }.unwrap();
    // Memory windows cannot be bound to peer memory.
    let mw = b.pd.alloc_mw(MwType::Type1).unwrap();
    let _ = b.qp.bind_mw(&mw, 9, SendFlags::SIGNALED, Some(&mr), daddr, 64, Access::REMOTE_WRITE);
    assert_eq!(b.cq.wait(1, T).unwrap()[0].status, WcStatus::MwBindErr);
    // (The bind error moved b's QP to ERR: use a fresh pair for traffic.)
    let (c, d) = connected(None);
    // SAFETY: as above.
    let mr2 = unsafe { d.pd.register_raw(daddr as *mut u8, 8192, daddr, RW) }.unwrap();
    // An indirect key over the peer region.
    let key = d.pd.create_indirect_key(1).unwrap();
    key.set_layout(Layout::list(RW, &[mr2.sge(4096, 4096)])).unwrap();
    let src = c.pd.register(vec![6u8; 64], Access::empty()).unwrap();
    let write = |id: u64, addr: u64, rkey: u32| {
        let mut w = wr(id, WrOpcode::RdmaWrite, src.sge(0, 64));
        w.remote_addr = addr;
        w.rkey = rkey;
        c.qp.post_send(&w).unwrap();
        c.cq.wait(1, T).unwrap()[0].status
    };
    assert_eq!(write(1, 0, key.rkey()), WcStatus::Success);
    let mut got = [0u8; 64];
    dev.read(daddr + 4096, &mut got).unwrap();
    assert_eq!(got, [6u8; 64]);
    let before = stats("ssd1");
    assert_adds_up(&before, 2, 4, 2 * 8192);
    dev.free(daddr).unwrap();
    let after = stats("ssd1");
    assert_eq!(after.num_free_callbacks - before.num_free_callbacks, 2, "one callback per registered region");
    // Invalidation ends both mappings: regions, pages and bytes leave together.
    assert_eq!(after.num_dealloc_mrs - before.num_dealloc_mrs, 2);
    assert_adds_up(&after, 0, 0, 0);
    assert_eq!(published("ssd1", "num_dereg_pages"), "4\n");
    assert_eq!(write(2, daddr, mr2.rkey()), WcStatus::RemAccessErr, "invalidated region refuses access");
    // Deregistration after invalidation still works and counts nothing more.
    drop(key);
    drop(mr2);
    drop(mr);
    let end = stats("ssd1");
    assert_eq!(end, after);
    assert_eq!((end.num_alloc_mrs, end.num_dealloc_mrs, end.num_dereg_pages, end.num_dereg_bytes), (2, 2, 4, 2 * 8192));
    let _ = (a, mw);
}

#[test]
fn client_registration_rules() {
    runtime_dir();
    let (_dev, _path) = storage("ssd2");
    let p2 = tempfile_path::Path::new("ssd2-dup");
    let dup = StoragePeer::open("ssd2", &p2.0, 4096).unwrap();
    assert_eq!(peer::register_client(Arc::new(dup)).unwrap_err().errno, Errno::EEXIST);
    let bad = StoragePeer::open("a/b", &p2.0, 4096).unwrap();
    assert_eq!(peer::register_client(Arc::new(bad)).unwrap_err().errno, Errno::EINVAL);
    assert!(peer::unregister_client("ssd2"));
    assert!(!peer::unregister_client("ssd2"));
}

/// Invalidation while a transfer runs: every snapshot a concurrent reader
/// takes obeys the arithmetic — one region of 19 pages is either wholly
/// mapped or wholly gone — and the transfers after it fail.
#[test]
fn invalidation_during_a_transfer_keeps_the_counters_consistent() {
    runtime_dir();
    let (dev, _path) = storage("ssd3");
    let (a, b) = connected(None);
    let len = 19 * 4096u64;
    let daddr = dev.alloc(len).unwrap();
    // SAFETY: a device address claimed by the storage peer.
    let mr = unsafe { b.pd.register_raw(daddr as *mut u8, len as usize, daddr, RW) }.unwrap();
    assert_adds_up(&stats("ssd3"), 1, 19, len);
    // A watcher reads the counters over and over while the transfers and
    // the invalidation run. The transfers start only once it has read them
    // once, so that a loaded machine that schedules it late still sees
    // them overlap.
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let reads = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let watcher = {
        let (stop, reads) = (stop.clone(), reads.clone());
        std::thread::spawn(move || {
            let deadline = std::time::Instant::now() + Duration::from_secs(60);
            while !stop.load(std::sync::atomic::Ordering::Relaxed) && std::time::Instant::now() < deadline {
                let s = stats("ssd3");
                let now = (s.regions(), s.mapped_pages(), s.mapped_bytes());
                assert!(now == (1, 19, len) || now == (0, 0, 0), "torn counters: {s:?}");
                reads.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            }
        })
    };
    let start = std::time::Instant::now();
    while reads.load(std::sync::atomic::Ordering::Relaxed) == 0 {
        assert!(start.elapsed() < Duration::from_secs(60), "the watcher never read the counters");
        std::thread::yield_now();
    }
    let src = a.pd.register(vec![3u8; len as usize], Access::empty()).unwrap();
    let mut statuses = Vec::new();
    for i in 0..40u64 {
        if i == 10 {
            dev.free(daddr).unwrap();
        }
        let mut w = wr(i, WrOpcode::RdmaWrite, src.sge(0, len as u32));
        w.remote_addr = daddr;
        w.rkey = mr.rkey();
        a.qp.post_send(&w).unwrap();
        let st = a.cq.wait(1, T).unwrap()[0].status;
        statuses.push(st);
        if st != WcStatus::Success {
            break;
        }
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    watcher.join().unwrap();
    assert_eq!(&statuses[..10], &[WcStatus::Success; 10]);
    assert_eq!(statuses.last(), Some(&WcStatus::RemAccessErr), "{statuses:?}");
    let s = stats("ssd3");
    assert_adds_up(&s, 0, 0, 0);
    assert_eq!((s.num_dealloc_mrs, s.num_dereg_pages, s.num_dereg_bytes, s.num_free_callbacks), (1, 19, len, 1));
    drop(mr);
    assert_eq!(stats("ssd3"), s, "deregistration after invalidation counts nothing more");
}

/// The child half of `exited_processes_stay_in_the_host_totals`: registers
/// two regions of client `ssd-exit-<how>`, deregisters one, then ends
/// without deregistering the other.
#[test]
fn child_registers_and_exits() {
    let Ok(how) = std::env::var("UROCE_PEER_CHILD") else { return };
    runtime_dir();
    let name = format!("ssd-exit-{how}");
    let (dev, _path) = storage(&name);
    let (_a, b) = connected(None);
    let d1 = dev.alloc(3 * 4096).unwrap();
    let d2 = dev.alloc(5 * 4096).unwrap();
    // SAFETY: device addresses claimed by the storage peer.
    let m1 = unsafe { b.pd.register_raw(d1 as *mut u8, 3 * 4096, d1, RW) }.unwrap();
    // SAFETY: as above.
    let m2 = unsafe { b.pd.register_raw(d2 as *mut u8, 5 * 4096, d2, RW) }.unwrap();
    drop(m1);
    assert_adds_up(&stats(&name), 1, 5, 5 * 4096);
    std::mem::forget(m2);
    match how.as_str() {
        "abort" => std::process::abort(),
        _ => std::process::exit(0),
    }
}

/// A process's counters outlive it: folded into the host totals at its
/// exit (or, when it died without exiting, by the next reader), the
/// regions it still had counted as deallocated by the exit.
#[test]
fn exited_processes_stay_in_the_host_totals() {
    let rt = runtime_dir();
    for how in ["exit", "abort"] {
        let st = std::process::Command::new(std::env::current_exe().unwrap())
            .args(["--exact", "child_registers_and_exits", "--nocapture", "--test-threads=1"])
            .env("UROCE_PEER_CHILD", how)
            .env("UROCE_RUNTIME_DIR", &rt)
            .stdout(std::process::Stdio::null())
            .status()
            .unwrap();
        assert_eq!(st.success(), how == "exit", "{how}: {st:?}");
        let name = format!("ssd-exit-{how}");
        if how == "exit" {
            assert!(rt.join(peer::totals::EXITED_DIR).join(&name).exists(), "folded by the process itself at exit");
        }
        let host = peer::totals::host();
        let t = host.totals.iter().find(|s| s.name == name).unwrap_or_else(|| panic!("{name}: {host:?}"));
        assert_eq!((t.num_alloc_mrs, t.num_reg_pages, t.num_reg_bytes), (2, 8, 8 * 4096), "{t:?}");
        assert_adds_up(t, 0, 0, 0);
        assert_eq!(t.version, "1.0");
        assert!(host.processes.iter().all(|(_, s)| s.name != name), "no longer a live process");
        // Folded exactly once: reading again changes nothing.
        let again = peer::totals::host();
        assert_eq!(again.totals.iter().find(|s| s.name == name), Some(t));
    }
}

/// `uroce peers stop|start` as a running process sees it: a stopped client
/// claims no new registration (the address is then not registrable: the
/// CPU cannot reach it), the regions it already backs keep working, and a
/// start brings it back — all without restarting the process.
#[test]
fn a_stopped_client_serves_no_new_registration() {
    let rt_path = runtime_dir();
    let (dev, _path) = storage("ssd4");
    let (a, b) = connected(None);
    let d1 = dev.alloc(4096).unwrap();
    let d2 = dev.alloc(4096).unwrap();
    // SAFETY: device addresses claimed by the storage peer.
    let mr1 = unsafe { b.pd.register_raw(d1 as *mut u8, 4096, d1, RW) }.unwrap();
    let rt = uroce::runtime::SafeDir::create_or_open(&rt_path, uroce::runtime::Access::Private).unwrap();
    peer::service::set_state(&rt, &["ssd4".into()], false, 0o600).unwrap();
    assert!(peer::service::stopped_now().contains("ssd4"));
    // SAFETY: as above.
    let refused = unsafe { b.pd.register_raw(d2 as *mut u8, 4096, d2, RW) };
    assert!(refused.is_err(), "a stopped client claims nothing");
    assert_eq!(stats("ssd4").num_alloc_mrs, 1);
    let src = a.pd.register(vec![9u8; 64], Access::empty()).unwrap();
    let mut w = wr(1, WrOpcode::RdmaWrite, src.sge(0, 64));
    w.remote_addr = d1;
    w.rkey = mr1.rkey();
    a.qp.post_send(&w).unwrap();
    assert_eq!(a.cq.wait(1, T).unwrap()[0].status, WcStatus::Success, "existing regions keep working");
    peer::service::set_state(&rt, &["ssd4".into()], true, 0o600).unwrap();
    // SAFETY: as above.
    let mr2 = unsafe { b.pd.register_raw(d2 as *mut u8, 4096, d2, RW) }.unwrap();
    assert_adds_up(&stats("ssd4"), 2, 2, 8192);
    drop((mr1, mr2));
    assert_adds_up(&stats("ssd4"), 0, 0, 0);
}
