//! The registration check of pinned memory: is the whole range mapped, with
//! the access the registration asks for? It answers as the kernel's
//! `get_user_pages` does for `ib_umem_get`: a writable registration needs a
//! writable mapping (FOLL_WRITE), any registration needs a readable one
//! (PROT_NONE fails), and a hole fails; all three are EFAULT.
//!
//! Up to 1 MiB, every page is probed with the fault-tolerant routines of
//! [`super::safe`] (a read, or a locked add of 0 for write access, which
//! needs write permission and changes nothing). Larger ranges are checked
//! against `/proc/self/maps`, read in 4 KiB chunks and parsed only up to the
//! end of the range (the file is sorted by address), so that cost depends on
//! the number of mappings below the range, not on the range's size. Where
//! `/proc` cannot be read, pages are probed for reading only.

use crate::ib::{Errno, Error, Result};
use std::io::Read;

/// Ranges up to this size are probed page by page (x86_64 Linux), larger
/// ones checked against `/proc/self/maps`: a probe costs tens of
/// nanoseconds per page, reading the maps about 10 µs.
const PROBE_MAX: u64 = 1 << 20;

/// Checks that `addr..addr+len` is mapped readable, and writable if `write`.
pub(crate) fn check(addr: usize, len: u64, write: bool) -> Result<()> {
    if len == 0 {
        return Ok(());
    }
    #[cfg(all(target_arch = "x86_64", target_os = "linux"))]
    if len <= PROBE_MAX {
        let ok =
            if write { super::safe::writable(addr, len as usize) } else { super::safe::readable(addr, len as usize) };
        return match ok {
            true => Ok(()),
            false => Err(Error::new(
                Errno::EFAULT,
                format!(
                    "reg_mr: {addr:#x}+{len} is not all mapped {} memory",
                    if write { "writable" } else { "readable" }
                ),
            )),
        };
    }
    let end = (addr as u64).saturating_add(len);
    let verdict = match std::fs::File::open("/proc/self/maps") {
        Ok(f) => scan(f, addr as u64, end, write),
        Err(_) => Ok(if super::safe::readable(addr, len as usize) { Verdict::Ok } else { Verdict::Hole(addr as u64) }),
    };
    match verdict {
        Ok(Verdict::Ok) => Ok(()),
        Ok(Verdict::Hole(at)) => Err(Error::new(Errno::EFAULT, format!("reg_mr: {at:#x} is not mapped memory"))),
        Ok(Verdict::NoRead(at)) => {
            Err(Error::new(Errno::EFAULT, format!("reg_mr: the mapping at {at:#x} is not readable (PROT_NONE)")))
        }
        Ok(Verdict::NoWrite(at)) => Err(Error::new(
            Errno::EFAULT,
            format!("reg_mr: write access asked, but the mapping at {at:#x} is read-only"),
        )),
        Err(e) => Err(Error::new(Errno::EFAULT, format!("reg_mr: cannot read /proc/self/maps: {e}"))),
    }
}

/// One mapping of `/proc/self/maps`, as `own` needs it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Vma {
    pub lo: u64,
    pub hi: u64,
    /// `PROT_*` bits of the mapping.
    pub prot: i32,
    pub shared: bool,
    /// Offset of `lo` in the mapped object.
    pub offset: u64,
    /// `major:minor` of the mapped file's device, as written.
    pub dev: String,
    pub inode: u64,
    /// The path or `[heap]`-style name; empty for plain anonymous memory.
    pub name: String,
}

/// The mappings that overlap `start..end`, in address order (holes are
/// the caller's to notice).
pub(crate) fn vmas(start: u64, end: u64) -> std::io::Result<Vec<Vma>> {
    let text = std::fs::read_to_string("/proc/self/maps")?;
    Ok(parse_vmas(&text, start, end).1)
}

/// As [`vmas`], with the mapping below the first of them (the nearest one
/// under `start`, if any: a stack's guard for [`super::stacks`]).
pub(crate) fn vmas_and_below(start: u64, end: u64) -> std::io::Result<(Option<Vma>, Vec<Vma>)> {
    let text = std::fs::read_to_string("/proc/self/maps")?;
    Ok(parse_vmas(&text, start, end))
}

fn parse_vmas(text: &str, start: u64, end: u64) -> (Option<Vma>, Vec<Vma>) {
    let mut out = Vec::new();
    let mut below = None;
    for line in text.lines() {
        // A line without an address range (none from a kernel) names no
        // mapping: it is skipped, never taken for the one below.
        let Some((lo, hi)) = range_of(line) else { continue };
        if lo >= end {
            break;
        }
        if hi <= start {
            // Below `start`: only the last such line is parsed whole.
            below = Some(line);
            continue;
        }
        out.extend(parse_line(line, |_, _| true));
    }
    (below.and_then(|l| parse_line(l, |_, _| true)), out)
}

