//! The strategies that average weights rather than gradients, and what they share.
//!
//! - [`Periodic`]: synchronising every H-th step (local SGD, DiLoCo, step-wise averaging
//!   with a period, gossip with full syncs), wrapping the strategies that run the steps.
//! - [`OuterNesterov`]: DiLoCo's outer optimizer, applied on the sync steps.
//! - [`Gossip`]: each step a mix with the two ring neighbours ([`gossip_weights`]).
//! - [`ChainSchedule`]: who averages with whom on the chain, step by step, and what that
//!   mixing does in the long run; [`crate::strategy::ChainPass`] runs it (for step-wise
//!   averaging and, with exact rounds only, for ring reduce).

mod gossip;
mod mixing;
mod outer;
mod periodic;

pub use gossip::{gossip_matrix, gossip_peers, gossip_weights, mix_into, Gossip, MixWeights};
pub use mixing::{ChainRound, ChainSchedule, StepwiseHead};
pub use outer::{OuterNesterov, OuterOptions};
pub use periodic::Periodic;
