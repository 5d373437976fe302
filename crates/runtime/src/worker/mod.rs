//! A worker process: trains its shard on a compute thread, in the order core's step
//! sequencer gives ([`step_loop`]), while a communication thread drives the strategy's state
//! machine over the links.

use std::sync::mpsc::{channel, Receiver, RecvTimeoutError, Sender};
use std::sync::Arc;
use std::time::{Duration as StdDuration, Instant};

use mio::Waker;
use serde::{Deserialize, Serialize};
use syncopate_core::buffers::{BufferRelay, BufferRoute};
use syncopate_core::json::{nan_if_null, nans_if_null};
use syncopate_core::latency::Percentiles;
use syncopate_core::liveness::{LivenessConfig, StallWatch};
use syncopate_core::registry::KeyInfo;
use syncopate_core::step::{CheckpointSchedule, EvalSchedule, StepPlan, StepSequencer};
use syncopate_core::strategy::{KeyLoss, LossStats, ProtocolError, Rank, WorkerEvent, WorkerSync};
use syncopate_core::tune::{Knobs, TuneReport};
use syncopate_train::checkpoint;
use syncopate_train::data::{Dataset, EpochSampler, Loader};
use syncopate_train::engine::LayerwiseEngine;
use syncopate_train::trainer::{Duration, Evaluation, LocalOptimizer, Observer, OptimConfig};

use crate::checkpoint::{CheckpointPlan, JobIdentity};
use crate::comm::{CommError, CommLoop, Flow, Hooks, LinkCounters, LinkStatus};
use crate::error::RunError;
use crate::job::{key_infos, JobLayout, ProcessContext};
use crate::process::join;
use crate::trace::{TraceRecorder, SEND};

mod checkpointing;
mod eval_log;
mod step_loop;
mod step_rows;
use checkpointing::CarriedRecord;
use checkpointing::Checkpointer;
use eval_log::EvalLog;
use step_loop::{Record, StepLoop};
use step_rows::Log;
use syncopate_core::wire::Header;

/// What a worker trains and how.
#[derive(Debug, Clone)]
pub struct WorkerPlan {
    /// Samples per step on this worker.
    pub batch_size: usize,
    /// How long.
    pub duration: Duration,
    /// Optimizer (applied locally by all-reduce workers, by the servers otherwise).
    pub optim: OptimConfig,
    /// Seed of initialisation and shuffling.
    pub seed: u64,
    /// Initial weights.
    pub load: Option<std::path::PathBuf>,
    /// Where rank 0 saves the final weights.
    pub save: Option<std::path::PathBuf>,
    /// Rank 0 also evaluates every this many steps (besides at the end of every epoch).
    pub eval_every: Option<u64>,
    /// Where every worker writes a snapshot of its weights at each evaluation point (see
    /// [`crate::replicas`]); `None`: no snapshots. Profile models write none.
    pub replica_dir: Option<std::path::PathBuf>,
    /// Test accuracy (a fraction) whose first evaluation at or above it sets the time to
    /// accuracy.
    pub target_accuracy: Option<f64>,
    /// Compute takes this many times as long as measured (a straggler, `--slow-worker`);
    /// 1 for a normal worker.
    pub slowdown: f64,
    /// Where and how often this worker writes checkpoints (`None`: never).
    pub checkpoint: Option<CheckpointPlan>,
    /// A checkpoint folder to resume from (its newest step every process completed).
    pub resume: Option<std::path::PathBuf>,
    /// The training settings that change the weights, which its checkpoints record and a
    /// resumed job must repeat (every process of the job is given the same).
    pub weight_settings: crate::checkpoint::WeightSettings,
}

/// Time spent in each phase over the run, seconds.
#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize)]
pub struct WorkerTimes {
    /// Waiting for the data loader.
    pub data: f64,
    /// Forward and backward (compute; communication overlaps it).
    pub compute: f64,
    /// Blocked on communication after backward.
    pub wait: f64,
    /// Local optimizer (all-reduce strategies).
    pub optimizer: f64,
}

