//! The copy workers of a device: threads that run the engine's copy jobs
//! (`proto::copy`: copies into and out of on-demand-paging and peer memory,
//! which may block) with no lock held, then give each back to its QP's
//! shard. A copy that waits for a page fault or a peer-memory client stops
//! only its own QP: receiving, posting and the other QPs of its shard go on.
//!
//! Workers start when jobs wait and none is idle, up to [`MAX_WORKERS`], and
//! live until the device shuts down. Jobs run in the order they came; a QP
//! has at most one job out at a time.

use crate::proto::{CopyJob, MemoryAccess};
use std::collections::VecDeque;
use std::sync::{Arc, Condvar, Mutex, Weak};
use std::thread::JoinHandle;

/// Most copy threads of one device: four copies may block at once (on
/// four peer-memory clients, say) before a fifth QP's job waits for one.
pub(super) const MAX_WORKERS: usize = 4;

/// What a worker does with a job it ran: its runtime's QP takes it.
pub(super) trait JobDone: Send + Sync + 'static {
    fn job_done(&self, job: Box<CopyJob>);
}

#[derive(Default)]
struct Queue {
    jobs: VecDeque<Box<CopyJob>>,
    idle: usize,
    workers: Vec<JoinHandle<()>>,
    shutdown: bool,
}

pub(super) struct Copier {
    queue: Mutex<Queue>,
    ready: Condvar,
    mem: Arc<dyn MemoryAccess>,
}

impl Copier {
    pub fn new(mem: Arc<dyn MemoryAccess>) -> Copier {
        Copier { queue: Mutex::default(), ready: Condvar::new(), mem }
    }

    /// Queues jobs (called with no engine lock held); starts a worker when
    /// none is idle. `owner` is who takes the jobs back.
    pub fn submit<O: JobDone>(self: &Arc<Self>, jobs: impl IntoIterator<Item = Box<CopyJob>>, owner: Weak<O>) {
        let mut q = self.queue.lock().unwrap();
        if q.shutdown {
            return;
        }
        let before = q.jobs.len();
        q.jobs.extend(jobs);
        let added = q.jobs.len() - before;
        if added == 0 {
            return;
        }
        if q.idle < q.jobs.len() && q.workers.len() < MAX_WORKERS {
            let me = Arc::downgrade(self);
            let o = owner.clone();
            match std::thread::Builder::new().name("uroce-copy".into()).spawn(move || worker(me, o)) {
                Ok(h) => q.workers.push(h),
                Err(e) if q.workers.is_empty() => {
                    // No worker at all: the caller runs the jobs (it holds
                    // no lock; they may block it, nothing else).
                    tracing::warn!("cannot start a copy worker ({e}): copying in the calling thread");
                    let jobs: Vec<_> = q.jobs.drain(..).collect();
                    drop(q);
                    for mut j in jobs {
                        j.run(&*self.mem);
                        match owner.upgrade() {
                            Some(o) => o.job_done(j),
                            None => return,
                        }
                    }
                    return;
                }
                // The workers there take it in turn.
                Err(e) => tracing::warn!("cannot start another copy worker: {e}"),
            }
        }
        drop(q);
        self.ready.notify_all();
    }

    /// Stops the workers after the job each is running (jobs not started
    /// are dropped: their QPs go away with the device) and joins them,
    /// except the calling thread if it is one.
    pub fn shutdown(&self) {
        let workers = {
            let mut q = self.queue.lock().unwrap();
            q.shutdown = true;
            q.jobs.clear();
            std::mem::take(&mut q.workers)
        };
        self.ready.notify_all();
        let me = std::thread::current().id();
        for h in workers {
            if h.thread().id() != me {
                let _ = h.join();
            }
        }
    }

    /// The next job, waiting for one; None at shutdown.
    fn next(&self) -> Option<Box<CopyJob>> {
        let mut q = self.queue.lock().unwrap();
        loop {
            if q.shutdown {
                return None;
            }
            if let Some(j) = q.jobs.pop_front() {
                return Some(j);
            }
            q.idle += 1;
            q = self.ready.wait(q).unwrap();
            q.idle -= 1;
        }
    }
}

fn worker<O: JobDone>(copier: Weak<Copier>, owner: Weak<O>) {
    loop {
        let Some(c) = copier.upgrade() else { return };
        let Some(mut job) = c.next() else { return };
        job.run(&*c.mem);
        drop(c);
        // The device may have gone meanwhile: then so has the QP.
        let Some(o) = owner.upgrade() else { return };
        o.job_done(job);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::{Duration, Instant};

    #[derive(Default)]
    struct Back {
        done: Mutex<Vec<(u32, bool, String)>>,
    }

    impl JobDone for Back {
        fn job_done(&self, job: Box<CopyJob>) {
            let name = std::thread::current().name().unwrap_or("").to_string();
            self.done.lock().unwrap().push((job.qpn(), job.has_run(), name));
        }
    }

    #[test]
    fn jobs_run_on_at_most_four_workers_and_come_back_then_shutdown_joins_them() {
        let copier = Arc::new(Copier::new(Arc::new(crate::mem::Memory::default())));
        let back = Arc::new(Back::default());
        for q in 0..10 {
            copier.submit([CopyJob::nothing(q)], Arc::downgrade(&back));
        }
        let t = Instant::now();
        while back.done.lock().unwrap().len() < 10 {
            assert!(t.elapsed() < Duration::from_secs(10), "jobs did not come back");
            std::thread::sleep(Duration::from_millis(1));
        }
        let done = back.done.lock().unwrap().clone();
        assert!(done.iter().all(|(_, ran, name)| *ran && name == "uroce-copy"), "{done:?}");
        let mut qpns: Vec<u32> = done.iter().map(|d| d.0).collect();
        qpns.sort();
        assert_eq!(qpns, (0..10).collect::<Vec<_>>());
        let workers = copier.queue.lock().unwrap().workers.len();
        assert!((1..=MAX_WORKERS).contains(&workers), "{workers} workers");
        copier.shutdown();
        assert!(copier.queue.lock().unwrap().workers.is_empty());
        // After shutdown, nothing runs.
        copier.submit([CopyJob::nothing(99)], Arc::downgrade(&back));
        std::thread::sleep(Duration::from_millis(20));
        assert_eq!(back.done.lock().unwrap().len(), 10);
    }
}
