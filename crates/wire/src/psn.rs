//! 24-bit packet sequence numbers and their modular arithmetic.
//!
//! PSNs wrap at 2^24. Following IBTA vol. 1 section 9.7.1, a PSN `b` is
//! "after" `a` when it lies in the half of the circle that follows `a`, so
//! comparisons stay meaningful across the wrap as long as fewer than 2^23
//! packets are outstanding.

use core::fmt;

/// A 24-bit packet sequence number.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Default)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct Psn(u32);

impl Psn {
    /// Number of distinct PSNs.
    pub const MODULUS: u32 = 1 << 24;
    const MASK: u32 = Self::MODULUS - 1;
    /// Half the circle: the largest distance that still orders two PSNs.
    pub const HALF: u32 = 1 << 23;

    /// The PSN `value` modulo 2^24.
    pub const fn new(value: u32) -> Psn {
        Psn(value & Self::MASK)
    }

    /// The raw 24-bit value.
    pub const fn value(self) -> u32 {
        self.0
    }

    /// This PSN plus `n`, wrapping.
    pub const fn add(self, n: u32) -> Psn {
        Psn::new(self.0.wrapping_add(n))
    }

    /// This PSN minus `n`, wrapping.
    pub const fn sub(self, n: u32) -> Psn {
        Psn::new(self.0.wrapping_sub(n))
    }

    /// The next PSN.
    pub const fn next(self) -> Psn {
        self.add(1)
    }

    /// How far `self` lies ahead of `earlier`, as a signed distance in
    /// (-2^23, 2^23]: positive when `self` comes after `earlier`.
    pub const fn distance_from(self, earlier: Psn) -> i32 {
        let d = self.0.wrapping_sub(earlier.0) & Self::MASK;
        if d > Self::HALF { d as i32 - Self::MODULUS as i32 } else { d as i32 }
    }

    /// Is `self` strictly before `other` on the circle?
    pub const fn is_before(self, other: Psn) -> bool {
        other.distance_from(self) > 0
    }

    /// Is `self` before or equal to `other`?
    pub const fn is_at_or_before(self, other: Psn) -> bool {
        other.distance_from(self) >= 0
    }
}

impl fmt::Debug for Psn {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Psn({:#08x})", self.0)
    }
}

impl fmt::Display for Psn {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:#08x}", self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn wraps_at_24_bits() {
        assert_eq!(Psn::new(0xff_ffff).next(), Psn::new(0));
        assert_eq!(Psn::new(0).sub(1), Psn::new(0xff_ffff));
        assert_eq!(Psn::new(0x1_000_005).value(), 5);
    }

    #[test]
    fn ordering_crosses_the_wrap() {
        let before_wrap = Psn::new(0xff_fff0);
        let after_wrap = Psn::new(0x10);
        assert!(before_wrap.is_before(after_wrap));
        assert!(!after_wrap.is_before(before_wrap));
        assert_eq!(after_wrap.distance_from(before_wrap), 0x20);
        assert_eq!(before_wrap.distance_from(after_wrap), -0x20);
    }

    proptest! {
        #[test]
        fn add_then_distance_is_identity(start in 0u32..Psn::MODULUS, n in 0u32..Psn::HALF) {
            let a = Psn::new(start);
            prop_assert_eq!(a.add(n).distance_from(a), n as i32);
            prop_assert_eq!(a.add(n).sub(n), a);
            prop_assert!(a.is_at_or_before(a.add(n)));
        }
    }
}
