//! The job token and the mutual challenge-response done on every connection.
//!
//! Every process of a job holds the same secret 32-byte [`JobToken`]. Before any other
//! frame, the two ends of a connection prove to each other that they hold it, without
//! sending it, with HMAC-SHA256 over fresh nonces from both sides:
//!
//! ```text
//! initiator -> acceptor   Hello { info_i, nonce_i }
//! acceptor  -> initiator  Hello { info_a, nonce_a,
//!                                 mac_a = HMAC(token, "syncopate-v1 acceptor"  || nonce_i || nonce_a || json(info_a)) }
//! initiator -> acceptor   Proof { mac_i = HMAC(token, "syncopate-v1 initiator" || nonce_a || nonce_i || json(info_i)) }
//! acceptor  -> initiator  Accepted
//! ```
//!
//! Once a side has authenticated its peer it checks that the two can work together
//! ([`check_compatible`]). A side that refuses sends an Abort frame with the reason and
//! returns an error; the other side reports that reason as [`AuthError::Refused`], so both
//! ends say why.
//!
//! A handshake also gives both ends the connection's frame keys ([`Session::keys`]), one
//! per direction, for the per-frame MACs of [`syncopate_core::wire::mac`]:
//!
//! ```text
//! key(initiator -> acceptor) = HMAC(token, "syncopate-v1 frames initiator->acceptor" || nonce_i || nonce_a)
//! key(acceptor -> initiator) = HMAC(token, "syncopate-v1 frames acceptor->initiator" || nonce_i || nonce_a)
//! ```
//!
//! Fresh nonces make the keys of every connection new; only holders of the token can
//! compute them, and since these labels differ from the handshake's within their first 14
//! bytes, no key is ever one of the MACs sent on the wire.

use std::fmt;
use std::io;
use std::net::TcpStream;
use std::path::Path;
use std::time::Duration;

use hmac::{Hmac, Mac};
use rand::RngCore;
use serde::{Deserialize, Serialize};
use sha2::Sha256;
use syncopate_core::wire::mac::{FrameKey, LinkKeys};
use syncopate_core::wire::VERSION;

use crate::frame_io::{recv_unauthenticated, send_abort, send_control, FrameIoError};

/// Environment variable holding the job token as 64 hex digits.
pub const TOKEN_ENV: &str = "SYNCOPATE_TOKEN";
/// Environment variable naming a file that holds the job token.
pub const TOKEN_FILE_ENV: &str = "SYNCOPATE_TOKEN_FILE";

const ACCEPTOR_LABEL: &[u8] = b"syncopate-v1 acceptor";
const INITIATOR_LABEL: &[u8] = b"syncopate-v1 initiator";
const FRAMES_FROM_INITIATOR_LABEL: &[u8] = b"syncopate-v1 frames initiator->acceptor";
const FRAMES_FROM_ACCEPTOR_LABEL: &[u8] = b"syncopate-v1 frames acceptor->initiator";

type HmacSha256 = Hmac<Sha256>;

/// The job's shared secret: 32 random bytes, written as 64 hex digits.
#[derive(Clone)]
pub struct JobToken([u8; 32]);

impl fmt::Debug for JobToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("JobToken(<redacted>)")
    }
}

impl JobToken {
    /// A fresh token from the operating system's random source.
    pub fn generate() -> Self {
        let mut bytes = [0u8; 32];
        rand::rngs::OsRng.fill_bytes(&mut bytes);
        Self(bytes)
    }

    /// Parses 64 hex digits (surrounding whitespace ignored).
    pub fn from_hex(s: &str) -> Result<Self, AuthError> {
        let mut bytes = [0u8; 32];
        hex::decode_to_slice(s.trim(), &mut bytes).map_err(|e| AuthError::BadToken {
            origin: "the given value".into(),
            reason: e.to_string(),
        })?;
        Ok(Self(bytes))
    }

    /// The token as 64 lowercase hex digits.
    pub fn to_hex(&self) -> String {
        hex::encode(self.0)
    }

