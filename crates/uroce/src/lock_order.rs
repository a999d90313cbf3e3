//! The lock order of docs/architecture.md ("Locks"), checked in debug
//! builds.
//!
//! The locks of the runtime, the same-host link, the CM endpoint and
//! librdmacm's process-wide state (uroce-ibverbs) are [`Ordered`]: a mutex
//! or read-write lock with a [`Rank`]. A thread may block on a lock only if
//! every lock it holds ranks lower; a debug build panics at the `lock`
//! call that breaks the order, before it can wait, so a test that takes
//! two locks the wrong way round fails at once instead of deadlocking one
//! run in a thousand. A `try_lock` never waits and is not checked, but the
//! lock it gets counts as held. Release builds keep no record: `Ordered`
//! is the lock itself and its guard the lock's guard.

use std::ops::{Deref, DerefMut};
use std::sync::{
    Condvar, Mutex, MutexGuard, RwLock, RwLockReadGuard, RwLockWriteGuard, TryLockError, WaitTimeoutResult,
};
use std::time::Duration;

/// The locks in the order a thread may take them (docs/architecture.md).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Rank {
    /// `rdmacm::STATE` (uroce-ibverbs): librdmacm's ids, listeners and
    /// connections, process-wide.
    #[cfg(feature = "unstable")]
    RdmacmState,
    /// `cm::CmEndpoint`'s state: the CM agent and QP 1's receive slots.
    CmEndpoint,
    /// `Runtime::rx`: the receive buffers.
    Rx,
    /// `Shard::tx`: one shard's drain and send.
    ShardTx,
    /// `link::Inner::peers`: the link's peer table.
    LinkPeers,
    /// `link::Peer::state`: one peer's medium.
    LinkPeerState,
    /// `link::Inner::links`: the live links.
    LinkLinks,
    /// `link::Link::tx` / `rx`: one end of one link's rings.
    LinkRing,
    /// `Shard::engine`: one shard's engine.
    ShardEngine,
}

/// A lock with its rank.
#[derive(Debug)]
pub struct Ordered<L> {
    lock: L,
    #[cfg(debug_assertions)]
    rank: Rank,
}

/// A guard of an [`Ordered`] lock: the lock's own guard, and in debug
/// builds the record that this thread holds the rank.
#[derive(Debug)]
pub struct Held<G> {
    guard: G,
    #[cfg(debug_assertions)]
    rank: Rank,
}

impl<L> Ordered<L> {
    pub fn new(rank: Rank, lock: L) -> Ordered<L> {
        #[cfg(not(debug_assertions))]
        let _ = rank;
        Ordered {
            lock,
            #[cfg(debug_assertions)]
            rank,
        }
    }

    /// Records that the thread is about to block on this lock (checked).
    fn before_wait(&self) {
        #[cfg(debug_assertions)]
        held::check(self.rank);
    }

    fn hold<G>(&self, guard: G) -> Held<G> {
        #[cfg(debug_assertions)]
        held::push(self.rank);
        Held {
            guard,
            #[cfg(debug_assertions)]
            rank: self.rank,
        }
    }
}

impl<T> Ordered<Mutex<T>> {
    /// Locks (a poisoned lock panics, as `lock().unwrap()`).
    pub fn lock(&self) -> Held<MutexGuard<'_, T>> {
        self.before_wait();
        let g = self.lock.lock().unwrap_or_else(|_| panic!("a lock poisoned by a panic"));
        self.hold(g)
    }

    /// Locks; a lock poisoned by a panic elsewhere is taken as it is (for
    /// state that stays consistent at every unlock, where one thread's
    /// panic must not stop every other).
    pub fn lock_unpoisoned(&self) -> Held<MutexGuard<'_, T>> {
        self.before_wait();
        let g = self.lock.lock().unwrap_or_else(|p| p.into_inner());
        self.hold(g)
    }

    /// Locks if nobody holds the lock, a poisoned one as it is (see
    /// [`Self::lock_unpoisoned`]).
    #[cfg(feature = "unstable")]
    pub fn try_lock_unpoisoned(&self) -> Option<Held<MutexGuard<'_, T>>> {
        match self.lock.try_lock() {
            Ok(g) => Some(self.hold(g)),
            Err(TryLockError::WouldBlock) => None,
            Err(TryLockError::Poisoned(p)) => Some(self.hold(p.into_inner())),
        }
    }

    /// Locks if nobody holds the lock.
    pub fn try_lock(&self) -> Option<Held<MutexGuard<'_, T>>> {
        match self.lock.try_lock() {
            Ok(g) => Some(self.hold(g)),
            Err(TryLockError::WouldBlock) => None,
            Err(TryLockError::Poisoned(_)) => panic!("a lock poisoned by a panic"),
        }
    }
}

