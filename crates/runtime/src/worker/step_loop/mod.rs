//! The worker's training loop: a thin driver of core's step sequencer
//! ([`syncopate_core::step`]) over the real engine and the communication thread. Every
//! sequencing decision (what runs when, what waits for what, where the optimizer runs, when
//! to evaluate) is the sequencer's; this module does what it is told and records how long
//! it took. Its parts: the step's actions here, the messages of the communication thread
//! ([`inbox`]), the backward pass and what follows each layer ([`backward`]), the
//! evaluation and checkpoint points ([`points`]), and what the loop measures ([`record`]).

use std::ops::Range;
use std::time::{Duration as StdDuration, Instant};

use syncopate_core::latency::TensorTimes;
use syncopate_core::step::{Action, Awaiting, StepSequencer};
use syncopate_train::data::{Batch, Loader, Split};
use syncopate_train::engine::{LayerwiseEngine, StepOutput};
use syncopate_train::trainer::{LocalOptimizer, Observer};

use super::checkpointing::Checkpointer;
use super::comm_thread::{Comm, ToComm};
use super::step_rows::StepRows;
use super::{EvalLog, WorkerTimes};
use crate::error::RunError;
use crate::trace::TraceRecorder;

mod backward;
mod inbox;
mod points;
mod record;
pub(super) use record::Record;

/// The engine, the data and the communication thread, driven by a sequencer.
pub(super) struct StepLoop<'a, E> {
    pub engine: &'a mut E,
    pub comm: &'a mut Comm,
    pub loader: Loader,
    pub optimizer: LocalOptimizer,
    /// Averaged gradients (all-reduce strategies).
    pub grads: Vec<Vec<f32>>,
    /// The test set, where this worker evaluates.
    pub test: Option<&'a Split>,
    pub observer: &'a mut dyn Observer,
    pub tracer: Option<TraceRecorder>,
    pub layer_names: Vec<String>,
    pub layer_keys: Vec<Range<usize>>,
    /// Compute takes this many times as long (a straggler; 1: as measured).
    pub slowdown: f64,
    /// Samples per step over all workers.
    pub global_batch: usize,
    /// This worker's rank (worker 0's buffers are the ones every worker takes).
    pub rank: usize,
    /// Where to write this worker's weight snapshots at evaluation points, and its rank.
    pub snapshots: Option<(std::path::PathBuf, usize)>,
    /// Where this worker writes its checkpoints.
    pub checkpoints: Option<Checkpointer>,
    pub record: Record,
    /// The first step of this run (after a checkpoint's steps when resumed).
    first_step: u64,
    /// The step being run, its epoch, its batch and its figures.
    step: u64,
    epoch: u64,
    batch: Option<Batch>,
    out: Option<StepOutput>,
    step_start: Instant,
    times_at_step_start: WorkerTimes,
    /// Bytes this worker had sent on all its links when the last step ended and when this
    /// one started: a step's row records what was sent between the two (a periodic
    /// average or outer step between steps) and what was sent during the step.
    sent_at: (u64, u64),
    /// Per-tensor completion times (hand-over to values back), on `record.start`'s clock.
    pub tensors: TensorTimes,
    /// Worker 0's buffers, relayed here before this worker reached their evaluation point.
    relayed: Option<(u64, Vec<f32>)>,
}

