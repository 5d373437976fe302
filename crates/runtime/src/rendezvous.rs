//! Rendezvous and mesh: how the processes of a job find and connect to each other.
//!
//! 1. One process (rank 0 of the job, on a thread of its own) runs [`serve_coordinator`]
//!    on a known address. Every process binds its data listener first, then calls
//!    [`register`] with that listener's address; the coordinator authenticates each one
//!    ([`crate::auth::handshake`]), collects `world_size` registrations and sends everyone
//!    the same table of [`Member`]s.
//! 2. Each process calls [`connect_mesh`] with the ranks it needs a link to. For every
//!    pair the higher rank dials the lower rank's data address and both authenticate again,
//!    so a link is only ever made between two holders of the job token.
//!
//! A slow or hostile connection never blocks the others: every accepted connection is
//! handshaken on its own thread (at most 64 at once), cut off if it has not authenticated
//! and registered within 5 s, and everything is bounded by the caller's timeout. Nothing a
//! connection that never authenticates sends can grow this process's memory: handshake
//! frames are read under tight bounds ([`crate::frame_io::recv_unauthenticated`]), and of
//! the connections that fail only a count and the first and last few, each cut to a short
//! text, are kept ([`FAILURES_KEPT`], [`FAILURE_TEXT_MAX`]).

use std::collections::btree_map::Entry;
use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::io;
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::{mpsc, Arc};
use std::thread;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use crate::auth::{compat_mismatch, handshake, AuthError, JobToken, PeerInfo, Role, Session};
use crate::comm::Link;
use crate::frame_io::{printable_prefix, recv_control, send_abort, send_control, FrameIoError};

/// How often the accept loop polls its listener while idle.
const POLL: Duration = Duration::from_millis(10);
/// How long one connection may take to authenticate and register (never more than the
/// caller's timeout): a peer that trickles its bytes is cut off then, not at the end of the
/// whole rendezvous.
const ADMISSION_DEADLINE: Duration = Duration::from_secs(5);
/// Connections handshaken at once; more wait in the listener's backlog.
const MAX_ADMISSIONS: usize = 64;
/// Pause between attempts to reach a peer that is not listening yet.
const RETRY: Duration = Duration::from_millis(100);
/// Failed connections remembered at each end of a rendezvous (the first and the last
/// this many); the others are only counted.
pub const FAILURES_KEPT: usize = 4;
/// Longest text kept of one failed connection; longer ones are cut.
pub const FAILURE_TEXT_MAX: usize = 512;

/// One process of the job as listed in the rendezvous table.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
pub struct Member {
    /// Rank in the job.
    pub rank: usize,
    /// What the process is.
    pub role: Role,
    /// Where its data listener accepts links.
    pub data_addr: SocketAddr,
    /// Where its datagram sockets receive, one per path (empty: it sends no datagrams).
    #[serde(default)]
    pub datagram_addrs: Vec<SocketAddr>,
}

/// A member's registration, sent right after its handshake with the coordinator.
#[derive(Serialize, Deserialize, Debug)]
struct Register {
    rank: usize,
    role: Role,
    data_addr: SocketAddr,
    #[serde(default)]
    datagram_addrs: Vec<SocketAddr>,
}

/// The coordinator's answer: every member, sorted by rank.
#[derive(Serialize, Deserialize, Debug)]
struct Table {
    members: Vec<Member>,
}

