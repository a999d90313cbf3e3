//! Copy jobs at the engine level (`proto::copy`): a WRITE into ODP pages the
//! device has not translated becomes a job; the QP's later packets wait
//! behind it in order, at most 256 of them (more are dropped and counted);
//! once the job is done they run, and the ACK covers them all. A job given
//! back after its QP was reset or destroyed changes nothing.

#[path = "simnet/mod.rs"]
#[allow(dead_code)]
mod simnet;

use simnet::buf::Buf;
use simnet::conn::{Conn, ConnParams};
use simnet::node::{Node, PORT};
use std::net::SocketAddr;
use std::time::Instant;
use uroce::ib::{Access, Mtu, QpAttrMask, QpState, Sge, WcStatus};
use uroce::proto::wr::{QpAttr, SendWr, WrOpcode};
use uroce::proto::{CopyJob, Transmit};
use uroce::wire::{AethKind, Opcode, Packet};

/// Node 0 writes from pinned memory into node 1's ODP buffer (never
/// touched: every page untranslated).
struct World {
    nodes: [Node; 2],
    conn: Conn,
    src_key: u32,
    dst_key: u32,
    // Dropped after `nodes`, whose keys cover them.
    src: Buf,
    dst: Buf,
}

fn world() -> World {
    let now = Instant::now();
    let mut nodes = [Node::new([10, 0, 1, 1].into(), Mtu::Mtu1024), Node::new([10, 0, 1, 2].into(), Mtu::Mtu1024)];
    let conn =
        Conn::new(&mut nodes, 0, now, ConnParams { xrc: false, psns: (500, 900), mtu: Mtu::Mtu1024, retry: (14, 7) });
    let src = Buf::new(64 * 1024, |i| (i % 253) as u8);
    let dst = Buf::new(64 * 1024, |_| 0);
    // SAFETY: the buffers outlive the nodes' use of the keys (see `World`).
    let src_key = unsafe { src.register(&nodes[0].mem, Access::LOCAL_WRITE) };
    let dst_key = dst.register_odp(&nodes[1].mem, Access::LOCAL_WRITE | Access::REMOTE_WRITE | Access::REMOTE_READ);
    World { nodes, conn, src_key, dst_key, src, dst }
}

impl World {
    fn write(&mut self, now: Instant, id: u64, off: u64, len: u32) {
        self.post(now, WrOpcode::RdmaWrite, id, off, len);
    }

    fn post(&mut self, now: Instant, op: WrOpcode, id: u64, off: u64, len: u32) {
        let mut wr = SendWr::new(id, op);
        wr.sg_list = uroce::sgl![Sge { addr: self.src.addr() + off, length: len, lkey: self.src_key }];
        wr.remote_addr = self.dst.addr() + off;
        wr.rkey = self.dst_key;
        self.nodes[0].engine.post_send(now, self.conn.req_qpn, wr).unwrap();
    }

    /// What node `from` sends now (not delivered).
    fn out(&mut self, from: usize, now: Instant) -> Vec<Transmit> {
        std::iter::from_fn(|| self.nodes[from].engine.poll_transmit(now)).collect()
    }

    fn deliver(&mut self, from: usize, now: Instant, packets: &[Transmit]) {
        let src = SocketAddr::new(self.nodes[from].ip, PORT);
        let to = &mut self.nodes[1 - from];
        let ip = to.ip;
        for t in packets {
            to.engine.handle_datagram(now, src, ip, &t.data);
        }
    }

    /// What node 1 sends once the deadline of an ACK it holds (for an
    /// answer that does not come) has passed.
    fn after_hold(&mut self, now: Instant) -> Vec<Transmit> {
        let later = now + std::time::Duration::from_millis(1);
        self.nodes[1].engine.handle_timeout(later);
        self.out(1, later)
    }

    /// Runs node 1's copy jobs and gives them back at `now`: the test's
    /// clock, never the real one (a loaded machine would move that past the
    /// deadlines the test steps to).
    fn jobs(&mut self, now: Instant) -> usize {
        let mut n = 0;
        while let Some(mut j) = self.nodes[1].engine.poll_copy() {
            // As a copy worker would, with no lock held.
            j.run(&*self.nodes[1].mem);
            self.nodes[1].engine.copy_done(now, j);
            n += 1;
        }
        n
    }
}

fn acks(packets: &[Transmit]) -> Vec<u32> {
    packets
        .iter()
        .filter_map(|t| Packet::parse(&t.data).ok())
        .filter(|p| {
            p.headers.bth.opcode == Opcode::RC_ACK
                && matches!(p.headers.aeth.map(|a| a.kind()), Some(AethKind::Ack { .. }))
        })
        .map(|p| p.headers.bth.psn)
        .collect()
}

