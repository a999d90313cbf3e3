//! Spans: the one way bytes move in and out of registered memory.
//!
//! A [`Span`] is a checked, in-bounds piece of a message's memory, made of one
//! or more pieces (more than one when an indirect key gathers several
//! regions). Each piece copies by the path its region's backing needs:
//!
//! * pinned host memory: a fault-tolerant memory copy ([`super::safe`]):
//!   memory the application unmapped or protected after registration
//!   fails the access instead of crashing the process;
//! * on-demand-paging memory: a fault-tolerant copy through the kernel
//!   (`process_vm_readv`/`writev` on this process), which faults pages in and
//!   reports an unmapped page as an error instead of a crash;
//! * peer memory: the peer-memory client's own read and write functions.
//!
//! Holding a span keeps every region it touches registered: deregistration
//! waits for live spans, so the caller may free memory as soon as
//! `ibv_dereg_mr` returns.

use super::mr::{Backing, MemoryRegion};
use super::error::AccessError;
use smallvec::SmallVec;
use std::sync::atomic::Ordering;
use std::sync::Arc;

// Here rather than in `mr`: a region's spans are this module's (so `mr`
// does not name `span` back).
impl MemoryRegion {
    /// The span `iova..iova+len`, if it lies inside the region. Indirect
    /// keys are resolved by `Memory::resolve`, not here.
    pub fn span(self: &Arc<Self>, iova: u64, len: u64) -> Option<Span> {
        let off = iova.checked_sub(self.iova)?;
        if off.checked_add(len)? > self.length {
            return None;
        }
        let place = match &self.backing {
            Backing::Host { addr, .. } => Place::Host(addr + off as usize),
            Backing::Odp { addr, .. } => Place::Odp(addr.checked_add(usize::try_from(off).ok()?)?),
            Backing::Peer(_) => Place::Peer(off),
            Backing::Indirect(_) => return None,
        };
        Some(Span::one(Piece::new(self.clone(), place, usize::try_from(len).ok()?)))
    }
}

/// Where a piece's bytes are.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Place {
    /// Pinned memory of this process.
    Host(usize),
    /// Memory of this process that may be unmapped at any time (ODP).
    Odp(usize),
    /// Byte offset inside a peer-memory region.
    Peer(u64),
}

/// One piece of a span, inside one region: `len` contiguous bytes at
/// `place`, or, with `cells = Some((cell, stride))`, `len / cell` cells of
/// `cell` bytes every `stride` bytes from `place` (a run of an interleaved
/// key, described in O(1)).
#[derive(Debug)]
pub(crate) struct Piece {
    pub(crate) len: usize,
    pub(crate) place: Place,
    pub(crate) mr: Arc<MemoryRegion>,
    pub(crate) cells: Option<(usize, usize)>,
}

impl Place {
    fn offset(self, by: usize) -> Place {
        match self {
            Place::Host(a) => Place::Host(a + by),
            Place::Odp(a) => Place::Odp(a + by),
            Place::Peer(a) => Place::Peer(a + by as u64),
        }
    }
}

impl Piece {
    /// Counts the region as in use until the piece is dropped.
    pub(crate) fn new(mr: Arc<MemoryRegion>, place: Place, len: usize) -> Piece {
        mr.spans.fetch_add(1, Ordering::AcqRel);
        Piece { len, place, mr, cells: None }
    }

    /// Makes a contiguous piece strided: `count` cells of `cell` bytes every
    /// `stride` bytes. The piece must cover `(count - 1) * stride + cell`
    /// bytes (so every cell lies inside the checked range).
    pub(crate) fn into_cells(mut self, cell: usize, stride: usize, count: usize) -> Piece {
        debug_assert!(self.cells.is_none() && count >= 1 && self.len == (count - 1) * stride + cell);
        self.len = cell * count;
        self.cells = Some((cell, stride));
        self
    }

