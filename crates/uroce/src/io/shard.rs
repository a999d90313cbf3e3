//! One shard of a device's queue pairs: an engine holding the QPs whose
//! number is `i` modulo the shard count, the lock that orders its packets
//! on the wire, and its earliest timer readable without a lock. Shards
//! share nothing mutable: QPs of different shards post, receive and
//! complete in parallel (see "Locks" in docs/architecture.md).

use crate::lock_order::{Ordered, Rank};
use crate::proto::{Engine, Transmit};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Shards of a device. A power of two (the shard of QPN q is q % SHARDS);
/// more shards than cores so that two busy QPs rarely share one.
pub(super) const SHARDS: usize = 64;

/// The shard of a QP number.
pub(super) fn shard_of(qpn: u32) -> usize {
    qpn as usize % SHARDS
}

/// The sending side's reusable storage of a shard.
#[derive(Default)]
pub(super) struct TxState {
    /// The packets of one engine pass (kept for its capacity).
    pub out: Vec<Transmit>,
    /// Buffers of sent packets, handed back to the engine on its next pass.
    pub sent: Vec<Vec<u8>>,
}

pub(super) struct Shard {
    /// The send lock: held while a thread runs this shard's engine and
    /// sends what it made, so that each QP's packets leave in the order the
    /// engine made them. Taken before `engine`.
    pub tx: Ordered<Mutex<TxState>>,
    /// The shard's QPs. Taken alone for queries and setup calls that make
    /// no packets. (Its earliest timer is in the runtime's `deadlines`,
    /// side by side with the other shards': an empty poll reads them all.)
    pub engine: Ordered<Mutex<Engine>>,
}

impl Shard {
    pub fn new(engine: Engine) -> Shard {
        Shard {
            tx: Ordered::new(Rank::ShardTx, Mutex::default()),
            engine: Ordered::new(Rank::ShardEngine, Mutex::new(engine)),
        }
    }
}

/// An `Option<Instant>` readable without a lock (nanoseconds since a
/// process-wide origin; 0 = none).
#[derive(Default)]
pub(super) struct AtomicInstant(AtomicU64);

impl AtomicInstant {
    fn origin() -> Instant {
        static O: std::sync::OnceLock<Instant> = std::sync::OnceLock::new();
        *O.get_or_init(Instant::now)
    }
    pub fn store(&self, t: Option<Instant>, o: Ordering) {
        self.0.store(t.map_or(0, Self::raw), o);
    }
    /// `t` as stored (compare with [`AtomicInstant::is_due`]).
    pub fn raw(t: Instant) -> u64 {
        t.saturating_duration_since(Self::origin()).as_nanos() as u64 + 1
    }
    /// Whether the stored instant is set and not after `raw_now` (from
    /// [`AtomicInstant::raw`]): one load and one compare.
    pub fn is_due(&self, raw_now: u64) -> bool {
        let v = self.0.load(Ordering::Relaxed);
        v != 0 && v <= raw_now
    }
    pub fn load(&self, o: Ordering) -> Option<Instant> {
        match self.0.load(o) {
            0 => None,
            v => Some(Self::origin() + Duration::from_nanos(v - 1)),
        }
    }
}
