//! Fault-tolerant access to pinned memory, as the kernel's `copy_from_user`.
//!
//! A pinned region is memory the application promised to keep, but nothing
//! stops it from `munmap`, `mprotect` or `ftruncate` behind a registration.
//! A kernel device keeps the pages it pinned; uroce reaches the memory
//! through the application's own mapping, so an access after such a change
//! would fault. This module owns the only code that touches pinned memory
//! with the CPU: a copy and three 8-byte atomics written in assembly, whose
//! faulting instructions and fixup addresses are known. A process-wide
//! SIGSEGV/SIGBUS handler, installed once when the first pinned region is
//! registered, moves a fault inside one of them to its fixup, which returns
//! an error; every other fault goes to the handler that was installed before
//! (the application's, or the Rust runtime's stack-overflow check) or, if
//! there was none, kills the process as it would have without uroce. The
//! fast path costs nothing more than a call: no system call, no lookup.
//!
//! On other architectures copies go through `process_vm_readv` on this
//! process (the kernel reports EFAULT instead of faulting) and atomics first
//! probe that the word is readable that way: a read-only page, or a change
//! racing with the probe, still faults there.

use std::sync::Once;

/// Copies `n` bytes from `src` to `dst`; returns the number of bytes NOT
/// copied (0: all of them). A fault on either side stops the copy at the
/// faulting byte: the bytes before it are copied.
///
/// # Safety
/// `dst..dst+n` and `src..src+n` must be either memory of this process that
/// no Rust reference aliases in a conflicting way, or unmapped/inaccessible
/// memory (which is what this function tolerates).
pub(crate) unsafe fn copy(dst: *mut u8, src: *const u8, n: usize) -> usize {
    if n == 0 {
        return 0;
    }
    // SAFETY: the caller's promise, passed on unchanged.
    unsafe { imp::copy(dst, src, n) }
}

/// Atomic fetch-and-add of the 8 aligned bytes at `p` (sequentially
/// consistent); `None` if the memory is not there or not writable.
///
/// # Safety
/// `p` must be 8-byte aligned; as [`copy`] for what it points to.
pub(crate) unsafe fn fetch_add(p: *mut u64, add: u64) -> Option<u64> {
    // SAFETY: the caller's promise, passed on unchanged.
    unsafe { imp::fetch_add(p, add) }
}

/// Atomic compare-and-swap of the 8 aligned bytes at `p` (sequentially
/// consistent); returns the original value, `None` on a fault.
///
/// # Safety
/// As [`fetch_add`].
pub(crate) unsafe fn compare_swap(p: *mut u64, compare: u64, swap: u64) -> Option<u64> {
    // SAFETY: the caller's promise, passed on unchanged.
    unsafe { imp::compare_swap(p, compare, swap) }
}

/// Atomic 8-byte store with release ordering; `None` on a fault.
///
/// # Safety
/// As [`fetch_add`].
pub(crate) unsafe fn store(p: *mut u64, value: u64) -> Option<()> {
    // SAFETY: the caller's promise, passed on unchanged.
    unsafe { imp::store(p, value) }
}

/// Why [`guarded`] did not return `f`'s result.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Unguarded {
    /// A read of the guarded range faulted: `f` was cut short there.
    Fault,
    /// No guard could be set up (no free slot, or no fault handler on this
    /// architecture): `f` did not run.
    Unavailable,
}

/// Runs `f` with faults on `start..start+len` in this thread recovered: `f`
/// may read that memory directly (a CRC over the application's buffer)
/// even if the application unmaps or protects it meanwhile. At such a
/// fault `f`'s frames are abandoned, as a `longjmp` would: `f` must own
/// nothing that needs dropping, hold no lock and not panic.
pub(crate) fn guarded<R>(start: usize, len: usize, f: impl FnOnce() -> R) -> Result<R, Unguarded> {
    imp::guarded(start, len, f)
}

/// Whether every page of `addr..addr+len` can be read now (one byte read
/// per page, fault-tolerant).
pub(crate) fn readable(addr: usize, len: usize) -> bool {
    if len == 0 {
        return true;
    }
    install();
    let page = super::odp::page_size() as usize;
    let end = addr.saturating_add(len);
    let mut at = addr;
    let mut byte = 0u8;
    while at < end {
        // SAFETY: the destination is our own byte; the source is probed.
        if unsafe { copy(&mut byte, at as *const u8, 1) } != 0 {
            return false;
        }
        at = (at / page + 1).saturating_mul(page);
    }
    true
}

/// Whether every page of `addr..addr+len` can be written now: one locked
/// add of 0 per page (fault-tolerant; no byte changes, even with concurrent
/// writers). x86_64 Linux only: elsewhere registration reads
/// `/proc/self/maps`.
#[cfg(all(target_arch = "x86_64", target_os = "linux"))]
pub(crate) fn writable(addr: usize, len: usize) -> bool {
    install();
    let page = super::odp::page_size() as usize;
    let end = addr.saturating_add(len);
    let mut at = addr;
    while at < end {
        // SAFETY: probed, and left unchanged.
        if !unsafe { imp::probe_write(at as *mut u8) } {
            return false;
        }
        at = (at / page + 1).saturating_mul(page);
    }
    true
}

/// Holds user-space writes to `start..start+len` while the returned guard
/// lives: the caller makes the range read-only, and a thread (other than
/// the caller) whose write faults there waits in the fault handler until the
/// guard is dropped, then retries the write. `own` uses it to move pages
/// under a running application without losing a concurrent write. `None`
/// when all slots are taken (or there is no handler on this architecture).
/// Between arming and dropping, the caller must not allocate or take a lock
/// that a waiting thread may hold.
pub(crate) fn hold_writes(start: usize, len: usize) -> Option<HeldWrites> {
    install();
    imp::hold(start, len).map(HeldWrites)
}

/// Writes held by [`hold_writes`]; released on drop.
pub(crate) struct HeldWrites(usize);

impl Drop for HeldWrites {
    fn drop(&mut self) {
        imp::release_hold(self.0);
    }
}

