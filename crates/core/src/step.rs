//! The worker's step sequencer: one training step after another as a sans-IO state machine,
//! the one place that decides in what order a worker computes, hands over and waits.
//!
//! Both drivers run it: the runtime's worker (real layers on a real engine, real waits on the
//! communication thread) and the simulator's workers (profiled layer times on virtual time).
//! The driver asks [`StepSequencer::poll_action`] what to do, does it, and reports back: a
//! computation ([`Action::Forward`], [`Action::Backward`]) with
//! [`StepSequencer::compute_done`], a strategy event with [`StepSequencer::handle_event`].
//! [`Action::Wait`] means nothing can happen until an event arrives or the computation
//! finishes.
//!
//! One step, in order:
//! 1. [`Action::LoadBatch`], then, unless the forward overlaps the last step's
//!    synchronisation, [`Action::Begin`] (ring neighbours may send this step's frames as soon
//!    as they are ahead, so the step begins before the forward).
//! 2. [`Action::Forward`] layer by layer, then [`Action::Loss`]. With forward overlap
//!    ([`StrategyKind::forward_overlap`]: parameter servers with overlap, P3, DLCP,
//!    step-wise averaging) layer `k` waits only until every key of layer `k`
//!    has its fresh value ([`WorkerEvent::ParamsReady`]); the step then begins once the last
//!    step's [`WorkerEvent::StepDone`] is in.
//! 3. [`Action::Backward`] from the last layer to the first; after each layer, where the
//!    optimizer runs before synchronisation (weight averaging), [`Action::OptimizeLayer`],
//!    then [`Action::HandOver`] of the layer's gradients (or weights); then
//!    [`Action::BackwardDone`].
//! 4. Without forward overlap: wait for StepDone, then [`Action::Optimize`] where the
//!    optimizer runs locally on the averaged gradients (all-reduce).
//! 5. [`Action::StepEnd`]; at evaluation points (epoch ends, every N steps, the last step),
//!    once every value of the step is in, [`Action::Evaluate`]; at checkpoint points
//!    ([`CheckpointSchedule`]), once every value of the step is in and after any evaluation,
//!    [`Action::Checkpoint`].
//!
//! A resumed job starts at [`StepPlan::first_step`] (the steps its checkpoint holds).
//!
//! With a tuner ([`StepPlan::tune`], `--autotune`) the driver reports the time of every
//! [`Action::StepEnd`] with [`StepSequencer::handle_step_end`]; the time between two step
//! ends feeds the [`CreditTuner`] (intervals with an evaluation or a checkpoint in them are
//! left out), and when it changes the settings the next step starts with
//! [`Action::Retune`], which the driver hands to the strategy's
//! [`crate::strategy::WorkerSync::retune`].
//!
//! After the last step the sequencer waits for every outstanding value, then answers
//! [`Action::Finished`] for good.

use std::ops::Range;
use std::sync::Arc;

use crate::strategy::{StrategyKind, WorkerEvent};
use crate::tune::{CreditTuner, Knobs, TuneSpec};

/// Where a worker's optimizer runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OptimizerPlace {
    /// On the parameter servers; the worker installs the values they send back.
    Server,
    /// Locally, once the averaged gradients of the whole step are in (all-reduce).
    AfterSync,
    /// Locally on each layer's own gradients as backward produces them, before its weights
    /// are handed over for averaging (weight-averaging strategies).
    BeforeSync,
}

impl OptimizerPlace {
    /// Where `strategy` runs its optimizer.
    pub fn of(strategy: StrategyKind) -> Self {
        if strategy.uses_servers() {
            OptimizerPlace::Server
        } else if strategy.averages() == crate::strategy::Averaged::Weights {
            OptimizerPlace::BeforeSync
        } else {
            OptimizerPlace::AfterSync
        }
    }
}

