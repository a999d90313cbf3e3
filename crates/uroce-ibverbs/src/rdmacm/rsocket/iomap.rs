//! Iomapped buffers (`riomap`, `riounmap`, `riowrite`) of a stream socket,
//! rdma-core 44's way: a buffer mapped for writing is registered and its
//! `struct rs_iomap` (offset, address, rkey, length) written into a free
//! entry of the peer's iomap area (`OP_IOMAP_SGL | index`) before the
//! socket's next send; `riowrite` looks the offset up in the entries the
//! peer wrote into this socket's own iomap area and RDMA WRITEs (no
//! immediate) straight into the peer's buffer.

use super::maps::Map;
use super::stream::{next_transfer, Stream};
use super::wire::{self, RsSge};
use crate::ffi::*;
use std::ffi::{c_int, c_void};

fn mr_is(mr: *mut ibv_mr, buf: *mut c_void, len: usize) -> bool {
    // SAFETY: a live MR of ours.
    unsafe { (*mr).addr == buf && (*mr).length == len }
}

impl Stream {
    /// `riomap`: the offset the mapping answers to.
    pub fn iomap(&mut self, buf: *mut c_void, len: usize, prot: c_int, offset: i64) -> Result<i64, c_int> {
        // SAFETY: our id.
        let pd = unsafe { (*self.id).pd };
        if pd.is_null() || prot & !(libc::PROT_WRITE | libc::PROT_NONE) != 0 || buf.is_null() || len == 0 {
            return Err(libc::EINVAL);
        }
        let write = prot & libc::PROT_WRITE != 0;
        let slot =
            if write { Some(self.iomap.remote.iter().position(Option::is_none).ok_or(libc::ENOMEM)?) } else { None };
        let mut access = ibv_access_flags_IBV_ACCESS_LOCAL_WRITE;
        if write {
            access |= ibv_access_flags_IBV_ACCESS_REMOTE_WRITE;
        }
        // SAFETY: the caller's buffer of `len` bytes, registered until riounmap.
        let mr = unsafe { crate::objects::ibv_reg_mr(pd, buf, len, access as c_int) };
        if mr.is_null() {
            return Err(crate::errno::last());
        }
        let offset = if offset == -1 { buf as i64 } else { offset };
        let m = Map { offset: offset as u64, mr };
        match slot {
            Some(i) => {
                self.iomap.remote[i] = Some(m);
                self.iomap.pending.push_back(i);
            }
            None => self.iomap.local.push(m),
        }
        Ok(offset)
    }

    /// `riounmap`: EINVAL when no mapping has exactly this buffer.
    pub fn iounmap(&mut self, buf: *mut c_void, len: usize) -> Result<(), c_int> {
        let mr = if let Some(i) = self.iomap.remote.iter().position(|m| m.is_some_and(|m| mr_is(m.mr, buf, len))) {
            self.iomap.pending.retain(|&p| p != i);
            self.iomap.remote[i].take().map(|m| m.mr)
        } else if let Some(i) = self.iomap.local.iter().position(|m| mr_is(m.mr, buf, len)) {
            Some(self.iomap.local.remove(i).mr)
        } else {
            None
        };
        let mr = mr.ok_or(libc::EINVAL)?;
        // SAFETY: the mapping's MR, deregistered once.
        unsafe { crate::objects::ibv_dereg_mr(mr) };
        Ok(())
    }

