//! The key table: `key = index << 8 | variant`. An index is reused only with
//! a new variant, so a stale key never reaches a new region.
//!
//! A slot's first variant is random (per device, as rxe randomises the 8
//! low bits of every key), so a peer cannot predict a key from the order of
//! registrations: guessing one takes up to 256 tries per index. This is all
//! RoCE offers against a forged packet (it has no authentication; a device
//! accepts a request from any address that can reach its port): see
//! docs/reliability.md, "Local attacker".

use super::MemoryRegion;
use rand_chacha::rand_core::{RngCore, SeedableRng};
use rand_chacha::ChaCha20Rng;
use std::sync::Arc;

/// The random source for everything a peer sees and must not predict (key
/// variants, communication IDs, starting PSNs, the QPN order): ChaCha20, a
/// keyed CSPRNG, seeded once per device with 256 bits from `getrandom(2)`
/// ([`KeyRng::from_os`]) or from a test's seed ([`KeyRng::new`]). Unlike
/// the SplitMix64 it replaces, no number of outputs reveals its state, so
/// one ID a peer learns tells it nothing about the next.
#[derive(Debug, Clone)]
pub struct KeyRng(ChaCha20Rng);

impl KeyRng {
    /// A generator replaying the sequence of `seed` (deterministic tests and
    /// simulations only: 64 bits of seed).
    pub fn new(seed: u64) -> KeyRng {
        KeyRng(ChaCha20Rng::seed_from_u64(seed))
    }

    /// Seeded from `getrandom(2)`; falls back to the clock and the address
    /// of a stack variable if the call fails (it does not on Linux ≥ 3.17).
    pub fn from_os() -> KeyRng {
        KeyRng(ChaCha20Rng::from_seed(os_random_bytes()))
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0.next_u64()
    }

    pub fn next_u32(&mut self) -> u32 {
        self.0.next_u32()
    }

    pub fn next_u8(&mut self) -> u8 {
        (self.next_u64() >> 56) as u8
    }
}

impl Default for KeyRng {
    fn default() -> KeyRng {
        KeyRng::from_os()
    }
}

/// 32 random bytes from the kernel (a generator's key).
pub fn os_random_bytes() -> [u8; 32] {
    let mut seed = [0u8; 32];
    for (i, c) in seed.chunks_mut(8).enumerate() {
        c.copy_from_slice(&(os_random_u64() ^ i as u64).to_ne_bytes());
    }
    seed
}

/// 64 random bits from the kernel.
pub fn os_random_u64() -> u64 {
    let mut b = [0u8; 8];
    // SAFETY: writes at most 8 bytes into `b`.
    let n = unsafe { libc::getrandom(b.as_mut_ptr().cast(), b.len(), 0) };
    if n == 8 {
        return u64::from_ne_bytes(b);
    }
    let t = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
    t.as_nanos() as u64 ^ (&b as *const _ as u64).rotate_left(32)
}

#[derive(Debug, Default)]
struct Slot {
    variant: u8,
    region: Option<Arc<MemoryRegion>>,
}

/// Regions by key. Index 0 is never used, so key 0 is always invalid.
#[derive(Debug, Default)]
pub struct KeyTable {
    slots: Vec<Slot>,
    free: Vec<u32>,
    rng: KeyRng,
}

/// Largest index: 24 bits.
const MAX_INDEX: u32 = 0x00FF_FFFF;

impl KeyTable {
    #[cfg(feature = "unstable")]
    /// A table whose variants come from `seed` (deterministic tests).
    pub fn with_seed(seed: u64) -> KeyTable {
        KeyTable { slots: Vec::new(), free: Vec::new(), rng: KeyRng::new(seed) }
    }

    /// A random variant for a new key outside this table (memory windows).
    pub fn random_variant(&mut self) -> u8 {
        self.rng.next_u8()
    }

