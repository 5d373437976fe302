//! Syncopate's ring all-reduce for a training loop that is not ours (a PyTorch DDP
//! communication hook, a model averager): a job of workers joined with the runtime's
//! rendezvous, authentication and liveness, and a communication thread that all-reduces
//! (averages) flat buffers in the order every rank asks for them.
//!
//! The communication thread runs one loop over the job's links for the ring's whole life:
//! heartbeats keep the links alive while the caller is away (a rank outside any collective
//! for minutes is not lost), and every operation starts the moment it is asked for, beside
//! the ones still in flight. Each operation is one step of a ring all-reduce endpoint of
//! its buffer's length (endpoints are kept for reuse, so buffers of any size may follow each
//! other: DDP's buckets change after its first iteration); its frames carry the operation's
//! number as their step, which routes them to it, and frames of an operation this rank has
//! not been asked for yet wait until it is. Every rank gets the same bits (core's ring adds
//! in ring order). The values are read from and written back to the caller's memory
//! ([`Operation`]) on the communication thread.
//!
//! Failure: a peer that dies, stays silent past the peer timeout or aborts fails the
//! operations with an error naming it, the peers are told (an Abort frame carrying the
//! error), and every later operation fails with the same error. An operation that does not
//! complete within the collective timeout fails too, naming the neighbour that did not enter
//! it when that is the cause; a peer that closes its ring while an operation needs it is
//! named as having left. A panic of the communication thread fails every pending and queued
//! operation with the panic's message.

use std::any::Any;
use std::collections::{BTreeMap, HashMap};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::mpsc::{channel, Receiver, Sender, TryRecvError};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use mio::Waker;
use syncopate_core::net::NetworkProfile;
use syncopate_core::registry::KeyInfo;
use syncopate_core::strategy::{
    Endpoint, HalfWire, ProtocolError, Rank, StrategyKind, SyncPlan, Transmit, WorkerEvent,
    WorkerSync,
};
use syncopate_core::wire::{Header, WireFloat};

use crate::comm::{CommError, CommLoop, Flow, Hooks, LinkStatus};
use crate::error::RunError;
use crate::job::{JobLayout, ProcessContext};
use crate::process::join;

/// The "model fingerprint" the processes of a collective job agree on.
pub const COLLECTIVE_FINGERPRINT: u64 = 0xc011_ec71;

/// The default bound on one collective operation: Gloo's default timeout (30 minutes).
pub const DEFAULT_COLLECTIVE_TIMEOUT: Duration = Duration::from_secs(30 * 60);

/// How long an operation may stay pending after a peer it needs said goodbye (what may
/// legitimately remain is this rank's own sends).
const GOODBYE_GRACE: Duration = Duration::from_secs(10);

/// Endpoints kept for reuse, all lengths together.
const IDLE_ENDPOINTS: usize = 64;

/// Buffers of early frames kept for the next ones (a fresh buffer is fresh pages, each
/// faulted in as the payload is read: a tenth of a large all-reduce's time).
const SPARE_EARLY_BUFFERS: usize = 4;

/// What an operation's caller is given when it ends: the averaged values, or the error that
/// ended the job (it names the peer).
pub type Completion = Box<dyn FnOnce(Result<Vec<f32>, String>) + Send>;

/// One all-reduce as the caller sees it: where its values come from and where the average
/// goes. Both calls run on the communication thread.
pub trait Operation: Send {
    /// The number of values.
    fn len(&self) -> usize;
    /// Whether there are no values.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// Writes the values (`into` has [`Operation::len`] of them).
    fn read(&self, into: &mut [f32]);
    /// Called once: the average over every rank, or the error that ended the job.
    fn complete(self: Box<Self>, result: Result<&[f32], String>);
    /// The float the values travel as: 16-bit for a buffer of 16-bit floats (half the
    /// bytes; every rank must agree), `f32` (the default) otherwise.
    fn wire_float(&self) -> WireFloat {
        WireFloat::F32
    }
}

