//! Synchronous parameter server: workers push each key's gradient (slice by slice) to the
//! server that owns it; a server waits for all N pushes of a slice, averages them, applies
//! SGD and answers every worker with the updated slice; a worker's step is done when every
//! slice is back.
//!
//! A server adds the pushes of a slice in rank order, `((g0 + g1) + g2) + ...`, whatever
//! order they arrive in: a push that comes before its turn waits in a buffer of its own. So
//! the same seed gives the same bits on every run, as on the ring strategies.

use std::collections::VecDeque;

use early::EarlyPushes;

use super::{
    encode_frame_from, frame_values, Endpoint, ProtocolError, Rank, ServerSync, Transmit,
    WorkerEvent, WorkerSync,
};
use crate::aggregate::{add_assign, scale};
use crate::optim::{LrSchedule, Sgd, SgdConfig};
use crate::registry::{Slice, TensorRegistry};
use crate::sched::{BroadcastQueue, LinkQueues, Pending, SchedulerKind};
use crate::tune::Knobs;
use crate::wire::{FrameKind, Header};

mod early;

/// Whether bit `i` of a bit set is set.
fn bit(bits: &[u64], i: usize) -> bool {
    bits.get(i / 64).is_some_and(|w| w & (1 << (i % 64)) != 0)
}

/// Sets bit `i` of a bit set (made large enough by its owner).
fn set_bit(bits: &mut [u64], i: usize) {
    if let Some(word) = bits.get_mut(i / 64) {
        *word |= 1 << (i % 64);
    }
}

fn pending_for(reg: &TensorRegistry, slice: usize, arrival: &mut u64) -> Pending {
    let s = reg.slices()[slice];
    *arrival += 1;
    Pending {
        item: slice,
        priority: reg.keys()[s.key].layer as i64,
        sequence: s.index_in_key as u64,
        arrival: *arrival,
    }
}

/// The header of a data frame carrying slice `s`.
fn slice_header(
    kind: FrameKind,
    step: u64,
    s: &Slice,
    p: &Pending,
    sender: Rank,
    sequence: u64,
) -> Header {
    let mut h = Header::data(kind, step, s.key as u32, s.offset as u32, s.len as u32);
    h.priority = p.priority as i32;
    h.sequence = sequence;
    h.sender = sender as u32;
    h
}

/// The worker side of the parameter-server strategies (`ps`, `ps-no-overlap`, `p3`).
///
/// Laid out in the order it is used (`repr(C)`): what every received frame reads first, then
/// what every sent frame reads, so that a simulator's thousand workers, each cold when its
/// next frame comes, cost a few cache lines a frame rather than every line of the struct.
#[repr(C)]
pub struct PsWorker {
    workers: usize,
    reg: TensorRegistry,
    step: u64,
    keys_left: usize,
    /// One bit per slice: its answer of this step is in (a bit set, so that 1,024 simulated
    /// workers' sets stay in the cache).
    received: Vec<u64>,
    /// Per key, its fresh values and the slices still to come (side by side: an answer
    /// reads both).
    keys: Vec<KeyState>,
    events: VecDeque<WorkerEvent>,
    /// Bytes that may be pushed and not yet answered (credit scheduling only).
    credit: Option<usize>,
    in_flight: usize,
    rank: Rank,
    sequence: u64,
    arrival: u64,
    /// Slices waiting for each server, by server index.
    queues: LinkQueues,
    /// Every key's gradient end to end ([`TensorRegistry::key_start`]).
    grads: Vec<f32>,
    /// Order keys of the slices pushed and not yet answered (credit scheduling only).
    in_flight_keys: std::collections::BTreeSet<(i64, u64, u64)>,
    held: Vec<usize>,
    kind: SchedulerKind,
    overlap: bool,
}

