//! A deterministic, seeded, learnable synthetic image dataset: each class is a random
//! prototype image, and each sample is its class prototype plus Gaussian-ish noise.

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde::{Deserialize, Serialize};

use super::{Dataset, Split};

/// Size and shape of the synthetic dataset.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SyntheticSpec {
    /// Training samples.
    pub train_len: usize,
    /// Test samples.
    pub test_len: usize,
    /// Shape of one sample `[C, H, W]`.
    pub shape: [usize; 3],
    /// Number of classes.
    pub classes: usize,
    /// Noise amplitude relative to the prototypes (higher is harder).
    pub noise: f32,
    /// Seed of the prototypes and of every sample.
    pub seed: u64,
}

impl Default for SyntheticSpec {
    fn default() -> Self {
        Self {
            train_len: 8192,
            test_len: 1024,
            shape: [1, 28, 28],
            classes: 10,
            noise: 1.5,
            seed: 7,
        }
    }
}

impl SyntheticSpec {
    /// Generates the dataset; the same spec gives the same bytes on every machine.
    pub fn generate(&self) -> Dataset {
        let n = self.shape.iter().product::<usize>();
        let mut rng = ChaCha8Rng::seed_from_u64(self.seed);
        let prototypes: Vec<Vec<f32>> = (0..self.classes)
            .map(|_| (0..n).map(|_| rng.gen_range(-1.0f32..1.0)).collect())
            .collect();
        let mut make = |len: usize| {
            let mut images = Vec::with_capacity(len * n);
            let mut labels = Vec::with_capacity(len);
            for i in 0..len {
                let class = i % self.classes.max(1);
                labels.push(class as u8);
                images.extend(prototypes[class].iter().map(|&p| {
                    // Sum of three uniforms: cheap, bounded, bell-shaped noise.
                    let noise: f32 = (0..3).map(|_| rng.gen_range(-1.0f32..1.0)).sum::<f32>();
                    p + self.noise * noise / 3.0
                }));
            }
            Split {
                images,
                labels,
                shape: self.shape,
            }
        };
        let train = make(self.train_len);
        let test = make(self.test_len);
        Dataset {
            name: "synthetic".into(),
            train,
            test,
            classes: self.classes,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn same_seed_same_bytes_other_seed_other_bytes() {
        let spec = SyntheticSpec {
            train_len: 20,
            test_len: 5,
            ..Default::default()
        };
        let a = spec.generate();
        let b = spec.generate();
        assert_eq!(a.train.images, b.train.images);
        assert_eq!(a.test.labels, b.test.labels);
        let c = SyntheticSpec { seed: 8, ..spec }.generate();
        assert_ne!(a.train.images, c.train.images);
        assert_eq!(a.train.len(), 20);
        assert_eq!(a.test.images.len(), 5 * 28 * 28);
    }
}
