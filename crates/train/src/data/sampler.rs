//! Deterministic sharded sampling.
//!
//! Each epoch the whole training split is shuffled with a seed derived from the job seed and
//! the epoch; global batch `t` is positions `t*N*b .. (t+1)*N*b` of that permutation, and
//! worker `r` of `N` takes the `r`-th block of `b`. So N workers with batch `b` see exactly
//! the samples one process with batch `N*b` sees, which makes synchronous strategies
//! reproduce single-process training.

use rand::seq::SliceRandom;
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;

use crate::error::{Result, TrainError};

/// Produces the sample indices of one worker's batches, epoch after epoch.
#[derive(Debug, Clone)]
pub struct EpochSampler {
    len: usize,
    batch: usize,
    rank: usize,
    world: usize,
    seed: u64,
}

impl EpochSampler {
    /// A sampler over `len` samples for worker `rank` of `world`, each taking `batch` samples.
    pub fn new(len: usize, batch: usize, rank: usize, world: usize, seed: u64) -> Result<Self> {
        if batch == 0 || world == 0 {
            return Err(TrainError::Config(
                "batch size and world size must be at least 1".into(),
            ));
        }
        if rank >= world {
            return Err(TrainError::Config(format!(
                "rank {rank} is outside a world of {world}"
            )));
        }
        if batch * world > len {
            return Err(TrainError::Config(format!(
                "a global batch of {} ({world} x {batch}) is larger than the {len} training samples",
                batch * world
            )));
        }
        Ok(Self {
            len,
            batch,
            rank,
            world,
            seed,
        })
    }

    /// Whole global batches in one epoch (the incomplete tail is dropped).
    pub fn steps_per_epoch(&self) -> usize {
        self.len / (self.batch * self.world)
    }

    /// The global permutation of one epoch.
    pub fn permutation(&self, epoch: u64) -> Vec<usize> {
        let mut order: Vec<usize> = (0..self.len).collect();
        let mut rng =
            ChaCha8Rng::seed_from_u64(self.seed ^ epoch.wrapping_mul(0x9E37_79B9_7F4A_7C15));
        order.shuffle(&mut rng);
        order
    }

    /// This worker's indices for `step` (0-based within the epoch) given the epoch's permutation.
    pub fn batch_indices<'a>(&self, permutation: &'a [usize], step: usize) -> &'a [usize] {
        let start = (step * self.world + self.rank) * self.batch;
        &permutation[start..start + self.batch]
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        /// N workers' batches at step t, concatenated in rank order, are the single-process
        /// global batch at step t; no sample repeats within an epoch.
        #[test]
        fn shards_concatenate_to_the_global_batch(
            len in 8usize..500, batch in 1usize..8, world in 1usize..5, seed: u64, epoch in 0u64..3,
        ) {
            prop_assume!(batch * world <= len);
            let single = EpochSampler::new(len, batch * world, 0, 1, seed).unwrap();
            let perm = single.permutation(epoch);
            let mut seen = std::collections::HashSet::new();
            for step in 0..single.steps_per_epoch() {
                let mut joined = Vec::new();
                for rank in 0..world {
                    let s = EpochSampler::new(len, batch, rank, world, seed).unwrap();
                    prop_assert_eq!(s.steps_per_epoch(), single.steps_per_epoch());
                    prop_assert_eq!(s.permutation(epoch), perm.clone());
                    joined.extend_from_slice(s.batch_indices(&perm, step));
                }
                prop_assert_eq!(&joined[..], single.batch_indices(&perm, step));
                for i in joined { prop_assert!(seen.insert(i)); }
            }
        }
    }

    #[test]
    fn rejects_bad_settings() {
        assert!(EpochSampler::new(10, 0, 0, 1, 0).is_err());
        assert!(EpochSampler::new(10, 2, 2, 2, 0).is_err());
        assert!(EpochSampler::new(10, 6, 0, 2, 0).is_err());
    }
}