/// An operation on an owned buffer, completed by a callback.
struct VecOperation {
    values: Vec<f32>,
    /// The float its values travel as.
    float: WireFloat,
    done: Completion,
}

impl Operation for VecOperation {
    fn len(&self) -> usize {
        self.values.len()
    }
    fn read(&self, into: &mut [f32]) {
        into.copy_from_slice(&self.values);
    }
    fn complete(self: Box<Self>, result: Result<&[f32], String>) {
        (self.done)(result.map(<[f32]>::to_vec));
    }
    fn wire_float(&self) -> WireFloat {
        self.float
    }
}

/// What the communication thread is asked.
enum Request {
    Reduce(Box<dyn Operation>),
    /// Test-only: panic on the communication thread with this message.
    Panic(String),
}

/// A job's ring of workers, all-reducing buffers on a communication thread of its own.
pub struct Ring {
    rank: Rank,
    workers: usize,
    requests: Option<Sender<Request>>,
    waker: Arc<Waker>,
    thread: Option<JoinHandle<()>>,
    /// The error that ended the job, once one has.
    failure: Arc<Mutex<Option<String>>>,
}

impl Ring {
    /// The layout of a collective job of `workers` workers: ring all-reduce with its
    /// defaults, every buffer one bucket, on an unshaped network whose send window holds
    /// one largest frame (4 MiB, as `bench-comm`'s).
    pub fn layout(workers: usize) -> JobLayout {
        JobLayout {
            sync: SyncPlan {
                bucket_bytes: usize::MAX,
                ..SyncPlan::new(StrategyKind::Allreduce, workers, 0)
            },
            network: NetworkProfile {
                buffer_bytes: 4 << 20,
                ..NetworkProfile::default()
            },
            net_seed: 0,
        }
    }

    /// Joins the job of `workers` workers described by `ctx` (rendezvous, authenticated
    /// links to the ring's neighbours) and starts the communication thread, with the
    /// default collective timeout.
    pub fn join(ctx: &ProcessContext, workers: usize) -> Result<Self, RunError> {
        Self::join_with_timeout(ctx, workers, DEFAULT_COLLECTIVE_TIMEOUT)
    }

    /// As [`Ring::join`]; an operation not complete `collective_timeout` after it was asked
    /// for fails the job.
    pub fn join_with_timeout(
        ctx: &ProcessContext,
        workers: usize,
        collective_timeout: Duration,
    ) -> Result<Self, RunError> {
        let layout = Self::layout(workers);
        layout
            .validate()
            .map_err(|e| RunError::Local(e.to_string()))?;
        if ctx.rank >= workers {
            return Err(RunError::Local(format!(
                "rank {} is not below the number of workers {workers}",
                ctx.rank
            )));
        }
        let joined = join(ctx, &layout, COLLECTIVE_FINGERPRINT)?;
        let (comm, waker) = CommLoop::new(
            joined.links,
            ctx.comm.clone(),
            layout.emulation(ctx.rank),
            joined.datagram_sockets,
        )
        .map_err(|e| RunError::Local(format!("setting up the links: {e}")))?;
        let (requests, inbox) = channel();
        let failure = Arc::new(Mutex::new(None));
        let thread = std::thread::Builder::new()
            .name(format!("syncopate-ring-{}", ctx.rank))
            .spawn({
                let pipeline = Pipeline::new(layout, ctx.rank, collective_timeout);
                let failure = failure.clone();
                move || serve(comm, pipeline, inbox, &failure)
            })
            .map_err(|e| RunError::Local(format!("starting the communication thread: {e}")))?;
        Ok(Self {
            rank: ctx.rank,
            workers,
            requests: Some(requests),
            waker,
            thread: Some(thread),
            failure,
        })
    }

    /// This process's rank.
    pub fn rank(&self) -> Rank {
        self.rank
    }

    /// Workers in the ring.
    pub fn workers(&self) -> usize {
        self.workers
    }

    /// The error that ended the job, if one has.
    pub fn failure(&self) -> Option<String> {
        self.failure.lock().ok().and_then(|f| f.clone())
    }

