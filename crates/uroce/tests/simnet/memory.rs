//! A node's memory as the simulation sees it: the real `Memory` behind the
//! engine's `MemoryAccess` boundary, with seeded trouble injected between
//! the engine and it.
//!
//! * page faults: a copy or atomic fails as if the page had been unmapped
//!   (a write may land a prefix of its bytes first, as a copy cut short by
//!   a fault does);
//! * peer invalidations: right after a key is resolved, the wrapper revokes
//!   it, so the copy through the span just checked fails, and every later
//!   resolution of the key is refused as a bad key;
//! * slow copies: a copy succeeds but takes simulated time, which the run
//!   loop adds to its clock ([`SimMemory::take_lag`]).
//!
//! Every injected failure is logged with the address (in this process) it
//! hit, so that the simulation can tell which work request it belongs to.

use super::Rng;
use std::collections::HashSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use uroce::mem::{AccessError, BindError, BindRequest, Layout, Memory, Span, Want};
use uroce::proto::memory::Atomic;
use uroce::proto::{MemoryAccess, PayloadHold};

/// How often each kind of trouble strikes, per access.
#[derive(Debug, Clone, Copy)]
pub struct MemFaults {
    /// A copy or atomic faults.
    pub fault: f64,
    /// A resolved key is revoked before its copy.
    pub revoke: f64,
    /// A copy takes up to `max_slow` of simulated time.
    pub slow: f64,
    pub max_slow: Duration,
    /// At most this many failures (faults and revocations) are injected.
    pub budget: u32,
}

/// What went wrong with one access.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Trouble {
    /// A copy or atomic faulted.
    Fault,
    /// The key was revoked: the copy through the span just checked failed,
    /// or a later resolution was refused.
    Revoked,
}

/// One injected failure: the address of the access's first byte, and what.
#[derive(Debug, Clone, Copy)]
pub struct Injected {
    pub addr: usize,
    pub trouble: Trouble,
}

#[derive(Debug)]
struct State {
    rng: Rng,
    faults: MemFaults,
    injected: Vec<Injected>,
    /// Keys revoked: resolutions are refused.
    revoked_keys: HashSet<u32>,
    /// Host ranges of spans resolved just before their key was revoked:
    /// their copies fail.
    revoked_spans: Vec<(usize, usize)>,
    lag: Duration,
    slow_copies: u64,
}

/// The wrapper (see the module docs).
pub struct SimMemory {
    inner: Arc<Memory>,
    state: Mutex<State>,
}

impl std::fmt::Debug for SimMemory {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SimMemory").finish_non_exhaustive()
    }
}

impl std::fmt::Debug for Rng {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Rng")
    }
}

impl SimMemory {
    pub fn new(inner: Arc<Memory>, faults: MemFaults, seed: u64) -> SimMemory {
        let state = State {
            rng: Rng::new(seed),
            faults,
            injected: Vec::new(),
            revoked_keys: HashSet::new(),
            revoked_spans: Vec::new(),
            lag: Duration::ZERO,
            slow_copies: 0,
        };
        SimMemory { inner, state: Mutex::new(state) }
    }

    /// The failures injected so far.
    pub fn injected(&self) -> Vec<Injected> {
        self.state.lock().unwrap().injected.clone()
    }

    /// Copies slowed down so far.
    pub fn slow_copies(&self) -> u64 {
        self.state.lock().unwrap().slow_copies
    }

    /// Simulated time the copies took since the last call.
    pub fn take_lag(&self) -> Duration {
        std::mem::take(&mut self.state.lock().unwrap().lag)
    }

    /// Checks the key, then maybe revokes it (its span still comes back:
    /// the revocation raced with the access).
    fn resolved(&self, key: u32, r: Result<Span, AccessError>) -> Result<Span, AccessError> {
        let span = r?;
        let Some(addr) = span.host_address(0) else { return Ok(span) };
        let mut st = self.state.lock().unwrap();
        if st.revoked_keys.contains(&key) {
            st.injected.push(Injected { addr, trouble: Trouble::Revoked });
            return Err(AccessError::BadKey);
        }
        let p = st.faults.revoke;
        if st.faults.budget > 0 && st.rng.chance(p) {
            st.faults.budget -= 1;
            st.revoked_keys.insert(key);
            st.revoked_spans.push((addr, span.len()));
        }
        Ok(span)
    }

