//! The error of a process of a job (worker, server, benchmark).

use syncopate_train::TrainError;

use crate::comm::CommError;
use crate::process::JoinError;

/// Why a process of a job failed.
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    /// Joining the job failed.
    #[error(transparent)]
    Join(#[from] JoinError),
    /// Communication failed (the message names the peer and the step).
    #[error(transparent)]
    Comm(#[from] CommError),
    /// Training failed.
    #[error(transparent)]
    Train(#[from] TrainError),
    /// A replica snapshot could not be written.
    #[error(transparent)]
    Replica(#[from] crate::replicas::ReplicaError),
    /// A checkpoint could not be written or resumed.
    #[error(transparent)]
    Checkpoint(#[from] crate::checkpoint::CheckpointError),
    /// The resource sampler could not start or write its samples.
    #[error(transparent)]
    Sampler(#[from] crate::sampler::SamplerError),
    /// Something local (a thread, a socket option).
    #[error("{0}")]
    Local(String),
}
