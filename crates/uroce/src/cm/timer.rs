//! CM timer values (IBA 12.7; `k/cm.c`, `k/cma.c`): the 5-bit exponents the
//! CM puts on the wire, their conversion to milliseconds as Linux does it,
//! and the constants rdma_cm uses on RoCE.

use std::time::Duration;

/// CM response timeout rdma_cm asks for (`CMA_CM_RESPONSE_TIMEOUT`).
pub const CM_RESPONSE_TIMEOUT: u8 = 20;
/// Max CM retries rdma_cm asks for (`CMA_MAX_CM_RETRIES`).
pub const MAX_CM_RETRIES: u8 = 15;
/// Packet life time of a RoCE path (`CMA_IBOE_PACKET_LIFETIME`, 16 since 2022).
pub const IBOE_PACKET_LIFETIME: u8 = 16;
/// rxe's local CA ACK delay (`RXE_LOCAL_CA_ACK_DELAY`).
pub const CA_ACK_DELAY: u8 = 15;
/// Service timeout of the MRA rdma_cm prepares (`CMA_CM_MRA_SETTING`).
pub const MRA_SERVICE_TIMEOUT: u8 = 24;
/// SIDR_REQ timeout exponent (4096 ms) and retries (`k/cma.c` `cma_resolve_ib_udp`).
pub const SIDR_TIMEOUT: u8 = 20;
/// SIDR_REQ retransmissions before the exchange is unreachable.
pub const SIDR_RETRIES: u8 = 15;

/// `cm_convert_to_ms`: 4.096 µs × 2^n rounded to a power of two milliseconds.
pub fn to_ms(n: u8) -> u64 {
    1u64 << (n.min(31).saturating_sub(8))
}

/// The same as a `Duration`.
pub fn duration(n: u8) -> Duration {
    Duration::from_millis(to_ms(n))
}

/// `cm_ack_timeout`: the local ACK timeout of a path from the CA's ACK
/// delay and the path's packet life time.
pub fn ack_timeout(ca_ack_delay: u8, packet_life_time: u8) -> u8 {
    let mut t = packet_life_time as u32 + 1;
    let d = ca_ack_delay as u32;
    if t >= d {
        t += (d + 1 >= t) as u32;
    } else {
        t = d + (t + 1 >= d) as u32;
    }
    t.min(31) as u8
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn linux_conversions() {
        assert_eq!([to_ms(16), to_ms(17), to_ms(18), to_ms(20), to_ms(24)], [256, 512, 1024, 4096, 65536]);
        assert_eq!(to_ms(0), 1);
        assert_eq!(to_ms(31), 1 << 23);
        // REQ Local ACK Timeout of rxe (PLT 16) and of kernels still at PLT 18.
        assert_eq!(ack_timeout(CA_ACK_DELAY, 16), 17);
        assert_eq!(ack_timeout(CA_ACK_DELAY, 18), 19);
        assert_eq!(ack_timeout(20, 16), 20);
        assert_eq!(ack_timeout(18, 16), 19);
        assert_eq!(ack_timeout(31, 31), 31);
    }
}