#[test]
fn packets_wait_behind_a_copy_job_in_order_and_one_ack_covers_them() {
    let now = Instant::now();
    let mut w = world();
    // Three WRITEs into one untranslated page, and one into another.
    w.write(now, 1, 0, 512);
    w.write(now, 2, 512, 512);
    w.write(now, 3, 1024, 1024);
    w.write(now, 4, 16384, 100);
    let sent = w.out(0, now);
    assert_eq!(sent.len(), 4);
    w.deliver(0, now, &sent);
    // The first asked for a job; the others wait behind it; nothing is
    // acknowledged yet and nothing was written.
    assert!(acks(&w.out(1, now)).is_empty());
    assert_eq!(w.dst.contents()[..2048], [0u8; 2048]);
    let s = w.nodes[1].engine.stats();
    assert_eq!((s.copies_deferred, s.rx_packets), (1, 4), "{s:?}");
    // The job runs; the parked WRITEs run in order: the second and third
    // find the page translated now, the fourth asks for a job of its own.
    assert_eq!(w.jobs(now), 2);
    assert_eq!(w.nodes[1].engine.stats().copies_deferred, 2);
    // (The ACK is held for an answer: its deadline passes.)
    let out = w.after_hold(now);
    assert_eq!(acks(&out).last(), Some(&503), "the last ACK covers all four WRITEs");
    w.deliver(1, now, &out);
    let wcs: Vec<(u64, WcStatus)> =
        std::iter::from_fn(|| w.nodes[0].cq.poll_one()).map(|c| (c.wr_id, c.status)).collect();
    assert_eq!(wcs, (1..=4).map(|i| (i, WcStatus::Success)).collect::<Vec<_>>());
    let (src, dst) = (w.src.contents(), w.dst.contents());
    assert_eq!(dst[..2048], src[..2048]);
    assert_eq!(dst[16384..16484], src[16384..16484]);
    assert_eq!(dst[2048..16384], [0u8; 14336], "nothing written outside the WRITEs");
    assert_eq!(w.nodes[1].engine.stats().rx_drop_busy, 0);
}

#[test]
fn at_most_256_packets_wait_behind_a_job_the_rest_are_dropped_and_counted() {
    let now = Instant::now();
    let mut w = world();
    w.write(now, 1, 0, 64);
    let sent = w.out(0, now);
    // The WRITE, then 299 copies of it (as a fabric duplicating it would).
    for _ in 0..300 {
        w.deliver(0, now, &sent);
    }
    let s = w.nodes[1].engine.stats();
    assert_eq!((s.copies_deferred, s.rx_drop_busy, s.rx_packets), (1, 300 - 256, 300), "{s:?}");
    assert_eq!(w.jobs(now), 1);
    // Executed once; its copies were duplicates, answered with ACKs.
    let s = w.nodes[1].engine.stats();
    assert_eq!(s.rx_duplicates, 255, "{s:?}");
    let out = w.after_hold(now);
    assert!(acks(&out).iter().all(|&p| p == 500) && !acks(&out).is_empty());
    assert_eq!(w.dst.contents()[..64], w.src.contents()[..64]);
}

/// A world whose WRITE into untranslated pages asked for a job, and that
/// job, run but not given back.
fn held_job(now: Instant) -> (World, Box<CopyJob>) {
    let mut w = world();
    w.write(now, 1, 0, 64);
    let sent = w.out(0, now);
    w.deliver(0, now, &sent);
    let mut job = w.nodes[1].engine.poll_copy().expect("a job");
    job.run(&*w.nodes[1].mem);
    (w, job)
}

#[test]
fn a_job_given_back_after_its_qp_was_reset_or_destroyed_changes_nothing() {
    let now = Instant::now();
    // Reset: what waited goes; the job finds no QP waiting for it.
    let (mut w, job) = held_job(now);
    let reset = QpAttr { qp_state: QpState::Reset, ..QpAttr::default() };
    w.nodes[1].engine.modify_qp(now, w.conn.resp_qpn, &reset, QpAttrMask::STATE).unwrap();
    w.nodes[1].engine.copy_done(now, job);
    assert!(w.out(1, now).is_empty());
    // A job of a destroyed QP is dropped.
    let (mut w, job) = held_job(now);
    w.nodes[1].engine.destroy_qp(w.conn.resp_qpn).unwrap();
    w.nodes[1].engine.copy_done(now, job);
    assert!(w.out(1, now).is_empty());
    assert_eq!(w.nodes[1].engine.qp_count(), 0);
}

/// Everything both nodes send until both are quiet (at most 1000 rounds),
/// running node 1's copy jobs as they come; returns how many ran.
fn settle(w: &mut World, now: Instant) -> usize {
    let mut jobs = 0;
    for _ in 0..1000 {
        let (a, b) = (w.out(0, now), w.out(1, now));
        w.deliver(0, now, &a);
        w.deliver(1, now, &b);
        let j = w.jobs(now);
        jobs += j;
        if a.is_empty() && b.is_empty() && j == 0 {
            let later = now + std::time::Duration::from_millis(1);
            w.nodes[1].engine.handle_timeout(later);
            let b = w.out(1, later);
            w.deliver(1, later, &b);
            if b.is_empty() {
                return jobs;
            }
        }
    }
    panic!("no end");
}

#[test]
fn one_job_faults_in_a_whole_message_for_its_other_packets() {
    let now = Instant::now();
    let mut w = world();
    // 16 packets of 1 KiB into four untranslated pages: one job.
    w.write(now, 1, 0, 16384);
    assert_eq!(settle(&mut w, now), 1);
    assert_eq!(w.nodes[0].cq.poll_one().map(|c| (c.wr_id, c.status)), Some((1, WcStatus::Success)));
    assert_eq!(w.dst.contents()[..16384], w.src.contents()[..16384]);
    // A READ of 16 KiB from four other untranslated pages of node 1 (into
    // node 0's buffer at the same offset): one job.
    w.post(now, WrOpcode::RdmaRead, 2, 32768, 16384);
    assert_eq!(settle(&mut w, now), 1);
    assert_eq!(w.nodes[0].cq.poll_one().map(|c| (c.wr_id, c.status)), Some((2, WcStatus::Success)));
    assert_eq!(w.src.contents()[32768..49152], [0u8; 16384], "the READ brought node 1's zeros");
    assert_eq!(w.nodes[1].engine.stats().copies_deferred, 2);
}
