//! Why a simulation failed.

use syncopate_core::strategy::{ProtocolError, Rank};

/// A simulation that could not run or did not finish.
#[derive(Debug, thiserror::Error)]
pub enum SimError {
    /// The configuration is inconsistent (checked before anything runs).
    #[error("invalid simulation config: {0}")]
    Config(String),
    /// A state machine refused a frame: a bug in the core or in the simulator.
    #[error("at {time_ns} ns, rank {host} refused a frame from rank {from}: {source}")]
    Protocol {
        /// Virtual time.
        time_ns: u64,
        /// Receiving rank.
        host: Rank,
        /// Sending rank.
        from: Rank,
        /// What the state machine said.
        #[source]
        source: ProtocolError,
    },
    /// The event queue ran dry before every worker finished every step (a deadlock).
    #[error("simulation stalled at {time_ns} ns: {what}")]
    Stalled {
        /// Virtual time of the last event.
        time_ns: u64,
        /// Who was stuck where.
        what: String,
    },
    /// An assumption of the simulator about the state machines did not hold.
    #[error("simulator invariant broken at {time_ns} ns: {what}")]
    Internal {
        /// Virtual time.
        time_ns: u64,
        /// What went wrong.
        what: String,
    },
}