/// Installs the fault handler once (no-op after the first call, and on
/// architectures without one).
pub(crate) fn install() {
    static ONCE: Once = Once::new();
    ONCE.call_once(imp::install);
}

#[cfg(all(target_arch = "x86_64", target_os = "linux"))]
mod imp {
    use std::cell::UnsafeCell;
    use std::mem::MaybeUninit;
    use std::sync::atomic::{AtomicBool, AtomicI32, AtomicU64, AtomicUsize, Ordering};

    // System V ABI: arguments in rdi, rsi, rdx, rcx; result in rax; DF = 0.
    // Each `*_f0_v1` .. `*_f1_v1` range holds the instructions that may touch
    // the caller's memory; a fault there resumes at the matching fixup.
    core::arch::global_asm!(
        ".pushsection .text.uroce_mem_safe,\"ax\",@progbits",
        ".p2align 4",
        ".globl uroce_mem_copy_v1",
        ".hidden uroce_mem_copy_v1",
        ".type uroce_mem_copy_v1,@function",
        "uroce_mem_copy_v1:",
        "    mov rcx, rdx",
        // Short copies (a 64 B message) move 8 bytes at a time: cheaper
        // than starting a string copy.
        "    cmp rcx, 128",
        "    ja uroce_mem_rep_f0_v1",
        "    cmp rcx, 8",
        "    jb uroce_mem_rep_fix_v1",
        ".globl uroce_mem_q_f0_v1",
        ".hidden uroce_mem_q_f0_v1",
        "uroce_mem_q_f0_v1:",
        "    mov rax, qword ptr [rsi]",
        "    mov qword ptr [rdi], rax",
        ".globl uroce_mem_q_f1_v1",
        ".hidden uroce_mem_q_f1_v1",
        "uroce_mem_q_f1_v1:",
        "    add rsi, 8",
        "    add rdi, 8",
        "    sub rcx, 8",
        "    cmp rcx, 8",
        "    jae uroce_mem_q_f0_v1",
        "    jmp uroce_mem_rep_fix_v1",
        ".globl uroce_mem_rep_f0_v1",
        ".hidden uroce_mem_rep_f0_v1",
        "uroce_mem_rep_f0_v1:",
        "    rep movsb",
        ".globl uroce_mem_rep_f1_v1",
        ".hidden uroce_mem_rep_f1_v1",
        "uroce_mem_rep_f1_v1:",
        "    xor eax, eax",
        "    ret",
        // Fixup of the string and 8-byte copies, and the tail of the
        // latter: rcx bytes are left at rsi/rdi. Go on byte by byte, so that
        // the count stops exactly at the faulting byte (a fast string copy
        // may stop a little before it).
        ".globl uroce_mem_rep_fix_v1",
        ".hidden uroce_mem_rep_fix_v1",
        "uroce_mem_rep_fix_v1:",
        "    test rcx, rcx",
        "    jz uroce_mem_byte_fix_v1",
        ".globl uroce_mem_byte_f0_v1",
        ".hidden uroce_mem_byte_f0_v1",
        "uroce_mem_byte_f0_v1:",
        "    mov al, byte ptr [rsi]",
        "    mov byte ptr [rdi], al",
        ".globl uroce_mem_byte_f1_v1",
        ".hidden uroce_mem_byte_f1_v1",
        "uroce_mem_byte_f1_v1:",
        "    inc rsi",
        "    inc rdi",
        "    dec rcx",
        "    jnz uroce_mem_byte_f0_v1",
        ".globl uroce_mem_byte_fix_v1",
        ".hidden uroce_mem_byte_fix_v1",
        "uroce_mem_byte_fix_v1:",
        "    mov rax, rcx",
        "    ret",
        ".size uroce_mem_copy_v1, . - uroce_mem_copy_v1",
        // u32 xadd(p: rdi, add: rsi, out: rdx): 0 ok, 1 fault.
        ".p2align 4",
        ".globl uroce_mem_xadd_v1",
        ".hidden uroce_mem_xadd_v1",
        ".type uroce_mem_xadd_v1,@function",
        "uroce_mem_xadd_v1:",
        "    mov rax, rsi",
        ".globl uroce_mem_xadd_f0_v1",
        ".hidden uroce_mem_xadd_f0_v1",
        "uroce_mem_xadd_f0_v1:",
        "    lock xadd qword ptr [rdi], rax",
        ".globl uroce_mem_xadd_f1_v1",
        ".hidden uroce_mem_xadd_f1_v1",
        "uroce_mem_xadd_f1_v1:",
        "    mov qword ptr [rdx], rax",
        "    xor eax, eax",
        "    ret",
        ".size uroce_mem_xadd_v1, . - uroce_mem_xadd_v1",
        // u32 cas(p: rdi, compare: rsi, swap: rdx, out: rcx): 0 ok, 1 fault.
        ".p2align 4",
        ".globl uroce_mem_cas_v1",
        ".hidden uroce_mem_cas_v1",
        ".type uroce_mem_cas_v1,@function",
        "uroce_mem_cas_v1:",
        "    mov rax, rsi",
        ".globl uroce_mem_cas_f0_v1",
        ".hidden uroce_mem_cas_f0_v1",
        "uroce_mem_cas_f0_v1:",
        "    lock cmpxchg qword ptr [rdi], rdx",
        ".globl uroce_mem_cas_f1_v1",
        ".hidden uroce_mem_cas_f1_v1",
        "uroce_mem_cas_f1_v1:",
        "    mov qword ptr [rcx], rax",
        "    xor eax, eax",
        "    ret",
        ".size uroce_mem_cas_v1, . - uroce_mem_cas_v1",
        // u32 store(p: rdi, value: rsi): 0 ok, 1 fault. A plain x86 store is
        // a release store.
        ".p2align 4",
        ".globl uroce_mem_store_v1",
        ".hidden uroce_mem_store_v1",
        ".type uroce_mem_store_v1,@function",
        "uroce_mem_store_v1:",
        ".globl uroce_mem_store_f0_v1",
        ".hidden uroce_mem_store_f0_v1",
        "uroce_mem_store_f0_v1:",
        "    mov qword ptr [rdi], rsi",
        ".globl uroce_mem_store_f1_v1",
        ".hidden uroce_mem_store_f1_v1",
        "uroce_mem_store_f1_v1:",
        "    xor eax, eax",
        "    ret",
        ".size uroce_mem_store_v1, . - uroce_mem_store_v1",
        // u32 probe_write(p: rdi): 0 if the byte at p may be written, 1 on a
        // fault. A locked add of 0 needs write access and changes nothing,
        // even with concurrent writers.
        ".p2align 4",
        ".globl uroce_mem_pw_v1",
        ".hidden uroce_mem_pw_v1",
        ".type uroce_mem_pw_v1,@function",
        "uroce_mem_pw_v1:",
        ".globl uroce_mem_pw_f0_v1",
        ".hidden uroce_mem_pw_f0_v1",
        "uroce_mem_pw_f0_v1:",
        "    lock add byte ptr [rdi], 0",
        ".globl uroce_mem_pw_f1_v1",
        ".hidden uroce_mem_pw_f1_v1",
        "uroce_mem_pw_f1_v1:",
        "    xor eax, eax",
        "    ret",
        ".size uroce_mem_pw_v1, . - uroce_mem_pw_v1",
        // u32 guarded(f: rdi, arg: rsi, frame: rdx): calls f(arg) and
        // returns 0, after storing its stack pointer at `frame`. The fault
        // handler resumes a guarded fault at `uroce_mem_guard_fix_v1` with
        // that stack pointer: the callee-saved registers are popped back and
        // 1 is returned, as from a longjmp.
        ".p2align 4",
        ".globl uroce_mem_guarded_v1",
        ".hidden uroce_mem_guarded_v1",
        ".type uroce_mem_guarded_v1,@function",
        "uroce_mem_guarded_v1:",
        "    push rbp",
        "    push rbx",
        "    push r12",
        "    push r13",
        "    push r14",
        "    push r15",
        "    sub rsp, 8",
        "    mov qword ptr [rdx], rsp",
        "    mov rax, rdi",
        "    mov rdi, rsi",
        "    call rax",
        "    add rsp, 8",
        "    pop r15",
        "    pop r14",
        "    pop r13",
        "    pop r12",
        "    pop rbx",
        "    pop rbp",
        "    xor eax, eax",
        "    ret",
        ".globl uroce_mem_guard_fix_v1",
        ".hidden uroce_mem_guard_fix_v1",
        "uroce_mem_guard_fix_v1:",
        "    add rsp, 8",
        "    pop r15",
        "    pop r14",
        "    pop r13",
        "    pop r12",
        "    pop rbx",
        "    pop rbp",
        "    mov eax, 1",
        "    ret",
        ".size uroce_mem_guarded_v1, . - uroce_mem_guarded_v1",
        // The atomics' shared fixup.
        ".globl uroce_mem_fail_v1",
        ".hidden uroce_mem_fail_v1",
        "uroce_mem_fail_v1:",
        "    mov eax, 1",
        "    ret",
        ".popsection",
    );

