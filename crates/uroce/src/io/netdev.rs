//! Facts about the network interface that carries a device's address: its
//! MTU, from which the RoCE active MTU follows as rxe derives it (the largest
//! IB MTU not above the interface MTU minus 80 bytes of headers), and its
//! index (the `ndev_ifindex` of a GID entry, as rxe's GIDs name their netdev).

use std::net::IpAddr;

/// The MTU of the interface that has `addr`, if one does.
pub fn interface_mtu(addr: IpAddr) -> Option<u32> {
    let name = interface_of(addr)?;
    let path = format!("/sys/class/net/{name}/mtu");
    std::fs::read_to_string(path).ok()?.trim().parse().ok()
}

#[cfg(feature = "unstable")]
/// The index of the interface that has `addr` (a loopback address: `lo`),
/// if one does.
pub fn interface_index(addr: IpAddr) -> Option<u32> {
    let name = std::ffi::CString::new(interface_of(addr)?).ok()?;
    // SAFETY: a NUL-terminated name; if_nametoindex only reads it.
    let i = unsafe { libc::if_nametoindex(name.as_ptr()) };
    (i != 0).then_some(i)
}

/// The RoCE active MTU (bytes) for an interface MTU: rxe's rule.
pub fn roce_mtu_for(netdev_mtu: u32) -> crate::ib::Mtu {
    crate::ib::Mtu::from_bytes_floor(netdev_mtu.saturating_sub(80))
}

fn interface_of(addr: IpAddr) -> Option<String> {
    let mut ifap: *mut libc::ifaddrs = std::ptr::null_mut();
    // SAFETY: getifaddrs allocates a list we free below with freeifaddrs.
    if unsafe { libc::getifaddrs(&mut ifap) } != 0 {
        return None;
    }
    let mut found = None;
    let mut cur = ifap;
    while !cur.is_null() {
        // SAFETY: `cur` is a node of the list getifaddrs returned.
        let ifa = unsafe { &*cur };
        if !ifa.ifa_addr.is_null() {
            // SAFETY: ifa_addr points to a sockaddr of the family it names.
            let fam = unsafe { (*ifa.ifa_addr).sa_family } as i32;
            let ip = match fam {
                libc::AF_INET => {
                    // SAFETY: family AF_INET means a sockaddr_in.
                    let sin = unsafe { &*(ifa.ifa_addr as *const libc::sockaddr_in) };
                    Some(IpAddr::from(u32::from_be(sin.sin_addr.s_addr).to_be_bytes()))
                }
                libc::AF_INET6 => {
                    // SAFETY: family AF_INET6 means a sockaddr_in6.
                    let sin6 = unsafe { &*(ifa.ifa_addr as *const libc::sockaddr_in6) };
                    Some(IpAddr::from(sin6.sin6_addr.s6_addr))
                }
                _ => None,
            };
            let matches = ip == Some(addr) || (addr.is_loopback() && ip.is_some_and(|i| i.is_loopback()));
            if matches {
                // SAFETY: ifa_name is a NUL-terminated C string owned by the list.
                found = Some(unsafe { std::ffi::CStr::from_ptr(ifa.ifa_name) }.to_string_lossy().into_owned());
                break;
            }
        }
        cur = ifa.ifa_next;
    }
    // SAFETY: frees the list from getifaddrs exactly once.
    unsafe { libc::freeifaddrs(ifap) };
    found
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loopback_mtu_and_rxe_rule() {
        let m = interface_mtu("127.0.0.1".parse().unwrap()).expect("lo exists");
        assert!(m >= 1500);
        assert_eq!(roce_mtu_for(1500).bytes(), 1024);
        assert_eq!(roce_mtu_for(9000).bytes(), 4096);
        assert_eq!(roce_mtu_for(65536).bytes(), 4096);
    }

    #[test]
    fn loopback_index_is_lo() {
        // SAFETY: a NUL-terminated literal.
        let lo = unsafe { libc::if_nametoindex(c"lo".as_ptr()) };
        assert!(lo != 0);
        assert_eq!(interface_index("127.0.0.84".parse().unwrap()), Some(lo));
        assert_eq!(interface_index("::1".parse().unwrap()), Some(lo));
        assert_eq!(interface_index("192.0.2.77".parse().unwrap()), None);
    }
}