    /// Writes the first queued mapping into the peer's iomap (the caller
    /// checked `can_send`).
    pub fn send_one_iomap(&mut self) -> Result<(), c_int> {
        let Some(i) = self.iomap.pending.pop_front() else { return Ok(()) };
        let Some(m) = self.iomap.remote[i] else { return Ok(()) };
        // SAFETY: a live MR of ours.
        let (addr, key, len) = unsafe { ((*m.mr).addr as u64, (*m.mr).rkey, (*m.mr).length as u32) };
        let (mut off, mut sge) = (m.offset, RsSge { addr, key, length: len });
        if self.swap_sgl {
            off = off.swap_bytes();
            sge = sge.swapped();
        }
        let mut b = [0u8; wire::IOMAP_LEN];
        b[..8].copy_from_slice(&off.to_ne_bytes());
        b[8..16].copy_from_slice(&sge.addr.to_ne_bytes());
        b[16..20].copy_from_slice(&sge.key.to_ne_bytes());
        b[20..24].copy_from_slice(&sge.length.to_ne_bytes());
        let mut at = 0usize;
        let (mut sgl, n) = self.ring_copy(
            &mut |dst, k| {
                // SAFETY: k bytes of the ring; b holds the rest.
                unsafe { std::ptr::copy_nonoverlapping(b.as_ptr().add(at), dst, k) };
                at += k;
            },
            wire::IOMAP_LEN as u32,
        );
        self.sseq_no = self.sseq_no.wrapping_add(1);
        self.sqe_avail -= 1;
        self.sbuf_bytes_avail -= wire::IOMAP_LEN as u32;
        let flags = if wire::IOMAP_LEN as u32 <= self.sq_inline { ibv_send_flags_IBV_SEND_INLINE } else { 0 };
        let raddr = self.remote_iomap.addr + (i * wire::IOMAP_LEN) as u64;
        let rkey = self.remote_iomap.key;
        self.post(&mut sgl[..n], wire::msg(wire::OP_IOMAP_SGL, i as u32), flags, raddr, rkey, true)
    }

    pub fn iomaps_pending(&self) -> bool {
        !self.iomap.pending.is_empty()
    }

    /// `rs_find_iomap`: the peer's mapping (offset, buffer) holding `offset`.
    pub fn find_iomap(&self, offset: u64) -> Option<(u64, RsSge)> {
        let base = self.target(0) as *const u8;
        // SAFETY: the iomap area after the target SGL in our target buffer.
        let area = unsafe { base.add(std::mem::size_of::<RsSge>() * wire::SGL_SIZE as usize) };
        (0..self.target_iomap_size as usize).find_map(|i| {
            // SAFETY: entry i of the area; the peer writes it (volatile).
            let e = unsafe { std::ptr::read_volatile(area.add(i * wire::IOMAP_LEN) as *const [u8; wire::IOMAP_LEN]) };
            let o = u64::from_ne_bytes(e[..8].try_into().ok()?);
            let s = RsSge {
                addr: u64::from_ne_bytes(e[8..16].try_into().ok()?),
                key: u32::from_ne_bytes(e[16..20].try_into().ok()?),
                length: u32::from_ne_bytes(e[20..24].try_into().ok()?),
            };
            (s.length > 0 && offset >= o && offset < o + s.length as u64).then_some((o, s))
        })
    }

    /// One RDMA WRITE of `riowrite` into the peer's mapping `iom` at
    /// `offset` (the caller checked `can_send`): the bytes written.
    pub fn write_direct(
        &mut self,
        src: &mut dyn FnMut(*mut u8, usize),
        left: usize,
        offset: u64,
        iom: (u64, RsSge),
        olen: &mut u32,
    ) -> Result<u32, c_int> {
        let mut xfer = next_transfer(olen, left);
        let room = (iom.0 + iom.1.length as u64 - offset).min(u32::MAX as u64) as u32;
        xfer = xfer.min(self.sbuf_bytes_avail).min(room);
        let (mut sgl, n) = self.ring_copy(src, xfer);
        let flags = if xfer <= self.sq_inline { ibv_send_flags_IBV_SEND_INLINE } else { 0 };
        self.sqe_avail -= 1;
        self.sbuf_bytes_avail -= xfer;
        let addr = iom.1.addr + (offset - iom.0);
        self.post(&mut sgl[..n], wire::msg(wire::OP_WRITE, xfer), flags, addr, iom.1.key, false)?;
        Ok(xfer)
    }
}
