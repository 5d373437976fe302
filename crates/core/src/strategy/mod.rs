//! Strategy state machines: how one step's gradients and parameters are synchronised.
//!
//! Each process role is a state machine in the quinn-proto style: plain getters;
//! `handle_*` methods that take events (a gradient ready, a frame received); and `poll_*`
//! methods that hand out what it wants done (a frame to transmit on a link, an event for the
//! training loop). Links are named by the peer's rank. No clocks, threads or sockets: the
//! runtime and the in-process tests drive the very same code.
//!
//! # Time
//!
//! Time comes in as an argument: nanoseconds on the driver's clock (the runtime's
//! communication loop counts from its own start, the simulator from virtual time zero). An
//! endpoint that needs a timer (a deadline, a probe, a retransmission) says when with
//! [`Endpoint::poll_timeout`] and is told with [`Endpoint::handle_timeout`]; it never reads
//! a clock.
//!
//! # How a driver calls an endpoint
//!
//! The contract every driver keeps (the runtime's `comm/` loop and the simulator's
//! `engine.rs`), as quinn-proto's `Connection` states its own:
//!
//! 1. After any `handle_*` call (a gradient, backward done, a payload, a frame sent, a
//!    timeout), [`WorkerSync::begin_step`] or [`WorkerSync::retune`], call the transmit polls
//!    ([`Endpoint::poll_transmit_lent`] or its kin) until they hand out nothing, on the
//!    links that have room; a link that gains room later is polled then.
//! 2. Then read [`Endpoint::poll_timeout`] and arm a timer for it, replacing any earlier one
//!    (`None`: no timer).
//! 3. Then, for a worker, call [`WorkerSync::poll_event`] until it answers `None`:
//!    transmitting can complete a step (the last frame handed over), so events are polled
//!    after the transmits, never only after frames arrive.
//! 4. When the armed time has come, call [`Endpoint::handle_timeout`] with the current time,
//!    then start again at 1. Calling it early or twice is harmless: spurious calls are
//!    no-ops.

mod averaging;
mod bucket;
mod chain;
mod dlcp;
mod half_wire;
mod kind;
mod plan;
mod ps;
mod ring;
mod ring_layout;
#[cfg(test)]
mod tests;
mod traffic;

pub use averaging::{
    gossip_matrix, gossip_peers, gossip_weights, mix_into, ChainRound, ChainSchedule, Gossip,
    MixWeights, OuterNesterov, OuterOptions, Periodic, StepwiseHead,
};
pub use chain::ChainPass;
pub use dlcp::{DlcpOptions, DlcpRing, DlcpServer, DlcpWorker, KeyLoss, LossFill, LossStats};
pub use half_wire::HalfWire;
pub use kind::{
    Averaged, StrategyInfo, StrategyKind, Topology, CHAIN_SEGMENT_ELEMS, DEFAULT_BUCKET_BYTES,
    DEFAULT_CREDIT_BYTES, DEFAULT_DILOCO_EVERY, DEFAULT_LOCAL_SGD_EVERY, DIRECT_SHARE_ELEMS,
    FRAME_ELEMS, MESH_MAX_WORKERS, P3_SLICE_PARAMS,
};
pub use plan::{Endpoints, PlanError, SyncPlan};
pub use ps::{PsServer, PsWorker, ServerOptim};
pub use ring::RingAllReduce;
pub use traffic::textbook_bytes_per_step;

/// Re-exported from [`crate::scale`], where it moved so that `net` need not reach into
/// `strategy`.
pub use crate::scale::scale_count;

use crate::tune::Knobs;
use crate::wire::{Header, WireError};

/// Ranks: workers are `0..workers`, servers are `workers..workers + servers`.
pub type Rank = usize;

/// The values a frame with header `h` carries out of `tensors` (one per key or bucket):
/// `tensors[key][offset..offset + length]`, empty if the header names none.
fn frame_values<'a>(tensors: &'a [Vec<f32>], h: &Header) -> &'a [f32] {
    let start = h.offset as usize;
    tensors
        .get(h.key as usize)
        .and_then(|t| t.get(start..start + h.length as usize))
        .unwrap_or(&[])
}

/// Appends the frame with header `h` and its values out of `tensors` to `out`.
fn encode_frame_from(out: &mut Vec<u8>, h: &Header, tensors: &[Vec<f32>]) {
    crate::wire::encode_data_frame(out, h, frame_values(tensors, h));
}

/// A peer broke the protocol; the message names what it sent and why it is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ProtocolError {
    /// The frame's header could not be decoded.
    #[error("malformed frame: {0}")]
    Wire(#[from] WireError),
    /// A well-formed frame that this role cannot accept now.
    #[error("unexpected frame from rank {from}: {reason}")]
    Unexpected {
        /// Sender's rank.
        from: Rank,
        /// What is wrong with it.
        reason: String,
    },
}

impl ProtocolError {
    pub(crate) fn unexpected(from: Rank, header: &Header, why: &str) -> Self {
        ProtocolError::Unexpected {
            from,
            reason: format!(
                "{why} ({:?} step {} key {} offset {} length {})",
                header.kind, header.step, header.key, header.offset, header.length
            ),
        }
    }
}

