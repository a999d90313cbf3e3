//! The UDP socket of a device. For IPv4 it is unconnected with
//! `IP_MTU_DISCOVER = IP_PMTUDISC_DO`, so the kernel sends DF with an IP
//! Identification of 0: the value the ICRC is computed with (see
//! shared/spec/platform.md). Datagrams are never fragmented.

use socket2::{Domain, Protocol, SockAddr, Socket, Type};
use std::io;
use std::net::SocketAddr;
use std::os::fd::{AsRawFd, RawFd};

#[derive(Debug)]
pub struct RoceSocket {
    sock: Socket,
    local: SocketAddr,
}

impl RoceSocket {
    pub fn bind(addr: SocketAddr) -> io::Result<RoceSocket> {
        let domain = if addr.is_ipv4() { Domain::IPV4 } else { Domain::IPV6 };
        let sock = Socket::new(domain, Type::DGRAM.nonblocking().cloexec(), Some(Protocol::UDP))?;
        if addr.is_ipv6() {
            sock.set_only_v6(true)?;
        }
        let _ = sock.set_recv_buffer_size(8 << 20);
        let _ = sock.set_send_buffer_size(8 << 20);
        if addr.ip().is_ipv4() {
            let val: libc::c_int = libc::IP_PMTUDISC_DO;
            // SAFETY: setsockopt reads `size_of::<c_int>()` bytes from &val.
            let rc = unsafe {
                libc::setsockopt(
                    sock.as_raw_fd(),
                    libc::IPPROTO_IP,
                    libc::IP_MTU_DISCOVER,
                    (&val as *const libc::c_int).cast(),
                    std::mem::size_of::<libc::c_int>() as libc::socklen_t,
                )
            };
            if rc != 0 {
                return Err(io::Error::last_os_error());
            }
        }
        sock.bind(&SockAddr::from(addr))?;
        let local = sock.local_addr()?.as_socket().ok_or_else(|| io::Error::other("not an IP socket"))?;
        Ok(RoceSocket { sock, local })
    }

    pub fn local_addr(&self) -> SocketAddr {
        self.local
    }

    pub fn send_to(&self, data: &[u8], dst: SocketAddr) -> io::Result<usize> {
        self.sock.send_to(data, &SockAddr::from(dst))
    }

    /// Receives one datagram without blocking.
    pub fn recv_from(&self, buf: &mut [u8]) -> io::Result<(usize, SocketAddr)> {
        // SAFETY: `MaybeUninit<u8>` has the layout of u8, and socket2 only
        // writes initialised bytes into the slice.
        let uninit = unsafe { &mut *(buf as *mut [u8] as *mut [std::mem::MaybeUninit<u8>]) };
        let (n, from) = self.sock.recv_from(uninit)?;
        let from = from.as_socket().ok_or_else(|| io::Error::other("not an IP peer"))?;
        Ok((n, from))
    }
}

impl AsRawFd for RoceSocket {
    fn as_raw_fd(&self) -> RawFd {
        self.sock.as_raw_fd()
    }
}
