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

/// An address vector naming an empty source GID entry is ENODATA, one past
/// the table EINVAL, in `create_ah` and in `modify_qp` (the kernel's
/// `rdma_get_gid_attr` rules).
#[test]
fn address_vectors_with_an_empty_or_missing_source_gid_are_refused() {
    use uroce::verbs::{AddressVector, QpAttr, QpAttrMask as M, QpInitAttr, QpState};
    let (a, b) = common::pair_with(None);
    let len = a.query_port(1).unwrap().gid_tbl_len;
    let pd = a.alloc_pd().unwrap();
    let av = |sgid_index: u32| AddressVector {
        dgid: b.query_gid(0).unwrap(),
        is_global: true,
        port_num: 1,
        sgid_index: sgid_index as u8,
        ..Default::default()
    };
    assert!(pd.create_ah(av(0)).is_ok());
    assert_eq!(pd.create_ah(av(1)).unwrap_err().errno, Errno::ENODATA);
    assert_eq!(pd.create_ah(av(len)).unwrap_err().errno, Errno::EINVAL);

    let cq = a.create_cq(8, None).unwrap();
    let qp = pd.create_qp(&QpInitAttr::rc(&cq, &cq)).unwrap();
    let init = QpAttr { qp_state: QpState::Init, port_num: 1, ..QpAttr::default() };
    qp.modify(&init, M::STATE | M::PKEY_INDEX | M::PORT | M::ACCESS_FLAGS).unwrap();
    let rtr = |sgid| QpAttr { qp_state: QpState::Rtr, dest_qp_num: 1, ah_attr: av(sgid), ..QpAttr::default() };
    let mask = M::STATE | M::AV | M::PATH_MTU | M::DEST_QPN | M::RQ_PSN | M::MAX_DEST_RD_ATOMIC | M::MIN_RNR_TIMER;
    assert_eq!(qp.modify(&rtr(1), mask).unwrap_err().errno, Errno::ENODATA);
    assert_eq!(qp.modify(&rtr(len), mask).unwrap_err().errno, Errno::EINVAL);
    qp.modify(&rtr(0), mask).unwrap();
}