    extern "C" {
        fn uroce_mem_copy_v1(dst: *mut u8, src: *const u8, n: usize) -> usize;
        fn uroce_mem_xadd_v1(p: *mut u64, add: u64, out: *mut u64) -> u32;
        fn uroce_mem_cas_v1(p: *mut u64, compare: u64, swap: u64, out: *mut u64) -> u32;
        fn uroce_mem_store_v1(p: *mut u64, value: u64) -> u32;
        fn uroce_mem_pw_v1(p: *mut u8) -> u32;
        fn uroce_mem_guarded_v1(f: extern "C" fn(*mut u8), arg: *mut u8, frame: *mut usize) -> u32;
        fn uroce_mem_guard_fix_v1();
        // Labels, declared as functions only to take their addresses.
        fn uroce_mem_q_f0_v1();
        fn uroce_mem_q_f1_v1();
        fn uroce_mem_rep_f0_v1();
        fn uroce_mem_rep_f1_v1();
        fn uroce_mem_rep_fix_v1();
        fn uroce_mem_byte_f0_v1();
        fn uroce_mem_byte_f1_v1();
        fn uroce_mem_byte_fix_v1();
        fn uroce_mem_xadd_f0_v1();
        fn uroce_mem_xadd_f1_v1();
        fn uroce_mem_cas_f0_v1();
        fn uroce_mem_cas_f1_v1();
        fn uroce_mem_store_f0_v1();
        fn uroce_mem_store_f1_v1();
        fn uroce_mem_pw_f0_v1();
        fn uroce_mem_pw_f1_v1();
        fn uroce_mem_fail_v1();
    }

    pub(super) unsafe fn copy(dst: *mut u8, src: *const u8, n: usize) -> usize {
        // SAFETY: the caller's contract; the routine touches only the two
        // ranges and returns normally whether or not they fault.
        unsafe { uroce_mem_copy_v1(dst, src, n) }
    }

    pub(super) unsafe fn fetch_add(p: *mut u64, add: u64) -> Option<u64> {
        let mut out = 0u64;
        // SAFETY: the caller's contract; `out` is ours.
        (unsafe { uroce_mem_xadd_v1(p, add, &mut out) } == 0).then_some(out)
    }

    pub(super) unsafe fn compare_swap(p: *mut u64, compare: u64, swap: u64) -> Option<u64> {
        let mut out = 0u64;
        // SAFETY: the caller's contract; `out` is ours.
        (unsafe { uroce_mem_cas_v1(p, compare, swap, &mut out) } == 0).then_some(out)
    }

    pub(super) unsafe fn store(p: *mut u64, value: u64) -> Option<()> {
        // SAFETY: the caller's contract.
        (unsafe { uroce_mem_store_v1(p, value) } == 0).then_some(())
    }

    pub(super) unsafe fn probe_write(p: *mut u8) -> bool {
        // SAFETY: the caller's contract; the byte keeps its value.
        unsafe { uroce_mem_pw_v1(p) == 0 }
    }

