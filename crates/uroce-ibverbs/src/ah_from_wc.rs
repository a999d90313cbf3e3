//! Address handles from a received completion: `ibv_init_ah_from_wc` and
//! `ibv_create_ah_from_wc`, as rdma-core 44's libibverbs/verbs.c does them
//! for RoCE. The 40-byte GRH area at the start of a UD receive buffer holds
//! either an IPv6 header (RoCE v2 over IPv6, or v1) or, for RoCE v2 over
//! IPv4, an IPv4 header in its last 20 bytes; which one is read from the
//! bytes themselves (rdma-core's `get_grh_header_version`). The answer
//! addresses the sender: its source address becomes the destination GID,
//! and the local address it was sent to picks the source GID index.

use crate::errno::{null, set_errno};
use crate::ffi::*;
use crate::handles::UContext;
use std::ffi::c_int;

/// Where the RoCE v2 IPv4 header sits in the GRH area.
const IPV4_AT: usize = 20;
/// The IPv6 next header of RoCE v1 (a BTH after the GRH).
const IB_NEXT_HDR: u8 = 0x1b;
const UDP: u8 = 17;

/// Which header the GRH area holds: 4, 6, or None (EPROTONOSUPPORT). An
/// area whose first nibble says 6 may still hold an IPv4 header: a valid
/// 20-byte one (IHL 5, checksum right) at offset 20 wins, as in rdma-core.
fn header_version(g: &[u8; 40]) -> Option<u8> {
    let ip4 = &g[IPV4_AT..];
    if g[0] >> 4 != 6 {
        return (ip4[0] >> 4 == 4).then_some(4);
    }
    if ip4[0] & 0xf != 5 {
        return Some(6);
    }
    let mut sum: u32 = 0;
    for (i, w) in ip4.chunks(2).enumerate() {
        if i != 5 {
            sum += u32::from(u16::from_be_bytes([w[0], w[1]]));
        }
    }
    while sum > 0xffff {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    let check = !(sum as u16);
    Some(if check == u16::from_be_bytes([ip4[10], ip4[11]]) { 4 } else { 6 })
}

fn v4_mapped(a: [u8; 4]) -> [u8; 16] {
    let mut g = [0u8; 16];
    g[10] = 0xff;
    g[11] = 0xff;
    g[12..].copy_from_slice(&a);
    g
}

/// The index of `gid` (a RoCE v2 GID unless `v1`) in the port's table, as
/// `ibv_find_gid_index` walks it: uroce's table holds its RoCE v2 GID at
/// index 0 and empty entries after it (ENODATA at the first, as rdma-core's
/// walk stops there).
fn find_gid_index(u: &UContext, port: u8, gid: &[u8; 16], v1: bool) -> Result<u8, c_int> {
    if port != 1 {
        return Err(libc::EINVAL);
    }
    match u.ctx.query_gid(0) {
        Ok(g) if g.0 == *gid && !v1 => Ok(0),
        Ok(_) => Err(libc::ENODATA),
        Err(e) => Err(e.errno.0),
    }
}

/// `ibv_init_ah_from_wc`: 0, or -1 with errno set.
#[no_mangle]
pub unsafe extern "C" fn ibv_init_ah_from_wc(
    context: *mut ibv_context,
    port_num: u8,
    wc: *mut ibv_wc,
    grh: *mut ibv_grh,
    ah_attr: *mut ibv_ah_attr,
) -> c_int {
    if context.is_null() || wc.is_null() || grh.is_null() || ah_attr.is_null() {
        set_errno(libc::EINVAL);
        return -1;
    }
    // SAFETY: our context; the caller's completion, 40-byte GRH area (the
    // start of the receive buffer) and out attributes.
    let (u, wc, g, a) = unsafe { (UContext::from_ctx(context), &*wc, &*(grh as *const [u8; 40]), &mut *ah_attr) };
    match init(u, port_num, wc, g, a) {
        Ok(()) => 0,
        Err(e) => {
            set_errno(e);
            -1
        }
    }
}

fn init(u: &UContext, port_num: u8, wc: &ibv_wc, g: &[u8; 40], a: &mut ibv_ah_attr) -> Result<(), c_int> {
    // SAFETY: ibv_ah_attr is plain old data.
    *a = unsafe { std::mem::zeroed() };
    let flow = u32::from_be_bytes([g[0], g[1], g[2], g[3]]);
    a.grh.flow_label = flow & 0xf_ffff;
    a.dlid = wc.slid;
    a.sl = wc.sl;
    a.src_path_bits = wc.dlid_path_bits;
    a.port_num = port_num;
    if wc.wc_flags & ibv_wc_flags_IBV_WC_GRH == 0 {
        return Ok(());
    }
    a.is_global = 1;
    match header_version(g) {
        Some(4) => {
            let ip = &g[IPV4_AT..];
            let (src, dst) = ([ip[12], ip[13], ip[14], ip[15]], [ip[16], ip[17], ip[18], ip[19]]);
            if (224..=239).contains(&dst[0]) {
                // A multicast destination has no GID of ours.
                return Err(libc::EINVAL);
            }
            a.grh.sgid_index = find_gid_index(u, port_num, &v4_mapped(dst), false)?;
            a.grh.dgid.raw = v4_mapped(src);
            a.grh.hop_limit = ip[8];
            a.grh.traffic_class = ip[1];
            Ok(())
        }
        Some(_) => {
            let (next_hdr, hop_limit) = (g[6], g[7]);
            let sgid: [u8; 16] = g[8..24].try_into().expect("16 bytes");
            let dgid: [u8; 16] = g[24..40].try_into().expect("16 bytes");
            if dgid[0] == 0xff {
                return Err(libc::EINVAL);
            }
            let v1 = match next_hdr {
                UDP => false,
                IB_NEXT_HDR => true,
                _ => return Err(libc::EPROTONOSUPPORT),
            };
            a.grh.dgid.raw = sgid;
            a.grh.sgid_index = find_gid_index(u, port_num, &dgid, v1)?;
            a.grh.hop_limit = hop_limit;
            a.grh.traffic_class = (flow >> 20) as u8;
            Ok(())
        }
        None => Err(libc::EPROTONOSUPPORT),
    }
}

/// `ibv_create_ah_from_wc`: an address handle that answers the sender of
/// `wc`, or NULL with errno.
#[no_mangle]
pub unsafe extern "C" fn ibv_create_ah_from_wc(
    pd: *mut ibv_pd,
    wc: *mut ibv_wc,
    grh: *mut ibv_grh,
    port_num: u8,
) -> *mut ibv_ah {
    if pd.is_null() {
        return null(libc::EINVAL);
    }
    // SAFETY: ibv_ah_attr is plain old data.
    let mut attr: ibv_ah_attr = unsafe { std::mem::zeroed() };
    // SAFETY: a PD of this library; the caller's completion and GRH area.
    if unsafe { ibv_init_ah_from_wc((*pd).context, port_num, wc, grh, &mut attr) } != 0 {
        return std::ptr::null_mut();
    }
    // SAFETY: the caller's PD and the attributes just built.
    unsafe { crate::objects::ibv_create_ah(pd, &mut attr) }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ipv4_area(src: [u8; 4], dst: [u8; 4], with_checksum: bool, first: u8) -> [u8; 40] {
        let mut g = [0u8; 40];
        g[0] = first;
        let ip = &mut g[20..];
        ip[0] = 0x45;
        ip[1] = 0x28;
        ip[2..4].copy_from_slice(&60u16.to_be_bytes());
        ip[8] = 33;
        ip[9] = 17;
        ip[12..16].copy_from_slice(&src);
        ip[16..20].copy_from_slice(&dst);
        if with_checksum {
            let mut sum: u32 = ip.chunks(2).map(|w| u32::from(u16::from_be_bytes([w[0], w[1]]))).sum();
            while sum > 0xffff {
                sum = (sum & 0xffff) + (sum >> 16);
            }
            ip[10..12].copy_from_slice(&(!(sum as u16)).to_be_bytes());
        }
        g
    }

    #[test]
    fn header_version_as_rdma_core() {
        // IPv4 header after 20 zero bytes (rxe, mlx5).
        assert_eq!(header_version(&ipv4_area([1, 2, 3, 4], [5, 6, 7, 8], false, 0)), Some(4));
        // First nibble 6 but a valid IPv4 header at 20: IPv4.
        assert_eq!(header_version(&ipv4_area([1, 2, 3, 4], [5, 6, 7, 8], true, 0x60)), Some(4));
        // First nibble 6, bad checksum at 20: IPv6.
        assert_eq!(header_version(&ipv4_area([1, 2, 3, 4], [5, 6, 7, 8], false, 0x60)), Some(6));
        // Neither.
        assert_eq!(header_version(&[0u8; 40]), None);
    }
}