impl PsWorker {
    /// Worker `rank` of `workers`, talking to the servers of `reg` (ranks `workers..`).
    /// With `overlap`, each key is pushed as soon as its gradient is handed over; without,
    /// only after [`WorkerSync::handle_backward_done`]. Under [`SchedulerKind::Credit`], at
    /// most `credit_bytes` of payload are pushed and not yet answered (at least one slice).
    pub fn new(
        rank: Rank,
        workers: usize,
        reg: TensorRegistry,
        overlap: bool,
        scheduler: SchedulerKind,
        credit_bytes: usize,
    ) -> Self {
        let keys = reg.keys().len();
        let slices = reg.slices().len();
        Self {
            rank,
            workers,
            overlap,
            kind: scheduler,
            credit: scheduler.uses_credit().then_some(credit_bytes),
            in_flight: 0,
            in_flight_keys: Default::default(),
            arrival: 0,
            step: 0,
            grads: vec![0.0; reg.total_numel()],
            keys: vec![KeyState::default(); keys],
            queues: LinkQueues::new(scheduler, reg.servers()),
            held: Vec::new(),
            received: vec![0; slices.div_ceil(64)],
            keys_left: 0,
            events: VecDeque::new(),
            sequence: 0,
            reg,
        }
    }

    /// The gradient values a push with header `h` carries.
    fn pushed_values(&self, h: &Header) -> &[f32] {
        let start = (self.reg.keys().get(h.key as usize))
            .map(|_| self.reg.key_start(h.key as usize) + h.offset as usize);
        start
            .and_then(|s| self.grads.get(s..s + h.length as usize))
            .unwrap_or(&[])
    }

    fn server_index(&self, link: Rank) -> Option<usize> {
        link.checked_sub(self.workers)
            .filter(|&s| s < self.reg.servers())
    }

    fn release(&mut self, key: usize) {
        for slice in self.reg.slices_of(key) {
            let p = pending_for(&self.reg, slice, &mut self.arrival);
            self.queues.push(self.reg.owner(slice), p);
        }
    }

    /// Whether the credit allows pushing `p` now: it fits, or it is more urgent than every
    /// slice in flight. The exception keeps workers that pushed in different orders from
    /// waiting on each other forever: the most urgent unfinished slice can always go.
    fn credit_allows(&self, p: &Pending) -> bool {
        match self.credit {
            Some(credit) => {
                self.in_flight + self.reg.slices()[p.item].len * 4 <= credit
                    || self
                        .in_flight_keys
                        .first()
                        .is_none_or(|&first| self.kind.order_key(p) < first)
            }
            None => true,
        }
    }

    /// Pushes the head of server `server`'s queue into `out`.
    fn transmit_from(&mut self, server: usize, out: &mut Vec<u8>) -> bool {
        let Some(h) = self.next_push(server) else {
            return false;
        };
        crate::wire::encode_data_frame(out, &h, self.pushed_values(&h));
        true
    }

    /// The server, among those behind `links`, whose queue head is the most urgent.
    fn most_urgent_server(&self, links: &[Rank]) -> Option<usize> {
        let servers = links.iter().filter_map(|&l| self.server_index(l));
        // Server `s` is offered iff its rank is: a scan of the ranks, nothing mapped.
        let offered = |s: usize| links.contains(&(self.workers + s));
        (self.queues).most_urgent_offered(servers, offered)
    }

    /// Takes the head of server `server`'s queue if the credit allows and says what it
    /// carries (the payload is `grads[key][offset..offset + length]`).
    fn next_push(&mut self, server: usize) -> Option<Header> {
        let p = self.queues.peek(server)?;
        if !self.credit_allows(&p) {
            return None;
        }
        self.queues.pop(server);
        let s = self.reg.slices()[p.item];
        let h = slice_header(FrameKind::Push, self.step, &s, &p, self.rank, self.sequence);
        self.sequence += 1;
        if self.credit.is_some() {
            self.in_flight += s.len * 4;
            self.in_flight_keys.insert(self.kind.order_key(&p));
        }
        Some(h)
    }
}

impl WorkerSync for PsWorker {
    fn start_at(&mut self, step: u64) {
        self.step = step;
    }

    fn retune(&mut self, knobs: Knobs) {
        if let Some(credit) = self.credit.as_mut() {
            *credit = knobs.credit_bytes.max(1);
        }
    }

