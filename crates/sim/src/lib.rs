//! Deterministic discrete-event simulator of Syncopate.
//!
//! The simulator drives the core's strategy state machines (`PsWorker`, `PsServer`,
//! `RingAllReduce`) *unchanged* on virtual time: every host has a modelled full-duplex NIC
//! (the core's network model: an egress `Port` with its send window, queues, paths, loss and
//! retransmission, and an ingress `Port` when the profile models it), workers
//! replay per-layer compute times from a `ModelProfile`, and frames are really encoded,
//! decoded and read into the slots the state machines designate. No clocks, threads or
//! hash-order dependence: the same inputs give the same report, bit for bit.
//!
//! Big clusters are simulated on a scaled-down model ([`SimConfig::scale`]): the state
//! machines hold `ceil(numel * scale)` values per key, while the network charges every frame
//! its full-size bytes, so timing is that of the full model and memory shrinks.

#![warn(missing_docs)]

mod build;
mod config;
mod engine;
mod error;
pub mod faults;
mod nic;
mod offer;
mod queue;
mod report;
mod rng;
pub mod transfer;

pub use config::SimConfig;
pub use error::SimError;
pub use report::{chrome_trace_json, HostTraffic, Lane, SimReport, TraceEvent};

use syncopate_core::profile::ModelProfile;

/// Simulates `config.steps` synchronous training steps of `profile` and reports timing,
/// traffic and (optionally) a trace. Protocol errors from the state machines, which would be
/// bugs, and a simulation that stops short of its steps become [`SimError`]s.
pub fn simulate(profile: &ModelProfile, config: &SimConfig) -> Result<SimReport, SimError> {
    engine::Sim::new(profile, config, engine::Polling::Lean)?.run()
}

#[cfg(test)]
mod fault_tests;
#[cfg(test)]
mod net_tests;
#[cfg(test)]
mod tests;
