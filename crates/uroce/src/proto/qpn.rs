//! The order in which a device hands out QP numbers: a keyed permutation of
//! the 24-bit QPN space, so that the QPNs a peer learns from its own
//! connections do not tell it the next one (they counted up by one from a
//! random start, which made a stale-connection REQ naming a victim's QPN
//! cheap: see docs/reliability.md, "Hostile peers"). Walking a counter
//! through the permutation still gives every number once before any
//! repeats, as a cyclic allocator does.
//!
//! The permutation is an 8-round balanced Feistel network on two 12-bit
//! halves whose round functions are tables drawn from a [`KeyRng`] (random
//! functions, 64 KiB in all); numbers below [`FIRST_QPN`] are skipped by
//! cycle-walking.

use crate::mem::KeyRng;
use std::sync::OnceLock;

/// Lowest QPN handed out (0 and 1 are the special QPs; rxe starts at 0x11).
pub const FIRST_QPN: u32 = 0x11;
/// Highest QPN (24 bits).
pub const LAST_QPN: u32 = 0x00FF_FFFF;

const ROUNDS: usize = 8;
const HALF: u32 = 12;
const HALF_MASK: u32 = (1 << HALF) - 1;

/// A keyed order of the QPNs `FIRST_QPN..=LAST_QPN`.
pub struct QpnOrder {
    rounds: Box<[[u16; 1 << HALF]; ROUNDS]>,
}

impl std::fmt::Debug for QpnOrder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("QpnOrder(..)")
    }
}

fn in_range(q: u32) -> bool {
    (FIRST_QPN..=LAST_QPN).contains(&q)
}

impl QpnOrder {
    /// An order keyed by `rng`'s next outputs.
    pub fn new(rng: &mut KeyRng) -> QpnOrder {
        let mut rounds = Box::new([[0u16; 1 << HALF]; ROUNDS]);
        for t in rounds.iter_mut() {
            for v in t.iter_mut() {
                *v = (rng.next_u32() & HALF_MASK) as u16;
            }
        }
        QpnOrder { rounds }
    }

    /// The permutation of `0..2^24`.
    fn permute(&self, x: u32) -> u32 {
        let (mut l, mut r) = ((x >> HALF) & HALF_MASK, x & HALF_MASK);
        for t in self.rounds.iter() {
            (l, r) = (r, l ^ u32::from(t[r as usize]));
        }
        (l << HALF) | r
    }

    fn unpermute(&self, y: u32) -> u32 {
        let (mut l, mut r) = ((y >> HALF) & HALF_MASK, y & HALF_MASK);
        for t in self.rounds.iter().rev() {
            (l, r) = (r ^ u32::from(t[l as usize]), l);
        }
        (l << HALF) | r
    }

    /// The QPN at position `c` (in range) of the order. The walk ends: the
    /// cycle through `c` comes back to `c`, which is in range, and at most
    /// 17 numbers are out of it.
    fn at(&self, c: u32) -> u32 {
        let mut y = self.permute(c);
        while !in_range(y) {
            y = self.permute(y);
        }
        y
    }

    fn position(&self, q: u32) -> u32 {
        let mut x = self.unpermute(q);
        while !in_range(x) {
            x = self.unpermute(x);
        }
        x
    }

    /// The first QPN of a device seeded with `seed`: a random place in the
    /// order.
    pub fn first(&self, seed: u64) -> u32 {
        self.at(FIRST_QPN + (seed % u64::from(LAST_QPN - FIRST_QPN + 1)) as u32)
    }

    /// The QPN after `qpn` in the order (`qpn` out of range: the first).
    pub fn after(&self, qpn: u32) -> u32 {
        if !in_range(qpn) {
            return self.at(FIRST_QPN);
        }
        let c = self.position(qpn);
        self.at(if c >= LAST_QPN { FIRST_QPN } else { c + 1 })
    }
}

/// The order of this process's devices, keyed from the OS once.
fn process_order() -> &'static QpnOrder {
    static ORDER: OnceLock<QpnOrder> = OnceLock::new();
    ORDER.get_or_init(|| QpnOrder::new(&mut KeyRng::from_os()))
}

/// The first QPN a device seeded with `seed` hands out (in this process's
/// secret order).
pub fn first_qpn(seed: u64) -> u32 {
    process_order().first(seed)
}

/// The QPN handed out after `qpn` (in this process's secret order; every
/// number once before any repeats).
pub fn qpn_after(qpn: u32) -> u32 {
    process_order().after(qpn)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_feistel_network_inverts() {
        let o = QpnOrder::new(&mut KeyRng::new(5));
        for x in (0..1u32 << 24).step_by(4099) {
            assert_eq!(o.unpermute(o.permute(x)), x);
        }
    }

    #[test]
    fn a_walk_visits_distinct_qpns_in_an_order_no_step_predicts() {
        let o = QpnOrder::new(&mut KeyRng::new(9));
        let mut q = o.first(12345);
        let mut seen = std::collections::HashSet::new();
        let mut steps = std::collections::HashSet::new();
        for _ in 0..100_000 {
            assert!(in_range(q), "{q:#x}");
            assert!(seen.insert(q), "{q:#x} twice");
            let n = o.after(q);
            steps.insert(n.wrapping_sub(q) & LAST_QPN);
            q = n;
        }
        // Counting up gives one step (1); a random order almost never
        // repeats a step among 100 000 of 16 M.
        assert!(steps.len() > 99_000, "{} distinct steps", steps.len());
    }

    #[test]
    fn orders_differ_by_key_and_replay_by_seed() {
        let a = QpnOrder::new(&mut KeyRng::new(1));
        let b = QpnOrder::new(&mut KeyRng::new(2));
        let walk = |o: &QpnOrder| {
            let mut q = o.first(0);
            (0..8)
                .map(|_| {
                    let n = o.after(q);
                    std::mem::replace(&mut q, n)
                })
                .collect::<Vec<_>>()
        };
        assert_eq!(walk(&a), walk(&QpnOrder::new(&mut KeyRng::new(1))));
        assert_ne!(walk(&a), walk(&b));
    }

    #[test]
    fn the_ends_of_the_range_wrap() {
        let o = QpnOrder::new(&mut KeyRng::new(3));
        assert_eq!(o.after(0), o.at(FIRST_QPN));
        assert_eq!(o.after(o.at(LAST_QPN)), o.at(FIRST_QPN));
        assert!(in_range(qpn_after(first_qpn(7))));
    }
}