    /// Calls `f(place, at, n)` for each contiguous run of logical bytes
    /// `off..off+n` of the piece (`at`: offset into the caller's buffer).
    fn runs(
        &self,
        off: usize,
        n: usize,
        mut f: impl FnMut(Place, usize, usize) -> Result<(), AccessError>,
    ) -> Result<(), AccessError> {
        let Some((cell, stride)) = self.cells else { return f(self.place.offset(off), 0, n) };
        let (mut pos, end, mut at) = (off, off + n, 0);
        while pos < end {
            let (c, inner) = (pos / cell, pos % cell);
            let k = (cell - inner).min(end - pos);
            f(self.place.offset(c * stride + inner), at, k)?;
            pos += k;
            at += k;
        }
        Ok(())
    }

    fn write(&self, off: usize, data: &[u8]) -> Result<(), AccessError> {
        self.runs(off, data.len(), |place, at, n| self.write_at(place, &data[at..at + n]))
    }

    fn read(&self, off: usize, out: &mut [u8]) -> Result<(), AccessError> {
        self.runs(off, out.len(), |place, at, n| self.read_at(place, &mut out[at..at + n]))
    }

    /// Whether a copy through this piece may block: a peer client's copy;
    /// an on-demand-paging page the device has not translated (the kernel
    /// may have to fault it in, from a file or swap). Pinned memory and
    /// translated ODP pages are copied at once.
    fn may_block(&self) -> bool {
        match self.place {
            Place::Host(_) => false,
            Place::Peer(_) => true,
            Place::Odp(_) if self.len == 0 => false,
            Place::Odp(addr) => {
                let extent = match self.cells {
                    Some((cell, stride)) => (self.len / cell - 1) * stride + cell,
                    None => self.len,
                };
                !self.odp().translated(addr as u64, extent as u64)
            }
        }
    }

    /// Faults an on-demand-paging piece in (best effort: the access itself
    /// reports what could not be).
    fn fault_in(&self, write: bool) {
        if let (Place::Odp(addr), false) = (self.place, self.len == 0) {
            let extent = match self.cells {
                Some((cell, stride)) => (self.len / cell - 1) * stride + cell,
                None => self.len,
            };
            let _ = self.odp().fault_in(addr as u64, extent as u64, write);
        }
    }

    /// Copies `data` to `place`, a run that `runs` computed inside the piece.
    fn write_at(&self, place: Place, data: &[u8]) -> Result<(), AccessError> {
        match place {
            Place::Host(host) => {
                // SAFETY: `runs` keeps [host, host+data.len()) inside the
                // checked range of a registered, pinned region (`Span::each`
                // bounds the logical range; cells lie inside the range
                // `into_cells` was built over), and deregistration waits
                // while this piece (holding the region) exists. The
                // application may have unmapped or protected it since: the
                // copy is fault-tolerant. The source is a Rust slice; if the
                // application posts overlapping buffers the bytes are
                // garbage but memory stays in bounds.
                match unsafe { super::safe::copy(host as *mut u8, data.as_ptr(), data.len()) } {
                    0 => Ok(()),
                    _ => Err(AccessError::Fault),
                }
            }
            Place::Odp(addr) => self.odp().write(addr, data),
            Place::Peer(at) => self.peer().write(at, data),
        }
    }

    fn read_at(&self, place: Place, out: &mut [u8]) -> Result<(), AccessError> {
        match place {
            Place::Host(host) => {
                // SAFETY: as in `write_at`; the destination is an exclusive Rust slice.
                match unsafe { super::safe::copy(out.as_mut_ptr(), host as *const u8, out.len()) } {
                    0 => Ok(()),
                    _ => Err(AccessError::Fault),
                }
            }
            Place::Odp(addr) => self.odp().read(addr, out),
            Place::Peer(at) => self.peer().read(at, out),
        }
    }

    fn odp(&self) -> &super::odp::OdpRegion {
        match &self.mr.backing {
            Backing::Odp { odp, .. } => odp,
            _ => unreachable!("ODP piece of a non-ODP region"),
        }
    }

    fn peer(&self) -> &super::peer::PeerMapping {
        match &self.mr.backing {
            Backing::Peer(p) => p,
            _ => unreachable!("peer piece of a non-peer region"),
        }
    }
}

