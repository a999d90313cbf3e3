//! A simulated node: one sans-IO engine at an IP address, its memory (on
//! some seeds reached through the fault-injecting [`SimMemory`]), and
//! its completion queues: one for every QP's send completions and the RC
//! receives, one for the receives of its XRC SRQs. It hands what the
//! engine transmits to the fabric; the simulation delivers to it.

use super::memory::{MemFaults, SimMemory};
use super::Fabric;
use std::net::IpAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};
use uroce::ib::{Mtu, QpState};
use uroce::mem::Memory;
use uroce::proto::cq::CompletionQueue;
use uroce::proto::{CopyJob, Engine, EngineConfig, MemoryAccess};

/// The protection domain of every QP, SRQ and key.
pub const PD: u32 = 1;
/// The RoCEv2 UDP port of every node.
pub const PORT: u16 = 4791;
/// Inline receive: SENDs up to this size travel in their completions.
const INLINE_RECV: usize = 32;

pub struct Node {
    pub ip: IpAddr,
    pub engine: Engine,
    /// The memory itself, for the test's own setup and checks.
    pub mem: Arc<Memory>,
    /// What the engine reaches memory through, when faults are injected.
    pub sim_mem: Option<Arc<SimMemory>>,
    /// Send completions of every QP, and receives of RC QPs.
    pub cq: Arc<CompletionQueue>,
    /// The CQ of this node's XRC SRQs: the receives of its XRC_RECV QPs
    /// complete here, never on `cq`.
    pub xrc_cq: Arc<CompletionQueue>,
    /// The number the next XRC SRQ gets.
    next_srqn: u32,
    /// What the engine reaches memory through (the copy jobs too).
    access: Arc<dyn MemoryAccess>,
    /// Copy jobs the engine asked for (copies that may block: ODP, and
    /// slow copies on seeds with memory trouble), each run when its time
    /// comes, as a runtime's copy worker would.
    copies: Vec<(Instant, Box<CopyJob>)>,
    /// Jobs run so far.
    pub copies_run: u64,
}

impl Node {
    pub fn new(ip: IpAddr, mtu: Mtu) -> Node {
        Node::with_faults(ip, mtu, None)
    }

    /// A node whose engine reaches its memory through a [`SimMemory`]
    /// injecting `faults` (drawn from `faults.1`'s seed), or directly.
    pub fn with_faults(ip: IpAddr, mtu: Mtu, faults: Option<(MemFaults, u64)>) -> Node {
        // Keys and QPNs from the address: a seed replays exactly.
        let seed = match ip {
            IpAddr::V4(v4) => u32::from(v4) as u64,
            IpAddr::V6(v6) => u128::from(v6) as u64,
        };
        let mem = Memory::with_key_seed(seed);
        let mut cfg = EngineConfig::new(ip, PORT, mtu);
        cfg.id_seed = seed;
        cfg.defer_blocking_copies = true;
        let sim_mem = faults.map(|(f, s)| Arc::new(SimMemory::new(mem.clone(), f, s)));
        let access: Arc<dyn MemoryAccess> = match &sim_mem {
            Some(m) => m.clone(),
            None => mem.clone(),
        };
        let mut engine = Engine::new(cfg, access.clone());
        // Its applications are always there to answer: ACKs may be held
        // for them (`proto::ack`), and the seeds check that this is safe.
        engine.set_app_active(true);
        // Inline receive on for both: small SENDs travel in their completions.
        let cq = Arc::new(CompletionQueue::with_inline(1, 1 << 16, Some(mem.clone()), INLINE_RECV));
        let xrc_cq = Arc::new(CompletionQueue::with_inline(2, 1 << 16, Some(mem.clone()), INLINE_RECV));
        Node { ip, engine, mem, sim_mem, cq, xrc_cq, next_srqn: 0x100, access, copies: Vec::new(), copies_run: 0 }
    }

    /// A fresh XRC SRQ number of this node.
    pub fn next_srqn(&mut self) -> u32 {
        self.next_srqn += 1;
        self.next_srqn - 1
    }

    /// Hands every packet the engine has to the fabric.
    pub fn transmit(&mut self, now: Instant, fabric: &mut Fabric) {
        while let Some(t) = self.engine.poll_transmit(now) {
            fabric.send(now, self.ip, t.dst.ip(), t.data);
        }
    }

    /// Takes the engine's new copy jobs (each due after a time that grows
    /// with its length: 1 µs and 1 ns per byte) and runs those due by
    /// `now`, giving each back to the engine. True if one ran.
    pub fn run_copies(&mut self, now: Instant) -> bool {
        while let Some(j) = self.engine.poll_copy() {
            let due = now + Duration::from_nanos(1000 + j.len() as u64);
            self.copies.push((due, j));
        }
        let mut ran = false;
        while let Some(i) = self.copies.iter().position(|(t, _)| *t <= now) {
            let (_, mut job) = self.copies.remove(i);
            job.run(&*self.access);
            self.engine.copy_done(now, job);
            self.copies_run += 1;
            ran = true;
        }
        ran
    }

    /// When the next copy job is due (`now` for jobs the engine has yet
    /// to hand over).
    pub fn next_copy(&self, now: Instant) -> Option<Instant> {
        if self.engine.has_copies() {
            return Some(now);
        }
        self.copies.iter().map(|(t, _)| *t).min()
    }

    pub fn qp_state(&self, qpn: u32) -> QpState {
        self.engine.qp(qpn).map_or(QpState::Reset, |q| q.state())
    }
}

/// Everything node `from` of a pair sends now, handed to the other node
/// straight (a perfect wire) unless `lose`; the packets, for the caller to
/// look at. (The engine-level tests' wire; `tests/sim.rs` has a fabric.)
#[allow(dead_code)]
pub fn exchange(nodes: &mut [Node; 2], from: usize, now: Instant, lose: bool) -> Vec<uroce::proto::Transmit> {
    let out: Vec<_> = std::iter::from_fn(|| nodes[from].engine.poll_transmit(now)).collect();
    if !lose {
        let src = std::net::SocketAddr::new(nodes[from].ip, PORT);
        let to = &mut nodes[1 - from];
        let ip = to.ip;
        for t in &out {
            to.engine.handle_datagram(now, src, ip, &t.data);
        }
    }
    out
}
