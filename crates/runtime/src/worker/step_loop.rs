//! The worker's training loop: a thin driver of core's step sequencer
//! ([`syncopate_core::step`]) over the real engine and the communication thread. Every
//! sequencing decision (what runs when, what waits for what, where the optimizer runs, when
//! to evaluate) is the sequencer's; this file does what it is told and records how long it
//! took.

use std::collections::VecDeque;
use std::ops::Range;
use std::time::{Duration as StdDuration, Instant};

use syncopate_core::step::{Action, Awaiting, OptimizerPlace, StepSequencer};
use syncopate_core::strategy::WorkerEvent;
use syncopate_train::data::{Batch, Loader, Split};
use syncopate_train::engine::{LayerGrads, LayerwiseEngine, StepOutput};
use syncopate_train::trainer::{evaluate, Evaluation, LocalOptimizer, Observer};

use super::checkpointing::{CarriedRecord, Checkpointer};
use super::comm_thread::{Comm, FromComm, ToComm};
use super::step_rows::StepRows;
use super::{EvalLog, WorkerTimes};
use crate::error::RunError;
use crate::replicas::write_snapshot;
use crate::trace::TraceRecorder;
use syncopate_core::latency::TensorTimes;

/// What the loop measured, for the worker's outputs.
pub(super) struct Record {
    /// Per-phase times.
    pub times: WorkerTimes,
    /// The last (up to) 20 training losses.
    pub recent: VecDeque<f64>,
    /// Test accuracy after each epoch.
    pub epoch_accuracy: Vec<f64>,
    /// Every evaluation.
    pub evals: EvalLog,
    /// Seconds spent evaluating and writing checkpoints (left out of training time).
    pub excluded_seconds: f64,
    /// Wall time of every step.
    pub step_seconds: Vec<f64>,
    /// `steps-rank<R>.csv`, appended to its file.
    pub step_rows: StepRows,
    /// The evaluation after the last step.
    pub test: Option<Evaluation>,
    /// When training started.
    pub start: Instant,
    /// Training seconds of the whole run (evaluations left out), once it has finished.
    pub trained: f64,
    /// Training seconds before this process started (a resumed job's earlier part).
    pub carried: f64,
}

impl Record {
    /// A new record whose step rows go to `step_rows` and evaluations to `evals`.
    pub fn new(step_rows: StepRows, evals: EvalLog) -> Self {
        Self {
            times: WorkerTimes::default(),
            recent: VecDeque::new(),
            epoch_accuracy: Vec::new(),
            evals,
            excluded_seconds: 0.0,
            step_seconds: Vec::new(),
            step_rows,
            test: None,
            start: Instant::now(),
            trained: 0.0,
            carried: 0.0,
        }
    }

    /// Training seconds so far (evaluations left out), the earlier part of a resumed job
    /// included.
    pub fn train_seconds(&self) -> f64 {
        self.carried + self.start.elapsed().as_secs_f64() - self.excluded_seconds
    }

    /// Nanoseconds since training started in this process: the clock of the tuner and the
    /// tensor completion times.
    pub fn clock_ns(&self) -> u64 {
        self.start.elapsed().as_nanos() as u64
    }

    /// What a checkpoint keeps of this record (its step rows and evaluations made durable
    /// first).
    pub fn carry(&mut self) -> Result<CarriedRecord, RunError> {
        Ok(CarriedRecord {
            times: self.times,
            recent: self.recent.clone(),
            epoch_accuracy: self.epoch_accuracy.clone(),
            evals: self.evals.rows.mark()?,
            rows: self.step_rows.mark()?,
            trained: self.train_seconds(),
        })
    }

