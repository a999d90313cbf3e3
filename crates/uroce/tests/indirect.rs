//! Indirect keys: list and interleaved layouts, nesting, UMR through the
//! send queue, and the failure cases. The property test compares every byte
//! read or written through a composite key with a reference gather/scatter
//! computed independently in plain Rust.

mod common;

use common::*;
use proptest::prelude::*;
use std::time::Duration;
use uroce::ib::{Errno, Sge};
use uroce::mem::{AccessError, InterleavedEntry, Layout, Memory, Want};
use uroce::verbs::*;

const T: Duration = Duration::from_secs(5);
const REGION: usize = 4096;
const PD: u32 = 1;

/// One memory with four registered regions of known bytes.
struct Fixture {
    mem: std::sync::Arc<Memory>,
    bufs: Vec<Vec<u8>>,
    keys: Vec<u32>,
}

impl Fixture {
    fn new(seed: u8) -> Fixture {
        let mem = Memory::new();
        let mut bufs: Vec<Vec<u8>> = (0..4u8)
            .map(|r| {
                (0..REGION)
                    .map(|i| (i as u8).wrapping_mul(31).wrapping_add(r.wrapping_mul(64).wrapping_add(seed)))
                    .collect()
            })
            .collect();
        let keys = bufs
            .iter_mut()
            .map(|b| {
                let a = b.as_mut_ptr() as usize;
                let access =
                    uroce::ib::Access::LOCAL_WRITE | uroce::ib::Access::REMOTE_READ | uroce::ib::Access::REMOTE_WRITE;
                // SAFETY: the buffers live as long as the fixture, whose
                // memory is dropped with it.
                unsafe { mem.register(PD, a, REGION as u64, a as u64, access, None) }.unwrap().key
            })
            .collect();
        Fixture { mem, bufs, keys }
    }

    fn addr(&self, region: usize, off: usize) -> u64 {
        self.bufs[region].as_ptr() as u64 + off as u64
    }
}

/// A layout description independent of uroce's types: what each byte of the
/// key's address space is, as (region, offset), enumerated in order.
#[derive(Debug, Clone)]
enum Shape {
    List(Vec<(usize, usize, usize)>),
    Interleaved { repeat: usize, entries: Vec<(usize, usize, usize, usize)> },
}

impl Shape {
    fn bytes(&self) -> Vec<(usize, usize)> {
        let mut v = Vec::new();
        match self {
            Shape::List(es) => {
                for &(r, off, len) in es {
                    v.extend((0..len).map(|j| (r, off + j)));
                }
            }
            Shape::Interleaved { repeat, entries } => {
                for rep in 0..*repeat {
                    for &(r, off, count, skip) in entries {
                        v.extend((0..count).map(|j| (r, off + rep * (count + skip) + j)));
                    }
                }
            }
        }
        v
    }

    fn layout(&self, f: &Fixture) -> Layout {
        let access = uroce::ib::Access::LOCAL_WRITE | uroce::ib::Access::REMOTE_READ | uroce::ib::Access::REMOTE_WRITE;
        match self {
            Shape::List(es) => Layout::list(
                access,
                &es.iter()
                    .map(|&(r, off, len)| Sge { addr: f.addr(r, off), length: len as u32, lkey: f.keys[r] })
                    .collect::<Vec<_>>(),
            ),
            Shape::Interleaved { repeat, entries } => Layout::interleaved(
                access,
                *repeat as u32,
                &entries
                    .iter()
                    .map(|&(r, off, count, skip)| InterleavedEntry {
                        addr: f.addr(r, off),
                        bytes_count: count as u32,
                        bytes_skip: skip as u32,
                        lkey: f.keys[r],
                    })
                    .collect::<Vec<_>>(),
            ),
        }
    }
}

