//! A hostile peer against a responder (sans-IO engine, no sockets): one
//! million RDMA WRITEs with guessed rkeys, stale key variants, a revoked
//! window, a deregistered region and an unmapped ODP range never change a
//! byte and are all NAKed; packets from an address that does not match the
//! QP's address vector are dropped.

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::Instant;
use uroce::ib::{Access, Gid, Mtu, QpAttrMask as M, QpState, QpType};
use uroce::mem::{Memory, MwType};
use uroce::proto::cq::CompletionQueue;
use uroce::proto::qp::QpInit;
use uroce::proto::wr::{AddressVector, QpAttr, QpCap};
use uroce::proto::{Engine, EngineConfig};
use uroce::wire::{build_packet, Bth, Headers, IpInfo, Opcode, Packet, Reth};

const PEER: [u8; 4] = [10, 0, 0, 1];
const LOCAL: [u8; 4] = [10, 0, 0, 2];

struct Target {
    e: Engine,
    qpn: u32,
    psn: u32,
    now: Instant,
}

fn target(mem: &Arc<Memory>) -> Target {
    let mut e = Engine::new(EngineConfig::new(LOCAL.into(), 4791, Mtu::Mtu1024), mem.clone());
    let cq = Arc::new(CompletionQueue::new(1, 1024));
    let cap = QpCap { max_send_wr: 8, max_recv_wr: 8, max_send_sge: 1, max_recv_sge: 1, max_inline_data: 0 };
    let init = QpInit {
        qp_type: QpType::Rc,
        pd: 1,
        send_cq: cq.clone(),
        recv_cq: cq,
        srq: None,
        cap,
        sq_sig_all: false,
        scatter_to_cqe: false,
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
    a.rq_psn = 100;
    a.max_dest_rd_atomic = 4;
    a.ah_attr = AddressVector {
        dgid: Gid::from_ip(PEER.into()),
        is_global: true,
        hop_limit: 64,
        port_num: 1,
        ..Default::default()
    };
    let m = M::STATE | M::AV | M::PATH_MTU | M::DEST_QPN | M::RQ_PSN | M::MAX_DEST_RD_ATOMIC | M::MIN_RNR_TIMER;
    e.modify_qp(now, qpn, &a, m).unwrap();
    Target { e, qpn, psn: 100, now }
}

impl Target {
    /// Sends a WRITE ONLY of 8 bytes from `src`; returns whether the
    /// responder answered with a NAK (true) or an ACK (false).
    fn write(&mut self, src: IpAddr, va: u64, rkey: u32) -> Option<bool> {
        let mut h = Headers::new(Bth {
            opcode: Opcode::RC_WRITE_ONLY,
            solicited: false,
            mig_req: false,
            pad_count: 0,
            tver: 0,
            pkey: 0xFFFF,
            fecn: false,
            becn: false,
            dest_qp: self.qpn,
            ack_req: true,
            psn: self.psn,
        });
        h.reth = Some(Reth { va, rkey, dma_len: 8 });
        let ip = IpInfo { src, dst: LOCAL.into(), sport: 49152, dport: 4791, ipv4_id: 0 };
        let mut buf = vec![0u8; 128];
        let n = build_packet(&h, &[0xEE; 8], &ip, &mut buf).unwrap();
        self.e.handle_datagram(self.now, SocketAddr::new(src, 49152), LOCAL.into(), &buf[..n]);
        let t = self.e.poll_transmit(self.now)?;
        let p = Packet::parse(&t.data).unwrap();
        let nak = p.headers.aeth.is_some_and(|a| !matches!(a.kind(), uroce::wire::AethKind::Ack { .. }));
        if !nak {
            self.psn = (self.psn + 1) & 0xFF_FFFF;
        }
        Some(nak)
    }

    /// After a NAK the QP is in error: a fresh one continues the attack.
    fn reset(&mut self, mem: &Arc<Memory>) {
        *self = target(mem);
    }
}

fn guarded(len: usize) -> Vec<u8> {
    vec![0x33u8; len]
}

#[test]
fn guessed_stale_and_revoked_keys_never_write() {
    let mem = Memory::new();
    let mut buf = guarded(4096);
    let addr = buf.as_mut_ptr() as u64;
    let rw = Access::LOCAL_WRITE | Access::REMOTE_WRITE | Access::MW_BIND;
    // SAFETY: `buf` outlives every use of the key (this test).
    let live = unsafe { mem.register(1, addr as usize, 4096, addr, rw, None) }.unwrap().key;
    // A stale variant: registered, deregistered, the index reused.
    // SAFETY: as above.
    let old = unsafe { mem.register(1, addr as usize, 4096, addr, rw, None) }.unwrap().key;
    mem.deregister(old).unwrap();
    // A revoked (invalidated) type-2 window.
    let mw = mem.alloc_mw(1, MwType::Type2);
    let req = uroce::mem::BindRequest {
        mw_key: mw.key(),
        new_key: mw.key() + 1,
        mr_key: live,
        addr,
        len: 4096,
        access: Access::REMOTE_WRITE,
    };
    let wkey = mem.bind_mw(1, 0x99, &req).unwrap();
    mem.invalidate(wkey, 1, 0x99).unwrap();
    // An ODP region over memory that is not there: an inaccessible
    // reservation. (A plain munmap'ed hole is reused by other threads'
    // allocations during the test: seen.) Shared, so it never merges with a
    // neighbouring private mapping.
    // SAFETY: a fresh PROT_NONE reservation; never dereferenced.
    let hole = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            8192,
            libc::PROT_NONE,
            libc::MAP_SHARED | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
            -1,
            0,
        ) as u64
    };
    // SAFETY: ODP keys never dereference memory directly.
    let odp = unsafe { mem.register(1, hole as usize, 8192, hole, rw | Access::ON_DEMAND, None) }.unwrap().key;

    let mut t = target(&mem);
    let peer: IpAddr = PEER.into();
    // The live key works (control).
    assert_eq!(t.write(peer, addr, live), Some(false));
    buf.iter_mut().for_each(|b| *b = 0x33);
    for (what, key, va) in [("stale variant", old, addr), ("revoked window", wkey, addr), ("unmapped ODP", odp, hole)] {
        assert_eq!(t.write(peer, va, key), Some(true), "{what} must be refused");
        t.reset(&mem);
    }
    // One million guessed keys (never the live one) at the region's address.
    let mut x: u64 = 0x2545_F491_4F6C_DD1D;
    let mut refused = 0u32;
    for _ in 0..1_000_000 {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        let key = x as u32;
        if key == live {
            continue;
        }
        match t.write(peer, addr, key) {
            Some(true) => {
                refused += 1;
                t.reset(&mem);
            }
            other => panic!("guessed key {key:#x} was not refused: {other:?}"),
        }
    }
    assert!(refused > 999_000);
    assert!(buf.iter().all(|&b| b == 0x33), "a refused write changed memory");
}

#[test]
fn packets_from_other_addresses_are_dropped() {
    let mem = Memory::new();
    let mut buf = guarded(64);
    let addr = buf.as_mut_ptr() as u64;
    // SAFETY: `buf` outlives the key's use.
    let key = unsafe { mem.register(1, addr as usize, 64, addr, Access::LOCAL_WRITE | Access::REMOTE_WRITE, None) }
        .unwrap()
        .key;
    let mut t = target(&mem);
    let stranger: IpAddr = [10, 0, 0, 66].into();
    assert_eq!(t.write(stranger, addr, key), None, "no answer to a stranger");
    assert_eq!(t.e.stats().rx_drop_addr, 1);
    assert!(buf.iter().all(|&b| b == 0x33));
    assert_eq!(t.write(PEER.into(), addr, key), Some(false));
    assert_eq!(&buf[..8], &[0xEE; 8]);
}
