//! A set of disjoint half-open `u64` intervals: which pages of an ODP region
//! the device currently has translated, and which address ranges the
//! invalidation notifier watches. Sparse, so a 1 TiB region costs nothing
//! until it is touched.

use std::collections::BTreeMap;

/// Disjoint, non-adjacent intervals `start..end`, keyed by start.
#[derive(Debug, Default, Clone)]
pub struct RangeSet {
    map: BTreeMap<u64, u64>,
}

impl RangeSet {
    pub fn new() -> RangeSet {
        RangeSet::default()
    }

    /// Adds `start..end`; returns how many units were not already present.
    pub fn insert(&mut self, start: u64, end: u64) -> u64 {
        if start >= end {
            return 0;
        }
        let (mut s, mut e) = (start, end);
        let mut covered = 0;
        // Merge with every interval that overlaps or touches start..end.
        let first = self.map.range(..=start).next_back().filter(|(_, &pe)| pe >= start).map(|(&ps, _)| ps);
        let from = first.unwrap_or(start);
        let touching: Vec<(u64, u64)> = self.map.range(from..=end).map(|(&a, &b)| (a, b)).collect();
        for (a, b) in touching {
            covered += b.min(end).saturating_sub(a.max(start));
            s = s.min(a);
            e = e.max(b);
            self.map.remove(&a);
        }
        self.map.insert(s, e);
        (end - start) - covered
    }

    /// Removes `start..end`; returns how many units were present.
    pub fn remove(&mut self, start: u64, end: u64) -> u64 {
        if start >= end {
            return 0;
        }
        let from =
            self.map.range(..start).next_back().filter(|(_, &pe)| pe > start).map(|(&ps, _)| ps).unwrap_or(start);
        let hit: Vec<(u64, u64)> = self.map.range(from..end).map(|(&a, &b)| (a, b)).collect();
        let mut removed = 0;
        for (a, b) in hit {
            removed += b.min(end) - a.max(start);
            self.map.remove(&a);
            if a < start {
                self.map.insert(a, start);
            }
            if b > end {
                self.map.insert(end, b);
            }
        }
        removed
    }

    /// Whether all of `start..end` is present.
    pub fn contains(&self, start: u64, end: u64) -> bool {
        start >= end || self.map.range(..=start).next_back().is_some_and(|(_, &e)| e >= end)
    }

    /// Units present.
    pub fn total(&self) -> u64 {
        self.map.iter().map(|(a, b)| b - a).sum()
    }

    pub fn clear(&mut self) -> u64 {
        let t = self.total();
        self.map.clear();
        t
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn insert_merges_and_counts_new_units() {
        let mut r = RangeSet::new();
        assert_eq!(r.insert(10, 20), 10);
        assert_eq!(r.insert(15, 25), 5);
        assert_eq!(r.insert(0, 5), 5);
        assert_eq!(r.insert(5, 10), 5, "fills the gap exactly");
        assert_eq!(r.total(), 25);
        assert!(r.contains(0, 25));
        assert_eq!(r.remove(3, 7), 4);
        assert!(!r.contains(0, 25));
        assert!(r.contains(7, 25));
        assert_eq!(r.remove(100, 200), 0);
        assert_eq!(r.total(), 21);
    }

    proptest! {
        #[test]
        fn matches_a_bitmap(ops in proptest::collection::vec((any::<bool>(), 0u64..64, 0u64..64), 0..60)) {
            let mut r = RangeSet::new();
            let mut bits = [false; 128];
            for (add, a, l) in ops {
                let (s, e) = (a, a + l);
                let before = bits[s as usize..e as usize].iter().filter(|b| **b).count() as u64;
                if add {
                    prop_assert_eq!(r.insert(s, e), l - before);
                    bits[s as usize..e as usize].iter_mut().for_each(|b| *b = true);
                } else {
                    prop_assert_eq!(r.remove(s, e), before);
                    bits[s as usize..e as usize].iter_mut().for_each(|b| *b = false);
                }
                prop_assert_eq!(r.total(), bits.iter().filter(|b| **b).count() as u64);
                // Intervals stay disjoint and non-adjacent.
                let v: Vec<_> = r.map.iter().collect();
                for w in v.windows(2) {
                    prop_assert!(w[0].1 < w[1].0);
                }
            }
        }
    }
}
