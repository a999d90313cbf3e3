//! How a test says that it could not run. libtest has no skip decided at run
//! time, so a test that cannot run (a tool, a privilege or hardware missing)
//! prints exactly one line and returns, and `scripts/test.sh` counts those
//! lines as skips instead of passes. This is the one file every test crate
//! includes for that (`#[macro_use] mod skip;`, with `#[path]` outside
//! crates/uroce):
//!
//! - `skip!("reason")`: the whole test is skipped. Prints
//!   `SKIP <test name>: <reason>` and returns from the test. test.sh counts
//!   the test as skipped, not passed.
//! - `skip::part("reason")`: a part of a test that has asserted something
//!   else is skipped. Prints `SKIP-PART <test name>: <reason>`; the test
//!   counts as passed and test.sh lists the line among the partial skips.
//!
//! A tool or package that is missing is said as "`<what>` is not installed
//! (Debian package `<p>`)": CI installs everything, and test.sh fails a CI
//! run (CI=true) that prints such a skip, so a missing install step is seen.
//! The test's name is libtest's name of the thread running it.
#![allow(dead_code)]

use std::fmt::Display;

/// The running test's name (libtest runs each test on a thread named after it).
pub fn test_name() -> String {
    std::thread::current().name().unwrap_or("unknown-test").to_string()
}

/// Prints the line of a whole-test skip; use `skip!`, which also returns.
pub fn whole(reason: impl Display) {
    println!("SKIP {}: {reason}", test_name());
}

/// Prints the line of a skipped part of a test that goes on (or has
/// asserted something already).
pub fn part(reason: impl Display) {
    println!("SKIP-PART {}: {reason}", test_name());
}

/// Skips the whole test: prints `SKIP <test>: <reason>` and returns `()`.
#[allow(unused_macros)]
macro_rules! skip {
    ($($reason:tt)+) => {{
        $crate::skip::whole(format_args!($($reason)+));
        return;
    }};
}