/// Why the rendezvous or the mesh could not be completed.
#[derive(Debug, thiserror::Error)]
pub enum RendezvousError {
    /// A local socket operation failed.
    #[error("{context}: {source}")]
    Io {
        /// What was being done.
        context: String,
        /// The I/O error.
        source: io::Error,
    },
    /// Not everyone showed up in time.
    #[error(
        "{who} timed out after {waited:.1?} waiting for {what} from ranks {missing:?}{}",
        failures_suffix(.failures)
    )]
    Timeout {
        /// Who was waiting ("the coordinator", "rank 2 (worker)").
        who: String,
        /// What it waited for ("registrations", "links").
        what: &'static str,
        /// How long it waited.
        waited: Duration,
        /// Ranks that never arrived.
        missing: Vec<usize>,
        /// Connections that failed or were refused meanwhile.
        failures: Vec<String>,
    },
    /// A peer could not be reached.
    #[error("could not connect to {peer} within {waited:.1?}: {source}")]
    Unreachable {
        /// Who ("the coordinator at ...", "rank 1 at ...").
        peer: String,
        /// How long we tried.
        waited: Duration,
        /// The last connection error.
        source: io::Error,
    },
    /// The handshake with a peer failed: authentication, compatibility or protocol.
    #[error("handshake with {peer} failed: {source}")]
    Handshake {
        /// Who ("the coordinator at ...", "rank 1 at ...").
        peer: String,
        /// Why.
        source: AuthError,
    },
    /// A message exchange after the handshake failed (including an abort by the peer).
    #[error("rendezvous with {peer} failed: {source}")]
    Exchange {
        /// Who.
        peer: String,
        /// Why.
        source: FrameIoError,
    },
    /// The peer gave up on us (sent an Abort) and said why.
    #[error("refused by {by}: {reason}")]
    Refused {
        /// Who ("the coordinator at ...").
        by: String,
        /// The reason it gave.
        reason: String,
    },
    /// The arguments, or a table or identity received, make no sense.
    #[error("{0}")]
    Invalid(String),
}

/// `timeout` from now (or a year from now, should `timeout` be absurdly long).
fn deadline_after(timeout: Duration) -> Instant {
    let now = Instant::now();
    now.checked_add(timeout)
        .unwrap_or_else(|| now + Duration::from_secs(365 * 24 * 3600))
}

/// Socket timeouts must not be zero.
fn nonzero(timeout: Duration) -> Duration {
    timeout.max(Duration::from_millis(1))
}

fn failures_suffix(failures: &[String]) -> String {
    if failures.is_empty() {
        String::new()
    } else {
        format!("; failed connections: {}", failures.join("; "))
    }
}

fn io_error(context: impl Into<String>) -> impl FnOnce(io::Error) -> RendezvousError {
    let context = context.into();
    move |source| RendezvousError::Io { context, source }
}

/// Serves the rendezvous: admits `world_size` members and sends each the table.
///
/// Connections that fail the handshake, or whose registration is refused (rank out of
/// range, rank already taken, rank or role differing from the handshake, model or strategy
/// differing from members already registered), get an Abort with the reason and are
/// dropped; the coordinator keeps waiting for the rightful members. If they are not all
/// there within `timeout`, every registered member is sent an Abort and the error names
/// the missing ranks and the connections that failed.
pub fn serve_coordinator(
    listener: TcpListener,
    token: &JobToken,
    info: &PeerInfo,
    world_size: usize,
    timeout: Duration,
) -> Result<Vec<Member>, RendezvousError> {
    if world_size == 0 {
        return Err(RendezvousError::Invalid(
            "a job needs at least one process".into(),
        ));
    }
    let deadline = deadline_after(timeout);
    let admit = {
        let (token, info) = (token.clone(), info.clone());
        move |stream, addr| admit_registration(stream, addr, &token, &info, timeout)
    };
    let mut registered = BTreeMap::new();
    let mut failures = FailureLog::default();
    let take = |r: Registration| {
        let rank = r.register.rank;
        enroll(r, &mut registered, world_size)?;
        tracing::debug!("rendezvous: rank {rank} registered");
        Ok(registered.len() == world_size)
    };
    let complete = accept_until(&listener, deadline, admit, take, &mut failures)?;
    if !complete {
        let missing: Vec<usize> = (0..world_size)
            .filter(|r| !registered.contains_key(r))
            .collect();
        let reason = format!("rendezvous timed out: ranks {missing:?} never registered");
        for r in registered.values_mut() {
            send_abort(&mut r.stream, &reason);
        }
        return Err(RendezvousError::Timeout {
            who: "the coordinator".into(),
            what: "registrations",
            waited: timeout,
            missing,
            failures: failures.into_list(),
        });
    }
    broadcast_table(registered)
}