impl Drop for Piece {
    fn drop(&mut self) {
        self.mr.spans.fetch_sub(1, Ordering::AcqRel);
    }
}

/// A run of pinned host memory inside a registered region, which stays
/// registered while this lives: deregistration waits for it, so the bytes
/// remain the application's registered buffer until the value is dropped
/// (after the kernel has copied them out, for a send in place).
#[derive(Debug)]
pub struct HostBytes {
    addr: usize,
    piece: Piece,
}

impl HostBytes {
    /// The first byte's address in this process.
    pub fn addr(&self) -> usize {
        self.addr
    }

    pub fn len(&self) -> usize {
        self.piece.len
    }

    #[cfg(any(test, feature = "unstable"))]
    pub fn is_empty(&self) -> bool {
        self.piece.len == 0
    }

    /// The bytes, read in place.
    ///
    /// # Safety
    /// The application may write its buffer at any time (a verbs contract
    /// violation while a send is outstanding, but not one that may corrupt
    /// uroce): the caller only reads the slice once, to checksum it, and
    /// tolerates any bytes.
    pub(crate) unsafe fn as_slice(&self) -> &[u8] {
        // SAFETY: [addr, addr + len) lies inside a registered, pinned region
        // (checked by `Memory::resolve`), which its registrant keeps mapped
        // until deregistration, and deregistration waits while `piece`
        // holds the region.
        unsafe { std::slice::from_raw_parts(self.addr as *const u8, self.piece.len) }
    }
    /// Runs `f` on the bytes read in place, with a fault on them (the
    /// application unmapped or protected them since they were checked)
    /// recovered: see [`super::safe::guarded`] for what `f` may do.
    pub(crate) fn with_slice<R>(&self, f: impl FnOnce(&[u8]) -> R) -> Result<R, super::safe::Unguarded> {
        // SAFETY: as `as_slice`; a read of memory gone meanwhile is
        // recovered by the guard.
        super::safe::guarded(self.addr, self.piece.len, || f(unsafe { self.as_slice() }))
    }

    /// Reads the bytes through a bounce buffer, in chunks given to `f`,
    /// tolerating memory that the application unmapped or protected since
    /// the span was resolved: false then.
    pub(crate) fn read_chunks(&self, mut f: impl FnMut(&[u8])) -> bool {
        // Not zeroed: only the bytes copied into it are read (a 4 KiB memset
        // per packet cost as much as the copy).
        let mut chunk = std::mem::MaybeUninit::<[u8; 4096]>::uninit();
        let buf = chunk.as_mut_ptr().cast::<u8>();
        let mut off = 0;
        while off < self.piece.len {
            let n = 4096.min(self.piece.len - off);
            // SAFETY: `chunk` is ours; the source lies inside a registered
            // region (see `as_slice`) and `safe::copy` tolerates it being
            // gone.
            if unsafe { super::safe::copy(buf, (self.addr + off) as *const u8, n) } != 0 {
                return false;
            }
            // SAFETY: the copy initialised the first `n` bytes.
            f(unsafe { std::slice::from_raw_parts(buf, n) });
            off += n;
        }
        true
    }
}

/// A checked, in-bounds piece of registered memory (see the module docs).
#[derive(Debug, Default)]
pub struct Span {
    len: usize,
    pieces: SmallVec<[Piece; 1]>,
}

impl Span {
    pub(crate) fn empty() -> Span {
        Span::default()
    }

    pub(crate) fn one(piece: Piece) -> Span {
        let mut pieces = SmallVec::new();
        let len = piece.len;
        pieces.push(piece);
        Span { len, pieces }
    }

    /// The span's only piece, if it has exactly one contiguous piece.
    pub(crate) fn into_single(mut self) -> Result<Piece, Span> {
        if self.pieces.len() == 1 && self.pieces[0].cells.is_none() {
            Ok(self.pieces.pop().unwrap())
        } else {
            Err(self)
        }
    }