    /// Queues the average of `values` over every worker; `done` is called on the
    /// communication thread with the averaged values (or the job's error). Every rank must
    /// ask for the same lengths in the same order.
    pub fn allreduce(&self, values: Vec<f32>, done: Completion) {
        self.start(Box::new(VecOperation {
            values,
            float: WireFloat::F32,
            done,
        }));
    }

    /// Starts `operation` at once (beside those in flight): the average of its values over
    /// every worker, completed on the communication thread. Every rank must start
    /// operations of the same lengths in the same order.
    pub fn start(&self, operation: Box<dyn Operation>) {
        self.send(Request::Reduce(operation));
    }

    /// Test-only: makes the communication thread panic with `message` once it reaches this
    /// request (what every pending operation must then be failed with).
    #[doc(hidden)]
    pub fn inject_panic(&self, message: String) {
        self.send(Request::Panic(message));
    }

    fn send(&self, request: Request) {
        let closed = || "the ring is closed".to_owned();
        let Some(requests) = &self.requests else {
            return refuse(request, closed());
        };
        if let Err(refused) = requests.send(request) {
            return refuse(refused.0, self.failure().unwrap_or_else(closed));
        }
        // A failed wake leaves the request to the loop's next round (within 100 ms).
        let _ = self.waker.wake();
    }

    /// Whether [`Ring::close`] has run.
    pub fn is_closed(&self) -> bool {
        self.thread.is_none()
    }

    /// Finishes the operations queued, says goodbye to the peers once they have too, then
    /// stops the communication thread.
    pub fn close(&mut self) {
        self.requests = None;
        let _ = self.waker.wake();
        if let Some(thread) = self.thread.take() {
            // The thread fails its operations itself, even when it panics.
            let _ = thread.join();
        }
    }
}

impl Drop for Ring {
    fn drop(&mut self) {
        self.close();
    }
}

/// Fails a request that never reached the thread.
fn refuse(request: Request, error: String) {
    if let Request::Reduce(op) = request {
        op.complete(Err(error));
    }
}

/// The communication thread: one run of the loop for the ring's life; after an error or a
/// panic, every pending, queued and later operation fails with it.
fn serve(
    mut comm: CommLoop,
    mut pipeline: Pipeline,
    inbox: Receiver<Request>,
    failure: &Mutex<Option<String>>,
) {
    let mut hooks = PipelineHooks {
        inbox: &inbox,
        closed: false,
        goodbye: None,
        step: 0,
        layout: pipeline.layout.clone(),
    };
    let outcome = catch_unwind(AssertUnwindSafe(|| comm.run(&mut pipeline, &mut hooks)));
    let error = match outcome {
        Ok(Ok(())) => "the ring is closed".to_owned(),
        Ok(Err(e)) => e.to_string(),
        Err(panic) => format!(
            "the communication thread panicked: {}",
            panic_message(panic.as_ref())
        ),
    };
    match failure.lock() {
        Ok(mut slot) => *slot = Some(error.clone()),
        Err(poisoned) => *poisoned.into_inner() = Some(error.clone()),
    }
    drop(comm);
    for op in pipeline.take_pending() {
        op.complete(Err(error.clone()));
    }
    while let Ok(request) = inbox.recv() {
        refuse(request, error.clone());
    }
}

/// The text of a panic's payload.
fn panic_message(payload: &(dyn Any + Send)) -> String {
    if let Some(s) = payload.downcast_ref::<&str>() {
        (*s).to_owned()
    } else if let Some(s) = payload.downcast_ref::<String>() {
        s.clone()
    } else {
        "(no message)".to_owned()
    }
}

/// An operation in flight.
struct Active {
    op: Box<dyn Operation>,
    ep: Box<dyn WorkerSync + Send>,
    started: Instant,
    /// Peers that sent a frame of it.
    heard: Vec<Rank>,
    done: bool,
}