impl<'a, E: LayerwiseEngine> StepLoop<'a, E> {
    /// A loop over `engine` and `comm`; the remaining fields are set by the caller.
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        engine: &'a mut E,
        comm: &'a mut Comm,
        loader: Loader,
        optimizer: LocalOptimizer,
        test: Option<&'a Split>,
        observer: &'a mut dyn Observer,
        tracer: Option<TraceRecorder>,
        key_sizes: &[usize],
    ) -> Self {
        let spec = engine.spec();
        let layer_names = spec.layers.iter().map(|l| l.name.clone()).collect();
        let layer_keys = spec.layer_keys();
        let grads = key_sizes.iter().map(|&n| vec![0.0; n]).collect();
        Self {
            engine,
            comm,
            loader,
            optimizer,
            grads,
            test,
            observer,
            tracer,
            layer_names,
            layer_keys,
            slowdown: 1.0,
            global_batch: 0,
            rank: 0,
            snapshots: None,
            checkpoints: None,
            record: Record::new(StepRows::default(), EvalLog::default()),
            first_step: 0,
            step: 0,
            epoch: 0,
            batch: None,
            out: None,
            step_start: Instant::now(),
            times_at_step_start: WorkerTimes::default(),
            sent_at: (0, 0),
            tensors: TensorTimes::new(key_sizes.len()),
            relayed: None,
        }
    }

    /// Runs `seq` to its end.
    pub fn run(&mut self, seq: &mut StepSequencer) -> Result<(), RunError> {
        self.first_step = seq.plan().first_step;
        if seq.plan().first_step > 0 {
            self.observer.on_resume(seq.plan().first_step);
        }
        self.observer.on_start(seq.plan().steps);
        self.record.start = Instant::now();
        loop {
            let action = seq.poll_action();
            match action {
                Action::Finished => {
                    self.record.trained = self.record.train_seconds();
                    return Ok(());
                }
                Action::Wait => self.wait(seq)?,
                Action::LoadBatch(step) => self.load_batch(step)?,
                Action::Begin(step) => self.comm.send(ToComm::Begin(step))?,
                Action::Forward(layer) => {
                    self.forward(layer)?;
                    seq.compute_done();
                }
                Action::Loss => {
                    let t = Instant::now();
                    self.out = Some(self.engine.finish_forward()?);
                    self.record.times.compute += t.elapsed().as_secs_f64();
                }
                Action::Backward(layer) => self.backward(seq, layer)?,
                Action::BackwardDone => self.comm.send(ToComm::BackwardDone)?,
                Action::OptimizeLayer(_) | Action::HandOver(_) => {
                    return Err(RunError::Local(format!(
                        "step sequence: {action:?} outside a backward pass"
                    )))
                }
                Action::Optimize => self.optimize()?,
                Action::StepEnd(step) => {
                    self.step_end(step, seq.plan().steps)?;
                    seq.handle_step_end(self.record.clock_ns());
                }
                Action::Retune(knobs) => self.comm.send(ToComm::Retune(knobs))?,
                Action::Evaluate {
                    step,
                    epoch_end,
                    last,
                } => self.evaluate(step, epoch_end, last, seq.plan().steps)?,
                Action::Checkpoint(step) => self.checkpoint(step)?,
                Action::SyncBuffers(step) => self.sync_buffers(seq, step)?,
            }
        }
    }

    fn span(&mut self, cat: &str, name: &str, start: Instant, end: Instant) {
        if let Some(t) = self.tracer.as_mut() {
            t.span(self.step, cat, name, start, end);
        }
    }

    /// Waits for the next message of the communication thread and hands it over.
    fn wait(&mut self, seq: &mut StepSequencer) -> Result<(), RunError> {
        let t = Instant::now();
        let awaiting = seq.awaiting();
        self.receive(seq)?;
        let end = Instant::now();
        self.record.times.wait += (end - t).as_secs_f64();
        if end - t > StdDuration::from_micros(50) {
            let name = match awaiting {
                Awaiting::Params(layer) => format!("wait params {}", self.layer_names[layer]),
                Awaiting::AllValues => "wait all values".into(),
                _ => "wait step done".into(),
            };
            self.span("wait", &name, t, end);
        }
        Ok(())
    }

    fn load_batch(&mut self, step: u64) -> Result<(), RunError> {
        self.step = step;
        self.step_start = Instant::now();
        self.times_at_step_start = self.record.times;
        self.sent_at.1 = self.sent_so_far();
        let t = Instant::now();
        let (epoch, _, batch) = self
            .loader
            .next_batch()
            .ok_or_else(|| RunError::Local("the data loader stopped early".into()))?;
        self.epoch = epoch;
        self.batch = Some(batch);
        self.record.times.data += t.elapsed().as_secs_f64();
        self.span("data", "load batch", t, Instant::now());
        Ok(())
    }

    /// Waits out the rest of a straggler's compute: `slowdown - 1` times what it took.
    fn straggle(&self, took: StdDuration) {
        if self.slowdown > 1.0 {
            std::thread::sleep(took.mul_f64(self.slowdown - 1.0));
        }
    }

    fn forward(&mut self, layer: usize) -> Result<(), RunError> {
        let t = Instant::now();
        if layer == 0 {
            let batch = self
                .batch
                .take()
                .ok_or_else(|| RunError::Local("forward before a batch was loaded".into()))?;
            self.engine.begin_forward(&batch)?;
        }
        self.engine.forward_layer(layer)?;
        self.straggle(t.elapsed());
        let end = Instant::now();
        self.record.times.compute += (end - t).as_secs_f64();
        let name = format!("forward {}", self.layer_names[layer]);
        self.span("compute", &name, t, end);
        Ok(())
    }

    /// The optimizer on every key with the averaged gradients (all-reduce strategies).
    fn optimize(&mut self) -> Result<(), RunError> {
        let t = Instant::now();
        self.optimizer.apply(&mut *self.engine, &self.grads)?;
        let end = Instant::now();
        self.record.times.optimizer += (end - t).as_secs_f64();
        self.span("optimizer", "optimizer", t, end);
        Ok(())
    }
}