fn shape() -> impl Strategy<Value = Shape> {
    let list = proptest::collection::vec((0usize..4, 0usize..REGION, 1usize..600), 1..6).prop_map(|es| {
        Shape::List(
            es.into_iter()
                .map(|(r, off, len)| (r, off.min(REGION - 1), len.min(REGION - off.min(REGION - 1))))
                .collect(),
        )
    });
    let inter = (1usize..24, proptest::collection::vec((0usize..4, 0usize..512, 1usize..40, 0usize..40), 1..4))
        .prop_filter("fits in the regions", |(rep, es)| es.iter().all(|&(_, off, c, s)| off + rep * (c + s) <= REGION))
        .prop_map(|(repeat, entries)| Shape::Interleaved { repeat, entries });
    prop_oneof![list, inter]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 200, failure_persistence: None, ..ProptestConfig::default() })]

    /// Reads and writes through one indirect key equal the reference.
    #[test]
    fn composite_key_equals_reference(s in shape(), a in 0.0f64..1.0, b in 0.0f64..1.0, seed in any::<u8>()) {
        let f = Fixture::new(seed);
        let mkey = f.mem.create_indirect(PD, 16).unwrap().key;
        f.mem.set_layout(mkey, PD, Some(s.layout(&f))).unwrap();
        let map = s.bytes();
        let total = map.len();
        let off = (a * total as f64) as usize % total.max(1);
        let len = ((b * (total - off) as f64) as usize).max(1).min(total - off);
        // Read.
        let span = f.mem.resolve(mkey, PD, off as u64, len as u64, Want::RemoteRead).unwrap();
        let mut got = vec![0u8; len];
        span.read(0, &mut got).unwrap();
        let want: Vec<u8> = map[off..off + len].iter().map(|&(r, o)| f.bufs[r][o]).collect();
        prop_assert_eq!(&got, &want);
        drop(span);
        // Write: every byte lands where the reference scatter puts it (later
        // bytes win where a layout maps two offsets to one address).
        let data: Vec<u8> = (0..len).map(|i| (i as u8) ^ 0x5A).collect();
        let mut expect = f.bufs.clone();
        for (i, &(r, o)) in map[off..off + len].iter().enumerate() {
            expect[r][o] = data[i];
        }
        f.mem.resolve(mkey, PD, off as u64, len as u64, Want::RemoteWrite).unwrap().write(0, &data).unwrap();
        prop_assert!(f.bufs == expect);
        // Out of range by one byte.
        prop_assert_eq!(f.mem.resolve(mkey, PD, off as u64, (total - off + 1) as u64, Want::RemoteRead).err(), Some(AccessError::Range));
    }

    /// A list key over another indirect key: offsets compose.
    #[test]
    fn nested_keys_compose(inner in shape(), cut in 0.0f64..1.0, seed in any::<u8>()) {
        let f = Fixture::new(seed);
        let k1 = f.mem.create_indirect(PD, 16).unwrap().key;
        f.mem.set_layout(k1, PD, Some(inner.layout(&f))).unwrap();
        let inner_map = inner.bytes();
        let n = inner_map.len();
        let c = ((cut * n as f64) as usize).min(n - 1);
        // Outer: [inner c..n] then region 3's first 10 bytes then [inner 0..c].
        let mut sges = vec![Sge { addr: c as u64, length: (n - c) as u32, lkey: k1 }];
        sges.push(Sge { addr: f.addr(3, 0), length: 10, lkey: f.keys[3] });
        if c > 0 {
            sges.push(Sge { addr: 0, length: c as u32, lkey: k1 });
        }
        let k2 = f.mem.create_indirect(PD, 4).unwrap().key;
        f.mem.set_layout(k2, PD, Some(Layout::list(uroce::ib::Access::REMOTE_READ, &sges))).unwrap();
        let mut map: Vec<(usize, usize)> = inner_map[c..].to_vec();
        map.extend((0..10).map(|j| (3, j)));
        map.extend_from_slice(&inner_map[..c]);
        let mut got = vec![0u8; map.len()];
        f.mem.resolve(k2, PD, 0, map.len() as u64, Want::RemoteRead).unwrap().read(0, &mut got).unwrap();
        let want: Vec<u8> = map.iter().map(|&(r, o)| f.bufs[r][o]).collect();
        prop_assert_eq!(got, want);
        // The outer key grants only READ.
        prop_assert_eq!(f.mem.resolve(k2, PD, 0, 1, Want::RemoteWrite).err(), Some(AccessError::Permission));
    }
}

