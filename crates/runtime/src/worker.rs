//! A worker process: trains its shard on a compute thread while a communication thread
//! drives the strategy's state machine over the links.

use std::sync::mpsc::{channel, Receiver, RecvTimeoutError, Sender};
use std::sync::Arc;
use std::time::{Duration as StdDuration, Instant};

use mio::Waker;
use serde::Serialize;
use syncopate_core::registry::KeyInfo;
use syncopate_core::strategy::{Rank, WorkerEvent, WorkerSync};
use syncopate_train::checkpoint;
use syncopate_train::data::{Dataset, EpochSampler, Loader};
use syncopate_train::engine::LayerwiseEngine;
use syncopate_train::trainer::{
    evaluate, Duration, Evaluation, LocalOptimizer, Observer, OptimConfig,
};

use crate::comm::{CommError, CommLoop, Flow, Hooks, Link, LinkCounters, LinkStatus};
use crate::error::RunError;
use crate::job::{key_infos, JobLayout, ProcessContext};
use crate::process::join;
use crate::trace::{frame_label, TraceRecorder, RECEIVE, SEND};
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
    /// Test accuracy (a fraction) whose first evaluation at or above it sets the time to
    /// accuracy.
    pub target_accuracy: Option<f64>,
}

/// Time spent in each phase over the run, seconds.
#[derive(Debug, Clone, Copy, Default, Serialize)]
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

/// A worker's outcome.
#[derive(Debug, Clone, Serialize)]
pub struct WorkerSummary {
    /// This worker's rank.
    pub rank: Rank,
    /// Steps run.
    pub steps: u64,
    /// Wall time of the training loop (evaluations excluded), seconds.
    pub train_seconds: f64,
    /// Samples per second over all workers (N x batch x steps / time).
    pub samples_per_sec: f64,
    /// Mean training loss over the last (up to) 20 steps, on this worker's shard.
    pub final_loss: f64,
    /// Test evaluation at the end (rank 0 only).
    pub test: Option<Evaluation>,
    /// Test accuracy after each epoch (rank 0 only).
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
    pub step_seconds: Vec<f64>,
    /// Bytes per link.
    pub links: Vec<(Rank, u64, u64)>,
    /// What the emulated network did to this worker's frames (sent, and received at its
    /// ingress port), all links together.
    pub network: syncopate_core::net::NetCounters,
}

/// One evaluation of the test set during training.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct EvalPoint {
    /// Steps done.
    pub step: u64,
    /// Training seconds so far (evaluations excluded).
    pub seconds: f64,
    /// Test accuracy, a fraction.
    pub accuracy: f64,
    /// Test loss.
    pub loss: f64,
}

/// Rank 0's evaluations, as CSV rows and as points.
struct EvalLog {
    csv: String,
    points: Vec<EvalPoint>,
}

impl Default for EvalLog {
    fn default() -> Self {
        Self {
            csv: String::from("epoch,step,t_s,test_accuracy,test_loss\n"),
            points: Vec::new(),
        }
    }
}

impl EvalLog {
    fn push(&mut self, epoch: u64, step: u64, seconds: f64, eval: &Evaluation) {
        self.csv.push_str(&format!(
            "{epoch},{step},{seconds:.3},{:.5},{:.5}\n",
            eval.accuracy, eval.loss
        ));
        self.points.push(EvalPoint {
            step,
            seconds,
            accuracy: eval.accuracy,
            loss: eval.loss,
        });
    }
}

enum ToComm {
    Begin(u64),
    Gradient(usize, Vec<f32>),
    BackwardDone,
    Finish,
}

enum FromComm {
    Values(usize, Vec<f32>),
    StepDone,
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
            let msg = match ev {
                WorkerEvent::ParamsReady(k) | WorkerEvent::GradReady(k) => {
                    FromComm::Values(k, ep.take_values(k))
                }
                WorkerEvent::StepDone => FromComm::StepDone,
            };
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

    fn traces_frames(&self) -> bool {
        self.tracer.is_some()
    }