    /// A guard armed by [`guarded`]: faults of thread `tid` on
    /// `start..end` resume at the guard's saved stack pointer `frame`.
    struct Guard {
        tid: AtomicI32,
        start: AtomicUsize,
        end: AtomicUsize,
        frame: AtomicUsize,
    }

    /// Threads that may be inside [`guarded`] at once; a thread that finds
    /// none free is told `Unavailable` (the caller takes a slower path).
    const GUARDS: usize = 64;
    #[allow(clippy::declare_interior_mutable_const)]
    const FREE: Guard = Guard {
        tid: AtomicI32::new(0),
        start: AtomicUsize::new(0),
        end: AtomicUsize::new(0),
        frame: AtomicUsize::new(0),
    };
    static ARMED: [Guard; GUARDS] = [FREE; GUARDS];

    /// Ranges whose writes are held (see `hold_writes`): `[start, end)` and
    /// the holding thread; `end == 0` is a free slot.
    struct Hold {
        tid: AtomicI32,
        start: AtomicUsize,
        end: AtomicUsize,
    }
    const HOLDS: usize = 16;
    /// `si_code` of a fault on a page mapped without the access tried.
    const SEGV_ACCERR: i32 = 2;
    #[allow(clippy::declare_interior_mutable_const)]
    const NO_HOLD: Hold = Hold { tid: AtomicI32::new(0), start: AtomicUsize::new(0), end: AtomicUsize::new(0) };
    static HELD: [Hold; HOLDS] = [NO_HOLD; HOLDS];

    /// Holds taken and released so far (see [`retry_after_release`]).
    static HOLDS_TAKEN: AtomicU64 = AtomicU64::new(0);
    static HOLDS_RELEASED: AtomicU64 = AtomicU64::new(0);

    pub(super) fn hold(start: usize, len: usize) -> Option<usize> {
        let tid = gettid();
        let i = HELD.iter().position(|h| h.tid.compare_exchange(0, tid, Ordering::Acquire, Ordering::Relaxed).is_ok())?;
        HOLDS_TAKEN.fetch_add(1, Ordering::AcqRel);
        HELD[i].start.store(start, Ordering::Relaxed);
        HELD[i].end.store(start.saturating_add(len), Ordering::Release);
        Some(i)
    }

    pub(super) fn release_hold(i: usize) {
        HELD[i].end.store(0, Ordering::Release);
        HELD[i].tid.store(0, Ordering::Release);
        HOLDS_RELEASED.fetch_add(1, Ordering::AcqRel);
    }

    /// A write fault (`SEGV_ACCERR`) in no range held now: it may have hit
    /// one just before the holder made the pages writable again and
    /// released it (between the fault and this handler). Retried once per
    /// release seen: a real fault comes back at once, finds no release
    /// since, and is passed on. (The process died of such a write, by a
    /// test's writer thread, in one run of two under load.) Async-signal-
    /// safe: atomics and a const-initialized thread-local without `Drop`.
    fn retry_after_release(addr: usize) -> bool {
        std::thread_local! {
            static LAST: std::cell::Cell<(usize, u64)> = const { std::cell::Cell::new((0, u64::MAX)) };
        }
        if HOLDS_TAKEN.load(Ordering::Acquire) == 0 {
            return false;
        }
        let released = HOLDS_RELEASED.load(Ordering::Acquire);
        LAST.with(|last| {
            if last.get() == (addr, released) {
                return false;
            }
            last.set((addr, released));
            true
        })
    }

    /// Waits while a write fault at `addr` of another thread falls in a held
    /// range; true if it waited (the write is then retried). Async-signal-
    /// safe: atomic loads and `sched_yield`.
    fn wait_if_held(addr: usize) -> bool {
        let tid = gettid();
        let Some(h) = HELD.iter().find(|h| {
            let t = h.tid.load(Ordering::Acquire);
            t != 0 && t != tid && (h.start.load(Ordering::Relaxed)..h.end.load(Ordering::Acquire)).contains(&addr)
        }) else {
            return false;
        };
        let (start, holder) = (h.start.load(Ordering::Relaxed), h.tid.load(Ordering::Relaxed));
        while h.tid.load(Ordering::Acquire) == holder && h.start.load(Ordering::Relaxed) == start && h.end.load(Ordering::Acquire) != 0 {
            // SAFETY: sched_yield has no preconditions and is async-signal-safe.
            unsafe { libc::sched_yield() };
        }
        true
    }

    fn gettid() -> i32 {
        // SAFETY: gettid has no arguments and cannot fail.
        unsafe { libc::syscall(libc::SYS_gettid) as i32 }
    }

    pub(super) fn guarded<R>(start: usize, len: usize, f: impl FnOnce() -> R) -> Result<R, super::Unguarded> {
        std::thread_local! {
            static TID: i32 = gettid();
        }
        let tid = TID.with(|t| *t);
        let Some(g) =
            ARMED.iter().find(|g| g.tid.compare_exchange(0, tid, Ordering::Acquire, Ordering::Relaxed).is_ok())
        else {
            return Err(super::Unguarded::Unavailable);
        };
        g.start.store(start, Ordering::Relaxed);
        g.end.store(start.saturating_add(len), Ordering::Relaxed);
        g.frame.store(0, Ordering::Relaxed);
        let mut f = Some(f);
        let mut out = None;
        let mut call = || out = Some((f.take().expect("called once"))());
        extern "C" fn trampoline<C: FnMut()>(arg: *mut u8) {
            // SAFETY: `arg` is the `&mut C` passed below, alive for the call.
            unsafe { (*arg.cast::<C>())() }
        }
        fn trampoline_of<C: FnMut()>(_: &C) -> extern "C" fn(*mut u8) {
            trampoline::<C>
        }
        let tramp = trampoline_of(&call);
        // SAFETY: the routine calls `tramp(&mut call)` on this stack and
        // returns; at a fault on the guarded range the handler resumes it at
        // its fixup with the stack pointer it saved in `g.frame`, abandoning
        // the frames of `call` (the caller's contract: nothing in them needs
        // dropping).
        let faulted = unsafe { uroce_mem_guarded_v1(tramp, &mut call as *mut _ as *mut u8, g.frame.as_ptr()) } != 0;
        g.frame.store(0, Ordering::Relaxed);
        g.end.store(0, Ordering::Relaxed);
        g.tid.store(0, Ordering::Release);
        match out {
            Some(r) if !faulted => Ok(r),
            _ => Err(super::Unguarded::Fault),
        }
    }

