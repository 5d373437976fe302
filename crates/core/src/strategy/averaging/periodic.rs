//! Synchronising every H-th step: local SGD, DiLoCo, step-wise averaging with a period and
//! gossip with exact averages between its mixing steps.
//!
//! Steps `H-1, 2H-1, ...` are *sync steps*: the weights go to the `sync` strategy (the ring
//! all-reduce, or the step-wise chain), the others to the `between` strategy (gossip), or,
//! where there is none, nowhere: the worker keeps its own weights, and the step sends
//! nothing. Each inner strategy counts only its own steps (*rounds*), so it sees an
//! unbroken sequence, whatever happens in between. DiLoCo's sync steps average the outer
//! gradient instead of the weights and apply the outer step ([`OuterNesterov`]).
//!
//! Frames are told apart by kind: gossip's ([`FrameKind::Mix`]) go to `between`, all others
//! to `sync`. A worker can be at most one round of each inner strategy ahead of its
//! neighbours, as the inner strategies already allow.

use std::collections::VecDeque;

use super::OuterNesterov;
use crate::strategy::{Endpoint, ProtocolError, Rank, Transmit, WorkerEvent, WorkerSync};
use crate::wire::{FrameKind, Header};

/// A boxed inner strategy.
type Inner = Box<dyn WorkerSync + Send>;

/// Which strategy the step begun runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Active {
    Sync,
    Between,
    /// No strategy: the weights handed over are the step's values.
    Local,
}

/// A worker that synchronises every `every`-th step (see the module docs).
pub struct Periodic {
    every: u64,
    sync: Inner,
    between: Option<Inner>,
    outer: Option<OuterNesterov>,
    active: Active,
    /// Per key, the values made ready and not yet taken.
    ready: Vec<Vec<f32>>,
    /// DiLoCo: the outer gradient of one key on its way to `sync`.
    scratch: Vec<f32>,
    events: VecDeque<WorkerEvent>,
}

impl Periodic {
    /// Averages the weights with `sync` every `every`-th step and steps alone in between
    /// (local SGD; step-wise averaging with a period). `keys` is the number of keys.
    pub fn averaging(every: u64, keys: usize, sync: Inner) -> Self {
        Self {
            every: every.max(1),
            sync,
            between: None,
            outer: None,
            active: Active::Local,
            ready: vec![Vec::new(); keys],
            scratch: Vec::new(),
            events: VecDeque::new(),
        }
    }

    /// DiLoCo: every `every`-th step `sync` averages the outer gradients and `outer` steps.
    pub fn outer(every: u64, keys: usize, sync: Inner, outer: OuterNesterov) -> Self {
        Self {
            outer: Some(outer),
            ..Self::averaging(every, keys, sync)
        }
    }

    /// `sync` every `every`-th step, `between` on every other step (gossip with full syncs).
    pub fn alternating(every: u64, keys: usize, sync: Inner, between: Inner) -> Self {
        Self {
            between: Some(between),
            ..Self::averaging(every, keys, sync)
        }
    }

    /// Whether step `step` (0-based) is a sync step.
    pub fn is_sync_step(every: u64, step: u64) -> bool {
        (step + 1).is_multiple_of(every.max(1))
    }

    /// Sync steps before step `step`: the round of `sync` that step `step` runs if it is a
    /// sync step.
    fn sync_rounds_before(&self, step: u64) -> u64 {
        step / self.every
    }

    /// Steps before `step` that are not sync steps.
    fn between_rounds_before(&self, step: u64) -> u64 {
        step - self.sync_rounds_before(step)
    }

    fn active_inner(&mut self) -> Option<&mut Inner> {
        match self.active {
            Active::Sync => Some(&mut self.sync),
            Active::Between => self.between.as_mut(),
            Active::Local => None,
        }
    }

    /// The inner strategy a frame like `h` belongs to.
    fn route(&mut self, h: &Header) -> Result<&mut Inner, ProtocolError> {
        match (h.kind, self.between.as_mut()) {
            (FrameKind::Mix, Some(between)) => Ok(between),
            (FrameKind::Mix, None) => Err(ProtocolError::unexpected(
                h.sender as Rank,
                h,
                "a gossip frame, and this job does not gossip",
            )),
            _ => Ok(&mut self.sync),
        }
    }

    fn route_ref(&self, h: &Header) -> Option<&Inner> {
        match h.kind {
            FrameKind::Mix => self.between.as_ref(),
            _ => Some(&self.sync),
        }
    }

    /// Moves the active inner strategy's events out, its values into `ready` (DiLoCo's
    /// after the outer step).
    fn pull_events(&mut self) {
        let syncing = self.active == Active::Sync;
        let Some(inner) = self.active_inner() else {
            return;
        };
        // `Some((key, values))` for a key made ready, `None` for the step's end.
        let mut pulled = Vec::new();
        while let Some(event) = inner.poll_event() {
            pulled.push(match event {
                WorkerEvent::ParamsReady(k) | WorkerEvent::GradReady(k) => {
                    Some((k, inner.take_values(k)))
                }
                WorkerEvent::StepDone => None,
            });
        }
        for ready in pulled {
            let Some((key, mut values)) = ready else {
                self.events.push_back(WorkerEvent::StepDone);
                continue;
            };
            if let (true, Some(outer)) = (syncing, self.outer.as_mut()) {
                values = outer.step(key, &values).to_vec();
            }
            if let Some(slot) = self.ready.get_mut(key) {
                *slot = values;
                self.events.push_back(WorkerEvent::ParamsReady(key));
            }
        }
    }