    /// The span as one run of pinned host memory, if that is what it is:
    /// bytes the device may hand to the kernel to send straight from the
    /// application's buffer. ODP and peer memory, and spans of several pieces
    /// or cells, come back unchanged (they are copied).
    ///
    /// Every page of the run is probed first (one fault-tolerant read per
    /// page): memory the application unmapped or made inaccessible comes
    /// back as a span, whose copy then reports the fault, instead of being
    /// handed to the ICRC and the kernel. (An unmap racing with the probe is
    /// not covered: see docs/reliability.md.)
    pub(crate) fn into_host_bytes(self) -> Result<HostBytes, Span> {
        match self.into_single() {
            Ok(piece) => match piece.place {
                Place::Host(addr) if super::safe::readable(addr, piece.len) => Ok(HostBytes { addr, piece }),
                _ => Err(Span::one(piece)),
            },
            Err(span) => Err(span),
        }
    }

    /// Appends a piece after this span's bytes.
    pub(crate) fn push(&mut self, piece: Piece) {
        self.len += piece.len;
        self.pieces.push(piece);
    }

    /// Appends another span's pieces after this span's bytes.
    pub(crate) fn append(&mut self, other: Span) {
        self.len += other.len;
        self.pieces.extend(other.pieces);
    }

    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether a copy through this span may block: some of its bytes are
    /// on-demand-paging memory the device has not translated (the kernel
    /// may have to fault pages in, from a file or swap) or peer memory (the
    /// client's copy).
    pub fn may_block(&self) -> bool {
        self.pieces.iter().any(Piece::may_block)
    }

    /// Faults the span's on-demand-paging pages in (writable if `write`),
    /// ahead of the copies that will need them; other memory is left as it
    /// is. A copy worker does this for the rest of a message whose first
    /// packet found its pages missing (`proto::copy`).
    pub fn fault_in(&self, write: bool) {
        for p in &self.pieces {
            p.fault_in(write);
        }
    }

    #[cfg(feature = "unstable")]
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The application's address of the span's byte `offset`, for memory
    /// of this process (pinned or on-demand paged; none for peer memory or
    /// past the end). For diagnostics and simulations that map an access
    /// back to the buffer it touches.
    #[cfg(feature = "unstable")]
    pub fn host_address(&self, offset: usize) -> Option<usize> {
        let mut at = 0;
        for p in &self.pieces {
            if offset < at + p.len {
                let off = offset - at;
                let off = match p.cells {
                    Some((cell, stride)) => off / cell * stride + off % cell,
                    None => off,
                };
                return match p.place.offset(off) {
                    // The application's address, also where uroce reaches
                    // the pages through its own mapping (`own`).
                    Place::Host(a) => Some(match &p.mr.backing {
                        super::Backing::Host { pages: Some(o), .. } => o.app_address(a),
                        _ => a,
                    }),
                    Place::Odp(a) => Some(a),
                    Place::Peer(_) => None,
                };
            }
            at += p.len;
        }
        None
    }

    /// Visits the pieces overlapping `offset..offset+len` as
    /// (piece, offset in piece, offset in the request, length).
    fn each(
        &self,
        offset: usize,
        len: usize,
        mut f: impl FnMut(&Piece, usize, usize, usize) -> Result<(), AccessError>,
    ) -> Result<(), AccessError> {
        assert!(offset.checked_add(len).is_some_and(|e| e <= self.len), "span overrun");
        let (mut at, mut done) = (0usize, 0usize);
        for p in &self.pieces {
            if done == len {
                break;
            }
            let pos = offset + done;
            if pos < at + p.len {
                let in_piece = pos - at;
                let n = (p.len - in_piece).min(len - done);
                f(p, in_piece, done, n)?;
                done += n;
            }
            at += p.len;
        }
        Ok(())
    }

    /// Copies `data` to `offset` within the span. Fails only for memory that
    /// went away underneath (an unmapped ODP page, invalidated peer memory).
    ///
    /// # Panics
    /// If the copy would leave the span (a bug in the caller, never a
    /// consequence of packet contents, which `Memory::resolve` checked).
    pub fn write(&self, offset: usize, data: &[u8]) -> Result<(), AccessError> {
        if let Some(p) = self.contiguous(offset, data.len()) {
            return p.write_at(p.place.offset(offset), data);
        }
        self.each(offset, data.len(), |p, off, at, n| p.write(off, &data[at..at + n]))
    }

