//! Seeded compute jitter: SplitMix64, one stream per worker, so a worker's draws do not
//! depend on what the others do.

/// Multiplies durations by a uniform factor in `1 ± amount`.
#[derive(Debug, Clone)]
pub(crate) struct Jitter {
    state: u64,
    amount: f64,
}

impl Jitter {
    /// Stream `stream` of seed `seed`.
    pub fn new(seed: u64, stream: u64, amount: f64) -> Self {
        let mut j = Self {
            state: seed ^ stream.wrapping_mul(0xD1B5_4A32_D192_ED03),
            amount,
        };
        j.next_u64();
        j
    }

    pub(crate) fn next_u64(&mut self) -> u64 {
        self.state = self.state.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.state;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// A uniform draw from `[0, 1)`.
    pub(crate) fn unit(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }

    /// `ns` with jitter applied (unchanged, and no draw, when the amount is 0).
    pub fn apply(&mut self, ns: u64) -> u64 {
        if self.amount == 0.0 {
            return ns;
        }
        let unit = self.unit();
        (ns as f64 * (1.0 + self.amount * (2.0 * unit - 1.0))).round() as u64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stays_in_bounds_and_replays_from_the_seed() {
        let mut a = Jitter::new(7, 3, 0.1);
        let mut b = Jitter::new(7, 3, 0.1);
        let xs: Vec<u64> = (0..1000).map(|_| a.apply(1_000_000)).collect();
        assert!(xs.iter().all(|&x| (900_000..=1_100_000).contains(&x)));
        assert_eq!(
            xs,
            (0..1000).map(|_| b.apply(1_000_000)).collect::<Vec<_>>()
        );
        let mut other = Jitter::new(7, 4, 0.1);
        assert_ne!(
            xs[..10],
            (0..10).map(|_| other.apply(1_000_000)).collect::<Vec<_>>()
        );
        assert_eq!(Jitter::new(1, 1, 0.0).apply(123), 123);
    }
}
