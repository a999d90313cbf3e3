//! Seed 003's non-contiguous re-registration in the core
//! (`Memory::rereg_layout`, behind `ibv_rereg_mr_interleaved` /
//! `ibv_rereg_mr_sg`): a plain region becomes a zero-based indirect key
//! under a new key; the old key is gone; a matrix column with rows beyond
//! 64 KiB reads and writes; an indirect region takes a new layout; bad
//! requests change nothing.

use uroce::ib::{Access, Errno, Sge};
use uroce::mem::{AccessError, InterleavedEntry, Layout, Memory, Want};

const PD: u32 = 1;

#[test]
fn a_region_becomes_a_matrix_column_and_then_a_composite() {
    let mem = Memory::new();
    let rw = Access::LOCAL_WRITE | Access::REMOTE_READ | Access::REMOTE_WRITE;
    // 8 rows of 100 KiB (past the 16 bits of an mlx5 WQE's stride).
    let (rows, row) = (8usize, 100 * 1024usize);
    let mut mat: Vec<u8> = (0..rows * row).map(|i| (i % 251) as u8).collect();
    let ma = mat.as_mut_ptr() as usize;
    // SAFETY: `mat` outlives `mem`'s use of it (deregistered below).
    let mkey = unsafe { mem.register(PD, ma, mat.len() as u64, ma as u64, rw, None) }.unwrap().key;
    let mut scratch = vec![0u8; 64];
    let sa = scratch.as_mut_ptr() as usize;
    // SAFETY: as above.
    let key = unsafe { mem.register(PD, sa, 64, sa as u64, rw, None) }.unwrap().key;

    let col = InterleavedEntry { addr: ma as u64 + 3, bytes_count: 2, bytes_skip: row as u32 - 2, lkey: mkey };
    let layout = Layout::interleaved(rw, rows as u32, &[col]);
    // The UMR path keeps the WQE's 16-bit limit; re-registration does not.
    assert_eq!(layout.validate(16).unwrap_err().errno, Errno::EINVAL);
    // Bad requests change nothing: a layout naming the region itself.
    let me = Layout::list(rw, &[Sge { addr: sa as u64, length: 8, lkey: key }]);
    assert_eq!(mem.rereg_layout(key, me).unwrap_err().errno, Errno::EINVAL);
    assert_eq!(mem.rereg_layout(key, Layout::list(Access::MW_BIND, &[])).unwrap_err().errno, Errno::EINVAL);
    assert!(mem.resolve(key, PD, sa as u64, 8, Want::RemoteRead).is_ok(), "unchanged after errors");

    let r = mem.rereg_layout(key, layout).unwrap();
    let new = r.key;
    assert_ne!(new, key, "a new key variant");
    assert_eq!((r.iova, r.length), (0, rows as u64 * 2));
    assert_eq!(mem.resolve(key, PD, sa as u64, 8, Want::RemoteRead).err(), Some(AccessError::BadKey));
    let mut got = vec![0u8; rows * 2];
    mem.resolve(new, PD, 0, got.len() as u64, Want::RemoteRead).unwrap().read(0, &mut got).unwrap();
    let want: Vec<u8> = (0..rows).flat_map(|r| [mat[r * row + 3], mat[r * row + 4]]).collect();
    assert_eq!(got, want);
    mem.resolve(new, PD, 2, 4, Want::RemoteWrite).unwrap().write(0, &[9, 9, 9, 9]).unwrap();
    assert_eq!(
        (mat[row + 3], mat[row + 4], mat[2 * row + 3], mat[2 * row + 5]),
        (9, 9, 9, ((2 * row + 5) % 251) as u8)
    );
    assert_eq!(mem.resolve(new, PD, 15, 2, Want::RemoteRead).err(), Some(AccessError::Range));

    // Again, as a composite of two pieces, read-only.
    let l = Layout::list(
        Access::REMOTE_READ,
        &[Sge { addr: ma as u64, length: 4, lkey: mkey }, Sge { addr: ma as u64 + row as u64, length: 4, lkey: mkey }],
    );
    let r2 = mem.rereg_layout(new, l).unwrap();
    assert_ne!(r2.key, new);
    let mut got = [0u8; 8];
    mem.resolve(r2.key, PD, 0, 8, Want::RemoteRead).unwrap().read(0, &mut got).unwrap();
    assert_eq!(&got[..4], &mat[..4]);
    assert_eq!(&got[4..], &mat[row..row + 4]);
    assert_eq!(mem.resolve(r2.key, PD, 0, 1, Want::RemoteWrite).err(), Some(AccessError::Permission));
    mem.deregister(r2.key).unwrap();
    mem.deregister(mkey).unwrap();
    assert_eq!(mem.rereg_layout(r2.key, Layout::list(Access::REMOTE_READ, &[])).unwrap_err().errno, Errno::EINVAL);
    drop(scratch);
}
