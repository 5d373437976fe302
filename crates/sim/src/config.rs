//! What to simulate: strategy, cluster, network, scale-down and trace window.

use std::ops::Range;

use serde::{Deserialize, Serialize};
use syncopate_core::net::{round_to_u64, NetworkProfile, RateConfig};
use syncopate_core::step::Straggler;
use syncopate_core::wire::datagram::{max_packet_bytes, DEFAULT_MTU};
use syncopate_core::wire::HEADER_LEN;

use crate::faults::FaultConfig;
use crate::SimError;

use syncopate_core::strategy::{scale_count, StrategyKind, SyncPlan};

/// Everything a simulation depends on (recorded in its report). It dereferences to its
/// [`SyncPlan`], as the runtime's `JobLayout` does, so `config.strategy`, `config.workers`
/// and the rest read the plan.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SimConfig {
    /// How the job synchronises (strategy, processes, scheduler, sizes), at full size.
    #[serde(flatten)]
    pub sync: SyncPlan,
    /// Every host's network: bandwidth, latency, send window (`buffer_bytes`), the
    /// receiver's downlink (`ingress`), queues, loss, paths, retransmission timeout.
    pub network: NetworkProfile,
    /// Scale-down of the state machines' buffers, in `(0, 1]`; the wire is charged full size.
    pub scale: f64,
    /// Steps to simulate.
    pub steps: u64,
    /// Samples per step on each worker (for the throughput).
    pub batch: usize,
    /// Compute jitter: every layer time is multiplied by a uniform factor in `1 ± jitter`.
    pub jitter: f64,
    /// Seed of the jitter.
    pub seed: u64,
    /// Workers whose compute takes longer (`--slow-worker RANK:FACTOR`).
    #[serde(default)]
    pub stragglers: Vec<Straggler>,
    /// Steps whose compute and frames are recorded as trace events.
    pub trace_steps: Option<Range<u64>>,
    /// Seeded faults (all off by default); with any on, every process runs the liveness
    /// rules and the report says how each ended.
    #[serde(default)]
    pub faults: FaultConfig,
    /// Loss-tolerant frames travel as datagrams of the core's datagram link (one per pair
    /// of processes: pacing and rate control by this controller's settings, feedback, the
    /// link's choice of path), as `--transport udp` sends them; `None`: each is a frame on
    /// the ports, as the emulated transport sends it.
    #[serde(default)]
    pub datagram: Option<RateConfig>,
    /// DLCP below scale 1: every packet a frame of `packet_elems` scaled values, even where
    /// the bound needs a share whole (off: such shares travel a slice a packet,
    /// [`SimConfig::whole_slices`]).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub packet_level: bool,
}

impl std::ops::Deref for SimConfig {
    type Target = SyncPlan;

    fn deref(&self) -> &SyncPlan {
        &self.sync
    }
}

impl SimConfig {
    /// Every host's bandwidth unless the configuration says otherwise: 10 Gbit/s.
    pub const DEFAULT_BANDWIDTH_BPS: f64 = 10e9;
    /// Samples per step per worker when neither the flags nor the profile say (the
    /// PipeDream profiles were measured at 128).
    pub const DEFAULT_BATCH: usize = 128;

    /// The runtime's defaults for `strategy` on `workers` workers and `servers` servers:
    /// 10 Gbit/s links without latency and a 256 KiB window, full scale, 10 steps of 128.
    pub fn new(strategy: StrategyKind, workers: usize, servers: usize) -> Self {
        Self::with_plan(SyncPlan::new(strategy, workers, servers))
    }

    /// The simulation of `sync` (at full size) with [`SimConfig::new`]'s other defaults.
    pub fn with_plan(sync: SyncPlan) -> Self {
        Self {
            sync,
            network: NetworkProfile {
                bandwidth_bps: Some(Self::DEFAULT_BANDWIDTH_BPS),
                ..NetworkProfile::default()
            },
            scale: 1.0,
            steps: 10,
            batch: Self::DEFAULT_BATCH,
            jitter: 0.0,
            seed: 0,
            stragglers: Vec::new(),
            trace_steps: None,
            faults: FaultConfig::default(),
            datagram: None,
            packet_level: false,
        }
    }