/// A worker's outcome: what it writes as its summary (`summary.json`'s `worker0`, and the
/// member files beside it) and what a study reads back, this one type on both sides. Every
/// field is required when read; a figure that was NaN is written as `null` and reads back
/// as NaN.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct WorkerSummary {
    /// This worker's rank.
    pub rank: Rank,
    /// Steps run.
    pub steps: u64,
    /// Wall time of the training loop (evaluations excluded), seconds.
    #[serde(deserialize_with = "nan_if_null")]
    pub train_seconds: f64,
    /// Samples per second over all workers (N x batch x steps / time).
    #[serde(deserialize_with = "nan_if_null")]
    pub samples_per_sec: f64,
    /// Mean training loss over the last (up to) 20 steps, on this worker's shard.
    #[serde(deserialize_with = "nan_if_null")]
    pub final_loss: f64,
    /// Test evaluation at the end (rank 0 only).
    pub test: Option<Evaluation>,
    /// Test accuracy after each epoch (rank 0 only).
    #[serde(deserialize_with = "nans_if_null")]
    pub epoch_accuracy: Vec<f64>,
    /// Every evaluation (rank 0 only), in order.
    pub evaluations: Vec<EvalPoint>,
    /// Training seconds (evaluations excluded) until the first evaluation that reached the
    /// target accuracy; `None` without a target or when no evaluation reached it.
    pub time_to_accuracy: Option<f64>,
    /// Steps until then.
    pub steps_to_accuracy: Option<u64>,
    /// Per-phase times.
    pub times: WorkerTimes,
    /// Wall time of every step, seconds (evaluations excluded).
    #[serde(deserialize_with = "nans_if_null")]
    pub step_seconds: Vec<f64>,
    /// Bytes per link: (peer, sent, received).
    pub links: Vec<(Rank, u64, u64)>,
    /// Bytes this worker sent on all its links per step (measured: headers, heartbeats
    /// and all).
    #[serde(deserialize_with = "nan_if_null")]
    pub bytes_per_step: f64,
    /// Bytes this worker received on all its links per step (measured).
    #[serde(deserialize_with = "nan_if_null")]
    pub received_bytes_per_step: f64,
    /// The textbook bytes per step per worker of the strategy for this model
    /// ([`syncopate_core::strategy::textbook_bytes_per_step`]).
    #[serde(deserialize_with = "nan_if_null")]
    pub textbook_bytes_per_step: f64,
    /// What the emulated network did to this worker's frames (sent, and received at its
    /// ingress port), all links together.
    pub network: syncopate_core::net::NetCounters,
    /// Per-tensor completion times of the run: from a key's hand-over to its synchronised
    /// values back ([`syncopate_core::latency`]).
    pub tensor_completion: Percentiles,
    /// What the tuner measured and chose (`--autotune`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub autotune: Option<TuneReport>,
    /// What a loss-tolerant worker (dlcp-allreduce) lost and filled in.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub loss: Option<LossStats>,
    /// Per key, the values it received and filled in (loss-tolerant workers).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub key_loss: Vec<KeyLoss>,
    /// What its datagrams did (`--transport udp`): sent, received, dropped by reason, and
    /// each link's rate controller.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub datagrams: Option<crate::comm::DatagramReport>,
}

/// One evaluation of the test set during training.
#[derive(Debug, Clone, Copy, Serialize, Deserialize)]
pub struct EvalPoint {
    /// Steps done.
    pub step: u64,
    /// Training seconds so far (evaluations excluded).
    #[serde(deserialize_with = "nan_if_null")]
    pub seconds: f64,
    /// Test accuracy, a fraction.
    #[serde(deserialize_with = "nan_if_null")]
    pub accuracy: f64,
    /// Test loss.
    #[serde(deserialize_with = "nan_if_null")]
    pub loss: f64,
    /// Test accuracy of the exact average of every worker's weights at this step; filled in
    /// by `launch` after the job from the replica snapshots (`None`: not computed).
    pub average_accuracy: Option<f64>,
    /// Test loss of that average.
    pub average_loss: Option<f64>,
    /// Mean over workers of ||x_i − x̄||² / ||x̄||² at this step (see
    /// [`crate::replicas`]).
    pub divergence: Option<f64>,
}