/// A frame of an operation this rank has not been asked for yet.
struct EarlyFrame {
    link: Rank,
    header: Header,
    values: Vec<f32>,
    complete: bool,
    /// Handed to its operation already (kept in place so that indices stay valid).
    replayed: bool,
}

/// The endpoint the loop runs: every operation in flight, each on an endpoint of its
/// length, and the frames that came before their operation was asked for here.
struct Pipeline {
    layout: JobLayout,
    rank: Rank,
    timeout: Duration,
    /// The number the next operation asked for gets (its frames' step).
    next_op: u64,
    active: BTreeMap<u64, Active>,
    /// Endpoints of finished operations, by length and wire float.
    idle: HashMap<(usize, WireFloat), Vec<Box<dyn WorkerSync + Send>>>,
    idle_count: usize,
    early: BTreeMap<u64, Vec<EarlyFrame>>,
    /// Per link, the early frame whose payload is being read: `(operation, index)`.
    receiving: HashMap<Rank, (u64, usize)>,
    /// Buffers of early frames handed on, for the next early frames.
    spare: Vec<Vec<f32>>,
    /// When a peer's goodbye was first seen, and whose.
    goodbye: Option<(Rank, Instant)>,
}

impl Pipeline {
    fn new(layout: JobLayout, rank: Rank, timeout: Duration) -> Self {
        Self {
            layout,
            rank,
            timeout,
            next_op: 0,
            active: BTreeMap::new(),
            idle: HashMap::new(),
            idle_count: 0,
            early: BTreeMap::new(),
            receiving: HashMap::new(),
            spare: Vec::new(),
            goodbye: None,
        }
    }

    /// The operation errors name: the oldest in flight, else the next.
    fn step(&self) -> u64 {
        self.active.keys().next().copied().unwrap_or(self.next_op)
    }

    /// Every operation not completed (to fail them).
    fn take_pending(&mut self) -> Vec<Box<dyn Operation>> {
        std::mem::take(&mut self.active)
            .into_values()
            .map(|a| a.op)
            .collect()
    }

    /// Starts `op` as the next operation: its values into an endpoint of its length, then
    /// the frames of it that came early.
    fn launch(&mut self, op: Box<dyn Operation>) -> Result<(), CommError> {
        let id = self.next_op;
        self.next_op += 1;
        let numel = op.len();
        if numel == 0 {
            op.complete(Ok(&[]));
            return Ok(());
        }
        let float = op.wire_float();
        let reused = self.idle.get_mut(&(numel, float)).and_then(Vec::pop);
        let mut ep = match reused {
            Some(mut ep) => {
                self.idle_count -= 1;
                // An endpoint clears, as a step begins, what it kept of the step after it;
                // one that skipped steps (other lengths went between) has that of the step
                // before this one to clear too: begin that step first (nothing of it came,
                // nothing of it is queued).
                ep.begin_step(id.saturating_sub(1));
                ep
            }
            None => self.endpoint(numel, float),
        };
        ep.begin_step(id);
        match ep.gradient_slot(0) {
            Some(slot) => {
                op.read(slot);
                ep.handle_gradient_in_place(0);
            }
            None => {
                let mut values = vec![0.0; numel];
                op.read(&mut values);
                ep.handle_gradient(0, &values);
            }
        }
        ep.handle_backward_done();
        let mut active = Active {
            op,
            ep,
            started: Instant::now(),
            heard: Vec::new(),
            done: false,
        };
        if let Some(frames) = self.early.remove(&id) {
            let mut kept = Vec::new();
            for f in frames {
                if f.replayed {
                    self.recycle(f.values);
                } else if f.complete {
                    replay(&mut active, &f).map_err(|e| self.protocol(f.link, e))?;
                    self.recycle(f.values);
                } else {
                    kept.push(f);
                }
            }
            if !kept.is_empty() {
                // Still being read: `receiving` points into it by index, which stays valid
                // because only the incomplete frames (one per link) remain, re-indexed here.
                for (i, f) in kept.iter().enumerate() {
                    self.receiving.insert(f.link, (id, i));
                }
                self.early.insert(id, kept);
            }
        }
        self.active.insert(id, active);
        Ok(())
    }