    /// Checks the configuration against the strategy.
    pub fn validate(&self) -> Result<(), SimError> {
        let fail = |why: String| Err(SimError::Config(why));
        if let Err(e) = self.plan().validate() {
            return fail(e.to_string());
        }
        if !(self.scale > 0.0 && self.scale <= 1.0) {
            return fail(format!("scale {} is not in (0, 1]", self.scale));
        }
        if let Err(e) = Straggler::check(&self.stragglers, self.workers) {
            return fail(e.to_string());
        }
        if !(0.0..1.0).contains(&self.jitter) {
            return fail(format!("jitter {} is not in [0, 1)", self.jitter));
        }
        if let Err(e) = self.network.validate() {
            return fail(e.to_string());
        }
        if self.batch == 0 {
            return fail("batch must be positive".into());
        }
        if self.steps == 0 {
            return fail("at least one step is needed".into());
        }
        self.faults.validate().map_err(SimError::Config)?;
        if self.datagram.is_some() && self.scale != 1.0 {
            return fail(format!(
                "datagrams carry the values a packet holds: they need scale 1 (got {})",
                self.scale
            ));
        }
        let fits = max_packet_bytes(DEFAULT_MTU).unwrap_or(0);
        let packet = self.sync.dlcp.packet_elems.saturating_mul(4);
        if self.datagram.is_some() && self.strategy.loss_tolerant() && packet > fits {
            return fail(format!(
                "a {packet}-byte packet does not fit one datagram: with datagrams a packet \
                 is at most {fits} bytes (--transport udp sizes them so)"
            ));
        }
        Ok(())
    }

    /// What a full-size count of `n` elements (or bytes) becomes at this scale: rounded up,
    /// at least 1 unless `n` is 0.
    pub fn scaled(&self, n: usize) -> usize {
        scale_count(n, self.scale)
    }

    /// The synchronisation plan the state machines are built from, at this scale.
    pub fn plan(&self) -> SyncPlan {
        let mut plan = self.sync.clone().scaled(self.scale);
        plan.dlcp.whole_slices = self.whole_slices();
        // Where packets are datagrams, so are the Probes, Stops and Missing bitmaps.
        plan.dlcp.control_datagrams = self.datagram.is_some();
        plan
    }

    /// Whether DLCP's packets of the shares its bound needs whole travel a slice a packet
    /// (the core's [`syncopate_core::strategy::DlcpOptions::whole_slices`]): below
    /// scale 1, unless [`SimConfig::packet_level`] or loss strikes packets (`mtu_bytes`). A
    /// scaled value already stands for `1 / scale` values, so a packet of a scaled slice
    /// stands for the full-size packets of its slice, lost with the same probability as each
    /// of them: true where loss strikes whole frames. Where it strikes each packet, a frame
    /// of a slice's bytes would be lost whenever any of its packets is (at 5 % nearly
    /// always, and DLCP's step took 10x the packet level's), so every packet stays a frame.
    pub fn whole_slices(&self) -> bool {
        self.strategy == StrategyKind::Dlcp
            && self.scale < 1.0
            && !self.packet_level
            && self.network.mtu_bytes.is_none()
    }

    /// Bytes the network charges for a frame carrying `elems` scaled values: the header plus
    /// the full-size payload, `48 + elems * 4 / scale`.
    pub fn wire_bytes(&self, elems: usize) -> usize {
        HEADER_LEN + round_to_u64(elems as f64 * 4.0 / self.scale) as usize
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use syncopate_core::strategy::FRAME_ELEMS;

    #[test]
    fn scaling_rounds_up_and_the_wire_charges_full_size() {
        let mut c = SimConfig::new(StrategyKind::P3, 2, 1);
        c.scale = 1.0 / 16.0;
        assert_eq!(c.scaled(0), 0);
        assert_eq!(c.scaled(1), 1);
        assert_eq!(c.scaled(33), 3);
        assert_eq!(c.plan().slice_params, 2_500);
        assert_eq!(c.wire_bytes(2_500), 48 + 160_000);
        c.sync.slice_params = 10 << 20;
        assert_eq!(
            c.plan().slice_params,
            FRAME_ELEMS / 16,
            "slices are clamped to a frame"
        );
    }

    #[test]
    fn validation_names_the_problem() {
        let bad = |f: fn(&mut SimConfig)| {
            let mut c = SimConfig::new(StrategyKind::Ps, 2, 1);
            f(&mut c);
            c.validate().map_err(|e| e.to_string()).unwrap_err()
        };
        assert!(bad(|c| c.sync.servers = 0).contains("server"));
        assert!(bad(|c| c.sync.strategy = StrategyKind::Allreduce).contains("no server"));
        assert!(bad(|c| c.scale = 0.0).contains("scale"));
        assert!(bad(|c| c.jitter = 1.5).contains("jitter"));
        assert!(bad(|c| c.sync.workers = 0).contains("worker"));
        assert!(bad(|c| c.network.loss = 2.0).contains("--loss"));
        assert!(bad(|c| c.network.buffer_bytes = 0).contains("buffer_bytes"));
        assert!(SimConfig::new(StrategyKind::Allreduce, 3, 0)
            .validate()
            .is_ok());
    }
}