enum ToComm {
    Begin(u64),
    Retune(Knobs),
    Gradient(usize, Vec<f32>),
    BackwardDone,
    /// Worker 0's buffers at the evaluation point after this step, to relay.
    Buffers(u64, Vec<f32>),
    /// The strategy's own state, for a checkpoint ([`WorkerSync::sync_state`]).
    SyncState,
    Finish,
}

enum FromComm {
    /// A strategy event, with the values it made ready (empty for StepDone).
    Event(WorkerEvent, Vec<f32>),
    /// Worker 0's buffers at the evaluation point after this step, relayed here.
    Buffers(u64, Vec<f32>),
    /// The strategy's own state, as asked for with [`ToComm::SyncState`].
    SyncState(Vec<Vec<f32>>),
    Failed,
}

struct WorkerHooks {
    rx: Receiver<ToComm>,
    tx: Sender<FromComm>,
    step: u64,
    layout: JobLayout,
    /// The frames' timeline (send and receive threads), when a window is recorded.
    tracer: Option<TraceRecorder>,
    /// Per key, its slices as `(offset, length)` (parameter-server strategies), for the
    /// timeline's enqueue instants.
    slices: Vec<Vec<(usize, usize)>>,
    /// This worker's part in relaying worker 0's buffers.
    buffers: BufferRelay,
}

impl WorkerHooks {
    /// Marks on the timeline that `key`'s gradient (each of its slices) entered the queue.
    fn trace_enqueue(&mut self, key: usize) {
        let Some(t) = self.tracer.as_mut().filter(|t| t.records(self.step)) else {
            return;
        };
        let now = Instant::now();
        match self.slices.get(key) {
            Some(slices) if !slices.is_empty() => {
                for (offset, len) in slices {
                    let name = format!("enqueue k{key} @{offset}+{len}");
                    t.instant(SEND, self.step, "enqueue", &name, now);
                }
            }
            _ => t.instant(SEND, self.step, "enqueue", &format!("enqueue k{key}"), now),
        }
    }

    fn drain(&mut self, ep: &mut dyn WorkerSync) {
        while let Some(ev) = ep.poll_event() {
            let values = match ev {
                WorkerEvent::ParamsReady(k) | WorkerEvent::GradReady(k) => ep.take_values(k),
                WorkerEvent::StepDone => Vec::new(),
            };
            let msg = FromComm::Event(ev, values);
            let _ = self.tx.send(msg);
        }
    }
}