    /// The saved stack pointer of this thread's guard over `addr`, if any.
    /// Async-signal-safe: a system call and atomic loads.
    fn guard_frame(addr: usize) -> Option<usize> {
        let tid = gettid();
        ARMED.iter().find_map(|g| {
            let mine = g.tid.load(Ordering::Acquire) == tid;
            let hit = (g.start.load(Ordering::Relaxed)..g.end.load(Ordering::Relaxed)).contains(&addr);
            let frame = g.frame.load(Ordering::Relaxed);
            (mine && hit && frame != 0).then_some(frame)
        })
    }

    /// The fixup for a fault at `rip`, if `rip` is one of ours.
    fn fixup(rip: usize) -> Option<usize> {
        type Label = unsafe extern "C" fn();
        let table: [(Label, Label, Label); 7] = [
            (uroce_mem_pw_f0_v1, uroce_mem_pw_f1_v1, uroce_mem_fail_v1),
            (uroce_mem_q_f0_v1, uroce_mem_q_f1_v1, uroce_mem_rep_fix_v1),
            (uroce_mem_rep_f0_v1, uroce_mem_rep_f1_v1, uroce_mem_rep_fix_v1),
            (uroce_mem_byte_f0_v1, uroce_mem_byte_f1_v1, uroce_mem_byte_fix_v1),
            (uroce_mem_xadd_f0_v1, uroce_mem_xadd_f1_v1, uroce_mem_fail_v1),
            (uroce_mem_cas_f0_v1, uroce_mem_cas_f1_v1, uroce_mem_fail_v1),
            (uroce_mem_store_f0_v1, uroce_mem_store_f1_v1, uroce_mem_fail_v1),
        ];
        table.iter().find(|(a, b, _)| (*a as usize..*b as usize).contains(&rip)).map(|(_, _, fix)| *fix as usize)
    }

    /// The handlers that were installed before ours: [SIGSEGV, SIGBUS].
    struct Previous(UnsafeCell<[MaybeUninit<libc::sigaction>; 2]>);
    // SAFETY: written once by `install` before `READY` is set (Release), read
    // only after `READY` is seen (Acquire).
    unsafe impl Sync for Previous {}
    static PREVIOUS: Previous = Previous(UnsafeCell::new([MaybeUninit::uninit(), MaybeUninit::uninit()]));
    static READY: AtomicBool = AtomicBool::new(false);

    pub(super) fn install() {
        let base = PREVIOUS.0.get();
        for (i, sig) in [libc::SIGSEGV, libc::SIGBUS].into_iter().enumerate() {
            // SAFETY: sigaction with a null new action only reads the current
            // one into our slot, which nothing else accesses before READY.
            let rc = unsafe { libc::sigaction(sig, std::ptr::null(), (*base)[i].as_mut_ptr()) };
            if rc != 0 {
                return;
            }
        }
        READY.store(true, Ordering::Release);
        for sig in [libc::SIGSEGV, libc::SIGBUS] {
            // SAFETY: an all-zero sigaction is valid; we fill it below.
            let mut sa: libc::sigaction = unsafe { std::mem::zeroed() };
            sa.sa_sigaction = on_fault as *const () as usize;
            sa.sa_flags = libc::SA_SIGINFO | libc::SA_ONSTACK;
            // SAFETY: sa_mask is ours; sigaction installs a handler that only
            // reads immutable data (see `on_fault`).
            unsafe {
                libc::sigemptyset(&mut sa.sa_mask);
                libc::sigaction(sig, &sa, std::ptr::null_mut());
            }
        }
    }

    /// The SIGSEGV/SIGBUS handler. Async-signal-safe: it reads the
    /// interrupted context and immutable statics, allocates nothing and
    /// takes no lock.
    extern "C" fn on_fault(sig: libc::c_int, info: *mut libc::siginfo_t, ctx: *mut libc::c_void) {
        // SAFETY: the kernel passes a valid siginfo and ucontext to an
        // SA_SIGINFO handler; REG_RIP indexes gregs on x86_64 Linux.
        unsafe {
            let uc = ctx as *mut libc::ucontext_t;
            let from_fault = !info.is_null() && (*info).si_code > 0;
            if from_fault && !uc.is_null() {
                // A write into memory whose pages `own` is moving: wait, retry.
                if sig == libc::SIGSEGV && wait_if_held((*info).si_addr() as usize) {
                    return;
                }
                let rip = &mut (*uc).uc_mcontext.gregs[libc::REG_RIP as usize];
                if let Some(fix) = fixup(*rip as usize) {
                    *rip = fix as i64;
                    return;
                }
                if let Some(frame) = guard_frame((*info).si_addr() as usize) {
                    (*uc).uc_mcontext.gregs[libc::REG_RSP as usize] = frame as i64;
                    (*uc).uc_mcontext.gregs[libc::REG_RIP as usize] =
                        uroce_mem_guard_fix_v1 as *const () as usize as i64;
                    return;
                }
                if sig == libc::SIGSEGV
                    && (*info).si_code == SEGV_ACCERR
                    && retry_after_release((*info).si_addr() as usize)
                {
                    return;
                }
            }
            chain(sig, info, ctx, from_fault);
        }
    }

