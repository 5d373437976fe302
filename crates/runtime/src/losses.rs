//! What a process lost and how its datagrams fared: the part of its summary that servers
//! and workers share, declared once.

use serde::{Deserialize, Serialize};
use syncopate_core::strategy::{KeyLoss, LossStats};

use crate::comm::DatagramReport;

/// What a loss-tolerant process (a dlcp server, a dlcp-allreduce worker) lost and filled
/// in, overall and per key, and what its datagrams did (`--transport udp`). Flattened into
/// [`crate::server::ServerSummary`] and [`crate::worker::WorkerSummary`]: its fields stand
/// at the top level of their JSON, each left out when empty.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Losses {
    /// Values lost and filled in, packets ignored, probes answered, stops sent (`None`: an
    /// exact strategy).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub loss: Option<LossStats>,
    /// Per key, the values it aggregated or received and filled in.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub key_loss: Vec<KeyLoss>,
    /// What its datagrams did: sent, received, dropped by reason, and each link's rate
    /// controller (`None` over TCP).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub datagrams: Option<DatagramReport>,
}
