//! `launch` and signals, with real processes: SIGTERM or SIGINT to `launch` stops every
//! process of the job, `launch` exits with 128 + the signal, and the job's checkpoints
//! resume to the weights of an uninterrupted job; SIGKILL to `launch` kills its processes
//! too (their parent-death signal). The job token is on no process's command line.

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const EXE: &str = env!("CARGO_BIN_EXE_syncopate");

const SIGINT: i32 = 2;
const SIGKILL: i32 = 9;
const SIGTERM: i32 = 15;

/// How long any awaited condition may take on a loaded machine.
const PATIENCE: Duration = Duration::from_secs(120);

/// `launch` of a 2-worker all-reduce job of LeNet for `steps` steps under `token`.
fn launch(steps: u64, token: &str) -> Command {
    let mut cmd = Command::new(EXE);
    cmd.args(["launch", "--strategy", "allreduce", "--workers", "2"])
        .args(["--model", "lenet", "--dataset", "synthetic"])
        .args(["--synthetic-samples", "512", "--batch-size", "8"])
        .args(["--lr", "0.05", "--lr-schedule", "constant", "--seed", "3"])
        .args(["--steps", &steps.to_string(), "--token", token, "--quiet"])
        .stdin(Stdio::null());
    cmd
}

fn run_ok(cmd: &mut Command) -> String {
    let out = cmd.output().unwrap();
    let text = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(out.status.success(), "command failed:\n{text}");
    text
}

/// The parent pid of `pid` (field 4 of /proc/PID/stat), and whether it is still running
/// (not a zombie); `None` once it is gone.
fn parent_and_running(pid: u32) -> Option<(u32, bool)> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let mut fields = stat.rsplit(')').next()?.split_whitespace();
    let state = fields.next()?;
    let parent = fields.next()?.parse().ok()?;
    Some((parent, state != "Z" && state != "X"))
}

fn running(pid: u32) -> bool {
    parent_and_running(pid).is_some_and(|(_, running)| running)
}

/// The processes `parent` started that run the job (their command line names
/// `--launched-job`), with their command lines.
fn job_processes(parent: u32) -> Vec<(u32, String)> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter(|&pid| parent_and_running(pid).is_some_and(|(p, _)| p == parent))
        .filter_map(|pid| {
            let raw = std::fs::read(format!("/proc/{pid}/cmdline")).ok()?;
            let cmdline = String::from_utf8_lossy(&raw).replace('\0', " ");
            cmdline.contains("--launched-job").then_some((pid, cmdline))
        })
        .collect()
}

/// Waits until `launch` runs both workers of its job; returns their pids.
fn wait_for_workers(launch: &mut Child, token: &str) -> Vec<u32> {
    let deadline = Instant::now() + PATIENCE;
    loop {
        let found = job_processes(launch.id());
        if found.len() == 2 {
            for (pid, cmdline) in &found {
                assert!(!cmdline.contains(token), "the token is in {pid}'s argv");
            }
            return found.into_iter().map(|(pid, _)| pid).collect();
        }
        assert!(launch.try_wait().unwrap().is_none(), "launch ended early");
        assert!(Instant::now() < deadline, "the workers never started");
        std::thread::yield_now();
    }
}

/// Sends `signal` to `pid`.
fn send(signal: i32, pid: u32) {
    let status = Command::new("kill")
        .args([format!("-{signal}"), pid.to_string()])
        .status()
        .unwrap();
    assert!(status.success(), "kill -{signal} {pid}");
}

/// Waits for `condition`, failing with `what` after `patience`.
fn wait_until(what: &str, patience: Duration, mut condition: impl FnMut() -> bool) {
    let deadline = Instant::now() + patience;
    while !condition() {
        assert!(Instant::now() < deadline, "{what}");
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// Whether every worker has completed its checkpoint after `step` in `dir`.
fn checkpointed(dir: &Path, step: u64) -> bool {
    let step_dir = dir.join(format!("step-{step:08}"));
    (0..2).all(|rank| step_dir.join(format!("rank-{rank}.toml")).exists())
}

/// SIGTERM, then SIGINT, to `launch` of a checkpointing job once every worker has
/// checkpointed step 10: `launch` exits with 143 and 130, none of its processes is left,
/// and `--resume` of the folder ends with the uninterrupted job's weights.
#[test]
fn a_signalled_launch_stops_its_job_and_leaves_it_resumable() {
    let dir = tempfile::tempdir().unwrap();
    let token = "5e".repeat(32);
    let steps = 200;
    let full = dir.path().join("full.safetensors");
    run_ok(launch(steps, &token).arg("--save").arg(&full));
    for (signal, code) in [(SIGTERM, 143), (SIGINT, 130)] {
        let ck = dir.path().join(format!("checkpoints-{signal}"));
        // A straggler (compute 20 times as long) keeps the job far from its end when the
        // signal comes; it changes the timing only, never the bits.
        let mut stopped = launch(steps, &token)
            .args(["--slow-worker", "1:20", "--checkpoint-every", "5"])
            .arg("--checkpoint-dir")
            .arg(&ck)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let workers = wait_for_workers(&mut stopped, &token);
        wait_until("no checkpoint after step 10", PATIENCE, || {
            checkpointed(&ck, 10)
        });
        send(signal, stopped.id());
        let mut status = None;
        wait_until("launch did not exit after the signal", PATIENCE, || {
            status = stopped.try_wait().unwrap();
            status.is_some()
        });
        assert_eq!(status.and_then(|s| s.code()), Some(code), "signal {signal}");
        for pid in workers {
            assert!(
                !running(pid),
                "worker {pid} outlived launch (signal {signal})"
            );
        }
        assert!(!checkpointed(&ck, steps), "the job ended before the signal");
        let resumed = dir.path().join(format!("resumed-{signal}.safetensors"));
        let weights = |path: &Path| std::fs::read(path).unwrap();
        resume(steps, &token, &ck, &resumed);
        assert!(
            weights(&full) == weights(&resumed),
            "signal {signal}: the resumed job's weights differ from the uninterrupted job's"
        );
    }
}

/// Resumes the job checkpointed in `ck` to its end, saving its weights to `save`.
fn resume(steps: u64, token: &str, ck: &Path, save: &Path) {
    let mut cmd = launch(steps, token);
    cmd.arg("--resume").arg(ck).arg("--save").arg(save);
    let log = run_ok(&mut cmd);
    let resumed = log.contains("resuming from the checkpoint after step");
    assert!(resumed, "not resumed from a checkpoint:\n{log}");
}

/// SIGKILL to `launch`, which can do nothing about it: its processes die all the same.
/// They are slowed down (compute 200 times as long) so that none writes a line between
/// the kill and the check (one writing to its dead `launch`'s pipe would die of that).
#[test]
fn the_processes_of_a_killed_launch_die_with_it() {
    let token = "7a".repeat(32);
    let mut killed = launch(100_000_000, &token)
        .args(["--slow-worker", "0:200", "--slow-worker", "1:200"])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let workers = wait_for_workers(&mut killed, &token);
    // Past the rendezvous (which `launch` hosts), the workers need `launch` no more.
    let said = BufReader::new(killed.stderr.take().unwrap());
    let training = said
        .lines()
        .map_while(Result::ok)
        .any(|line| line.contains("rank 1: joined the job"));
    assert!(training, "the workers never started training");
    send(SIGKILL, killed.id());
    let _ = killed.wait();
    // They die at once; without a parent-death signal they would train on for minutes.
    let kill_lag = Duration::from_secs(10);
    wait_until("a worker outlived its killed launch", kill_lag, || {
        workers.iter().all(|&pid| !running(pid))
    });
}