    /// A record that goes on from `carried`, a resumed job's earlier part, whose step rows
    /// `step_rows` and evaluations `evals` go on from and whose steps took `step_seconds`.
    pub fn resumed(
        carried: CarriedRecord,
        step_rows: StepRows,
        step_seconds: Vec<f64>,
        evals: EvalLog,
    ) -> Self {
        Self {
            times: carried.times,
            recent: carried.recent,
            epoch_accuracy: carried.epoch_accuracy,
            step_seconds,
            carried: carried.trained,
            ..Self::new(step_rows, evals)
        }
    }
}

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

    /// The strategy's own state, from the communication thread (asked between steps, once
    /// every value of the step is in, so no strategy event can come first; relayed buffers
    /// can, and are kept).
    fn sync_state(&mut self) -> Result<Vec<Vec<f32>>, RunError> {
        self.comm.send(ToComm::SyncState)?;
        loop {
            match self.comm.recv()? {
                FromComm::SyncState(state) => return Ok(state),
                FromComm::Buffers(step, values) => self.relayed = Some((step, values)),
                FromComm::Event(event, _) => {
                    return Err(RunError::Local(format!(
                        "the strategy's {event:?} came while its state was read between steps"
                    )))
                }
                FromComm::Failed => unreachable!("recv turns failures into errors"),
            }
        }
    }

    /// Takes the next message of the communication thread: a strategy event goes to the
    /// engine and the sequencer, relayed buffers are kept for their evaluation point.
    fn receive(&mut self, seq: &mut StepSequencer) -> Result<(), RunError> {
        let (event, values) = match self.comm.recv()? {
            FromComm::Event(event, values) => (event, values),
            FromComm::Buffers(step, values) => {
                self.relayed = Some((step, values));
                return Ok(());
            }
            FromComm::SyncState(_) => {
                return Err(RunError::Local(
                    "the strategy's state came unasked for".into(),
                ))
            }
            FromComm::Failed => unreachable!("recv turns failures into errors"),
        };
        if let WorkerEvent::ParamsReady(key) | WorkerEvent::GradReady(key) = event {
            let now = self.record.clock_ns();
            self.tensors.completed(key, now);
        }
        match event {
            WorkerEvent::ParamsReady(key) => self.engine.set_param(key, values)?,
            WorkerEvent::GradReady(key) => {
                if let Some(g) = self.grads.get_mut(key) {
                    *g = values;
                }
            }
            WorkerEvent::StepDone => {}
        }
        seq.handle_event(event);
        Ok(())
    }

    /// Bytes this worker has sent on all its links so far (this process).
    fn sent_so_far(&self) -> u64 {
        self.comm
            .traffic
            .sent
            .load(std::sync::atomic::Ordering::Relaxed)
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

    /// Runs the whole backward pass (the engine calls back after each layer); the
    /// sequencer says what follows each layer: its hand-over, and first, where weights are
    /// averaged, its local optimizer step.
    fn backward(&mut self, seq: &mut StepSequencer, first: usize) -> Result<(), RunError> {
        let Self {
            engine,
            comm,
            tracer,
            layer_names,
            layer_keys,
            record,
            slowdown,
            step,
            grads,
            optimizer,
            tensors,
            ..
        } = self;
        let mut failure = None;
        let mut expected = first;
        let mut layer_start = Instant::now();
        let result = engine.backward(&mut |layer, layer_grads, engine| {
            let computed = layer_start.elapsed();
            if *slowdown > 1.0 {
                std::thread::sleep(computed.mul_f64(*slowdown - 1.0));
            }
            let now = Instant::now();
            record.times.compute += (now - layer_start).as_secs_f64();
            if let Some(t) = tracer.as_mut() {
                let name = format!("backward {}", layer_names[layer]);
                t.span(*step, "compute", &name, layer_start, now);
            }
            let mut after = AfterBackward {
                seq,
                comm,
                grads,
                optimizer,
                engine,
                record,
                tensors,
            };
            match after.run(layer, expected, &layer_keys[layer], layer_grads) {
                Ok(Some(next)) => expected = next,
                Ok(None) => {}
                Err(e) => {
                    let msg = e.to_string();
                    failure = Some(e);
                    return Err(syncopate_train::TrainError::Model(msg));
                }
            }
            layer_start = Instant::now();
            Ok(())
        });
        if let Some(e) = failure {
            return Err(e);
        }
        Ok(result?)
    }

    fn optimize(&mut self) -> Result<(), RunError> {
        let t = Instant::now();
        self.optimizer.apply(&mut *self.engine, &self.grads)?;
        let end = Instant::now();
        self.record.times.optimizer += (end - t).as_secs_f64();
        self.span("optimizer", "optimizer", t, end);
        Ok(())
    }

    fn step_end(&mut self, step: u64, steps: u64) -> Result<(), RunError> {
        let out = self
            .out
            .take()
            .ok_or_else(|| RunError::Local("a step ended without a loss".into()))?;
        let sent = self.sent_so_far();
        let r = &mut self.record;
        if r.recent.len() == 20 {
            r.recent.pop_front();
        }
        r.recent.push_back(f64::from(out.loss));
        let step_s = self.step_start.elapsed().as_secs_f64();
        r.step_seconds.push(step_s);
        let (now, before) = (r.times, self.times_at_step_start);
        let tensors = self.tensors.take_interval();
        let (last_end, start) = self.sent_at;
        let (sent_between, sent_in_step) =
            (start.saturating_sub(last_end), sent.saturating_sub(start));
        self.sent_at = (sent, sent);
        r.step_rows.push(&format!(
            "{},{:.4},{:.4},{:.5},{:.4},{:.4},{:.4},{:.4},{},{:.6},{:.6},{},{}\n",
            step + 1,
            r.train_seconds(),
            step_s,
            out.loss,
            now.data - before.data,
            now.compute - before.compute,
            now.wait - before.wait,
            now.optimizer - before.optimizer,
            tensors.count,
            tensors.p50_s,
            tensors.p99_s,
            sent_in_step,
            sent_between
        ))?;
        let rate = (step + 1 - self.first_step) as f64 * self.global_batch as f64
            / r.train_seconds().max(1e-9);
        self.observer.on_step(step + 1, steps, &out, rate);
        Ok(())
    }

    /// At an evaluation point: worker 0 sends its buffers; every other worker waits for
    /// them and installs them (left out of training time, as the evaluation is).
    fn sync_buffers(&mut self, seq: &mut StepSequencer, step: u64) -> Result<(), RunError> {
        let t = Instant::now();
        if self.rank == 0 {
            let values = self
                .engine
                .buffers()?
                .into_iter()
                .flat_map(|(_, v)| v)
                .collect();
            self.comm.send(ToComm::Buffers(step, values))?;
        } else {
            let values = loop {
                match self.relayed.take() {
                    Some((at, values)) if at == step => break values,
                    Some((at, _)) => {
                        return Err(RunError::Local(format!(
                            "worker 0's buffers of step {} arrived at step {}",
                            at + 1,
                            step + 1
                        )))
                    }
                    None => self.receive(seq)?,
                }
            };
            self.install_buffers(values)?;
        }
        self.record.excluded_seconds += t.elapsed().as_secs_f64();
        self.span("buffers", "relay buffers", t, Instant::now());
        Ok(())
    }

    /// Installs worker 0's buffers, in the order of [`LayerwiseEngine::buffers`].
    fn install_buffers(&mut self, values: Vec<f32>) -> Result<(), RunError> {
        let mut rest = values.as_slice();
        for (name, mine) in self.engine.buffers()? {
            if rest.len() < mine.len() {
                return Err(RunError::Local("worker 0's buffers are too few".into()));
            }
            let (theirs, tail) = rest.split_at(mine.len());
            self.engine.set_buffer(&name, theirs.to_vec())?;
            rest = tail;
        }
        if !rest.is_empty() {
            return Err(RunError::Local("worker 0's buffers are too many".into()));
        }
        Ok(())
    }

    /// At a checkpoint point: writes this worker's state after `step` (0-based), left out
    /// of training time.
    fn checkpoint(&mut self, step: u64) -> Result<(), RunError> {
        let t = Instant::now();
        let keeps_state = self
            .checkpoints
            .as_ref()
            .is_some_and(|c| c.keeps_sync_state);
        let sync_state = match keeps_state {
            true => self.sync_state()?,
            false => Vec::new(),
        };
        if let Some(c) = &self.checkpoints {
            let carried = self.record.carry()?;
            c.write(
                &*self.engine,
                &self.optimizer,
                sync_state,
                step + 1,
                &carried,
            )?;
            self.observer.on_checkpoint(step + 1);
        }
        self.record.excluded_seconds += t.elapsed().as_secs_f64();
        self.span("checkpoint", "checkpoint", t, Instant::now());
        Ok(())
    }

    /// At an evaluation point: writes this worker's weight snapshot (when asked) and
    /// evaluates the test set (where this worker has one), both left out of training time.
    fn evaluate(
        &mut self,
        step: u64,
        epoch_end: bool,
        last: bool,
        steps: u64,
    ) -> Result<(), RunError> {
        let trained = self.record.train_seconds();
        let t = Instant::now();
        if let Some((dir, rank)) = &self.snapshots {
            write_snapshot(&*self.engine, dir, step + 1, *rank)?;
        }
        let eval = match self.test {
            Some(test) => Some(evaluate(&mut *self.engine, test, 256)?),
            None => None,
        };
        self.record.excluded_seconds += t.elapsed().as_secs_f64();
        if let Some(eval) = eval {
            self.record_eval(step, epoch_end, last, steps, trained, eval)?;
        }
        Ok(())
    }

    /// Records the evaluation after step `step` (`trained` seconds of training so far).
    fn record_eval(
        &mut self,
        step: u64,
        epoch_end: bool,
        last: bool,
        steps: u64,
        trained: f64,
        eval: Evaluation,
    ) -> Result<(), RunError> {
        (self.record.evals).push(self.epoch + 1, step + 1, trained, &eval)?;
        if epoch_end {
            self.record.epoch_accuracy.push(eval.accuracy);
            self.observer.on_eval(self.epoch + 1, &eval);
        } else if last {
            self.observer.on_eval(self.epoch + 1, &eval);
        }
        if last {
            debug_assert_eq!(step + 1, steps);
            self.record.test = Some(eval);
        }
        Ok(())
    }
}

