//! Indirect keys: one key over a non-contiguous layout of other keys.
//!
//! An indirect key (mlx5's "mkey", MLNX OFED's indirect MR, seed 003's
//! composite region) presents a **zero-based** address space `0..len` made of
//! pieces of other registered memory, named by their lkeys:
//!
//! * a **list** layout concatenates `(addr, length, lkey)` entries;
//! * an **interleaved** layout repeats a block of `(addr, bytes_count,
//!   bytes_skip, lkey)` entries `repeat` times: repetition `r` of entry `i`
//!   starts at `addr + r × (bytes_count + bytes_skip)`. A matrix column is one
//!   entry with `bytes_count` = element size and `bytes_skip` = row stride −
//!   element size, so its description is O(1) in the number of rows.
//!
//! Entries may name other indirect keys (nesting, to [`MAX_DEPTH`] levels).
//! Nothing is resolved when the layout is set: every access resolves each
//! entry's key then, with the same access it needs, so a constituent that is
//! deregistered, invalidated or lacks a right makes the access fail
//! (`LOC_PROT_ERR` locally, `REM_ACCESS_ERR` remotely), as on mlx5.
//!
//! A key is created **free** (invalid). A layout is set either by the
//! verbs-style call [`super::Memory::set_layout`] (immediate; replaces any
//! layout, like a re-registration) or by a UMR work request through a send
//! queue, which needs a free key: reconfiguring a valid key through the send
//! queue requires a LOCAL_INV first (mlx5 semantics).

use crate::ib::{Access, Errno, Error, Result, Sge};
use std::sync::{Arc, RwLock};

/// How deep indirect keys may nest (an access through more levels fails).
pub const MAX_DEPTH: usize = 4;
/// Largest `bytes_count` / `bytes_skip` of an interleaved entry set by a UMR
/// work request (the 16-bit fields of the mlx5 WQE; larger values are
/// refused, not truncated). Verbs-style layouts (`set_layout`,
/// `ibv_rereg_mr_interleaved`) have no such limit: see [`Layout::validate_wide`].
pub const MAX_STRIDE_FIELD: u32 = 0xFFFF;

/// One entry of an interleaved layout.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct InterleavedEntry {
    /// Start of the entry's first repetition, an address in `lkey`'s
    /// address space.
    pub addr: u64,
    /// Bytes taken from each repetition.
    pub bytes_count: u32,
    /// Bytes skipped after each repetition's `bytes_count` before the next.
    pub bytes_skip: u32,
    /// The key (region or indirect key) the bytes come from.
    pub lkey: u32,
}

/// The shape of an indirect key's address space.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LayoutKind {
    /// The SGEs' ranges, concatenated in order (`mlx5dv_wr_mr_list`).
    List(Vec<Sge>),
    /// A block of entries repeated (`mlx5dv_wr_mr_interleaved`).
    Interleaved {
        /// How many times the block is repeated.
        repeat: u32,
        /// The block: one piece of each entry per repetition, in order.
        entries: Vec<InterleavedEntry>,
    },
}

/// A layout and the rights it grants.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Layout {
    /// Rights the key grants: LOCAL_WRITE, REMOTE_WRITE, REMOTE_READ and
    /// REMOTE_ATOMIC at most.
    pub access: Access,
    /// The pieces that make up the address space.
    pub kind: LayoutKind,
}

impl Layout {
    /// A list layout: `sges` concatenated.
    pub fn list(access: Access, sges: &[Sge]) -> Layout {
        Layout { access, kind: LayoutKind::List(sges.to_vec()) }
    }

    /// An interleaved layout: the block `entries` repeated `repeat` times.
    pub fn interleaved(access: Access, repeat: u32, entries: &[InterleavedEntry]) -> Layout {
        Layout { access, kind: LayoutKind::Interleaved { repeat, entries: entries.to_vec() } }
    }

    /// Bytes of the zero-based address space.
    pub fn len(&self) -> u64 {
        match &self.kind {
            LayoutKind::List(s) => s.iter().map(|e| e.length as u64).sum(),
            LayoutKind::Interleaved { repeat, entries } => {
                entries.iter().map(|e| e.bytes_count as u64).sum::<u64>() * *repeat as u64
            }
        }
    }

