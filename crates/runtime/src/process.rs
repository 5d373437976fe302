//! Joining a job: rendezvous, then authenticated links to the peers this process needs.

use std::net::TcpListener;

use crate::auth::{PeerInfo, Role};
use crate::comm::Link;
use crate::job::{JobLayout, ProcessContext};
use crate::rendezvous::{connect_mesh, register, serve_coordinator, RendezvousError};

/// Failure to join the job.
#[derive(Debug, thiserror::Error)]
pub enum JoinError {
    /// A socket could not be opened.
    #[error("cannot listen on {addr}: {source}")]
    Listen {
        /// Address tried.
        addr: String,
        /// Why.
        source: std::io::Error,
    },
    /// The rendezvous or a link failed.
    #[error(transparent)]
    Rendezvous(#[from] RendezvousError),
    /// The hosted coordinator failed.
    #[error("the rendezvous hosted by this process failed: {0}")]
    Coordinator(String),
}

/// This process's handshake identity.
pub fn peer_info(ctx: &ProcessContext, layout: &JobLayout, fingerprint: u64) -> PeerInfo {
    let role = if ctx.rank < layout.workers {
        Role::Worker
    } else {
        Role::Server
    };
    PeerInfo::new(
        ctx.rank,
        role,
        fingerprint,
        &layout.sync_descriptor(),
        layout.workers,
        layout.servers,
    )
    .with_frame_mac(ctx.comm.frame_mac)
}

/// Rendezvous with the job and connect to every peer this rank needs.
pub fn join(
    ctx: &ProcessContext,
    layout: &JobLayout,
    fingerprint: u64,
) -> Result<Vec<Link>, JoinError> {
    let me = peer_info(ctx, layout, fingerprint);
    let coordinator = if ctx.host_coordinator {
        let listener = TcpListener::bind(ctx.coordinator).map_err(|source| JoinError::Listen {
            addr: ctx.coordinator.to_string(),
            source,
        })?;
        let token = ctx.token.clone();
        let info = PeerInfo::new(
            ctx.rank,
            Role::Coordinator,
            0,
            "",
            layout.workers,
            layout.servers,
        );
        let world = layout.world_size();
        let timeout = ctx.connect_timeout;
        Some(std::thread::spawn(move || {
            serve_coordinator(listener, &token, &info, world, timeout)
        }))
    } else {
        None
    };
    let data = TcpListener::bind((ctx.bind_ip, 0)).map_err(|source| JoinError::Listen {
        addr: format!("{}:0", ctx.bind_ip),
        source,
    })?;
    let data_addr = data.local_addr().map_err(|source| JoinError::Listen {
        addr: format!("{}:0", ctx.bind_ip),
        source,
    })?;
    let table = register(
        ctx.coordinator,
        &ctx.token,
        &me,
        data_addr,
        ctx.connect_timeout,
    );
    if let Some(handle) = coordinator {
        match handle.join() {
            Ok(Ok(_)) => {}
            Ok(Err(e)) => return Err(JoinError::Coordinator(e.to_string())),
            Err(_) => {
                return Err(JoinError::Coordinator(
                    "the coordinator thread panicked".into(),
                ))
            }
        }
    }
    let table = table?;
    Ok(connect_mesh(
        &me,
        &table,
        &layout.peers(ctx.rank),
        &data,
        &ctx.token,
        ctx.connect_timeout,
    )?)
}