#[test]
fn layout_rules_and_constituent_failures() {
    let f = Fixture::new(0);
    let access = uroce::ib::Access::REMOTE_READ;
    let mkey = f.mem.create_indirect(PD, 2).unwrap().key;
    let sge = |r: usize, len: u32| Sge { addr: f.addr(r, 0), length: len, lkey: f.keys[r] };
    // Free key: invalid.
    assert_eq!(f.mem.resolve(mkey, PD, 0, 1, Want::RemoteRead).err(), Some(AccessError::BadKey));
    // Too many entries (max_entries rounds up to 4).
    let e = f.mem.set_layout(mkey, PD, Some(Layout::list(access, &[sge(0, 1); 5]))).unwrap_err();
    assert_eq!(e.errno, Errno::ENOMEM);
    // Referencing itself.
    let me = Sge { addr: 0, length: 4, lkey: mkey };
    assert_eq!(f.mem.set_layout(mkey, PD, Some(Layout::list(access, &[me]))).unwrap_err().errno, Errno::EINVAL);
    // Other PD.
    assert_eq!(f.mem.set_layout(mkey, 2, Some(Layout::list(access, &[sge(0, 1)]))).unwrap_err().errno, Errno::EPERM);
    f.mem.set_layout(mkey, PD, Some(Layout::list(access, &[sge(0, 100), sge(1, 100)]))).unwrap();
    assert!(f.mem.resolve(mkey, PD, 50, 100, Want::RemoteRead).is_ok());
    assert_eq!(f.mem.resolve(mkey, 2, 0, 1, Want::RemoteRead).err(), Some(AccessError::WrongPd));
    assert_eq!(f.mem.resolve(mkey, PD, 0, 1, Want::RemoteAtomic).err(), Some(AccessError::Permission));
    // A constituent without the right: the composite access fails.
    let ro = f.mem.create_indirect(PD, 4).unwrap().key;
    let b = f.bufs[2].as_ptr() as usize;
    // SAFETY: a second registration of a fixture buffer.
    let read_only = unsafe { f.mem.register(PD, b, 64, b as u64, uroce::ib::Access::empty(), None) }.unwrap().key;
    let rw = uroce::ib::Access::REMOTE_READ | uroce::ib::Access::REMOTE_WRITE | uroce::ib::Access::LOCAL_WRITE;
    let l = Layout::list(rw, &[sge(0, 10), Sge { addr: b as u64, length: 64, lkey: read_only }]);
    f.mem.set_layout(ro, PD, Some(l)).unwrap();
    assert!(f.mem.resolve(ro, PD, 0, 10, Want::RemoteWrite).is_ok());
    assert_eq!(f.mem.resolve(ro, PD, 5, 10, Want::RemoteWrite).err(), Some(AccessError::Permission));
    // A deregistered constituent.
    f.mem.deregister(f.keys[1]).unwrap();
    assert_eq!(f.mem.resolve(mkey, PD, 150, 10, Want::RemoteRead).err(), Some(AccessError::BadKey));
    assert!(f.mem.resolve(mkey, PD, 0, 100, Want::RemoteRead).is_ok());
    // Invalidation frees the key.
    f.mem.invalidate(mkey, PD, 0).unwrap();
    assert_eq!(f.mem.resolve(mkey, PD, 0, 1, Want::RemoteRead).err(), Some(AccessError::BadKey));
}

fn matrix(rows: usize, cols: usize) -> Vec<u8> {
    (0..rows * cols * 4).map(|i| (i / 4) as u8).collect()
}

#[test]
fn one_rkey_spans_three_regions_remotely() {
    let (a, b) = connected(None);
    let rw = Access::LOCAL_WRITE | Access::REMOTE_WRITE | Access::REMOTE_READ;
    let parts: Vec<MemoryRegion> = (0..3).map(|_| b.pd.register(vec![0u8; 1000], rw).unwrap()).collect();
    let key = b.pd.create_indirect_key(4).unwrap();
    let sges = [parts[0].sge(900, 100), parts[1].sge(0, 1000), parts[2].sge(0, 50)];
    key.set_layout(Layout::list(rw, &sges)).unwrap();
    assert_eq!(key.len(), 1150);
    let data: Vec<u8> = (0..1150u32).map(|i| (i % 253) as u8).collect();
    let src = a.pd.register(data.clone(), Access::empty()).unwrap();
    let mut w = wr(1, WrOpcode::RdmaWrite, src.sge(0, 1150));
    w.remote_addr = 0;
    w.rkey = key.rkey();
    a.qp.post_send(&w).unwrap();
    assert_eq!(a.cq.wait(1, T).unwrap()[0].status, WcStatus::Success);
    assert_eq!(&parts[0].to_vec()[900..], &data[..100]);
    assert_eq!(parts[1].to_vec(), &data[100..1100]);
    assert_eq!(&parts[2].to_vec()[..50], &data[1100..]);
    assert_eq!(parts[2].to_vec()[50], 0);
    // READ it back across the seams, from offset 50.
    let dst = a.pd.register(vec![0u8; 1100], Access::LOCAL_WRITE).unwrap();
    let mut r = wr(2, WrOpcode::RdmaRead, dst.sge(0, 1100));
    r.remote_addr = 50;
    r.rkey = key.rkey();
    a.qp.post_send(&r).unwrap();
    assert_eq!(a.cq.wait(1, T).unwrap()[0].status, WcStatus::Success);
    assert_eq!(dst.to_vec(), &data[50..]);
    // One byte past the end: REM_ACCESS_ERR.
    let mut bad = wr(3, WrOpcode::RdmaRead, dst.sge(0, 2));
    bad.remote_addr = 1149;
    bad.rkey = key.rkey();
    a.qp.post_send(&bad).unwrap();
    assert_eq!(a.cq.wait(1, T).unwrap()[0].status, WcStatus::RemAccessErr);
}

