//! A seeded, simulated network for driving sans-IO engines: every datagram
//! may be lost, duplicated, delayed (and so reordered) or corrupted, a
//! partition may cut the link for a while, and arrivals may come in bursts.
//! This file owns the fabric and the seeded random numbers; the modules
//! below own what the simulation puts on either side of it.

/// Applications that answer late, never, or exit: the delayed-ACK policy.
pub mod answers;
/// Guarded buffers in shared memfd mappings, whose pages can be dropped.
pub mod buf;
/// One reliable connection between the two nodes, RC or XRC.
pub mod conn;
/// A node's memory behind the engine's boundary, with faults injected.
pub mod memory;
/// One engine with its memory and completion queues.
pub mod node;

use std::collections::BinaryHeap;
use std::net::IpAddr;
use std::time::{Duration, Instant};

/// splitmix64: small, fast, and good enough to choose faults.
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ 0xD1B5_4A32_D192_ED03)
    }
    pub fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    /// Uniform in 0..n (n > 0).
    pub fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
    pub fn chance(&mut self, p: f64) -> bool {
        ((self.next() >> 11) as f64 / (1u64 << 53) as f64) < p
    }
}

#[derive(Debug, Clone, Copy)]
pub struct Faults {
    pub loss: f64,
    pub duplicate: f64,
    /// Extra delay of up to 10 × max_delay for this fraction of packets.
    pub reorder: f64,
    pub corrupt: f64,
    pub min_delay: Duration,
    pub max_delay: Duration,
    /// A partition: every packet sent in `start..start+len` after the
    /// fabric's first packet is lost; then the link heals.
    pub partition: Option<(Duration, Duration)>,
}

impl Faults {
    pub fn none() -> Faults {
        Faults {
            loss: 0.0,
            duplicate: 0.0,
            reorder: 0.0,
            corrupt: 0.0,
            min_delay: Duration::from_micros(5),
            max_delay: Duration::from_micros(5),
            partition: None,
        }
    }
}

#[derive(PartialEq, Eq)]
struct InFlight {
    at: Instant,
    seq: u64,
    src: IpAddr,
    dst: IpAddr,
    data: Vec<u8>,
}

impl Ord for InFlight {
    fn cmp(&self, o: &Self) -> std::cmp::Ordering {
        // Min-heap on (time, sequence).
        (o.at, o.seq).cmp(&(self.at, self.seq))
    }
}

impl PartialOrd for InFlight {
    fn partial_cmp(&self, o: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(o))
    }
}

pub struct Fabric {
    faults: Faults,
    rng: Rng,
    heap: BinaryHeap<InFlight>,
    seq: u64,
    pub stats: FabricStats,
    first: Option<Instant>,
    /// Arrivals rounded up to a multiple of this, from the first packet.
    batch: Option<Duration>,
}

#[derive(Debug, Default, Clone, Copy)]
pub struct FabricStats {
    pub sent: u64,
    pub lost: u64,
    pub duplicated: u64,
    pub corrupted: u64,
    pub reordered: u64,
    pub partitioned: u64,
}

impl Fabric {
    pub fn new(faults: Faults, seed: u64) -> Fabric {
        Fabric {
            faults,
            rng: Rng::new(seed),
            heap: BinaryHeap::new(),
            seq: 0,
            stats: Default::default(),
            first: None,
            batch: None,
        }
    }

    /// Delivers in bursts: every arrival is rounded up to a multiple of
    /// `tick` after the first packet, so a receiver handles several
    /// datagrams before it sends anything, as one that batches its receives
    /// (interrupt coalescing, GRO, `recvmmsg`) does.
    pub fn batched(mut self, tick: Duration) -> Fabric {
        assert!(!tick.is_zero());
        self.batch = Some(tick);
        self
    }

    pub fn send(&mut self, now: Instant, src: IpAddr, dst: IpAddr, data: Vec<u8>) {
        self.stats.sent += 1;
        let t0 = *self.first.get_or_insert(now);
        if let Some((start, len)) = self.faults.partition {
            if now >= t0 + start && now < t0 + start + len {
                self.stats.partitioned += 1;
                return;
            }
        }
        if self.rng.chance(self.faults.loss) {
            self.stats.lost += 1;
            return;
        }
        let copies = if self.rng.chance(self.faults.duplicate) {
            self.stats.duplicated += 1;
            2
        } else {
            1
        };
        for _ in 0..copies {
            let mut data = data.clone();
            if !data.is_empty() && self.rng.chance(self.faults.corrupt) {
                let i = self.rng.below(data.len() as u64) as usize;
                data[i] ^= 1 << self.rng.below(8);
                self.stats.corrupted += 1;
            }
            let span = self.faults.max_delay.saturating_sub(self.faults.min_delay).as_nanos() as u64;
            let mut delay = self.faults.min_delay + Duration::from_nanos(self.rng.below(span + 1));
            if self.rng.chance(self.faults.reorder) {
                self.stats.reordered += 1;
                delay += Duration::from_nanos(self.rng.below(10 * self.faults.max_delay.as_nanos() as u64 + 1));
            }
            self.seq += 1;
            let at = self.arrival(t0, now + delay);
            self.heap.push(InFlight { at, seq: self.seq, src, dst, data });
        }
    }

    fn arrival(&self, t0: Instant, at: Instant) -> Instant {
        let Some(tick) = self.batch else { return at };
        let ticks = (at - t0).as_nanos().div_ceil(tick.as_nanos());
        t0 + Duration::from_nanos((ticks * tick.as_nanos()) as u64)
    }

    /// The time of the next delivery.
    pub fn next_time(&self) -> Option<Instant> {
        self.heap.peek().map(|p| p.at)
    }

    /// Datagrams due at `now`: (destination, source, bytes).
    pub fn deliver(&mut self, now: Instant) -> Vec<(IpAddr, IpAddr, Vec<u8>)> {
        let mut out = Vec::new();
        while self.heap.peek().is_some_and(|p| p.at <= now) {
            let p = self.heap.pop().unwrap();
            out.push((p.dst, p.src, p.data));
        }
        out
    }

    pub fn is_empty(&self) -> bool {
        self.heap.is_empty()
    }
}
