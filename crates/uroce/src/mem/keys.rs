//! The key table: `key = index << 8 | variant`. An index is reused only with
//! a new variant, so a stale key never reaches a new region.

use super::MemoryRegion;
use std::sync::Arc;

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
}

/// Largest index: 24 bits.
const MAX_INDEX: u32 = 0x00FF_FFFF;

impl KeyTable {
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
                self.slots.push(Slot { variant: (i as u8).wrapping_mul(17), region: None });
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

    pub fn len(&self) -> usize {
        self.slots.iter().filter(|s| s.region.is_some()).count()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}
