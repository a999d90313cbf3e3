//! The connection records of a CM agent, by local communication ID, and a
//! heap of their deadlines, so that the next timer and the records due are
//! found without a scan of every record (a server with thousands of
//! established connections has thousands of records and few timers).
//!
//! Records change only through [`Records::get_mut`] and
//! [`Records::insert`], which note the record's ID; before the heap is
//! read, each noted record's deadline, if it has one, is pushed. So every
//! record with a deadline has an entry holding exactly that deadline;
//! entries that no longer match (the deadline moved, the record went) are
//! stale and dropped when they reach the top. Stale entries are bounded:
//! past twice the records (and a floor), the heap is rebuilt from them.

use super::conn::Conn;
use std::cmp::Reverse;
use std::collections::hash_map::{self, HashMap};
use std::collections::BinaryHeap;
use std::time::Instant;

/// Stale heap entries tolerated before a rebuild, beyond twice the records.
const SLACK: usize = 1024;

/// The records and their deadline heap.
#[derive(Debug, Default)]
pub(super) struct Records {
    map: HashMap<u32, Conn>,
    heap: BinaryHeap<Reverse<(Instant, u32)>>,
    /// Records handed out for change since the heap was last brought up to
    /// date.
    touched: Vec<u32>,
}

impl Records {
    pub(super) fn get(&self, id: &u32) -> Option<&Conn> {
        self.map.get(id)
    }

    /// A record to change; its deadline reaches the heap before the heap
    /// is next read.
    pub(super) fn get_mut(&mut self, id: &u32) -> Option<&mut Conn> {
        if !self.map.contains_key(id) {
            return None;
        }
        self.touch(*id);
        self.map.get_mut(id)
    }

    pub(super) fn insert(&mut self, id: u32, conn: Conn) {
        self.map.insert(id, conn);
        self.touch(id);
    }

    pub(super) fn remove(&mut self, id: &u32) -> Option<Conn> {
        self.map.remove(id)
    }

    pub(super) fn contains_key(&self, id: &u32) -> bool {
        self.map.contains_key(id)
    }

    pub(super) fn len(&self) -> usize {
        self.map.len()
    }

    pub(super) fn iter(&self) -> hash_map::Iter<'_, u32, Conn> {
        self.map.iter()
    }

    pub(super) fn values(&self) -> hash_map::Values<'_, u32, Conn> {
        self.map.values()
    }

    /// The earliest deadline of any record.
    pub(super) fn next_deadline(&mut self) -> Option<Instant> {
        self.update();
        while let Some(&Reverse(top)) = self.heap.peek() {
            if self.current(top) {
                return Some(top.0);
            }
            self.heap.pop();
        }
        None
    }

    /// The records due at `now`, each once; their entries are taken off
    /// the heap. Whatever the caller then does to
    /// them goes through [`Records::get_mut`], and the caller notes each
    /// with [`Records::touch`] (a record whose turn changed nothing keeps a
    /// deadline that no entry holds any more).
    pub(super) fn due(&mut self, now: Instant) -> Vec<u32> {
        self.update();
        let mut out = Vec::new();
        while let Some(&Reverse((d, id))) = self.heap.peek() {
            if d > now {
                break;
            }
            self.heap.pop();
            if self.current((d, id)) {
                out.push(id);
            }
        }
        // (A deadline moved away and back leaves two current entries.)
        out.sort_unstable();
        out.dedup();
        out
    }

    /// Notes a record whose deadline must reach the heap again (brought up
    /// to date here when many are noted and the heap is not read).
    pub(super) fn touch(&mut self, id: u32) {
        if self.touched.len() > 2 * self.map.len() + SLACK {
            self.update();
        }
        self.touched.push(id);
    }

    /// Whether a heap entry is the current deadline of a live record.
    fn current(&self, (d, id): (Instant, u32)) -> bool {
        self.map.get(&id).and_then(Conn::deadline) == Some(d)
    }

    /// Pushes the deadlines of the records noted since the last update, and
    /// rebuilds the heap once stale entries pile up.
    fn update(&mut self) {
        if self.heap.len() + self.touched.len() > 2 * self.map.len() + SLACK {
            self.touched.clear();
            self.heap = self.map.iter().filter_map(|(&id, c)| c.deadline().map(|d| Reverse((d, id)))).collect();
            return;
        }
        self.touched.sort_unstable();
        self.touched.dedup();
        for id in self.touched.drain(..) {
            if let Some(d) = self.map.get(&id).and_then(Conn::deadline) {
                self.heap.push(Reverse((d, id)));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cm::conn::{ConnInfo, Role, State};
    use crate::cm::service::PortSpace;
    use std::time::Duration;

    fn conn() -> Conn {
        let a = "127.0.0.1:1".parse().unwrap();
        Conn::new(ConnInfo::new(Role::Active, PortSpace::Tcp, a, a), State::Established, 1, a.ip())
    }

    /// The heap answers what a scan of every record would, through moves
    /// of deadlines earlier and later, removals and turns that change
    /// nothing, and stays bounded.
    #[test]
    fn the_heap_answers_as_a_scan_would() {
        let t0 = Instant::now();
        let mut r = Records::default();
        let scan = |r: &Records| r.values().filter_map(Conn::deadline).min();
        // 2 000 established records without timers, a few with.
        for id in 0..2000u32 {
            r.insert(id, conn());
        }
        assert_eq!(r.next_deadline(), None);
        let mut rng = crate::mem::KeyRng::new(7);
        for step in 0..20_000u32 {
            let id = rng.next_u32() % 2100;
            match rng.next_u32() % 6 {
                0 if r.contains_key(&id) => {
                    r.remove(&id);
                }
                0 | 1 => r.insert(id, conn()),
                2 => {
                    if let Some(c) = r.get_mut(&id) {
                        c.timewait_until = Some(t0 + Duration::from_millis(u64::from(rng.next_u32() % 1000)));
                    }
                }
                3 => {
                    if let Some(c) = r.get_mut(&id) {
                        c.timewait_until = None;
                    }
                }
                4 => {
                    // A turn that changes nothing still keeps the record's entry.
                    let now = t0 + Duration::from_millis(u64::from(step % 1000));
                    for id in r.due(now) {
                        let _ = r.get(&id);
                        r.touch(id);
                    }
                }
                _ => {}
            }
            assert_eq!(r.next_deadline(), scan(&r), "step {step}");
            assert!(r.heap.len() <= 2 * r.len() + SLACK + 1, "the heap stays bounded: {}", r.heap.len());
        }
        // Everything due is found, each record once.
        let end = t0 + Duration::from_secs(2);
        let mut due = r.due(end);
        due.sort_unstable();
        let mut want: Vec<u32> = r.iter().filter(|(_, c)| c.deadline().is_some()).map(|(&id, _)| id).collect();
        want.sort_unstable();
        assert_eq!(due, want);
    }
}
