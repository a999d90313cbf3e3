//! Copy jobs at the engine level (`proto::copy`): a WRITE or READ into ODP
//! pages the device has not translated becomes a job, and the request is
//! answered with an RNR NAK (as mlx5 answers a responder page fault), again
//! with a longer wait for each copy of it that comes while the job runs; the
//! QP's later packets wait behind the job in order, at most 256 of them
//! (more are dropped and counted), and run after it (out of sequence then:
//! the requester sends again from the NAKed request after its RNR wait).
//! A local fault (a READ response into untranslated pages) does not count
//! against the transport's retries. A job given back after its QP was
//! reset or destroyed changes nothing. Deterministic: the engines are driven
//! directly, time included.

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

fn rnr_naks(packets: &[Transmit]) -> Vec<u32> {
    packets
        .iter()
        .filter_map(|t| Packet::parse(&t.data).ok())
        .filter(|p| matches!(p.headers.aeth.map(|a| a.kind()), Some(AethKind::RnrNak { .. })))
        .map(|p| p.headers.bth.psn)
        .collect()
}

#[test]
fn a_page_fault_is_answered_with_an_rnr_nak_and_the_request_sent_again_completes() {
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
    // The first asked for a job and was answered with an RNR NAK, as mlx5
    // answers a page fault; the others wait behind the job. Nothing is
    // acknowledged and nothing written yet.
    let out = w.out(1, now);
    assert_eq!((rnr_naks(&out), acks(&out)), (vec![500], vec![]));
    assert_eq!(w.dst.contents()[..2048], [0u8; 2048]);
    let s = w.nodes[1].engine.stats();
    assert_eq!((s.copies_deferred, s.fault_rnr_naks, s.rx_packets), (1, 1, 4), "{s:?}");
    // The job runs: the WRITEs behind it are out of sequence now (the
    // requester sends from 500 again after its RNR wait) and dropped.
    assert_eq!(w.jobs(now), 1);
    assert_eq!(w.nodes[1].engine.stats().rx_out_of_sequence, 3);
    assert!(w.out(1, now).is_empty(), "no sequence NAK after the RNR NAK");
    w.deliver(1, now, &out);
    // Everything again after the RNR wait: the first takes the job's result,
    // two more find the page in, the fourth faults in its own page.
    assert_eq!(settle(&mut w, now), 1);
    let wcs: Vec<(u64, WcStatus)> =
        std::iter::from_fn(|| w.nodes[0].cq.poll_one()).map(|c| (c.wr_id, c.status)).collect();
    assert_eq!(wcs, (1..=4).map(|i| (i, WcStatus::Success)).collect::<Vec<_>>());
    let (src, dst) = (w.src.contents(), w.dst.contents());
    assert_eq!(dst[..2048], src[..2048]);
    assert_eq!(dst[16384..16484], src[16384..16484]);
    assert_eq!(dst[2048..16384], [0u8; 14336], "nothing written outside the WRITEs");
    let (r, q) = (w.nodes[1].engine.stats(), w.nodes[0].engine.stats());
    assert_eq!((r.copies_deferred, r.fault_rnr_naks), (2, 2), "{r:?}");
    assert_eq!((q.rnr_naks_received, q.timeouts), (2, 0), "the RNR budget, not the transport's: {q:?}");
}

#[test]
fn a_request_sent_again_during_its_fault_gets_rnr_naks_with_longer_waits() {
    let now = Instant::now();
    let mut w = world();
    w.write(now, 1, 0, 64);
    let sent = w.out(0, now);
    for _ in 0..4 {
        w.deliver(0, now, &sent);
    }
    let timers: Vec<u8> = w
        .out(1, now)
        .iter()
        .filter_map(|t| Packet::parse(&t.data).ok())
        .filter_map(|p| match p.headers.aeth.map(|a| a.kind()) {
            Some(AethKind::RnrNak { timer }) => Some(timer),
            _ => None,
        })
        .collect();
    // min_rnr_timer is 1 (0.01 ms) here: then 9, 17, 25 (0.24, 3.84, 61.44 ms).
    assert_eq!(timers, vec![1, 9, 17, 25]);
    assert_eq!(w.nodes[1].engine.stats().copies_deferred, 1, "one job");
}

