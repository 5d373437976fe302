//! Joining a job: rendezvous, then authenticated links to the peers this process needs.

use std::net::{IpAddr, Ipv4Addr, SocketAddr, TcpListener, UdpSocket};

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

/// What joining a job gives a process: its links, and its datagram sockets (one per path;
/// empty without the datagram transport).
#[derive(Debug)]
pub struct Joined {
    /// One authenticated link per peer, sorted by rank.
    pub links: Vec<Link>,
    /// Bound UDP sockets, one per path.
    pub datagram_sockets: Vec<UdpSocket>,
}

/// Binds this process's datagram sockets (none without the datagram transport) and says
/// their addresses.
fn bind_datagrams(ctx: &ProcessContext) -> Result<(Vec<UdpSocket>, Vec<SocketAddr>), JoinError> {
    let Some(options) = &ctx.comm.datagram else {
        return Ok((Vec::new(), Vec::new()));
    };
    let listen_error = |source| JoinError::Listen {
        addr: format!("UDP on {:?}", options.addrs),
        source,
    };
    let sockets = options.bind().map_err(listen_error)?;
    let addrs = (sockets.iter())
        .map(UdpSocket::local_addr)
        .collect::<Result<Vec<_>, _>>()
        .map_err(listen_error)?;
    Ok((sockets, addrs))
}

/// Rendezvous with the job and connect to every peer this rank needs.
pub fn join(
    ctx: &ProcessContext,
    layout: &JobLayout,
    fingerprint: u64,
) -> Result<Joined, JoinError> {
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
    let (datagram_sockets, datagram_addrs) = bind_datagrams(ctx)?;
    let table = register(
        ctx.coordinator,
        &ctx.token,
        &me,
        data_addr,
        &datagram_addrs,
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
    let links = connect_mesh(
        &me,
        &table,
        &layout.peers(ctx.rank),
        &data,
        &ctx.token,
        ctx.connect_timeout,
    )?;
    Ok(Joined {
        links,
        datagram_sockets,
    })
}

/// The local address that routes to `peer` (no packet is sent): the address a process
/// binds its data listener to when it is not told one.
pub fn local_ip_towards(peer: SocketAddr) -> IpAddr {
    if peer.ip().is_loopback() {
        return IpAddr::V4(Ipv4Addr::LOCALHOST);
    }
    UdpSocket::bind("0.0.0.0:0")
        .and_then(|s| s.connect(peer).and_then(|()| s.local_addr()))
        .map(|a| a.ip())
        .unwrap_or(IpAddr::V4(Ipv4Addr::UNSPECIFIED))
}
