//! Floats as the switch sums them: fixed-point i32s with `frac_bits`
//! fractional bits. Each value is rounded to the nearest step of
//! 2^-frac_bits, so a sum over n workers is within n · 2^-(frac_bits+1)
//! of the exact sum, unless it saturates (flagged). Integers need no
//! conversion and sum exactly.

/// `x` in fixed point, rounded to nearest and clamped to an i32.
pub fn to_fixed(x: f32, frac_bits: u32) -> i32 {
    let scaled = f64::from(x) * f64::from(frac_bits.min(30)).exp2();
    scaled.round().clamp(f64::from(i32::MIN), f64::from(i32::MAX)) as i32
}

pub fn from_fixed(v: i32, frac_bits: u32) -> f32 {
    (f64::from(v) / f64::from(frac_bits.min(30)).exp2()) as f32
}

/// The most a sum of `workers` rounded values may differ from the exact
/// sum.
pub fn error_bound(workers: usize, frac_bits: u32) -> f64 {
    workers as f64 * f64::from(frac_bits.min(30) + 1).exp2().recip()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_within_half_a_step() {
        for x in [0.0f32, 1.5, -2.25, 0.1, -1234.567] {
            let back = from_fixed(to_fixed(x, 16), 16);
            assert!(f64::from((back - x).abs()) <= error_bound(1, 16) + 1e-6, "{x} -> {back}");
        }
        assert_eq!(to_fixed(1e12, 16), i32::MAX, "clamped");
        assert_eq!(to_fixed(3.0, 0), 3);
    }
}