/// An authenticated connection and what it registered as.
struct Registration {
    stream: TcpStream,
    addr: SocketAddr,
    info: PeerInfo,
    register: Register,
}

/// Handshakes a new connection and reads its registration (runs on its own thread).
fn admit_registration(
    mut stream: TcpStream,
    addr: SocketAddr,
    token: &JobToken,
    me: &PeerInfo,
    timeout: Duration,
) -> Result<Registration, String> {
    let info = handshake(&mut stream, token, me, false, timeout)
        .map_err(|e| e.to_string())?
        .peer;
    let who = format!("{} at {addr}", info.describe());
    stream
        .set_read_timeout(Some(nonzero(timeout)))
        .map_err(|e| format!("{who}: {e}"))?;
    let register: Register =
        recv_control(&mut stream).map_err(|e| format!("{who}: no registration: {e}"))?;
    stream
        .set_read_timeout(None)
        .map_err(|e| format!("{who}: {e}"))?;
    Ok(Registration {
        stream,
        addr,
        info,
        register,
    })
}

/// Adds a registration to the table, or refuses it (Abort sent) with the reason.
fn enroll(
    mut r: Registration,
    registered: &mut BTreeMap<usize, Registration>,
    world_size: usize,
) -> Result<(), String> {
    if let Err(reason) = check_registration(&r, registered, world_size) {
        send_abort(&mut r.stream, &reason);
        return Err(format!("{} at {}: {reason}", r.info.describe(), r.addr));
    }
    if r.register.data_addr.ip().is_unspecified() {
        // Bound to 0.0.0.0 / [::]: peers reach it at the address it connected from.
        r.register.data_addr.set_ip(r.addr.ip());
    }
    for a in &mut r.register.datagram_addrs {
        if a.ip().is_unspecified() {
            a.set_ip(r.addr.ip());
        }
    }
    registered.insert(r.register.rank, r);
    Ok(())
}

fn check_registration(
    r: &Registration,
    registered: &BTreeMap<usize, Registration>,
    world_size: usize,
) -> Result<(), String> {
    let (reg, info) = (&r.register, &r.info);
    if reg.rank >= world_size {
        return Err(format!(
            "rank {} is out of range for a job of {world_size} processes",
            reg.rank
        ));
    }
    if reg.rank != info.rank || reg.role != info.role {
        return Err(format!(
            "registration as rank {} ({}) contradicts the handshake's {}",
            reg.rank,
            reg.role,
            info.describe()
        ));
    }
    if reg.datagram_addrs.len() > syncopate_core::net::MAX_PATHS {
        return Err(format!(
            "rank {} registered {} datagram addresses (at most one per path, {} paths)",
            reg.rank,
            reg.datagram_addrs.len(),
            syncopate_core::net::MAX_PATHS
        ));
    }
    if let Some(other) = registered.get(&reg.rank) {
        return Err(format!(
            "rank {} is already registered (from {})",
            reg.rank, other.addr
        ));
    }
    // Members never handshake with each other here, so check them against one another.
    let reference = registered.values().find(|o| o.info.role.carries_model());
    let mismatch =
        reference.and_then(|o| compat_mismatch(&o.info, &format!("{}'s", o.info.describe()), info));
    mismatch.map_or(Ok(()), Err)
}

/// Sends the table to every member; returns it, or the first member that could not get it.
fn broadcast_table(
    registered: BTreeMap<usize, Registration>,
) -> Result<Vec<Member>, RendezvousError> {
    let members: Vec<Member> = registered
        .values()
        .map(|r| Member {
            rank: r.register.rank,
            role: r.register.role,
            data_addr: r.register.data_addr,
            datagram_addrs: r.register.datagram_addrs.clone(),
        })
        .collect();
    let table = Table {
        members: members.clone(),
    };
    let mut first_error = None;
    for (rank, mut r) in registered {
        if let Err(source) = send_control(&mut r.stream, &table) {
            tracing::warn!("rendezvous: could not send the table to rank {rank}: {source}");
            first_error.get_or_insert(RendezvousError::Exchange {
                peer: format!("rank {rank} at {}", r.addr),
                source,
            });
        }
    }
    first_error.map_or(Ok(members), Err)
}

