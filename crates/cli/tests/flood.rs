//! Connections that never authenticate cannot grow a process's memory: a worker hosting the
//! rendezvous is flooded with connections that each send a 1 MiB Abort frame (or 1 MiB of
//! garbage, or a 1 MiB control frame) before the job's second worker arrives. Its resident
//! memory stays within [`GROWTH_BOUND`] of what it was before the flood, and the job then
//! forms and completes.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use syncopate_core::wire::{FrameKind, Header};
use syncopate_runtime::auth::JobToken;

const EXE: &str = env!("CARGO_BIN_EXE_syncopate");

/// Connections in the flood (each sends [`FLOOD_BYTES`]).
const FLOOD_CONNECTIONS: usize = 150;
/// What each connection sends after its header: 1 MiB, the largest control payload.
const FLOOD_BYTES: usize = 1 << 20;
/// Connections sending at once.
const FLOODERS: usize = 10;
/// How much the flooded process's resident memory may grow: 150 connections of 1 MiB each
/// kept would be 150 MiB; what the bound allows is room for the threads that handshake
/// the connections (at most 64 at once, each reading at most 16 KiB) and the allocator.
const GROWTH_BOUND: u64 = 32 << 20;

/// Resident memory of `pid` in bytes (`VmRSS` of /proc/PID/status).
fn resident_bytes(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let kib: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("VmRSS in /proc/PID/status");
    kib * 1024
}

/// A free port on 127.0.0.1 for the rendezvous (the worker binds it itself).
fn free_port() -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    listener.local_addr().unwrap().port()
}

/// Worker `rank` of a 2-worker all-reduce job of 3 steps whose rendezvous is on `port`
/// (hosted by rank 0).
fn worker(rank: usize, port: u16, token: &JobToken) -> Command {
    let mut cmd = Command::new(EXE);
    cmd.args(["worker", "--strategy", "allreduce", "--workers", "2"])
        .args(["--model", "mlp", "--dataset", "synthetic"])
        .args([
            "--synthetic-samples",
            "64",
            "--batch-size",
            "8",
            "--steps",
            "3",
        ])
        .args(["--connect-timeout", "120", "--quiet"])
        .env("RANK", rank.to_string())
        .env("WORLD_SIZE", "2")
        .env("MASTER_ADDR", "127.0.0.1")
        .env("MASTER_PORT", port.to_string())
        .env("SYNCOPATE_TOKEN", token.to_hex())
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    cmd
}

/// Waits (up to a minute) until something accepts connections at `addr`.
fn wait_for_listener(addr: SocketAddr, child: &mut Child) {
    let deadline = Instant::now() + Duration::from_secs(60);
    while TcpStream::connect_timeout(&addr, Duration::from_millis(200)).is_err() {
        assert!(child.try_wait().unwrap().is_none(), "worker 0 ended early");
        assert!(
            Instant::now() < deadline,
            "worker 0 never listened on {addr}"
        );
        std::thread::yield_now();
    }
}

/// One hostile connection: `kind` 0 sends an Abort frame of [`FLOOD_BYTES`], 1 a control
/// frame of as many bytes of garbage JSON, 2 that many bytes of garbage with no header at
/// all; then it waits for the peer to close the connection (it has dealt with it).
fn flood_one(addr: SocketAddr, kind: usize) {
    let Ok(mut stream) = TcpStream::connect(addr) else {
        return;
    };
    let payload = vec![b'A' + kind as u8; FLOOD_BYTES];
    let frame_kind = if kind == 0 {
        FrameKind::Abort
    } else {
        FrameKind::Control
    };
    let header = Header::control(frame_kind, FLOOD_BYTES as u32).encode();
    if kind < 2 {
        let _ = stream.write_all(&header);
    }
    // The peer may refuse the frame from its header and close while we still write.
    let _ = stream.write_all(&payload);
    let _ = stream.set_read_timeout(Some(Duration::from_secs(30)));
    let mut sink = [0u8; 4096];
    while matches!(stream.read(&mut sink), Ok(n) if n > 0) {}
}

#[test]
fn a_flood_of_unauthenticated_connections_does_not_grow_memory() {
    let token = JobToken::generate();
    let port = free_port();
    let addr: SocketAddr = ([127, 0, 0, 1], port).into();
    let mut first = worker(0, port, &token).spawn().unwrap();
    // Read what it says (a line per refused connection), lest a full pipe block it.
    let mut said = first.stderr.take().unwrap();
    let first_said = std::thread::spawn(move || {
        let mut text = String::new();
        let _ = said.read_to_string(&mut text);
        text
    });
    wait_for_listener(addr, &mut first);
    let before = resident_bytes(first.id());
    let flooders: Vec<_> = (0..FLOODERS)
        .map(|f| {
            std::thread::spawn(move || {
                for i in (f..FLOOD_CONNECTIONS).step_by(FLOODERS) {
                    flood_one(addr, i % 3);
                }
            })
        })
        .collect();
    for f in flooders {
        f.join().unwrap();
    }
    let after = resident_bytes(first.id());
    let grown = after.saturating_sub(before);
    assert!(
        grown <= GROWTH_BOUND,
        "worker 0 grew from {} MiB to {} MiB under the flood (bound: {} MiB)",
        before >> 20,
        after >> 20,
        GROWTH_BOUND >> 20
    );
    // The rightful member still gets in, and the job completes.
    let second = worker(1, port, &token).output().unwrap();
    let first = first.wait().unwrap();
    let first_said = first_said.join().unwrap();
    assert!(
        first.success(),
        "worker 0 failed after the flood:\n{first_said}"
    );
    assert!(
        second.status.success(),
        "worker 1 failed after the flood:\n{}",
        String::from_utf8_lossy(&second.stderr)
    );
}
