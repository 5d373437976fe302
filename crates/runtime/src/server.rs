//! A parameter-server process: one shard of the parameters, driven by the communication
//! loop until every worker has said goodbye.

use syncopate_core::buffers::{BufferRelay, BufferRoute};
use syncopate_core::step::CheckpointSchedule;
use syncopate_core::strategy::{Rank, ServerOptim, ServerSync};

/// A server endpoint of any parameter-server strategy.
type Server = dyn ServerSync + Send;
use syncopate_train::checkpoint::{encode, Decoded, NamedTensor};

use crate::checkpoint::{self, CheckpointPlan, JobIdentity, ProcessState};
use syncopate_core::Sgd;
use syncopate_train::model::ModelSpec;
use syncopate_train::trainer::OptimConfig;

use std::time::Instant;

use syncopate_core::wire::Header;

use crate::comm::{CommError, CommLoop, Flow, HookExtras, Hooks, LinkStatus};
use crate::error::RunError;
use crate::job::{key_infos, JobLayout, ProcessContext};
use crate::losses::Losses;
use crate::process::join;
use crate::trace::{TraceRecorder, RECEIVE};

/// A server's outcome.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct ServerSummary {
    /// This server's rank.
    pub rank: Rank,
    /// Slice updates applied.
    pub updates: u64,
    /// The most gradient values held at once in pushes waiting for their turn in the
    /// rank-order sum (what bit-reproducibility costs in memory).
    pub peak_early_values: usize,
    /// Bytes per link: `(peer, sent, received)`.
    pub links: Vec<(Rank, u64, u64)>,
    /// What a loss-tolerant server (dlcp) lost and recovered, and what its datagrams did.
    #[serde(flatten)]
    pub losses: Losses,
}

/// What a server runs with besides the job's layout.
#[derive(Debug, Clone)]
pub struct ServerPlan {
    /// Initial values of every key (the server keeps the slices it owns).
    pub initial: Vec<Vec<f32>>,
    /// The optimizer it applies.
    pub optim: OptimConfig,
    /// The job's length in steps (its last step is always checkpointed).
    pub steps: u64,
    /// Where and how often it writes checkpoints (`None`: never).
    pub checkpoint: Option<CheckpointPlan>,
    /// A checkpoint folder to resume from (its newest step every process completed).
    pub resume: Option<std::path::PathBuf>,
    /// The training settings that change the weights, which its checkpoints record and a
    /// resumed job must repeat (every process of the job is given the same).
    pub weight_settings: crate::checkpoint::WeightSettings,
}

/// Writes a server's checkpoints: the values and momentum of the keys it owns.
pub(crate) struct ServerCheckpointer {
    plan: CheckpointPlan,
    job: JobIdentity,
    spec: ModelSpec,
    steps: u64,
}

impl ServerCheckpointer {
    /// Writes `server`'s state if step `step` (0-based, just completed) is a checkpoint point.
    fn maybe_write(&self, server: &Server, rank: Rank, step: u64) -> Result<(), RunError> {
        let schedule = CheckpointSchedule {
            every: Some(self.plan.every),
        };
        if !schedule.due(step, self.steps) {
            return Ok(());
        }
        let (params, velocity) = server.state();
        let mut tensors = Vec::new();
        for (k, (p, v)) in self.spec.keys().iter().zip(params.iter().zip(velocity)) {
            if p.is_empty() {
                continue;
            }
            for (name, values) in [(k.name.clone(), p), (format!("momentum.{}", k.name), v)] {
                tensors.push(NamedTensor {
                    name,
                    shape: vec![values.len()],
                    values: values.clone(),
                });
            }
        }
        let bytes = encode(&self.spec, &tensors, Default::default(), &self.plan.dir)?;
        let written = ProcessState {
            state: &bytes,
            record: None,
        };
        checkpoint::write(&self.plan.dir, step + 1, rank, &self.job, written)?;
        tracing::info!(rank, steps = step + 1, "checkpoint written");
        Ok(())
    }
}

/// Loads server `rank`'s state from the newest complete checkpoint of `dir` into `server`;
/// returns the checkpoint's run id.
fn restore(
    server: &mut Server,
    spec: &ModelSpec,
    job: &JobIdentity,
    rank: Rank,
    dir: &std::path::Path,
) -> Result<String, RunError> {
    let point = checkpoint::newest_complete(dir, job)?;
    let bytes = point.read_state(rank)?;
    let path = point.dir.join(format!("rank-{rank}.safetensors"));
    let decoded = Decoded::parse(&bytes, &path)?;
    let (owned, _) = server.state();
    let owned: Vec<bool> = owned.iter().map(|p| !p.is_empty()).collect();
    let mut params = Vec::new();
    let mut velocity = Vec::new();
    for (k, owns) in spec.keys().iter().zip(owned) {
        let numel: usize = k.shape.iter().product();
        let read = |name: &str| -> Result<Vec<f32>, RunError> {
            Ok(if owns {
                decoded.tensor(name, &[numel])?
            } else {
                Vec::new()
            })
        };
        params.push(read(&k.name)?);
        velocity.push(read(&format!("momentum.{}", k.name))?);
    }
    server
        .restore(params, velocity, point.step)
        .map_err(RunError::Local)?;
    tracing::info!(
        rank,
        steps = point.step,
        "resuming from {}",
        point.dir.display()
    );
    Ok(point.run().to_string())
}

