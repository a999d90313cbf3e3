//! Socket addresses between Rust and C: a caller's `sockaddr` read, a
//! `SocketAddr` written as the `sockaddr_storage` ids and events carry.

use std::ffi::c_int;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

/// A caller's sockaddr (AF_INET / AF_INET6).
pub unsafe fn read_sockaddr(sa: *const libc::sockaddr) -> Option<SocketAddr> {
    if sa.is_null() {
        return None;
    }
    // SAFETY: the caller's sockaddr of the family it says.
    unsafe {
        match (*sa).sa_family as c_int {
            libc::AF_INET => {
                let s = &*(sa as *const libc::sockaddr_in);
                Some(SocketAddr::new(
                    IpAddr::V4(Ipv4Addr::from(u32::from_be(s.sin_addr.s_addr))),
                    u16::from_be(s.sin_port),
                ))
            }
            libc::AF_INET6 => {
                let s = &*(sa as *const libc::sockaddr_in6);
                let ip = Ipv6Addr::from(s.sin6_addr.s6_addr);
                Some(SocketAddr::new(ip.to_ipv4_mapped().map_or(IpAddr::V6(ip), IpAddr::V4), u16::from_be(s.sin6_port)))
            }
            _ => None,
        }
    }
}

pub fn sockaddr_of(a: SocketAddr) -> libc::sockaddr_storage {
    // SAFETY: all-zero is a valid sockaddr_storage.
    let mut s: libc::sockaddr_storage = unsafe { std::mem::zeroed() };
    match a {
        SocketAddr::V4(v) => {
            // SAFETY: sockaddr_in fits in sockaddr_storage.
            let sin = unsafe { &mut *(&mut s as *mut _ as *mut libc::sockaddr_in) };
            sin.sin_family = libc::AF_INET as u16;
            sin.sin_port = v.port().to_be();
            sin.sin_addr.s_addr = u32::from(*v.ip()).to_be();
        }
        SocketAddr::V6(v) => {
            // SAFETY: sockaddr_in6 fits in sockaddr_storage.
            let sin = unsafe { &mut *(&mut s as *mut _ as *mut libc::sockaddr_in6) };
            sin.sin6_family = libc::AF_INET6 as u16;
            sin.sin6_port = v.port().to_be();
            sin.sin6_addr.s6_addr = v.ip().octets();
        }
    }
    s
}
