//! Registration cost of populated memory vs the kernel's own `mlock` /
//! `munlock` of the same range, from 4 KiB to 1 GiB (issue #8 target:
//! ≤ 1.1× with `mlock` alone; issue 28: registration now also gives uroce
//! its own mapping of the pages, a copy into a memfd for private memory).
//! Shared memory (a memfd the application mapped) is duplicated without a
//! copy: the second table.
//!
//! Run: `cargo bench -p uroce --bench reg_mr` (needs RLIMIT_MEMLOCK ≥ 1 GiB,
//! e.g. as root).

use std::time::Instant;
use uroce::ib::Access;
use uroce::mem::Memory;

fn map(len: usize, shared: bool) -> *mut libc::c_void {
    let (flags, fd) = if shared {
        // SAFETY: a fresh memfd, checked.
        let fd = unsafe { libc::memfd_create(c"reg_mr-bench".as_ptr(), libc::MFD_CLOEXEC) };
        assert!(fd >= 0);
        // SAFETY: our descriptor.
        assert_eq!(unsafe { libc::ftruncate(fd, len as libc::off_t) }, 0);
        (libc::MAP_SHARED, fd)
    } else {
        (libc::MAP_PRIVATE | libc::MAP_ANONYMOUS, -1)
    };
    // SAFETY: a fresh mapping, checked; populated below.
    let p = unsafe { libc::mmap(std::ptr::null_mut(), len, libc::PROT_READ | libc::PROT_WRITE, flags, fd, 0) };
    assert_ne!(p, libc::MAP_FAILED);
    // SAFETY: our mapping (and descriptor, which the mapping keeps alive).
    unsafe {
        assert_eq!(libc::madvise(p, len, libc::MADV_POPULATE_WRITE), 0);
        if fd >= 0 {
            libc::close(fd);
        }
    }
    p
}

fn main() {
    let mem = Memory::new();
    for shared in [false, true] {
        println!(
            "{} memory, populated, mean per call (ms); ratio to mlock/munlock:",
            if shared { "shared (memfd)" } else { "private anonymous" }
        );
        for (len, rounds) in [(4usize << 10, 2000), (64 << 10, 1000), (1 << 20, 200), (64 << 20, 10), (1 << 30, 3)] {
            let p = map(len, shared);
            let (mut lock, mut unlock, mut reg, mut dereg) = (0f64, 0f64, 0f64, 0f64);
            for _ in 0..rounds {
                let t = Instant::now();
                // SAFETY: our mapping.
                assert_eq!(unsafe { libc::mlock(p, len) }, 0, "mlock (RLIMIT_MEMLOCK?)");
                lock += t.elapsed().as_secs_f64();
                let t = Instant::now();
                // SAFETY: our mapping.
                unsafe { libc::munlock(p, len) };
                unlock += t.elapsed().as_secs_f64();
                let t = Instant::now();
                // SAFETY: the mapping outlives the registration.
                let mr =
                    unsafe { mem.register(1, p as usize, len as u64, p as u64, Access::LOCAL_WRITE, None) }.unwrap();
                reg += t.elapsed().as_secs_f64();
                let t = Instant::now();
                mem.deregister(mr.key).unwrap();
                drop(mr); // the last reference: what registration did is undone
                dereg += t.elapsed().as_secs_f64();
            }
            let ms = |x: f64| x * 1e3 / rounds as f64;
            println!(
                "  {:>5} KiB: mlock {:9.4} reg_mr {:9.4} ({:6.2}x)   munlock {:9.4} dereg_mr {:9.4} ({:6.2}x)",
                len >> 10,
                ms(lock),
                ms(reg),
                reg / lock,
                ms(unlock),
                ms(dereg),
                dereg / unlock
            );
            if len == 64 << 20 {
                data_path(&mem, p as usize, len);
            }
            // SAFETY: our mapping.
            unsafe { libc::munmap(p, len) };
        }
    }
}

/// The data path: 4 KiB remote WRITEs through a registered region (uroce's
/// own mapping of the pages) against `memcpy` into the application's
/// address, over the same 64 MiB, in the same run.
fn data_path(mem: &Memory, p: usize, len: usize) {
    let access = Access::LOCAL_WRITE | Access::REMOTE_WRITE;
    // SAFETY: the mapping outlives the registration.
    let mr = unsafe { mem.register(1, p, len as u64, p as u64, access, None) }.unwrap();
    let data = vec![7u8; 4096];
    let (mut plain, mut through) = (f64::MAX, f64::MAX);
    for _ in 0..5 {
        let t = Instant::now();
        for off in (0..len).step_by(4096) {
            // SAFETY: inside our mapping.
            unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), (p + off) as *mut u8, 4096) };
        }
        plain = plain.min(t.elapsed().as_secs_f64());
        let t = Instant::now();
        for off in (0..len).step_by(4096) {
            assert!(mem.write_remote(mr.key, 1, 1, (p + off) as u64, &data).unwrap());
        }
        through = through.min(t.elapsed().as_secs_f64());
    }
    let per = |x: f64| x * 1e9 / (len / 4096) as f64;
    println!(
        "    data path, 4 KiB WRITEs over 64 MiB: memcpy to the application's address {:.0} ns, write_remote {:.0} ns ({:.2}x)",
        per(plain),
        per(through),
        through / plain
    );
    mem.deregister(mr.key).unwrap();
}