/// The address range a line of `/proc/self/maps` starts with.
fn range_of(line: &str) -> Option<(u64, u64)> {
    let (lo, hi) = line.split(' ').next()?.split_once('-')?;
    let (lo, hi) = (u64::from_str_radix(lo, 16).ok()?, u64::from_str_radix(hi, 16).ok()?);
    (lo < hi).then_some((lo, hi))
}

/// One line of `/proc/self/maps`, parsed past its address range only if
/// `wanted(lo, hi)`.
fn parse_line(line: &str, wanted: impl Fn(u64, u64) -> bool) -> Option<Vma> {
    let mut f = line.splitn(6, ' ');
    let (range, perms, off, dev, inode) = (f.next()?, f.next()?, f.next()?, f.next()?, f.next()?);
    let (lo, hi) = range.split_once('-')?;
    let (lo, hi) = (u64::from_str_radix(lo, 16).ok()?, u64::from_str_radix(hi, 16).ok()?);
    if !wanted(lo, hi) {
        return None;
    }
    let p = perms.as_bytes();
    let bit = |i: usize, c: u8, v: i32| if p.get(i) == Some(&c) { v } else { 0 };
    Some(Vma {
        lo,
        hi,
        prot: bit(0, b'r', libc::PROT_READ) | bit(1, b'w', libc::PROT_WRITE) | bit(2, b'x', libc::PROT_EXEC),
        shared: p.get(3) == Some(&b's'),
        offset: u64::from_str_radix(off, 16).unwrap_or(0),
        dev: dev.to_string(),
        inode: inode.parse().unwrap_or(0),
        name: f.next().unwrap_or("").trim().to_string(),
    })
}

#[derive(Debug, PartialEq, Eq)]
enum Verdict {
    Ok,
    Hole(u64),
    NoRead(u64),
    NoWrite(u64),
}

/// Walks the mappings of `maps` (the text of `/proc/self/maps`) that overlap
/// `start..end`.
fn scan(mut maps: impl Read, start: u64, end: u64, write: bool) -> std::io::Result<Verdict> {
    let mut buf = [0u8; 4096];
    // The first bytes of the current line (its address range and
    // permissions; the path after them is skipped).
    let mut head = [0u8; 64];
    let mut head_len = 0usize;
    let mut cursor = start;
    loop {
        let n = maps.read(&mut buf)?;
        if n == 0 {
            return Ok(Verdict::Hole(cursor));
        }
        for &b in &buf[..n] {
            if b != b'\n' {
                if head_len < head.len() {
                    head[head_len] = b;
                    head_len += 1;
                }
                continue;
            }
            let line = &head[..head_len];
            head_len = 0;
            let Some((lo, hi, r, w)) = parse(line) else { continue };
            if hi <= cursor {
                continue;
            }
            if lo > cursor {
                return Ok(Verdict::Hole(cursor));
            }
            if !r {
                return Ok(Verdict::NoRead(cursor));
            }
            if write && !w {
                return Ok(Verdict::NoWrite(cursor));
            }
            cursor = hi;
            if cursor >= end {
                return Ok(Verdict::Ok);
            }
        }
    }
}

/// `lo-hi rwxp ...` → (lo, hi, readable, writable).
fn parse(line: &[u8]) -> Option<(u64, u64, bool, bool)> {
    let mut fields = line.split(|&b| b == b' ');
    let range = fields.next()?;
    let perms = fields.next()?;
    let dash = range.iter().position(|&b| b == b'-')?;
    let hex = |s: &[u8]| u64::from_str_radix(std::str::from_utf8(s).ok()?, 16).ok();
    let (lo, hi) = (hex(&range[..dash])?, hex(&range[dash + 1..])?);
    Some((lo, hi, perms.first() == Some(&b'r'), perms.get(1) == Some(&b'w')))
}

#[cfg(test)]
mod tests {
    use super::*;

    const MAPS: &str = "\
00400000-00452000 r-xp 00000000 08:02 173521      /usr/bin/dbus-daemon
00651000-00652000 r--p 00051000 08:02 173521      /usr/bin/dbus-daemon
00652000-00655000 rw-p 00052000 08:02 173521      /usr/bin/dbus-daemon
00655000-00660000 rw-p 00000000 00:00 0 
00660000-00670000 ---p 00000000 00:00 0 
7ffc0000-7ffd0000 rw-p 00000000 00:00 0                          [stack]
";