/// Registers with the coordinator and waits for the table of all members.
///
/// Connection attempts are retried for up to `timeout` (the coordinator may not be up
/// yet); the table is then awaited for up to `timeout` again, since it only comes once
/// every member has registered.
pub fn register(
    coordinator: SocketAddr,
    token: &JobToken,
    me: &PeerInfo,
    data_addr: SocketAddr,
    datagram_addrs: &[SocketAddr],
    timeout: Duration,
) -> Result<Vec<Member>, RendezvousError> {
    let peer = format!("the coordinator at {coordinator}");
    let mut stream = connect_with_retry(coordinator, &peer, deadline_after(timeout))?;
    handshake(&mut stream, token, me, true, timeout).map_err(|source| {
        RendezvousError::Handshake {
            peer: peer.clone(),
            source,
        }
    })?;
    let exchange = |source| match source {
        FrameIoError::PeerAborted(reason) => RendezvousError::Refused {
            by: peer.clone(),
            reason,
        },
        source => RendezvousError::Exchange {
            peer: peer.clone(),
            source,
        },
    };
    let register = Register {
        rank: me.rank,
        role: me.role,
        data_addr,
        datagram_addrs: datagram_addrs.to_vec(),
    };
    send_control(&mut stream, &register).map_err(exchange)?;
    stream
        .set_read_timeout(Some(nonzero(timeout)))
        .map_err(io_error("cannot set the rendezvous timeout"))?;
    let table: Table = recv_control(&mut stream).map_err(exchange)?;
    check_table(&table.members, me)?;
    Ok(table.members)
}

/// Checks that a received table is sorted by rank without duplicates and lists us.
fn check_table(members: &[Member], me: &PeerInfo) -> Result<(), RendezvousError> {
    let sorted = members.windows(2).all(|w| w[0].rank < w[1].rank);
    let listed = members
        .iter()
        .any(|m| m.rank == me.rank && m.role == me.role);
    if sorted && listed {
        return Ok(());
    }
    Err(RendezvousError::Invalid(format!(
        "the coordinator's table is malformed (sorted without duplicates: {sorted}, lists {}: {listed})",
        me.describe()
    )))
}

/// Connects to `addr`, retrying until `deadline` while nobody listens there.
fn connect_with_retry(
    addr: SocketAddr,
    peer: &str,
    deadline: Instant,
) -> Result<TcpStream, RendezvousError> {
    let start = Instant::now();
    loop {
        let remaining = deadline.saturating_duration_since(Instant::now());
        let attempt = remaining.clamp(Duration::from_millis(1), Duration::from_secs(5));
        let source = match TcpStream::connect_timeout(&addr, attempt) {
            Ok(stream) => return Ok(stream),
            Err(e) => e,
        };
        let remaining = deadline.saturating_duration_since(Instant::now());
        if remaining.is_zero() {
            return Err(RendezvousError::Unreachable {
                peer: peer.to_owned(),
                waited: start.elapsed(),
                source,
            });
        }
        tracing::debug!("{peer} not reachable yet ({source}); retrying");
        thread::sleep(RETRY.min(remaining));
    }
}

/// Builds this process's links: returns one authenticated link per rank in `peers`,
/// sorted by rank, with `TCP_NODELAY` set and the frame keys its handshake derived.
///
/// For each pair the higher rank dials the lower rank's `data_addr` and the lower rank
/// accepts on `listener` (left in blocking mode afterwards), so links must be symmetric:
/// if A lists B, B must list A. The accepting side learns who dialled from the handshake
/// and refuses ranks it does not expect. Errors name the rank that failed.
pub fn connect_mesh(
    me: &PeerInfo,
    table: &[Member],
    peers: &[usize],
    listener: &TcpListener,
    token: &JobToken,
    timeout: Duration,
) -> Result<Vec<Link>, RendezvousError> {
    let deadline = deadline_after(timeout);
    let wanted = wanted_members(me, table, peers)?;
    let (lower, higher): (Vec<Member>, Vec<Member>) =
        wanted.into_iter().partition(|m| m.rank < me.rank);
    // Dial first, then accept: a rank only dials ranks below it, and rank 0 dials nobody,
    // so every dial eventually meets an accepting peer.
    let mut links = Vec::with_capacity(lower.len() + higher.len());
    for m in &lower {
        links.push(dial(me, m, token, deadline)?);
    }
    links.extend(accept_links(
        me, &higher, listener, token, deadline, timeout,
    )?);
    links.sort_by_key(|link| link.peer);
    Ok(links)
}

