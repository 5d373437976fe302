//! A prefetching loader: a background thread gathers the next batches while the step runs.

use std::sync::mpsc::{sync_channel, Receiver};
use std::sync::Arc;
use std::thread::JoinHandle;

use super::{Batch, EpochSampler, Split};

/// Yields this worker's batches in order, `depth` batches ahead of the consumer.
pub struct Loader {
    rx: Receiver<(u64, usize, Batch)>,
    handle: Option<JoinHandle<()>>,
}

impl Loader {
    /// Starts prefetching from `start_epoch`, step 0, for `epochs` epochs (`None`: forever).
    pub fn spawn(
        split: Arc<Split>,
        sampler: EpochSampler,
        start_epoch: u64,
        epochs: Option<u64>,
        depth: usize,
    ) -> Self {
        let (tx, rx) = sync_channel(depth.max(1));
        let handle = std::thread::Builder::new()
            .name("syncopate-loader".into())
            .spawn(move || {
                let mut epoch = start_epoch;
                loop {
                    if epochs.is_some_and(|n| epoch >= start_epoch + n) {
                        return;
                    }
                    let perm = sampler.permutation(epoch);
                    for step in 0..sampler.steps_per_epoch() {
                        let batch = split.gather(sampler.batch_indices(&perm, step));
                        if tx.send((epoch, step, batch)).is_err() {
                            return; // the consumer has gone
                        }
                    }
                    epoch += 1;
                }
            })
            .ok();
        Self { rx, handle }
    }

    /// The next `(epoch, step_in_epoch, batch)`, or `None` when the epochs are done.
    pub fn next_batch(&mut self) -> Option<(u64, usize, Batch)> {
        self.rx.recv().ok()
    }
}

impl Drop for Loader {
    fn drop(&mut self) {
        // Dropping the receiver makes the producer's next send fail, ending its loop.
        let (_tx, rx) = sync_channel(1);
        drop(std::mem::replace(&mut self.rx, rx));
        if let Some(h) = self.handle.take() {
            let _ = h.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn yields_the_sampler_order_and_stops() {
        let split = Arc::new(Split {
            images: (0..20).map(|i| i as f32).collect(),
            labels: (0..20).map(|i| i as u8).collect(),
            shape: [1, 1, 1],
        });
        let sampler = EpochSampler::new(20, 4, 1, 2, 3).unwrap();
        let mut loader = Loader::spawn(split, sampler.clone(), 0, Some(2), 2);
        let mut n = 0;
        while let Some((epoch, step, batch)) = loader.next_batch() {
            let perm = sampler.permutation(epoch);
            let want: Vec<u8> = sampler
                .batch_indices(&perm, step)
                .iter()
                .map(|&i| i as u8)
                .collect();
            assert_eq!(batch.labels, want);
            n += 1;
        }
        assert_eq!(n, 2 * sampler.steps_per_epoch());
    }
}