    /// Completes the operations whose step is done, in order.
    fn complete_done(&mut self) {
        for a in self.active.values_mut() {
            while let Some(event) = a.ep.poll_event() {
                if event == WorkerEvent::StepDone {
                    a.done = true;
                }
            }
        }
        let done: Vec<u64> = (self.active.iter())
            .filter(|(_, a)| a.done)
            .map(|(&id, _)| id)
            .collect();
        for id in done {
            let Some(mut a) = self.active.remove(&id) else {
                continue;
            };
            for f in self.early.remove(&id).into_iter().flatten() {
                self.recycle(f.values);
            }
            let key = (a.op.len(), a.op.wire_float());
            match a.ep.gradient_slot(0) {
                Some(values) => a.op.complete(Ok(values)),
                None => {
                    let values = a.ep.take_values(0);
                    a.op.complete(Ok(&values));
                }
            }
            if self.idle_count < IDLE_ENDPOINTS {
                self.idle.entry(key).or_default().push(a.ep);
                self.idle_count += 1;
            }
        }
    }

    /// A new endpoint for an operation of `numel` values travelling as `float`: the
    /// layout's ring, which for 16-bit floats shares no buffer whole ([`HalfWire`]).
    fn endpoint(&self, numel: usize, float: WireFloat) -> Box<dyn WorkerSync + Send> {
        let keys = vec![KeyInfo { numel, layer: 0 }];
        if float == WireFloat::F32 {
            return self.layout.worker_endpoint(self.rank, keys);
        }
        let mut layout = self.layout.clone();
        layout.sync.direct_share_elems = 0;
        Box::new(HalfWire::new(
            layout.worker_endpoint(self.rank, keys),
            float,
        ))
    }

    /// Keeps an early frame's buffer for the next early frame, while there is room.
    fn recycle(&mut self, values: Vec<f32>) {
        if self.spare.len() < SPARE_EARLY_BUFFERS && values.capacity() > 0 {
            self.spare.push(values);
        }
    }

    /// A buffer of `len` zeros for an early frame, a spare one when there is one.
    fn early_buffer(&mut self, len: usize) -> Vec<f32> {
        let mut values = self.spare.pop().unwrap_or_default();
        values.clear();
        values.resize(len, 0.0);
        values
    }

    /// The error of a frame from `link` that breaks the protocol.
    fn protocol(&self, link: Rank, error: ProtocolError) -> CommError {
        CommError::Protocol {
            peer: self.layout.describe(link),
            step: self.step(),
            error,
        }
    }

    /// Fails the job if an operation has been pending past the collective timeout, or
    /// needs a peer that has left.
    fn check_deadlines(&self) -> Result<(), CommError> {
        let now = Instant::now();
        let workers = self.layout.sync.workers;
        let left = (self.rank + workers - 1) % workers;
        for (&id, a) in &self.active {
            if let Some((peer, at)) = self.goodbye {
                if a.started > at || now.duration_since(at) > GOODBYE_GRACE {
                    return Err(CommError::Lost {
                        peer: self.layout.describe(peer),
                        step: id,
                        reason: format!(
                            "it closed its ring (left the job) before collective {id} completed"
                        ),
                    });
                }
            }
            let waited = now.duration_since(a.started);
            let entered = a.heard.contains(&left);
            // Where the left neighbour did enter, the rank that did not is further round the
            // ring: its own right neighbour names it first, and the abort reaches us.
            let limit = if entered {
                self.timeout + self.timeout / 4
            } else {
                self.timeout
            };
            if waited > limit {
                let who = if entered {
                    format!(
                        "waiting on a rank beyond {}, which entered it",
                        self.layout.describe(left)
                    )
                } else {
                    format!("{} did not enter it", self.layout.describe(left))
                };
                return Err(CommError::Local(format!(
                    "collective {id} did not complete within the collective timeout of \
                     {:.1} s: {who}",
                    self.timeout.as_secs_f64()
                )));
            }
        }
        Ok(())
    }
}