/// Looks up `peers` in the table (deduplicated), refusing ourselves and unknown ranks.
fn wanted_members(
    me: &PeerInfo,
    table: &[Member],
    peers: &[usize],
) -> Result<Vec<Member>, RendezvousError> {
    let unique: BTreeSet<usize> = peers.iter().copied().collect();
    unique
        .into_iter()
        .map(|rank| {
            if rank == me.rank {
                return Err(RendezvousError::Invalid(format!(
                    "rank {rank} cannot link to itself"
                )));
            }
            table
                .iter()
                .find(|m| m.rank == rank)
                .cloned()
                .ok_or_else(|| {
                    RendezvousError::Invalid(format!("rank {rank} is not in the rendezvous table"))
                })
        })
        .collect()
}

/// Dials a lower rank and authenticates it as the member the table says.
fn dial(
    me: &PeerInfo,
    m: &Member,
    token: &JobToken,
    deadline: Instant,
) -> Result<Link, RendezvousError> {
    let peer = format!("rank {} at {}", m.rank, m.data_addr);
    let mut stream = connect_with_retry(m.data_addr, &peer, deadline)?;
    let remaining = deadline.saturating_duration_since(Instant::now());
    let Session { peer: info, keys } =
        handshake(&mut stream, token, me, true, remaining).map_err(|source| {
            RendezvousError::Handshake {
                peer: peer.clone(),
                source,
            }
        })?;
    if info.rank != m.rank || info.role != m.role {
        let reason = format!(
            "{} answered at the address of rank {} ({})",
            info.describe(),
            m.rank,
            m.role
        );
        send_abort(&mut stream, &reason);
        return Err(RendezvousError::Invalid(reason));
    }
    stream.set_nodelay(true).map_err(io_error(format!(
        "cannot set TCP_NODELAY on the link to {peer}"
    )))?;
    Ok(Link {
        peer: m.rank,
        stream,
        keys,
        datagram_addrs: m.datagram_addrs.clone(),
    })
}

/// Accepts the links from the higher ranks in `expected`.
fn accept_links(
    me: &PeerInfo,
    expected: &[Member],
    listener: &TcpListener,
    token: &JobToken,
    deadline: Instant,
    timeout: Duration,
) -> Result<Vec<Link>, RendezvousError> {
    if expected.is_empty() {
        return Ok(Vec::new());
    }
    let admit = {
        let (token, me) = (token.clone(), me.clone());
        move |mut stream: TcpStream, addr: SocketAddr| {
            let remaining = deadline.saturating_duration_since(Instant::now());
            let session =
                handshake(&mut stream, &token, &me, false, remaining).map_err(|e| e.to_string())?;
            Ok((stream, addr, session))
        }
    };
    let mut links: BTreeMap<usize, Link> = BTreeMap::new();
    let take = |(stream, addr, session): (TcpStream, SocketAddr, Session)| {
        keep_link(stream, addr, session, me, expected, &mut links)?;
        Ok(links.len() == expected.len())
    };
    let mut failures = FailureLog::default();
    let complete = accept_until(listener, deadline, admit, take, &mut failures)?;
    if !complete {
        return Err(RendezvousError::Timeout {
            who: me.describe(),
            what: "links",
            waited: timeout,
            missing: expected
                .iter()
                .map(|m| m.rank)
                .filter(|r| !links.contains_key(r))
                .collect(),
            failures: failures.into_list(),
        });
    }
    Ok(links.into_values().collect())
}