/// A server's loop: nothing to command, done when every worker has said goodbye.
pub(crate) struct ServerHooks {
    pub(crate) layout: JobLayout,
    /// Its part in relaying worker 0's buffers (the first server passes them on) and the
    /// frames' timeline.
    pub(crate) extras: HookExtras,
    /// Slice updates seen so far (a push that raises it applied a slice).
    pub(crate) updates: u64,
    /// The latest step a push was received for (errors name it).
    pub(crate) step: u64,
    /// Writes checkpoints as steps complete.
    pub(crate) checkpoints: Option<ServerCheckpointer>,
    /// This server's rank.
    pub(crate) rank: Rank,
}

impl ServerHooks {
    /// The hooks of server `rank`, writing `checkpoints` (if any) and the timeline
    /// (`tracer`).
    pub(crate) fn new(
        layout: &JobLayout,
        rank: Rank,
        tracer: Option<TraceRecorder>,
        checkpoints: Option<ServerCheckpointer>,
    ) -> Self {
        let route = BufferRoute::of(layout.strategy, layout.workers, layout.servers, rank);
        Self {
            layout: layout.clone(),
            extras: HookExtras {
                buffers: BufferRelay::new(route, None),
                tracer,
            },
            updates: 0,
            step: 0,
            checkpoints,
            rank,
        }
    }
}

impl Hooks<Server> for ServerHooks {
    fn on_commands(&mut self, _: &mut Server) -> Result<Flow, CommError> {
        Ok(Flow::Continue)
    }

    fn on_progress(&mut self, server: &mut Server, status: LinkStatus) -> Result<Flow, CommError> {
        self.step = server.latest_step();
        while let Some(step) = server.poll_step_complete() {
            if let Some(c) = &self.checkpoints {
                c.maybe_write(server, self.rank, step)
                    .map_err(|e| CommError::Local(e.to_string()))?;
            }
        }
        Ok(if status.goodbyes == status.links {
            Flow::Finish
        } else {
            Flow::Continue
        })
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

    fn on_frame_received(
        &mut self,
        server: &Server,
        peer: Rank,
        header: &Header,
        arrived: Instant,
        read: Instant,
        handled: Instant,
    ) {
        let applied = server.updates() > self.updates;
        self.updates = server.updates();
        let Some(t) = self.extras.tracer.as_mut() else {
            return;
        };
        if applied {
            // The last push of a slice: aggregate, optimizer, replies queued.
            t.frame_received(peer, header, arrived, read);
            let name = format!("apply k{} @{}+{}", header.key, header.offset, header.length);
            t.span_on(RECEIVE, header.step, "apply", &name, read, handled);
        } else {
            t.frame_received(peer, header, arrived, handled);
        }
    }
}

/// Runs server `ctx.rank` until every worker is done.
pub fn run_server(
    ctx: &ProcessContext,
    layout: &JobLayout,
    spec: &ModelSpec,
    plan: ServerPlan,
) -> Result<ServerSummary, RunError> {
    let optim = ServerOptim {
        sgd: Sgd::new(plan.optim.sgd),
        lr: plan.optim.lr,
        schedule: plan.optim.schedule,
    };
    let mut server = layout
        .server_endpoint(ctx.rank, key_infos(spec), plan.initial, optim)
        .map_err(|e| RunError::Local(e.to_string()))?;
    let mut job = layout.identity(&ctx.token, spec, &plan.weight_settings);
    if let Some(checkpoints) = &plan.checkpoint {
        job = checkpoints.fresh_identity(job);
    }
    if let Some(dir) = &plan.resume {
        let run = restore(server.as_mut(), spec, &job, ctx.rank, dir)?;
        job = job.with_run(&run);
    }
    let plan_steps = plan.steps;
    let joined = join(ctx, layout, spec.fingerprint())?;
    let (links, sockets) = (joined.links, joined.datagram_sockets);
    let emulation = layout.emulation(ctx.rank);
    let (mut comm, _waker) = CommLoop::new(links, ctx.comm.clone(), emulation, sockets)
        .map_err(|e| RunError::Local(format!("setting up the links: {e}")))?;
    let tracer = ctx.tracer();
    let checkpoints = plan.checkpoint.map(|plan| ServerCheckpointer {
        plan,
        job,
        spec: spec.clone(),
        steps: plan_steps,
    });
    let mut hooks = ServerHooks::new(layout, ctx.rank, tracer, checkpoints);
    let sampler = ctx.start_sampler(comm.traffic())?;
    comm.run(server.as_mut(), &mut hooks)?;
    crate::sampler::finish_sampler(sampler)?;
    if let (Some(t), Some(m)) = (&hooks.extras.tracer, &ctx.metrics) {
        t.write(&m.dir, &format!("server {}", ctx.rank - layout.workers))
            .map_err(|e| RunError::Local(format!("writing the trace: {e}")))?;
    }
    Ok(ServerSummary {
        rank: ctx.rank,
        updates: server.updates(),
        peak_early_values: server.peak_early_values(),
        losses: Losses {
            loss: server.loss_stats(),
            key_loss: server.key_loss(),
            datagrams: comm.datagram_report(),
        },
        links: comm
            .counters()
            .iter()
            .map(|c| (c.peer, c.sent, c.received))
            .collect(),
    })
}