    /// Finds the job token: `explicit`, else `$SYNCOPATE_TOKEN`, else the contents of
    /// `file`, else the contents of the file named by `$SYNCOPATE_TOKEN_FILE`.
    pub fn resolve(explicit: Option<&str>, file: Option<&Path>) -> Result<JobToken, AuthError> {
        resolve_with(explicit, file, &|name| std::env::var(name).ok())
    }
}

fn resolve_with(
    explicit: Option<&str>,
    file: Option<&Path>,
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<JobToken, AuthError> {
    let named = |origin: String| {
        move |e: AuthError| match e {
            AuthError::BadToken { reason, .. } => AuthError::BadToken { origin, reason },
            other => other,
        }
    };
    if let Some(s) = explicit {
        return JobToken::from_hex(s).map_err(named("the explicit token".into()));
    }
    if let Some(s) = env(TOKEN_ENV).filter(|s| !s.trim().is_empty()) {
        return JobToken::from_hex(&s).map_err(named(format!("${TOKEN_ENV}")));
    }
    if let Some(path) = file {
        return token_from_file(path);
    }
    match env(TOKEN_FILE_ENV).filter(|s| !s.trim().is_empty()) {
        Some(path) => token_from_file(Path::new(path.trim())),
        None => Err(AuthError::NoToken),
    }
}

/// Refuses a token file that anyone but its reader could have written: one owned by
/// another user, or writable by its group or by everyone (whoever can replace the token
/// can forge the job's checkpoints and join it).
pub fn check_token_file(path: &Path) -> Result<(), AuthError> {
    use std::os::unix::fs::MetadataExt;
    let meta = std::fs::metadata(path).map_err(|source| AuthError::TokenFile {
        path: path.display().to_string(),
        source,
    })?;
    let unsafe_file = |why: String| AuthError::UnsafeTokenFile {
        path: path.display().to_string(),
        why,
    };
    // SAFETY: geteuid has no preconditions and cannot fail.
    let me = unsafe { libc::geteuid() };
    if meta.uid() != me {
        return Err(unsafe_file(format!(
            "it is owned by user {}, not by this user ({me})",
            meta.uid()
        )));
    }
    if meta.mode() & 0o022 != 0 {
        return Err(unsafe_file(format!(
            "its group or everyone may write it (mode {:o}; chmod 600 it)",
            meta.mode() & 0o777
        )));
    }
    Ok(())
}

fn token_from_file(path: &Path) -> Result<JobToken, AuthError> {
    check_token_file(path)?;
    let text = std::fs::read_to_string(path).map_err(|source| AuthError::TokenFile {
        path: path.display().to_string(),
        source,
    })?;
    JobToken::from_hex(&text).map_err(|e| match e {
        AuthError::BadToken { reason, .. } => AuthError::BadToken {
            origin: format!("file {}", path.display()),
            reason,
        },
        other => other,
    })
}

/// What a process is in the job.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    /// Trains a replica of the model.
    Worker,
    /// Holds a shard of the parameters.
    Server,
    /// Runs the rendezvous.
    Coordinator,
    /// Starts and supervises the other processes.
    Launcher,
}

impl Role {
    /// Whether this role carries a model (and so a fingerprint and a strategy).
    pub fn carries_model(self) -> bool {
        matches!(self, Role::Worker | Role::Server)
    }
}

impl fmt::Display for Role {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Role::Worker => "worker",
            Role::Server => "server",
            Role::Coordinator => "coordinator",
            Role::Launcher => "launcher",
        })
    }
}

/// What a process says about itself in the handshake.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
pub struct PeerInfo {
    /// Rank in the job.
    pub rank: usize,
    /// What the process is.
    pub role: Role,
    /// Wire protocol version ([`syncopate_core::wire::VERSION`]).
    pub protocol_version: u8,
    /// Hash of the model's architecture (0 for coordinators and launchers).
    pub model_fingerprint: u64,
    /// Synchronisation strategy name (empty for coordinators and launchers).
    pub strategy: String,
    /// Workers in the job.
    pub workers: usize,
    /// Parameter servers in the job.
    pub servers: usize,
    /// Whether the process tags its frames with MACs and wants its peers' tagged
    /// (on unless `--no-frame-mac`; false for coordinators and launchers, which exchange no
    /// frames after the handshake).
    #[serde(default)]
    pub frame_mac: bool,
}

