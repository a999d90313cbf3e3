//! On-demand paging costs (issue #5):
//! 1. registration time vs size (should be flat: nothing is pinned);
//! 2. first access per page: the device writing never-touched ODP pages
//!    through its fault-tolerant path vs the kernel's own first-touch cost
//!    (the CPU writing never-touched pages); goal ≤ 2×;
//! 3. prefetch of 1 GiB (`advise_mr` PREFETCH_WRITE) vs `madvise
//!    (MADV_POPULATE_WRITE)` of the same range.
//!
//! Run: `cargo bench -p uroce --bench odp`

use std::time::Instant;
use uroce::ib::{Access, Sge};
use uroce::mem::{Advice, Memory, Want, IMPLICIT_ODP_LEN};

const PAGE: usize = 4096;

fn map(len: usize) -> usize {
    // SAFETY: a fresh anonymous mapping, checked.
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
            -1,
            0,
        )
    };
    assert_ne!(p, libc::MAP_FAILED);
    p as usize
}

fn unmap(addr: usize, len: usize) {
    // SAFETY: a mapping made by `map`.
    unsafe { libc::munmap(addr as *mut libc::c_void, len) };
}

fn main() {
    let mem = Memory::new();
    let rw = Access::LOCAL_WRITE | Access::REMOTE_WRITE | Access::ON_DEMAND;

    println!("1. ODP registration time vs size");
    println!("   {:>12} {:>12}", "size", "µs");
    for shift in [12u32, 20, 30, 36, 40] {
        let len = 1u64 << shift;
        // Reserve address space only.
        // SAFETY: PROT_NONE reservation, checked.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len as usize,
                libc::PROT_NONE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
                -1,
                0,
            )
        };
        assert_ne!(p, libc::MAP_FAILED);
        let n = 200;
        let t = Instant::now();
        for _ in 0..n {
            // SAFETY: ODP registrations never dereference memory directly.
            let mr = unsafe { mem.register(1, p as usize, len, p as u64, rw, None) }.unwrap();
            mem.deregister(mr.key).unwrap();
        }
        let us = t.elapsed().as_secs_f64() * 1e6 / n as f64;
        println!("   {:>12} {:>12.2}", format!("2^{shift} B"), us);
        unmap(p as usize, len as usize);
    }

    println!("\n2. first access per page (64 MiB of never-touched pages, µs per 4 KiB page)");
    let len = 64 << 20;
    let pages = len / PAGE;
    let cpu = map(len);
    let t = Instant::now();
    for i in 0..pages {
        // SAFETY: inside the fresh RW mapping.
        unsafe { std::ptr::write_bytes((cpu + i * PAGE) as *mut u8, 1, PAGE) };
    }
    let cpu_us = t.elapsed().as_secs_f64() * 1e6 / pages as f64;
    unmap(cpu, len);
    let dev = map(len);
    // SAFETY: ODP.
    let mr = unsafe { mem.register(1, dev, len as u64, dev as u64, rw, None) }.unwrap();
    let data = vec![1u8; PAGE];
    let t = Instant::now();
    for i in 0..pages {
        let s = mem.resolve(mr.key, 1, (dev + i * PAGE) as u64, PAGE as u64, Want::RemoteWrite).unwrap();
        s.write(0, &data).unwrap();
    }
    let dev_us = t.elapsed().as_secs_f64() * 1e6 / pages as f64;
    let faults = mr.odp().unwrap().stats().page_faults;
    // Second touch: the translation exists, only the copy remains.
    let t = Instant::now();
    for i in 0..pages {
        let s = mem.resolve(mr.key, 1, (dev + i * PAGE) as u64, PAGE as u64, Want::RemoteWrite).unwrap();
        s.write(0, &data).unwrap();
    }
    let again_us = t.elapsed().as_secs_f64() * 1e6 / pages as f64;
    mem.deregister(mr.key).unwrap();
    unmap(dev, len);
    println!("   CPU first touch (kernel page fault + 4 KiB write)  {cpu_us:8.3}");
    println!(
        "   device first write through ODP                   {dev_us:8.3}   ({:.2}x; {faults} page faults counted)",
        dev_us / cpu_us
    );
    println!("   device write to already-faulted pages            {again_us:8.3}");

    println!("\n3. prefetch 1 GiB");
    let len = 1 << 30;
    let a = map(len);
    let t = Instant::now();
    // SAFETY: our mapping.
    let r = unsafe { libc::madvise(a as *mut libc::c_void, len, libc::MADV_POPULATE_WRITE) };
    assert_eq!(r, 0);
    let madv_ms = t.elapsed().as_secs_f64() * 1e3;
    unmap(a, len);
    let b = map(len);
    // SAFETY: ODP.
    let mr = unsafe { mem.register(1, b, len as u64, b as u64, rw, None) }.unwrap();
    let t = Instant::now();
    mem.advise(1, Advice::PrefetchWrite, true, &[Sge { addr: b as u64, length: len as u32, lkey: mr.key }]).unwrap();
    let adv_ms = t.elapsed().as_secs_f64() * 1e3;
    let pre = mr.odp().unwrap().stats().page_prefetch;
    mem.deregister(mr.key).unwrap();
    unmap(b, len);
    println!("   madvise(MADV_POPULATE_WRITE)   {madv_ms:8.1} ms");
    println!("   advise_mr(PREFETCH_WRITE)      {adv_ms:8.1} ms   ({:.2}x; page_prefetch {pre})", adv_ms / madv_ms);

    // Implicit ODP registration is one key for everything.
    let t = Instant::now();
    // SAFETY: ODP.
    let imp = unsafe { mem.register(1, 0, IMPLICIT_ODP_LEN, 0, rw, None) }.unwrap();
    println!("\nimplicit ODP registration: {:.2} µs", t.elapsed().as_secs_f64() * 1e6);
    mem.deregister(imp.key).unwrap();
}
