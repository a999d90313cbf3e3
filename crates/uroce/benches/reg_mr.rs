//! Registration cost of 1 GiB of populated memory vs the kernel's own
//! `mlock`/`munlock` of the same range (issue #8 target: ≤ 1.1×).
//!
//! Run: `cargo bench -p uroce --bench reg_mr` (needs RLIMIT_MEMLOCK ≥ 1 GiB,
//! e.g. as root).

use std::time::Instant;
use uroce::ib::Access;
use uroce::mem::Memory;

fn main() {
    let len = 1usize << 30;
    // SAFETY: a fresh anonymous mapping, checked; populated below.
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
            0,
        )
    };
    assert_ne!(p, libc::MAP_FAILED);
    // SAFETY: our mapping.
    assert_eq!(unsafe { libc::madvise(p, len, libc::MADV_POPULATE_WRITE) }, 0);
    let mem = Memory::new();
    let (mut lock, mut unlock, mut reg, mut dereg) = (0f64, 0f64, 0f64, 0f64);
    let rounds = 5;
    for _ in 0..rounds {
        let t = Instant::now();
        // SAFETY: our mapping.
        assert_eq!(unsafe { libc::mlock(p, len) }, 0, "mlock 1 GiB (RLIMIT_MEMLOCK?)");
        lock += t.elapsed().as_secs_f64();
        let t = Instant::now();
        // SAFETY: our mapping.
        unsafe { libc::munlock(p, len) };
        unlock += t.elapsed().as_secs_f64();
        let t = Instant::now();
        // SAFETY: the mapping outlives the registration.
        let mr = unsafe { mem.register(1, p as usize, len as u64, p as u64, Access::LOCAL_WRITE, None) }.unwrap();
        reg += t.elapsed().as_secs_f64();
        let t = Instant::now();
        mem.deregister(mr.key).unwrap();
        dereg += t.elapsed().as_secs_f64();
    }
    let ms = |x: f64| x * 1e3 / rounds as f64;
    println!("1 GiB of populated memory, mean of {rounds} (ms):");
    println!("  mlock {:8.1}   reg_mr   {:8.1}   ({:.2}x)", ms(lock), ms(reg), reg / lock);
    println!("  munlock {:6.1}   dereg_mr {:8.1}   ({:.2}x)", ms(unlock), ms(dereg), dereg / unlock);
}