impl PeerInfo {
    /// Info for this build's protocol version.
    pub fn new(
        rank: usize,
        role: Role,
        model_fingerprint: u64,
        strategy: &str,
        workers: usize,
        servers: usize,
    ) -> Self {
        Self {
            rank,
            role,
            protocol_version: VERSION,
            model_fingerprint,
            strategy: strategy.to_owned(),
            workers,
            servers,
            frame_mac: false,
        }
    }

    /// The same info, tagging frames with MACs or not.
    pub fn with_frame_mac(self, frame_mac: bool) -> Self {
        Self { frame_mac, ..self }
    }

    /// "rank 3 (worker)".
    pub fn describe(&self) -> String {
        format!("rank {} ({})", self.rank, self.role)
    }
}

/// Why a job token could not be found or a handshake did not succeed.
#[derive(Debug, thiserror::Error)]
pub enum AuthError {
    /// No token was provided anywhere.
    #[error(
        "no job token: pass one explicitly, set SYNCOPATE_TOKEN to its 64 hex digits, \
         or name a file holding it (token file option or SYNCOPATE_TOKEN_FILE)"
    )]
    NoToken,
    /// A token that is not 64 hex digits.
    #[error("invalid job token from {origin}: expected 64 hex digits ({reason})")]
    BadToken {
        /// Where the token came from.
        origin: String,
        /// What is wrong with it.
        reason: String,
    },
    /// The token file could not be read.
    #[error("cannot read the job token file {path}: {source}")]
    TokenFile {
        /// The file.
        path: String,
        /// The I/O error.
        source: io::Error,
    },
    /// A token file that someone else could have written.
    #[error("refusing the job token file {path}: {why}")]
    UnsafeTokenFile {
        /// The file.
        path: String,
        /// Who else could have written it.
        why: String,
    },
    /// We refused the peer; it was sent `reason` in an Abort frame.
    #[error("refused {peer}: {reason}")]
    Rejected {
        /// Who the peer claims to be ("rank 3 (worker)") or its address.
        peer: String,
        /// Why ("authentication failed: ...", "model fingerprint ... differs ...").
        reason: String,
    },
    /// The peer refused us and said why.
    #[error("refused by {by}: {reason}")]
    Refused {
        /// Who refused ("rank 0 (coordinator)") or its address.
        by: String,
        /// The reason it gave.
        reason: String,
    },
    /// The peer broke the handshake protocol (garbage, wrong message, closed, timed out).
    #[error("handshake with {peer} failed: {source}")]
    Frame {
        /// Who the peer is, as far as known.
        peer: String,
        /// What went wrong.
        source: FrameIoError,
    },
    /// A socket option could not be set.
    #[error("handshake socket setup failed: {0}")]
    Io(#[from] io::Error),
}

impl AuthError {
    /// Whether the failure is that the two ends do not share the job token.
    pub fn is_authentication_failure(&self) -> bool {
        match self {
            AuthError::Rejected { reason, .. } | AuthError::Refused { reason, .. } => {
                reason.starts_with(AUTH_FAILED)
            }
            _ => false,
        }
    }
}

const AUTH_FAILED: &str = "authentication failed";

/// The handshake messages, in order.
#[derive(Serialize, Deserialize, Debug)]
#[serde(tag = "msg", rename_all = "snake_case")]
enum Message {
    Hello {
        info: PeerInfo,
        nonce: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        mac: Option<String>,
    },
    Proof {
        mac: String,
    },
    Accepted,
}

/// Checks that a peer can work with us, after it has been authenticated.
///
/// The rule: protocol version, worker count and server count must always match; model
/// fingerprint, strategy and frame MACs must match only when both sides carry a model
/// (workers and servers), since coordinators and launchers carry 0, "" and no MACs. Returns the reason
/// for refusing, phrased from our side ("... differs from ours ...").
pub fn check_compatible(ours: &PeerInfo, theirs: &PeerInfo) -> Result<(), String> {
    compat_mismatch(ours, "ours", theirs).map_or(Ok(()), Err)
}

