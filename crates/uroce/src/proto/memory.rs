//! The boundary between the transport and registered memory: the
//! [`MemoryAccess`] trait is the only way the engine (and a completion
//! queue scattering an inline receive) reaches memory. Through it the
//! transport resolves and checks keys (local and remote), copies into and
//! out of the resolved spans, runs the 8-byte atomics, binds and
//! invalidates memory windows, runs UMRs, and pins a payload to send in
//! place. How the bytes move — pinned host memory through fault-tolerant
//! copies, on-demand paging, a peer-memory client, the pieces of an
//! indirect key — is the implementation's business: the device's is
//! [`crate::mem::Memory`] (implemented here), and a simulation may wrap it
//! to inject page faults, revoked keys and slow copies
//! (`tests/simnet/memory.rs`).
//!
//! A payload sent in place leaves the engine as a [`PayloadHold`]: raw
//! bytes (an address and a length) and a token that keeps their memory
//! registered until the packet has been handed to the kernel. The I/O
//! layer sees only that, never a memory type.

use crate::ib::Sge;
use crate::mem::safe::Unguarded;
pub use crate::mem::{AccessError, BindError, BindRequest, Layout, Memory, Span, Want};
use std::fmt::Debug;

/// An 8-byte atomic on the first bytes of a span (host byte order).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Atomic {
    /// Compare-and-swap; the result is the original value.
    CompareSwap { compare: u64, swap: u64 },
    /// Fetch-and-add; the result is the original value.
    FetchAdd(u64),
    /// An atomic store (RDMA ATOMIC WRITE); the result is the stored value.
    Store(u64),
}

/// How the transport reaches memory. Every check a key needs is made by
/// `resolve`/`resolve_remote` before any byte moves; the copies report
/// only memory that went away since ([`AccessError::Fault`]), or a key an
/// implementation revoked between the check and the copy.
pub trait MemoryAccess: Send + Sync + Debug {
    /// Checks a local access (an lkey) of `len` bytes at `iova` for
    /// protection domain `pd`. A zero-length access needs no valid key.
    fn resolve(&self, key: u32, pd: u32, iova: u64, len: u64, want: Want) -> Result<Span, AccessError>;

    /// Checks a remote access (an rkey from the wire: a region or a window)
    /// for QP `qpn` of protection domain `pd`.
    fn resolve_remote(&self, key: u32, pd: u32, qpn: u32, iova: u64, len: u64, want: Want)
        -> Result<Span, AccessError>;

    /// Copies `data` to `offset` within `span`.
    fn write(&self, span: &Span, offset: usize, data: &[u8]) -> Result<(), AccessError>;

    /// Copies from `offset` within `span` into `out`.
    fn read(&self, span: &Span, offset: usize, out: &mut [u8]) -> Result<(), AccessError>;

    /// Whether a copy through `span` may block: wait for the kernel to
    /// fault pages in (on-demand paging) or for a peer-memory client. An
    /// engine that defers such copies runs them outside its locks
    /// (`proto::copy`).
    fn may_block(&self, span: &Span) -> bool;

    /// Makes a later copy through `span` (a write if `write`) unlikely to
    /// block: faults its on-demand-paging pages in. May block itself: a copy
    /// worker calls it, with no lock held.
    fn fault_in(&self, span: &Span, write: bool);

    /// Checks a remote write of `data` at `iova` (as `resolve_remote` with
    /// [`Want::RemoteWrite`]) and copies it there (as `write`): true. One
    /// packet's WRITE in one call, which an implementation may answer
    /// without building a span. False, with nothing copied, when the copy
    /// may block (the caller resolves the span and copies it its way).
    fn write_remote(&self, key: u32, pd: u32, qpn: u32, iova: u64, data: &[u8]) -> Result<bool, AccessError> {
        let span = self.resolve_remote(key, pd, qpn, iova, data.len() as u64, Want::RemoteWrite)?;
        if self.may_block(&span) {
            return Ok(false);
        }
        self.write(&span, 0, data).map(|()| true)
    }

    /// Checks a local read of `out.len()` bytes at `iova` (as `resolve`
    /// with [`Want::LocalRead`]) and copies them into `out` (as `read`):
    /// true. False, with nothing read, when the copy may block.
    fn read_local(&self, key: u32, pd: u32, iova: u64, out: &mut [u8]) -> Result<bool, AccessError> {
        let span = self.resolve(key, pd, iova, out.len() as u64, Want::LocalRead)?;
        if self.may_block(&span) {
            return Ok(false);
        }
        self.read(&span, 0, out).map(|()| true)
    }

