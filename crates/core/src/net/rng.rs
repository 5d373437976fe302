//! A tiny seeded random stream (SplitMix64): every random choice of the network model
//! comes from one, derived from the job's seed, so the same seed gives the same losses.

/// SplitMix64 (Steele, Lea and Flood 2014): 64 bits of state, passes BigCrush, and any seed
/// (0 included) gives a good stream.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SplitMix64 {
    state: u64,
}

/// One SplitMix64 output step: a bijective mix of `z`.
pub(crate) fn mix(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// Hashes a sequence of numbers into one (order matters), e.g. (seed, host, direction).
pub fn hash(parts: &[u64]) -> u64 {
    parts
        .iter()
        .fold(0x6A09_E667_F3BC_C909, |h, &p| mix(h ^ mix(p)))
}

impl SplitMix64 {
    const GAMMA: u64 = 0x9E37_79B9_7F4A_7C15;

    /// A stream starting from `seed`.
    pub fn new(seed: u64) -> Self {
        Self { state: seed }
    }

    /// A stream of its own for `parts` (e.g. seed, host, direction, path).
    pub fn derive(parts: &[u64]) -> Self {
        Self::new(hash(parts))
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.state = self.state.wrapping_add(Self::GAMMA);
        mix(self.state)
    }

    /// A uniform number in `[0, 1)` (53 random bits).
    pub fn next_f64(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
    }

    /// `true` with probability `p` (never for `p <= 0`, always for `p >= 1`).
    pub fn chance(&mut self, p: f64) -> bool {
        self.next_f64() < p
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The reference outputs of SplitMix64 seeded with 1234567 (from the published C code).
    #[test]
    fn matches_the_reference_stream() {
        let mut r = SplitMix64::new(1234567);
        assert_eq!(r.next_u64(), 6457827717110365317);
        assert_eq!(r.next_u64(), 3203168211198807973);
    }

    #[test]
    fn uniform_mean_is_a_half() {
        let mut r = SplitMix64::derive(&[7, 1, 0]);
        let n = 100_000;
        let mean = (0..n).map(|_| r.next_f64()).sum::<f64>() / n as f64;
        // sigma of the mean: sqrt(1/12 / n) ~ 0.0009
        assert!((mean - 0.5).abs() < 0.003, "mean {mean}");
    }
}