impl Hooks<dyn WorkerSync + Send> for WorkerHooks {
    fn on_commands(
        &mut self,
        ep: &mut (dyn WorkerSync + Send + 'static),
    ) -> Result<Flow, CommError> {
        loop {
            match self.rx.try_recv() {
                Ok(ToComm::Begin(step)) => {
                    self.step = step;
                    ep.begin_step(step);
                }
                Ok(ToComm::Gradient(key, g)) => {
                    self.trace_enqueue(key);
                    ep.handle_gradient(key, &g);
                }
                Ok(ToComm::BackwardDone) => ep.handle_backward_done(),
                Ok(ToComm::Retune(knobs)) => ep.retune(knobs),
                Ok(ToComm::Buffers(step, values)) => self.buffers.handle_local(step, &values),
                Ok(ToComm::SyncState) => {
                    let _ = self.tx.send(FromComm::SyncState(ep.sync_state()));
                }
                Ok(ToComm::Finish) => return Ok(Flow::Finish),
                Err(std::sync::mpsc::TryRecvError::Empty) => break,
                Err(std::sync::mpsc::TryRecvError::Disconnected) => {
                    return Err(CommError::Local("the training thread stopped".into()))
                }
            }
        }
        self.drain(ep);
        Ok(Flow::Continue)
    }

    fn on_progress(
        &mut self,
        ep: &mut (dyn WorkerSync + Send + 'static),
        _: LinkStatus,
    ) -> Result<Flow, CommError> {
        self.drain(ep);
        Ok(Flow::Continue)
    }

    fn step(&self) -> u64 {
        self.step
    }

    fn describe(&self, rank: Rank) -> String {
        self.layout.describe(rank)
    }

    fn on_buffers(
        &mut self,
        peer: Rank,
        header: &Header,
        payload: &[u8],
    ) -> Result<(), ProtocolError> {
        self.buffers.handle_frame(peer, header, payload)?;
        while let Some((step, values)) = self.buffers.poll_delivered() {
            let _ = self.tx.send(FromComm::Buffers(step, values));
        }
        Ok(())
    }

    fn buffer_relay(&mut self) -> Option<&mut BufferRelay> {
        Some(&mut self.buffers)
    }

    fn tracer(&self) -> Option<&TraceRecorder> {
        self.tracer.as_ref()
    }

    fn tracer_mut(&mut self) -> Option<&mut TraceRecorder> {
        self.tracer.as_mut()
    }

    fn on_frame_received(
        &mut self,
        _: &(dyn WorkerSync + Send + 'static),
        peer: Rank,
        header: &Header,
        arrived: Instant,
        _read: Instant,
        handled: Instant,
    ) {
        if let Some(t) = self.tracer.as_mut() {
            t.frame_received(peer, header, arrived, handled);
        }
    }
}

/// What the communication thread hands back.
struct CommOutcome {
    /// The links' byte counters.
    counters: Vec<LinkCounters>,
    /// The frames' timeline.
    frames: Option<TraceRecorder>,
    /// What a loss-tolerant endpoint lost and filled in, overall and per key.
    loss: Option<LossStats>,
    key_loss: Vec<KeyLoss>,
    /// What the datagram path did (`--transport udp`).
    datagrams: Option<crate::comm::DatagramReport>,
}

type CommResult = Result<CommOutcome, CommError>;

/// The training side's handle on the communication thread.
struct Comm {
    tx: Sender<ToComm>,
    rx: Receiver<FromComm>,
    waker: Arc<Waker>,
    thread: Option<std::thread::JoinHandle<CommResult>>,
    first_error: Option<String>,
    traffic: Arc<crate::sampler::TrafficTotals>,
    /// The step last begun (for the stall error).
    step: u64,
    /// How long to wait for the next message before giving up on a stalled protocol.
    liveness: LivenessConfig,
}

impl Comm {
    /// Hands a command to the communication thread; if that thread has stopped, its own
    /// error (which names the peer and the step) is the one returned.
    fn send(&mut self, msg: ToComm) -> Result<(), RunError> {
        if let ToComm::Begin(step) = msg {
            self.step = step;
        }
        if self.tx.send(msg).is_err() || self.waker.wake().is_err() {
            return Err(self.failure());
        }
        Ok(())
    }

    /// Waits for the next message; a failure of the communication thread becomes its error,
    /// and so does a wait longer than the stall timeout (the peers' liveness is the
    /// communication thread's business: it fails when one dies or goes silent).
    fn recv(&mut self) -> Result<FromComm, RunError> {
        let started = Instant::now();
        let watch = StallWatch::new(&self.liveness, 0);
        loop {
            match self.rx.recv_timeout(StdDuration::from_millis(200)) {
                Ok(FromComm::Failed) | Err(RecvTimeoutError::Disconnected) => {
                    return Err(self.failure());
                }
                Ok(msg) => return Ok(msg),
                Err(RecvTimeoutError::Timeout) => {
                    if self.thread.as_ref().is_some_and(|t| t.is_finished()) {
                        return Err(self.failure());
                    }
                    let waited = u64::try_from(started.elapsed().as_nanos()).unwrap_or(u64::MAX);
                    if let Some(stall) = watch.poll_stalled(waited) {
                        return Err(RunError::Local(format!(
                            "at step {}: {stall}; giving up (--stall-timeout)",
                            self.step,
                        )));
                    }
                }
            }
        }
    }

    /// The communication thread's error; later calls repeat its message.
    fn failure(&mut self) -> RunError {
        let err = match self.thread.take().map(|t| t.join()) {
            Some(Ok(Err(e))) => RunError::Comm(e),
            Some(Ok(Ok(_))) => RunError::Local("the communication thread ended early".into()),
            Some(Err(_)) => RunError::Local("the communication thread panicked".into()),
            None => {
                return RunError::Local(
                    self.first_error
                        .clone()
                        .unwrap_or_else(|| "the communication thread is gone".into()),
                )
            }
        };
        self.first_error = Some(err.to_string());
        err
    }

    fn finish(mut self) -> Result<CommOutcome, RunError> {
        self.send(ToComm::Finish)?;
        match self.thread.take().map(|t| t.join()) {
            Some(Ok(Ok(c))) => Ok(c),
            Some(Ok(Err(e))) => Err(RunError::Comm(e)),
            _ => Err(RunError::Local("the communication thread panicked".into())),
        }
    }
}

fn start_comm(
    joined: crate::process::Joined,
    ctx: &ProcessContext,
    layout: &JobLayout,
    keys: &[KeyInfo],
    mut endpoint: Box<dyn WorkerSync + Send>,
    buffer_values: usize,
) -> Result<Comm, RunError> {
    let (links, sockets) = (joined.links, joined.datagram_sockets);
    let emulation = layout.emulation(ctx.rank);
    let (mut comm_loop, waker) = CommLoop::new(links, ctx.comm.clone(), emulation, sockets)
        .map_err(|e| RunError::Local(format!("setting up the links: {e}")))?;
    let traffic = comm_loop.traffic();
    let (to_tx, to_rx) = channel();
    let (from_tx, from_rx) = channel();
    let tracer = ctx.tracer();
    let mut slices = vec![Vec::new(); keys.len()];
    if tracer.is_some() && layout.strategy.uses_servers() {
        let registry = layout.registry(keys.to_vec());
        for s in registry.slices() {
            if let Some(of_key) = slices.get_mut(s.key) {
                of_key.push((s.offset, s.len));
            }
        }
    }
    let mut hooks = WorkerHooks {
        rx: to_rx,
        tx: from_tx.clone(),
        step: 0,
        layout: layout.clone(),
        tracer,
        slices,
        buffers: BufferRelay::new(
            BufferRoute::of(layout.strategy, layout.workers, layout.servers, ctx.rank),
            Some(buffer_values),
        ),
    };
    let thread = std::thread::Builder::new()
        .name("syncopate-comm".into())
        .spawn(move || {
            let r = comm_loop.run(endpoint.as_mut(), &mut hooks);
            if r.is_err() {
                let _ = from_tx.send(FromComm::Failed);
            }
            r.map(|()| CommOutcome {
                counters: comm_loop.counters(),
                frames: hooks.tracer.take(),
                loss: endpoint.loss_stats(),
                key_loss: endpoint.key_loss(),
                datagrams: comm_loop.datagram_report(),
            })
        })
        .map_err(|e| RunError::Local(format!("starting the communication thread: {e}")))?;
    Ok(Comm {
        tx: to_tx,
        rx: from_rx,
        waker,
        thread: Some(thread),
        first_error: None,
        traffic,
        step: 0,
        liveness: ctx.comm.liveness,
    })
}

/// Runs worker `ctx.rank`: joins the job, trains (or replays a compute profile) as core's
/// step sequencer directs, and (rank 0) evaluates and saves.
pub fn run_worker<E: LayerwiseEngine>(
    ctx: &ProcessContext,
    layout: &JobLayout,
    mut engine: E,
    data: Dataset,
    plan: &WorkerPlan,
    observer: &mut dyn Observer,
) -> Result<WorkerSummary, RunError> {
    let spec = engine.spec().clone();
    let keys: Vec<KeyInfo> = key_infos(&spec);
    let sizes: Vec<usize> = keys.iter().map(|k| k.numel).collect();
    let mut endpoint = layout.worker_endpoint(ctx.rank, keys.clone());
    let state_sizes: Vec<usize> = endpoint.sync_state().iter().map(Vec::len).collect();
    let start = starting_state(ctx, layout, plan, &mut engine, &sizes, &state_sizes)?;
    start_endpoint(endpoint.as_mut(), &engine, &start)?;
    let evaluates = ctx.rank == 0 && !spec.is_profile();
    let snapshots = plan.replica_dir.clone().filter(|_| !spec.is_profile());
    let buffer_values = engine.buffers()?.iter().map(|(_, v)| v.len()).sum();
    let fingerprint = spec.fingerprint();
    let mut comm = connect(ctx, layout, &keys, endpoint, buffer_values, fingerprint)?;
    let resources = ctx.start_sampler(comm.traffic.clone())?;

    let sampler = EpochSampler::new(
        data.train.len(),
        plan.batch_size,
        ctx.rank,
        layout.workers,
        plan.seed,
    )?;
    let steps_per_epoch = sampler.steps_per_epoch() as u64;
    let evaluated = evaluates || snapshots.is_some();
    let mut seq = StepSequencer::new(
        step_plan(plan, layout, &spec, &keys, steps_per_epoch, evaluated)
            .with_buffer_sync(buffer_values > 0 && layout.workers > 1)
            .resumed_at(start.first_step),
    );
    let mut run = StepLoop::new(
        &mut engine,
        &mut comm,
        Loader::spawn(Arc::new(data.train), sampler, start.first_step, None, 4),
        start.optimizer,
        evaluates.then_some(&data.test),
        observer,
        ctx.tracer(),
        &sizes,
    );
    run.slowdown = plan.slowdown;
    run.rank = ctx.rank;
    run.snapshots = snapshots.map(|dir| (dir, ctx.rank));
    run.record = starting_record(ctx, plan, start.carried, evaluates)?;
    run.checkpoints = plan.checkpoint.clone().map(|plan| Checkpointer {
        plan,
        job: start.job,
        rank: ctx.rank,
        keeps_sync_state: !state_sizes.is_empty(),
    });
    run.global_batch = plan.batch_size * layout.workers;
    run.run(&mut seq)?;
    let tensor_completion = run.tensors.run().summary();
    let (mut record, tracer) = (run.record, run.tracer);
    if ctx.rank == 0 {
        if let Some(path) = &plan.save {
            checkpoint::save(&engine, path)?;
        }
    }
    let mut outcome = comm.finish()?;
    crate::sampler::finish_sampler(resources)?;
    write_outputs(ctx, tracer, outcome.frames.take(), &mut record, evaluates)?;
    let model_bytes = (spec.num_params() * 4) as f64;
    let mut summary = summarise(ctx.rank, plan, layout, model_bytes, record, outcome, &seq);
    summary.tensor_completion = tensor_completion;
    Ok(summary)
}

/// The record a worker starts with: a new one, or a resumed job's (`carried`) going on;
/// either way with its step rows' file open (see [`step_rows`]).
fn starting_record(
    ctx: &ProcessContext,
    plan: &WorkerPlan,
    carried: Option<CarriedRecord>,
    evaluates: bool,
) -> Result<Record, RunError> {
    let checkpoints = plan.checkpoint.as_ref().map(|c| c.dir.as_path());
    let metrics = ctx.metrics.as_ref().map(|m| m.dir.as_path());
    let resume_dir = plan.resume.as_deref();
    let resumed_rows = resume_dir.zip(carried.as_ref().and_then(|c| c.rows.as_ref()));
    let (rows, earlier) =
        step_rows::open(Log::Steps, ctx.rank, checkpoints, metrics, resumed_rows)?;
    let evals = if evaluates {
        let resumed_evals = resume_dir.zip(carried.as_ref().and_then(|c| c.evals.as_ref()));
        let (file, earlier_evals) =
            step_rows::open(Log::Evals, ctx.rank, checkpoints, metrics, resumed_evals)?;
        EvalLog::resumed(file, &earlier_evals)?
    } else {
        EvalLog::default()
    };
    Ok(match carried {
        Some(carried) => Record::resumed(carried, rows, step_rows::step_seconds(&earlier), evals),
        None => Record::new(rows, evals),
    })
}

/// Where a worker starts: its optimizer, the steps already done and what was measured
/// during them (a resumed job's), and the job's identity in its checkpoints.
struct StartingState {
    optimizer: LocalOptimizer,
    first_step: u64,
    carried: Option<CarriedRecord>,
    job: JobIdentity,
    /// The strategy's own state in the checkpoint resumed from (`None`: not resumed).
    sync_state: Option<Vec<Vec<f32>>>,
}

/// Readies `endpoint` for the first step of this run: its own state restored from the
/// checkpoint resumed from, or else the model's initial weights handed over.
fn start_endpoint(
    endpoint: &mut dyn WorkerSync,
    engine: &dyn LayerwiseEngine,
    start: &StartingState,
) -> Result<(), RunError> {
    endpoint.start_at(start.first_step);
    if let Some(state) = &start.sync_state {
        return endpoint
            .restore_sync_state(state.clone())
            .map_err(|e| RunError::Local(format!("resuming the strategy's state: {e}")));
    }
    for key in 0..engine.spec().keys().len() {
        let values = engine.param(key)?;
        endpoint.handle_initial_weights(key, &values);
    }
    Ok(())
}

/// Loads the initial weights into `engine` (`plan.load`) and resumes from the newest
/// complete checkpoint (`plan.resume`), if asked; `sizes` are the model's key sizes,
/// `state_sizes` those of the strategy's own state.
fn starting_state<E: LayerwiseEngine>(
    ctx: &ProcessContext,
    layout: &JobLayout,
    plan: &WorkerPlan,
    engine: &mut E,
    sizes: &[usize],
    state_sizes: &[usize],
) -> Result<StartingState, RunError> {
    if let Some(path) = &plan.load {
        checkpoint::load(engine, path)?;
    }
    let mut optimizer = LocalOptimizer::new(plan.optim, sizes);
    let mut job = layout.identity(&ctx.token, engine.spec(), &plan.weight_settings);
    if let Some(checkpoints) = &plan.checkpoint {
        job = checkpoints.fresh_identity(job);
    }
    let into = checkpointing::ResumeInto {
        engine,
        optimizer: &mut optimizer,
        state_sizes,
    };
    let (first_step, carried, sync_state) = match &plan.resume {
        Some(dir) => {
            let resumed = checkpointing::resume(dir, &job, ctx.rank, into)?;
            job = job.with_run(&resumed.run);
            (resumed.steps, resumed.carried, Some(resumed.sync_state))
        }
        None => (0, None, None),
    };
    Ok(StartingState {
        optimizer,
        first_step,
        carried,
        job,
        sync_state,
    })
}

/// Joins the job (with the model's `fingerprint`) and starts the communication thread
/// driving `endpoint` and relaying `buffer_values` values of worker 0's buffers.
fn connect(
    ctx: &ProcessContext,
    layout: &JobLayout,
    keys: &[KeyInfo],
    endpoint: Box<dyn WorkerSync + Send>,
    buffer_values: usize,
    fingerprint: u64,
) -> Result<Comm, RunError> {
    let links = join(ctx, layout, fingerprint)?;
    start_comm(links, ctx, layout, keys, endpoint, buffer_values)
}

/// The step sequencer's plan of a worker training `spec` (whose keys are `keys`) for
/// `plan.duration`, with `steps_per_epoch`, evaluating if `evaluates`.
fn step_plan(
    plan: &WorkerPlan,
    layout: &JobLayout,
    spec: &syncopate_train::model::ModelSpec,
    keys: &[KeyInfo],
    steps_per_epoch: u64,
    evaluates: bool,
) -> StepPlan {
    let total = match plan.duration {
        Duration::Epochs(e) => e * steps_per_epoch,
        Duration::Steps(s) => s,
    };
    let eval = EvalSchedule {
        enabled: evaluates,
        steps_per_epoch,
        every: plan.eval_every,
    };
    let checkpoints = CheckpointSchedule {
        every: plan.checkpoint.as_ref().map(|c| c.every),
    };
    StepPlan::new(layout.strategy, total, spec.layer_keys())
        .with_eval(eval)
        .with_checkpoints(checkpoints)
        .with_tuning(layout.tune_spec(keys))
}

/// Writes the run directory's per-worker files: steps, timeline, evaluations.
fn write_outputs(
    ctx: &ProcessContext,
    mut tracer: Option<TraceRecorder>,
    frame_trace: Option<TraceRecorder>,
    record: &mut Record,
    evaluates: bool,
) -> Result<(), RunError> {
    if let (Some(t), Some(frames)) = (tracer.as_mut(), frame_trace) {
        t.absorb(frames);
    }
    let Some(m) = &ctx.metrics else {
        record.evals.rows.finish(None)?;
        return record.step_rows.finish(None);
    };
    let steps_csv = step_rows::steps_csv_in(&m.dir, ctx.rank);
    record.step_rows.finish(Some(&steps_csv))?;
    if let Some(t) = &tracer {
        t.write(&m.dir, &format!("worker {}", ctx.rank))
            .map_err(|e| RunError::Local(format!("writing the trace: {e}")))?;
    }
    if evaluates {
        (record.evals.rows).finish(Some(&Log::Evals.in_metrics(&m.dir, ctx.rank)))?;
    }
    Ok(())
}

/// The worker's summary from what its loop recorded, what its communication thread handed
/// back and what its sequencer ran, for a model of `model_bytes`.
fn summarise(
    rank: Rank,
    plan: &WorkerPlan,
    layout: &JobLayout,
    model_bytes: f64,
    record: Record,
    outcome: CommOutcome,
    seq: &StepSequencer,
) -> WorkerSummary {
    let workers = layout.workers;
    let counters = &outcome.counters;
    let total = seq.plan().steps;
    let steps_run = total - seq.plan().first_step;
    // The links' counters cover this process's steps; the record, the whole job's.
    let per_step = |bytes: u64| bytes as f64 / steps_run.max(1) as f64;
    let train_seconds = record.trained;
    let reached = plan
        .target_accuracy
        .and_then(|target| record.evals.points.iter().find(|e| e.accuracy >= target));
    let (time_to_accuracy, steps_to_accuracy) =
        (reached.map(|e| e.seconds), reached.map(|e| e.step));
    WorkerSummary {
        rank,
        steps: total,
        train_seconds,
        samples_per_sec: total as f64 * (plan.batch_size * workers) as f64
            / train_seconds.max(1e-9),
        final_loss: record.recent.iter().sum::<f64>() / record.recent.len().max(1) as f64,
        test: record.test,
        epoch_accuracy: record.epoch_accuracy,
        evaluations: record.evals.points,
        time_to_accuracy,
        steps_to_accuracy,
        times: record.times,
        step_seconds: record.step_seconds,
        links: counters
            .iter()
            .map(|c| (c.peer, c.sent, c.received))
            .collect(),
        bytes_per_step: per_step(counters.iter().map(|c| c.sent).sum()),
        received_bytes_per_step: per_step(counters.iter().map(|c| c.received).sum()),
        textbook_bytes_per_step: layout.sync.textbook_bytes_per_step(model_bytes),
        network: counters.iter().fold(Default::default(), |mut sum, c| {
            sum.add(&c.net);
            sum.add(&c.ingress);
            sum
        }),
        autotune: seq.tuner().map(|t| t.report()),
        tensor_completion: Percentiles::default(),
        loss: outcome.loss,
        key_loss: outcome.key_loss,
        datagrams: outcome.datagrams,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A communication thread that stays alive but never delivers (a protocol stall between
    /// live peers) makes the training side give up with an error naming the step.
    #[test]
    fn a_stalled_protocol_ends_in_an_error_not_a_hang() {
        let poll = mio::Poll::new().unwrap();
        let waker = Arc::new(Waker::new(poll.registry(), mio::Token(0)).unwrap());
        let (to_tx, to_rx) = channel::<ToComm>();
        let (_from_tx, from_rx) = channel::<FromComm>();
        let thread = std::thread::spawn(move || {
            // Alive until the training side lets go of its sender.
            while to_rx.recv().is_ok() {}
            Ok(CommOutcome {
                counters: Vec::new(),
                frames: None,
                loss: None,
                key_loss: Vec::new(),
                datagrams: None,
            })
        });
        let mut comm = Comm {
            tx: to_tx,
            rx: from_rx,
            waker,
            thread: Some(thread),
            first_error: None,
            traffic: Arc::new(crate::sampler::TrafficTotals::default()),
            step: 0,
            liveness: LivenessConfig {
                stall_timeout_ns: Some(300_000_000),
                ..LivenessConfig::default()
            },
        };
        comm.send(ToComm::Begin(7)).unwrap();
        let err = match comm.recv() {
            Err(e) => e.to_string(),
            Ok(_) => panic!("a message arrived from a thread that sends none"),
        };
        assert!(err.contains("at step 7: stalled"), "{err}");
    }
}

#[cfg(test)]
#[path = "summary_tests.rs"]
mod summary_tests;