/// The first of `fields` (`(what, theirs, ours)`) whose two values differ, as a reason:
/// "<what> <theirs> differs from <label> <ours>".
fn first_difference<const N: usize>(
    label: &str,
    fields: [(&str, String, String); N],
) -> Option<String> {
    fields
        .into_iter()
        .find(|(_, theirs, ours)| theirs != ours)
        .map(|(what, theirs, ours)| format!("{what} {theirs} differs from {label} {ours}"))
}

/// Like [`check_compatible`], with `label` naming the reference ("ours", "rank 0's").
pub(crate) fn compat_mismatch(
    reference: &PeerInfo,
    label: &str,
    theirs: &PeerInfo,
) -> Option<String> {
    let (o, t) = (reference, theirs);
    let always = [
        (
            "protocol version",
            t.protocol_version.to_string(),
            o.protocol_version.to_string(),
        ),
        ("worker count", t.workers.to_string(), o.workers.to_string()),
        ("server count", t.servers.to_string(), o.servers.to_string()),
    ];
    if let Some(difference) = first_difference(label, always) {
        return Some(difference);
    }
    if !(t.role.carries_model() && o.role.carries_model()) {
        return None;
    }
    let fingerprint = |p: &PeerInfo| format!("{:#018x}", p.model_fingerprint);
    let with_model = [
        ("model fingerprint", fingerprint(t), fingerprint(o)),
        ("strategy", t.strategy.clone(), o.strategy.clone()),
    ];
    if let Some(difference) = first_difference(label, with_model) {
        return Some(difference);
    }
    if t.frame_mac != o.frame_mac {
        let on_off = |on: bool| if on { "on" } else { "off" };
        return Some(format!(
            "frame MACs {} differ from {label} {} (turn them off in every process or in none: \
             `--no-frame-mac`, or `SYNCOPATE_FRAME_MAC=0` for Python)",
            on_off(t.frame_mac),
            on_off(o.frame_mac)
        ));
    }
    None
}

/// What a successful handshake yields.
#[derive(Debug, Clone)]
pub struct Session {
    /// Who the peer is.
    pub peer: PeerInfo,
    /// This end's frame keys for the connection (see the module docs).
    pub keys: LinkKeys,
}

/// Authenticates the peer on `stream` and checks compatibility; returns the peer's info
/// and the connection's frame keys.
///
/// `initiator` is the side that opened the connection. Read and write timeouts of
/// `timeout` (per message) apply during the handshake and are cleared afterwards.
pub fn handshake(
    stream: &mut TcpStream,
    token: &JobToken,
    me: &PeerInfo,
    initiator: bool,
    timeout: Duration,
) -> Result<Session, AuthError> {
    let timeout = Some(timeout.max(Duration::from_millis(1)));
    stream.set_read_timeout(timeout)?;
    stream.set_write_timeout(timeout)?;
    let result = if initiator {
        initiate(stream, token, me)
    } else {
        accept(stream, token, me)
    };
    let restored = stream
        .set_read_timeout(None)
        .and_then(|()| stream.set_write_timeout(None));
    let info = result?;
    restored?;
    Ok(info)
}