    /// Passes a fault that is not ours to the handler installed before.
    ///
    /// # Safety
    /// Called from `on_fault` with its arguments.
    unsafe fn chain(sig: libc::c_int, info: *mut libc::siginfo_t, ctx: *mut libc::c_void, from_fault: bool) {
        let i = if sig == libc::SIGSEGV { 0 } else { 1 };
        let prev = READY.load(Ordering::Acquire).then(|| {
            // SAFETY: written before READY was set, never written again.
            unsafe { (*PREVIOUS.0.get())[i].assume_init_ref() }
        });
        let handler = prev.map_or(libc::SIG_DFL, |p| p.sa_sigaction);
        if handler == libc::SIG_DFL || handler == libc::SIG_IGN {
            // Restore the default action; returning re-executes the faulting
            // instruction, which now kills the process with this signal (a
            // signal sent by kill() is raised again, to be delivered when the
            // handler returns).
            // SAFETY: an all-zero sigaction with SIG_DFL (0) is the default;
            // sigaction and raise are async-signal-safe.
            unsafe {
                let mut dfl: libc::sigaction = std::mem::zeroed();
                dfl.sa_sigaction = libc::SIG_DFL;
                libc::sigaction(sig, &dfl, std::ptr::null_mut());
                if !from_fault {
                    libc::raise(sig);
                }
            }
            return;
        }
        let prev = prev.expect("a handler other than SIG_DFL was saved");
        // SAFETY: the previous handler was installed for this signal with
        // these flags, so it accepts these arguments.
        unsafe {
            if prev.sa_flags & libc::SA_SIGINFO != 0 {
                let f: extern "C" fn(libc::c_int, *mut libc::siginfo_t, *mut libc::c_void) =
                    std::mem::transmute(handler);
                f(sig, info, ctx);
            } else {
                let f: extern "C" fn(libc::c_int) = std::mem::transmute(handler);
                f(sig);
            }
        }
    }
}

#[cfg(not(all(target_arch = "x86_64", target_os = "linux")))]
mod imp {
    //! Without the assembly routines: copies through the kernel, atomics
    //! after a probe (see the module docs).

    use std::sync::atomic::{AtomicU64, Ordering};

    /// Copies `n` bytes at `remote` to `local` through the kernel; returns
    /// the number of bytes not copied. Either side may be the inaccessible
    /// one: the kernel reports EFAULT for both.
    fn vm_copy(local: *mut u8, remote: *mut u8, n: usize) -> usize {
        let l = libc::iovec { iov_base: local.cast(), iov_len: n };
        let r = libc::iovec { iov_base: remote.cast(), iov_len: n };
        // SAFETY: both iovecs describe memory of this process; the kernel
        // reports an inaccessible range as an error instead of faulting.
        let done = unsafe { libc::process_vm_readv(libc::getpid(), &l, 1, &r, 1, 0) };
        n - usize::try_from(done).unwrap_or(0).min(n)
    }

    pub(super) unsafe fn copy(dst: *mut u8, src: *const u8, n: usize) -> usize {
        vm_copy(dst, src as *mut u8, n)
    }

    pub(super) fn guarded<R>(_: usize, _: usize, _: impl FnOnce() -> R) -> Result<R, super::Unguarded> {
        Err(super::Unguarded::Unavailable)
    }

    /// Whether the word can be read now (writing it to find out would race
    /// with other writers; a read-only page still faults in the atomic).
    fn probe(p: *mut u64) -> bool {
        let mut v = 0u64;
        vm_copy((&mut v as *mut u64).cast(), p.cast(), 8) == 0
    }

    pub(super) unsafe fn fetch_add(p: *mut u64, add: u64) -> Option<u64> {
        // SAFETY: probed just before (see the module docs for the race).
        probe(p).then(|| unsafe { AtomicU64::from_ptr(p) }.fetch_add(add, Ordering::SeqCst))
    }

    pub(super) unsafe fn compare_swap(p: *mut u64, compare: u64, swap: u64) -> Option<u64> {
        // SAFETY: as in `fetch_add`.
        probe(p).then(|| {
            match unsafe { AtomicU64::from_ptr(p) }.compare_exchange(compare, swap, Ordering::SeqCst, Ordering::SeqCst)
            {
                Ok(v) | Err(v) => v,
            }
        })
    }

    pub(super) unsafe fn store(p: *mut u64, value: u64) -> Option<()> {
        // SAFETY: as in `fetch_add`.
        probe(p).then(|| unsafe { AtomicU64::from_ptr(p) }.store(value, Ordering::Release))
    }

    pub(super) fn install() {}

    pub(super) fn hold(_: usize, _: usize) -> Option<usize> {
        None
    }

    pub(super) fn release_hold(_: usize) {}
}

#[cfg(test)]
mod tests {
    use super::*;

    const PAGE: usize = 4096;

    /// Two pages: the first read-write, the second `prot`.
    struct TwoPages(usize);

    impl TwoPages {
        fn new(prot: i32) -> TwoPages {
            // SAFETY: a fresh anonymous mapping, checked.
            let p = unsafe {
                libc::mmap(
                    std::ptr::null_mut(),
                    2 * PAGE,
                    libc::PROT_READ | libc::PROT_WRITE,
                    libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                    -1,
                    0,
                )
            };
            assert_ne!(p, libc::MAP_FAILED);
            // SAFETY: our mapping.
            unsafe {
                std::ptr::write_bytes(p as *mut u8, 0x5a, 2 * PAGE);
                assert_eq!(libc::mprotect((p as usize + PAGE) as *mut libc::c_void, PAGE, prot), 0);
            }
            TwoPages(p as usize)
        }
    }

    impl Drop for TwoPages {
        fn drop(&mut self) {
            // SAFETY: our mapping.
            unsafe { libc::munmap(self.0 as *mut libc::c_void, 2 * PAGE) };
        }
    }

    #[test]
    fn a_guarded_read_of_memory_that_is_gone_returns_instead_of_crashing() {
        install();
        {
            // Unmapped and truncated memory fault the same way (SIGSEGV or
            // SIGBUS at an address in the range): a PROT_NONE page here.
            let m = TwoPages::new(libc::PROT_NONE);
            // Across the boundary: the second page faults.
            let r = guarded(m.0, 2 * PAGE, || {
                // SAFETY: read inside `guarded`, which recovers the fault.
                crc32fast::hash(unsafe { std::slice::from_raw_parts(m.0 as *const u8, 2 * PAGE) })
            });
            assert_eq!(r, Err(Unguarded::Fault));
            // The first page alone: read normally, the guard disarmed after.
            // SAFETY: our readable page.
            let r =
                guarded(m.0, PAGE, || crc32fast::hash(unsafe { std::slice::from_raw_parts(m.0 as *const u8, PAGE) }));
            assert_eq!(r, Ok(crc32fast::hash(&[0x5a; PAGE])));
        }
        // A fault outside the guarded range is not recovered by it.
        let m = TwoPages::new(libc::PROT_NONE);
        // SAFETY: only the readable page is read.
        let r = guarded(m.0 + PAGE, PAGE, || unsafe { std::ptr::read_volatile(m.0 as *const u8) });
        assert_eq!(r, Ok(0x5a));
    }