/// Keeps an accepted link if its rank is expected and not linked yet, else refuses it.
fn keep_link(
    mut stream: TcpStream,
    addr: SocketAddr,
    session: Session,
    me: &PeerInfo,
    expected: &[Member],
    links: &mut BTreeMap<usize, Link>,
) -> Result<(), String> {
    let info = &session.peer;
    let known = expected
        .iter()
        .find(|m| m.rank == info.rank && m.role == info.role);
    let reason = match (links.entry(info.rank), known) {
        (_, None) => "is not expected to link to",
        (Entry::Occupied(_), _) => "is already linked to",
        (Entry::Vacant(slot), Some(member)) => {
            stream
                .set_nodelay(true)
                .map_err(|e| format!("{} at {addr}: {e}", info.describe()))?;
            slot.insert(Link {
                peer: info.rank,
                stream,
                keys: session.keys,
                datagram_addrs: member.datagram_addrs.clone(),
            });
            return Ok(());
        }
    };
    let reason = format!("{} {reason} {}", info.describe(), me.describe());
    send_abort(&mut stream, &reason);
    Err(format!("{addr}: {reason}"))
}

/// Accepts connections until `take` reports it has everything (`Ok(true)`) or `deadline`
/// passes (`Ok(false)`).
///
/// Each connection is admitted by `admit` (the handshake) on its own thread, so a slow or
/// hostile peer delays nobody; admitted connections are handed to `take` on this thread.
/// Failed admissions and refusals by `take` are logged and noted in `failures`.
fn accept_until<T, A, K>(
    listener: &TcpListener,
    deadline: Instant,
    admit: A,
    mut take: K,
    failures: &mut FailureLog,
) -> Result<bool, RendezvousError>
where
    T: Send + 'static,
    A: Fn(TcpStream, SocketAddr) -> Result<T, String> + Send + Sync + 'static,
    K: FnMut(T) -> Result<bool, String>,
{
    listener
        .set_nonblocking(true)
        .map_err(io_error("cannot poll the listener"))?;
    let admit = Arc::new(admit);
    let (tx, rx) = mpsc::channel();
    let mut admitting: Vec<Admission> = Vec::new();
    let outcome = loop {
        admitting.retain(|a| !a.thread.is_finished());
        let expired = |a: &&Admission| Instant::now() >= a.deadline && !a.thread.is_finished();
        for a in admitting.iter().filter(expired) {
            // The blocked read fails, and the thread ends.
            let _ = a.stream.shutdown(std::net::Shutdown::Both);
            failures.note(&format!(
                "{}: not authenticated and registered within {:.0} s; cut off",
                a.addr,
                a.allowed.as_secs_f64()
            ));
        }
        admitting.retain(|a| Instant::now() < a.deadline);
        while admitting.len() < MAX_ADMISSIONS {
            match accept_one(listener, &admit, &tx, deadline) {
                Some(a) => admitting.push(a),
                None => break,
            }
        }
        match rx.recv_timeout(POLL) {
            Ok(Ok(item)) => match take(item) {
                Ok(true) => break true,
                Ok(false) => {}
                Err(refusal) => failures.note(&refusal),
            },
            Ok(Err(failure)) => failures.note(&failure),
            Err(_) => {}
        }
        if Instant::now() >= deadline {
            break false;
        }
    };
    listener
        .set_nonblocking(false)
        .map_err(io_error("cannot restore the listener to blocking mode"))?;
    Ok(outcome)
}

/// A connection being authenticated on its own thread.
struct Admission {
    addr: SocketAddr,
    /// A handle on the connection, to cut it off.
    stream: TcpStream,
    thread: thread::JoinHandle<()>,
    deadline: Instant,
    allowed: Duration,
}

type Admitted<T> = Result<T, String>;

