//! A parameter-server process: one shard of the parameters, driven by the communication
//! loop until every worker has said goodbye.

use syncopate_core::strategy::{PsServer, Rank, ServerOptim};
use syncopate_core::Sgd;
use syncopate_train::model::ModelSpec;
use syncopate_train::trainer::OptimConfig;

use std::time::Instant;

use syncopate_core::wire::Header;

use crate::comm::{CommError, CommLoop, Flow, Hooks, LinkStatus};
use crate::error::RunError;
use crate::job::{key_infos, JobLayout, ProcessContext};
use crate::process::join;
use crate::trace::{frame_label, TraceRecorder, RECEIVE};

/// A server's outcome.
#[derive(Debug, Clone, serde::Serialize)]
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
}

/// A server's loop: nothing to command, done when every worker has said goodbye.
pub(crate) struct ServerHooks {
    pub(crate) layout: JobLayout,
    /// The frames' timeline, when a window of steps is recorded.
    pub(crate) tracer: Option<TraceRecorder>,
    /// Slice updates seen so far (a push that raises it applied a slice).
    pub(crate) updates: u64,
    /// The latest step a push was received for (errors name it).
    pub(crate) step: u64,
}

impl Hooks<PsServer> for ServerHooks {
    fn on_commands(&mut self, _: &mut PsServer) -> Result<Flow, CommError> {
        Ok(Flow::Continue)
    }

    fn on_progress(
        &mut self,
        server: &mut PsServer,
        status: LinkStatus,
    ) -> Result<Flow, CommError> {
        self.step = server.latest_step();
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
        server: &PsServer,
        peer: Rank,
        header: &Header,
        arrived: Instant,
        read: Instant,
        handled: Instant,
    ) {
        let applied = server.updates() > self.updates;
        self.updates = server.updates();
        let Some(t) = self.tracer.as_mut() else {
            return;
        };
        let name = format!("{} from {peer}", frame_label(header));
        if applied {
            // The last push of a slice: aggregate, optimizer, replies queued.
            t.span_on(RECEIVE, header.step, "receive", &name, arrived, read);
            let name = format!("apply k{} @{}+{}", header.key, header.offset, header.length);
            t.span_on(RECEIVE, header.step, "apply", &name, read, handled);
        } else {
            t.span_on(RECEIVE, header.step, "receive", &name, arrived, handled);
        }
    }
}

/// Runs server `ctx.rank` until every worker is done.
pub fn run_server(
    ctx: &ProcessContext,
    layout: &JobLayout,
    spec: &ModelSpec,
    initial: Vec<Vec<f32>>,
    optim: OptimConfig,
) -> Result<ServerSummary, RunError> {
    let optim = ServerOptim {
        sgd: Sgd::new(optim.sgd),
        lr: optim.lr,
        schedule: optim.schedule,
    };
    let mut server = layout
        .server_endpoint(ctx.rank, key_infos(spec), initial, optim)
        .map_err(|e| RunError::Local(e.to_string()))?;
    let links = join(ctx, layout, spec.fingerprint())?;
    let (mut comm, _waker) = CommLoop::new(links, ctx.comm.clone(), layout.emulation(ctx.rank))
        .map_err(|e| RunError::Local(format!("setting up the links: {e}")))?;
    let mut hooks = ServerHooks {
        layout: layout.clone(),
        tracer: ctx
            .metrics
            .as_ref()
            .and_then(|m| m.trace_steps.clone())
            .map(|window| TraceRecorder::new(ctx.rank, window)),
        updates: 0,
        step: 0,
    };
    let sampler = ctx.start_sampler(comm.traffic())?;
    comm.run(&mut server, &mut hooks)?;
    crate::job::finish_sampler(sampler)?;
    if let (Some(t), Some(m)) = (&hooks.tracer, &ctx.metrics) {
        t.write(&m.dir, &format!("server {}", ctx.rank - layout.workers))
            .map_err(|e| RunError::Local(format!("writing the trace: {e}")))?;
    }
    Ok(ServerSummary {
        rank: ctx.rank,
        updates: server.updates(),
        peak_early_values: server.peak_early_values(),
        links: comm
            .counters()
            .iter()
            .map(|c| (c.peer, c.sent, c.received))
            .collect(),
    })
}