    fn begin_step(&mut self, step: u64) {
        self.step = step;
        self.held.clear();
        self.received.fill(0);
        self.keys_left = 0;
        for key in 0..self.reg.keys().len() {
            let n = self.reg.slices_of(key).len();
            let state = &mut self.keys[key];
            state.slices_left = n;
            if state.params.len() != self.reg.keys()[key].numel {
                state.params = vec![0.0; self.reg.keys()[key].numel];
            }
            if n == 0 {
                self.events.push_back(WorkerEvent::ParamsReady(key));
            } else {
                self.keys_left += 1;
            }
        }
        if self.keys_left == 0 {
            self.events.push_back(WorkerEvent::StepDone);
        }
    }

    fn handle_gradient(&mut self, key: usize, grad: &[f32]) {
        let start = self.reg.key_start(key);
        let numel = self.reg.keys()[key].numel;
        self.grads[start..start + numel].copy_from_slice(grad);
        if self.overlap {
            self.release(key);
        } else {
            self.held.push(key);
        }
    }

    fn handle_backward_done(&mut self) {
        for key in std::mem::take(&mut self.held) {
            self.release(key);
        }
    }

    fn poll_event(&mut self) -> Option<WorkerEvent> {
        self.events.pop_front()
    }

    fn take_values(&mut self, key: usize) -> Vec<f32> {
        std::mem::take(&mut self.keys[key].params)
    }
}

impl Endpoint for PsWorker {
    fn poll_transmit(&mut self, link: Rank, out: &mut Vec<u8>) -> bool {
        match self.server_index(link) {
            Some(server) => self.transmit_from(server, out),
            None => false,
        }
    }

    fn poll_transmit_any(&mut self, links: &[Rank], out: &mut Vec<u8>) -> Option<Rank> {
        let server = self.most_urgent_server(links)?;
        self.transmit_from(server, out)
            .then_some(self.workers + server)
    }

    // A pushed gradient stays unchanged until the next step's backward, which starts only
    // after every pushed slice has been answered, so after every push was written.
    fn poll_transmit_lent(&mut self, links: &[Rank], out: &mut Vec<u8>) -> Option<Transmit> {
        let server = self.most_urgent_server(links)?;
        let h = self.next_push(server)?;
        out.extend_from_slice(&h.encode());
        Some(Transmit::Lent(self.workers + server, h))
    }

    fn lent_payload(&self, h: &Header) -> &[f32] {
        self.pushed_values(h)
    }

    fn recv_slot(&mut self, link: Rank, h: &Header) -> Result<&mut [f32], ProtocolError> {
        let server = self.server_index(link).ok_or_else(|| {
            ProtocolError::unexpected(link, h, "a worker accepts frames only from servers")
        })?;
        if h.kind != FrameKind::Params {
            return Err(ProtocolError::unexpected(
                link,
                h,
                "a worker expects only Params frames",
            ));
        }
        if h.step != self.step {
            return Err(ProtocolError::unexpected(
                link,
                h,
                &format!("wrong step (this worker is at step {})", self.step),
            ));
        }
        let slice = self
            .reg
            .find_slice(h.key as usize, h.offset as usize, h.length as usize)
            .ok_or_else(|| ProtocolError::unexpected(link, h, "no such slice"))?;
        if self.reg.owner(slice) != server {
            return Err(ProtocolError::unexpected(
                link,
                h,
                "slice owned by another server",
            ));
        }
        if bit(&self.received, slice) {
            return Err(ProtocolError::unexpected(link, h, "slice received twice"));
        }
        let s = self.reg.slices()[slice];
        // The key's buffer is made at the step's start and handed out once complete.
        self.keys[s.key]
            .params
            .get_mut(s.range())
            .ok_or_else(|| ProtocolError::unexpected(link, h, "parameters outside a step"))
    }

