//! Which private mappings are other threads' stacks.
//!
//! [`super::own`] moves private memory into a memfd with the range
//! read-only for the copy; a thread that writes there meanwhile waits in
//! the SIGSEGV handler, which runs on that thread's stack. A thread whose
//! stack is in the range cannot take that fault (the kernel has nowhere to
//! push the signal frame) and dies, so a stack is never moved.
//! `/proc/self/maps` names only the main thread's (`[stack]`); this module
//! tells the others by what glibc builds: a thread's stack mapping has a
//! `PROT_NONE` guard directly below it (or a name, with the
//! `glibc.mem.decorate_maps` tunable), and the thread's descriptor
//! (`struct pthread`) at its top, whose first and third words (`tcbhead_t`'s
//! `tcb` and `self`, what `%fs:0` and `%fs:16` read) hold its own address.
//! A buffer with guard pages around it has the first mark, not the second.
//!
//! Cost: nothing unless the mapping has the guard; then one read of the
//! resident pages from the range up to the mapping's top, at most
//! [`SCAN_MAX`] (a stack's descriptor lies above every frame of its thread,
//! so a buffer on a stack is found after reading the stack above it).
//! Stacks glibc did not lay out (`pthread_attr_setstack` without a guard,
//! coroutine stacks, a future glibc guarding with `MADV_GUARD_INSTALL`,
//! which leaves no mapping of its own) are not told apart.

use super::maps::Vma;

/// The most bytes read above a range looking for a thread descriptor:
/// larger than glibc's default stack (8 MiB here: `RLIMIT_STACK`).
pub(crate) const SCAN_MAX: u64 = 64 << 20;

/// Whether `v`, private anonymous memory that `below` (the mapping just
/// under it, if any) borders, holds a thread's stack at or above `from`.
pub(crate) fn is_thread_stack(v: &Vma, below: Option<&Vma>, from: u64) -> bool {
    if v.name.contains("stack") {
        return true;
    }
    let guarded = below.is_some_and(|b| b.hi == v.lo && b.prot == libc::PROT_NONE && !b.shared);
    guarded && descriptor_above(from.max(v.lo), v.hi.min(from.saturating_add(SCAN_MAX)))
}

/// Whether a resident page of `lo..hi` holds, at a 64-byte boundary `a`
/// (glibc aligns `struct pthread` to at least 64), the words `a` at `a` and
/// `a + 16`.
fn descriptor_above(lo: u64, hi: u64) -> bool {
    let page = super::odp::page_size();
    let lo = lo / page * page;
    let mut buf = vec![0u64; page as usize / 8];
    for (start, end) in super::odp::resident_runs(lo, hi.saturating_sub(lo)) {
        for at in (start..end).step_by(page as usize) {
            // SAFETY: a page of this process's memory (another thread's
            // stack, which may change or go away meanwhile: read
            // fault-tolerantly into our own buffer).
            let missed = unsafe { super::safe::copy(buf.as_mut_ptr().cast(), at as *const u8, page as usize) };
            if missed != 0 {
                continue;
            }
            let found = buf.chunks_exact(8).zip((at..).step_by(64)).any(|(w, a)| w[0] == a && w[2] == a);
            if found {
                return true;
            }
        }
    }
    false
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
    use std::sync::Arc;

    fn vmas_around(addr: u64) -> (Vma, Option<Vma>) {
        let (below, vmas) = super::super::maps::vmas_and_below(addr, addr + 1).unwrap();
        (vmas[0].clone(), below)
    }

    /// A buffer on another thread's stack is told apart, while the thread
    /// runs and writes its stack.
    #[test]
    fn another_threads_stack_is_told_apart() {
        super::super::safe::install();
        let (addr, stop) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicBool::new(false)));
        let t = {
            let (addr, stop) = (addr.clone(), stop.clone());
            std::thread::spawn(move || {
                let mut buf = [0u8; 8192];
                addr.store(buf.as_mut_ptr() as usize, Ordering::Release);
                let mut i = 0u8;
                while !stop.load(Ordering::Relaxed) {
                    i = i.wrapping_add(1);
                    std::hint::black_box(&mut buf)[100] = i;
                }
            })
        };
        let a = loop {
            match addr.load(Ordering::Acquire) {
                0 => std::thread::yield_now(),
                a => break a as u64,
            }
        };
        let (v, below) = vmas_around(a);
        let stack = is_thread_stack(&v, below.as_ref(), a);
        stop.store(true, Ordering::Relaxed);
        t.join().unwrap();
        assert!(below.is_some_and(|b| b.prot == libc::PROT_NONE), "glibc guards a thread's stack");
        assert!(stack, "{v:?} holds the thread's stack");
    }

    /// Memory with guard pages around it, as the suite's victims and some
    /// allocators map it, is not a stack.
    #[test]
    fn a_guarded_buffer_is_not_a_stack() {
        super::super::safe::install();
        let page = super::super::odp::page_size() as usize;
        // SAFETY: a fresh private mapping, checked; its first and last pages
        // made guards.
        let p = unsafe {
            let p = libc::mmap(
                std::ptr::null_mut(),
                6 * page,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            );
            assert_ne!(p, libc::MAP_FAILED);
            std::ptr::write_bytes((p as *mut u8).add(page), 0x11, 4 * page);
            assert_eq!(libc::mprotect(p, page, libc::PROT_NONE), 0);
            assert_eq!(libc::mprotect((p as *mut u8).add(5 * page).cast(), page, libc::PROT_NONE), 0);
            p as u64
        };
        let (v, below) = vmas_around(p + page as u64);
        assert!(below.as_ref().is_some_and(|b| b.prot == libc::PROT_NONE && b.hi == v.lo));
        assert!(!is_thread_stack(&v, below.as_ref(), p + page as u64), "{v:?}");
        // A word that points to itself is not enough; the third must too.
        // SAFETY: our mapping.
        unsafe { *((p + 2 * page as u64) as *mut u64) = p + 2 * page as u64 };
        assert!(!is_thread_stack(&v, below.as_ref(), p + page as u64));
        // SAFETY: our mapping.
        unsafe { *((p + 2 * page as u64 + 16) as *mut u64) = p + 2 * page as u64 };
        assert!(is_thread_stack(&v, below.as_ref(), p + page as u64), "the descriptor's mark, planted");
        // SAFETY: our mapping.
        unsafe { libc::munmap(p as *mut libc::c_void, 6 * page) };
    }
}
