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
//! its full-size bytes, so timing is that of the full model and memory shrinks. DLCP's
//! shares that its loss bound needs whole then go a slice a packet, each standing for the
//! packets of its slice ([`SimConfig::whole_slices`]; [`SimConfig::packet_level`] keeps
//! every packet a frame).
//!
//! Where every worker is alike (no jitter, straggler or fault) and the network lossless
//! with one path, one worker stands for all of them on the same state machines (the
//! symmetric model, [`model_choice`]): a ring of 16,384 workers then costs what one worker
//! does. [`simulate_packet_level`] runs every worker and every frame whatever the case.

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
mod symmetry;
pub mod transfer;

pub use config::SimConfig;
pub use error::SimError;
pub use report::{chrome_trace_json, FlowWindows, HostTraffic, Lane, SimReport, TraceEvent};
pub use symmetry::{model_choice, ModelChoice};

use syncopate_core::profile::ModelProfile;

/// Simulates `config.steps` synchronous training steps of `profile` and reports timing,
/// traffic and (optionally) a trace. Protocol errors from the state machines, which would be
/// bugs, and a simulation that stops short of its steps become [`SimError`]s.
///
/// Where every worker does the same at the same time over a lossless network, one worker
/// stands for all (the symmetric model, [`model_choice`]); the report's `model_path` says
/// which model ran and why.
pub fn simulate(profile: &ModelProfile, config: &SimConfig) -> Result<SimReport, SimError> {
    config.validate()?;
    let choice = model_choice(profile, config);
    if !choice.symmetric {
        let mut report = simulate_packet_level(profile, config)?;
        report.model_path = choice.why;
        return Ok(report);
    }
    let one = symmetry::reduced(config);
    let ring = match config.strategy.uses_servers() {
        true => None,
        false => symmetry::mirror_ring(profile, config),
    };
    let mirror = symmetry::Mirror {
        workers: config.workers,
        ring,
    };
    let sim = engine::Sim::new(profile, &one, engine::Polling::Lean)?;
    let report = sim.with_mirror(mirror, config).run()?;
    Ok(symmetry::expand(report, config, choice.why))
}

/// [`simulate`] at packet level whatever the configuration: every worker, every frame (the
/// reference the symmetric model is checked against).
pub fn simulate_packet_level(
    profile: &ModelProfile,
    config: &SimConfig,
) -> Result<SimReport, SimError> {
    engine::Sim::new(profile, config, engine::Polling::Lean)?.run()
}

#[cfg(test)]
mod datagram_tests;
#[cfg(test)]
mod fault_tests;
#[cfg(test)]
mod net_tests;
#[cfg(test)]
mod scaled_dlcp_tests;
#[cfg(test)]
mod symmetry_tests;
#[cfg(test)]
mod tests;
