//! Page pinning with `mlock`, reference counted per page range so that
//! overlapping registrations pin once and unpin only when the last one goes
//! (mlock does not nest). Pinned pages count against RLIMIT_MEMLOCK.

use crate::ib::{Errno, Error, Result};
use std::collections::BTreeMap;

/// Disjoint page ranges `[start, end)` (page numbers) with their pin counts.
#[derive(Debug, Default)]
pub struct PinTable {
    ranges: BTreeMap<u64, (u64, u32)>,
}

fn page_size() -> u64 {
    // SAFETY: sysconf has no memory-safety preconditions.
    let p = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    if p > 0 {
        p as u64
    } else {
        4096
    }
}

fn pages(addr: u64, len: u64) -> (u64, u64) {
    let ps = page_size();
    (addr / ps, (addr + len).div_ceil(ps))
}

impl PinTable {
    /// Pins `addr..addr+len`, faulting the pages in.
    pub fn pin(&mut self, addr: u64, len: u64) -> Result<()> {
        let (start, end) = pages(addr, len);
        let fresh = self.uncovered(start, end);
        let ps = page_size();
        for (i, &(s, e)) in fresh.iter().enumerate() {
            // SAFETY: mlock only changes page residency; it reports ENOMEM for
            // unmapped ranges instead of touching them.
            let rc = unsafe { libc::mlock((s * ps) as *const libc::c_void, ((e - s) * ps) as usize) };
            if rc != 0 {
                let err = std::io::Error::last_os_error();
                for &(s2, e2) in &fresh[..i] {
                    // SAFETY: undoing our own successful mlock.
                    unsafe { libc::munlock((s2 * ps) as *const libc::c_void, ((e2 - s2) * ps) as usize) };
                }
                return Err(pin_error(addr, len, err));
            }
        }
        self.add(start, end, 1);
        Ok(())
    }

    /// Drops one pin of `addr..addr+len`; pages whose count reaches zero are
    /// unlocked.
    pub fn unpin(&mut self, addr: u64, len: u64) {
        let (start, end) = pages(addr, len);
        self.add(start, end, -1);
        let covered = self.uncovered(start, end);
        let ps = page_size();
        for (s, e) in covered {
            // SAFETY: these pages were locked by us and no registration needs them now.
            unsafe { libc::munlock((s * ps) as *const libc::c_void, ((e - s) * ps) as usize) };
        }
    }

    pub fn pinned_bytes(&self) -> u64 {
        self.ranges.iter().map(|(s, (e, _))| e - s).sum::<u64>() * page_size()
    }

    /// Sub-ranges of `[start, end)` with no pin.
    fn uncovered(&self, start: u64, end: u64) -> Vec<(u64, u64)> {
        let mut out = Vec::new();
        let mut cur = start;
        for (&s, &(e, _)) in self.ranges.range(..end) {
            if e <= cur {
                continue;
            }
            if s > cur {
                out.push((cur, s.min(end)));
            }
            cur = cur.max(e);
            if cur >= end {
                break;
            }
        }
        if cur < end {
            out.push((cur, end));
        }
        out
    }

    /// Adds `delta` to the count of every page in `[start, end)`.
    fn add(&mut self, start: u64, end: u64, delta: i32) {
        self.split_at(start);
        self.split_at(end);
        // Fill holes (only when adding).
        if delta > 0 {
            for (s, e) in self.uncovered(start, end) {
                self.ranges.insert(s, (e, 0));
            }
        }
        let keys: Vec<u64> = self.ranges.range(start..end).map(|(&s, _)| s).collect();
        for s in keys {
            let entry = self.ranges.get_mut(&s).unwrap();
            let c = (entry.1 as i64 + delta as i64).max(0) as u32;
            if c == 0 {
                self.ranges.remove(&s);
            } else {
                entry.1 = c;
            }
        }
    }

    fn split_at(&mut self, at: u64) {
        let Some((&s, &(e, c))) = self.ranges.range(..at).next_back() else { return };
        if s < at && at < e {
            self.ranges.insert(s, (at, c));
            self.ranges.insert(at, (e, c));
        }
    }
}

fn pin_error(addr: u64, len: u64, err: std::io::Error) -> Error {
    // mlock reports a page it could not fault in (unmapped, or past the end
    // of a file) as ENOMEM, like an exhausted RLIMIT_MEMLOCK: tell them apart
    // by reading every page, fault-tolerantly (up to 1 GiB: beyond, reading
    // would cost more than the answer is worth; registration checked the
    // mappings already).
    let probe = len <= 1 << 30;
    if err.raw_os_error() == Some(libc::ENOMEM) && probe && !super::safe::readable(addr as usize, len as usize) {
        return Error::new(Errno::EFAULT, format!("reg_mr: {addr:#x}+{len} is not all mapped memory"));
    }
    let mut lim = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: getrlimit fills the struct we pass.
    unsafe { libc::getrlimit(libc::RLIMIT_MEMLOCK, &mut lim) };
    Error::new(
        Errno::ENOMEM,
        format!(
            "reg_mr: cannot pin {len} bytes: {err}; RLIMIT_MEMLOCK is {} KiB (raise it with `ulimit -l`, or register with on-demand paging)",
            if lim.rlim_cur == libc::RLIM_INFINITY { u64::MAX } else { lim.rlim_cur / 1024 }
        ),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn overlapping_pins_count() {
        let mut t = PinTable::default();
        t.add(0, 10, 1);
        t.add(5, 15, 1);
        assert_eq!(t.uncovered(0, 20), vec![(15, 20)]);
        t.add(0, 10, -1);
        assert_eq!(t.uncovered(0, 20), vec![(0, 5), (15, 20)]);
        t.add(5, 15, -1);
        assert!(t.ranges.is_empty());
    }

    #[test]
    fn real_pin_and_unpin() {
        let buf = vec![1u8; 3 * 4096];
        let mut t = PinTable::default();
        t.pin(buf.as_ptr() as u64, buf.len() as u64).unwrap();
        t.pin(buf.as_ptr() as u64 + 100, 10).unwrap();
        assert!(t.pinned_bytes() >= 3 * 4096);
        t.unpin(buf.as_ptr() as u64, buf.len() as u64);
        t.unpin(buf.as_ptr() as u64 + 100, 10);
        assert_eq!(t.pinned_bytes(), 0);
    }
}
