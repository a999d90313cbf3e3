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
    drop(mr);
    let s = stats("ssd0");
    assert_eq!((s.num_dealloc_mrs, s.num_dereg_pages, s.num_dereg_bytes, s.num_free_callbacks), (1, 16, len, 0));
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
    dev.free(daddr).unwrap();
    let after = stats("ssd1");
    assert_eq!(after.num_free_callbacks - before.num_free_callbacks, 2, "one callback per registered region");
    assert_eq!(after.num_dealloc_mrs - before.num_dealloc_mrs, 2);
    assert_eq!(write(2, daddr, mr2.rkey()), WcStatus::RemAccessErr, "invalidated region refuses access");
    // Deregistration after invalidation still works; bytes counted, pages not (OFED).
    drop(key);
    drop(mr2);
    drop(mr);
    let end = stats("ssd1");
    assert_eq!(end.num_dereg_bytes - before.num_dereg_bytes, 2 * 8192);
    assert_eq!(end.num_dereg_pages, before.num_dereg_pages);
    assert_eq!(end.num_alloc_mrs, 2);
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
