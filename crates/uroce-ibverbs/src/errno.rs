//! errno for the C caller.

use uroce::ib::Error;

pub fn set_errno(e: i32) {
    // SAFETY: __errno_location returns this thread's errno slot.
    unsafe { *libc::__errno_location() = e };
}

/// Sets errno from a uroce error and returns its value.
pub fn fail(e: &Error) -> i32 {
    set_errno(e.errno.0);
    e.errno.0
}

/// Returns `err`, also set in errno when non-zero: the convention of the
/// verbs whose provider passes the kernel's errno straight through
/// (rdma-core's `execute_ioctl` returns the `errno` the ioctl set), e.g.
/// `ibv_dereg_mr`, `ibv_advise_mr`, `ibv_dealloc_mw`, mlx5's `bind_mw`.
pub fn ret(err: i32) -> i32 {
    if err != 0 {
        set_errno(err);
    }
    err
}

/// NULL with errno set.
pub fn null<T>(e: i32) -> *mut T {
    set_errno(e);
    std::ptr::null_mut()
}

/// This thread's errno.
pub fn last() -> i32 {
    // SAFETY: __errno_location returns this thread's errno slot.
    unsafe { *libc::__errno_location() }
}