impl<T> Ordered<RwLock<T>> {
    pub fn read(&self) -> Held<RwLockReadGuard<'_, T>> {
        self.before_wait();
        let g = self.lock.read().unwrap_or_else(|_| panic!("a lock poisoned by a panic"));
        self.hold(g)
    }

    pub fn write(&self) -> Held<RwLockWriteGuard<'_, T>> {
        self.before_wait();
        let g = self.lock.write().unwrap_or_else(|_| panic!("a lock poisoned by a panic"));
        self.hold(g)
    }
}

impl<G: Deref> Deref for Held<G> {
    type Target = G::Target;
    fn deref(&self) -> &G::Target {
        &self.guard
    }
}

impl<G: DerefMut> DerefMut for Held<G> {
    fn deref_mut(&mut self) -> &mut G::Target {
        &mut self.guard
    }
}

impl<'a, T> Held<MutexGuard<'a, T>> {
    /// `Condvar::wait`: releases the lock while it waits (checked as a new
    /// `lock`: no lock of this rank or higher may be held meanwhile).
    /// Poisoning is ignored, as by [`Ordered::lock_unpoisoned`].
    #[cfg(feature = "unstable")]
    pub fn wait(self, cv: &Condvar) -> Self {
        self.wait_with(|g| cv.wait(g).unwrap_or_else(|p| p.into_inner()))
    }

    /// `Condvar::wait_timeout`, as [`Self::wait`].
    pub fn wait_timeout(self, cv: &Condvar, dur: Duration) -> (Self, WaitTimeoutResult) {
        let mut res = None;
        let held = self.wait_with(|g| {
            let (g, r) = cv.wait_timeout(g, dur).unwrap_or_else(|p| p.into_inner());
            res = Some(r);
            g
        });
        (held, res.expect("the wait ran"))
    }

    fn wait_with(self, f: impl FnOnce(MutexGuard<'a, T>) -> MutexGuard<'a, T>) -> Self {
        #[cfg(debug_assertions)]
        let rank = self.rank;
        let this = std::mem::ManuallyDrop::new(self);
        // SAFETY: `this` is never used or dropped after this read, so the
        // guard is moved out exactly once (Held has a Drop impl in debug
        // builds, which forbids moving a field out by destructuring).
        let guard = unsafe { std::ptr::read(&this.guard) };
        #[cfg(debug_assertions)]
        {
            held::pop(rank);
            held::check(rank);
        }
        let guard = f(guard);
        #[cfg(debug_assertions)]
        held::push(rank);
        Held {
            guard,
            #[cfg(debug_assertions)]
            rank,
        }
    }
}

#[cfg(debug_assertions)]
impl<G> Drop for Held<G> {
    fn drop(&mut self) {
        held::pop(self.rank);
    }
}

/// The ranks this thread holds (debug builds).
#[cfg(debug_assertions)]
mod held {
    use super::Rank;
    use std::cell::RefCell;

    thread_local! {
        static HELD: RefCell<Vec<Rank>> = const { RefCell::new(Vec::new()) };
    }

    /// Panics if the thread holds a lock of `r`'s rank or a higher one.
    pub fn check(r: Rank) {
        HELD.with(|h| {
            if let Some(top) = h.borrow().iter().max().filter(|top| **top >= r) {
                panic!("lock order: {r:?} taken while {top:?} is held (docs/architecture.md, \"Locks\")");
            }
        });
    }

