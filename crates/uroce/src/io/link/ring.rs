//! One direction of a shared-memory link: a single-producer,
//! single-consumer ring of packets in memory that another process maps too.
//!
//! Layout (all little-endian, native atomics): a 4 KiB header, then
//! `nslots` slots of `slot` bytes. The header holds a magic number, the
//! producer's `tail` (packets written), the consumer's `head` (packets
//! read) and the consumer's `sleeping` flag, each on its own cache line. A
//! slot is a 4-byte length and the packet's bytes.
//!
//! The other process is trusted with nothing: each side keeps its own
//! counter privately (the producer its tail, the consumer its head) and
//! only publishes it; what it reads of the other's counter, and every
//! length, is checked before use, and a packet is copied out of the shared
//! memory before anything parses it. An inconsistent ring is
//! [`Corrupt`]: the link is dropped, nothing is read out of bounds.
//!
//! Wakeups: the consumer sets `sleeping` before it sleeps (then looks once
//! more); the producer, after publishing its tail, rings the doorbell only
//! if it finds the flag set. A poller never sleeps, so packets to it cost
//! no system call.

use std::sync::atomic::{fence, AtomicU32, AtomicU64, Ordering};

/// Bytes of the ring header.
pub const HEADER: usize = 4096;
const MAGIC: u64 = 0x554c_4e4b_5249_4e47; // "ULNKRING"
const OFF_MAGIC: usize = 0;
const OFF_TAIL: usize = 64;
const OFF_HEAD: usize = 128;
const OFF_SLEEPING: usize = 192;
/// Bytes before a packet in its slot (its length, then padding).
const SLOT_HEAD: usize = 8;

/// The shape of a ring: slot count (a power of two) and slot size.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Geometry {
    pub nslots: usize,
    pub slot: usize,
}

impl Geometry {
    /// What a link uses: 512 slots of 8 KiB (any RoCE packet of a 4096-byte
    /// MTU fits one), 4 MiB per direction.
    pub const LINK: Geometry = Geometry { nslots: 512, slot: 8192 };

    /// Bytes of the whole ring (header and slots).
    pub const fn bytes(self) -> usize {
        HEADER + self.nslots * self.slot
    }

    /// The longest packet a slot holds.
    pub const fn max_packet(self) -> usize {
        self.slot - SLOT_HEAD
    }

    fn valid(self) -> bool {
        self.nslots.is_power_of_two() && self.slot >= 64 && self.slot % 8 == 0
    }
}

