//! Copies that may block, run outside the engine.
//!
//! A copy into or out of on-demand-paging memory may wait for the kernel
//! to fault pages in, and one through a peer-memory client waits for the
//! client (a GPU copy, a file). Run inside an engine pass, such a copy
//! would hold the locks that every other QP of the engine needs. So when
//! the engine may defer ([`super::EngineConfig::defer_blocking_copies`]),
//! a state machine that meets a span that may block
//! ([`MemoryAccess::may_block`]) does not copy: it asks for a
//! [`CopyJob`] and returns as if the input had not arrived (nothing of the
//! QP changed that a second run of the same input would not redo). The
//! engine parks the input (a received packet, in order with the QP's later
//! ones; a packet build simply returns nothing); the runtime takes the job
//! ([`super::Engine::poll_copy`]), runs it with no lock held
//! ([`CopyJob::run`]) and gives it back ([`super::Engine::copy_done`]);
//! the engine then runs the parked input again, and the copy it asks for
//! is answered with the job's result ([`Copies`]) instead of being made
//! again. A fault in the job's copy takes the same path as a fault found
//! at once: the input is refused, the work request fails. Meanwhile the
//! QP's other work goes on (local work requests, requests and responses
//! that need no such copy).
//!
//! Each QP has at most one job outstanding (another copy that may block
//! waits for it without a job), and a job's result is only taken by the
//! same request: a [`Fingerprint`] (place, PSN, length, address) ties
//! them, so an input that changed the QP meanwhile (a retry that rewound
//! the send queue) asks afresh. A job also faults in the rest of its
//! message, so that one job serves a message into never-touched pages.

use super::memory::{Atomic, MemoryAccess};
use crate::mem::{AccessError, Span};
use crate::wire::IpInfo;
use smallvec::SmallVec;
use std::collections::VecDeque;

/// Most packets parked behind a QP's copy job; later ones are dropped
/// (counted in `rx_drop_busy`): a reliable sender sends them again. A
/// send window (128 PSNs) fits.
pub(crate) const MAX_PARKED: usize = 256;

/// The most of a message's rest a copy job faults in ahead (256 pages):
/// bounded so that one job of a huge message does not hold its worker long.
pub(crate) const AHEAD_MAX: u64 = 1 << 20;

/// Most finished jobs' results a QP keeps for their requests.
const MAX_DONE: usize = 4;

/// A received packet that waits behind its QP's copy job: checked (ICRC
/// included), owned.
#[derive(Debug)]
pub(crate) struct Parked {
    pub(crate) ip: IpInfo,
    pub(crate) data: Vec<u8>,
}

/// Which request a copy belongs to: a result is taken only by the request
/// that asked for it (the same place in the state machines, the same
/// packet, length and address).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Fingerprint {
    pub site: Site,
    pub psn: u32,
    pub len: u64,
    pub addr: u64,
}

/// The places in the state machines that copy.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Site {
    /// Requester: a request's payload.
    SendPayload,
    /// Completer: a READ response's payload, an atomic's original value.
    ReadScatter,
    AtomicResult,
    /// Responder: a SEND's payload, a WRITE's, an atomic, a UD receive,
    /// a READ response's payload.
    RecvScatter,
    Write,
    Atomic,
    UdRecv,
    ReadResponse,
}

/// What a copy job does.
#[derive(Debug)]
enum Work {
    /// `data` into the spans, one after another.
    Write,
    /// The spans, one after another, into `data`.
    Read,
    /// An 8-byte atomic on the first span.
    Atomic(Atomic),
}

/// A copy that may block, to run outside the engine's locks (see the
/// module documentation).
#[derive(Debug)]
pub struct CopyJob {
    pub(crate) qpn: u32,
    pub(crate) id: u32,
    pub(crate) fp: Fingerprint,
    work: Work,
    spans: SmallVec<[Span; 2]>,
    data: Vec<u8>,
    result: Option<Result<u64, AccessError>>,
    /// The rest of the message, to fault in once the copy is done (a
    /// write if `.1`): its other packets then copy at once.
    ahead: Option<(Span, bool)>,
}

impl CopyJob {
    /// The QP that waits for this job.
    pub fn qpn(&self) -> u32 {
        self.qpn
    }

    #[cfg(any(test, feature = "unstable"))]
    /// The bytes it moves.
    pub fn len(&self) -> usize {
        self.data.len()
    }

    #[cfg(any(test, feature = "unstable"))]
    pub fn is_empty(&self) -> bool {
        self.data.is_empty()
    }