#[test]
fn at_most_256_packets_wait_behind_a_job_the_rest_are_dropped_and_counted() {
    let now = Instant::now();
    let mut w = world();
    w.write(now, 1, 0, 64);
    w.write(now, 2, 64, 64);
    let sent = w.out(0, now);
    // The first WRITE faults; then 300 copies of the second (as a fabric
    // duplicating it would) wait behind its job.
    w.deliver(0, now, &sent[..1]);
    for _ in 0..300 {
        w.deliver(0, now, &sent[1..]);
    }
    let s = w.nodes[1].engine.stats();
    assert_eq!((s.copies_deferred, s.rx_drop_busy, s.rx_packets), (1, 300 - 256, 301), "{s:?}");
    assert_eq!(w.jobs(now), 1);
    // They ran after it: out of sequence (the first WRITE comes again).
    let s = w.nodes[1].engine.stats();
    assert_eq!(s.rx_out_of_sequence, 256, "{s:?}");
    let out = w.out(1, now);
    w.deliver(1, now, &out);
    assert_eq!(settle(&mut w, now), 0);
    assert_eq!(w.dst.contents()[..128], w.src.contents()[..128]);
}

#[test]
fn a_local_fault_does_not_count_against_the_transport_retries() {
    let now = Instant::now();
    let mut w = world();
    // Node 0 READs node 1's pinned memory into its own untranslated ODP
    // pages: the READ response's copy is a job on node 0, and the
    // transport timer expires while it waits.
    let local = Buf::new(16384, |_| 0);
    let lkey = local.register_odp(&w.nodes[0].mem, Access::LOCAL_WRITE);
    let remote = Buf::new(4096, |i| (i % 7) as u8);
    // SAFETY: `remote` outlives node 1's use of the key (dropped after it).
    let rkey = unsafe { remote.register(&w.nodes[1].mem, Access::LOCAL_WRITE | Access::REMOTE_READ) };
    let mut wr = SendWr::new(9, WrOpcode::RdmaRead);
    wr.sg_list = uroce::sgl![Sge { addr: local.addr(), length: 1024, lkey }];
    wr.remote_addr = remote.addr();
    wr.rkey = rkey;
    w.nodes[0].engine.post_send(now, w.conn.req_qpn, wr).unwrap();
    let req = w.out(0, now);
    w.deliver(0, now, &req);
    let resp = w.out(1, now);
    w.deliver(1, now, &resp);
    let job = w.nodes[0].engine.poll_copy().expect("the READ response's copy is a job");
    // Far past the ACK timeout (exponent 14: 67 ms), several times.
    for i in 1..=5 {
        let later = now + std::time::Duration::from_millis(200 * i);
        w.nodes[0].engine.handle_timeout(later);
        let _ = w.out(0, later);
    }
    let s = w.nodes[0].engine.stats();
    assert_eq!((s.timeouts, s.retransmits), (0, 0), "{s:?}");
    assert!(s.timeouts_behind_copies >= 1, "{s:?}");
    let mut job = job;
    job.run(&*w.nodes[0].mem);
    w.nodes[0].engine.copy_done(now, job);
    assert_eq!(w.nodes[0].cq.poll_one().map(|c| (c.wr_id, c.status)), Some((9, WcStatus::Success)));
    assert_eq!(local.contents()[..1024], remote.contents()[..1024]);
    drop(w);
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
/// running node 1's copy jobs as they come and letting 1 ms pass when
/// nothing moves (RNR waits, held ACKs); returns how many jobs ran.
fn settle(w: &mut World, start: Instant) -> usize {
    let (mut jobs, mut now) = (0, start);
    for _ in 0..1000 {
        let (a, b) = (w.out(0, now), w.out(1, now));
        w.deliver(0, now, &a);
        w.deliver(1, now, &b);
        let j = w.jobs(now);
        jobs += j;
        if a.is_empty() && b.is_empty() && j == 0 {
            now += std::time::Duration::from_millis(1);
            w.nodes[0].engine.handle_timeout(now);
            w.nodes[1].engine.handle_timeout(now);
            let (a, b) = (w.out(0, now), w.out(1, now));
            if a.is_empty() && b.is_empty() {
                return jobs;
            }
            w.deliver(0, now, &a);
            w.deliver(1, now, &b);
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