    /// Runs an atomic on the 8 bytes at the span's start.
    fn atomic(&self, span: &Span, op: Atomic) -> Result<u64, AccessError>;

    /// The span as a payload to send in place, if it is one run of pinned
    /// host memory that can be read now; else the span back, to be copied.
    fn pin_for_send(&self, span: Span) -> Result<PayloadHold, Span>;

    /// Binds a memory window for QP `qpn` of protection domain `qp_pd`
    /// (BIND_MW); returns the new key.
    fn bind_mw(&self, qp_pd: u32, qpn: u32, r: &BindRequest) -> Result<u32, BindError>;

    /// Sets an indirect key's layout (UMR work request).
    fn umr(&self, key: u32, pd: u32, layout: Layout) -> Result<(), BindError>;

    /// LOCAL_INV, or SEND_WITH_INV arriving on QP `qpn`.
    fn invalidate(&self, key: u32, pd: u32, qpn: u32) -> Result<(), BindError>;
}

/// Bytes left in registered memory for a packet sent in place, with what
/// keeps that memory registered until this value is dropped (after the
/// kernel has copied the bytes out).
#[derive(Debug)]
pub struct PayloadHold {
    addr: usize,
    len: usize,
    token: Box<dyn PayloadSource>,
}

/// What a [`PayloadHold`] needs from the memory that owns its bytes: it
/// keeps them registered while it lives, and reads them without crashing
/// if the application unmapped or protected them since they were checked.
pub trait PayloadSource: Send + Sync + Debug {
    /// Feeds the bytes to `f`, with `in_place` read in place under a fault
    /// guard where one can be set up (then `f` must own nothing that needs
    /// dropping, hold no lock and not panic: see `mem::safe::guarded`),
    /// else through a bounce buffer, in chunks. False if they could not be
    /// read (`f` may have seen some of them).
    fn read_tolerant(&self, in_place: bool, f: &mut dyn FnMut(&[u8])) -> bool;
}

impl PayloadHold {
    /// `len` bytes at `addr`, kept readable by `token` (see
    /// [`PayloadSource`]).
    ///
    /// # Safety
    /// `addr..addr + len` must stay mapped memory of this process, in a
    /// registration that cannot end, while `token` lives (the application
    /// may still unmap it, against the verbs contract: readers of
    /// `PayloadHold::as_slice` tolerate what the kernel then does).
    pub unsafe fn new(addr: usize, len: usize, token: Box<dyn PayloadSource>) -> PayloadHold {
        PayloadHold { addr, len, token }
    }

    pub fn addr(&self) -> usize {
        self.addr
    }

    pub fn len(&self) -> usize {
        self.len
    }

    #[cfg(any(test, feature = "unstable"))]
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The bytes, read in place: only to hand to the kernel (which copies
    /// them, and fails the send if they are gone) or to checksum them.
    ///
    /// # Safety
    /// The application may write its buffer at any time (a verbs contract
    /// violation while a send is outstanding, but not one that may corrupt
    /// uroce): the caller tolerates any bytes, and does not dereference the
    /// slice itself where the memory may be gone (see `read_tolerant`).
    pub(crate) unsafe fn as_slice(&self) -> &[u8] {
        // SAFETY: the constructor's contract: the range stays in a live
        // registration while `token` does.
        unsafe { std::slice::from_raw_parts(self.addr as *const u8, self.len) }
    }

    /// Feeds the bytes to `f`, tolerating memory gone since the check
    /// (see [`PayloadSource::read_tolerant`]).
    pub fn read_tolerant(&self, in_place: bool, f: &mut dyn FnMut(&[u8])) -> bool {
        self.token.read_tolerant(in_place, f)
    }
}

impl PayloadSource for crate::mem::HostBytes {
    fn read_tolerant(&self, in_place: bool, f: &mut dyn FnMut(&[u8])) -> bool {
        if !in_place {
            return self.read_chunks(f);
        }
        match self.with_slice(|p| f(p)) {
            Ok(()) => true,
            Err(Unguarded::Fault) => false,
            Err(Unguarded::Unavailable) => self.read_chunks(f),
        }
    }
}

/// The device's memory: the checks and copy paths of [`crate::mem`].
impl MemoryAccess for Memory {
    #[inline]
    fn resolve(&self, key: u32, pd: u32, iova: u64, len: u64, want: Want) -> Result<Span, AccessError> {
        Memory::resolve(self, key, pd, iova, len, want)
    }