    /// Runs the copy. It may block: call it with no lock held.
    pub fn run(&mut self, mem: &dyn MemoryAccess) {
        let mut at = 0;
        let r = match self.work {
            Work::Write => self
                .spans
                .iter()
                .try_for_each(|s| {
                    let r = mem.write(s, 0, &self.data[at..at + s.len()]);
                    at += s.len();
                    r
                })
                .map(|()| 0),
            Work::Read => {
                let data = &mut self.data;
                self.spans
                    .iter()
                    .try_for_each(|s| {
                        let r = mem.read(s, 0, &mut data[at..at + s.len()]);
                        at += s.len();
                        r
                    })
                    .map(|()| 0)
            }
            Work::Atomic(op) => mem.atomic(&self.spans[0], op),
        };
        if r.is_ok() {
            if let Some((span, write)) = &self.ahead {
                mem.fault_in(span, *write);
            }
        }
        self.result = Some(r);
        // The regions are released now: deregistration need not wait for
        // the engine to take the result.
        self.spans.clear();
        self.ahead = None;
    }

    /// A job that copies nothing, for QP `qpn` (tests of job runners).
    #[cfg(test)]
    pub(crate) fn nothing(qpn: u32) -> Box<CopyJob> {
        let fp = Fingerprint { site: Site::Write, psn: 0, len: 0, addr: 0 };
        Box::new(CopyJob {
            qpn,
            id: 1,
            fp,
            work: Work::Write,
            spans: SmallVec::new(),
            data: Vec::new(),
            result: None,
            ahead: None,
        })
    }

    #[cfg(any(test, feature = "unstable"))]
    /// Whether the job has run.
    pub fn has_run(&self) -> bool {
        self.result.is_some()
    }

    /// A job that was run, as the result its request takes.
    pub(crate) fn into_done(self) -> Done {
        Done { fp: self.fp, result: self.result.unwrap_or(Err(AccessError::Fault)), data: self.data }
    }
}

/// A finished job's result, waiting for its request to run again.
#[derive(Debug)]
pub(crate) struct Done {
    fp: Fingerprint,
    result: Result<u64, AccessError>,
    /// What a read copied.
    data: Vec<u8>,
}

/// Why a copy did not happen.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum CopyError {
    /// The access failed (a fault, or a key revoked since its check).
    Access(AccessError),
    /// The copy may block: a job was asked for, the input waits for it.
    Deferred,
}

impl From<AccessError> for CopyError {
    fn from(e: AccessError) -> CopyError {
        CopyError::Access(e)
    }
}

/// A QP's copies that may block, kept beside the QP by the engine and lent
/// to each of its inputs (the [`super::Ctx`]): whether it may defer, the
/// job it waits for and the one an input asks for, the results of
/// finished jobs not yet taken, whether a packet build waits, and the
/// packets parked behind the job (the one that asked for it first).
#[derive(Debug)]
pub(crate) struct Copies {
    qpn: u32,
    defer: bool,
    pub(crate) waiting: Option<u32>,
    pub(crate) build_waits: bool,
    /// The input that asked for the job was answered with an RNR NAK (a
    /// responder's page fault): the engine does not park it, the requester
    /// sends it again.
    pub(crate) nakked: bool,
    next_id: u32,
    pub(crate) done: SmallVec<[Box<Done>; 1]>,
    pub(crate) job: Option<Box<CopyJob>>,
    pub(crate) parked: VecDeque<Parked>,
}

impl Copies {
    /// QP `qpn`'s, deferring copies that may block if `defer`.
    pub(crate) fn new(qpn: u32, defer: bool) -> Copies {
        Copies {
            qpn,
            defer,
            waiting: None,
            build_waits: false,
            nakked: false,
            next_id: 0,
            done: SmallVec::new(),
            job: None,
            parked: VecDeque::new(),
        }
    }

    /// Keeps a finished job's result for its request; the oldest of too
    /// many goes (its request changed, a retry rewound it: it asks again).
    pub(crate) fn put(&mut self, d: Done) {
        if self.done.len() >= MAX_DONE {
            self.done.remove(0);
        }
        self.done.push(Box::new(d));
    }

    /// Forgets what waited (the QP was reset): a job still out finds no
    /// QP waiting for it. Returns how many parked packets went.
    pub(crate) fn clear(&mut self) -> usize {
        self.waiting = None;
        self.build_waits = false;
        self.done.clear();
        let n = self.parked.len();
        self.parked.clear();
        n
    }

