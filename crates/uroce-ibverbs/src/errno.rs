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