    #[inline]
    fn resolve_remote(
        &self,
        key: u32,
        pd: u32,
        qpn: u32,
        iova: u64,
        len: u64,
        want: Want,
    ) -> Result<Span, AccessError> {
        Memory::resolve_remote(self, key, pd, qpn, iova, len, want)
    }

    #[inline]
    fn write(&self, span: &Span, offset: usize, data: &[u8]) -> Result<(), AccessError> {
        span.write(offset, data)
    }

    #[inline]
    fn read(&self, span: &Span, offset: usize, out: &mut [u8]) -> Result<(), AccessError> {
        span.read(offset, out)
    }

    #[inline]
    fn may_block(&self, span: &Span) -> bool {
        span.may_block()
    }

    fn fault_in(&self, span: &Span, write: bool) {
        span.fault_in(write)
    }

    #[inline]
    fn write_remote(&self, key: u32, pd: u32, qpn: u32, iova: u64, data: &[u8]) -> Result<bool, AccessError> {
        Memory::write_remote(self, key, pd, qpn, iova, data)
    }

    #[inline]
    fn read_local(&self, key: u32, pd: u32, iova: u64, out: &mut [u8]) -> Result<bool, AccessError> {
        Memory::read_local(self, key, pd, iova, out)
    }

    fn atomic(&self, span: &Span, op: Atomic) -> Result<u64, AccessError> {
        match op {
            Atomic::CompareSwap { compare, swap } => span.compare_swap(compare, swap),
            Atomic::FetchAdd(add) => span.fetch_add(add),
            Atomic::Store(v) => span.atomic_write(v).map(|()| v),
        }
    }

    fn pin_for_send(&self, span: Span) -> Result<PayloadHold, Span> {
        let bytes = span.into_host_bytes()?;
        let (addr, len) = (bytes.addr(), bytes.len());
        // SAFETY: `HostBytes` is a checked run of pinned host memory whose
        // region stays registered (deregistration waits) while it lives.
        Ok(unsafe { PayloadHold::new(addr, len, Box::new(bytes)) })
    }

    fn bind_mw(&self, qp_pd: u32, qpn: u32, r: &BindRequest) -> Result<u32, BindError> {
        Memory::bind_mw(self, qp_pd, qpn, r)
    }

    fn umr(&self, key: u32, pd: u32, layout: Layout) -> Result<(), BindError> {
        Memory::umr(self, key, pd, layout)
    }