    fn handle_payload(&mut self, link: Rank, h: &Header) -> Result<(), ProtocolError> {
        let slice = self
            .reg
            .find_slice(h.key as usize, h.offset as usize, h.length as usize)
            .ok_or_else(|| ProtocolError::unexpected(link, h, "no such slice"))?;
        set_bit(&mut self.received, slice);
        if self.credit.is_some() {
            self.in_flight = self.in_flight.saturating_sub(h.length as usize * 4);
            let s = self.reg.slices()[slice];
            let key = (
                self.reg.keys()[s.key].layer as i64,
                s.index_in_key as u64,
                slice as u64,
            );
            self.in_flight_keys.remove(&key);
        }
        let key = h.key as usize;
        self.keys[key].slices_left -= 1;
        if self.keys[key].slices_left == 0 {
            self.events.push_back(WorkerEvent::ParamsReady(key));
            self.keys_left -= 1;
            if self.keys_left == 0 {
                self.events.push_back(WorkerEvent::StepDone);
            }
        }
        Ok(())
    }
}

/// A worker's key: its fresh values (made at the step's start, handed out once complete)
/// and how many of its slices are still to come.
#[derive(Debug, Clone, Default)]
#[repr(align(32))]
struct KeyState {
    params: Vec<f32>,
    slices_left: usize,
}

/// One parameter-server shard: owns some slices, aggregates pushes, applies SGD, answers.
pub struct PsServer {
    index: usize,
    rank: Rank,
    workers: usize,
    reg: TensorRegistry,
    sgd: Sgd,
    base_lr: f32,
    schedule: LrSchedule,
    params: Vec<Vec<f32>>,
    velocity: Vec<Vec<f32>>,
    /// Running sum of the pushes of each key's owned slices (zero between steps).
    acc: Vec<Vec<f32>>,
    /// One receive buffer per worker link, `scratch_len` values each, side by side, so a
    /// frame's slot stays put until it is complete whatever other frames arrive meanwhile.
    scratch: Vec<f32>,
    scratch_len: usize,
    /// Pushes that began to arrive before their turn in the rank-order sum.
    early: EarlyPushes,
    /// Early pushes held now, and the most ever held at once (values), for the cost of
    /// summing in rank order.
    early_values: usize,
    peak_early_values: usize,
    latest_step: u64,
    /// Per slice, how its pushes stand (one cache line each: a push reads all of it).
    slices: Vec<SliceState>,
    /// Answers waiting for the workers (each updated slice for every worker).
    out: BroadcastQueue,
    arrival: u64,
    updates: u64,
    sequence: u64,
    /// Slices this server owns.
    owned_slices: usize,
    /// Per step not yet complete: slices updated.
    updated_in_step: std::collections::BTreeMap<u64, usize>,
    /// Steps all of whose owned slices are updated, not yet polled.
    completed: std::collections::VecDeque<u64>,
    /// The frame whose slot [`Endpoint::recv_slot`] handed out last, and its slice.
    last_slot: Option<LastSlot>,
}

/// Where a server's slice stands.
#[derive(Debug, Clone, Default)]
#[repr(align(64))]
struct SliceState {
    /// Pushes of this step in.
    pushes: usize,
    /// The step of the pushes in (once one is), or the next step expected.
    step: u64,
    /// The worker whose push is added next.
    next_rank: usize,
    /// The step of the values last updated (what the answers carry).
    out_step: u64,
    /// A bit per worker whose push of this step is in.
    pushed_by: Vec<u64>,
}

/// A push a server handed out a slot for: what of its header names the slice, and the slice.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct LastSlot {
    link: Rank,
    kind: FrameKind,
    key: u32,
    offset: u32,
    length: u32,
    slice: usize,
}

impl LastSlot {
    fn of(link: Rank, h: &Header, slice: usize) -> Self {
        Self {
            link,
            kind: h.kind,
            key: h.key,
            offset: h.offset,
            length: h.length,
            slice,
        }
    }

    /// Whether a frame from `link` with header `h` names the same slice.
    fn is(&self, link: Rank, h: &Header) -> bool {
        *self == Self::of(link, h, self.slice)
    }
}

/// Optimizer settings a server applies.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ServerOptim {
    /// The SGD rule.
    pub sgd: Sgd,
    /// Base learning rate.
    pub lr: f32,
    /// Schedule over the step number carried by the frames.
    pub schedule: LrSchedule,
}

