//! The application changes registered (pinned) memory behind the device's
//! back — munmap, mprotect(PROT_NONE), mprotect(PROT_READ), ftruncate of a
//! shared file mapping — and a peer then WRITEs, READs and runs atomics on
//! it, or the application SENDs from it: the process survives, and each
//! access does what it does on a kernel device, which holds the pages it
//! pinned. After munmap or mprotect every operation reaches the old pages
//! and succeeds; memory mapped later at the same address is never reached
//! (issue 28: a peer's WRITE through the old key must not land in it, a
//! READ must not return its bytes). Past the end of a truncated shared
//! file the pages are gone: remote accesses fail with REM_ACCESS_ERR, local
//! ones with LOC_PROT_ERR. Registration checks the mapping's access as
//! get_user_pages does (EFAULT).

mod common;

use common::*;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use uroce::ib::Errno;
use uroce::verbs::*;

const PAGE: usize = 4096;
/// The victim region: three pages.
const LEN: usize = 3 * PAGE;
const ALL: Access =
    Access::LOCAL_WRITE.union(Access::REMOTE_WRITE).union(Access::REMOTE_READ).union(Access::REMOTE_ATOMIC);

/// Tests here open devices (threads, hence small mappings) and make holes in
/// the address space: one at a time, so that no mapping of this process
/// lands in a hole while a test relies on it.
static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn serial() -> std::sync::MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

/// What the application does to its registered memory.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Change {
    Munmap,
    ProtNone,
    ProtRead,
    Truncate,
}

/// A private 0700 directory, removed on drop.
struct TempDir(std::path::PathBuf);