fn initiate(stream: &mut TcpStream, token: &JobToken, me: &PeerInfo) -> Result<Session, AuthError> {
    let nonce_i = fresh_nonce();
    let hello = Message::Hello {
        info: me.clone(),
        nonce: hex::encode(nonce_i),
        mac: None,
    };
    let addr = format!("the peer at {}", peer_addr(stream));
    send(stream, &addr, &hello)?;
    let (info_a, nonce_a, mac_a) = match receive(stream, &addr)? {
        Message::Hello {
            info,
            nonce,
            mac: Some(mac),
        } => (info, nonce, mac),
        other => return Err(violation(stream, &addr, "acceptor hello", &other)),
    };
    let peer = info_a.describe();
    let nonce_a = decode_nonce(&nonce_a).ok_or_else(|| refuse(stream, &peer, "malformed nonce"))?;
    let expected = keyed(token, ACCEPTOR_LABEL, &nonce_i, &nonce_a, &info_a);
    verify(stream, &peer, expected, &mac_a)?;
    check_peer(stream, &peer, me, &info_a)?;
    let mac_i = keyed(token, INITIATOR_LABEL, &nonce_a, &nonce_i, me).finalize();
    let proof = Message::Proof {
        mac: hex::encode(mac_i.into_bytes()),
    };
    send(stream, &peer, &proof)?;
    match receive(stream, &peer)? {
        Message::Accepted => Ok(Session {
            peer: info_a,
            keys: link_keys(token, &nonce_i, &nonce_a, true),
        }),
        other => Err(violation(stream, &peer, "acceptance", &other)),
    }
}

fn accept(stream: &mut TcpStream, token: &JobToken, me: &PeerInfo) -> Result<Session, AuthError> {
    let addr = peer_addr(stream);
    let unknown = format!("the peer at {addr}");
    let (info_i, nonce_i) = match receive(stream, &unknown) {
        Ok(Message::Hello {
            info,
            nonce,
            mac: None,
        }) => (info, nonce),
        Ok(other) => return Err(violation(stream, &unknown, "initiator hello", &other)),
        Err(e) => {
            send_abort(
                stream,
                &format!("expected a Syncopate handshake hello: {e}"),
            );
            return Err(e);
        }
    };
    let peer = format!("{} at {addr}", info_i.describe());
    let nonce_i = decode_nonce(&nonce_i).ok_or_else(|| refuse(stream, &peer, "malformed nonce"))?;
    let nonce_a = fresh_nonce();
    let mac_a = keyed(token, ACCEPTOR_LABEL, &nonce_i, &nonce_a, me).finalize();
    let hello = Message::Hello {
        info: me.clone(),
        nonce: hex::encode(nonce_a),
        mac: Some(hex::encode(mac_a.into_bytes())),
    };
    send(stream, &peer, &hello)?;
    let mac_i = match receive(stream, &peer)? {
        Message::Proof { mac } => mac,
        other => return Err(violation(stream, &peer, "proof", &other)),
    };
    let expected = keyed(token, INITIATOR_LABEL, &nonce_a, &nonce_i, &info_i);
    verify(stream, &peer, expected, &mac_i)?;
    check_peer(stream, &peer, me, &info_i)?;
    send(stream, &peer, &Message::Accepted)?;
    Ok(Session {
        peer: info_i,
        keys: link_keys(token, &nonce_i, &nonce_a, false),
    })
}

/// This end's frame keys for a connection whose handshake exchanged `nonce_i` (the
/// initiator's) and `nonce_a` (the acceptor's).
fn link_keys(
    token: &JobToken,
    nonce_i: &[u8; 32],
    nonce_a: &[u8; 32],
    initiator: bool,
) -> LinkKeys {
    let key = |label: &[u8]| {
        let mut mac = hmac_sha256(token);
        mac.update(label);
        mac.update(nonce_i);
        mac.update(nonce_a);
        FrameKey::new(mac.finalize().into_bytes().into())
    };
    let (from_i, from_a) = (
        key(FRAMES_FROM_INITIATOR_LABEL),
        key(FRAMES_FROM_ACCEPTOR_LABEL),
    );
    if initiator {
        LinkKeys {
            send: from_i,
            recv: from_a,
        }
    } else {
        LinkKeys {
            send: from_a,
            recv: from_i,
        }
    }
}

fn hmac_sha256(token: &JobToken) -> HmacSha256 {
    HmacSha256::new_from_slice(&token.0).expect("HMAC accepts keys of any length")
}

fn fresh_nonce() -> [u8; 32] {
    let mut nonce = [0u8; 32];
    rand::thread_rng().fill_bytes(&mut nonce);
    nonce
}