/// What runs after one layer's backward, inside the engine's callback.
struct AfterBackward<'s> {
    seq: &'s mut StepSequencer,
    comm: &'s mut Comm,
    grads: &'s mut [Vec<f32>],
    optimizer: &'s mut LocalOptimizer,
    engine: &'s mut dyn LayerwiseEngine,
    record: &'s mut Record,
    tensors: &'s mut TensorTimes,
}

impl AfterBackward<'_> {
    /// After layer `layer`'s backward: does what the sequencer asks until the engine's next
    /// layer (returned) or the end of the backward pass.
    fn run(
        &mut self,
        layer: usize,
        expected: usize,
        keys: &Range<usize>,
        layer_grads: &LayerGrads,
    ) -> Result<Option<usize>, RunError> {
        if layer != expected {
            return Err(RunError::Local(format!(
                "the engine computed layer {layer}'s backward where the step sequence expects layer {expected}"
            )));
        }
        self.seq.compute_done();
        let mut updated = false;
        loop {
            match self.seq.poll_action() {
                Action::OptimizeLayer(k) if k == layer => {
                    self.optimize_layer(keys, layer_grads)?;
                    updated = true;
                }
                // Weights after the layer's own optimizer step, or its gradients.
                Action::HandOver(k) if k == layer => {
                    let now = self.record.clock_ns();
                    keys.clone().for_each(|key| self.tensors.handed(key, now));
                    self.hand_over(keys, layer_grads, updated)?;
                }
                Action::Backward(next) => return Ok(Some(next)),
                Action::BackwardDone => {
                    // The step's layers are all updated: the next step's learning rate.
                    if self.seq.plan().optimizer == OptimizerPlace::BeforeSync {
                        self.optimizer.advance();
                    }
                    self.comm.send(ToComm::BackwardDone)?;
                    return Ok(None);
                }
                other => {
                    return Err(RunError::Local(format!(
                        "step sequence: {other:?} during layer {layer}'s backward"
                    )))
                }
            }
        }
    }

    /// Hands the layer's keys to the communication thread: its weights after the layer's
    /// own optimizer step (`updated`), or its gradients.
    fn hand_over(
        &mut self,
        keys: &Range<usize>,
        layer_grads: &LayerGrads,
        updated: bool,
    ) -> Result<(), RunError> {
        if updated {
            for key in keys.clone() {
                let weights = self.engine.param(key)?.to_vec();
                self.comm.send(ToComm::Gradient(key, weights))?;
            }
        } else {
            for (key, g) in layer_grads.iter() {
                debug_assert!(keys.contains(&key));
                self.comm.send(ToComm::Gradient(key, g.to_vec()))?;
            }
        }
        Ok(())
    }

    /// The optimizer on this layer's keys with their own gradients.
    fn optimize_layer(
        &mut self,
        keys: &Range<usize>,
        layer_grads: &LayerGrads,
    ) -> Result<(), RunError> {
        let t = Instant::now();
        for (key, g) in layer_grads.iter() {
            if let Some(slot) = self.grads.get_mut(key) {
                slot.clear();
                slot.extend_from_slice(g);
            }
        }
        self.optimizer
            .apply_keys(&mut *self.engine, keys.clone(), self.grads)?;
        self.record.times.optimizer += t.elapsed().as_secs_f64();
        Ok(())
    }
}
