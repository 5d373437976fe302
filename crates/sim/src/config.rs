//! What to simulate: strategy, cluster, network, scale-down and trace window.

use std::ops::Range;

use serde::{Deserialize, Serialize};
use syncopate_core::net::NetworkProfile;
use syncopate_core::sched::SchedulerKind;
use syncopate_core::wire::HEADER_LEN;

use crate::SimError;

pub use syncopate_core::strategy::{
    StrategyKind as Strategy, DEFAULT_CREDIT_BYTES, FRAME_ELEMS, P3_SLICE_PARAMS,
};

/// All-reduce bucket capacity when none is asked for (PyTorch DDP's 25 MB).
pub const DEFAULT_BUCKET_BYTES: usize = 25_000_000;

/// Everything a simulation depends on (recorded in its report).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SimConfig {
    /// Strategy.
    pub strategy: Strategy,
    /// Scheduler of every endpoint.
    pub scheduler: SchedulerKind,
    /// Bytes a worker may have pushed and not yet had answered (credit scheduler, full size).
    pub credit_bytes: usize,
    /// Workers (ranks `0..workers`).
    pub workers: usize,
    /// Parameter servers (ranks `workers..workers + servers`); 0 for all-reduce.
    pub servers: usize,
    /// Every host's network: bandwidth, latency, send window (`buffer_bytes`), the
    /// receiver's downlink (`ingress`), queues, loss, paths, retransmission timeout.
    pub network: NetworkProfile,
    /// Scale-down of the state machines' buffers, in `(0, 1]`; the wire is charged full size.
    pub scale: f64,
    /// Parameter-server slice size in full-size parameters (`None`: the strategy's default).
    pub slice_params: Option<usize>,
    /// All-reduce bucket capacity in full-size bytes.
    pub bucket_bytes: usize,
    /// Steps to simulate.
    pub steps: u64,
    /// Samples per step on each worker (for the throughput).
    pub batch: usize,
    /// Compute jitter: every layer time is multiplied by a uniform factor in `1 ± jitter`.
    pub jitter: f64,
    /// Seed of the jitter.
    pub seed: u64,
    /// Steps whose compute and frames are recorded as trace events.
    pub trace_steps: Option<Range<u64>>,
}

impl SimConfig {
    /// The runtime's defaults for `strategy` on `workers` workers and `servers` servers:
    /// 10 Gbit/s links without latency and a 256 KiB window, full scale, 10 steps of 128.
    pub fn new(strategy: Strategy, workers: usize, servers: usize) -> Self {
        Self {
            strategy,
            scheduler: strategy.default_scheduler(),
            credit_bytes: DEFAULT_CREDIT_BYTES,
            workers,
            servers,
            network: NetworkProfile {
                bandwidth_bps: Some(10e9),
                ..NetworkProfile::default()
            },
            scale: 1.0,
            slice_params: None,
            bucket_bytes: DEFAULT_BUCKET_BYTES,
            steps: 10,
            batch: 128,
            jitter: 0.0,
            seed: 0,
            trace_steps: None,
        }
    }

    /// Checks the configuration against the strategy.
    pub fn validate(&self) -> Result<(), SimError> {
        let fail = |why: String| Err(SimError::Config(why));
        let s = self.strategy.name();
        if self.workers == 0 {
            return fail("at least one worker is needed".into());
        }
        if self.strategy.uses_servers() && self.servers == 0 {
            return fail(format!("strategy {s} needs at least one server"));
        }
        if !self.strategy.uses_servers() && self.servers > 0 {
            return fail(format!("strategy {s} uses no server; set servers to 0"));
        }
        if !(self.scale > 0.0 && self.scale <= 1.0) {
            return fail(format!("scale {} is not in (0, 1]", self.scale));
        }
        if !(0.0..1.0).contains(&self.jitter) {
            return fail(format!("jitter {} is not in [0, 1)", self.jitter));
        }
        if let Err(e) = self.network.validate() {
            return fail(e.to_string());
        }
        if self.slice_params == Some(0) || self.bucket_bytes < 4 || self.batch == 0 {
            return fail("slice_params, bucket_bytes and batch must be positive".into());
        }
        if self.scheduler.uses_credit() && self.credit_bytes == 0 {
            return fail("credit_bytes must be positive under the credit scheduler".into());
        }
        if self.steps == 0 {
            return fail("at least one step is needed".into());
        }
        Ok(())
    }

    /// What a full-size count of `n` elements (or bytes) becomes at this scale: rounded up,
    /// at least 1 unless `n` is 0.
    pub fn scaled(&self, n: usize) -> usize {
        if n == 0 {
            0
        } else {
            ((n as f64 * self.scale).ceil() as usize).max(1)
        }
    }

    /// Slice length in the state machines (the runtime clamps slices to a frame).
    pub fn slice_elems(&self) -> usize {
        let full = self
            .slice_params
            .unwrap_or(self.strategy.default_slice_params());
        self.scaled(full.clamp(1, FRAME_ELEMS))
    }

    /// Bytes the network charges for a frame carrying `elems` scaled values: the header plus
    /// the full-size payload, `48 + elems * 4 / scale`.
    pub fn wire_bytes(&self, elems: usize) -> usize {
        HEADER_LEN + (elems as f64 * 4.0 / self.scale).round() as usize
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scaling_rounds_up_and_the_wire_charges_full_size() {
        let mut c = SimConfig::new(Strategy::P3, 2, 1);
        c.scale = 1.0 / 16.0;
        assert_eq!(c.scaled(0), 0);
        assert_eq!(c.scaled(1), 1);
        assert_eq!(c.scaled(33), 3);
        assert_eq!(c.slice_elems(), 2_500);
        assert_eq!(c.wire_bytes(2_500), 48 + 160_000);
        c.slice_params = Some(10 << 20);
        assert_eq!(
            c.slice_elems(),
            FRAME_ELEMS / 16,
            "slices are clamped to a frame"
        );
    }

    #[test]
    fn validation_names_the_problem() {
        let bad = |f: fn(&mut SimConfig)| {
            let mut c = SimConfig::new(Strategy::Ps, 2, 1);
            f(&mut c);
            c.validate().map_err(|e| e.to_string()).unwrap_err()
        };
        assert!(bad(|c| c.servers = 0).contains("server"));
        assert!(bad(|c| c.strategy = Strategy::Allreduce).contains("no server"));
        assert!(bad(|c| c.scale = 0.0).contains("scale"));
        assert!(bad(|c| c.jitter = 1.5).contains("jitter"));
        assert!(bad(|c| c.workers = 0).contains("worker"));
        assert!(bad(|c| c.network.loss = 2.0).contains("--loss"));
        assert!(bad(|c| c.network.buffer_bytes = 0).contains("buffer_bytes"));
        assert!(SimConfig::new(Strategy::Allreduce, 3, 0).validate().is_ok());
    }
}