    /// Whether the address space has no bytes.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Translation slots the layout needs (mlx5: one per list entry, one
    /// more for an interleaved block's header).
    pub fn slots(&self) -> usize {
        match &self.kind {
            LayoutKind::List(s) => s.len(),
            LayoutKind::Interleaved { entries, .. } => entries.len() + 1,
        }
    }

    /// The keys the layout names.
    pub fn keys(&self) -> Vec<u32> {
        match &self.kind {
            LayoutKind::List(s) => s.iter().map(|e| e.lkey).collect(),
            LayoutKind::Interleaved { entries, .. } => entries.iter().map(|e| e.lkey).collect(),
        }
    }

    /// Checks the layout against a key of `max_entries` slots: EINVAL for
    /// bad rights or shapes (and for 16-bit WQE fields that would not hold
    /// `bytes_count` / `bytes_skip`), ENOMEM for too many entries.
    pub fn validate(&self, max_entries: u32) -> Result<()> {
        self.check(max_entries, MAX_STRIDE_FIELD)
    }

    /// As [`Layout::validate`], for layouts set without a WQE (verbs-style
    /// re-registration): `bytes_count` and `bytes_skip` may take any 32-bit
    /// value, so a column of a matrix whose rows exceed 64 KiB works.
    pub fn validate_wide(&self, max_entries: u32) -> Result<()> {
        self.check(max_entries, u32::MAX)
    }

    fn check(&self, max_entries: u32, max_field: u32) -> Result<()> {
        let allowed = Access::LOCAL_WRITE | Access::REMOTE_WRITE | Access::REMOTE_READ | Access::REMOTE_ATOMIC;
        if !allowed.contains(self.access) {
            return Err(Error::inval("indirect key: access beyond LOCAL_WRITE|REMOTE_WRITE|REMOTE_READ|REMOTE_ATOMIC"));
        }
        match &self.kind {
            LayoutKind::List(s) if s.is_empty() => return Err(Error::inval("indirect key: empty list")),
            LayoutKind::Interleaved { repeat, entries } => {
                if entries.is_empty() || *repeat == 0 {
                    return Err(Error::inval("indirect key: interleaved layout needs entries and a repeat count"));
                }
                if entries.iter().any(|e| e.bytes_count > max_field || e.bytes_skip > max_field) {
                    return Err(Error::inval("indirect key: bytes_count and bytes_skip must fit in 16 bits"));
                }
                if entries.iter().all(|e| e.bytes_count == 0) {
                    return Err(Error::inval("indirect key: interleaved block of zero bytes"));
                }
                // The last repetition must not overflow an address.
                for e in entries {
                    let stride = e.bytes_count as u64 + e.bytes_skip as u64;
                    let reach = stride.checked_mul(*repeat as u64).and_then(|r| e.addr.checked_add(r));
                    if reach.is_none() {
                        return Err(Error::inval("indirect key: interleaved entry wraps the address space"));
                    }
                }
            }
            _ => {}
        }
        if self.slots() > max_entries as usize {
            return Err(Error::new(Errno::ENOMEM, "indirect key: more entries than the key was created for"));
        }
        Ok(())
    }

    /// Calls `f(lkey, addr, len)` for each run of `off..off+len` in order.
    pub fn for_each<E>(
        &self,
        off: u64,
        len: u64,
        mut f: impl FnMut(u32, u64, u64) -> std::result::Result<(), E>,
    ) -> std::result::Result<(), E> {
        let mut pos = off;
        let end = off + len;
        match &self.kind {
            LayoutKind::List(sges) => {
                let mut start = 0u64;
                for s in sges {
                    let e_end = start + s.length as u64;
                    if pos < e_end && pos < end {
                        let n = e_end.min(end) - pos;
                        f(s.lkey, s.addr + (pos - start), n)?;
                        pos += n;
                    }
                    start = e_end;
                    if pos >= end {
                        break;
                    }
                }
            }
            LayoutKind::Interleaved { entries, .. } => {
                let block: u64 = entries.iter().map(|e| e.bytes_count as u64).sum();
                while pos < end {
                    let (r, q) = (pos / block, pos % block);
                    let mut prefix = 0u64;
                    for e in entries {
                        let bc = e.bytes_count as u64;
                        if q < prefix + bc {
                            let n = (prefix + bc - q).min(end - pos);
                            let addr = e.addr + r * (bc + e.bytes_skip as u64) + (q - prefix);
                            f(e.lkey, addr, n)?;
                            pos += n;
                            break;
                        }
                        prefix += bc;
                    }
                }
            }
        }
        Ok(())
    }
}

