//! The GID table of the Rust API, as the kernel keeps a RoCE port's: longer
//! than its populated entries. Index 0 is the RoCEv2 GID of the device's
//! address; the other entries are empty (ENODATA); an index beyond the
//! table is EINVAL.

mod common;

use uroce::ib::Errno;
use uroce::verbs::Gid;

#[test]
fn gid_table_is_longer_than_its_populated_entries() {
    let (a, _b) = common::pair_with(None);
    let len = a.query_port(1).unwrap().gid_tbl_len;
    assert!(len > 1, "gid_tbl_len {len}");
    assert_eq!(a.query_gid(0).unwrap(), Gid::from_ip(a.local_addr().ip()));
    for i in 1..len {
        assert_eq!(a.query_gid(i).unwrap_err().errno, Errno::ENODATA, "entry {i}");
    }
    assert_eq!(a.query_gid(len).unwrap_err().errno, Errno::EINVAL);
    assert_eq!(a.query_gid(u32::MAX).unwrap_err().errno, Errno::EINVAL);
}