/// The ring's contents contradict its rules (a hostile or broken peer).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("shared-memory ring corrupt: {0}")]
pub struct Corrupt(pub &'static str);

/// A ring in memory that this process maps (and another may write).
#[derive(Debug, Clone, Copy)]
pub struct RingMem {
    base: *mut u8,
    geo: Geometry,
}

// SAFETY: RingMem is an address of shared memory accessed only through
// atomics and raw copies; which thread uses it is irrelevant.
unsafe impl Send for RingMem {}
// SAFETY: as above.
unsafe impl Sync for RingMem {}

impl RingMem {
    /// # Safety
    /// `base..base + geo.bytes()` must be mapped readable and writable,
    /// 64-byte aligned, for as long as the value (and copies) are used.
    /// Its contents may be anything and may change at any time.
    pub unsafe fn new(base: *mut u8, geo: Geometry) -> Option<RingMem> {
        (geo.valid() && base as usize % 64 == 0).then_some(RingMem { base, geo })
    }

    fn u64_at(&self, off: usize) -> &AtomicU64 {
        // SAFETY: off + 8 <= HEADER <= mapped length, 8-aligned (base is
        // 64-aligned); any bit pattern is a valid AtomicU64.
        unsafe { &*(self.base.add(off) as *const AtomicU64) }
    }

    fn u32_at(&self, off: usize) -> &AtomicU32 {
        // SAFETY: callers pass off + 4 <= mapped length, 4-aligned.
        unsafe { &*(self.base.add(off) as *const AtomicU32) }
    }

    fn slot_off(&self, n: u64) -> usize {
        HEADER + (n as usize & (self.geo.nslots - 1)) * self.geo.slot
    }

    /// Writes a fresh header (the creator does, before sharing). The
    /// consumer starts marked asleep, so that the first packet rings.
    pub fn init(&self) {
        self.u64_at(OFF_TAIL).store(0, Ordering::Relaxed);
        self.u64_at(OFF_HEAD).store(0, Ordering::Relaxed);
        self.u32_at(OFF_SLEEPING).store(1, Ordering::Relaxed);
        self.u64_at(OFF_MAGIC).store(MAGIC, Ordering::Release);
    }

    /// Whether the header carries the magic number.
    pub fn has_magic(&self) -> bool {
        self.u64_at(OFF_MAGIC).load(Ordering::Acquire) == MAGIC
    }
}

/// The writing end (one per ring; this process's tail is the truth).
#[derive(Debug)]
pub struct Producer {
    mem: RingMem,
    tail: u64,
    published: u64,
    /// The consumer's head as last read: the shared one is read again only
    /// when this says the ring is full (its cache line then moves between
    /// the cores once per lap, not once per packet).
    head: u64,
}

impl Producer {
    pub fn new(mem: RingMem) -> Producer {
        Producer { mem, tail: 0, published: 0, head: 0 }
    }

    /// Free slots, as far as the consumer's published head says.
    fn free(&mut self) -> Result<usize, Corrupt> {
        let nslots = self.mem.geo.nslots as u64;
        if self.tail.wrapping_sub(self.head) < nslots {
            return Ok((nslots - self.tail.wrapping_sub(self.head)) as usize);
        }
        let head = self.mem.u64_at(OFF_HEAD).load(Ordering::Acquire);
        let used = self.tail.wrapping_sub(head);
        if used > nslots {
            return Err(Corrupt("consumer head outside the ring"));
        }
        self.head = head;
        Ok((nslots - used) as usize)
    }

    /// Reserves the next slot for a packet of `len` bytes and lets `fill`
    /// write it through the pointer it gets (`len` bytes there are ours to
    /// write). `Ok(false)`: the ring is full, or `fill` refused (returned
    /// false); nothing is written then. The packet becomes visible at
    /// [`Producer::publish`].
    pub fn push(&mut self, len: usize, fill: impl FnOnce(*mut u8) -> bool) -> Result<bool, Corrupt> {
        if len == 0 || len > self.mem.geo.max_packet() {
            return Ok(false);
        }
        if self.free()? == 0 {
            return Ok(false);
        }
        let off = self.mem.slot_off(self.tail);
        // SAFETY: off + SLOT_HEAD + len <= off + slot <= the mapped length.
        let dst = unsafe { self.mem.base.add(off + SLOT_HEAD) };
        if !fill(dst) {
            return Ok(false);
        }
        self.mem.u32_at(off).store(len as u32, Ordering::Relaxed);
        self.tail = self.tail.wrapping_add(1);
        Ok(true)
    }

    /// Makes the pushed packets visible; returns whether the consumer
    /// sleeps (then the caller rings its doorbell).
    pub fn publish(&mut self) -> bool {
        if self.tail == self.published {
            return false;
        }
        self.published = self.tail;
        self.mem.u64_at(OFF_TAIL).store(self.tail, Ordering::Release);
        // Pairs with the consumer's fence between setting `sleeping` and
        // looking at the tail: one of the two sees the other.
        fence(Ordering::SeqCst);
        self.mem.u32_at(OFF_SLEEPING).load(Ordering::Relaxed) != 0
    }
}

/// The reading end (one per ring; this process's head is the truth).
#[derive(Debug)]
pub struct Consumer {
    mem: RingMem,
    head: u64,
}

impl Consumer {
    pub fn new(mem: RingMem) -> Consumer {
        Consumer { mem, head: 0 }
    }

    /// Packets waiting, as far as the producer's published tail says.
    pub fn pending(&self) -> Result<usize, Corrupt> {
        let tail = self.mem.u64_at(OFF_TAIL).load(Ordering::Acquire);
        let n = tail.wrapping_sub(self.head);
        if n > self.mem.geo.nslots as u64 {
            return Err(Corrupt("producer tail outside the ring"));
        }
        Ok(n as usize)
    }

    /// Copies up to `max` packets out of the ring, appending each to `out`
    /// and telling `each` its length, and frees their slots. A slot whose
    /// length is impossible is [`Corrupt`].
    pub fn drain(&mut self, max: usize, out: &mut Vec<u8>, mut each: impl FnMut(usize)) -> Result<usize, Corrupt> {
        let n = self.pending()?.min(max);
        if n == 0 {
            // Nothing taken: the head's cache line stays with the producer.
            return Ok(0);
        }
        for _ in 0..n {
            let off = self.mem.slot_off(self.head);
            let len = self.mem.u32_at(off).load(Ordering::Relaxed) as usize;
            if len == 0 || len > self.mem.geo.max_packet() {
                self.release();
                return Err(Corrupt("packet length outside its slot"));
            }
            out.reserve(len);
            let at = out.len();
            // SAFETY: the source lies inside the slot (checked above), the
            // destination is `out`'s spare capacity of at least `len` bytes,
            // which the copy initialises. The peer may write the source
            // meanwhile: the bytes are then garbage, which every reader of
            // a packet already tolerates.
            unsafe {
                std::ptr::copy_nonoverlapping(self.mem.base.add(off + SLOT_HEAD), out.as_mut_ptr().add(at), len);
                out.set_len(at + len);
            }
            each(len);
            self.head = self.head.wrapping_add(1);
        }
        self.release();
        Ok(n)
    }

    fn release(&self) {
        self.mem.u64_at(OFF_HEAD).store(self.head, Ordering::Release);
    }

    /// Marks the consumer asleep; returns whether packets wait (then it
    /// should not sleep). Corruption counts as waiting (the next drain
    /// reports it).
    pub fn sleep(&self) -> bool {
        self.mem.u32_at(OFF_SLEEPING).store(1, Ordering::Relaxed);
        fence(Ordering::SeqCst);
        self.pending().map_or(true, |n| n > 0)
    }

    /// Marks the consumer awake (producers stop ringing).
    pub fn wake(&self) {
        // Written only when set: the producer reads this line after every
        // publish.
        let f = self.mem.u32_at(OFF_SLEEPING);
        if f.load(Ordering::Relaxed) != 0 {
            f.store(0, Ordering::Relaxed);
        }
    }
}

/// A cache line of private memory (for rings built in a `Vec`).
#[cfg(feature = "unstable")]
#[derive(Clone, Copy)]
#[repr(C, align(64))]
struct Line([u8; 64]);

/// Drains a ring built from arbitrary bytes (the fuzz target's entry):
/// the first 16 bytes give the consumer's private head and how many
/// packets to take; the rest is the shared memory of a small ring,
/// header and slots. Never panics, never reads outside it.
#[cfg(feature = "unstable")]
pub fn fuzz_drain(data: &[u8]) -> Result<usize, Corrupt> {
    const GEO: Geometry = Geometry { nslots: 8, slot: 128 };
    if data.len() < 16 {
        return Ok(0);
    }
    let head = u64::from_le_bytes(data[..8].try_into().unwrap_or_default());
    let max = u64::from_le_bytes(data[8..16].try_into().unwrap_or_default()) as usize;
    // 64-byte aligned storage for the ring.
    let mut mem = vec![Line([0; 64]); GEO.bytes() / 64];
    // SAFETY: `mem` is GEO.bytes() long; copying at most that many bytes.
    let base = mem.as_mut_ptr().cast::<u8>();
    let n = (data.len() - 16).min(GEO.bytes());
    // SAFETY: both ranges are valid and distinct.
    unsafe { std::ptr::copy_nonoverlapping(data[16..].as_ptr(), base, n) };
    // SAFETY: `mem` is mapped, aligned and outlives the ring's use here.
    let Some(ring) = (unsafe { RingMem::new(base, GEO) }) else { return Ok(0) };
    let mut c = Consumer { mem: ring, head };
    let mut buf = Vec::new();
    let got = c.drain(max.min(64), &mut buf, |_| {})?;
    let _ = c.sleep();
    Ok(got)
}

#[cfg(test)]
mod tests {
    use super::*;

    const GEO: Geometry = Geometry { nslots: 4, slot: 64 };

    fn ring(mem: &mut [Line]) -> RingMem {
        // SAFETY: the test's buffer is large enough, aligned and outlives the ring.
        unsafe { RingMem::new(mem.as_mut_ptr().cast(), GEO) }.unwrap()
    }

    fn push(p: &mut Producer, bytes: &[u8]) -> bool {
        p.push(bytes.len(), |d| {
            // SAFETY: push hands `bytes.len()` writable bytes.
            unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), d, bytes.len()) };
            true
        })
        .unwrap()
    }

    fn drain(c: &mut Consumer) -> Result<Vec<Vec<u8>>, Corrupt> {
        let (mut buf, mut lens) = (Vec::new(), Vec::new());
        c.drain(usize::MAX, &mut buf, |len| lens.push(len))?;
        let mut at = 0;
        Ok(lens
            .into_iter()
            .map(|l| {
                at += l;
                buf[at - l..at].to_vec()
            })
            .collect())
    }

    #[test]
    fn packets_pass_in_order_and_a_full_ring_refuses_more() {
        let mut mem = vec![Line([0; 64]); GEO.bytes() / 64];
        let r = ring(&mut mem);
        r.init();
        let (mut p, mut c) = (Producer::new(r), Consumer::new(r));
        for i in 0..4u8 {
            assert!(push(&mut p, &[i; 10]));
        }
        assert!(!push(&mut p, &[9; 10]), "full: the packet is refused (dropped)");
        assert!(!push(&mut p, &[9; 57]), "longer than a slot");
        assert!(p.publish(), "the consumer starts asleep: the first publish rings");
        c.wake();
        assert_eq!(drain(&mut c).unwrap(), (0..4u8).map(|i| vec![i; 10]).collect::<Vec<_>>());
        assert!(push(&mut p, &[7; 56]));
        assert!(!p.publish(), "an awake consumer is not rung");
        assert!(c.sleep(), "a packet waits: do not sleep");
        assert_eq!(drain(&mut c).unwrap(), vec![vec![7; 56]]);
        assert!(!c.sleep());
        assert!(push(&mut p, &[1]));
        assert!(p.publish(), "a sleeping consumer is rung");
    }

    #[test]
    fn a_scribbled_ring_is_reported_not_followed() {
        let mut mem = vec![Line([0; 64]); GEO.bytes() / 64];
        let r = ring(&mut mem);
        r.init();
        let (mut p, mut c) = (Producer::new(r), Consumer::new(r));
        // The producer claims more packets than the ring holds.
        r.u64_at(OFF_TAIL).store(1 << 40, Ordering::Relaxed);
        assert!(c.pending().is_err());
        assert!(drain(&mut c).is_err());
        // A slot length past its slot.
        r.u64_at(OFF_TAIL).store(1, Ordering::Relaxed);
        r.u32_at(HEADER).store(60_000, Ordering::Relaxed);
        assert_eq!(drain(&mut c).unwrap_err(), Corrupt("packet length outside its slot"));
        // The consumer claims to have read what was never written (seen
        // when the producer's own count says the ring is full).
        for _ in 0..GEO.nslots {
            assert!(p.push(1, |_| true).unwrap());
        }
        r.u64_at(OFF_HEAD).store(u64::MAX / 2, Ordering::Relaxed);
        assert!(p.push(1, |_| true).is_err());
    }

    #[test]
    fn fuzz_drain_survives_random_bytes() {
        let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
        for round in 0..2000 {
            let len = (round * 37) % 1400;
            let data: Vec<u8> = (0..len)
                .map(|_| {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    if x % 3 == 0 {
                        0
                    } else {
                        x as u8
                    }
                })
                .collect();
            let _ = fuzz_drain(&data);
        }
    }
}