/// When rank 0 evaluates the model on the test set.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct EvalSchedule {
    /// Whether this worker evaluates at all (rank 0 of a model with a test set).
    pub enabled: bool,
    /// Steps per epoch: the end of every epoch is an evaluation point.
    pub steps_per_epoch: u64,
    /// Also every this many steps.
    pub every: Option<u64>,
}

impl EvalSchedule {
    /// Whether step `step` (0-based) of `steps` ends at an evaluation point; the last step
    /// always does.
    pub fn due(&self, step: u64, steps: u64) -> bool {
        self.enabled && self.point(step, steps)
    }

    /// Whether step `step` (0-based) of `steps` ends at an evaluation point of the job,
    /// whether or not this worker evaluates (the same on every worker).
    pub fn point(&self, step: u64, steps: u64) -> bool {
        let done = step.saturating_add(1);
        let epoch_end = self.steps_per_epoch > 0 && done.is_multiple_of(self.steps_per_epoch);
        let periodic = self.every.is_some_and(|n| n > 0 && done.is_multiple_of(n));
        epoch_end || periodic || done == steps
    }

    /// Whether step `step` (0-based) is the last of an epoch.
    pub fn epoch_end(&self, step: u64) -> bool {
        self.steps_per_epoch > 0 && step.saturating_add(1).is_multiple_of(self.steps_per_epoch)
    }
}

/// When every process of a job writes its state (`--checkpoint-every N`): after every N-th
/// step, counted from the first step of the job (not of a resumed run), so a resumed job
/// checkpoints at the same steps as an uninterrupted one. Servers follow the same rule.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct CheckpointSchedule {
    /// Steps between two checkpoints; `None`: never.
    pub every: Option<u64>,
}

impl CheckpointSchedule {
    /// Whether the state after step `step` (0-based) of a `steps`-step job is checkpointed:
    /// every N-th step and the last (so a finished job can be resumed to train longer).
    pub fn due(&self, step: u64, steps: u64) -> bool {
        let done = step.saturating_add(1);
        self.every
            .is_some_and(|n| n > 0 && (done.is_multiple_of(n) || done == steps))
    }
}

/// A worker whose compute takes `factor` times as long as the others' (`--slow-worker
/// RANK:FACTOR`): the real engine waits out the difference after each layer, the simulator
/// multiplies the profiled times.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Straggler {
    /// The worker's rank.
    pub rank: usize,
    /// How many times as long its compute takes (at least 1).
    pub factor: f64,
}

/// A malformed `--slow-worker` value.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("--slow-worker '{input}': {why} (expected RANK:FACTOR with FACTOR >= 1, e.g. 2:1.5)")]
pub struct StragglerError {
    input: String,
    why: &'static str,
}

impl std::str::FromStr for Straggler {
    type Err = StragglerError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let err = |why| StragglerError {
            input: s.into(),
            why,
        };
        let (rank, factor) = s.split_once(':').ok_or_else(|| err("no ':'"))?;
        let rank = rank
            .trim()
            .parse()
            .map_err(|_| err("the rank is not a number"))?;
        let factor: f64 = factor
            .trim()
            .parse()
            .map_err(|_| err("the factor is not a number"))?;
        if !factor.is_finite() || factor < 1.0 {
            return Err(err("the factor must be a finite number of at least 1"));
        }
        Ok(Self { rank, factor })
    }
}

impl Straggler {
    /// How many times as long `rank`'s compute takes among `stragglers` (1 if none names it).
    pub fn slowdown(stragglers: &[Straggler], rank: usize) -> f64 {
        stragglers
            .iter()
            .filter(|s| s.rank == rank)
            .map(|s| s.factor)
            .fold(1.0, f64::max)
    }

    /// Refuses stragglers naming a rank that is not a worker.
    pub fn check(stragglers: &[Straggler], workers: usize) -> Result<(), StragglerError> {
        match stragglers.iter().find(|s| s.rank >= workers) {
            Some(s) => Err(StragglerError {
                input: format!("{}:{}", s.rank, s.factor),
                why: "no worker has this rank",
            }),
            None => Ok(()),
        }
    }
}

