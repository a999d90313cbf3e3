//! 24-bit packet sequence numbers and their half-space modular order
//! (`psn_compare` of rxe: `(s32)((a - b) << 8)`).

/// A PSN mask: PSNs are 24 bits wide.
pub const PSN_MASK: u32 = 0x00FF_FFFF;

/// `a + n` modulo 2^24.
#[inline]
pub fn add(a: u32, n: u32) -> u32 {
    a.wrapping_add(n) & PSN_MASK
}

/// `a - b` as a signed distance in the half space (−2^23 .. 2^23).
#[inline]
pub fn diff(a: u32, b: u32) -> i32 {
    ((a.wrapping_sub(b)) << 8) as i32 >> 8
}

#[inline]
pub fn lt(a: u32, b: u32) -> bool {
    diff(a, b) < 0
}

#[inline]
pub fn le(a: u32, b: u32) -> bool {
    diff(a, b) <= 0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wraps_at_24_bits() {
        assert_eq!(add(PSN_MASK, 1), 0);
        assert_eq!(diff(0, PSN_MASK), 1);
        assert_eq!(diff(PSN_MASK, 0), -1);
        assert!(lt(PSN_MASK, 2));
        assert!(le(5, 5));
        assert!(!lt(5, 5));
        assert_eq!(diff(0x40_0000, 0), 0x40_0000);
        assert_eq!(diff(0x80_0000, 0), -0x80_0000);
    }
}