/// What a worker-side state machine tells the training loop.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WorkerEvent {
    /// Fresh values of this key are complete (parameter server strategies): install them.
    ParamsReady(usize),
    /// The averaged gradient of this key is complete (all-reduce strategies).
    GradReady(usize),
    /// Everything of the current step has been synchronised.
    StepDone,
}

/// The worker side of a strategy, as the training loop drives it.
pub trait WorkerSync: Endpoint {
    /// Before anything else: the job resumes after `step` steps (its first step is `step`,
    /// and peers may send frames of that step before it begins here).
    fn start_at(&mut self, step: u64);
    /// Starts step `step` (the previous step must have reported [`WorkerEvent::StepDone`]).
    fn begin_step(&mut self, step: u64);
    /// Backward produced `key`'s gradient (copied in; the caller keeps its buffer).
    fn handle_gradient(&mut self, key: usize, grad: &[f32]);
    /// The buffer this strategy synchronises `key`'s gradient in, for a caller that writes
    /// the gradient there itself and then calls [`WorkerSync::handle_gradient_in_place`]
    /// instead of [`WorkerSync::handle_gradient`] (an in-place all-reduce: the copy is the
    /// caller's). Free to write before the key's gradient of the step is handed over, once
    /// the previous step is done. `None` (the default) where the strategy has no such
    /// buffer: then the gradient must be handed over with [`WorkerSync::handle_gradient`].
    fn gradient_slot(&mut self, _key: usize) -> Option<&mut [f32]> {
        None
    }
    /// `key`'s gradient has been written into [`WorkerSync::gradient_slot`]: as
    /// [`WorkerSync::handle_gradient`] without the copy. Only for strategies that gave a
    /// slot; the default does nothing.
    fn handle_gradient_in_place(&mut self, _key: usize) {}
    /// Backward has finished (no-overlap strategies start communicating only now).
    fn handle_backward_done(&mut self);
    /// The next event for the training loop.
    fn poll_event(&mut self) -> Option<WorkerEvent>;
    /// After [`WorkerEvent::ParamsReady`]: the fresh parameter values of `key`; after
    /// [`WorkerEvent::GradReady`]: the averaged gradient of `key`.
    fn take_values(&mut self, key: usize) -> Vec<f32>;
    /// The autotuner changed the worker-local settings (see [`crate::tune`]); they apply
    /// from the next frame on. Endpoints without such settings ignore it.
    fn retune(&mut self, knobs: Knobs) {
        let _ = knobs;
    }

    /// What a loss-tolerant worker lost and filled in so far (`None` where the workers
    /// lose nothing: reliable strategies, and parameter servers, whose servers count).
    fn loss_stats(&self) -> Option<LossStats> {
        None
    }

    /// Per key, the values a loss-tolerant worker received and filled in (empty where
    /// [`WorkerSync::loss_stats`] is `None`).
    fn key_loss(&self) -> Vec<KeyLoss> {
        Vec::new()
    }

    /// Before the first step of a job that does not resume: `key`'s initial weights, for
    /// strategies that keep a copy of the weights of their own (DiLoCo's anchor). Default:
    /// ignored.
    fn handle_initial_weights(&mut self, key: usize, weights: &[f32]) {
        let _ = (key, weights);
    }

    /// The state this strategy keeps besides the model's weights and momentum, which a
    /// checkpoint must hold for a resume to be exact (DiLoCo's anchor and outer momentum),
    /// as tensors in a fixed order; empty (the default) for strategies that keep none. Read
    /// between steps, once every value of the step is in.
    fn sync_state(&self) -> Vec<Vec<f32>> {
        Vec::new()
    }

    /// Before the first step of a resumed job: restores what [`WorkerSync::sync_state`]
    /// gave; refuses a state of another shape.
    fn restore_sync_state(&mut self, state: Vec<Vec<f32>>) -> Result<(), String> {
        match state.is_empty() {
            true => Ok(()),
            false => Err(format!(
                "this strategy keeps no state of its own, the checkpoint holds {} tensors of one",
                state.len()
            )),
        }
    }
}

/// The server side of a parameter-server strategy, as the runtime's server process and the
/// simulator drive it besides its frames.
pub trait ServerSync: Endpoint {
    /// The values and momentum of every key (empty for keys this server owns no slice
    /// of; within the others only the owned ranges are meaningful): what a checkpoint of
    /// this server holds.
    fn state(&self) -> (&[Vec<f32>], &[Vec<f32>]);

    /// Restores a checkpoint taken after `first_step` steps: the values and momentum of
    /// every key as [`ServerSync::state`] gave them. Pushes of earlier steps are refused
    /// (or, from loss-tolerant senders, ignored) from now on.
    fn restore(
        &mut self,
        params: Vec<Vec<f32>>,
        velocity: Vec<Vec<f32>>,
        first_step: u64,
    ) -> Result<(), String>;

    /// The next step all of whose slices owned here have been updated (each step once, in
    /// order): the moment a checkpoint of this server holds exactly that step.
    fn poll_step_complete(&mut self) -> Option<u64>;

