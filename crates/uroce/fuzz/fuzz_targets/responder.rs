//! Random packets against an RC QP in RTS whose peer may do anything:
//! fuzzed BTH/RETH/AtomicETH/payload with a valid ICRC, aimed at registered
//! memory surrounded by guard bytes, a memory window and an indirect key.
//! The engine never panics, and no byte outside the regions that grant
//! remote write (and only inside them) ever changes. With the input's first
//! bit set, every copy counts as one that may block: the engine defers it
//! to a copy job (`proto::copy`), and the jobs run, and come back, at
//! points the input chooses (parked packets replayed in between).
#![no_main]

use libfuzzer_sys::fuzz_target;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::{Duration, Instant};
use uroce::ib::{Access, Gid, Mtu, QpAttrMask as M, QpState, QpType};
use uroce::mem::{AccessError, BindError, BindRequest, Layout, Memory, Span, Want};
use uroce::proto::cq::CompletionQueue;
use uroce::proto::memory::Atomic;
use uroce::proto::qp::QpInit;
use uroce::proto::wr::{AddressVector, QpAttr, QpCap, RecvWr};
use uroce::proto::{Engine, EngineConfig};
use uroce::proto::{MemoryAccess, PayloadHold};
use uroce::wire::{icrc, IpInfo};

/// The device's memory, every copy of which may block (so the engine
/// defers each to a copy job).
#[derive(Debug)]
struct Blocking(Arc<Memory>);

impl MemoryAccess for Blocking {
    fn resolve(&self, key: u32, pd: u32, iova: u64, len: u64, want: Want) -> Result<Span, AccessError> {
        MemoryAccess::resolve(&*self.0, key, pd, iova, len, want)
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
        MemoryAccess::resolve_remote(&*self.0, key, pd, qpn, iova, len, want)
    }
    fn write(&self, span: &Span, offset: usize, data: &[u8]) -> Result<(), AccessError> {
        MemoryAccess::write(&*self.0, span, offset, data)
    }
    fn read(&self, span: &Span, offset: usize, out: &mut [u8]) -> Result<(), AccessError> {
        MemoryAccess::read(&*self.0, span, offset, out)
    }
    fn may_block(&self, _: &Span) -> bool {
        true
    }
    fn fault_in(&self, span: &Span, write: bool) {
        MemoryAccess::fault_in(&*self.0, span, write)
    }
    fn atomic(&self, span: &Span, op: Atomic) -> Result<u64, AccessError> {
        MemoryAccess::atomic(&*self.0, span, op)
    }
    fn pin_for_send(&self, span: Span) -> Result<PayloadHold, Span> {
        Err(span)
    }
    fn bind_mw(&self, qp_pd: u32, qpn: u32, r: &BindRequest) -> Result<u32, BindError> {
        MemoryAccess::bind_mw(&*self.0, qp_pd, qpn, r)
    }
    fn umr(&self, key: u32, pd: u32, layout: Layout) -> Result<(), BindError> {
        MemoryAccess::umr(&*self.0, key, pd, layout)
    }
    fn invalidate(&self, key: u32, pd: u32, qpn: u32) -> Result<(), BindError> {
        MemoryAccess::invalidate(&*self.0, key, pd, qpn)
    }
}

/// Runs the engine's copy jobs and gives them back.
fn run_jobs(e: &mut Engine, mem: &dyn MemoryAccess, t: Instant) {
    while let Some(mut j) = e.poll_copy() {
        j.run(mem);
        e.copy_done(t, j);
        while e.poll_transmit(t).is_some() {}
    }
}

const GUARD: usize = 256;
const LEN: usize = 4096;

