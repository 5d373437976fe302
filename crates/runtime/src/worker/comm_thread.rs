//! The worker's communication thread: it drives the strategy's state machine over the
//! links ([`CommLoop`]) and trades commands and events with the training thread through
//! channels; [`Comm`] is the training side's handle on it.

use std::sync::mpsc::{channel, Receiver, RecvTimeoutError, Sender};
use std::sync::Arc;
use std::time::{Duration as StdDuration, Instant};

use mio::Waker;
use syncopate_core::buffers::{BufferRelay, BufferRoute};
use syncopate_core::liveness::{LivenessConfig, StallWatch};
use syncopate_core::registry::KeyInfo;
use syncopate_core::strategy::{Rank, WorkerEvent, WorkerSync};
use syncopate_core::tune::Knobs;
use syncopate_train::engine::FlatView;

use crate::comm::{CommError, CommLoop, Flow, HookExtras, Hooks, LinkCounters, LinkStatus};
use crate::error::RunError;
use crate::job::{JobLayout, ProcessContext};
use crate::losses::Losses;
use crate::process::join;
use crate::trace::{TraceRecorder, SEND};

/// A command from the training thread to the communication thread.
pub(super) enum ToComm {
    Begin(u64),
    Retune(Knobs),
    /// A key's gradient (or its weights after the layer's own optimizer step), shared with
    /// the engine rather than copied.
    Gradient(usize, FlatView),
    BackwardDone,
    /// Worker 0's buffers at the evaluation point after this step, to relay.
    Buffers(u64, Vec<f32>),
    /// The strategy's own state, for a checkpoint ([`WorkerSync::sync_state`]).
    SyncState,
    Finish,
}

/// What the communication thread tells the training thread.
pub(super) enum FromComm {
    /// A strategy event, with the values it made ready (empty for StepDone).
    Event(WorkerEvent, Vec<f32>),
    /// Worker 0's buffers at the evaluation point after this step, relayed here.
    Buffers(u64, Vec<f32>),
    /// The strategy's own state, as asked for with [`ToComm::SyncState`].
    SyncState(Vec<Vec<f32>>),
    Failed,
}

/// The communication loop's hooks on a worker: commands in, events and relayed buffers out.
struct WorkerHooks {
    rx: Receiver<ToComm>,
    tx: Sender<FromComm>,
    step: u64,
    layout: JobLayout,
    /// This worker's part in relaying worker 0's buffers, and the frames' timeline (send
    /// and receive threads) when a window is recorded.
    extras: HookExtras,
    /// Per key, its slices as `(offset, length)` (parameter-server strategies), for the
    /// timeline's enqueue instants.
    slices: Vec<Vec<(usize, usize)>>,
}

impl WorkerHooks {
    /// Marks on the timeline that `key`'s gradient (each of its slices) entered the queue.
    fn trace_enqueue(&mut self, key: usize) {
        let Some(t) = self.extras.tracer.as_mut().filter(|t| t.records(self.step)) else {
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

    /// Hands the training thread the endpoint's events and worker 0's buffers relayed here.
    fn drain(&mut self, ep: &mut dyn WorkerSync) {
        while let Some((step, values)) = self.extras.buffers.poll_delivered() {
            let _ = self.tx.send(FromComm::Buffers(step, values));
        }
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
                Ok(ToComm::Buffers(step, values)) => {
                    self.extras.buffers.handle_local(step, &values)
                }
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

    fn extras(&mut self) -> Option<&mut HookExtras> {
        Some(&mut self.extras)
    }
}

/// What the communication thread hands back.
pub(super) struct CommOutcome {
    /// The links' byte counters.
    pub(super) counters: Vec<LinkCounters>,
    /// The frames' timeline.
    pub(super) frames: Option<TraceRecorder>,
    /// What a loss-tolerant endpoint lost and filled in, and what the datagram path did.
    pub(super) losses: Losses,
}

type CommResult = Result<CommOutcome, CommError>;

/// The training side's handle on the communication thread.
pub(super) struct Comm {
    tx: Sender<ToComm>,
    rx: Receiver<FromComm>,
    waker: Arc<Waker>,
    thread: Option<std::thread::JoinHandle<CommResult>>,
    first_error: Option<String>,
    pub(super) traffic: Arc<crate::sampler::TrafficTotals>,
    /// The step last begun (for the stall error).
    step: u64,
    /// How long to wait for the next message before giving up on a stalled protocol.
    liveness: LivenessConfig,
}

impl Comm {
    /// Hands a command to the communication thread; if that thread has stopped, its own
    /// error (which names the peer and the step) is the one returned.
    pub(super) fn send(&mut self, msg: ToComm) -> Result<(), RunError> {
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
    pub(super) fn recv(&mut self) -> Result<FromComm, RunError> {
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

    /// Tells the communication thread to finish and takes what it hands back.
    pub(super) fn finish(mut self) -> Result<CommOutcome, RunError> {
        self.send(ToComm::Finish)?;
        match self.thread.take().map(|t| t.join()) {
            Some(Ok(Ok(c))) => Ok(c),
            Some(Ok(Err(e))) => Err(RunError::Comm(e)),
            _ => Err(RunError::Local("the communication thread panicked".into())),
        }
    }
}

/// Starts the communication thread over the links `joined` has set up, driving `endpoint`
/// and relaying `buffer_values` values of worker 0's buffers.
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
        extras: HookExtras {
            buffers: BufferRelay::new(
                BufferRoute::of(layout.strategy, layout.workers, layout.servers, ctx.rank),
                Some(buffer_values),
            ),
            tracer,
        },
        slices,
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
                frames: hooks.extras.tracer.take(),
                losses: Losses {
                    loss: endpoint.loss_stats(),
                    key_loss: endpoint.key_loss(),
                    datagrams: comm_loop.datagram_report(),
                },
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

/// Joins the job (with the model's `fingerprint`) and starts the communication thread
/// driving `endpoint` and relaying `buffer_values` values of worker 0's buffers.
pub(super) fn connect(
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
                losses: Losses::default(),
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