impl ServerOptim {
    /// Plain SGD (no momentum, no weight decay) at the constant rate `lr`: for servers whose
    /// values nobody trains on (benchmarks, the simulator).
    pub fn plain(lr: f32) -> Self {
        Self {
            sgd: Sgd::new(SgdConfig {
                momentum: 0.0,
                weight_decay: 0.0,
            }),
            lr,
            schedule: LrSchedule::Constant,
        }
    }
}

impl PsServer {
    /// Server number `index` (rank `workers + index`), starting from `initial` values of
    /// every key (it keeps the slices it owns).
    pub fn new(
        index: usize,
        workers: usize,
        reg: TensorRegistry,
        initial: Vec<Vec<f32>>,
        optim: ServerOptim,
        scheduler: SchedulerKind,
    ) -> Self {
        let keys = reg.keys().len();
        let owns_key: Vec<bool> = (0..keys)
            .map(|k| reg.slices_of(k).any(|s| reg.owner(s) == index))
            .collect();
        let sized = |k: usize| {
            if owns_key[k] {
                vec![0.0; reg.keys()[k].numel]
            } else {
                Vec::new()
            }
        };
        let params = initial
            .into_iter()
            .enumerate()
            .map(|(k, v)| if owns_key[k] { v } else { Vec::new() })
            .collect();
        let slices = reg.slices().len();
        let max_slice = reg.slices().iter().map(|s| s.len).max().unwrap_or(0);
        // Per-worker bookkeeping for the slices this server owns only (frames for the others
        // are refused before it is looked at): with many servers, most slices are others'.
        let owned = |s: usize| reg.owner(s) == index;
        let per_worker = |s: usize, n: usize| if owned(s) { n } else { 0 };
        Self {
            index,
            rank: workers + index,
            workers,
            sgd: optim.sgd,
            base_lr: optim.lr,
            schedule: optim.schedule,
            params,
            velocity: (0..keys).map(sized).collect(),
            acc: (0..keys).map(sized).collect(),
            scratch: vec![0.0; workers.saturating_mul(max_slice)],
            scratch_len: max_slice,
            early: EarlyPushes::new((0..slices).map(|s| per_worker(s, workers))),
            early_values: 0,
            peak_early_values: 0,
            latest_step: 0,
            slices: (0..slices)
                .map(|s| SliceState {
                    pushed_by: vec![0; per_worker(s, workers).div_ceil(64)],
                    ..SliceState::default()
                })
                .collect(),
            out: BroadcastQueue::new(scheduler, workers),
            arrival: 0,
            updates: 0,
            sequence: 0,
            owned_slices: (0..slices).filter(|&s| reg.owner(s) == index).count(),
            updated_in_step: Default::default(),
            completed: Default::default(),
            last_slot: None,
            reg,
        }
    }

    /// Counts an update of a slice of `step`; the step is complete once every owned slice
    /// has had its update.
    fn count_update(&mut self, step: u64) {
        let n = self.updated_in_step.entry(step).or_insert(0);
        *n += 1;
        if *n == self.owned_slices {
            self.updated_in_step.remove(&step);
            self.completed.push_back(step);
            self.early.trim();
        }
    }

    /// The slice a push from `link` with header `h` carries, if this server takes it now.
    fn check(&self, link: Rank, h: &Header) -> Result<usize, ProtocolError> {
        let slice = self.owned_slice(link, h)?;
        self.check_turn(link, h, slice)?;
        Ok(slice)
    }

    /// [`PsServer::check`] for the payload of the frame whose slot was last handed out:
    /// the slice found then (what a header says never changes), the step checked again
    /// (other pushes may have come in since).
    fn check_payload(&self, link: Rank, h: &Header) -> Result<usize, ProtocolError> {
        match self.last_slot {
            Some(last) if last.is(link, h) => {
                self.check_turn(link, h, last.slice)?;
                Ok(last.slice)
            }
            _ => self.check(link, h),
        }
    }