    fn invalidate(&self, key: u32, pd: u32, qpn: u32) -> Result<(), BindError> {
        Memory::invalidate(self, key, pd, qpn)
    }
}

/// Scatter/gather over a list of local SGEs: the `i`-th byte of the message
/// lives in the SGE that covers it. `f` gets each piece as (span, offset
/// within the message, length); it copies through `mem` too.
pub fn for_each_sge_piece(
    mem: &dyn MemoryAccess,
    pd: u32,
    sges: &[Sge],
    msg_offset: u64,
    len: u64,
    want: Want,
    mut f: impl FnMut(&Span, u64, usize) -> Result<(), AccessError>,
) -> Result<(), AccessError> {
    let mut at = 0u64;
    for span in sge_spans(mem, pd, sges, msg_offset, len, want)? {
        let n = span.len();
        f(&span, at, n)?;
        at += n as u64;
    }
    Ok(())
}

/// The spans of `len` bytes of a message from byte `msg_offset` over a
/// list of local SGEs, each checked for `want` (see
/// [`for_each_sge_piece`]), to be copied in order.
pub fn sge_spans(
    mem: &dyn MemoryAccess,
    pd: u32,
    sges: &[Sge],
    msg_offset: u64,
    len: u64,
    want: Want,
) -> Result<smallvec::SmallVec<[Span; 2]>, AccessError> {
    let mut spans = smallvec::SmallVec::new();
    let mut skip = msg_offset;
    let mut left = len;
    for sge in sges {
        if left == 0 {
            break;
        }
        let sl = sge.length as u64;
        if skip >= sl {
            skip -= sl;
            continue;
        }
        let take = (sl - skip).min(left);
        spans.push(mem.resolve(sge.lkey, pd, sge.addr + skip, take, want)?);
        left -= take;
        skip = 0;
    }
    if left != 0 {
        return Err(AccessError::Range);
    }
    Ok(spans)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ib::Access;

    /// The one-call copies (`write_remote`, `read_local`) answer every
    /// access exactly as a resolved span does: the same checks, the same
    /// error, and nothing copied when a check fails.
    #[test]
    fn one_call_copies_check_as_spans_do() {
        let mem = Memory::default();
        let mut buf = vec![0u8; 64];
        let addr = buf.as_mut_ptr() as usize;
        let rw = Access::LOCAL_WRITE | Access::REMOTE_WRITE;
        // SAFETY: `buf` outlives the regions (the memory is dropped first).
        let (k, ro) = unsafe {
            (
                mem.register_host(1, addr, 64, 0x1000, rw, None).unwrap().key,
                mem.register_host(1, addr, 64, 0x1000, Access::LOCAL_WRITE, None).unwrap().key,
            )
        };
        let m: &dyn MemoryAccess = &mem;
        let data = [0xA5u8; 16];
        // (key, pd, iova, len)
        let cases = [
            (k, 1, 0x1000, 16, None),
            (k, 1, 0x1000 + 48, 16, None),
            (k ^ 1, 1, 0x1000, 16, Some(AccessError::BadKey)),
            (0, 1, 0x1000, 16, Some(AccessError::BadKey)),
            (k, 2, 0x1000, 16, Some(AccessError::WrongPd)),
            (ro, 1, 0x1000, 16, Some(AccessError::Permission)),
            (k, 1, 0x1000 + 49, 16, Some(AccessError::Range)),
            (k, 1, 0xFFF, 16, Some(AccessError::Range)),
            (k, 1, u64::MAX, 16, Some(AccessError::Range)),
        ];
        for (key, pd, iova, len, err) in cases {
            buf.iter_mut().for_each(|b| *b = 0);
            let spans = m.resolve_remote(key, pd, 7, iova, len, Want::RemoteWrite).and_then(|s| m.write(&s, 0, &data));
            let one =
                m.write_remote(key, pd, 7, iova, &data).map(|copied| assert!(copied, "host memory does not block"));
            assert_eq!(one, spans, "WRITE key {key:#x} pd {pd} iova {iova:#x}");
            assert_eq!(one.err(), err);
            let written = buf.iter().filter(|&&b| b == 0xA5).count();
            assert_eq!(written, if err.is_none() { 16 } else { 0 }, "iova {iova:#x}");
            let mut out = [0u8; 16];
            let spans = m.resolve(key, pd, iova, len, Want::LocalRead).and_then(|s| m.read(&s, 0, &mut out));
            let one = m.read_local(key, pd, iova, &mut out).map(|copied| assert!(copied, "host memory does not block"));
            assert_eq!(one, spans, "READ key {key:#x} pd {pd} iova {iova:#x}");
            if err.is_none() {
                assert_eq!(out, data);
            }
        }
        // An empty access needs no valid key (as `resolve`).
        assert!(matches!(m.write_remote(0, 1, 7, 0, &[]), Ok(true)));
        assert!(matches!(m.read_local(0, 1, 0, &mut []), Ok(true)));
        // A deregistered key copies nothing.
        mem.deregister(k).unwrap();
        assert!(matches!(m.write_remote(k, 1, 7, 0x1000, &data), Err(AccessError::BadKey)));
    }

    #[test]
    fn sge_pieces_cover_the_message() {
        let mem = Memory::default();
        let mut a = vec![0u8; 10];
        let mut b = vec![0u8; 10];
        let reg = |buf: &mut [u8]| {
            let addr = buf.as_mut_ptr() as usize;
            // SAFETY: the buffers outlive the regions in this test.
            unsafe { mem.register_host(1, addr, buf.len() as u64, addr as u64, Access::LOCAL_WRITE, None) }.unwrap().key
        };
        let (ka, kb) = (reg(&mut a), reg(&mut b));
        let sges = [
            Sge { addr: a.as_ptr() as u64, length: 10, lkey: ka },
            Sge { addr: b.as_ptr() as u64, length: 10, lkey: kb },
        ];
        let data: Vec<u8> = (0..15).collect();
        let m: &dyn MemoryAccess = &mem;
        for_each_sge_piece(m, 1, &sges, 3, 15, Want::LocalWrite, |span, off, n| {
            m.write(span, 0, &data[off as usize..off as usize + n])
        })
        .unwrap();
        assert_eq!(&a[3..], &data[..7]);
        assert_eq!(&b[..8], &data[7..]);
        assert_eq!(b[8], 0);
        let e = for_each_sge_piece(m, 1, &sges, 10, 11, Want::LocalWrite, |_, _, _| Ok(()));
        assert_eq!(e, Err(AccessError::Range));
    }
}