/// What a waiting sequencer waits for (for timelines and stall reports).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Awaiting {
    /// The computation handed out.
    Compute,
    /// Fresh values of this layer's keys, before its forward.
    Params(usize),
    /// The end of the step last begun.
    StepDone,
    /// Every value of the step last begun (before an evaluation or the end).
    AllValues,
    /// Nothing: the sequencer can go on.
    Nothing,
}

/// Everything that shapes a worker's sequence.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StepPlan {
    /// Steps to run.
    pub steps: u64,
    /// Whether layer `k` of the next forward waits only for layer `k`'s fresh values.
    pub forward_overlap: bool,
    /// Where the optimizer runs.
    pub optimizer: OptimizerPlace,
    /// The keys each layer owns, layers numbered from the input (shared by the clones a
    /// simulator gives each of its workers).
    pub layer_keys: Arc<[Range<usize>]>,
    /// Evaluation points.
    pub eval: EvalSchedule,
    /// Checkpoint points.
    pub checkpoint: CheckpointSchedule,
    /// The step to start from: 0, or the steps a resumed job's checkpoint holds.
    pub first_step: u64,
    /// The online search of the worker-local settings (`--autotune`), if any.
    pub tune: Option<TuneSpec>,
    /// Whether worker 0's buffers are relayed to every worker at each evaluation point
    /// ([`crate::buffers`]): a model with buffers, trained by more than one worker.
    pub sync_buffers: bool,
}

impl StepPlan {
    /// The plan of `strategy` for `steps` steps of a model whose layers own `layer_keys`,
    /// without evaluations.
    pub fn new(strategy: StrategyKind, steps: u64, layer_keys: Vec<Range<usize>>) -> Self {
        Self {
            steps,
            forward_overlap: strategy.forward_overlap(),
            optimizer: OptimizerPlace::of(strategy),
            layer_keys: layer_keys.into(),
            eval: EvalSchedule::default(),
            checkpoint: CheckpointSchedule::default(),
            first_step: 0,
            tune: None,
            sync_buffers: false,
        }
    }

    /// The same plan with the settings searched online as `tune` says.
    pub fn with_tuning(mut self, tune: Option<TuneSpec>) -> Self {
        self.tune = tune;
        self
    }

    /// The same plan with checkpoints at `checkpoint`'s points.
    pub fn with_checkpoints(mut self, checkpoint: CheckpointSchedule) -> Self {
        self.checkpoint = checkpoint;
        self
    }

    /// The same plan resumed after `first_step` steps (at most the plan's steps).
    pub fn resumed_at(mut self, first_step: u64) -> Self {
        self.first_step = first_step.min(self.steps);
        self
    }

    /// The same plan with evaluations at `eval`'s points.
    pub fn with_eval(mut self, eval: EvalSchedule) -> Self {
        self.eval = eval;
        self
    }

    /// The same plan, relaying worker 0's buffers at every evaluation point when `yes`.
    pub fn with_buffer_sync(mut self, yes: bool) -> Self {
        self.sync_buffers = yes;
        self
    }

    /// Whether the sequence stops after step `step` (0-based): an evaluation here, a
    /// buffer relay or a checkpoint.
    fn stops_after(&self, step: u64) -> bool {
        self.eval.due(step, self.steps)
            || self.relays_buffers_after(step)
            || self.checkpoint.due(step, self.steps)
    }

    /// Whether worker 0's buffers are relayed after step `step` (0-based).
    fn relays_buffers_after(&self, step: u64) -> bool {
        self.sync_buffers && self.eval.point(step, self.steps)
    }
}