    /// The slice of this server's that a push from `link` with header `h` names.
    fn owned_slice(&self, link: Rank, h: &Header) -> Result<usize, ProtocolError> {
        if link >= self.workers {
            return Err(ProtocolError::unexpected(
                link,
                h,
                "a server accepts frames only from workers",
            ));
        }
        if h.kind != FrameKind::Push {
            return Err(ProtocolError::unexpected(
                link,
                h,
                "a server expects only Push frames",
            ));
        }
        let slice = self
            .reg
            .find_slice(h.key as usize, h.offset as usize, h.length as usize)
            .ok_or_else(|| ProtocolError::unexpected(link, h, "no such slice"))?;
        if self.reg.owner(slice) != self.index {
            return Err(ProtocolError::unexpected(
                link,
                h,
                "slice owned by another server",
            ));
        }
        Ok(slice)
    }

    /// Whether a push of `slice` from `link` with header `h` fits the slice's step and is
    /// the link's first of it.
    #[inline(always)]
    fn check_turn(&self, link: Rank, h: &Header, slice: usize) -> Result<(), ProtocolError> {
        let state = &self.slices[slice];
        if state.pushes > 0 && h.step != state.step {
            return Err(ProtocolError::unexpected(
                link,
                h,
                &format!("step differs from the other workers' step {}", state.step),
            ));
        }
        if h.step == u64::MAX {
            // The slice's next step would not be representable.
            return Err(ProtocolError::unexpected(link, h, "step out of range"));
        }
        if state.pushes == 0 && h.step < state.step {
            return Err(ProtocolError::unexpected(link, h, "step already completed"));
        }
        if bit(&state.pushed_by, link) {
            return Err(ProtocolError::unexpected(
                link,
                h,
                "pushed twice in one step",
            ));
        }
        Ok(())
    }
}

impl ServerSync for PsServer {
    fn state(&self) -> (&[Vec<f32>], &[Vec<f32>]) {
        (&self.params, &self.velocity)
    }

    fn restore(
        &mut self,
        params: Vec<Vec<f32>>,
        velocity: Vec<Vec<f32>>,
        first_step: u64,
    ) -> Result<(), String> {
        let shapes = |v: &[Vec<f32>]| v.iter().map(Vec::len).collect::<Vec<_>>();
        let want = shapes(&self.params);
        if shapes(&params) != want || shapes(&velocity) != want {
            return Err(format!(
                "the checkpoint's tensors do not match server {}'s share of the model",
                self.index
            ));
        }
        self.params = params;
        self.velocity = velocity;
        self.slices.iter_mut().for_each(|s| s.step = first_step);
        self.latest_step = first_step;
        Ok(())
    }

    fn poll_step_complete(&mut self) -> Option<u64> {
        self.completed.pop_front()
    }

    fn values(&self, key: usize) -> &[f32] {
        &self.params[key]
    }

    fn updates(&self) -> u64 {
        self.updates
    }

    fn peak_early_values(&self) -> usize {
        self.peak_early_values
    }

    fn latest_step(&self) -> u64 {
        self.latest_step
    }

    fn has_pending_replies(&self) -> bool {
        !self.out.is_empty()
    }
}

impl PsServer {
    /// Adds, in rank order, the pushes of `slice` that arrived (all of them) before their
    /// turn and whose turn has come.
    fn add_waiting_pushes(&mut self, slice: usize) {
        let s = self.reg.slices()[slice];
        // A push still arriving stays where it is until it is all in.
        while self
            .early
            .holds_complete(slice, self.slices[slice].next_rank)
        {
            let link = self.slices[slice].next_rank;
            let values = self.early.values(slice, link);
            add_assign(&mut self.acc[s.key][s.range()], values);
            self.early_values -= values.len();
            self.early.release(slice, link);
            self.slices[slice].next_rank += 1;
        }
    }

    /// Takes the next answer queued for `link` and says what it carries (the payload is
    /// `params[key][offset..offset + length]`).
    fn next_answer(&mut self, link: Rank) -> Option<Header> {
        let p = self.out.pop(link)?;
        let s = self.reg.slices()[p.item];
        let step = self.slices[p.item].out_step;
        let h = slice_header(FrameKind::Params, step, &s, &p, self.rank, self.sequence);
        self.sequence += 1;
        Some(h)
    }

