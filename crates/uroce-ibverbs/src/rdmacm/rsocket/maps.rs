//! What a stream socket keeps of its iomapped buffers (`riomap`): the
//! entries it published in the peer's iomap area, those still to write
//! there, and its local-only mappings. The calls working on them are
//! `iomap`'s; the socket (`stream`) holds them.

use crate::ffi::*;
use std::collections::VecDeque;

/// One mapping: the offset the application names it by, and its MR.
#[derive(Clone, Copy)]
pub struct Map {
    pub offset: u64,
    pub mr: *mut ibv_mr,
}

#[derive(Default)]
pub struct Maps {
    /// The peer's iomap entries: what this socket published (or queued) there.
    pub remote: Vec<Option<Map>>,
    /// Entries of `remote` still to be written to the peer.
    pub pending: VecDeque<usize>,
    /// Mappings for local use only (no PROT_WRITE).
    pub local: Vec<Map>,
}

impl Maps {
    pub fn release_all(&mut self) {
        for m in self.remote.iter_mut().filter_map(Option::take).chain(self.local.drain(..)) {
            // SAFETY: an MR riomap registered, deregistered once.
            unsafe { crate::objects::ibv_dereg_mr(m.mr) };
        }
        self.pending.clear();
    }
}