    #[test]
    fn guarded_reads_in_many_threads_recover_their_own_faults() {
        install();
        let m = TwoPages::new(libc::PROT_NONE);
        let base = m.0;
        let threads: Vec<_> = (0..8)
            .map(|_| {
                std::thread::spawn(move || {
                    (0..200)
                        .map(|i| {
                            let len = if i % 2 == 0 { PAGE } else { 2 * PAGE };
                            guarded(base, len, || {
                                // SAFETY: read inside `guarded`.
                                crc32fast::hash(unsafe { std::slice::from_raw_parts(base as *const u8, len) })
                            })
                            .is_ok()
                        })
                        .filter(|ok| *ok)
                        .count()
                })
            })
            .collect();
        for t in threads {
            assert_eq!(t.join().unwrap(), 100);
        }
    }

    #[test]
    fn copy_stops_at_an_inaccessible_page() {
        install();
        let m = TwoPages::new(libc::PROT_NONE);
        let mut out = vec![0u8; 300];
        // Reading 100 bytes before the boundary and 200 after.
        let src = (m.0 + PAGE - 100) as *const u8;
        // SAFETY: `out` is ours; the source is half inaccessible, tolerated.
        let left = unsafe { copy(out.as_mut_ptr(), src, 300) };
        assert_eq!(left, 200, "the bytes before the boundary are copied");
        assert!(out[..100].iter().all(|&b| b == 0x5a));
        assert!(out[100..].iter().all(|&b| b == 0));
        // Writing across it.
        let data = vec![0xa5u8; 300];
        // SAFETY: as above, the destination now.
        let left = unsafe { copy(src as *mut u8, data.as_ptr(), 300) };
        assert_eq!(left, 200);
        // SAFETY: the first page is readable.
        let first = unsafe { std::slice::from_raw_parts(src, 100) };
        assert!(first.iter().all(|&b| b == 0xa5));
        // Entirely inaccessible, and a large copy.
        let mut big = vec![0u8; 2 * PAGE];
        // SAFETY: as above.
        assert_eq!(unsafe { copy(big.as_mut_ptr(), (m.0 + PAGE) as *const u8, PAGE) }, PAGE);
        // SAFETY: as above.
        assert_eq!(unsafe { copy(big.as_mut_ptr(), m.0 as *const u8, 2 * PAGE) }, PAGE);
        assert!(big[..PAGE].iter().all(|&b| b == 0xa5 || b == 0x5a));
        // Whole and empty copies.
        // SAFETY: readable memory.
        assert_eq!(unsafe { copy(big.as_mut_ptr(), m.0 as *const u8, PAGE) }, 0);
        // SAFETY: nothing is copied.
        assert_eq!(unsafe { copy(big.as_mut_ptr(), (m.0 + PAGE) as *const u8, 0) }, 0);
    }

    #[test]
    fn every_length_stops_exactly_at_the_boundary() {
        install();
        let m = TwoPages::new(libc::PROT_NONE);
        let mut out = vec![0u8; 2 * PAGE];
        for n in [1, 2, 7, 8, 9, 15, 16, 63, 64, 65, 100, 127, 128, 129, 300, 4096] {
            for before in [0usize, 1, 3, 7, 8, 9, 13, 64, 100, 128, 200] {
                let src = (m.0 + PAGE - before) as *const u8;
                // SAFETY: `out` is ours; the source is tolerated.
                let left = unsafe { copy(out.as_mut_ptr(), src, n) };
                assert_eq!(left, n.saturating_sub(before), "{n} bytes, {before} before the boundary");
                // SAFETY: as above, writing now.
                let left = unsafe { copy(src as *mut u8, out.as_ptr(), n) };
                assert_eq!(left, n.saturating_sub(before), "write: {n} bytes, {before} before the boundary");
            }
        }
    }

    #[test]
    fn a_stack_overflow_still_reaches_the_rust_runtime() {
        // The Rust runtime's own SIGSEGV handler (installed before ours)
        // reports a stack overflow and aborts: chained, it still does.
        install();
        #[allow(unconditional_recursion)]
        fn deep(n: u64) -> u64 {
            let pad = std::hint::black_box([n; 64]);
            deep(n + 1) + pad[7]
        }
        // SAFETY: fork in a test; the child only recurses and never returns.
        let pid = unsafe { libc::fork() };
        assert!(pid >= 0);
        if pid == 0 {
            no_core_dump();
            // SAFETY: silence the child's report, then overflow.
            unsafe { libc::close(2) };
            std::hint::black_box(deep(0));
            // SAFETY: not reached.
            unsafe { libc::_exit(0) };
        }
        let mut status = 0;
        // SAFETY: waiting for our child.
        unsafe { libc::waitpid(pid, &mut status, 0) };
        assert!(libc::WIFSIGNALED(status), "{status:#x}");
        assert_eq!(libc::WTERMSIG(status), libc::SIGABRT, "the runtime's overflow report aborts");
    }

