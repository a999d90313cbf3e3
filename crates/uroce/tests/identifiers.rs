//! Identifiers a peer must not predict: each device starts its QPNs at a
//! random place and gives every key random variant bits, so the first QPN
//! is not 0x11 and the first rkey not 0x111 (as they were), and two devices
//! do not hand out the same sequence.

mod common;

use common::*;
use uroce::verbs::*;

fn first_ids(ctx: &Context) -> (u32, Vec<u32>) {
    let e = end(ctx.clone());
    let keys = (0..4)
        .map(|_| {
            let mr = e.pd.register(vec![0u8; 64], Access::LOCAL_WRITE | Access::REMOTE_WRITE).unwrap();
            let k = mr.rkey();
            std::mem::forget(mr); // keep the index taken, so the next key gets the next one
            k
        })
        .collect();
    (e.qp.qp_num(), keys)
}

#[test]
fn qpns_and_keys_differ_between_devices() {
    let (a, b) = pair_with(None);
    let (qa, ka) = first_ids(&a);
    let (qb, kb) = first_ids(&b);
    // Each equality below happens by chance with probability 2^-24 (QPNs)
    // or 2^-32 (four variants).
    assert_ne!(qa, qb, "QPNs start at a random place per device");
    assert_ne!(ka, kb, "keys {ka:x?} and {kb:x?}");
    assert!((0x11..=0xFF_FFFF).contains(&qa) && (0x11..=0xFF_FFFF).contains(&qb));
    // Variants are not a function of the index (they were index × 17).
    let by_index: Vec<u32> = ka.iter().map(|k| ((k >> 8) as u8).wrapping_mul(17) as u32).collect();
    assert_ne!(ka.iter().map(|k| k & 0xff).collect::<Vec<_>>(), by_index);
}