    /// Before a copy at `span`'s byte `offset`: whether it fails (logged),
    /// else how long it takes.
    fn before_copy(&self, span: &Span, offset: usize) -> Option<Trouble> {
        let addr = span.host_address(offset)?;
        let mut st = self.state.lock().unwrap();
        if st.revoked_spans.iter().any(|&(a, n)| addr >= a && addr < a + n) {
            st.injected.push(Injected { addr, trouble: Trouble::Revoked });
            return Some(Trouble::Revoked);
        }
        let p = st.faults.fault;
        if st.faults.budget > 0 && st.rng.chance(p) {
            st.faults.budget -= 1;
            st.injected.push(Injected { addr, trouble: Trouble::Fault });
            return Some(Trouble::Fault);
        }
        let p = st.faults.slow;
        if st.rng.chance(p) {
            let max = st.faults.max_slow.as_nanos() as u64;
            let d = Duration::from_nanos(1 + st.rng.below(max));
            st.lag += d;
            st.slow_copies += 1;
        }
        None
    }

    /// How many bytes of a faulting write land first.
    fn prefix(&self, len: usize) -> usize {
        self.state.lock().unwrap().rng.below(len as u64 + 1) as usize
    }
}

impl MemoryAccess for SimMemory {
    fn resolve(&self, key: u32, pd: u32, iova: u64, len: u64, want: Want) -> Result<Span, AccessError> {
        self.resolved(key, self.inner.resolve(key, pd, iova, len, want))
    }

    fn resolve_remote(
        &self,
        key: u32,
        pd: u32,
        qpn: u32,
        iova: u64,
        len: u64,
        want: Want,
    ) -> Result<Span, AccessError> {
        self.resolved(key, self.inner.resolve_remote(key, pd, qpn, iova, len, want))
    }

    fn write(&self, span: &Span, offset: usize, data: &[u8]) -> Result<(), AccessError> {
        match self.before_copy(span, offset) {
            None => span.write(offset, data),
            Some(Trouble::Fault) => {
                let n = self.prefix(data.len());
                span.write(offset, &data[..n])?;
                Err(AccessError::Fault)
            }
            Some(Trouble::Revoked) => Err(AccessError::Fault),
        }
    }

    fn may_block(&self, span: &Span) -> bool {
        // ODP and peer memory, and, on seeds with slow copies, as many
        // other copies as are slow: they run as copy jobs, outside the
        // engine (`proto::copy`), when the engine defers them.
        if span.may_block() {
            return true;
        }
        let mut st = self.state.lock().unwrap();
        let p = st.faults.slow;
        st.rng.chance(p)
    }

    fn fault_in(&self, span: &Span, write: bool) {
        span.fault_in(write)
    }

    fn read(&self, span: &Span, offset: usize, out: &mut [u8]) -> Result<(), AccessError> {
        match self.before_copy(span, offset) {
            None => span.read(offset, out),
            Some(_) => Err(AccessError::Fault),
        }
    }

    fn atomic(&self, span: &Span, op: Atomic) -> Result<u64, AccessError> {
        match self.before_copy(span, 0) {
            None => MemoryAccess::atomic(&*self.inner, span, op),
            Some(_) => Err(AccessError::Fault),
        }
    }

    fn pin_for_send(&self, span: Span) -> Result<PayloadHold, Span> {
        // Payloads are copied, so that every read passes `read`.
        Err(span)
    }

    fn bind_mw(&self, qp_pd: u32, qpn: u32, r: &BindRequest) -> Result<u32, BindError> {
        self.inner.bind_mw(qp_pd, qpn, r)
    }

    fn umr(&self, key: u32, pd: u32, layout: Layout) -> Result<(), BindError> {
        self.inner.umr(key, pd, layout)
    }

    fn invalidate(&self, key: u32, pd: u32, qpn: u32) -> Result<(), BindError> {
        self.inner.invalidate(key, pd, qpn)
    }
}