/// The mutable part of an indirect key.
#[derive(Debug)]
pub struct IndirectKey {
    /// Translation slots (rounded up to a multiple of 4, as mlx5 does).
    pub max_entries: u32,
    layout: RwLock<Option<Arc<Layout>>>,
}

impl IndirectKey {
    pub(crate) fn new(max_entries: u32) -> IndirectKey {
        IndirectKey { max_entries: max_entries.div_ceil(4) * 4, layout: RwLock::new(None) }
    }

    /// The current layout; `None` while the key is free (invalid).
    pub fn layout(&self) -> Option<Arc<Layout>> {
        self.layout.read().unwrap().clone()
    }

    pub(crate) fn set(&self, layout: Option<Layout>) {
        *self.layout.write().unwrap() = layout.map(Arc::new);
    }

    /// Sets a layout only if the key is free (a UMR through the send queue).
    pub(crate) fn set_if_free(&self, layout: Layout) -> bool {
        let mut l = self.layout.write().unwrap();
        if l.is_some() {
            return false;
        }
        *l = Some(Arc::new(layout));
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn runs(l: &Layout, off: u64, len: u64) -> Vec<(u32, u64, u64)> {
        let mut v = Vec::new();
        l.for_each::<()>(off, len, |k, a, n| {
            v.push((k, a, n));
            Ok(())
        })
        .unwrap();
        v
    }

    #[test]
    fn list_runs() {
        let l = Layout::list(
            Access::LOCAL_WRITE,
            &[Sge { addr: 100, length: 10, lkey: 1 }, Sge { addr: 500, length: 5, lkey: 2 }],
        );
        assert_eq!(l.len(), 15);
        assert_eq!(runs(&l, 8, 5), vec![(1, 108, 2), (2, 500, 3)]);
        assert_eq!(runs(&l, 10, 5), vec![(2, 500, 5)]);
    }

    #[test]
    fn interleaved_is_a_matrix_column() {
        // A 4x4 matrix of u32, row stride 16: column 2 is 4 bytes at +8, skip 12.
        let e = InterleavedEntry { addr: 1000 + 8, bytes_count: 4, bytes_skip: 12, lkey: 7 };
        let l = Layout::interleaved(Access::REMOTE_READ, 4, &[e]);
        assert_eq!(l.len(), 16);
        assert_eq!(runs(&l, 0, 16), vec![(7, 1008, 4), (7, 1024, 4), (7, 1040, 4), (7, 1056, 4)]);
        assert_eq!(runs(&l, 6, 4), vec![(7, 1026, 2), (7, 1040, 2)]);
    }

    #[test]
    fn validation() {
        let e = InterleavedEntry { addr: 0, bytes_count: 4, bytes_skip: 0, lkey: 1 };
        assert_eq!(Layout::interleaved(Access::MW_BIND, 1, &[e]).validate(8).unwrap_err().errno, Errno::EINVAL);
        assert_eq!(Layout::interleaved(Access::empty(), 0, &[e]).validate(8).unwrap_err().errno, Errno::EINVAL);
        let big = InterleavedEntry { bytes_count: 0x1_0000, ..e };
        assert_eq!(Layout::interleaved(Access::empty(), 1, &[big]).validate(8).unwrap_err().errno, Errno::EINVAL);
        assert_eq!(Layout::interleaved(Access::empty(), 1, &[e; 4]).validate(4).unwrap_err().errno, Errno::ENOMEM);
        assert!(Layout::interleaved(Access::empty(), 1, &[e; 3]).validate(4).is_ok());
        assert_eq!(IndirectKey::new(5).max_entries, 8);
        // Verbs-style layouts take 32-bit strides: a column of 100 KiB rows.
        let wide = InterleavedEntry { bytes_count: 8, bytes_skip: 100 * 1024 - 8, ..e };
        assert_eq!(Layout::interleaved(Access::empty(), 4, &[wide]).validate(8).unwrap_err().errno, Errno::EINVAL);
        assert!(Layout::interleaved(Access::empty(), 4, &[wide]).validate_wide(8).is_ok());
        assert_eq!(runs(&Layout::interleaved(Access::empty(), 2, &[wide]), 0, 16), vec![(1, 0, 8), (1, 100 * 1024, 8)]);
    }
}