/// A frame from `from` that this rank cannot accept now.
fn unexpected(from: Rank, header: &Header, why: &str) -> ProtocolError {
    ProtocolError::Unexpected {
        from,
        reason: format!(
            "{why} ({:?} step {} key {} offset {} length {})",
            header.kind, header.step, header.key, header.offset, header.length
        ),
    }
}

/// Hands a frame that came before its operation to the operation's endpoint.
fn replay(active: &mut Active, f: &EarlyFrame) -> Result<(), ProtocolError> {
    let slot = active.ep.recv_slot(f.link, &f.header)?;
    if slot.len() != f.values.len() {
        return Err(unexpected(
            f.link,
            &f.header,
            "an early frame of another length",
        ));
    }
    slot.copy_from_slice(&f.values);
    active.ep.handle_payload(f.link, &f.header)?;
    if !active.heard.contains(&f.link) {
        active.heard.push(f.link);
    }
    Ok(())
}

impl Endpoint for Pipeline {
    fn poll_transmit(&mut self, link: Rank, out: &mut Vec<u8>) -> bool {
        (self.active.values_mut()).any(|a| a.ep.poll_transmit(link, out))
    }

    fn poll_transmit_any(&mut self, links: &[Rank], out: &mut Vec<u8>) -> Option<Rank> {
        (self.active.values_mut()).find_map(|a| a.ep.poll_transmit_any(links, out))
    }

    fn poll_transmit_lent(&mut self, links: &[Rank], out: &mut Vec<u8>) -> Option<Transmit> {
        (self.active.values_mut()).find_map(|a| a.ep.poll_transmit_lent(links, out))
    }

    fn lent_payload(&self, header: &Header) -> &[f32] {
        (self.active.get(&header.step)).map_or(&[], |a| a.ep.lent_payload(header))
    }

    fn handle_sent(&mut self, link: Rank, header: &Header) {
        if let Some(a) = self.active.get_mut(&header.step) {
            a.ep.handle_sent(link, header);
        }
    }

    fn recv_slot(&mut self, link: Rank, header: &Header) -> Result<&mut [f32], ProtocolError> {
        let reading = (self.receiving.get(&link).copied()).filter(|&(id, i)| {
            (self.early.get(&id).and_then(|f| f.get(i))).is_some_and(|f| f.header == *header)
        });
        if let Some((id, i)) = reading {
            return (self.early.get_mut(&id).and_then(|f| f.get_mut(i)))
                .map(|f| f.values.as_mut_slice())
                .ok_or_else(|| unexpected(link, header, "an early frame went missing"));
        }
        let id = header.step;
        if self.active.contains_key(&id) {
            let Some(a) = self.active.get_mut(&id) else {
                return Err(unexpected(link, header, "no such collective"));
            };
            if !a.heard.contains(&link) {
                a.heard.push(link);
            }
            return a.ep.recv_slot(link, header);
        }
        if id < self.next_op {
            return Err(unexpected(
                link,
                header,
                "a frame of a collective already completed here",
            ));
        }
        // The payload's words: its values, or half as many where they travel as halves.
        let values = self.early_buffer(header.payload_len as usize / 4);
        let frames = self.early.entry(id).or_default();
        frames.push(EarlyFrame {
            link,
            header: *header,
            values,
            complete: false,
            replayed: false,
        });
        let i = frames.len() - 1;
        self.receiving.insert(link, (id, i));
        Ok(&mut frames[i].values)
    }

