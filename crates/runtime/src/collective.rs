//! Syncopate's ring all-reduce for a training loop that is not ours (a PyTorch DDP
//! communication hook, a model averager): a job of workers joined with the runtime's
//! rendezvous, authentication and liveness, and a communication thread that all-reduces
//! (averages) flat buffers one after the other, in the order every rank asks for them.
//!
//! Each operation is one run of the communication loop over the job's links, with a ring
//! all-reduce endpoint of the buffer's length (built once per length, so buffers of any size
//! may follow each other: DDP's buckets change after its first iteration); the goodbye
//! exchange at the end of a run keeps the operations apart, as `bench-comm`'s sizes are.
//! Every rank gets the same bits (core's ring adds in ring order). A peer that dies, hangs
//! past the peer timeout or aborts fails the operation with an error naming it, the peers
//! are told (an Abort frame carrying the error), and every later operation fails with the
//! same error.

use std::collections::HashMap;
use std::sync::mpsc::{channel, Receiver, Sender};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

use syncopate_core::net::NetworkProfile;
use syncopate_core::registry::KeyInfo;
use syncopate_core::strategy::{Rank, StrategyKind, SyncPlan, WorkerEvent, WorkerSync};

use crate::comm::{CommError, CommLoop, Flow, Hooks, LinkStatus};
use crate::error::RunError;
use crate::job::{JobLayout, ProcessContext};
use crate::process::join;

/// The "model fingerprint" the processes of a collective job agree on.
pub const COLLECTIVE_FINGERPRINT: u64 = 0xc011_ec71;

/// What an operation's caller is given when it ends: the averaged values, or the error that
/// ended the job (it names the peer).
pub type Completion = Box<dyn FnOnce(Result<Vec<f32>, String>) + Send>;

/// One operation asked of the communication thread.
struct Request {
    values: Vec<f32>,
    done: Completion,
}

/// A job's ring of workers, all-reducing buffers on a communication thread of its own.
pub struct Ring {
    rank: Rank,
    workers: usize,
    requests: Option<Sender<Request>>,
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
    /// links to the ring's neighbours) and starts the communication thread.
    pub fn join(ctx: &ProcessContext, workers: usize) -> Result<Self, RunError> {
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
        let (comm, _waker) = CommLoop::new(
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
                let worker = RingThread {
                    comm,
                    layout,
                    rank: ctx.rank,
                    endpoints: HashMap::new(),
                    operations: 0,
                    failure: failure.clone(),
                };
                move || worker.serve(inbox)
            })
            .map_err(|e| RunError::Local(format!("starting the communication thread: {e}")))?;
        Ok(Self {
            rank: ctx.rank,
            workers,
            requests: Some(requests),
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
        let closed = || "the ring is closed".to_owned();
        let Some(requests) = &self.requests else {
            return done(Err(closed()));
        };
        if let Err(refused) = requests.send(Request { values, done }) {
            let failure = self.failure().unwrap_or_else(closed);
            (refused.0.done)(Err(failure));
        }
    }

    /// Whether [`Ring::close`] has run.
    pub fn is_closed(&self) -> bool {
        self.thread.is_none()
    }

    /// Finishes the operations queued, then stops the communication thread.
    pub fn close(&mut self) {
        self.requests = None;
        if let Some(thread) = self.thread.take() {
            // A panic of the thread has already failed its operations' callers.
            let _ = thread.join();
        }
    }
}

impl Drop for Ring {
    fn drop(&mut self) {
        self.close();
    }
}

/// The communication thread's state: the loop, one endpoint per buffer length, and how
/// many operations each endpoint has done (its step).
struct RingThread {
    comm: CommLoop,
    layout: JobLayout,
    rank: Rank,
    endpoints: HashMap<usize, (Box<dyn WorkerSync + Send>, u64)>,
    /// Operations done, all lengths together (the step errors name).
    operations: u64,
    failure: Arc<Mutex<Option<String>>>,
}

impl RingThread {
    /// Serves requests until the ring is closed; after an error, fails every request.
    fn serve(mut self, inbox: Receiver<Request>) {
        let mut failed: Option<String> = None;
        while let Ok(request) = inbox.recv() {
            if let Some(error) = &failed {
                (request.done)(Err(error.clone()));
                continue;
            }
            match self.reduce(request.values) {
                Ok(averaged) => (request.done)(Ok(averaged)),
                Err(e) => {
                    let error = e.to_string();
                    if let Ok(mut slot) = self.failure.lock() {
                        *slot = Some(error.clone());
                    }
                    failed = Some(error.clone());
                    (request.done)(Err(error));
                }
            }
        }
    }

    /// One operation: a run of the loop with the endpoint of this length.
    fn reduce(&mut self, values: Vec<f32>) -> Result<Vec<f32>, CommError> {
        let numel = values.len();
        if numel == 0 {
            return Ok(values);
        }
        let (layout, rank) = (&self.layout, self.rank);
        let (endpoint, step) = self.endpoints.entry(numel).or_insert_with(|| {
            let keys = vec![KeyInfo { numel, layer: 0 }];
            (layout.worker_endpoint(rank, keys), 0)
        });
        let mut hooks = OneReduce {
            layout,
            values: Some(values),
            endpoint_step: *step,
            operation: self.operations,
            result: None,
        };
        self.comm.run(endpoint.as_mut(), &mut hooks)?;
        *step += 1;
        self.operations += 1;
        hooks
            .result
            .ok_or_else(|| CommError::Local("the all-reduce ended without its values".into()))
    }
}

/// Drives one all-reduce of one buffer through an endpoint, inside the loop's thread.
struct OneReduce<'a> {
    layout: &'a JobLayout,
    /// The buffer, until it is handed to the endpoint.
    values: Option<Vec<f32>>,
    /// The endpoint's step (its own count of operations).
    endpoint_step: u64,
    /// The job's count of operations, which errors name as the step.
    operation: u64,
    result: Option<Vec<f32>>,
}

impl OneReduce<'_> {
    fn advance(&mut self, ep: &mut (dyn WorkerSync + Send + 'static)) -> Flow {
        if let Some(values) = self.values.take() {
            ep.begin_step(self.endpoint_step);
            ep.handle_gradient(0, &values);
            ep.handle_backward_done();
        }
        while let Some(event) = ep.poll_event() {
            match event {
                WorkerEvent::GradReady(key) => self.result = Some(ep.take_values(key)),
                WorkerEvent::StepDone => return Flow::Finish,
                _ => {}
            }
        }
        Flow::Continue
    }
}

impl DrivesSteps for OneReduce<'_> {
    fn advance(&mut self, ep: &mut (dyn WorkerSync + Send + 'static)) -> Flow {
        OneReduce::advance(self, ep)
    }
    fn step(&self) -> u64 {
        self.operation
    }
    fn layout(&self) -> &JobLayout {
        self.layout
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