    /// Current values of `key` (only the ranges this server owns are meaningful).
    fn values(&self, key: usize) -> &[f32];

    /// Slice updates applied so far.
    fn updates(&self) -> u64;

    /// The most values this server ever held in pushes waiting for their turn in the
    /// rank-order sum (the memory that bit-reproducibility costs).
    fn peak_early_values(&self) -> usize;

    /// The latest step any push was received for (0 before the first).
    fn latest_step(&self) -> u64;

    /// Whether any reply is still queued for a worker.
    fn has_pending_replies(&self) -> bool;

    /// What a loss-tolerant server lost and recovered so far (`None` for reliable ones).
    fn loss_stats(&self) -> Option<LossStats> {
        None
    }

    /// Per key, the values a loss-tolerant server aggregated and filled in (empty for
    /// reliable ones).
    fn key_loss(&self) -> Vec<KeyLoss> {
        Vec::new()
    }
}

/// A frame handed out by [`Endpoint::poll_transmit_lent`], and where its payload is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Transmit {
    /// For this link; `out` holds the whole frame.
    Copied(Rank),
    /// For this link; `out` holds the header only, the payload stays in the endpoint.
    Lent(Rank, Header),
}

/// The part of every role that the transport drives: frames out, frames in.
pub trait Endpoint {
    /// Appends the next frame for `link` (header and payload) to `out` if one is ready;
    /// returns whether it did. The driver calls it only when the link has room.
    fn poll_transmit(&mut self, link: Rank, out: &mut Vec<u8>) -> bool;

    /// Appends the most urgent frame for any of `links` (those with room, when the links
    /// share one network interface) and returns its link. The default takes the first link
    /// in the given order that has a frame; the driver rotates the order for fairness.
    fn poll_transmit_any(&mut self, links: &[Rank], out: &mut Vec<u8>) -> Option<Rank> {
        links.iter().copied().find(|&l| self.poll_transmit(l, out))
    }

    /// Like [`Endpoint::poll_transmit_any`], but an endpoint that can keep the payload where
    /// it is (in buffers that stay unchanged until the frame has gone) writes only the header
    /// to `out` and answers [`Transmit::Lent`]: the driver then sends
    /// [`Endpoint::lent_payload`] after the header, without a copy, and calls
    /// [`Endpoint::handle_sent`] once its last byte is written. The default copies.
    fn poll_transmit_lent(&mut self, links: &[Rank], out: &mut Vec<u8>) -> Option<Transmit> {
        self.poll_transmit_any(links, out).map(Transmit::Copied)
    }

    /// The payload of a frame handed out as [`Transmit::Lent`] and not yet reported sent.
    fn lent_payload(&self, _header: &Header) -> &[f32] {
        &[]
    }

    /// The last byte of a frame handed out as [`Transmit::Lent`] has been written: its
    /// payload's buffer is the endpoint's again.
    fn handle_sent(&mut self, _link: Rank, _header: &Header) {}

    /// Where the payload of a data frame announced by `header` from `link` goes: the driver
    /// reads exactly `header.payload_len` bytes (`header.length` values, packed two to a
    /// word where they travel as 16-bit floats) into the returned slice, then calls
    /// [`Endpoint::handle_payload`]. Refuses frames that do not fit the protocol state. A
    /// driver reading the payload as it arrives asks again for the same frame: the answer
    /// must be the same slot.
    fn recv_slot(&mut self, link: Rank, header: &Header) -> Result<&mut [f32], ProtocolError>;

    /// The payload announced by `header` has been written into the slot.
    fn handle_payload(&mut self, link: Rank, header: &Header) -> Result<(), ProtocolError>;

    /// Whether a data frame like `header` from `link` belongs to one of this endpoint's
    /// loss-tolerant flows (the protocol completes without it): only such a frame may an
    /// emulated network lose on its way in, whatever its sender's header claims. Default:
    /// none.
    fn accepts_loss(&self, _link: Rank, _header: &Header) -> bool {
        false
    }

    /// When the endpoint next wants [`Endpoint::handle_timeout`] called: absolute
    /// nanoseconds on the driver's clock, `None` for no timer. Read it after the transmit
    /// polls (see the module docs); the answer replaces any earlier one. The default: never.
    #[must_use]
    fn poll_timeout(&self) -> Option<u64> {
        None
    }

    /// The time from [`Endpoint::poll_timeout`] has come (`now_ns` is at or after it, on the
    /// driver's clock). A call before any deadline, or a second call for the same one, must
    /// do nothing, so a driver may call it spuriously. The default does nothing.
    fn handle_timeout(&mut self, _now_ns: u64) {}

    /// The datagram link to `link` measured a smoothed round trip of `srtt_ns` (a driver of
    /// datagrams tells it as it changes; an endpoint with timers may size them by it). The
    /// default ignores it.
    fn handle_path_rtt(&mut self, _link: Rank, _srtt_ns: u64) {}

    /// Bytes the endpoint keeps in buffers for reuse, not in use now (a driver's metrics
    /// show them beside the live heap). The default: none.
    fn pooled_bytes(&self) -> usize {
        0
    }
}