    /// Allocates a key and stores the region `make` builds for it.
    pub fn insert(&mut self, make: impl FnOnce(u32) -> MemoryRegion) -> Arc<MemoryRegion> {
        if self.slots.is_empty() {
            self.slots.push(Slot::default()); // index 0: reserved
        }
        let index = match self.free.pop() {
            Some(i) => i,
            None => {
                let i = self.slots.len() as u32;
                assert!(i <= MAX_INDEX, "key space exhausted");
                let variant = self.rng.next_u8();
                self.slots.push(Slot { variant, region: None });
                i
            }
        };
        let slot = &mut self.slots[index as usize];
        let key = (index << 8) | slot.variant as u32;
        let region = Arc::new(make(key));
        slot.region = Some(region.clone());
        region
    }

    /// Removes the region of a current key; the slot's next key gets a new
    /// variant.
    pub fn remove(&mut self, key: u32) -> Option<Arc<MemoryRegion>> {
        let index = key >> 8;
        let slot = self.slots.get_mut(index as usize)?;
        if slot.variant as u32 != key & 0xff || slot.region.is_none() {
            return None;
        }
        slot.variant = slot.variant.wrapping_add(1);
        self.free.push(index);
        slot.region.take()
    }

    /// Replaces the region of a current key. With `new_variant`, the region
    /// gets a new key (same index, next variant) and the old key stops
    /// working; otherwise it keeps its key.
    pub fn replace(
        &mut self,
        key: u32,
        new_variant: bool,
        make: impl FnOnce(u32) -> MemoryRegion,
    ) -> Option<(Arc<MemoryRegion>, Arc<MemoryRegion>)> {
        let index = key >> 8;
        let slot = self.slots.get_mut(index as usize)?;
        if slot.variant as u32 != key & 0xff || slot.region.is_none() {
            return None;
        }
        if new_variant {
            slot.variant = slot.variant.wrapping_add(1);
        }
        let region = Arc::new(make((index << 8) | slot.variant as u32));
        let old = slot.region.replace(region.clone())?;
        Some((old, region))
    }

    pub fn lookup(&self, key: u32) -> Option<&Arc<MemoryRegion>> {
        let slot = self.slots.get((key >> 8) as usize)?;
        if slot.variant as u32 != key & 0xff {
            return None;
        }
        slot.region.as_ref()
    }

    /// Every registered region.
    pub fn regions(&self) -> impl Iterator<Item = &Arc<MemoryRegion>> {
        self.slots.iter().filter_map(|s| s.region.as_ref())
    }

    #[cfg(any(test, feature = "unstable"))]
    pub fn len(&self) -> usize {
        self.slots.iter().filter(|s| s.region.is_some()).count()
    }

    #[cfg(any(test, feature = "unstable"))]
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ib::Access;
    use crate::mem::{Backing, MemoryRegion};

    fn region(key: u32) -> MemoryRegion {
        MemoryRegion::new(1, key, 0, 0, Access::empty(), Backing::Host { addr: 0, owner: None, pages: None })
    }

    fn first_keys(t: &mut KeyTable, n: usize) -> Vec<u32> {
        (0..n).map(|_| t.insert(region).key).collect()
    }

    #[test]
    fn variants_depend_on_the_seed_not_the_order_of_registration() {
        let a = first_keys(&mut KeyTable::with_seed(1), 16);
        let b = first_keys(&mut KeyTable::with_seed(2), 16);
        assert_eq!(a, first_keys(&mut KeyTable::with_seed(1), 16), "a seed replays");
        assert_ne!(a, b);
        // Indexes are sequential, variants are not a function of the index.
        assert_eq!(a.iter().map(|k| k >> 8).collect::<Vec<_>>(), (1..=16).collect::<Vec<_>>());
        let variants: std::collections::HashSet<u32> = a.iter().map(|k| k & 0xff).collect();
        assert!(variants.len() > 8, "16 keys, {} variants: {a:x?}", variants.len());
    }

    #[test]
    fn a_reused_index_gets_a_new_variant() {
        let mut t = KeyTable::with_seed(7);
        let k = t.insert(region).key;
        t.remove(k).unwrap();
        let k2 = t.insert(region).key;
        assert_eq!(k2 >> 8, k >> 8);
        assert_ne!(k2, k);
        assert!(t.lookup(k).is_none(), "the stale key resolves nothing");
    }
}