fn decode_nonce(s: &str) -> Option<[u8; 32]> {
    let mut nonce = [0u8; 32];
    hex::decode_to_slice(s, &mut nonce).ok().map(|()| nonce)
}

/// HMAC(token, label || first || second || json(info)), ready to finalize or verify.
fn keyed(
    token: &JobToken,
    label: &[u8],
    first: &[u8; 32],
    second: &[u8; 32],
    info: &PeerInfo,
) -> HmacSha256 {
    let mut mac = hmac_sha256(token);
    mac.update(label);
    mac.update(first);
    mac.update(second);
    // Serialising a plain struct of numbers and strings cannot fail.
    mac.update(&serde_json::to_vec(info).unwrap_or_default());
    mac
}

/// Checks the peer's MAC in constant time; on mismatch refuses the peer.
fn verify(
    stream: &mut TcpStream,
    peer: &str,
    expected: HmacSha256,
    mac_hex: &str,
) -> Result<(), AuthError> {
    let ok = hex::decode(mac_hex).is_ok_and(|mac| expected.verify_slice(&mac).is_ok());
    if ok {
        return Ok(());
    }
    let reason = format!("{AUTH_FAILED}: the two ends do not hold the same job token");
    Err(refuse(stream, peer, &reason))
}

fn check_peer(
    stream: &mut TcpStream,
    peer: &str,
    me: &PeerInfo,
    theirs: &PeerInfo,
) -> Result<(), AuthError> {
    check_compatible(me, theirs).map_err(|reason| refuse(stream, peer, &reason))
}

/// Sends an Abort with `reason` and returns the matching error.
fn refuse(stream: &mut TcpStream, peer: &str, reason: &str) -> AuthError {
    send_abort(stream, reason);
    AuthError::Rejected {
        peer: peer.to_owned(),
        reason: reason.to_owned(),
    }
}

fn violation(stream: &mut TcpStream, peer: &str, expected: &str, got: &Message) -> AuthError {
    let kind = match got {
        Message::Hello { mac: None, .. } => "initiator hello",
        Message::Hello { .. } => "acceptor hello",
        Message::Proof { .. } => "proof",
        Message::Accepted => "acceptance",
    };
    refuse(
        stream,
        peer,
        &format!("handshake protocol violation: expected the {expected}, got a {kind}"),
    )
}

fn send(stream: &mut TcpStream, peer: &str, msg: &Message) -> Result<(), AuthError> {
    send_control(stream, msg).map_err(|source| AuthError::Frame {
        peer: peer.to_owned(),
        source,
    })
}

/// Receives the next handshake message, under the bounds for a peer that has not
/// authenticated; an Abort from the peer becomes `Refused` with its reason cut short.
fn receive(stream: &mut TcpStream, peer: &str) -> Result<Message, AuthError> {
    recv_unauthenticated(stream).map_err(|source| match source {
        FrameIoError::PeerAborted(reason) => AuthError::Refused {
            by: peer.to_owned(),
            reason,
        },
        source => AuthError::Frame {
            peer: peer.to_owned(),
            source,
        },
    })
}