    /// The finished job's result for the request `fp`, if there is one.
    /// Results for other requests stay: a READ response's bytes wait while
    /// the packets parked behind the job run first (and may ask for jobs of
    /// their own).
    fn take(&mut self, fp: Fingerprint) -> Option<Box<Done>> {
        let i = self.done.iter().position(|d| d.fp == fp)?;
        Some(self.done.remove(i))
    }

    /// Whether a copy through `spans` has to become a job.
    fn must_defer(&self, mem: &dyn MemoryAccess, spans: &[Span]) -> bool {
        self.defer && spans.iter().any(|s| mem.may_block(s))
    }

    fn ask(&mut self, fp: Fingerprint, work: Work, spans: SmallVec<[Span; 2]>, data: Vec<u8>) -> CopyError {
        if self.waiting.is_some() || self.job.is_some() {
            // One job per QP: this copy waits for the QP's job to be done.
            // A packet build that waits goes first then, before the parked
            // packets (which could ask for job after job and starve it).
            if matches!(fp.site, Site::SendPayload | Site::ReadResponse) {
                self.build_waits = true;
            }
            return CopyError::Deferred;
        }
        self.next_id = self.next_id.wrapping_add(1);
        self.job = Some(Box::new(CopyJob {
            qpn: self.qpn,
            id: self.next_id,
            fp,
            work,
            spans,
            data,
            result: None,
            ahead: None,
        }));
        CopyError::Deferred
    }

    /// Writes `data` into `spans` (in order, each span taking its length),
    /// now or as a job.
    pub(crate) fn write(
        &mut self,
        mem: &dyn MemoryAccess,
        fp: Fingerprint,
        spans: SmallVec<[Span; 2]>,
        data: &[u8],
    ) -> Result<(), CopyError> {
        if let Some(d) = self.take(fp) {
            return d.result.map(|_| ()).map_err(CopyError::Access);
        }
        if self.must_defer(mem, &spans) {
            return Err(self.ask(fp, Work::Write, spans, data.to_vec()));
        }
        let mut at = 0;
        for s in &spans {
            mem.write(s, 0, &data[at..at + s.len()])?;
            at += s.len();
        }
        Ok(())
    }

    /// Reads `spans` (in order) into `out`, now or as a job.
    pub(crate) fn read(
        &mut self,
        mem: &dyn MemoryAccess,
        fp: Fingerprint,
        spans: SmallVec<[Span; 2]>,
        out: &mut [u8],
    ) -> Result<(), CopyError> {
        if let Some(d) = self.take(fp) {
            d.result.map_err(CopyError::Access)?;
            if d.data.len() != out.len() {
                return Err(CopyError::Access(AccessError::Range));
            }
            out.copy_from_slice(&d.data);
            return Ok(());
        }
        if self.must_defer(mem, &spans) {
            return Err(self.ask(fp, Work::Read, spans, vec![0; out.len()]));
        }
        let mut at = 0;
        for s in &spans {
            mem.read(s, 0, &mut out[at..at + s.len()])?;
            at += s.len();
        }
        Ok(())
    }

    /// Gives the job just asked for the rest of its message (`span`), to
    /// fault in after its copy (a write if `write`), so that one job serves
    /// the message rather than one per packet. At most [`AHEAD_MAX`] bytes
    /// are worth it (the caller bounds `span`).
    pub(crate) fn ahead(&mut self, span: Span, write: bool) {
        if let Some(job) = &mut self.job {
            job.ahead.get_or_insert((span, write));
        }
    }

    /// Whether a finished job's result waits for `fp` (then the request
    /// takes it, through the slot, instead of copying by another path).
    pub(crate) fn holds(&self, fp: Fingerprint) -> bool {
        self.done.iter().any(|d| d.fp == fp)
    }

    /// Whether a copy for `fp` through `spans` goes through this slot: a
    /// finished job's result waits for it, or it must become a job.
    pub(crate) fn wants_job(&self, mem: &dyn MemoryAccess, fp: Fingerprint, spans: &[Span]) -> bool {
        self.holds(fp) || self.must_defer(mem, spans)
    }

    /// Runs `op` on the first 8 bytes of `span`, now or as a job.
    pub(crate) fn atomic(
        &mut self,
        mem: &dyn MemoryAccess,
        fp: Fingerprint,
        span: Span,
        op: Atomic,
    ) -> Result<u64, CopyError> {
        if let Some(d) = self.take(fp) {
            return d.result.map_err(CopyError::Access);
        }
        if self.must_defer(mem, std::slice::from_ref(&span)) {
            let mut spans = SmallVec::new();
            spans.push(span);
            return Err(self.ask(fp, Work::Atomic(op), spans, Vec::new()));
        }
        Ok(mem.atomic(&span, op)?)
    }
}
