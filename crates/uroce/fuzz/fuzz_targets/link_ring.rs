//! Any bytes as the shared memory of a same-host link's ring (header and
//! slots) and the reader's private head: draining it never panics and never
//! reads outside the ring — a peer process scribbling on the ring can make
//! the link drop, nothing more.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = uroce::io::link::ring::fuzz_drain(data);
});