/// What the driver should do next.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    /// Fetch the batch of this step.
    LoadBatch(u64),
    /// Call the strategy's `begin_step(step)`.
    Begin(u64),
    /// Compute this layer's forward; report [`StepSequencer::compute_done`].
    Forward(usize),
    /// Compute the loss after the last layer.
    Loss,
    /// Compute this layer's backward; report [`StepSequencer::compute_done`].
    Backward(usize),
    /// Apply the optimizer to this layer's keys with their own gradients.
    OptimizeLayer(usize),
    /// Hand this layer's gradients (or, with [`OptimizerPlace::BeforeSync`], its weights) to
    /// the strategy.
    HandOver(usize),
    /// Call the strategy's `handle_backward_done`.
    BackwardDone,
    /// Apply the optimizer to every key with the averaged gradients.
    Optimize,
    /// The training side of this step is over (the driver records its figures).
    StepEnd(u64),
    /// Every value of this step (0-based) is in, at an evaluation point: worker 0 sends
    /// its buffers, every other worker waits for them and installs them
    /// ([`crate::buffers`]), before anything evaluates or is saved.
    SyncBuffers(u64),
    /// Every value of this step is in: evaluate (rank 0).
    Evaluate {
        /// The step just ended (0-based).
        step: u64,
        /// Whether it was the last step of an epoch.
        epoch_end: bool,
        /// Whether it was the last step of the job.
        last: bool,
    },
    /// Every value of this step (0-based) is in: write this process's checkpoint.
    Checkpoint(u64),
    /// The tuner changed the worker-local settings: hand them to the strategy.
    Retune(Knobs),
    /// Nothing until a strategy event arrives or the computation finishes.
    Wait,
    /// Every step has run and every value is in.
    Finished,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    Start,
    BeginBeforeForward,
    Forward(usize),
    BeginAfterForward,
    Backward(usize),
    AfterBackward(usize),
    HandOver(usize),
    AwaitStepDone,
    Optimize,
    StepEnd,
    MaybeEvaluate,
    AwaitAll,
    Evaluate,
    Checkpoint,
    Drain,
    Finished,
}

/// One worker's sequence of steps; see the module docs.
#[derive(Debug, Clone)]
pub struct StepSequencer {
    plan: StepPlan,
    step: u64,
    phase: Phase,
    busy: bool,
    /// Keys whose value for the coming forward is installed (forward overlap).
    have: Vec<bool>,
    missing: usize,
    /// Whether the step last begun has reported StepDone.
    step_done: bool,
    steps_done: u64,
    tuner: Option<CreditTuner>,
    /// When the last step ended (driver's nanoseconds), unless an evaluation or a
    /// checkpoint came after it.
    last_step_end: Option<u64>,
    retune: Option<Knobs>,
}

impl StepSequencer {
    /// A sequencer for `plan`.
    pub fn new(plan: StepPlan) -> Self {
        let keys = plan.layer_keys.iter().map(|r| r.end).max().unwrap_or(0);
        Self {
            step: plan.first_step,
            phase: Phase::Start,
            busy: false,
            have: vec![true; keys],
            missing: 0,
            step_done: true,
            steps_done: 0,
            tuner: plan.tune.map(CreditTuner::new),
            last_step_end: None,
            retune: None,
            plan,
        }
    }

    /// The tuner, with what it measured and chose (`None` without `--autotune`).
    pub fn tuner(&self) -> Option<&CreditTuner> {
        self.tuner.as_ref()
    }

    /// The driver finished [`Action::StepEnd`] at `now_ns` on its clock.
    pub fn handle_step_end(&mut self, now_ns: u64) {
        let last = self.last_step_end.replace(now_ns);
        let (Some(tuner), Some(last)) = (self.tuner.as_mut(), last) else {
            return;
        };
        let seconds = now_ns.saturating_sub(last) as f64 / 1e9;
        if let Some(knobs) = tuner.handle_step(seconds) {
            self.retune = Some(knobs);
        }
    }

    /// The plan.
    pub fn plan(&self) -> &StepPlan {
        &self.plan
    }

    /// The step being run (or the step count once finished).
    pub fn step(&self) -> u64 {
        self.step
    }

    /// StepDone events received.
    pub fn steps_done(&self) -> u64 {
        self.steps_done
    }