    fn v(start: u64, end: u64, write: bool) -> Verdict {
        // A one-byte reader, so that lines cross reads.
        struct Slow<'a>(&'a [u8]);
        impl Read for Slow<'_> {
            fn read(&mut self, b: &mut [u8]) -> std::io::Result<usize> {
                let Some((&x, rest)) = self.0.split_first() else { return Ok(0) };
                b[0] = x;
                self.0 = rest;
                Ok(1)
            }
        }
        let a = scan(MAPS.as_bytes(), start, end, write).unwrap();
        assert_eq!(a, scan(Slow(MAPS.as_bytes()), start, end, write).unwrap());
        a
    }

    #[test]
    fn verdicts() {
        assert_eq!(v(0x400100, 0x400200, false), Verdict::Ok);
        assert_eq!(v(0x400100, 0x400200, true), Verdict::NoWrite(0x400100));
        assert_eq!(v(0x652000, 0x660000, true), Verdict::Ok, "adjacent writable mappings");
        assert_eq!(v(0x651000, 0x660000, false), Verdict::Ok);
        assert_eq!(v(0x651000, 0x660000, true), Verdict::NoWrite(0x651000));
        assert_eq!(v(0x65f000, 0x661000, false), Verdict::NoRead(0x660000), "PROT_NONE");
        assert_eq!(v(0x452000, 0x453000, false), Verdict::Hole(0x452000));
        assert_eq!(v(0x450000, 0x653000, false), Verdict::Hole(0x452000), "a hole inside");
        assert_eq!(v(0x7ffc_f000, 0x7ffd_1000, true), Verdict::Hole(0x7ffd_0000), "past the end");
        assert_eq!(v(0x8000_0000, 0x8000_1000, false), Verdict::Hole(0x8000_0000));
    }

    #[test]
    fn vmas_of_a_range() {
        let v = parse_vmas(MAPS, 0x651000, 0x656000).1;
        assert_eq!(v.len(), 3);
        assert_eq!((v[0].lo, v[0].prot, v[0].shared, v[0].inode), (0x651000, libc::PROT_READ, false, 173521));
        assert_eq!(v[0].name, "/usr/bin/dbus-daemon");
        assert_eq!((v[2].lo, v[2].hi, v[2].prot, v[2].inode), (0x655000, 0x660000, libc::PROT_READ | libc::PROT_WRITE, 0));
        assert_eq!(v[2].name, "");
        assert_eq!(parse_vmas(MAPS, 0x7ffc_0000, 0x7ffc_1000).1[0].name, "[stack]");
        // The mapping below: the nearest under the range, not one inside it.
        let (below, v) = parse_vmas(MAPS, 0x7ffc_0000, 0x7ffc_1000);
        assert_eq!(below.map(|b| (b.lo, b.prot)), Some((0x660000, libc::PROT_NONE)));
        assert_eq!(v.len(), 1);
        assert_eq!(parse_vmas(MAPS, 0x655800, 0x656000).0.map(|b| b.lo), Some(0x652000));
        assert_eq!(parse_vmas(MAPS, 0x300000, 0x400100).0, None);
    }

    #[test]
    fn a_malformed_line_is_skipped_not_taken_for_the_mapping_below() {
        let maps = MAPS.replace("7ffc0000-7ffd0000", "garbage\n7ffc0000-7ffd0000");
        let (below, v) = parse_vmas(&maps, 0x7ffc_0000, 0x7ffc_1000);
        assert_eq!(below.map(|b| b.lo), Some(0x660000));
        assert_eq!(v.len(), 1);
        let maps = MAPS.replace("00655000-00660000 rw-p", "00655000-zz rw-p");
        let v = parse_vmas(&maps, 0x651000, 0x661000).1;
        assert_eq!(v.iter().map(|v| v.lo).collect::<Vec<_>>(), [0x651000, 0x652000, 0x660000], "a hole, seen");
        let (below, _) = parse_vmas("00400000-00300000 r-xp 0 0 0\n", 0x500000, 0x501000);
        assert_eq!(below, None, "an empty range is no mapping");
    }

    #[test]
    fn real_maps() {
        let v = vec![0u8; 10000];
        assert!(check(v.as_ptr() as usize, 10000, true).is_ok());
        let e = check(8, 10, false).unwrap_err();
        assert_eq!(e.errno, Errno::EFAULT);
        // Past the probing size: the maps.
        let big = vec![0u8; 3 << 20];
        assert!(check(big.as_ptr() as usize, 3 << 20, true).is_ok());
        assert_eq!(check(8, 3 << 20, false).unwrap_err().errno, Errno::EFAULT);
        let f = std::fs::File::open("/proc/self/maps").unwrap();
        let at = big.as_ptr() as u64;
        assert_eq!(scan(f, at, at + (3 << 20), true).unwrap(), Verdict::Ok);
    }
}