    /// The most urgent of the links in `links` that has an answer queued.
    fn most_urgent_link(&self, links: &[Rank]) -> Option<Rank> {
        self.out.most_urgent(links)
    }
}

impl Endpoint for PsServer {
    fn pooled_bytes(&self) -> usize {
        self.early.pooled_bytes()
    }

    fn poll_transmit(&mut self, link: Rank, out: &mut Vec<u8>) -> bool {
        let Some(h) = self.next_answer(link) else {
            return false;
        };
        encode_frame_from(out, &h, &self.params);
        true
    }

    fn poll_transmit_any(&mut self, links: &[Rank], out: &mut Vec<u8>) -> Option<Rank> {
        let link = self.most_urgent_link(links)?;
        self.poll_transmit(link, out).then_some(link)
    }

    // A slice's values change only when every worker has pushed it again, and a worker
    // pushes it again only after it has received these values, so after they were written.
    fn poll_transmit_lent(&mut self, links: &[Rank], out: &mut Vec<u8>) -> Option<Transmit> {
        let link = self.most_urgent_link(links)?;
        let h = self.next_answer(link)?;
        out.extend_from_slice(&h.encode());
        Some(Transmit::Lent(link, h))
    }

    fn lent_payload(&self, h: &Header) -> &[f32] {
        frame_values(&self.params, h)
    }

    fn recv_slot(&mut self, link: Rank, h: &Header) -> Result<&mut [f32], ProtocolError> {
        let slice = self.check(link, h)?;
        self.last_slot = Some(LastSlot::of(link, h, slice));
        let len = self.reg.slices()[slice].len;
        if !self.early.holds(slice, link) && link == self.slices[slice].next_rank {
            let start = link * self.scratch_len;
            return Ok(&mut self.scratch[start..start + len]);
        }
        // Before its turn: into a buffer of its own, where it waits. A driver asks again for
        // the slot of a frame still arriving (its turn may come meanwhile), so the frame
        // keeps the buffer it was given.
        (self.early.buffer(slice, link, len))
            .ok_or_else(|| ProtocolError::unexpected(link, h, "no such worker for this slice"))
    }

    fn handle_payload(&mut self, link: Rank, h: &Header) -> Result<(), ProtocolError> {
        let slice = self.check_payload(link, h)?;
        let s = self.reg.slices()[slice];
        let r = s.range();
        self.latest_step = self.latest_step.max(h.step);
        if self.early.complete(slice, link) {
            self.early_values += s.len;
            self.peak_early_values = self.peak_early_values.max(self.early_values);
        } else if link == self.slices[slice].next_rank {
            // Read into the sum's own buffer: it was this push's turn when it began.
            let start = link * self.scratch_len;
            let pushed = &self.scratch[start..start + s.len];
            add_assign(&mut self.acc[s.key][r.clone()], pushed);
            self.slices[slice].next_rank += 1;
        } else {
            return Err(ProtocolError::unexpected(
                link,
                h,
                "payload handed over without its slot",
            ));
        }
        self.add_waiting_pushes(slice);
        let state = &mut self.slices[slice];
        if state.pushes == 0 {
            state.step = h.step;
        }
        state.pushes += 1;
        set_bit(&mut state.pushed_by, link);
        if state.pushes == self.workers {
            let acc = &mut self.acc[s.key][r.clone()];
            scale(acc, 1.0 / self.workers as f32);
            let lr = self.schedule.lr_at(self.base_lr, h.step);
            self.sgd.step(
                lr,
                &mut self.params[s.key][r.clone()],
                acc,
                &mut self.velocity[s.key][r],
            );
            acc.iter_mut().for_each(|a| *a = 0.0);
            let state = &mut self.slices[slice];
            state.next_rank = 0;
            state.pushes = 0;
            state.pushed_by.iter_mut().for_each(|w| *w = 0);
            state.out_step = h.step;
            state.step = h.step + 1;
            self.updates += 1;
            self.count_update(h.step);
            let p = pending_for(&self.reg, slice, &mut self.arrival);
            self.out.push_all(p);
        }
        Ok(())
    }
}