    /// Copies from `offset` within the span into `out`.
    pub fn read(&self, offset: usize, out: &mut [u8]) -> Result<(), AccessError> {
        if let Some(p) = self.contiguous(offset, out.len()) {
            return p.read_at(p.place.offset(offset), out);
        }
        self.each(offset, out.len(), |p, off, at, n| p.read(off, &mut out[at..at + n]))
    }

    /// The common case, one contiguous piece: it, once `offset..offset+len`
    /// is checked to lie inside it (as `each` checks).
    #[inline]
    fn contiguous(&self, offset: usize, len: usize) -> Option<&Piece> {
        match self.pieces.as_slice() {
            [p] if p.cells.is_none() => {
                assert!(offset.checked_add(len).is_some_and(|e| e <= self.len), "span overrun");
                Some(p)
            }
            _ => None,
        }
    }

    /// Atomic compare-and-swap of the 8 bytes at the span's start (host
    /// order); returns the original value.
    pub fn compare_swap(&self, compare: u64, swap: u64) -> Result<u64, AccessError> {
        self.atomic(AtomicOp::CompareSwap(compare, swap))
    }

    /// Atomic fetch-and-add; returns the original value.
    pub fn fetch_add(&self, add: u64) -> Result<u64, AccessError> {
        self.atomic(AtomicOp::FetchAdd(add))
    }

    /// Atomic 8-byte store (RDMA ATOMIC WRITE), ordered after every earlier
    /// access as rxe's `smp_store_release`.
    pub fn atomic_write(&self, value: u64) -> Result<(), AccessError> {
        self.atomic(AtomicOp::Store(value)).map(|_| ())
    }

    /// Runs an atomic on the 8 bytes at the span's start: with the
    /// fault-tolerant atomics on host memory, as a read-modify-write through
    /// a peer client.
    fn atomic(&self, op: AtomicOp) -> Result<u64, AccessError> {
        let p = match self.pieces.first() {
            Some(p) if p.len >= 8 && p.cells.is_none_or(|(c, _)| c >= 8) => p,
            // The 8 bytes straddle two regions of an indirect key.
            _ => return Err(AccessError::Range),
        };
        let host = match p.place {
            Place::Host(h) => h,
            Place::Odp(addr) => {
                p.odp().prepare_atomic(addr)?;
                addr
            }
            Place::Peer(at) => return p.peer().read_modify_write(at, |v| op.next(v)),
        };
        if host % 8 != 0 {
            return Err(AccessError::Range);
        }
        let w = host as *mut u64;
        // SAFETY: 8 in-bounds, 8-byte-aligned bytes of registered memory,
        // kept registered while this span holds its region (pinned), or that
        // the ODP path has just populated writable. The application may have
        // unmapped or protected them since (or, for ODP, be unmapping them
        // now): the atomics are fault-tolerant and report it. Concurrent CPU
        // and device accesses are all atomic instructions.
        let r = unsafe {
            match op {
                AtomicOp::CompareSwap(c, s) => super::safe::compare_swap(w, c, s),
                AtomicOp::FetchAdd(a) => super::safe::fetch_add(w, a),
                AtomicOp::Store(v) => super::safe::store(w, v).map(|()| v),
            }
        };
        r.ok_or(AccessError::Fault)
    }
}

/// The 8-byte atomics of RDMA.
#[derive(Debug, Clone, Copy)]
enum AtomicOp {
    CompareSwap(u64, u64),
    FetchAdd(u64),
    Store(u64),
}

impl AtomicOp {
    /// The value the operation leaves after `v`.
    fn next(self, v: u64) -> u64 {
        match self {
            AtomicOp::CompareSwap(c, s) => {
                if v == c {
                    s
                } else {
                    v
                }
            }
            AtomicOp::FetchAdd(a) => v.wrapping_add(a),
            AtomicOp::Store(x) => x,
        }
    }
}