#[test]
fn a_matrix_column_travels_in_one_send_through_an_indirect_lkey() {
    let (a, b) = connected(None);
    let (rows, cols) = (64usize, 16usize);
    let m = a.pd.register(matrix(rows, cols), Access::LOCAL_WRITE).unwrap();
    let key = a.pd.create_indirect_key(2).unwrap();
    // Column 5: 4 bytes every row, O(1) description for 64 rows.
    let col =
        InterleavedEntry { addr: m.iova() + 5 * 4, bytes_count: 4, bytes_skip: (cols * 4 - 4) as u32, lkey: m.lkey() };
    key.set_layout(Layout::interleaved(Access::LOCAL_WRITE, rows as u32, &[col])).unwrap();
    let rbuf = b.pd.register(vec![0u8; rows * 4], Access::LOCAL_WRITE).unwrap();
    b.qp.post_recv(&RecvWr { wr_id: 1, sg_list: uroce::sgl![rbuf.sge(0, (rows * 4) as u32)] }).unwrap();
    let sge = Sge { addr: 0, length: (rows * 4) as u32, lkey: key.lkey() };
    a.qp.post_send(&wr(2, WrOpcode::Send, sge)).unwrap();
    assert_eq!(a.cq.wait(1, T).unwrap()[0].status, WcStatus::Success);
    assert_eq!(b.cq.wait(1, T).unwrap()[0].byte_len, (rows * 4) as u32);
    let expect: Vec<u8> = (0..rows).flat_map(|r| [(r * cols + 5) as u8; 4]).collect();
    assert_eq!(rbuf.to_vec(), expect);
}

#[test]
fn umr_through_the_send_queue() {
    let (a, b) = connected(None);
    let rw = Access::LOCAL_WRITE | Access::REMOTE_WRITE | Access::REMOTE_READ;
    let x = b.pd.register(vec![1u8; 64], rw).unwrap();
    let y = b.pd.register(vec![2u8; 64], rw).unwrap();
    let key = b.pd.create_indirect_key(4).unwrap();
    let umr = |id: u64, sges: &[Sge]| {
        let mut w = SendWr::new(id, WrOpcode::Umr);
        w.umr = Some(Box::new(uroce::proto::wr::Umr { key: key.lkey(), layout: Layout::list(rw, sges) }));
        w
    };
    b.qp.post_send(&umr(1, &[y.sge(0, 8), x.sge(0, 8)])).unwrap();
    let wc = b.cq.wait(1, T).unwrap()[0];
    assert_eq!((wc.wr_id, wc.status, wc.opcode), (1, WcStatus::Success, WcOpcode::Umr));
    let dst = a.pd.register(vec![0u8; 16], Access::LOCAL_WRITE).unwrap();
    let read = |id| {
        let mut r = wr(id, WrOpcode::RdmaRead, dst.sge(0, 16));
        r.rkey = key.rkey();
        a.qp.post_send(&r).unwrap();
        a.cq.wait(1, T).unwrap()[0].status
    };
    assert_eq!(read(10), WcStatus::Success);
    assert_eq!(dst.to_vec(), [[2u8; 8], [1u8; 8]].concat());
    // Invalidate, then configure again, ordered in the same send queue.
    let mut inv = SendWr::new(2, WrOpcode::LocalInv);
    inv.imm_data = key.lkey();
    b.qp.post_send_list([inv, umr(3, &[x.sge(8, 16)])]).unwrap();
    let wcs = b.cq.wait(2, T).unwrap();
    assert_eq!((wcs[0].opcode, wcs[0].status), (WcOpcode::LocalInv, WcStatus::Success));
    assert_eq!((wcs[1].opcode, wcs[1].status), (WcOpcode::Umr, WcStatus::Success));
    assert_eq!(read(11), WcStatus::Success);
    assert_eq!(dst.to_vec(), vec![1u8; 16]);
    // Post-time errors: too many entries (latched as ENOMEM on mlx5).
    let e = b.qp.post_send(&{
        let mut w = umr(4, &[x.sge(0, 1)]);
        w.umr.as_mut().unwrap().layout.access = Access::MW_BIND;
        w
    });
    assert_eq!(e.unwrap_err().errno, Errno::EINVAL);
    // Reconfiguring a valid key without invalidation: MW_BIND_ERR, QP to ERR.
    b.qp.post_send(&umr(5, &[x.sge(0, 8)])).unwrap();
    let wc = b.cq.wait(1, T).unwrap()[0];
    assert_eq!((wc.wr_id, wc.status), (5, WcStatus::MwBindErr));
}