    fn handle_payload(&mut self, link: Rank, header: &Header) -> Result<(), ProtocolError> {
        if let Some(&(id, i)) = self.receiving.get(&link) {
            let same =
                (self.early.get(&id).and_then(|f| f.get(i))).is_some_and(|f| f.header == *header);
            if same {
                self.receiving.remove(&link);
                let Some(f) = self.early.get_mut(&id).and_then(|f| f.get_mut(i)) else {
                    return Ok(());
                };
                f.complete = true;
                if let Some(a) = self.active.get_mut(&id) {
                    // Its operation started while the payload was being read.
                    f.replayed = true;
                    let values = std::mem::take(&mut f.values);
                    let frame = EarlyFrame {
                        link: f.link,
                        header: f.header,
                        values,
                        complete: true,
                        replayed: true,
                    };
                    let replayed = replay(a, &frame);
                    self.recycle(frame.values);
                    return replayed;
                }
                return Ok(());
            }
        }
        match self.active.get_mut(&header.step) {
            Some(a) => a.ep.handle_payload(link, header),
            None => Err(unexpected(
                link,
                header,
                "a frame of no collective in flight",
            )),
        }
    }

    fn poll_timeout(&self) -> Option<u64> {
        (self.active.values())
            .filter_map(|a| a.ep.poll_timeout())
            .min()
    }

    fn handle_timeout(&mut self, now_ns: u64) {
        for a in self.active.values_mut() {
            a.ep.handle_timeout(now_ns);
        }
    }
}

/// The loop's hooks: requests in, completions out, deadlines checked every round.
struct PipelineHooks<'a> {
    inbox: &'a Receiver<Request>,
    /// The ring was closed: finish once nothing is in flight.
    closed: bool,
    goodbye: Option<Rank>,
    /// The operation errors name.
    step: u64,
    /// The job, which names the peers.
    layout: JobLayout,
}

impl PipelineHooks<'_> {
    fn advance(&mut self, p: &mut Pipeline) -> Result<Flow, CommError> {
        p.complete_done();
        if let (Some(peer), None) = (self.goodbye, p.goodbye) {
            p.goodbye = Some((peer, Instant::now()));
        }
        self.step = p.step();
        p.check_deadlines()?;
        Ok(if self.closed && p.active.is_empty() {
            Flow::Finish
        } else {
            Flow::Continue
        })
    }
}

impl Hooks<Pipeline> for PipelineHooks<'_> {
    fn on_commands(&mut self, p: &mut Pipeline) -> Result<Flow, CommError> {
        while !self.closed {
            match self.inbox.try_recv() {
                Ok(Request::Reduce(op)) => p.launch(op)?,
                Ok(Request::Panic(message)) => panic!("{message}"),
                Err(TryRecvError::Empty) => break,
                Err(TryRecvError::Disconnected) => self.closed = true,
            }
        }
        self.advance(p)
    }

    fn on_progress(&mut self, p: &mut Pipeline, status: LinkStatus) -> Result<Flow, CommError> {
        if self.goodbye.is_none() {
            self.goodbye = status.first_goodbye;
        }
        self.advance(p)
    }

    fn step(&self) -> u64 {
        self.step
    }

    fn describe(&self, rank: Rank) -> String {
        self.layout.describe(rank)
    }
}

/// Hooks that drive a worker endpoint from inside the loop's thread (no commands from
/// other threads): the same `advance` after every round and every frame.
pub(crate) trait DrivesSteps {
    /// Feeds the endpoint what it needs next and drains its events.
    fn advance(&mut self, ep: &mut (dyn WorkerSync + Send + 'static)) -> Flow;
    /// The step errors name.
    fn step(&self) -> u64;
    /// The job, which names the peers.
    fn layout(&self) -> &JobLayout;
}

impl<T: DrivesSteps> Hooks<dyn WorkerSync + Send> for T {
    fn on_commands(
        &mut self,
        ep: &mut (dyn WorkerSync + Send + 'static),
    ) -> Result<Flow, CommError> {
        Ok(self.advance(ep))
    }
    fn on_progress(
        &mut self,
        ep: &mut (dyn WorkerSync + Send + 'static),
        _: LinkStatus,
    ) -> Result<Flow, CommError> {
        Ok(self.advance(ep))
    }
    fn step(&self) -> u64 {
        DrivesSteps::step(self)
    }
    fn describe(&self, rank: Rank) -> String {
        self.layout().describe(rank)
    }
}

#[cfg(test)]
#[path = "collective_tests.rs"]
mod tests;
