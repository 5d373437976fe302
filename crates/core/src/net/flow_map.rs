//! Per-flow tables of the network model, keyed by the drivers' 64-bit flow numbers.
//!
//! Drivers number a flow by its two ends (the simulator: `from << 32 | to`), so the flows
//! through one port often differ only in their high bits. A multiplicative hash (FxHash)
//! carries only low bits into the low bits that pick a hash table's bucket: every flow into
//! a server's ingress port landed in one bucket, and a lookup probed through all of them
//! (15 % of a 1,024-worker simulation). [`FlowHasher`] folds the high half into the low
//! half before multiplying.

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};

/// A table of per-flow state.
pub(crate) type FlowMap<V> = HashMap<u64, V, BuildHasherDefault<FlowHasher>>;

/// The hash of a flow number: both halves folded together, then multiplied (odd constant)
/// so that every input bit reaches the high bits too.
#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct FlowHasher(u64);

impl Hasher for FlowHasher {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        for b in bytes {
            self.write_u64(u64::from(*b) ^ self.0.rotate_left(8));
        }
    }

    fn write_u64(&mut self, x: u64) {
        let folded = x ^ x.rotate_right(32) ^ self.0;
        self.0 = folded.wrapping_mul(0x9E37_79B9_7F4A_7C15);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::hash::BuildHasher;

    /// Flows that differ only in their high half (every worker's flow into one server)
    /// spread over the low bits that pick a bucket.
    #[test]
    fn flows_into_one_port_spread_over_buckets() {
        let build = BuildHasherDefault::<FlowHasher>::default();
        let buckets: std::collections::BTreeSet<u64> = (0u64..1024)
            .map(|from| build.hash_one((from << 32) | 7) & 1023)
            .collect();
        assert!(buckets.len() > 600, "{} of 1024 buckets", buckets.len());
    }
}