impl TempDir {
    fn new() -> TempDir {
        let base = std::env::temp_dir();
        for i in 0..100u32 {
            let p = base.join(format!("uroce-memchg-{}-{i}", std::process::id()));
            if std::fs::DirBuilder::new().mode(0o700).create(&p).is_ok() {
                return TempDir(p);
            }
        }
        panic!("cannot create a private temporary directory");
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// The victim's memory: an anonymous private mapping, or a shared mapping
/// of a file in a private directory.
struct Victim {
    addr: usize,
    file: Option<(std::fs::File, TempDir)>,
}

impl Victim {
    fn new(file_backed: bool) -> Victim {
        let file = file_backed.then(|| {
            let dir = TempDir::new();
            let f = std::fs::OpenOptions::new()
                .read(true)
                .write(true)
                .create_new(true)
                .mode(0o600)
                .custom_flags(libc::O_NOFOLLOW)
                .open(dir.0.join("region"))
                .unwrap();
            f.set_len(LEN as u64).unwrap();
            (f, dir)
        });
        let (flags, fd) = match &file {
            Some((f, _)) => (libc::MAP_SHARED, std::os::fd::AsRawFd::as_raw_fd(f)),
            None => (libc::MAP_PRIVATE | libc::MAP_ANONYMOUS, -1),
        };
        // An inaccessible page on each side, so that the hole a munmap
        // leaves is exactly the region's size: too small for the 16 KiB a
        // new thread's signal stack takes, which the kernel would otherwise
        // put there at once (at the top of the free gap the hole joins).
        // SAFETY: a fresh reservation chosen by the kernel, checked below.
        let r = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                LEN + 2 * PAGE,
                libc::PROT_NONE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        assert_ne!(r, libc::MAP_FAILED);
        let at = (r as usize + PAGE) as *mut libc::c_void;
        // SAFETY: MAP_FIXED inside our own reservation.
        let p = unsafe { libc::mmap(at, LEN, libc::PROT_READ | libc::PROT_WRITE, flags | libc::MAP_FIXED, fd, 0) };
        assert_eq!(p, at);
        // SAFETY: our mapping, writable.
        unsafe { std::ptr::write_bytes(p as *mut u8, 0x11, LEN) };
        Victim { addr: p as usize, file }
    }

    fn apply(&self, change: Change) {
        let p = self.addr as *mut libc::c_void;
        // SAFETY: our own mapping; nothing references it as a Rust object.
        let rc = unsafe {
            match change {
                Change::Munmap => libc::munmap(p, LEN),
                Change::ProtNone => libc::mprotect(p, LEN, libc::PROT_NONE),
                Change::ProtRead => libc::mprotect(p, LEN, libc::PROT_READ),
                Change::Truncate => libc::ftruncate(std::os::fd::AsRawFd::as_raw_fd(&self.file.as_ref().unwrap().0), 0),
            }
        };
        assert_eq!(rc, 0, "{change:?}: {}", std::io::Error::last_os_error());
    }
}

impl Drop for Victim {
    fn drop(&mut self) {
        // SAFETY: our mapping and its two guard pages (munmap of an
        // unmapped range is harmless).
        unsafe { libc::munmap((self.addr - PAGE) as *mut libc::c_void, LEN + 2 * PAGE) };
    }
}

/// What the test does to the changed memory.
#[derive(Debug, Clone, Copy)]
enum Op {
    RemoteWrite,
    RemoteRead,
    FetchAdd,
    CmpSwp,
    /// A local SEND of this many bytes from the region (small ones are
    /// copied into the packet, large ones are sent in place).
    Send(u32),
}

/// The status of `op` against the victim's memory after `change`, with the
/// victim's region registered on device `b`, the peer on device `a`.
fn run(devs: &(Context, Context), change: Change, op: Op) -> WcStatus {
    let (a, b) = (end(devs.0.clone()), end(devs.1.clone()));
    a.qp.connect_rc(&b.ctx.query_gid(0).unwrap(), b.qp.qp_num(), 300, 400).unwrap();
    b.qp.connect_rc(&a.ctx.query_gid(0).unwrap(), a.qp.qp_num(), 400, 300).unwrap();
    let victim = Victim::new(change == Change::Truncate);
    // SAFETY: the mapping outlives the region (and is changed under it on
    // purpose: that is what the test is about).
    let mr = unsafe { b.pd.register_raw(victim.addr as *mut u8, LEN, victim.addr as u64, ALL) }.unwrap();
    let local = a.pd.register(vec![0u8; LEN], ALL).unwrap();
    victim.apply(change);
    let status = match op {
        Op::Send(n) => {
            local_recv(&a, &local, n);
            b.qp.post_send(&wr(9, WrOpcode::Send, mr.sge(PAGE, n))).unwrap();
            b.cq.wait(1, T).unwrap()[0].status
        }
        _ => {
            let (opcode, sge) = match op {
                Op::RemoteWrite => (WrOpcode::RdmaWrite, local.sge(0, 2 * PAGE as u32)),
                Op::RemoteRead => (WrOpcode::RdmaRead, local.sge(0, 2 * PAGE as u32)),
                Op::FetchAdd => (WrOpcode::AtomicFetchAdd, local.sge(0, 8)),
                Op::CmpSwp => (WrOpcode::AtomicCmpSwp, local.sge(0, 8)),
                Op::Send(_) => unreachable!(),
            };
            let mut w = wr(7, opcode, sge);
            w.remote_addr = mr.iova() + PAGE as u64;
            w.rkey = mr.rkey();
            w.compare_add = 0x1111_1111_1111_1111;
            w.swap = 5;
            a.qp.post_send(&w).unwrap();
            a.cq.wait(1, T).unwrap()[0].status
        }
    };
    drop(mr);
    status
}

fn local_recv(a: &End, local: &MemoryRegion, n: u32) {
    a.qp.post_recv(&RecvWr { wr_id: 1, sg_list: uroce::sgl![local.sge(0, n)] }).unwrap();
}

/// Every operation after `change`: the process survives and each status is
/// a device's: the pinned pages serve every operation, except past the end
/// of a truncated file.
fn survives(change: Change) {
    let _g = serial();
    let devs = pair_with(None);
    let pinned = change != Change::Truncate;
    let ok_if_readable = |s| if pinned { WcStatus::Success } else { s };
    let cases = [
        (Op::RemoteWrite, ok_if_readable(WcStatus::RemAccessErr)),
        (Op::RemoteRead, ok_if_readable(WcStatus::RemAccessErr)),
        (Op::FetchAdd, ok_if_readable(WcStatus::RemAccessErr)),
        (Op::CmpSwp, ok_if_readable(WcStatus::RemAccessErr)),
        (Op::Send(64), ok_if_readable(WcStatus::LocProtErr)),
        (Op::Send(4096), ok_if_readable(WcStatus::LocProtErr)),
    ];
    for (op, want) in cases {
        assert_eq!(run(&devs, change, op), want, "{change:?} then {op:?}");
    }
}

#[test]
fn munmap_then_every_operation() {
    survives(Change::Munmap);
}

#[test]
fn prot_none_then_every_operation() {
    survives(Change::ProtNone);
}

#[test]
fn prot_read_then_every_operation() {
    survives(Change::ProtRead);
}

#[test]
fn ftruncate_of_a_shared_file_then_every_operation() {
    survives(Change::Truncate);
}

/// A mapping of `pages` pages with `prot`, unmapped on drop.
struct Map(usize, usize);

impl Map {
    fn new(pages: usize, prot: i32) -> Map {
        // SAFETY: a fresh anonymous mapping, checked.
        let p = unsafe {
            libc::mmap(std::ptr::null_mut(), pages * PAGE, prot, libc::MAP_PRIVATE | libc::MAP_ANONYMOUS, -1, 0)
        };
        assert_ne!(p, libc::MAP_FAILED);
        Map(p as usize, pages * PAGE)
    }
}

impl Drop for Map {
    fn drop(&mut self) {
        // SAFETY: our mapping.
        unsafe { libc::munmap(self.0 as *mut libc::c_void, self.1) };
    }
}

#[test]
fn registration_checks_the_mapping_access() {
    let _g = serial();
    let (ctx, _other) = pair_with(None);
    let pd = ctx.alloc_pd().unwrap();
    let reg = |addr: usize, len: usize, access: Access| {
        // SAFETY: the mappings of every call below outlive the regions,
        // and failed registrations keep nothing.
        unsafe { pd.register_raw(addr as *mut u8, len, addr as u64, access) }.map(|mr| mr.lkey())
    };
    let ro = Map::new(2, libc::PROT_READ);
    for access in [Access::LOCAL_WRITE, ALL, Access::LOCAL_WRITE | Access::REMOTE_WRITE, Access::MW_BIND] {
        let e = reg(ro.0, ro.1, access).unwrap_err();
        assert_eq!(e.errno, Errno::EFAULT, "{access:?} on a read-only mapping: {e}");
    }
    assert!(reg(ro.0, ro.1, Access::REMOTE_READ).is_ok(), "read-only access on a read-only mapping");
    assert!(reg(ro.0 + 10, 100, Access::empty()).is_ok());
    // Re-registering a read-only region writable: EPERM, as mlx5.
    {
        // SAFETY: as above.
        let mut mr = unsafe { pd.register_raw(ro.0 as *mut u8, ro.1, ro.0 as u64, Access::REMOTE_READ) }.unwrap();
        let e = mr.rereg_access(Access::LOCAL_WRITE | Access::REMOTE_READ).unwrap_err();
        assert_eq!(e.errno, Errno::EPERM);
    }
    // A new translation onto the read-only mapping, keeping a writable
    // access: EFAULT, and the region keeps its old translation.
    {
        let rw = Map::new(1, libc::PROT_READ | libc::PROT_WRITE);
        // SAFETY: as above.
        let mut mr = unsafe { pd.register_raw(rw.0 as *mut u8, PAGE, rw.0 as u64, ALL) }.unwrap();
        // SAFETY: the mapping outlives the region.
        let e = unsafe { mr.rereg_raw(ro.0 as *mut u8, PAGE, ro.0 as u64) }.unwrap_err();
        assert_eq!(e.errno, Errno::EFAULT);
        mr.write_at(0, &[1u8; 8]).unwrap();
    }
    // PROT_NONE: EFAULT even for read-only access.
    let none = Map::new(1, libc::PROT_NONE);
    assert_eq!(reg(none.0, PAGE, Access::empty()).unwrap_err().errno, Errno::EFAULT);
    assert_eq!(reg(none.0, PAGE, Access::REMOTE_READ).unwrap_err().errno, Errno::EFAULT);
    // Writable with a read-only page in the middle.
    let mixed = Map::new(3, libc::PROT_READ | libc::PROT_WRITE);
    // SAFETY: our mapping.
    assert_eq!(unsafe { libc::mprotect((mixed.0 + PAGE) as *mut libc::c_void, PAGE, libc::PROT_READ) }, 0);
    assert_eq!(reg(mixed.0, 3 * PAGE, Access::LOCAL_WRITE).unwrap_err().errno, Errno::EFAULT);
    assert!(reg(mixed.0, PAGE, Access::LOCAL_WRITE).is_ok(), "the writable page alone");
    assert!(reg(mixed.0, 3 * PAGE, Access::REMOTE_READ).is_ok());
    // Unmapped: a hole in the middle, and entirely.
    let holed = Map::new(3, libc::PROT_READ | libc::PROT_WRITE);
    // SAFETY: our mapping.
    assert_eq!(unsafe { libc::munmap((holed.0 + PAGE) as *mut libc::c_void, PAGE) }, 0);
    assert_eq!(reg(holed.0, 3 * PAGE, Access::empty()).unwrap_err().errno, Errno::EFAULT);
    assert_eq!(reg(holed.0 + PAGE, PAGE, Access::LOCAL_WRITE).unwrap_err().errno, Errno::EFAULT);
    // Writable: fine.
    let rw = Map::new(2, libc::PROT_READ | libc::PROT_WRITE);
    assert!(reg(rw.0, rw.1, ALL).is_ok());
}

/// Replaces `LEN` bytes at `addr` by a new anonymous mapping filled with
/// `fill` (MAP_FIXED: atomic, no window for another thread).
fn map_again(addr: usize, fill: u8) {
    // SAFETY: the test's own victim range.
    unsafe {
        let p = libc::mmap(
            addr as *mut libc::c_void,
            LEN,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_FIXED,
            -1,
            0,
        );
        assert_eq!(p as usize, addr);
        std::ptr::write_bytes(p as *mut u8, fill, LEN);
    }
}

/// Issue 28's deterministic case: register, munmap, map new memory at the
/// address, then a peer WRITE and READ through the old key. The WRITE
/// reaches the old pages, not the new mapping; the READ returns the old
/// pages' bytes, never the new mapping's.
#[test]
fn a_write_through_an_old_key_never_reaches_memory_mapped_later() {
    let _g = serial();
    let devs = pair_with(None);
    let (a, b) = (end(devs.0.clone()), end(devs.1.clone()));
    a.qp.connect_rc(&b.ctx.query_gid(0).unwrap(), b.qp.qp_num(), 300, 400).unwrap();
    b.qp.connect_rc(&a.ctx.query_gid(0).unwrap(), a.qp.qp_num(), 400, 300).unwrap();
    for round in 0..20u64 {
        let victim = Victim::new(false);
        // SAFETY: the mapping is replaced under the region on purpose.
        let mr = unsafe { b.pd.register_raw(victim.addr as *mut u8, LEN, victim.addr as u64, ALL) }.unwrap();
        // SAFETY: our victim mapping.
        assert_eq!(unsafe { libc::munmap(victim.addr as *mut libc::c_void, LEN) }, 0);
        map_again(victim.addr, 0x22);
        let local = a.pd.register(vec![0xabu8; LEN], ALL).unwrap();
        let mut w = wr(round * 2, WrOpcode::RdmaWrite, local.sge(0, PAGE as u32));
        w.remote_addr = mr.iova() + PAGE as u64;
        w.rkey = mr.rkey();
        a.qp.post_send(&w).unwrap();
        assert_eq!(a.cq.wait(1, T).unwrap()[0].status, WcStatus::Success, "the pinned pages take the WRITE");
        // SAFETY: the new mapping, ours.
        let now = unsafe { std::slice::from_raw_parts(victim.addr as *const u8, LEN) };
        assert!(now.iter().all(|&x| x == 0x22), "round {round}: the WRITE landed in the new mapping");
        let back = a.pd.register(vec![0u8; LEN], ALL).unwrap();
        let mut r = wr(round * 2 + 1, WrOpcode::RdmaRead, back.sge(0, LEN as u32));
        r.remote_addr = mr.iova();
        r.rkey = mr.rkey();
        a.qp.post_send(&r).unwrap();
        assert_eq!(a.cq.wait(1, T).unwrap()[0].status, WcStatus::Success);
        let mut got = vec![0u8; LEN];
        back.read_at(0, &mut got).unwrap();
        assert!(got[..PAGE].iter().all(|&x| x == 0x11), "round {round}: the old bytes");
        assert!(got[PAGE..2 * PAGE].iter().all(|&x| x == 0xab), "round {round}: the WRITE's bytes");
        assert!(got[2 * PAGE..].iter().all(|&x| x == 0x11), "round {round}: never the new mapping's");
        drop(mr);
    }
}

/// Many threads map, fill and check memory while a peer WRITEs and READs
/// through keys whose memory the application unmaps meanwhile: no byte ever
/// lands in a mapping made after the registration's pages went away, and
/// no READ returns such a mapping's bytes (checked by pattern). 10 000
/// rounds, or fewer when 60 s are up on a busy machine.
#[test]
fn unmapping_under_a_peers_traffic_never_touches_new_mappings() {
    use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
    let _g = serial();
    let devs = pair_with(None);
    let (a, b) = (end(devs.0.clone()), end(devs.1.clone()));
    a.qp.connect_rc(&b.ctx.query_gid(0).unwrap(), b.qp.qp_num(), 300, 400).unwrap();
    b.qp.connect_rc(&a.ctx.query_gid(0).unwrap(), a.qp.qp_num(), 400, 300).unwrap();
    let stop = std::sync::Arc::new(AtomicBool::new(false));
    let checked = std::sync::Arc::new(AtomicU64::new(0));
    // Mappers: map (the kernel reuses the addresses the victims free),
    // fill with their own pattern, yield, check, unmap.
    let mappers: Vec<_> = (0..3u8)
        .map(|i| {
            let (stop, checked) = (stop.clone(), checked.clone());
            std::thread::spawn(move || {
                let fill = 0x30 + i;
                let mut bad = 0usize;
                while !stop.load(Ordering::Relaxed) {
                    let m = Map::new(3, libc::PROT_READ | libc::PROT_WRITE);
                    // SAFETY: our mapping.
                    let s = unsafe { std::slice::from_raw_parts_mut(m.0 as *mut u8, m.1) };
                    s.fill(fill);
                    for _ in 0..20 {
                        std::thread::yield_now();
                    }
                    bad += s.iter().filter(|&&x| x != fill).count();
                    checked.fetch_add(1, Ordering::Relaxed);
                }
                bad
            })
        })
        .collect();
    let local = a.pd.register(vec![0xabu8; LEN], ALL).unwrap();
    let back = a.pd.register(vec![0u8; LEN], ALL).unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    let mut rounds = 0u64;
    while rounds < 10_000 && std::time::Instant::now() < deadline {
        let victim = Map::new(3, libc::PROT_READ | libc::PROT_WRITE);
        // SAFETY: our mapping.
        unsafe { std::ptr::write_bytes(victim.0 as *mut u8, 0x11, LEN) };
        // SAFETY: unmapped under the region on purpose.
        let mr = unsafe { b.pd.register_raw(victim.0 as *mut u8, LEN, victim.0 as u64, ALL) }.unwrap();
        let mut w = wr(rounds * 2, WrOpcode::RdmaWrite, local.sge(0, 2 * PAGE as u32));
        w.remote_addr = mr.iova() + PAGE as u64;
        w.rkey = mr.rkey();
        let mut r = wr(rounds * 2 + 1, WrOpcode::RdmaRead, back.sge(0, LEN as u32));
        r.remote_addr = mr.iova();
        r.rkey = mr.rkey();
        a.qp.post_send(&w).unwrap();
        a.qp.post_send(&r).unwrap();
        drop(victim); // munmap while the operations are on their way
        let wcs = a.cq.wait(2, T).unwrap();
        assert!(wcs.iter().all(|c| c.status == WcStatus::Success), "round {rounds}: {wcs:?}");
        let mut got = vec![0u8; LEN];
        back.read_at(0, &mut got).unwrap();
        assert!(got.iter().all(|&x| x == 0x11 || x == 0xab), "round {rounds}: a READ returned another mapping's bytes");
        drop(mr);
        rounds += 1;
    }
    stop.store(true, Ordering::Relaxed);
    let bad: usize = mappers.into_iter().map(|t| t.join().unwrap()).sum();
    eprintln!("{rounds} rounds, {} mappings checked", checked.load(Ordering::Relaxed));
    assert_eq!(bad, 0, "bytes of a peer's WRITE landed in mappings made later");
    assert!(rounds >= 100, "only {rounds} rounds in 60 s");
}

#[test]
fn deregistration_after_munmap_works() {
    let _g = serial();
    let (ctx, _other) = pair_with(None);
    let pd = ctx.alloc_pd().unwrap();
    // One page between two inaccessible ones: the hole its munmap leaves
    // is too small for what other threads map meanwhile (a new thread's
    // 16 KiB signal stack took a 4-page hole between the two accesses).
    let m = Map::new(3, libc::PROT_READ | libc::PROT_WRITE);
    let page = m.0 + PAGE;
    // SAFETY: our mapping; the guards, then the page under the region on
    // purpose.
    unsafe {
        assert_eq!(libc::mprotect(m.0 as *mut libc::c_void, PAGE, libc::PROT_NONE), 0);
        assert_eq!(libc::mprotect((m.0 + 2 * PAGE) as *mut libc::c_void, PAGE, libc::PROT_NONE), 0);
    }
    // SAFETY: the mapping is unmapped under the region on purpose.
    let mr = unsafe { pd.register_raw(page as *mut u8, PAGE, page as u64, ALL) }.unwrap();
    // SAFETY: our mapping.
    assert_eq!(unsafe { libc::munmap(page as *mut libc::c_void, PAGE) }, 0);
    // The region still holds the pages, as a kernel pin.
    let mut b = [0u8; 8];
    mr.write_at(0, &[9u8; 8]).unwrap();
    mr.read_at(0, &mut b).unwrap();
    assert_eq!(b, [9u8; 8]);
    mr.dereg().map_err(|(_, e)| e).unwrap();
    // Unmap the guards alone: the hole may be another thread's by now.
    std::mem::forget(m);
    // SAFETY: the two guard pages are ours.
    unsafe {
        libc::munmap((page - PAGE) as *mut libc::c_void, PAGE);
        libc::munmap((page + PAGE) as *mut libc::c_void, PAGE);
    }
}

#[test]
fn dmabuf_whose_file_is_truncated() {
    let _g = serial();
    let devs = pair_with(None);
    let (a, b) = (end(devs.0.clone()), end(devs.1.clone()));
    a.qp.connect_rc(&b.ctx.query_gid(0).unwrap(), b.qp.qp_num(), 300, 400).unwrap();
    b.qp.connect_rc(&a.ctx.query_gid(0).unwrap(), a.qp.qp_num(), 400, 300).unwrap();
    // SAFETY: a fresh memfd, checked.
    let fd = unsafe { libc::memfd_create(c"uroce-memchg".as_ptr(), libc::MFD_CLOEXEC) };
    assert!(fd >= 0);
    // SAFETY: our descriptor.
    assert_eq!(unsafe { libc::ftruncate(fd, LEN as libc::off_t) }, 0);
    let mr = b.pd.register_dmabuf(0, LEN, 0, fd, ALL).unwrap();
    let local = a.pd.register(vec![7u8; LEN], ALL).unwrap();
    let mut w = wr(1, WrOpcode::RdmaWrite, local.sge(0, 64));
    w.remote_addr = mr.iova();
    w.rkey = mr.rkey();
    a.qp.post_send(&w).unwrap();
    assert_eq!(a.cq.wait(1, T).unwrap()[0].status, WcStatus::Success, "before the truncation");
    // SAFETY: our descriptor; the region's own mapping now lies past the end.
    assert_eq!(unsafe { libc::ftruncate(fd, 0) }, 0);
    w.wr_id = 2;
    a.qp.post_send(&w).unwrap();
    assert_eq!(a.cq.wait(1, T).unwrap()[0].status, WcStatus::RemAccessErr);
    mr.dereg().map_err(|(_, e)| e).unwrap();
    // SAFETY: our descriptor.
    unsafe { libc::close(fd) };
}
