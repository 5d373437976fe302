//! A parameter-server process: one shard of the parameters, driven by the communication
//! loop until every worker has said goodbye.

use syncopate_core::registry::KeyInfo;
use syncopate_core::strategy::{PsServer, Rank, ServerOptim};
use syncopate_core::Sgd;
use syncopate_train::model::ModelSpec;
use syncopate_train::trainer::OptimConfig;

use crate::comm::{CommError, CommLoop, Flow, Hooks, LinkStatus};
use crate::error::RunError;
use crate::job::{key_infos, JobLayout, ProcessContext};
use crate::process::join;

/// A server's outcome.
#[derive(Debug, Clone, serde::Serialize)]
pub struct ServerSummary {
    /// This server's rank.
    pub rank: Rank,
    /// Slice updates applied.
    pub updates: u64,
    /// Bytes per link: `(peer, sent, received)`.
    pub links: Vec<(Rank, u64, u64)>,
}

/// A server's loop: nothing to command, done when every worker has said goodbye.
pub(crate) struct ServerHooks {
    pub(crate) layout: JobLayout,
}

impl Hooks<PsServer> for ServerHooks {
    fn on_commands(&mut self, _: &mut PsServer) -> Result<Flow, CommError> {
        Ok(Flow::Continue)
    }

    fn on_progress(&mut self, _: &mut PsServer, status: LinkStatus) -> Result<Flow, CommError> {
        Ok(if status.goodbyes == status.links {
            Flow::Finish
        } else {
            Flow::Continue
        })
    }

    fn step(&self) -> u64 {
        0
    }

    fn describe(&self, rank: Rank) -> String {
        self.layout.describe(rank)
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
    let keys: Vec<KeyInfo> = key_infos(spec);
    let index = ctx
        .rank
        .checked_sub(layout.workers)
        .ok_or_else(|| RunError::Local(format!("rank {} is a worker rank", ctx.rank)))?;
    let mut server = PsServer::new(
        index,
        layout.workers,
        layout.registry(keys),
        initial,
        ServerOptim {
            sgd: Sgd::new(optim.sgd),
            lr: optim.lr,
            schedule: optim.schedule,
        },
        layout.scheduler,
    );
    let links = join(ctx, layout, spec.fingerprint())?;
    let (mut comm, _waker) = CommLoop::new(links, ctx.comm.clone(), layout.network)
        .map_err(|e| RunError::Local(format!("setting up the links: {e}")))?;
    let mut hooks = ServerHooks {
        layout: layout.clone(),
    };
    let sampler = ctx.start_sampler(comm.traffic())?;
    comm.run(&mut server, &mut hooks)?;
    crate::job::finish_sampler(sampler)?;
    Ok(ServerSummary {
        rank: ctx.rank,
        updates: server.updates(),
        links: comm
            .counters()
            .iter()
            .map(|c| (c.peer, c.sent, c.received))
            .collect(),
    })
}