    fn on_frame_sent(&mut self, header: &Header, queued: Instant, written: Instant) {
        if let Some(t) = self.tracer.as_mut() {
            t.frame_sent(header, queued, written);
        }
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
            let name = format!("{} from {peer}", frame_label(header));
            t.span_on(RECEIVE, header.step, "receive", &name, arrived, handled);
        }
    }
}

/// What the communication thread hands back: the links' byte counters and the frames'
/// timeline.
type CommResult = Result<(Vec<LinkCounters>, Option<TraceRecorder>), CommError>;

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
    /// Longest wait for the next message before giving up on a stalled protocol.
    stall_timeout: Option<StdDuration>,
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
                    let waited = started.elapsed();
                    if self.stall_timeout.is_some_and(|limit| waited > limit) {
                        return Err(RunError::Local(format!(
                            "stalled at step {}: nothing of the step's synchronisation arrived \
                             for {:.0} s although every peer is alive; giving up \
                             (--stall-timeout)",
                            self.step,
                            waited.as_secs_f64()
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

    fn finish(mut self) -> Result<(Vec<LinkCounters>, Option<TraceRecorder>), RunError> {
        self.send(ToComm::Finish)?;
        match self.thread.take().map(|t| t.join()) {
            Some(Ok(Ok(c))) => Ok(c),
            Some(Ok(Err(e))) => Err(RunError::Comm(e)),
            _ => Err(RunError::Local("the communication thread panicked".into())),
        }
    }
}

fn start_comm(
    links: Vec<Link>,
    ctx: &ProcessContext,
    layout: &JobLayout,
    keys: &[KeyInfo],
    mut endpoint: Box<dyn WorkerSync + Send>,
) -> Result<Comm, RunError> {
    let (mut comm_loop, waker) = CommLoop::new(links, ctx.comm.clone(), layout.emulation(ctx.rank))
        .map_err(|e| RunError::Local(format!("setting up the links: {e}")))?;
    let traffic = comm_loop.traffic();
    let (to_tx, to_rx) = channel();
    let (from_tx, from_rx) = channel();
    let tracer = ctx
        .metrics
        .as_ref()
        .and_then(|m| m.trace_steps.clone())
        .map(|window| TraceRecorder::new(ctx.rank, window));
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
    };
    let thread = std::thread::Builder::new()
        .name("syncopate-comm".into())
        .spawn(move || {
            let r = comm_loop.run(endpoint.as_mut(), &mut hooks);
            if r.is_err() {
                let _ = from_tx.send(FromComm::Failed);
            }
            r.map(|()| (comm_loop.counters(), hooks.tracer.take()))
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
        stall_timeout: ctx.comm.stall_timeout,
    })
}

/// Parameter values still arriving from the last step (parameter-server strategies with
/// forward overlap): the next forward installs each layer's keys just before it runs.
struct PendingSync {
    /// Keys whose fresh values are installed.
    have: Vec<bool>,
    /// Whether the last step's StepDone has arrived.
    step_done: bool,
    /// Seconds spent blocked on it.
    waited: f64,
}

impl PendingSync {
    fn new(keys: usize) -> Self {
        Self {
            have: vec![true; keys],
            step_done: true,
            waited: 0.0,
        }
    }

    fn start(&mut self) {
        self.have.iter_mut().for_each(|h| *h = false);
        self.step_done = false;
    }

    /// Receives until every key in `keys` is installed (and, with `all`, until StepDone).
    fn wait_for(
        &mut self,
        comm: &mut Comm,
        engine: &mut dyn LayerwiseEngine,
        keys: std::ops::Range<usize>,
        all: bool,
    ) -> Result<(), RunError> {
        let t = Instant::now();
        while !self.have[keys.clone()].iter().all(|&h| h) || (all && !self.step_done) {
            match comm.recv()? {
                FromComm::Values(key, values) => {
                    engine.set_param(key, values)?;
                    if let Some(h) = self.have.get_mut(key) {
                        *h = true;
                    }
                }
                FromComm::StepDone => self.step_done = true,
                FromComm::Failed => unreachable!("recv turns failures into errors"),
            }
        }
        self.waited += t.elapsed().as_secs_f64();
        Ok(())
    }
}

/// Runs worker `ctx.rank`: joins the job, trains (or replays a compute profile), and
/// (rank 0) evaluates and saves.
///
/// Parameter-server strategies with overlap start the next step's forward as soon as the
/// first layer's parameters are back: layer `k` waits only for its own keys.
pub fn run_worker<E: LayerwiseEngine>(
    ctx: &ProcessContext,
    layout: &JobLayout,
    mut engine: E,
    data: Dataset,
    plan: &WorkerPlan,
    observer: &mut dyn Observer,
) -> Result<WorkerSummary, RunError> {
    let spec = engine.spec().clone();
    if let Some(path) = &plan.load {
        checkpoint::load(&mut engine, path)?;
    }
    let keys: Vec<KeyInfo> = key_infos(&spec);
    let layer_keys = spec.layer_keys();
    let can_evaluate = !spec.is_profile();
    let endpoint = layout.worker_endpoint(ctx.rank, keys.clone());
    let links = join(ctx, layout, spec.fingerprint())?;
    let mut comm = start_comm(links, ctx, layout, &keys, endpoint)?;
    let resources = ctx.start_sampler(comm.traffic.clone())?;

    let sampler = EpochSampler::new(
        data.train.len(),
        plan.batch_size,
        ctx.rank,
        layout.workers,
        plan.seed,
    )?;
    let per_epoch = sampler.steps_per_epoch() as u64;
    let total = match plan.duration {
        Duration::Epochs(e) => e * per_epoch,
        Duration::Steps(s) => s,
    };
    let sizes: Vec<usize> = keys.iter().map(|k| k.numel).collect();
    let mut optimizer = LocalOptimizer::new(plan.optim, &sizes);
    let mut grads: Vec<Vec<f32>> = sizes.iter().map(|&n| vec![0.0; n]).collect();
    let mut loader = Loader::spawn(Arc::new(data.train), sampler, 0, None, 4);
    let is_ps = layout.strategy.uses_servers();
    let forward_overlap = is_ps && layout.strategy.overlaps();
    let mut sync = PendingSync::new(keys.len());
    observer.on_start(total);
    let mut times = WorkerTimes::default();
    let mut recent = std::collections::VecDeque::new();
    let mut epoch_accuracy = Vec::new();
    let mut eval_seconds = 0.0;
    let start = Instant::now();
    let mut step_seconds = Vec::with_capacity(total as usize);
    let mut step_rows =
        String::from("step,t_end_s,step_s,loss,data_s,compute_s,wait_s,optimizer_s\n");
    let mut evals = EvalLog::default();
    let mut tracer = ctx
        .metrics
        .as_ref()
        .and_then(|m| m.trace_steps.clone())
        .map(|window| TraceRecorder::new(ctx.rank, window));
    let layer_names: Vec<String> = spec.layers.iter().map(|l| l.name.clone()).collect();
    let span = |tracer: &mut Option<TraceRecorder>, step, cat: &str, name: &str, a, b| {
        if let Some(t) = tracer.as_mut() {
            t.span(step, cat, name, a, b);
        }
    };
    for step in 0..total {
        let step_start = Instant::now();
        let (times_before, waited_before_step) = (times, sync.waited);
        let t = Instant::now();
        let (epoch, in_epoch, batch) = loader
            .next_batch()
            .ok_or_else(|| RunError::Local("the data loader stopped early".into()))?;
        times.data += t.elapsed().as_secs_f64();
        span(&mut tracer, step, "data", "load batch", t, Instant::now());
        // Ring neighbours may send this step's frames as soon as they are ahead, so the
        // step begins before the forward; with forward overlap it begins once the last
        // step's values are all back (they are needed layer by layer during the forward).
        if !forward_overlap {
            comm.send(ToComm::Begin(step))?;
        }
        let t = Instant::now();
        let waited_before = sync.waited;
        let mut comm_error = None;
        let mut layer_start = Instant::now();
        let out = engine.forward(&batch, &mut |layer, eng| {
            let entry = Instant::now();
            if layer > 0 {
                let name = format!("forward {}", layer_names[layer - 1]);
                span(&mut tracer, step, "compute", &name, layer_start, entry);
            }
            let keys = layer_keys.get(layer).cloned().unwrap_or(0..0);
            let waited = sync.wait_for(&mut comm, eng, keys, false);
            layer_start = Instant::now();
            if layer_start - entry > StdDuration::from_micros(50) {
                let name = format!("wait params {}", layer_names[layer]);
                span(&mut tracer, step, "wait", &name, entry, layer_start);
            }
            match waited {
                Ok(()) => Ok(()),
                Err(e) => {
                    let msg = e.to_string();
                    comm_error = Some(e);
                    Err(syncopate_train::TrainError::Model(msg))
                }
            }
        });
        if let Some(e) = comm_error {
            return Err(e);
        }
        let out = out?;
        if let Some(last) = layer_names.last() {
            let name = format!("forward {last} + loss");
            span(
                &mut tracer,
                step,
                "compute",
                &name,
                layer_start,
                Instant::now(),
            );
        }
        // Every key is in by now; the step's end follows its last key.
        if forward_overlap {
            let t = Instant::now();
            sync.wait_for(&mut comm, &mut engine, 0..0, true)?;
            span(
                &mut tracer,
                step,
                "wait",
                "wait step done",
                t,
                Instant::now(),
            );
            comm.send(ToComm::Begin(step))?;
        }
        let mut send_error = None;
        let mut layer_start = Instant::now();
        engine.backward(&mut |layer, layer_grads| {
            for (key, g) in layer_grads.iter() {
                if send_error.is_some() {
                    break;
                }
                if let Err(e) = comm.send(ToComm::Gradient(key, g.to_vec())) {
                    send_error = Some(e);
                }
            }
            let now = Instant::now();
            let name = format!("backward {}", layer_names[layer]);
            span(&mut tracer, step, "compute", &name, layer_start, now);
            layer_start = now;
            Ok(())
        })?;
        if let Some(e) = send_error {
            return Err(e);
        }
        comm.send(ToComm::BackwardDone)?;
        times.compute += t.elapsed().as_secs_f64() - (sync.waited - waited_before);
        if forward_overlap {
            sync.start();
        } else {
            let t = Instant::now();
            loop {
                match comm.recv()? {
                    FromComm::Values(key, values) if is_ps => engine.set_param(key, values)?,
                    FromComm::Values(key, values) => grads[key] = values,
                    FromComm::StepDone => break,
                    FromComm::Failed => unreachable!("recv turns failures into errors"),
                }
            }
            times.wait += t.elapsed().as_secs_f64();
            span(
                &mut tracer,
                step,
                "wait",
                "wait step done",
                t,
                Instant::now(),
            );
        }
        if !is_ps {
            let t = Instant::now();
            optimizer.apply(&mut engine, &grads)?;
            times.optimizer += t.elapsed().as_secs_f64();
            span(
                &mut tracer,
                step,
                "optimizer",
                "optimizer",
                t,
                Instant::now(),
            );
        }
        if recent.len() == 20 {
            recent.pop_front();
        }
        recent.push_back(f64::from(out.loss));
        step_seconds.push(step_start.elapsed().as_secs_f64());
        step_rows.push_str(&format!(
            "{},{:.4},{:.4},{:.5},{:.4},{:.4},{:.4},{:.4}\n",
            step + 1,
            start.elapsed().as_secs_f64() - eval_seconds,
            step_start.elapsed().as_secs_f64(),
            out.loss,
            times.data - times_before.data,
            times.compute - times_before.compute,
            times.wait - times_before.wait + (sync.waited - waited_before_step),
            times.optimizer - times_before.optimizer
        ));
        let elapsed = (start.elapsed().as_secs_f64() - eval_seconds).max(1e-9);
        let rate = (step + 1) as f64 * (plan.batch_size * layout.workers) as f64 / elapsed;
        observer.on_step(step + 1, total, &out, rate);
        let epoch_end = in_epoch as u64 + 1 == per_epoch;
        let periodic = plan.eval_every.is_some_and(|n| (step + 1) % n.max(1) == 0);
        if ctx.rank == 0 && can_evaluate && (epoch_end || periodic) {
            let all = 0..keys.len();
            sync.wait_for(&mut comm, &mut engine, all, true)?;
            let trained = start.elapsed().as_secs_f64() - eval_seconds;
            let t = Instant::now();
            let eval = evaluate(&mut engine, &data.test, 256)?;
            eval_seconds += t.elapsed().as_secs_f64();
            evals.push(epoch + 1, step + 1, trained, &eval);
            if epoch_end {
                epoch_accuracy.push(eval.accuracy);
                observer.on_eval(epoch + 1, &eval);
            }
        }
    }
    sync.wait_for(&mut comm, &mut engine, 0..keys.len(), true)?;
    times.wait += sync.waited;
    let train_seconds = start.elapsed().as_secs_f64() - eval_seconds;
    let test = if ctx.rank == 0 && can_evaluate {
        let eval = evaluate(&mut engine, &data.test, 256)?;
        if total % per_epoch != 0 {
            observer.on_eval(total.div_ceil(per_epoch), &eval);
        }
        if evals.points.last().is_none_or(|e| e.step != total) {
            evals.push(total.div_ceil(per_epoch), total, train_seconds, &eval);
        }
        Some(eval)
    } else {
        None
    };
    if ctx.rank == 0 {
        if let Some(path) = &plan.save {
            checkpoint::save(&engine, path)?;
        }
    }
    let reached = plan
        .target_accuracy
        .and_then(|target| evals.points.iter().find(|e| e.accuracy >= target));
    let (time_to_accuracy, steps_to_accuracy) =
        (reached.map(|e| e.seconds), reached.map(|e| e.step));
    let (counters, frame_trace) = comm.finish()?;
    if let (Some(t), Some(frames)) = (tracer.as_mut(), frame_trace) {
        t.absorb(frames);
    }
    crate::job::finish_sampler(resources)?;
    if let Some(m) = &ctx.metrics {
        let write = |name: String, text: &str| {
            std::fs::write(m.dir.join(&name), text)
                .map_err(|e| RunError::Local(format!("writing {name}: {e}")))
        };
        write(format!("steps-rank{}.csv", ctx.rank), &step_rows)?;
        if let Some(t) = &tracer {
            t.write(&m.dir, &format!("worker {}", ctx.rank))
                .map_err(|e| RunError::Local(format!("writing the trace: {e}")))?;
        }
        if ctx.rank == 0 && can_evaluate {
            write("evals-rank0.csv".into(), &evals.csv)?;
        }
    }
    Ok(WorkerSummary {
        rank: ctx.rank,
        steps: total,
        train_seconds,
        samples_per_sec: total as f64 * (plan.batch_size * layout.workers) as f64
            / train_seconds.max(1e-9),
        final_loss: recent.iter().sum::<f64>() / recent.len().max(1) as f64,
        test,
        epoch_accuracy,
        evaluations: evals.points,
        time_to_accuracy,
        steps_to_accuracy,
        times,
        step_seconds,
        links: counters
            .iter()
            .map(|c| (c.peer, c.sent, c.received))
            .collect(),
        network: counters.iter().fold(Default::default(), |mut sum, c| {
            sum.add(&c.net);
            sum.add(&c.ingress);
            sum
        }),
    })
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
            Ok((Vec::new(), None))
        });
        let mut comm = Comm {
            tx: to_tx,
            rx: from_rx,
            waker,
            thread: Some(thread),
            first_error: None,
            traffic: Arc::new(crate::sampler::TrafficTotals::default()),
            step: 0,
            stall_timeout: Some(StdDuration::from_millis(300)),
        };
        comm.send(ToComm::Begin(7)).unwrap();
        let err = match comm.recv() {
            Err(e) => e.to_string(),
            Ok(_) => panic!("a message arrived from a thread that sends none"),
        };
        assert!(err.contains("stalled at step 7"), "{err}");
    }
}
