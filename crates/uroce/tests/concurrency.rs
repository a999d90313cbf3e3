//! Threads posting, polling, querying, creating and destroying QPs and
//! closing the devices, all at once (the runtime's per-shard locks, see
//! "Locks" in docs/architecture.md): nothing deadlocks, every posted WRITE
//! completes, and the devices go when their last handle does, in whichever
//! thread that is. A watchdog fails the test with a message instead of
//! letting it hang.

mod common;

use common::*;
use std::sync::mpsc;
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};
use uroce::verbs::*;

/// Runs `f` in a thread; fails if it has not returned within `limit`.
fn watchdog(limit: Duration, what: &'static str, f: impl FnOnce() + Send + 'static) {
    let (tx, rx) = mpsc::channel();
    let h = thread::spawn(move || {
        f();
        let _ = tx.send(());
    });
    match rx.recv_timeout(limit) {
        Ok(()) => h.join().unwrap(),
        Err(mpsc::RecvTimeoutError::Disconnected) => {
            if let Err(p) = h.join() {
                std::panic::resume_unwind(p);
            }
        }
        Err(mpsc::RecvTimeoutError::Timeout) => panic!("deadlock: {what} did not finish within {limit:?}"),
    }
}

/// A connected RC pair on `a` and `b` with its own CQs (`a`'s on a
/// completion channel when `channel`), a source on `a` and a target on `b`.
struct Link {
    cq: CompletionQueue,
    ch: Option<CompletionChannel>,
    qp: QueuePair,
    peer: QueuePair,
    src: MemoryRegion,
    dst: MemoryRegion,
}

fn link(a: &Context, b: &Context, channel: bool) -> Link {
    let (pa, pb) = (a.alloc_pd().unwrap(), b.alloc_pd().unwrap());
    let ch = channel.then(|| a.create_comp_channel().unwrap());
    let cq = a.create_cq(64, ch.as_ref()).unwrap();
    let cq_b = b.create_cq(64, None).unwrap();
    let qp = pa.create_qp(&QpInitAttr::rc(&cq, &cq)).unwrap();
    let peer = pb.create_qp(&QpInitAttr::rc(&cq_b, &cq_b)).unwrap();
    qp.connect_rc(&b.query_gid(0).unwrap(), peer.qp_num(), 1, 2).unwrap();
    peer.connect_rc(&a.query_gid(0).unwrap(), qp.qp_num(), 2, 1).unwrap();
    let src = pa.register(vec![3u8; 64], Access::LOCAL_WRITE).unwrap();
    let dst = pb.register(vec![0u8; 64], Access::LOCAL_WRITE | Access::REMOTE_WRITE).unwrap();
    Link { cq, ch, qp, peer, src, dst }
}

impl Link {
    /// One 64-byte WRITE, waited for (through the channel when there is
    /// one). Returns whether it completed within `T`.
    fn write(&self, id: u64) -> bool {
        let mut w = wr(id, WrOpcode::RdmaWrite, self.src.sge(0, 64));
        w.remote_addr = self.dst.addr();
        w.rkey = self.dst.rkey();
        if let Some(ch) = &self.ch {
            self.cq.req_notify(false).unwrap();
            self.qp.post_send(&w).unwrap();
            let t = Instant::now();
            while t.elapsed() < T {
                if let Some(wc) = self.cq.poll_one() {
                    return wc.wr_id == id && wc.status == WcStatus::Success;
                }
                let _ = ch.wait(Duration::from_millis(5));
            }
            return false;
        }
        self.qp.post_send(&w).unwrap();
        matches!(self.cq.wait(1, T).as_deref(), Ok([wc]) if wc.wr_id == id && wc.status == WcStatus::Success)
    }

    /// Posts a WRITE and does not wait: the QPs are destroyed with it in
    /// flight.
    fn write_and_leave(&self, id: u64) {
        let mut w = wr(id, WrOpcode::RdmaWrite, self.src.sge(0, 64));
        w.remote_addr = self.dst.addr();
        w.rkey = self.dst.rkey();
        self.qp.post_send(&w).unwrap();
        let _ = &self.peer;
    }
}

const ROUNDS: usize = 50;
const WRITES: u64 = 30;
const CHURN: usize = 25;

#[test]
fn posting_polling_destroying_and_closing_at_once_never_deadlocks() {
    watchdog(Duration::from_secs(120), "the stress rounds", || {
        let started = Instant::now();
        let mut iterations = 0usize;
        for round in 0..ROUNDS {
            if started.elapsed() > Duration::from_secs(60) {
                break; // a very slow machine: what ran counts
            }
            let (a, b) = pair_with(None);
            let (a, b) = (Arc::new(a), Arc::new(b));
            let mut workers: Vec<thread::JoinHandle<usize>> = Vec::new();
            // Posters: each its own QP pair (different shards, mostly), one
            // of them waiting on a completion channel; the last WRITE of
            // each is left in flight when its QPs go.
            for p in 0..3 {
                let (a, b) = (a.clone(), b.clone());
                workers.push(thread::spawn(move || {
                    let l = link(&a, &b, p == 0);
                    drop((a, b));
                    for i in 0..WRITES {
                        assert!(l.write(i), "round {round}: poster {p}'s WRITE {i} did not complete");
                    }
                    l.write_and_leave(WRITES);
                    WRITES as usize
                }));
            }
            // Churn: QPs created, moved to INIT and destroyed on both devices.
            {
                let (a, b) = (a.clone(), b.clone());
                workers.push(thread::spawn(move || {
                    let (pa, pb) = (a.alloc_pd().unwrap(), b.alloc_pd().unwrap());
                    let (ca, cb) = (a.create_cq(8, None).unwrap(), b.create_cq(8, None).unwrap());
                    for _ in 0..CHURN {
                        let q = pa.create_qp(&QpInitAttr::rc(&ca, &ca)).unwrap();
                        let r = pb.create_qp(&QpInitAttr::rc(&cb, &cb)).unwrap();
                        q.connect_rc(&b.query_gid(0).unwrap(), r.qp_num(), 5, 6).unwrap();
                        drop(q);
                        drop(r);
                    }
                    CHURN
                }));
            }
            // Queries over every shard (device counters, QP listings) while
            // the others run; they hold the last device handles at times.
            {
                let (a, b) = (a.clone(), b.clone());
                workers.push(thread::spawn(move || {
                    let mut n = 0;
                    for _ in 0..CHURN {
                        let _ = (a.stats(), b.stats());
                        n += 1;
                        thread::yield_now();
                    }
                    n
                }));
            }
            // This thread closes its handles at once: the devices go with
            // whichever worker lets go last.
            drop((a, b));
            for w in workers {
                iterations += w.join().expect("a worker failed");
            }
        }
        assert!(iterations >= 1000, "only {iterations} iterations ran");
        eprintln!("{iterations} iterations in {:?}", started.elapsed());
    });
}

/// Closing a device from a thread while another busy-polls its CQ (and so
/// runs receive passes and delivers events) with a WRITE in flight.
#[test]
fn closing_while_another_thread_polls_never_deadlocks() {
    watchdog(Duration::from_secs(60), "close while polling", || {
        for _ in 0..20 {
            let (a, b) = pair_with(None);
            let l = Arc::new(link(&a, &b, true));
            let poller = {
                let l = l.clone();
                thread::spawn(move || {
                    let t = Instant::now();
                    while t.elapsed() < Duration::from_millis(20) {
                        let _ = l.cq.poll_one();
                    }
                })
            };
            l.write_and_leave(1);
            drop((a, b, l));
            poller.join().unwrap();
        }
    });
}
