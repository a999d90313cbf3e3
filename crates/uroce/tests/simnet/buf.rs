//! Guarded buffers for the simulations. Each buffer is its own shared
//! memfd mapping, so that `MADV_DONTNEED` drops its pages without losing
//! their contents (the file keeps them): that is how a simulation makes
//! the kernel invalidate pages behind an on-demand-paging key. Guard bytes
//! on both sides catch any access that strays past the buffer.

use uroce::ib::Access;
use uroce::mem::odp::page_size;
use uroce::mem::Memory;

/// Guard bytes on each side of a buffer (a multiple of 8, so the buffer
/// itself stays 8-byte aligned for atomics).
pub const GUARD: usize = 64;
pub const GUARD_BYTE: u8 = 0xA5;

pub struct Buf {
    /// The page-aligned mapping: guard, buffer, guard, slack to a page.
    map: *mut u8,
    map_len: usize,
    len: usize,
}

impl Buf {
    /// `len` bytes, byte `i` set to `fill(i)`.
    pub fn new(len: usize, fill: impl Fn(usize) -> u8) -> Buf {
        let page = page_size() as usize;
        let map_len = (len + 2 * GUARD).div_ceil(page) * page;
        // SAFETY: a fresh memfd, sized, then mapped shared; the descriptor is
        // closed once mapped (the mapping keeps the file).
        let map = unsafe {
            let fd = libc::memfd_create(c"uroce-sim".as_ptr(), libc::MFD_CLOEXEC);
            assert!(fd >= 0, "memfd_create: {}", std::io::Error::last_os_error());
            assert_eq!(libc::ftruncate(fd, map_len as libc::off_t), 0, "ftruncate");
            let p =
                libc::mmap(std::ptr::null_mut(), map_len, libc::PROT_READ | libc::PROT_WRITE, libc::MAP_SHARED, fd, 0);
            libc::close(fd);
            assert_ne!(p, libc::MAP_FAILED, "mmap: {}", std::io::Error::last_os_error());
            p.cast::<u8>()
        };
        // SAFETY: the mapping is `map_len` bytes, ours alone; no key covers
        // it yet.
        let all = unsafe { std::slice::from_raw_parts_mut(map, map_len) };
        all.fill(GUARD_BYTE);
        for (i, b) in all[GUARD..GUARD + len].iter_mut().enumerate() {
            *b = fill(i);
        }
        Buf { map, map_len, len }
    }

    /// The address of byte 0.
    pub fn addr(&self) -> u64 {
        self.map as u64 + GUARD as u64
    }

    pub fn len(&self) -> usize {
        self.len
    }

    /// A copy of the contents: the device may write the buffer between two
    /// looks, so no reference into it is handed out.
    pub fn contents(&self) -> Vec<u8> {
        // SAFETY: `len` bytes inside our mapping, copied at once.
        unsafe { std::slice::from_raw_parts(self.map.add(GUARD), self.len) }.to_vec()
    }

    pub fn guards_intact(&self) -> bool {
        // SAFETY: the bytes of our mapping before and after the buffer.
        let (head, tail) = unsafe {
            (
                std::slice::from_raw_parts(self.map, GUARD),
                std::slice::from_raw_parts(self.map.add(GUARD + self.len), self.map_len - GUARD - self.len),
            )
        };
        head.iter().chain(tail).all(|&b| b == GUARD_BYTE)
    }

    /// Registers the buffer as pinned host memory; returns the key.
    ///
    /// # Safety
    /// `mem`, and every engine using it, must be dropped before the buffer
    /// (pinned memory must stay valid while its key exists).
    pub unsafe fn register(&self, mem: &Memory, access: Access) -> u32 {
        // SAFETY: the caller keeps the mapping alive as long as the key.
        let mr = unsafe { mem.register(1, self.addr() as usize, self.len as u64, self.addr(), access, None) };
        mr.expect("register the buffer").key
    }

    /// Registers the buffer for on-demand paging; returns the key. The
    /// buffer must not also be pinned if its pages are to be dropped
    /// (`MADV_DONTNEED` refuses locked pages).
    pub fn register_odp(&self, mem: &Memory, access: Access) -> u32 {
        // SAFETY: an ODP key never dereferences the memory: every access
        // goes through the kernel, which fails cleanly on an unmapped page.
        let mr = unsafe {
            mem.register(1, self.addr() as usize, self.len as u64, self.addr(), access | Access::ON_DEMAND, None)
        };
        mr.expect("register the buffer for ODP").key
    }

    /// Drops the pages holding bytes `range` of the buffer. The memfd keeps
    /// their data; the next access faults them back in.
    pub fn drop_pages(&self, range: std::ops::Range<usize>) {
        assert!(range.start < range.end && range.end <= self.len, "drop {range:?} of {}", self.len);
        let page = page_size() as usize;
        let first = (GUARD + range.start) / page * page;
        let end = (GUARD + range.end).div_ceil(page) * page;
        // SAFETY: whole pages inside our mapping; MADV_DONTNEED on a shared
        // mapping only drops the page-table entries.
        let r = unsafe { libc::madvise(self.map.add(first).cast(), end - first, libc::MADV_DONTNEED) };
        assert_eq!(r, 0, "madvise(MADV_DONTNEED): {}", std::io::Error::last_os_error());
    }
}

impl Drop for Buf {
    fn drop(&mut self) {
        // SAFETY: our mapping; by the contract of `register`, no key that
        // could reach it is in use any more.
        unsafe { libc::munmap(self.map.cast(), self.map_len) };
    }
}
