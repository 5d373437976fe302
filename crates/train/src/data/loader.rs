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
    /// Starts prefetching after `start_step` steps (epoch `start_step / steps_per_epoch`, at
    /// its step `start_step % steps_per_epoch`: where a resumed job left off), up to the end
    /// of `epochs` epochs counted from that first epoch (`None`: forever).
    pub fn spawn(
        split: Arc<Split>,
        sampler: EpochSampler,
        start_step: u64,
        epochs: Option<u64>,
        depth: usize,
    ) -> Self {
        let (tx, rx) = sync_channel(depth.max(1));
        let handle = std::thread::Builder::new()
            .name("syncopate-loader".into())
            .spawn(move || {
                let per_epoch = sampler.steps_per_epoch().max(1) as u64;
                let start_epoch = start_step / per_epoch;
                let mut first = (start_step % per_epoch) as usize;
                let mut epoch = start_epoch;
                loop {
                    if epochs.is_some_and(|n| epoch >= start_epoch.saturating_add(n)) {
                        return;
                    }
                    let perm = sampler.permutation(epoch);
                    for step in std::mem::take(&mut first)..sampler.steps_per_epoch() {
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

    /// A split of `n` one-value samples, sample `i` holding `i` and labelled `i`.
    fn numbered(n: u8) -> Arc<Split> {
        Arc::new(Split {
            images: (0..n).map(f32::from).collect(),
            labels: (0..n).collect(),
            shape: [1, 1, 1],
        })
    }

    #[test]
    fn yields_the_sampler_order_and_stops() {
        let split = numbered(20);
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

    /// A loader started after k steps yields exactly what an unstarted one yields from its
    /// k-th batch on (a resumed job sees the batches the uninterrupted one would).
    #[test]
    fn a_loader_started_mid_epoch_continues_the_same_sequence() {
        let split = numbered(40);
        let sampler = EpochSampler::new(40, 4, 0, 2, 9).unwrap();
        let labels = |start: u64| {
            let mut l = Loader::spawn(split.clone(), sampler.clone(), start, None, 2);
            (0..12)
                .map(|_| l.next_batch().unwrap())
                .map(|(e, s, b)| (e, s, b.labels))
                .collect::<Vec<_>>()
        };
        let all = labels(0);
        for start in [1u64, 5, 7] {
            let skip = start as usize;
            assert_eq!(labels(start)[..12 - skip], all[skip..]);
        }
    }
}