    /// DiLoCo's sync step: hands `anchor - weights` of `key` to `sync`.
    fn hand_outer_gradient(&mut self, key: usize, weights: &[f32]) {
        let Some(outer) = self.outer.as_ref() else {
            return;
        };
        if let Some(slot) = self.sync.gradient_slot(key) {
            outer.outer_gradient(key, weights, slot);
            self.sync.handle_gradient_in_place(key);
            return;
        }
        self.scratch.clear();
        self.scratch.resize(weights.len(), 0.0);
        outer.outer_gradient(key, weights, &mut self.scratch);
        self.sync.handle_gradient(key, &self.scratch);
    }
}

impl WorkerSync for Periodic {
    fn start_at(&mut self, step: u64) {
        let (sync, between) = (
            self.sync_rounds_before(step),
            self.between_rounds_before(step),
        );
        self.sync.start_at(sync);
        if let Some(b) = self.between.as_mut() {
            b.start_at(between);
        }
    }

    fn begin_step(&mut self, step: u64) {
        self.active = if Self::is_sync_step(self.every, step) {
            let round = self.sync_rounds_before(step);
            self.sync.begin_step(round);
            Active::Sync
        } else if let Some(b) = self.between.as_mut() {
            b.begin_step(step - step / self.every);
            Active::Between
        } else {
            Active::Local
        };
    }

    fn handle_gradient(&mut self, key: usize, weights: &[f32]) {
        match self.active {
            Active::Sync if self.outer.is_some() => self.hand_outer_gradient(key, weights),
            Active::Sync => self.sync.handle_gradient(key, weights),
            Active::Between => {
                if let Some(b) = self.between.as_mut() {
                    b.handle_gradient(key, weights);
                }
            }
            Active::Local => {
                if let Some(slot) = self.ready.get_mut(key) {
                    slot.clear();
                    slot.extend_from_slice(weights);
                    self.events.push_back(WorkerEvent::ParamsReady(key));
                }
            }
        }
    }

    fn handle_backward_done(&mut self) {
        match self.active_inner() {
            Some(inner) => inner.handle_backward_done(),
            None => self.events.push_back(WorkerEvent::StepDone),
        }
    }

    fn poll_event(&mut self) -> Option<WorkerEvent> {
        self.pull_events();
        self.events.pop_front()
    }

    fn take_values(&mut self, key: usize) -> Vec<f32> {
        self.ready
            .get_mut(key)
            .map(std::mem::take)
            .unwrap_or_default()
    }

    fn handle_initial_weights(&mut self, key: usize, weights: &[f32]) {
        if let Some(outer) = self.outer.as_mut() {
            outer.set_anchor(key, weights);
        }
    }

    fn sync_state(&self) -> Vec<Vec<f32>> {
        self.outer.as_ref().map(|o| o.state()).unwrap_or_default()
    }

    fn restore_sync_state(&mut self, state: Vec<Vec<f32>>) -> Result<(), String> {
        match self.outer.as_mut() {
            Some(outer) => outer.restore(state),
            None if state.is_empty() => Ok(()),
            None => Err(format!(
                "this strategy keeps no state of its own, the checkpoint holds {} tensors of one",
                state.len()
            )),
        }
    }
}

impl Endpoint for Periodic {
    fn poll_transmit(&mut self, link: Rank, out: &mut Vec<u8>) -> bool {
        if self.sync.poll_transmit(link, out) {
            return true;
        }
        self.between
            .as_mut()
            .is_some_and(|b| b.poll_transmit(link, out))
    }

    fn poll_transmit_lent(&mut self, links: &[Rank], out: &mut Vec<u8>) -> Option<Transmit> {
        if let Some(t) = self.sync.poll_transmit_lent(links, out) {
            return Some(t);
        }
        self.between
            .as_mut()
            .and_then(|b| b.poll_transmit_lent(links, out))
    }

    fn lent_payload(&self, header: &Header) -> &[f32] {
        self.route_ref(header)
            .map_or(&[], |inner| inner.lent_payload(header))
    }

    fn handle_sent(&mut self, link: Rank, header: &Header) {
        if let Ok(inner) = self.route(header) {
            inner.handle_sent(link, header);
        }
    }

    fn recv_slot(&mut self, link: Rank, header: &Header) -> Result<&mut [f32], ProtocolError> {
        self.route(header)?.recv_slot(link, header)
    }

    fn handle_payload(&mut self, link: Rank, header: &Header) -> Result<(), ProtocolError> {
        self.route(header)?.handle_payload(link, header)
    }

    fn poll_timeout(&self) -> Option<u64> {
        let between = self.between.as_ref().and_then(|b| b.poll_timeout());
        match (self.sync.poll_timeout(), between) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    fn handle_timeout(&mut self, now_ns: u64) {
        self.sync.handle_timeout(now_ns);
        if let Some(b) = self.between.as_mut() {
            b.handle_timeout(now_ns);
        }
    }
}
