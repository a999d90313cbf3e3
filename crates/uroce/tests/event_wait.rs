//! Applications that wait for completion events instead of polling
//! (`proto::presence`): a thread blocked on a completion channel receives
//! for its device, an armed CQ makes the progress thread watch the socket
//! for an application that waits in its own `poll`, and a non-blocking
//! channel fd never blocks. Two devices in one process over loopback UDP;
//! every wait is bounded.

mod common;

use common::*;
use std::time::{Duration, Instant};
use uroce::verbs::*;

/// One event-driven end: its CQ on a channel, armed.
struct EvEnd {
    ch: CompletionChannel,
    cq: CompletionQueue,
    qp: QueuePair,
    mr: MemoryRegion,
}

fn ev_end(pd: &ProtectionDomain, ctx: &Context, qp_type: QpType) -> EvEnd {
    let ch = ctx.create_comp_channel().unwrap();
    let cq = ctx.create_cq(64, Some(&ch)).unwrap();
    let mut attr = QpInitAttr::rc(&cq, &cq);
    attr.qp_type = qp_type;
    let qp = pd.create_qp(&attr).unwrap();
    let mr = pd.register(vec![0u8; 128], Access::LOCAL_WRITE).unwrap();
    cq.req_notify(false).unwrap();
    EvEnd { ch, cq, qp, mr }
}

impl EvEnd {
    /// As `ibv_rc_pingpong -e`: waits for an event, re-arms, polls until
    /// a receive completes (sends may complete on the way).
    fn wait_recv(&self) {
        let deadline = Instant::now() + T;
        loop {
            assert!(Instant::now() < deadline, "no receive within {T:?}");
            if self.ch.wait(T).unwrap().is_none() {
                continue;
            }
            self.cq.req_notify(false).unwrap();
            let mut wcs = [Wc::new(0, WcStatus::Success, WcOpcode::Send, 0); 4];
            let n = self.cq.poll(&mut wcs).unwrap();
            for wc in &wcs[..n] {
                assert_eq!(wc.status, WcStatus::Success, "{wc:?}");
            }
            if wcs[..n].iter().any(|wc| wc.opcode == WcOpcode::Recv) {
                return;
            }
        }
    }

    fn post_recv(&self) {
        self.qp.post_recv(&RecvWr { wr_id: 1, sg_list: uroce::sgl![self.mr.sge(64, 64)] }).unwrap();
    }

    fn send(&self, n: u64) {
        let mut w = wr(n, WrOpcode::Send, self.mr.sge(0, 16));
        w.flags = SendFlags::SIGNALED;
        self.qp.post_send(&w).unwrap();
    }
}

fn ping_pong(qp_type: QpType, rounds: u64) {
    let (a, b) = pair_with(None);
    let (pa, pb) = (a.alloc_pd().unwrap(), b.alloc_pd().unwrap());
    let (x, y) = (ev_end(&pa, &a, qp_type), ev_end(&pb, &b, qp_type));
    x.qp.connect_rc(&b.query_gid(0).unwrap(), y.qp.qp_num(), 1, 2).unwrap();
    y.qp.connect_rc(&a.query_gid(0).unwrap(), x.qp.qp_num(), 2, 1).unwrap();
    x.post_recv();
    y.post_recv();
    std::thread::scope(|s| {
        s.spawn(|| {
            for n in 0..rounds {
                y.wait_recv();
                y.post_recv();
                y.send(n);
            }
        });
        for n in 0..rounds {
            x.send(n);
            x.wait_recv();
            x.post_recv();
        }
    });
}

#[test]
fn event_driven_ping_pong_over_rc_and_uc() {
    for t in [QpType::Rc, QpType::Uc] {
        ping_pong(t, 300);
    }
}

/// An application that polled a moment ago, armed its CQ and now waits in
/// its own `poll` on the channel's fd (libfabric, an event loop): nobody
/// polls the CQ, so the progress thread must receive (the arm wakes it).
#[test]
fn an_armed_cq_is_served_while_the_application_waits_in_its_own_poll() {
    let (a, b) = pair_with(None);
    let (pa, pb) = (a.alloc_pd().unwrap(), b.alloc_pd().unwrap());
    let (x, y) = (ev_end(&pa, &a, QpType::Rc), ev_end(&pb, &b, QpType::Rc));
    x.qp.connect_rc(&b.query_gid(0).unwrap(), y.qp.qp_num(), 1, 2).unwrap();
    y.qp.connect_rc(&a.query_gid(0).unwrap(), x.qp.qp_num(), 2, 1).unwrap();
    for n in 0..50 {
        y.post_recv();
        // A poll of the empty CQ: the application "polled lately".
        assert!(y.cq.poll_one().is_none());
        x.send(n);
        let mut pfd = libc::pollfd { fd: y.ch.fd(), events: libc::POLLIN, revents: 0 };
        // SAFETY: one valid pollfd.
        let r = unsafe { libc::poll(&mut pfd, 1, T.as_millis() as i32) };
        assert_eq!(r, 1, "round {n}: no event within {T:?}");
        assert_eq!(y.ch.get_event().unwrap(), y.cq.handle());
        y.cq.req_notify(false).unwrap();
        assert_eq!(y.cq.wait(1, T).unwrap()[0].opcode, WcOpcode::Recv);
        let _ = x.cq.wait(1, T).unwrap();
    }
}

/// A channel fd the application made non-blocking: no event is EAGAIN at
/// once (nothing waits on the socket), an event is taken.
#[test]
fn a_nonblocking_channel_reports_eagain_and_then_the_event() {
    let (a, b) = pair_with(None);
    let (pa, pb) = (a.alloc_pd().unwrap(), b.alloc_pd().unwrap());
    let (x, y) = (ev_end(&pa, &a, QpType::Rc), ev_end(&pb, &b, QpType::Rc));
    x.qp.connect_rc(&b.query_gid(0).unwrap(), y.qp.qp_num(), 1, 2).unwrap();
    y.qp.connect_rc(&a.query_gid(0).unwrap(), x.qp.qp_num(), 2, 1).unwrap();
    // SAFETY: fcntl on the channel's own fd.
    unsafe {
        let fl = libc::fcntl(y.ch.fd(), libc::F_GETFL);
        assert!(libc::fcntl(y.ch.fd(), libc::F_SETFL, fl | libc::O_NONBLOCK) == 0);
    }
    let t = Instant::now();
    assert_eq!(y.ch.get_event().unwrap_err().errno.0, libc::EAGAIN);
    assert_eq!(y.ch.wait(Duration::from_millis(20)).unwrap(), None);
    assert!(t.elapsed() < T, "a non-blocking fd blocked");
    y.post_recv();
    x.send(1);
    let got = (0..1000).find_map(|_| y.ch.wait(Duration::from_millis(10)).unwrap());
    assert_eq!(got, Some(y.cq.handle()));
}