    /// Whether every step has run and been synchronised.
    pub fn finished(&self) -> bool {
        self.phase == Phase::Finished
    }

    /// Where the worker stands, for stall reports.
    pub fn describe(&self) -> String {
        format!(
            "step {} {:?}{}, {} StepDone received, {} values outstanding",
            self.step,
            self.phase,
            if self.busy { " (computing)" } else { "" },
            self.steps_done,
            self.missing
        )
    }

    /// What the sequencer waits for when [`StepSequencer::poll_action`] answers [`Action::Wait`].
    pub fn awaiting(&self) -> Awaiting {
        match self.phase {
            _ if self.busy => Awaiting::Compute,
            Phase::Forward(k) if k < self.plan.layer_keys.len() && !self.layer_ready(k) => {
                Awaiting::Params(k)
            }
            Phase::BeginAfterForward | Phase::AwaitStepDone if !self.step_done => {
                Awaiting::StepDone
            }
            Phase::AwaitAll | Phase::Drain if !self.all_in() => Awaiting::AllValues,
            _ => Awaiting::Nothing,
        }
    }

    /// The computation last handed out finished.
    pub fn compute_done(&mut self) {
        self.busy = false;
    }

    /// An event from the strategy.
    pub fn handle_event(&mut self, event: WorkerEvent) {
        match event {
            WorkerEvent::ParamsReady(key) => {
                if let Some(h) = self.have.get_mut(key).filter(|h| !**h) {
                    *h = true;
                    self.missing -= 1;
                }
            }
            WorkerEvent::GradReady(_) => {}
            WorkerEvent::StepDone => {
                self.step_done = true;
                self.steps_done += 1;
            }
        }
    }

    /// Whether every value of the step last begun is in.
    fn all_in(&self) -> bool {
        self.step_done && self.missing == 0
    }

    fn layer_ready(&self, layer: usize) -> bool {
        let keys = self.plan.layer_keys[layer].clone();
        self.have.get(keys).is_none_or(|h| h.iter().all(|&h| h))
    }

    fn begin(&mut self) -> Action {
        self.step_done = false;
        if self.plan.forward_overlap {
            self.have.iter_mut().for_each(|h| *h = false);
            self.missing = self.have.len();
        }
        Action::Begin(self.step)
    }

    /// The next thing to do.
    pub fn poll_action(&mut self) -> Action {
        loop {
            if self.busy {
                return Action::Wait;
            }
            if let Some(action) = self.advance() {
                return action;
            }
        }
    }

    /// One transition: an action for the driver, or `None` to keep going.
    fn advance(&mut self) -> Option<Action> {
        match self.phase {
            Phase::Start => self.start_step(),
            Phase::BeginBeforeForward => {
                self.phase = Phase::Forward(0);
                (!self.plan.forward_overlap).then(|| self.begin())
            }
            Phase::Forward(k) => Some(self.forward(k)),
            Phase::BeginAfterForward => self.begin_after_forward(),
            Phase::Backward(k) => Some(self.backward(k)),
            Phase::AfterBackward(k) => {
                self.phase = Phase::HandOver(k);
                (self.plan.optimizer == OptimizerPlace::BeforeSync)
                    .then_some(Action::OptimizeLayer(k))
            }
            Phase::HandOver(k) => {
                self.phase = Phase::Backward(k);
                Some(Action::HandOver(k))
            }
            Phase::AwaitStepDone if !self.step_done => Some(Action::Wait),
            Phase::AwaitStepDone => {
                self.phase = Phase::Optimize;
                None
            }
            Phase::Optimize => {
                self.phase = Phase::StepEnd;
                (self.plan.optimizer == OptimizerPlace::AfterSync).then_some(Action::Optimize)
            }
            Phase::StepEnd => {
                self.phase = Phase::MaybeEvaluate;
                Some(Action::StepEnd(self.step))
            }
            Phase::MaybeEvaluate => {
                self.after_step_end();
                None
            }
            Phase::AwaitAll => self.await_all(),
            Phase::Evaluate => self.evaluate(),
            Phase::Checkpoint => self.checkpoint(),
            Phase::Drain if !self.all_in() => Some(Action::Wait),
            Phase::Drain => {
                self.phase = Phase::Finished;
                None
            }
            Phase::Finished => Some(Action::Finished),
        }
    }