    /// The cost of the fault-tolerant copy against `memmove`, in the same
    /// run (a ratio that the VM's speed swings do not change): run with
    /// `cargo test --release -p uroce --lib mem::safe::tests::cost -- --ignored --nocapture`.
    #[test]
    #[ignore]
    fn cost() {
        use std::hint::black_box;
        use std::time::Instant;
        install();
        let src = vec![7u8; 1 << 16];
        let mut dst = vec![0u8; 1 << 16];
        for n in [8usize, 64, 256, 4096, 65536] {
            let reps = (1usize << 24) / n.max(64);
            let (mut plain, mut safe) = (f64::MAX, f64::MAX);
            for _ in 0..15 {
                let t = Instant::now();
                for _ in 0..reps {
                    // SAFETY: two distinct buffers of 64 KiB.
                    unsafe { std::ptr::copy(black_box(src.as_ptr()), black_box(dst.as_mut_ptr()), black_box(n)) };
                }
                plain = plain.min(t.elapsed().as_secs_f64() * 1e9 / reps as f64);
                let t = Instant::now();
                for _ in 0..reps {
                    // SAFETY: as above.
                    black_box(unsafe { copy(black_box(dst.as_mut_ptr()), black_box(src.as_ptr()), black_box(n)) });
                }
                safe = safe.min(t.elapsed().as_secs_f64() * 1e9 / reps as f64);
            }
            println!(
                "{n:6} B: memmove {plain:8.1} ns, safe copy {safe:8.1} ns ({:+.1} ns, {:.2}x)",
                safe - plain,
                safe / plain
            );
        }
        let t = Instant::now();
        for _ in 0..100_000 {
            black_box(readable(black_box(src.as_ptr() as usize), 4096));
        }
        println!("probe of a 4 KiB payload (readable): {:.1} ns", t.elapsed().as_secs_f64() * 1e9 / 100_000.0);
        let w = Box::new(0u64);
        let p = &*w as *const u64 as *mut u64;
        let (mut plain, mut safe) = (f64::MAX, f64::MAX);
        for _ in 0..15 {
            let t = Instant::now();
            for _ in 0..100_000 {
                // SAFETY: our aligned word.
                black_box(
                    unsafe { std::sync::atomic::AtomicU64::from_ptr(black_box(p)) }
                        .fetch_add(1, std::sync::atomic::Ordering::SeqCst),
                );
            }
            plain = plain.min(t.elapsed().as_secs_f64() * 1e4);
            let t = Instant::now();
            for _ in 0..100_000 {
                // SAFETY: our aligned word.
                black_box(unsafe { fetch_add(black_box(p), 1) });
            }
            safe = safe.min(t.elapsed().as_secs_f64() * 1e4);
        }
        println!("fetch_add: AtomicU64 {plain:.1} ns, safe {safe:.1} ns");
        let maps = std::fs::read_to_string("/proc/self/maps").unwrap().lines().count();
        let big = vec![1u8; 4 << 20];
        for len in [4096usize, 64 << 10, 1 << 20, 4 << 20] {
            let t = Instant::now();
            for _ in 0..200 {
                super::super::maps::check(big.as_ptr() as usize, len as u64, true).unwrap();
            }
            let us = t.elapsed().as_secs_f64() * 1e6 / 200.0;
            println!("registration check of {len} B, writable ({maps} mappings): {us:.2} us");
        }
    }

    #[test]
    fn copy_into_a_read_only_page_stops_there() {
        install();
        let m = TwoPages::new(libc::PROT_READ);
        let data = [1u8; 64];
        // SAFETY: the source is ours; the destination straddles into a
        // read-only page, tolerated.
        let left = unsafe { copy((m.0 + PAGE - 8) as *mut u8, data.as_ptr(), 64) };
        assert_eq!(left, 56);
        assert!(readable(m.0, 2 * PAGE), "read-only is readable");
    }

    #[test]
    #[cfg(all(target_arch = "x86_64", target_os = "linux"))]
    fn atomics_report_faults() {
        install();
        let m = TwoPages::new(libc::PROT_READ);
        let ok = m.0 as *mut u64;
        let ro = (m.0 + PAGE) as *mut u64;
        // SAFETY: aligned words of our mapping; faults are tolerated.
        unsafe {
            assert_eq!(store(ok, 10), Some(()));
            assert_eq!(fetch_add(ok, 5), Some(10));
            assert_eq!(compare_swap(ok, 15, 99), Some(15));
            assert_eq!(compare_swap(ok, 15, 7), Some(99), "no swap when different");
            assert_eq!(*ok, 99);
            assert_eq!(fetch_add(ro, 1), None);
            assert_eq!(compare_swap(ro, 0, 1), None);
            assert_eq!(store(ro, 1), None);
            assert_eq!(*(ro as *const u64), 0x5a5a_5a5a_5a5a_5a5a, "unchanged");
            libc::mprotect(ro.cast(), PAGE, libc::PROT_NONE);
            assert_eq!(fetch_add(ro, 1), None);
        }
        assert!(!readable(m.0, PAGE + 1));
        assert!(readable(m.0, PAGE));
        assert!(writable(m.0, PAGE));
        assert!(!writable(m.0, PAGE + 1));
        let ro = TwoPages::new(libc::PROT_READ);
        assert!(!writable(ro.0 + 10, PAGE), "read-only second page");
        assert!(readable(ro.0 + 10, PAGE));
    }

    /// In a child about to die of a deliberate fault: no core file (where
    /// core dumps are on, one would land in the crate's directory).
    fn no_core_dump() {
        let zero = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
        // SAFETY: setrlimit with a valid struct.
        unsafe { libc::setrlimit(libc::RLIMIT_CORE, &zero) };
    }

    #[test]
    fn other_faults_still_reach_the_previous_handler() {
        // A SIGSEGV that is not ours goes to the handler installed before
        // (here the Rust runtime's, or the default): run it in a child.
        install();
        // SAFETY: fork in a test; the child only faults and never returns.
        let pid = unsafe { libc::fork() };
        assert!(pid >= 0);
        if pid == 0 {
            no_core_dump();
            // SAFETY: a deliberate fault in the child.
            unsafe {
                std::ptr::write_volatile(8 as *mut u8, 1);
                libc::_exit(0);
            }
        }
        let mut status = 0;
        // SAFETY: waiting for our child.
        unsafe { libc::waitpid(pid, &mut status, 0) };
        assert!(libc::WIFSIGNALED(status), "the child died of its fault: {status:#x}");
        assert_eq!(libc::WTERMSIG(status), libc::SIGSEGV);
    }
}
