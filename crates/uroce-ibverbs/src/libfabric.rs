//! What the drop-in does at load time for libfabric.
//!
//! libfabric's default memory monitor for its registration cache
//! (`memhooks`) patches libc's `mmap`, `munmap`, `madvise`, `brk` and
//! others in place when a verbs domain opens (`fi_domain`), and unpatches
//! them when it closes, with no care for threads running those functions
//! meanwhile (libfabric issues 7569 and 10943, open upstream). Over a
//! kernel device no other thread exists then; over uroce its threads
//! (progress, CM, link hub) do, and a new one allocating its first malloc
//! arena is inside `munmap` now and then: it returns into the half-written
//! patch and dies (SIGSEGV at `munmap+9`, the code there a `movabs`/`jmp`
//! to libfabric's hook; twice in a few hundred `fi_pingpong -e rdm` runs
//! on a busy host). So, unless the application chose a monitor
//! itself (`FI_MR_CACHE_MONITOR` set), the drop-in sets it before libfabric
//! reads it (libfabric reads it in `fi_getinfo`, after the libraries it
//! links were loaded): `userfaultfd` where this process may open one (the
//! cache then works as with memhooks), else `disabled` (libfabric then
//! registers without its cache).

/// Run once by the dynamic loader when the library is loaded, before
/// `main` and before any thread of the application exists.
extern "C" fn choose_fi_monitor() {
    if std::env::var_os("FI_MR_CACHE_MONITOR").is_some() {
        return;
    }
    let monitor = if userfaultfd_allowed() { "userfaultfd" } else { "disabled" };
    // The process has one thread now (a constructor of a library the
    // application links), so nothing reads the environment meanwhile.
    std::env::set_var("FI_MR_CACHE_MONITOR", monitor);
}

/// Whether this process may open a userfaultfd (root, CAP_SYS_PTRACE, or
/// `vm.unprivileged_userfaultfd = 1`), as libfabric's monitor opens it.
fn userfaultfd_allowed() -> bool {
    // SAFETY: a system call with flags only; the descriptor is closed below.
    let fd = unsafe { libc::syscall(libc::SYS_userfaultfd, libc::O_CLOEXEC | libc::O_NONBLOCK) };
    if fd < 0 {
        return false;
    }
    // SAFETY: the descriptor opened above, ours.
    unsafe { libc::close(fd as libc::c_int) };
    true
}

#[used]
#[link_section = ".init_array"]
static CHOOSE_FI_MONITOR: extern "C" fn() = choose_fi_monitor;