    /// [`Phase::Start`]: a pending retune, the batch of the next step, or the drain after
    /// the last one.
    fn start_step(&mut self) -> Option<Action> {
        if self.step == self.plan.steps {
            self.phase = Phase::Drain;
            return None;
        }
        if let Some(knobs) = self.retune.take() {
            return Some(Action::Retune(knobs));
        }
        self.phase = Phase::BeginBeforeForward;
        Some(Action::LoadBatch(self.step))
    }

    /// [`Phase::Forward`]: layer `k`'s forward once its values are in, or the loss after the
    /// last layer.
    fn forward(&mut self, k: usize) -> Action {
        if k == self.plan.layer_keys.len() {
            self.phase = Phase::BeginAfterForward;
            return Action::Loss;
        }
        if self.plan.forward_overlap && !self.layer_ready(k) {
            return Action::Wait;
        }
        self.phase = Phase::Forward(k + 1);
        self.busy = true;
        Action::Forward(k)
    }

    /// [`Phase::BeginAfterForward`]: with forward overlap, the step begins once the last
    /// one is done; without, it began before the forward.
    fn begin_after_forward(&mut self) -> Option<Action> {
        let layers = self.plan.layer_keys.len();
        if !self.plan.forward_overlap {
            self.phase = Phase::Backward(layers);
            None
        } else if !self.step_done {
            Some(Action::Wait)
        } else {
            self.phase = Phase::Backward(layers);
            Some(self.begin())
        }
    }

    /// [`Phase::Backward`]: the backward of the layer below `k`, or backward done.
    fn backward(&mut self, k: usize) -> Action {
        if k == 0 {
            self.phase = if self.plan.forward_overlap {
                Phase::StepEnd
            } else {
                Phase::AwaitStepDone
            };
            return Action::BackwardDone;
        }
        self.phase = Phase::AfterBackward(k - 1);
        self.busy = true;
        Action::Backward(k - 1)
    }

    /// [`Phase::MaybeEvaluate`]: on to the stop point (every value in, then evaluation and
    /// checkpoint) where this step needs one, else straight to the next step.
    fn after_step_end(&mut self) {
        if self.plan.stops_after(self.step) {
            self.phase = Phase::AwaitAll;
        } else {
            self.step += 1;
            self.phase = Phase::Start;
        }
    }

    /// [`Phase::AwaitAll`]: once every value of the step is in, the buffers relayed where
    /// due.
    fn await_all(&mut self) -> Option<Action> {
        if !self.all_in() {
            return Some(Action::Wait);
        }
        self.phase = Phase::Evaluate;
        self.last_step_end = None;
        let step = self.step;
        self.plan
            .relays_buffers_after(step)
            .then_some(Action::SyncBuffers(step))
    }

    /// [`Phase::Evaluate`]: the evaluation, where due.
    fn evaluate(&mut self) -> Option<Action> {
        let step = self.step;
        self.phase = Phase::Checkpoint;
        self.plan
            .eval
            .due(step, self.plan.steps)
            .then(|| Action::Evaluate {
                step,
                epoch_end: self.plan.eval.epoch_end(step),
                last: step + 1 == self.plan.steps,
            })
    }

    /// [`Phase::Checkpoint`]: the checkpoint, where due, then the next step.
    fn checkpoint(&mut self) -> Option<Action> {
        let step = self.step;
        self.step += 1;
        self.phase = Phase::Start;
        self.plan
            .checkpoint
            .due(step, self.plan.steps)
            .then_some(Action::Checkpoint(step))
    }
}

#[cfg(test)]
mod tests;