fn peer_addr(stream: &TcpStream) -> String {
    stream
        .peer_addr()
        .map_or_else(|_| "an unknown address".to_owned(), |a| a.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;
    use std::io::Write;
    use std::net::TcpListener;
    use std::thread;

    fn info(rank: usize, fingerprint: u64, strategy: &str) -> PeerInfo {
        PeerInfo::new(rank, Role::Worker, fingerprint, strategy, 2, 0)
    }

    /// Runs a handshake between an acceptor (`a`) and an initiator (`i`) on loopback.
    fn pair(
        token_a: &JobToken,
        a: &PeerInfo,
        token_i: &JobToken,
        i: &PeerInfo,
    ) -> (Result<Session, AuthError>, Result<Session, AuthError>) {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let (token_i, i) = (token_i.clone(), i.clone());
        let dialer = thread::spawn(move || {
            let mut s = TcpStream::connect(addr).unwrap();
            handshake(&mut s, &token_i, &i, true, Duration::from_secs(5))
        });
        let (mut s, _) = listener.accept().unwrap();
        let acc = handshake(&mut s, token_a, a, false, Duration::from_secs(5));
        (acc, dialer.join().unwrap())
    }

    #[test]
    fn a_token_file_others_may_write_is_refused() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("job.token");
        std::fs::write(&path, "ab".repeat(32)).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
        let none = |_: &str| None;
        assert!(resolve_with(None, Some(&path), &none).is_ok());
        for mode in [0o620, 0o602, 0o666] {
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode)).unwrap();
            let err = resolve_with(None, Some(&path), &none).unwrap_err();
            assert!(matches!(err, AuthError::UnsafeTokenFile { .. }), "{err}");
            assert!(err.to_string().contains("chmod 600"), "{err}");
        }
    }

    #[test]
    fn matching_peers_learn_each_other() {
        let t = JobToken::generate();
        let (a, i) = (info(0, 7, "ps"), info(1, 7, "ps"));
        let (ra, ri) = pair(&t, &a, &t, &i);
        assert_eq!(ra.unwrap().peer, i);
        assert_eq!(ri.unwrap().peer, a);
    }

    #[test]
    fn both_ends_derive_mirrored_frame_keys_new_for_every_connection() {
        let t = JobToken::generate();
        let (a, i) = (info(0, 7, "ps"), info(1, 7, "ps"));
        let (ra, ri) = pair(&t, &a, &t, &i);
        let (ka, ki) = (ra.unwrap().keys, ri.unwrap().keys);
        assert_eq!(ka, ki.reversed());
        assert_ne!(ka.send, ka.recv);
        let (again, _) = pair(&t, &a, &t, &i);
        let again = again.unwrap().keys;
        assert!(again.send != ka.send && again.recv != ka.recv);
    }

    #[test]
    fn wrong_token_is_refused_on_both_sides() {
        let (a, i) = (info(0, 7, "ps"), info(1, 7, "ps"));
        let (ra, ri) = pair(&JobToken::generate(), &a, &JobToken::generate(), &i);
        let (ea, ei) = (ra.unwrap_err(), ri.unwrap_err());
        // The initiator checks the acceptor's MAC first and refuses it.
        assert!(matches!(ei, AuthError::Rejected { .. }), "{ei}");
        assert!(matches!(ea, AuthError::Refused { .. }), "{ea}");
        for e in [&ea, &ei] {
            assert!(e.is_authentication_failure(), "{e}");
            assert!(e.to_string().contains("authentication failed"), "{e}");
        }
        assert!(ea.to_string().contains("rank 1 (worker)"), "{ea}");
    }

    #[test]
    fn incompatible_peers_say_why() {
        let t = JobToken::generate();
        let (ra, ri) = pair(&t, &info(0, 0xabc, "ps"), &t, &info(1, 0xdef, "ps"));
        for e in [ra.unwrap_err(), ri.unwrap_err()] {
            assert!(e.to_string().contains("model fingerprint"), "{e}");
            assert!(e.to_string().contains("0x0000000000000abc"), "{e}");
        }
        let (ra, ri) = pair(&t, &info(0, 1, "allreduce"), &t, &info(1, 1, "ps"));
        for e in [ra.unwrap_err(), ri.unwrap_err()] {
            assert!(
                e.to_string()
                    .contains("strategy ps differs from ours allreduce")
                    || e.to_string()
                        .contains("strategy allreduce differs from ours ps"),
                "{e}"
            );
        }
    }

    #[test]
    fn peers_must_agree_on_frame_macs() {
        let t = JobToken::generate();
        let on = info(1, 7, "ps").with_frame_mac(true);
        let (ra, ri) = pair(&t, &info(0, 7, "ps"), &t, &on);
        for e in [ra.unwrap_err(), ri.unwrap_err()] {
            let e = e.to_string();
            assert!(
                e.contains("frame MACs on differ from ours off")
                    || e.contains("frame MACs off differ from ours on"),
                "{e}"
            );
        }
        let (ra, ri) = pair(&t, &info(0, 7, "ps").with_frame_mac(true), &t, &on);
        assert!(ra.is_ok() && ri.is_ok());
        let coord = PeerInfo::new(0, Role::Coordinator, 0, "", 2, 0);
        let (ra, ri) = pair(&t, &coord, &t, &on);
        assert!(ra.is_ok() && ri.is_ok());
    }

    #[test]
    fn coordinator_is_exempt_from_model_checks_but_not_counts() {
        let t = JobToken::generate();
        let coord = PeerInfo::new(0, Role::Coordinator, 0, "", 2, 0);
        let (ra, ri) = pair(&t, &coord, &t, &info(1, 9, "ps"));
        assert!(ra.is_ok() && ri.is_ok());
        let other_job = PeerInfo::new(0, Role::Coordinator, 0, "", 4, 0);
        let (ra, _) = pair(&t, &other_job, &t, &info(1, 9, "ps"));
        assert!(ra.unwrap_err().to_string().contains("worker count"));
    }

    #[test]
    fn garbage_first_frame_is_an_error_not_a_hang() {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let sender = thread::spawn(move || {
            let mut s = TcpStream::connect(addr).unwrap();
            s.write_all(&[0x5a; 100]).unwrap();
            // Keep the connection open so that only the garbage can end the handshake.
            thread::sleep(Duration::from_millis(300));
        });
        let (mut s, _) = listener.accept().unwrap();
        let t = JobToken::generate();
        let e = handshake(&mut s, &t, &info(0, 1, "ps"), false, Duration::from_secs(5));
        assert!(e.unwrap_err().to_string().contains("bad magic"));
        sender.join().unwrap();

        // Silence ends in a timeout.
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let _quiet = TcpStream::connect(addr).unwrap();
        let (mut s, _) = listener.accept().unwrap();
        let e = handshake(
            &mut s,
            &t,
            &info(0, 1, "ps"),
            false,
            Duration::from_millis(200),
        );
        assert!(e.unwrap_err().to_string().contains("timed out"));
    }

    #[test]
    fn token_hex_round_trip_and_debug_hides_it() {
        let t = JobToken::generate();
        assert_eq!(
            JobToken::from_hex(&t.to_hex()).unwrap().to_hex(),
            t.to_hex()
        );
        assert!(!format!("{t:?}").contains(&t.to_hex()[..8]));
        assert!(JobToken::from_hex("abc").is_err());
    }

    #[test]
    fn resolve_order() {
        let a = JobToken::generate().to_hex();
        let b = JobToken::generate().to_hex();
        let c = JobToken::generate().to_hex();
        let dir = tempfile::tempdir().unwrap();
        let file_c = dir.path().join("c");
        std::fs::write(&file_c, format!("{c}\n")).unwrap();
        let d = JobToken::generate().to_hex();
        let file_d = dir.path().join("d");
        std::fs::write(&file_d, &d).unwrap();

        let vars: HashMap<&str, String> = [
            (TOKEN_ENV, b.clone()),
            (TOKEN_FILE_ENV, file_d.display().to_string()),
        ]
        .into();
        let full = |k: &str| vars.get(k).cloned();
        let no_token = |k: &str| (k != TOKEN_ENV).then(|| full(k)).flatten();
        let none = |_: &str| None;
        let hex = |r: Result<JobToken, AuthError>| r.unwrap().to_hex();

        assert_eq!(hex(resolve_with(Some(&a), Some(&file_c), &full)), a);
        assert_eq!(hex(resolve_with(None, Some(&file_c), &full)), b);
        assert_eq!(hex(resolve_with(None, Some(&file_c), &no_token)), c);
        assert_eq!(hex(resolve_with(None, None, &no_token)), d);
        let e = resolve_with(None, None, &none).unwrap_err();
        assert!(e.to_string().contains(TOKEN_ENV), "{e}");
        let e = resolve_with(Some("xyz"), None, &none).unwrap_err();
        assert!(e.to_string().contains("explicit"), "{e}");
        let e = resolve_with(None, Some(&dir.path().join("missing")), &none).unwrap_err();
        assert!(e.to_string().contains("missing"), "{e}");
    }
}