    pub fn push(r: Rank) {
        HELD.with(|h| h.borrow_mut().push(r));
    }

    /// Guards may go in any order: the last record of `r` goes.
    pub fn pop(r: Rank) {
        // (During thread exit the record may be gone already.)
        let _ = HELD.try_with(|h| {
            let mut h = h.borrow_mut();
            if let Some(i) = h.iter().rposition(|x| *x == r) {
                h.remove(i);
            }
        });
    }
}

#[cfg(all(test, debug_assertions))]
mod tests {
    use super::*;

    #[test]
    fn the_order_is_allowed_and_a_guard_dropped_early_leaves_the_rest_held() {
        let rx = Ordered::new(Rank::Rx, Mutex::new(1));
        let tx = Ordered::new(Rank::ShardTx, Mutex::new(2));
        let engine = Ordered::new(Rank::ShardEngine, Mutex::new(3));
        let a = rx.lock();
        let b = tx.lock();
        drop(a);
        let c = engine.lock();
        assert_eq!(*b + *c, 5);
        drop((b, c));
        // Nothing held: any lock again.
        drop(engine.lock());
        drop(rx.lock());
    }

    #[test]
    fn a_lock_below_one_held_panics_before_it_waits() {
        let tx = Ordered::new(Rank::ShardTx, Mutex::new(()));
        let engine = Ordered::new(Rank::ShardEngine, Mutex::new(()));
        let _e = engine.lock();
        // tx is free: the order, not a wait, is what fails.
        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| drop(tx.lock())));
        let msg = *r.expect_err("tx under engine").downcast::<String>().unwrap();
        assert!(msg.contains("ShardTx taken while ShardEngine is held"), "{msg}");
    }

    #[test]
    fn a_condvar_wait_releases_the_rank_and_is_checked_like_a_lock() {
        let cm = Ordered::new(Rank::CmEndpoint, Mutex::new(0));
        let cv = Condvar::new();
        let g = cm.lock_unpoisoned();
        // (Nobody notifies: it times out, or wakes spuriously.)
        let (g, _) = g.wait_timeout(&cv, Duration::from_millis(1));
        // Still held after the wait: a lock of a lower rank may not be taken.
        let state = Ordered::new(Rank::RdmacmState, Mutex::new(()));
        assert!(std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| drop(state.lock()))).is_err());
        drop(g);
        drop(state.lock());
        // Waiting on the CM's condvar while a runtime lock is held is a
        // blocking wait under that lock.
        let rx = Ordered::new(Rank::Rx, Mutex::new(()));
        let g = cm.lock_unpoisoned();
        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            let _rx = rx.try_lock().unwrap();
            drop(g.wait_timeout(&cv, Duration::from_millis(1)));
        }));
        let msg = *r.expect_err("a wait under rx").downcast::<String>().unwrap();
        assert!(msg.contains("CmEndpoint taken while Rx is held"), "{msg}");
    }

    #[test]
    fn a_poisoned_lock_is_taken_as_it_is() {
        let m = std::sync::Arc::new(Ordered::new(Rank::CmEndpoint, Mutex::new(7)));
        let m2 = m.clone();
        let _ = std::thread::spawn(move || {
            let _g = m2.lock_unpoisoned();
            panic!("poison it");
        })
        .join();
        assert_eq!(*m.lock_unpoisoned(), 7);
    }

    #[test]
    fn two_locks_of_one_rank_nest_only_by_try_lock() {
        let a = Ordered::new(Rank::LinkRing, Mutex::new(()));
        let b = Ordered::new(Rank::LinkRing, Mutex::new(()));
        let _a = a.lock();
        assert!(b.try_lock().is_some(), "a try-lock never waits: not checked");
        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| drop(b.lock())));
        assert!(r.is_err(), "a second lock of one rank could wait for a thread holding them the other way");
        let w = Ordered::new(Rank::LinkLinks, RwLock::new(0));
        assert!(std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| drop(w.read()))).is_err());
    }
}