/// Accepts one pending connection, if any, and admits it on a new thread, which gets until
/// [`ADMISSION_DEADLINE`] (or the rendezvous' end, if sooner).
fn accept_one<T, A>(
    listener: &TcpListener,
    admit: &Arc<A>,
    tx: &mpsc::Sender<Admitted<T>>,
    rendezvous_end: Instant,
) -> Option<Admission>
where
    T: Send + 'static,
    A: Fn(TcpStream, SocketAddr) -> Admitted<T> + Send + Sync + 'static,
{
    let (stream, addr) = match listener.accept() {
        Ok(pair) => pair,
        Err(e) if e.kind() == io::ErrorKind::WouldBlock => return None,
        Err(e) => {
            tracing::warn!("accept failed: {e}");
            return None;
        }
    };
    let handle = match stream.try_clone() {
        Ok(h) => h,
        Err(e) => {
            tracing::warn!("cannot keep a handle on the connection from {addr}: {e}");
            return None;
        }
    };
    let (admit, tx) = (Arc::clone(admit), tx.clone());
    let spawned = thread::Builder::new()
        .name(format!("admit {addr}"))
        .spawn(move || {
            let result = stream
                .set_nonblocking(false)
                .map_err(|e| format!("{addr}: {e}"))
                .and_then(|()| admit(stream, addr));
            // The receiver is gone once the rendezvous is over; the connection is dropped.
            let _ = tx.send(result);
        });
    match spawned {
        Ok(thread) => {
            let now = Instant::now();
            let deadline = (now + ADMISSION_DEADLINE).min(rendezvous_end);
            Some(Admission {
                addr,
                stream: handle,
                thread,
                deadline,
                allowed: deadline.saturating_duration_since(now),
            })
        }
        Err(e) => {
            tracing::warn!("cannot start a thread for the connection from {addr}: {e}");
            None
        }
    }
}

/// The connections that failed during a rendezvous, in bounded memory: how many, and the
/// first and last [`FAILURES_KEPT`], each cut to [`FAILURE_TEXT_MAX`] bytes.
#[derive(Debug, Default)]
struct FailureLog {
    count: usize,
    first: Vec<String>,
    last: VecDeque<String>,
}

impl FailureLog {
    /// Logs `failure` and remembers it if it is among the first or the last few.
    fn note(&mut self, failure: &str) {
        let text = printable_prefix(failure.as_bytes(), FAILURE_TEXT_MAX);
        tracing::warn!("rendezvous: {text}");
        self.count = self.count.saturating_add(1);
        if self.first.len() < FAILURES_KEPT {
            self.first.push(text);
            return;
        }
        if self.last.len() == FAILURES_KEPT {
            self.last.pop_front();
        }
        self.last.push_back(text);
    }

    /// The failures kept, oldest first, with a line saying how many were left out.
    fn into_list(self) -> Vec<String> {
        let left_out = (self.count)
            .saturating_sub(self.first.len())
            .saturating_sub(self.last.len());
        let mut list = self.first;
        if left_out > 0 {
            list.push(format!("{left_out} more not shown"));
        }
        list.extend(self.last);
        list
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_failure_log_keeps_a_count_and_the_first_and_last_few_cut_short() {
        let mut log = FailureLog::default();
        for i in 0..1000 {
            log.note(&format!("connection {i}: {}", "z".repeat(1 << 20)));
        }
        let list = log.into_list();
        assert_eq!(list.len(), 2 * FAILURES_KEPT + 1, "{list:?}");
        assert!(list[0].starts_with("connection 0:"));
        assert_eq!(
            list[FAILURES_KEPT],
            format!("{} more not shown", 1000 - 2 * FAILURES_KEPT)
        );
        assert!(list[2 * FAILURES_KEPT].starts_with("connection 999:"));
        assert!(list.iter().all(|f| f.len() <= FAILURE_TEXT_MAX + 32));
    }

    #[test]
    fn a_short_failure_log_is_kept_whole() {
        let mut log = FailureLog::default();
        (0..FAILURES_KEPT + 2).for_each(|i| log.note(&i.to_string()));
        let list = log.into_list();
        let want: Vec<String> = (0..FAILURES_KEPT + 2).map(|i| i.to_string()).collect();
        assert_eq!(list, want);
    }
}