fuzz_target!(|data: &[u8]| {
    if data.len() < 16 {
        return;
    }
    let local: IpAddr = [10, 0, 0, 2].into();
    let peer: IpAddr = [10, 0, 0, 1].into();
    let mem = Memory::new();
    let blocking = data[3] & 1 != 0;
    let access: Arc<dyn MemoryAccess> = if blocking { Arc::new(Blocking(mem.clone())) } else { mem.clone() };
    let mut cfg = EngineConfig::new(local, 4791, Mtu::Mtu1024);
    cfg.defer_blocking_copies = blocking;
    let mut e = Engine::new(cfg, access.clone());
    let cq = Arc::new(CompletionQueue::new(1, 1024));
    let init = QpInit {
        qp_type: QpType::Rc,
        pd: 1,
        send_cq: cq.clone(),
        recv_cq: cq.clone(),
        srq: None,
        cap: QpCap { max_send_wr: 16, max_recv_wr: 16, max_send_sge: 2, max_recv_sge: 2, max_inline_data: 0 },
        sq_sig_all: false,
        scatter_to_cqe: true,
    };
    let qpn = e.create_qp(init).unwrap();
    let now = Instant::now();
    let mut a = QpAttr {
        qp_state: QpState::Init,
        port_num: 1,
        qp_access_flags: Access::LOCAL_WRITE | Access::REMOTE_WRITE | Access::REMOTE_READ | Access::REMOTE_ATOMIC,
        ..QpAttr::default()
    };
    e.modify_qp(now, qpn, &a, M::STATE | M::PKEY_INDEX | M::PORT | M::ACCESS_FLAGS).unwrap();
    a.qp_state = QpState::Rtr;
    a.path_mtu = Mtu::Mtu1024;
    a.dest_qp_num = 0x11;
    a.rq_psn = u32::from_be_bytes([0, data[0], data[1], data[2]]) & 0xFF_FFFF;
    a.max_dest_rd_atomic = 4;
    a.ah_attr =
        AddressVector { dgid: Gid::from_ip(peer), is_global: true, hop_limit: 64, port_num: 1, ..Default::default() };
    let mask = M::STATE | M::AV | M::PATH_MTU | M::DEST_QPN | M::RQ_PSN | M::MAX_DEST_RD_ATOMIC | M::MIN_RNR_TIMER;
    e.modify_qp(now, qpn, &a, mask).unwrap();
    a.qp_state = QpState::Rts;
    a.timeout = 10;
    a.retry_cnt = 3;
    a.max_rd_atomic = 4;
    e.modify_qp(now, qpn, &a, M::STATE | M::TIMEOUT | M::RETRY_CNT | M::RNR_RETRY | M::SQ_PSN | M::MAX_QP_RD_ATOMIC)
        .unwrap();

    // Memory: a writable region, a read-only one, both inside guarded buffers.
    let mut w = vec![0xA5u8; LEN + 2 * GUARD];
    let mut r = vec![0x5Au8; LEN + 2 * GUARD];
    let (wa, ra) = (w.as_mut_ptr() as usize + GUARD, r.as_mut_ptr() as usize + GUARD);
    let rw = Access::LOCAL_WRITE | Access::REMOTE_WRITE | Access::REMOTE_ATOMIC | Access::MW_BIND;
    // SAFETY: the buffers outlive the engine's use of the keys (this call).
    let wk = unsafe { mem.register(1, wa, LEN as u64, wa as u64, rw, None) }.unwrap().key;
    // SAFETY: as above.
    let rk = unsafe { mem.register(1, ra, LEN as u64, ra as u64, Access::REMOTE_READ, None) }.unwrap().key;
    let ik = mem.create_indirect(1, 4).unwrap().key;
    let sges = [uroce::ib::Sge { addr: wa as u64 + 100, length: 200, lkey: wk }];
    mem.set_layout(ik, 1, Some(uroce::mem::Layout::list(Access::REMOTE_WRITE | Access::LOCAL_WRITE, &sges))).unwrap();
    let recv = uroce::ib::Sge { addr: wa as u64 + 2048, length: 1024, lkey: wk };
    for i in 0..4 {
        e.post_recv(now, qpn, RecvWr { wr_id: i, sg_list: uroce::sgl![recv] }).unwrap();
    }
    let before_r = r.clone();

    // The fuzz input is a sequence of packets: [len u8][bytes...]; keys and
    // addresses in RETH/AtomicETH are steered toward the real ones.
    let keys = [wk, rk, ik, wk ^ 1, 0];
    let mut rest = &data[4..];
    let mut t = now;
    while rest.len() > 1 {
        let n = (rest[0] as usize).min(rest.len() - 1);
        let mut pkt = rest[1..1 + n].to_vec();
        rest = &rest[1 + n..];
        if pkt.len() < 12 {
            continue;
        }
        pkt[5..8].copy_from_slice(&qpn.to_be_bytes()[1..]); // dest QP
        if pkt.len() >= 28 && pkt[0] & 0x1F >= 6 {
            // Steer a RETH/AtomicETH-shaped field at the regions.
            let base = [wa, ra, 0][pkt[12] as usize % 3] as u64 + (pkt[13] as u64 * 16) % (LEN as u64 + 64);
            pkt[12..20].copy_from_slice(&base.to_be_bytes());
            let k = keys[pkt[20] as usize % keys.len()];
            pkt[20..24].copy_from_slice(&k.to_be_bytes());
        }
        pkt.extend_from_slice(&[0; 4]);
        let ip = IpInfo { src: peer, dst: local, sport: 49152, dport: 4791, ipv4_id: 0 };
        let m = pkt.len();
        let c = icrc::compute(&ip, &pkt[..m - 4]);
        pkt[m - 4..].copy_from_slice(&c);
        e.handle_datagram(t, SocketAddr::new(peer, 49152), local, &pkt);
        while e.poll_transmit(t).is_some() {}
        if pkt[1] & 1 != 0 {
            // The copy workers catch up here (or, else, later).
            run_jobs(&mut e, &*access, t);
        }
        t += Duration::from_micros(50);
        e.handle_timeout(t);
        while cq.poll_one().is_some() {}
    }
    run_jobs(&mut e, &*access, t);
    assert!(w[..GUARD].iter().chain(&w[GUARD + LEN..]).all(|&b| b == 0xA5), "write outside the writable region");
    assert_eq!(r, before_r, "a read-only region changed");
});
