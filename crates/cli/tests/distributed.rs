//! Real processes on 127.0.0.1: synchronous strategies reproduce single-process training,
//! a wrong token is refused, and a killed worker makes the others fail with its name.

use std::io::{BufRead, BufReader};
use std::net::TcpListener;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use syncopate_runtime::auth::{JobToken, PeerInfo, Role};
use syncopate_runtime::rendezvous::serve_coordinator;

mod common;
use common::{read_weights, run_ok};

const EXE: &str = env!("CARGO_BIN_EXE_syncopate");

/// Common flags: LeNet on a small synthetic set, a few steps.
fn train_flags(batch: usize, steps: u64) -> Vec<String> {
    [
        "--model",
        "lenet",
        "--dataset",
        "synthetic",
        "--synthetic-samples",
        "512",
        "--steps",
        &steps.to_string(),
        "--batch-size",
        &batch.to_string(),
        "--lr",
        "0.05",
        "--momentum",
        "0.9",
        "--weight-decay",
        "0.0001",
        "--seed",
        "3",
        "--quiet",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect()
}

/// Asserts that `got` equals the single-process weights `want` to float tolerance.
fn assert_same_weights(got: &[(String, Vec<f32>)], want: &[(String, Vec<f32>)], what: &str) {
    assert_eq!(got.len(), want.len());
    for ((name, a), (_, b)) in got.iter().zip(want) {
        for (x, y) in a.iter().zip(b) {
            assert!(
                (x - y).abs() <= 1e-4 + 1e-3 * y.abs(),
                "{what}: {name} differs: {x} vs {y}"
            );
        }
    }
}

/// The weights of single-process training with `batch` samples a step for `steps` steps
/// (the reference every synchronous strategy must reproduce), trained into `dir`.
fn single_process_weights(dir: &Path, batch: usize, steps: u64) -> Vec<(String, Vec<f32>)> {
    let path = dir.join(format!("single-{batch}x{steps}.safetensors"));
    run_ok(
        Command::new(EXE)
            .arg("train")
            .args(train_flags(batch, steps))
            .arg("--save")
            .arg(&path),
    );
    read_weights(&path)
}

/// `syncopate launch` of `strategy` with `workers` workers and `servers` servers.
fn launch(strategy: &str, workers: usize, servers: usize) -> Command {
    let mut cmd = Command::new(EXE);
    cmd.arg("launch").args([
        "--strategy",
        strategy,
        "--workers",
        &workers.to_string(),
        "--servers",
        &servers.to_string(),
    ]);
    cmd
}

/// `bench-comm` completes for ring all-reduce (busy polling and sleeping, back to back and
/// barrier-timed, over the ring and over a full mesh) and the parameter server, and reports
/// one row per size with the operations it timed; a barrier is refused for parameter
/// servers.
#[test]
fn bench_comm_measures_every_size() {
    let cases: [&[&str]; 7] = [
        &["--strategy", "allreduce", "--workers", "3"],
        &["--strategy", "allreduce", "--workers", "3", "--barrier"],
        &["--strategy", "allreduce", "--workers", "4", "--mesh"],
        &[
            "--strategy",
            "allreduce",
            "--workers",
            "4",
            "--mesh",
            "--barrier",
        ],
        &[
            "--strategy",
            "allreduce",
            "--workers",
            "2",
            "--no-frame-mac",
        ],
        &[
            "--strategy",
            "allreduce",
            "--workers",
            "2",
            "--busy-poll-us",
            "0",
        ],
        &["--strategy", "ps", "--workers", "2", "--servers", "2"],
    ];
    for args in cases {
        let out = run_ok(Command::new(EXE).arg("bench-comm").args(args).args([
            "--sizes",
            "4KiB,1MiB",
            "--min-time",
            "0.01",
            "--min-iters",
            "3",
        ]));
        let rows: Vec<Vec<f64>> = out
            .lines()
            .filter_map(|l| l.strip_prefix("[worker 0] "))
            .map(|l| l.split(',').map(|v| v.parse().unwrap()).collect())
            .collect();
        assert_eq!(rows.len(), 2, "{args:?}: {out}");
        for (row, size) in rows.iter().zip([4096.0, 1048576.0]) {
            assert_eq!(row[0], size, "{args:?}: {out}");
            assert!(
                row[2] > 0.0 && row[3] > 0.0 && row[4] >= 3.0,
                "{args:?}: {out}"
            );
        }
    }
    let out = Command::new(EXE)
        .args(["bench-comm", "--strategy", "ps", "--barrier"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && err.contains("--barrier"), "{err}");
}

/// N workers with batch b end with the weights of one process with batch N*b.
///
/// Tolerance: gradients are averaged in another order (per worker, then across workers),
/// so the weights differ by float rounding: we allow 1e-4 absolute plus 1e-3 relative
/// after 6 steps of SGD with momentum.
#[test]
fn synchronous_strategies_reproduce_single_process_training() {
    let dir = tempfile::tempdir().unwrap();
    let (batch, steps) = (8usize, 6u64);
    for workers in [2usize, 4] {
        let want = single_process_weights(dir.path(), batch * workers, steps);
        let variants: [(&str, &[&str]); 10] = [
            ("ps", &[]),
            ("ps-no-overlap", &[]),
            ("allreduce", &[]),
            // Busy polling changes when the loop looks at its sockets, never what it sends.
            ("allreduce", &["--busy-poll-us", "200"]),
            // 50 kB buckets: the small ones are shared whole, the big ones ring-reduced.
            ("allreduce", &["--bucket-mb", "0.05"]),
            ("allreduce-no-overlap", &[]),
            // P3's slicing, priority and forward overlap change the timing, never the maths.
            ("p3", &[]),
            ("p3", &["--scheduler", "credit", "--credit-bytes", "300KB"]),
            // Reduce along the chain to the last worker, its average back around; 2 kB
            // segments so each bucket streams.
            ("ring-reduce", &["--bucket-mb", "0.05"]),
            // Averaging the weights after every worker's own momentum step, exactly, every
            // step, is (by linearity) single-process SGD with momentum.
            ("stepwise", &["--full-sync-every", "1"]),
        ];
        for (i, (strategy, extra)) in variants.into_iter().enumerate() {
            let out = dir
                .path()
                .join(format!("{strategy}-{workers}-{i}.safetensors"));
            let summary = dir.path().join(format!("{strategy}-{workers}-{i}.json"));
            let servers = if strategy.starts_with("ps") || strategy == "p3" {
                2
            } else {
                0
            };
            run_ok(
                launch(strategy, workers, servers)
                    .args(train_flags(batch, steps))
                    .args(extra)
                    .arg("--save")
                    .arg(&out)
                    .arg("--summary-json")
                    .arg(&summary),
            );
            assert_same_weights(
                &read_weights(&out),
                &want,
                &format!("{strategy} with {workers} workers"),
            );
            let json: serde_json::Value =
                serde_json::from_slice(&std::fs::read(&summary).unwrap()).unwrap();
            assert_eq!(json["steps"], steps);
            assert_eq!(json["strategy"], strategy);
            assert!(json["samples_per_sec"].as_f64().unwrap() > 0.0);
        }
    }
}

/// With every frame tagged and checked (the default, which `launch` passes to every
/// process) and with `--no-frame-mac`, ring all-reduce and the parameter server reproduce
/// single-process training: the MACs change what goes on the wire, never what arrives.
#[test]
fn frame_macs_on_or_off_leave_training_exact() {
    let dir = tempfile::tempdir().unwrap();
    let (batch, steps, workers) = (8usize, 6u64, 2usize);
    let want = single_process_weights(dir.path(), batch * workers, steps);
    let cases: [(&str, usize, &[&str], bool); 2] = [
        ("allreduce", 0, &[], true),
        ("ps", 2, &["--no-frame-mac"], false),
    ];
    for (strategy, servers, flags, on) in cases {
        let out = dir.path().join(format!("{strategy}-mac.safetensors"));
        let metrics = dir.path().join(format!("{strategy}-metrics"));
        run_ok(
            launch(strategy, workers, servers)
                .args(flags)
                .args(train_flags(batch, steps))
                .arg("--save")
                .arg(&out)
                .arg("--metrics-dir")
                .arg(&metrics),
        );
        assert_same_weights(
            &read_weights(&out),
            &want,
            &format!("{strategy} with frame MACs {on}"),
        );
        let config = std::fs::read_to_string(metrics.join("config.toml")).unwrap();
        assert!(config.contains(&format!("frame_mac = {on}")), "{config}");
    }
}

/// `--autotune` changes the credit while the job runs: the weights stay exact (the credit
/// orders frames, never changes values), and what the tuner measured and chose is in the
/// summary, in config.toml and on stdout. Without the credit scheduler it is refused.
#[test]
fn an_autotuned_credit_keeps_training_exact_and_is_recorded() {
    let dir = tempfile::tempdir().unwrap();
    let (batch, steps, workers) = (8usize, 20u64, 2usize);
    let want = single_process_weights(dir.path(), batch * workers, steps);
    let out = dir.path().join("tuned.safetensors");
    let metrics = dir.path().join("metrics");
    let summary = dir.path().join("summary.json");
    let text = run_ok(
        launch("p3", workers, 2)
            .args([
                "--scheduler",
                "credit",
                "--credit-bytes",
                "200KB",
                "--autotune",
            ])
            .args(train_flags(batch, steps))
            .arg("--save")
            .arg(&out)
            .arg("--metrics-dir")
            .arg(&metrics)
            .arg("--summary-json")
            .arg(&summary),
    );
    assert_same_weights(&read_weights(&out), &want, "p3 with an autotuned credit");
    assert!(text.contains("autotune: credit"), "{text}");
    let json: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&summary).unwrap()).unwrap();
    let tune = &json["worker0"]["autotune"];
    let trials = tune["trials"].as_array().unwrap();
    assert!(trials.len() >= 2, "{tune}");
    assert_eq!(
        trials[0]["credit_bytes"], 200_000,
        "the search starts at --credit-bytes"
    );
    let config = std::fs::read_to_string(metrics.join("config.toml")).unwrap();
    let parsed: toml::Value = toml::from_str(&config).unwrap();
    assert_eq!(
        parsed["autotune"]["chosen"]["credit_bytes"].as_integer(),
        tune["chosen"]["credit_bytes"].as_i64(),
        "{config}"
    );
    assert_eq!(parsed["sync"]["credit_bytes"].as_integer(), Some(200_000));

    // Per-tensor completion times: every key of every step, in the summary and per step.
    let tensors = &json["worker0"]["tensor_completion"];
    let count = tensors["count"].as_u64().unwrap();
    assert!(
        count.is_multiple_of(steps) && count / steps >= 2,
        "{tensors}"
    );
    let (p50, p99) = (
        tensors["p50_s"].as_f64().unwrap(),
        tensors["p99_s"].as_f64().unwrap(),
    );
    assert!(0.0 < p50 && p50 <= p99 && p99 <= tensors["max_s"].as_f64().unwrap());
    let rows = std::fs::read_to_string(metrics.join("steps-rank0.csv")).unwrap();
    let mut lines = rows.lines();
    assert!(lines
        .next()
        .unwrap()
        .ends_with(",tensors,tensor_p50_s,tensor_p99_s,sent_bytes,sent_before_bytes"));
    let counted: u64 = lines
        .map(|l| l.split(',').nth(8).unwrap().parse::<u64>().unwrap())
        .sum();
    // A row counts what completed during its step; under P3 the last step's values may
    // come back after the last row.
    assert!(
        count - count / steps <= counted && counted <= count,
        "{rows}"
    );

    let refused = launch("p3", 2, 1)
        .arg("--autotune")
        .args(train_flags(batch, 2))
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&refused.stderr);
    assert!(!refused.status.success());
    assert!(
        err.contains("--autotune") && err.contains("credit"),
        "{err}"
    );
}

/// Processes that disagree about frame MACs (one left at the default, one given
/// `--no-frame-mac`) are refused at the rendezvous, naming the flag.
#[test]
fn processes_must_agree_on_frame_macs() {
    let token = JobToken::generate();
    let hex = token.to_hex();
    let (port, _coord) = coordinator(2, 2, 0, token);
    let flags = |mac: bool| {
        let mut f = ONE_ALLREDUCE_STEP.to_vec();
        f.extend(["--quiet", "--connect-timeout", "10"]);
        if !mac {
            f.push("--no-frame-mac");
        }
        f
    };
    let children: Vec<_> = [false, true]
        .into_iter()
        .enumerate()
        .map(|(rank, mac)| {
            process("worker", rank, 2, port, &hex, &flags(mac))
                .stdout(Stdio::null())
                .stderr(Stdio::piped())
                .spawn()
                .unwrap()
        })
        .collect();
    let outputs: Vec<_> = children
        .into_iter()
        .map(|c| c.wait_with_output().unwrap())
        .collect();
    assert!(outputs.iter().all(|o| !o.status.success()));
    let stderr: String = outputs
        .iter()
        .map(|o| String::from_utf8_lossy(&o.stderr).into_owned())
        .collect();
    assert!(stderr.contains("frame MACs"), "{stderr}");
    assert!(stderr.contains("--no-frame-mac"), "{stderr}");
}

/// Ring reduce with 3 workers (a chain whose middle both adds and forwards) reproduces
/// single-process training; step-wise averaging with one worker is single-process training.
#[test]
fn chain_strategies_reproduce_single_process_training() {
    let dir = tempfile::tempdir().unwrap();
    let (batch, steps) = (8usize, 6u64);
    for (strategy, workers) in [("ring-reduce", 3usize), ("stepwise", 1)] {
        let want = single_process_weights(dir.path(), batch * workers, steps);
        let out = dir.path().join(format!("{strategy}.safetensors"));
        run_ok(
            Command::new(EXE)
                .arg("launch")
                .args(["--strategy", strategy, "--workers", &workers.to_string()])
                .args(train_flags(batch, steps))
                .arg("--save")
                .arg(&out),
        );
        let what = format!("{strategy} with {workers} workers");
        assert_same_weights(&read_weights(&out), &want, &what);
    }
}

/// Same seed, same bits: two runs of each parameter-server strategy with 3 workers (whose
/// pushes reach the servers in whatever order the sockets deliver them) end with identical
/// weights, because servers add the pushes in rank order.
#[test]
fn parameter_servers_are_bit_reproducible() {
    let dir = tempfile::tempdir().unwrap();
    for strategy in ["ps", "p3"] {
        let weights: Vec<_> = (0..2)
            .map(|run| {
                let out = dir.path().join(format!("{strategy}-{run}.safetensors"));
                run_ok(
                    Command::new(EXE)
                        .arg("launch")
                        .args(["--strategy", strategy, "--workers", "3", "--servers", "2"])
                        .args(train_flags(8, 6))
                        .arg("--save")
                        .arg(&out),
                );
                read_weights(&out)
            })
            .collect();
        assert!(weights[0] == weights[1], "{strategy}: two runs differ");
    }
}

/// Duration flags with values no clock can hold are refused with a message, not a panic
/// (they used to panic in the workers: "value is either too big or NaN").
#[test]
fn absurd_durations_are_refused_up_front() {
    for flag in [
        "--peer-timeout",
        "--stall-timeout",
        "--connect-timeout",
        "--metrics-interval",
    ] {
        for value in ["inf", "1e30", "-1", "NaN"] {
            let out = Command::new(EXE)
                .args(["launch", &format!("{flag}={value}")])
                .args(train_flags(8, 2))
                .output()
                .unwrap();
            let err = String::from_utf8_lossy(&out.stderr);
            assert_eq!(out.status.code(), Some(2), "{flag} {value}: {err}");
            assert!(err.contains(flag) && !err.contains("panicked"), "{err}");
        }
    }
}

/// `launch --token T` runs the job under T (its processes used T while the launcher's
/// coordinator made up another, so it always failed).
#[test]
fn launch_takes_the_given_token() {
    let token = "ab".repeat(32);
    run_ok(
        Command::new(EXE)
            .args(["launch", "--workers", "2", "--token", &token])
            .args(train_flags(8, 2)),
    );
}

/// The pid of the child of `parent` whose environment says `RANK=rank`.
fn child_with_rank(parent: u32, rank: usize) -> Option<u32> {
    let want = format!("RANK={rank}");
    std::fs::read_dir("/proc").ok()?.flatten().find_map(|e| {
        let pid: u32 = e.file_name().to_str()?.parse().ok()?;
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
        // Field 4 (after the parenthesised name) is the parent's pid.
        let ppid: u32 = stat
            .rsplit(')')
            .next()?
            .split_whitespace()
            .nth(1)?
            .parse()
            .ok()?;
        let env = std::fs::read(format!("/proc/{pid}/environ")).ok()?;
        let has_rank = env.split(|&b| b == 0).any(|v| v == want.as_bytes());
        (ppid == parent && has_rank).then_some(pid)
    })
}

/// A frozen (SIGSTOPped) worker: the others stop within the peer timeout, and `launch` kills
/// it and ends the job within about two seconds more (it used to wait 10 s).
#[test]
fn a_frozen_worker_ends_the_job_within_the_peer_timeout() {
    let mut launch = Command::new(EXE)
        .args(["launch", "--workers", "2", "--peer-timeout", "1"])
        .args([
            "--model",
            "mlp",
            "--dataset",
            "synthetic",
            "--synthetic-samples",
            "256",
        ])
        .args(["--steps", "100000000", "--batch-size", "8", "--quiet"])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(launch.stderr.take().unwrap()).lines();
    while !lines
        .next()
        .expect("launch ended before training")
        .unwrap()
        .contains("[worker 1] rank 1: joined the job")
    {}
    let victim = child_with_rank(launch.id(), 1).expect("worker 1's process");
    let stopped = Instant::now();
    assert!(Command::new("kill")
        .args(["-STOP", &victim.to_string()])
        .status()
        .unwrap()
        .success());
    let drain = std::thread::spawn(move || lines.map_while(Result::ok).collect::<Vec<_>>());
    let status = launch.wait().unwrap();
    let took = stopped.elapsed();
    let _ = Command::new("kill")
        .args(["-9", &victim.to_string()])
        .status();
    let log = drain.join().unwrap().join("\n");
    assert!(!status.success(), "{log}");
    // Peer timeout 1 s, grace 2 s, plus slack for a loaded machine.
    assert!(
        took < Duration::from_secs(7),
        "the job took {took:?}:\n{log}"
    );
    assert!(log.contains("rank 1"), "{log}");
}

/// Step-wise settings are refused for other strategies, naming the flag.
#[test]
fn stepwise_flags_are_refused_for_other_strategies() {
    let out = Command::new(EXE)
        .args([
            "launch",
            "--strategy",
            "allreduce",
            "--full-sync-every",
            "5",
        ])
        .args(train_flags(8, 2))
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        err.contains("--full-sync-every applies to --strategy stepwise"),
        "{err}"
    );
    let out = Command::new(EXE)
        .args([
            "launch",
            "--strategy",
            "stepwise",
            "--stepwise-head",
            "random",
        ])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("rotate"));
}

/// Launches allreduce with 2 workers evaluating every 2 of 6 steps, plus `extra`; returns
/// launch's output and the summary JSON (the run directory is `dir`).
fn launch_replicas(dir: &Path, extra: &[&str]) -> (String, serde_json::Value) {
    let summary = dir.join("summary.json");
    let out = run_ok(
        Command::new(EXE)
            .args(["launch", "--strategy", "allreduce", "--workers", "2"])
            .args(train_flags(8, 6))
            .args(["--eval-every", "2"])
            .args(extra)
            .arg("--metrics-dir")
            .arg(dir)
            .arg("--summary-json")
            .arg(&summary),
    );
    let json = serde_json::from_slice(&std::fs::read(&summary).unwrap()).unwrap();
    (out, json)
}

/// An exact strategy leaves identical replicas: at every evaluation their divergence is 0
/// and their exact average scores exactly what worker 0 scores; the snapshots are removed
/// afterwards, and the bytes per step are reported beside the textbook figure.
#[test]
fn exact_replicas_do_not_diverge_and_average_to_worker_0() {
    let dir = tempfile::tempdir().unwrap();
    let (out, json) = launch_replicas(dir.path(), &[]);
    let evals = json["worker0"]["evaluations"].as_array().unwrap();
    assert_eq!(evals.len(), 3, "{json}");
    for e in evals {
        assert!(e["divergence"].as_f64().unwrap() < 1e-12, "{e}");
        assert_eq!(e["average_accuracy"], e["accuracy"], "{e}");
        assert_eq!(e["average_loss"], e["loss"], "{e}");
    }
    assert!(json["divergence"].as_f64().unwrap() < 1e-12, "{json}");
    assert_eq!(json["average_accuracy"], json["test_accuracy"]);
    let csv = std::fs::read_to_string(dir.path().join("evals-rank0.csv")).unwrap();
    assert!(
        csv.starts_with(
            "epoch,step,t_s,test_accuracy,test_loss,average_accuracy,average_loss,divergence\n"
        ),
        "{csv}"
    );
    assert_eq!(csv.lines().count(), 4, "{csv}");
    assert!(
        out.contains("replicas: divergence 0.000e0, average accuracy"),
        "{out}"
    );
    assert!(!dir.path().join("replicas").exists());
    // Ring all-reduce of 2 workers: each sends the model once a step, plus headers.
    let (sent, textbook) = (
        json["bytes_per_step"].as_f64().unwrap(),
        json["textbook_bytes_per_step"].as_f64().unwrap(),
    );
    assert!(
        textbook > 0.0 && sent >= textbook && sent < 1.05 * textbook,
        "{json}"
    );

    // Switched off: no snapshots, no statistics.
    let (out, json) = launch_replicas(dir.path(), &["--no-replica-stats"]);
    assert!(json["divergence"].is_null() && json["average_accuracy"].is_null());
    assert!(!out.contains("replicas:"), "{out}");
    assert!(!dir.path().join("replicas").exists());
}

/// Under an emulated 1 % frame loss with a 20 ms retransmission timeout, every synchronous
/// strategy still reproduces single-process training (a loss only delays a frame), and the
/// losses are reported in summary.json (the job's seed decides them, so they replay).
#[test]
fn synchronous_strategies_survive_a_lossy_network() {
    let dir = tempfile::tempdir().unwrap();
    let (batch, steps, workers) = (8usize, 20u64, 2usize);
    let want = single_process_weights(dir.path(), batch * workers, steps);
    for strategy in [
        "p3",
        "ps",
        "ps-no-overlap",
        "allreduce",
        "allreduce-no-overlap",
        "ring-reduce",
    ] {
        let out = dir.path().join(format!("{strategy}.safetensors"));
        let summary = dir.path().join(format!("{strategy}.json"));
        let servers = if strategy.starts_with("ps") || strategy == "p3" {
            1
        } else {
            0
        };
        run_ok(
            launch(strategy, 2, servers)
                .args(train_flags(batch, steps))
                .args(["--loss", "1%", "--rto", "20ms"])
                .arg("--save")
                .arg(&out)
                .arg("--summary-json")
                .arg(&summary),
        );
        assert_same_weights(
            &read_weights(&out),
            &want,
            &format!("{strategy} under loss"),
        );
        let json: serde_json::Value =
            serde_json::from_slice(&std::fs::read(&summary).unwrap()).unwrap();
        let lost = json["frames_lost"].as_u64().unwrap();
        assert_eq!(json["frames_retransmitted"].as_u64().unwrap(), lost);
        if strategy == "p3" {
            // P3's 40,000-parameter slices: a few hundred frames from worker 0 in 20 steps.
            assert!(lost > 0, "p3 lost no frame: {json}");
        }
    }
}

/// A compute profile replays over real sockets: every worker ends, steps are counted, and
/// the bytes on the wire are the scaled model's (pushes out, parameters back).
#[test]
fn profile_replay_runs_p3_over_real_links() {
    let dir = tempfile::tempdir().unwrap();
    let summary = dir.path().join("profile.json");
    let mut launch = Command::new(EXE);
    launch.args([
        "launch",
        "--strategy",
        "p3",
        "--workers",
        "2",
        "--servers",
        "2",
        "--model",
        "profile:resnet50",
        "--scale",
        "1/64",
        "--bandwidth",
        "10gbit",
        "--steps",
        "2",
        "--batch-size",
        "128",
        "--quiet",
        "--trace-steps",
        "1..2",
        "--metrics-dir",
    ]);
    launch.arg(dir.path()).arg("--summary-json").arg(&summary);
    run_ok(&mut launch);
    // One merged Chrome trace: both workers' forward and backward spans of step 1.
    let trace: serde_json::Value =
        serde_json::from_slice(&std::fs::read(dir.path().join("trace.json")).unwrap()).unwrap();
    let events = trace["traceEvents"].as_array().unwrap();
    for pid in 0..2 {
        let of = |prefix: &str| {
            events.iter().any(|e| {
                e["pid"] == pid
                    && e["ph"] == "X"
                    && e["args"]["step"] == 1
                    && e["name"].as_str().unwrap().starts_with(prefix)
            })
        };
        assert!(of("forward") && of("backward"), "worker {pid}: {events:?}");
    }
    assert!(events
        .iter()
        .all(|e| e["args"]["step"].is_null() || e["args"]["step"] == 1));
    // Per slice: every worker queues, sends and gets back each slice once; the servers
    // (tracks 2 and 3) receive each push and apply each slice once.
    let count = |pid: Option<u64>, cat: &str| {
        events
            .iter()
            .filter(|e| pid.is_none_or(|p| e["pid"] == p) && e["cat"] == cat)
            .count()
    };
    let slices = count(Some(0), "enqueue");
    assert!(slices > 100, "{slices} slices queued");
    for pid in 0..2 {
        assert_eq!(count(Some(pid), "enqueue"), slices);
        assert_eq!(count(Some(pid), "send"), slices);
        assert_eq!(count(Some(pid), "receive"), slices);
    }
    assert_eq!(count(None, "apply"), slices);
    for pid in 2..4 {
        assert!(count(Some(pid), "apply") > 0, "server track {pid}");
        assert!(count(Some(pid), "send") > 0, "server track {pid}");
    }
    assert_eq!(count(None, "receive"), 4 * slices);
    let json: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&summary).unwrap()).unwrap();
    assert_eq!(json["steps"], 2);
    assert!(json["test_accuracy"].is_null(), "a replay has no accuracy");
    let links = json["worker0"]["links"].as_array().unwrap();
    let sent: u64 = links.iter().map(|l| l[1].as_u64().unwrap()).sum();
    // ResNet-50 / 64 is ~400k parameters: ~1.6 MB pushed per step, plus frame headers.
    let want = 2 * 25_557_032u64.div_ceil(64) * 4;
    assert!(
        sent >= want && sent < want + want / 10,
        "sent {sent}, want ~{want}"
    );
    // The sampler's per-link counters end at the transport's totals.
    let csv = std::fs::read_to_string(dir.path().join("metrics-rank0.csv")).unwrap();
    let header: Vec<&str> = csv.lines().next().unwrap().split(',').collect();
    let last: Vec<&str> = csv.lines().last().unwrap().split(',').collect();
    for link in links {
        let peer = link[0].as_u64().unwrap();
        let column = |name: String| {
            let i = header.iter().position(|h| *h == name).unwrap();
            last[i].parse::<u64>().unwrap()
        };
        assert_eq!(
            column(format!("sent_to_rank{peer}")),
            link[1].as_u64().unwrap()
        );
        assert_eq!(
            column(format!("received_from_rank{peer}")),
            link[2].as_u64().unwrap()
        );
    }
}

/// Flags of a worker of a one-step all-reduce job of 2 workers.
const ONE_ALLREDUCE_STEP: [&str; 6] = ["--strategy", "allreduce", "--workers", "2", "--steps", "1"];

fn coordinator(
    world: usize,
    workers: usize,
    servers: usize,
    token: JobToken,
) -> (u16, std::thread::JoinHandle<()>) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let handle = std::thread::spawn(move || {
        let info = PeerInfo::new(0, Role::Coordinator, 0, "", workers, servers);
        let _ = serve_coordinator(listener, &token, &info, world, Duration::from_secs(30));
    });
    (port, handle)
}

fn process(
    role: &str,
    rank: usize,
    world: usize,
    port: u16,
    token: &str,
    extra: &[&str],
) -> Command {
    let mut cmd = Command::new(EXE);
    cmd.arg(role)
        .args(extra)
        .env("RANK", rank.to_string())
        .env("WORLD_SIZE", world.to_string())
        .env("MASTER_ADDR", "127.0.0.1")
        .env("MASTER_PORT", port.to_string())
        .env("SYNCOPATE_TOKEN", token)
        .env("SYNCOPATE_EXTERNAL_COORDINATOR", "1")
        .stdin(Stdio::null());
    cmd
}

#[test]
fn a_wrong_token_is_refused() {
    let token = JobToken::generate();
    let (port, coord) = coordinator(2, 2, 0, token.clone());
    let wrong = JobToken::generate().to_hex();
    let flags = [&ONE_ALLREDUCE_STEP[..], &["--connect-timeout", "5"]].concat();
    let out = process("worker", 1, 2, port, &wrong, &flags)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(stderr.contains("authentication failed"), "{stderr}");
    drop(coord);
}

#[test]
fn killing_a_worker_makes_the_others_fail_naming_it() {
    let token = JobToken::generate();
    let hex = token.to_hex();
    let (workers, servers) = (3usize, 1usize);
    let world = workers + servers;
    let (port, _coord) = coordinator(world, workers, servers, token);
    let flags = [
        "--strategy",
        "ps",
        "--workers",
        "3",
        "--servers",
        "1",
        "--steps",
        "1000000",
        "--batch-size",
        "8",
        "--synthetic-samples",
        "256",
        "--model",
        "mlp",
        "--quiet",
    ];
    let mut children = Vec::new();
    for rank in 0..world {
        let role = if rank < workers { "worker" } else { "server" };
        let child = process(role, rank, world, port, &hex, &flags)
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        children.push(child);
    }
    // Wait until the victim is training (it says so on stderr), then kill it.
    let victim_err = children[2].stderr.take().unwrap();
    let mut lines = BufReader::new(victim_err).lines();
    loop {
        let line = lines
            .next()
            .expect("victim exited before training")
            .unwrap();
        if line.contains("training") {
            break;
        }
    }
    children[2].kill().unwrap();
    let _ = children[2].wait();
    let deadline = Instant::now() + Duration::from_secs(30);
    for (rank, child) in children.iter_mut().enumerate() {
        if rank == 2 {
            continue;
        }
        loop {
            if let Some(status) = child.try_wait().unwrap() {
                assert!(!status.success(), "rank {rank} should fail");
                break;
            }
            assert!(
                Instant::now() < deadline,
                "rank {rank} did not stop after the kill"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        let mut err = String::new();
        std::io::Read::read_to_string(child.stderr.as_mut().unwrap(), &mut err).unwrap();
        assert!(
            err.contains("rank 2"),
            "rank {rank} must name the lost rank 2:\n{err}"
        );
        assert!(
            err.contains("step"),
            "rank {rank} must name the step:\n{err}"
        );
    }
}

/// `launch` of `strategy` (with `extra` flags) for `steps` steps of the common training.
fn launch_job(strategy: &[&str], steps: u64, extra: &[&str]) -> Command {
    let mut cmd = Command::new(EXE);
    cmd.arg("launch")
        .arg("--strategy")
        .args(strategy)
        .args(train_flags(8, steps))
        .args(extra);
    cmd
}

/// A job stopped after 20 steps and resumed for 20 more ends with the weights of 40 steps
/// run in one go, byte for byte, for every kind of state: all-reduce (momentum on the
/// workers), ps and p3 (shards and momentum on the servers), step-wise averaging (every
/// worker's own weights). A checkpoint of another job is refused.
#[test]
fn a_job_stopped_and_resumed_ends_with_the_uninterrupted_weights() {
    let dir = tempfile::tempdir().unwrap();
    let constant = ["--lr-schedule", "constant"];
    for strategy in [
        &["allreduce", "--workers", "2"][..],
        &["ps", "--workers", "3", "--servers", "2"],
        &["p3", "--workers", "2", "--servers", "1"],
        &["stepwise", "--workers", "3"],
    ] {
        let name = strategy[0];
        let at = |file: &str| dir.path().join(format!("{name}-{file}"));
        let (full, resumed, ck) = (at("full"), at("resumed"), at("checkpoints"));
        let ck_flags = [
            "--checkpoint-every",
            "10",
            "--checkpoint-dir",
            ck.to_str().unwrap(),
        ];
        run_ok(launch_job(strategy, 40, &constant).arg("--save").arg(&full));
        run_ok(launch_job(strategy, 20, &constant).args(ck_flags));
        let log = run_ok(
            launch_job(strategy, 40, &constant)
                .arg("--resume")
                .arg(&ck)
                .arg("--save")
                .arg(&resumed),
        );
        assert!(
            log.contains("resuming from the checkpoint after step 20"),
            "{log}"
        );
        assert!(
            std::fs::read(&full).unwrap() == std::fs::read(&resumed).unwrap(),
            "{name}: the resumed job's weights differ from the uninterrupted job's"
        );
    }
    let ck = dir.path().join("allreduce-checkpoints");
    let refused = |workers: &str, steps: u64, why: &str| {
        let out = launch_job(&["allreduce", "--workers", workers], steps, &constant)
            .arg("--resume")
            .arg(&ck)
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{why}");
        assert!(err.contains(why), "{err}");
    };
    refused("3", 40, "worker count was 2 there and is 3 here");
    // A checkpoint that already holds every step asked for: refused, not a run of nothing.
    refused("2", 20, "step 20, and --steps 20 asks for no more");
}

/// kill -9 of a worker in the middle of a p3 job, then `launch --resume`: the job goes on
/// from the newest checkpoint every process completed and ends with the weights of the
/// uninterrupted job, bit for bit (cosine learning rate over the job's steps, as by default).
#[test]
fn a_killed_job_resumes_to_the_uninterrupted_weights() {
    let dir = tempfile::tempdir().unwrap();
    let p3 = ["p3", "--workers", "2", "--servers", "1"];
    let (full, resumed) = (dir.path().join("full"), dir.path().join("resumed"));
    let ck = dir.path().join("checkpoints");
    let ck_flags = [
        "--checkpoint-every",
        "10",
        "--checkpoint-dir",
        ck.to_str().unwrap(),
    ];
    let steps = 300;
    run_ok(launch_job(&p3, steps, &[]).arg("--save").arg(&full));
    let mut launch = launch_job(&p3, steps, &ck_flags)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let stderr = launch.stderr.take().unwrap();
    let drain = std::thread::spawn(move || {
        BufReader::new(stderr)
            .lines()
            .map_while(Result::ok)
            .collect::<Vec<_>>()
    });
    // Worker 1 wrote its checkpoint after step 20: kill it.
    let written = ck.join("step-00000020").join("rank-1.toml");
    let deadline = Instant::now() + Duration::from_secs(120);
    while !written.exists() {
        assert!(Instant::now() < deadline, "no checkpoint after step 20");
        std::thread::sleep(Duration::from_millis(5));
    }
    if let Some(victim) = child_with_rank(launch.id(), 1) {
        let _ = Command::new("kill")
            .args(["-9", &victim.to_string()])
            .status();
    }
    let status = launch.wait().unwrap();
    let log = drain.join().unwrap().join("\n");
    assert!(!status.success(), "the job survived the kill:\n{log}");
    assert!(log.contains("rank 1"), "{log}");
    let log = run_ok(
        launch_job(&p3, steps, &["--resume", ck.to_str().unwrap()])
            .arg("--save")
            .arg(&resumed),
    );
    assert!(
        log.contains("resuming from the checkpoint after step"),
        "{log}"
    );
    assert!(
        std::fs::read(&full).unwrap() == std::fs::read(&resumed).unwrap(),
        "the resumed job's weights differ from the uninterrupted job's"
    );
}

/// Batch-norm running statistics follow each worker's own batches, so without a relay the
/// workers of a job end with different buffers. At every evaluation point (here the last
/// step) worker 0's buffers are relayed to every worker, down the ring (all-reduce, 3
/// workers: worker 2 gets them through worker 1) or through the first server (p3, 2
/// servers): every worker's checkpoint after the last step then holds the same weights and
/// the same buffers, so every worker evaluates the model as worker 0 does.
#[test]
fn every_worker_ends_with_worker_0s_batch_norm_buffers() {
    let dir = tempfile::tempdir().unwrap();
    for strategy in [
        &["allreduce", "--workers", "3"][..],
        &["p3", "--workers", "3", "--servers", "2"],
    ] {
        let name = strategy[0];
        let ck = dir.path().join(format!("{name}-checkpoints"));
        let flags = train_flags(8, 3).into_iter().map(|f| match f.as_str() {
            "lenet" => "resnet20".to_string(),
            _ => f,
        });
        run_ok(
            Command::new(EXE)
                .args(["launch", "--strategy"])
                .args(strategy)
                .args(flags)
                .args(["--checkpoint-every", "3", "--checkpoint-dir"])
                .arg(&ck),
        );
        let states: Vec<_> = (0..3)
            .map(|rank| {
                read_weights(
                    &ck.join("step-00000003")
                        .join(format!("rank-{rank}.safetensors")),
                )
            })
            .collect();
        let buffers = states[0]
            .iter()
            .filter(|(n, _)| n.contains(".running_"))
            .count();
        assert!(
            buffers > 0,
            "{name}: no batch-norm buffers in the checkpoint"
        );
        for (rank, state) in states.iter().enumerate().skip(1) {
            for ((n, a), (m, b)) in state.iter().zip(&states[0]) {
                assert_eq!(n, m);
                if !n.starts_with("momentum.") {
                    assert!(
                        a == b,
                        "{name}: worker {rank}'s {n} differs from worker 0's"
                    );
                }
            }
        }
    }
}

/// DLCP with a loss bound of 0 needs every packet: the packets the emulated network loses
/// (never retransmitted by it) are found by probes and resent, and the job ends with the
/// weights of single-process training; the servers' counts reach the job's summary.
#[test]
fn dlcp_with_bound_zero_recovers_every_loss_and_reproduces_single_process_training() {
    let dir = tempfile::tempdir().unwrap();
    let (batch, steps) = (8usize, 20u64);
    let want = single_process_weights(dir.path(), batch * 2, steps);
    // Losses at the sender's egress (never written) without frame MACs, then also at the
    // server's ingress (read, tag checked, thrown away) with them (the default).
    let variants: [&[&str]; 2] = [&["--no-frame-mac"], &["--ingress"]];
    for (i, extra) in variants.into_iter().enumerate() {
        let out = dir.path().join(format!("dlcp-{i}.safetensors"));
        let summary = dir.path().join(format!("dlcp-{i}.json"));
        run_ok(
            Command::new(EXE)
                .arg("launch")
                .args(["--strategy", "dlcp", "--workers", "2", "--servers", "1"])
                .args(train_flags(batch, steps))
                .args(["--loss-bound", "0", "--packet-bytes", "1KiB"])
                .args(["--loss", "5%", "--rto", "20ms"])
                .args(extra)
                .arg("--save")
                .arg(&out)
                .arg("--summary-json")
                .arg(&summary),
        );
        assert_same_weights(&read_weights(&out), &want, &format!("dlcp {extra:?}"));
        let json: serde_json::Value =
            serde_json::from_slice(&std::fs::read(&summary).unwrap()).unwrap();
        let lost = json["frames_lost"].as_u64().unwrap();
        let retransmitted = json["frames_retransmitted"].as_u64().unwrap();
        assert!(lost > 0, "the network lost nothing: {json}");
        assert!(
            retransmitted < lost,
            "packets are not retransmitted: {json}"
        );
        assert_eq!(json["dlcp"]["entries_filled"], 0, "{json}");
        let probes = json["dlcp"]["probes_answered"].as_u64().unwrap();
        assert!(probes > 0, "{json}");
        let per_step = json["dlcp"]["probes_per_step"].as_f64().unwrap();
        let steps = json["steps"].as_f64().unwrap();
        assert!((per_step * steps - probes as f64).abs() < 1e-6, "{json}");
        let per_key = json["dlcp"]["realised_loss_per_key"].as_array().unwrap();
        assert!(
            !per_key.is_empty() && per_key.iter().all(|l| l == 0.0),
            "{json}"
        );
        assert_eq!(
            json["dlcp"]["max_key_realised_loss"], 0.0,
            "bound 0 fills nothing"
        );
        assert_eq!(
            json["exact"], false,
            "dlcp is approximate unless its bound is 0"
        );
    }
}

/// DLCP with loss-tolerant pulls (`--pull-loss-bound`): on a lossless network every
/// parameter packet arrives before the share completes, so the weights are single-process
/// training's; under 5 % loss the job completes and worker 0 counts the entries that kept
/// the step before's values.
#[test]
fn dlcp_with_loss_tolerant_pulls_is_exact_without_loss_and_completes_with_it() {
    let dir = tempfile::tempdir().unwrap();
    let (batch, steps) = (8usize, 20u64);
    let want = single_process_weights(dir.path(), batch * 2, steps);
    for (i, loss) in ["0", "5%"].into_iter().enumerate() {
        let out = dir.path().join(format!("pull-{i}.safetensors"));
        let summary = dir.path().join(format!("pull-{i}.json"));
        run_ok(
            Command::new(EXE)
                .arg("launch")
                .args(["--strategy", "dlcp", "--workers", "2", "--servers", "1"])
                .args(train_flags(batch, steps))
                .args(["--loss-bound", "0", "--pull-loss-bound", "5%"])
                .args(["--packet-bytes", "1KiB", "--loss", loss, "--rto", "20ms"])
                .arg("--save")
                .arg(&out)
                .arg("--summary-json")
                .arg(&summary),
        );
        let json: serde_json::Value =
            serde_json::from_slice(&std::fs::read(&summary).unwrap()).unwrap();
        let stale = json["worker0"]["loss"]["entries_stale"].as_u64();
        assert!(stale.is_some(), "{json}");
        if i == 0 {
            assert_same_weights(&read_weights(&out), &want, "dlcp, pull bound, lossless");
            assert_eq!(stale, Some(0), "{json}");
        }
    }
}

/// DLCP over the ring with a loss bound of 0: three workers (each hop between different
/// neighbours), 5 % of the packets lost and recovered by probes, the weights of
/// single-process training; every worker's counts reach the job's summary.
#[test]
fn dlcp_allreduce_with_bound_zero_reproduces_single_process_training() {
    let dir = tempfile::tempdir().unwrap();
    let (batch, steps) = (8usize, 20u64);
    let want = single_process_weights(dir.path(), batch * 3, steps);
    let out = dir.path().join("dlcp-ring.safetensors");
    let summary = dir.path().join("dlcp-ring.json");
    run_ok(
        Command::new(EXE)
            .arg("launch")
            .args(["--strategy", "dlcp-allreduce", "--workers", "3"])
            .args(train_flags(batch, steps))
            .args(["--loss-bound", "0", "--packet-bytes", "1KiB"])
            .args(["--loss", "5%", "--rto", "20ms"])
            .arg("--save")
            .arg(&out)
            .arg("--summary-json")
            .arg(&summary),
    );
    assert_same_weights(&read_weights(&out), &want, "dlcp-allreduce");
    let json: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&summary).unwrap()).unwrap();
    assert!(json["frames_lost"].as_u64().unwrap() > 0, "{json}");
    assert_eq!(json["dlcp"]["entries_filled"], 0, "{json}");
    assert!(
        json["dlcp"]["probes_answered"].as_u64().unwrap() > 0,
        "{json}"
    );
    assert!(json["dlcp"]["entries"].as_u64().unwrap() > 0, "{json}");
    assert_eq!(json["worker0"]["loss"]["entries_filled"], 0, "{json}");
}

/// DLCP's flags are refused with another strategy, and out of range, naming the flag.
#[test]
fn dlcp_flags_are_checked() {
    let refused = |args: &[&str], flag: &str| {
        let out = Command::new(EXE)
            .arg("launch")
            .args(args)
            .args(train_flags(8, 2))
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            !out.status.success() && err.contains(flag),
            "{args:?}: {err}"
        );
    };
    let dlcp = ["--strategy", "dlcp", "--workers", "2", "--servers", "1"];
    refused(
        &[&dlcp[..], &["--loss-bound", "0.7"]].concat(),
        "--loss-bound",
    );
    refused(
        &[&dlcp[..], &["--packet-bytes", "0"]].concat(),
        "--packet-bytes",
    );
    refused(
        &[&dlcp[..], &["--packet-bytes", "6"]].concat(),
        "--packet-bytes",
    );
    refused(
        &[&dlcp[..], &["--packet-bytes", "8MiB"]].concat(),
        "--packet-bytes",
    );
    refused(
        &[&dlcp[..], &["--dlcp-drop-quantile", "2"]].concat(),
        "--dlcp-drop-quantile",
    );
    refused(
        &[&dlcp[..], &["--scheduler", "fifo"]].concat(),
        "--scheduler",
    );
    refused(
        &[&dlcp[..], &["--pull-loss-bound", "0.7"]].concat(),
        "--pull-loss-bound",
    );
    refused(
        &[&dlcp[..], &["--transport", "udp", "--packet-bytes", "2KiB"]].concat(),
        "must fit a 1500-byte MTU",
    );
    refused(
        &[&dlcp[..], &["--transport", "udp", "--loss", "1%"]].concat(),
        "emulation flags",
    );
    refused(
        &[&dlcp[..], &["--udp-addrs", "127.0.0.1"]].concat(),
        "--transport udp only",
    );
    refused(
        &[
            &dlcp[..],
            &[
                "--transport",
                "udp",
                "--paths",
                "2",
                "--udp-addrs",
                "127.0.0.1",
            ],
        ]
        .concat(),
        "one per path",
    );
    let ring = ["--strategy", "dlcp-allreduce", "--workers", "2"];
    refused(
        &[&ring[..], &["--loss-fill", "rescale"]].concat(),
        "--loss-fill rescale",
    );
    refused(
        &[&ring[..], &["--pull-loss-bound", "0.6"]].concat(),
        "--pull-loss-bound",
    );
    let allreduce = ["--strategy", "allreduce", "--workers", "2"];
    refused(
        &[&allreduce[..], &["--pull-loss-bound", "1%"]].concat(),
        "--pull-loss-bound",
    );
    let p3 = ["--strategy", "p3", "--workers", "2", "--servers", "1"];
    refused(&[&p3[..], &["--loss-bound", "1%"]].concat(), "--loss-bound");
    refused(&[&p3[..], &["--dlcp-no-spray"]].concat(), "--dlcp-no-spray");
}

/// Sends a datagram of garbage to every port of the ephemeral range at `ip` (where a job's
/// datagram sockets are bound) until `stop` is set: every one reaches a job's socket, if at
/// all, from an address no peer has. Returns how many it sent.
fn spray_garbage(ip: &str, stop: &std::sync::atomic::AtomicBool) -> u64 {
    use std::sync::atomic::Ordering;
    let range = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .unwrap_or_else(|_| "32768 60999".into());
    let mut bounds = range
        .split_whitespace()
        .filter_map(|p| p.parse::<u16>().ok());
    let (low, high) = (
        bounds.next().unwrap_or(32768),
        bounds.next().unwrap_or(60999),
    );
    let socket = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    let garbage = [0x53u8; 200];
    let mut sent = 0;
    while !stop.load(Ordering::Relaxed) {
        for port in low..=high {
            if socket.send_to(&garbage, (ip, port)).is_ok() {
                sent += 1;
            }
        }
        // Leave the job a core.
        std::thread::sleep(Duration::from_millis(20));
    }
    sent
}

/// DLCP's packets as real UDP datagrams (`--transport udp`) with a loss bound of 0: the
/// weights of single-process training, on a parameter server (the job's datagram sockets
/// on 127.0.0.77, under a spray of garbage datagrams from an address no peer has, which
/// are dropped and counted) and on the ring (two paths: 127.0.0.1 and 127.0.0.2).
#[test]
fn dlcp_over_udp_datagrams_reproduces_single_process_training() {
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;
    let dir = tempfile::tempdir().unwrap();
    let (batch, steps) = (8usize, 20u64);
    let cases: [(&str, usize, &[&str]); 2] = [
        ("dlcp", 2, &["--servers", "1", "--udp-addrs", "127.0.0.77"]),
        ("dlcp-allreduce", 3, &["--paths", "2"]),
    ];
    for (strategy, workers, extra) in cases {
        let want = single_process_weights(dir.path(), batch * workers, steps);
        let out = dir.path().join(format!("{strategy}-udp.safetensors"));
        let summary = dir.path().join(format!("{strategy}-udp.json"));
        let stop = Arc::new(AtomicBool::new(false));
        let sprayer = (strategy == "dlcp").then(|| {
            let stop = stop.clone();
            std::thread::spawn(move || spray_garbage("127.0.0.77", &stop))
        });
        let text = run_ok(
            Command::new(EXE)
                .arg("launch")
                .args(["--strategy", strategy, "--workers", &workers.to_string()])
                .args(["--transport", "udp", "--loss-bound", "0"])
                .args(extra)
                .args(train_flags(batch, steps))
                .arg("--save")
                .arg(&out)
                .arg("--summary-json")
                .arg(&summary),
        );
        stop.store(true, Ordering::Relaxed);
        let sprayed = sprayer.map(|t| t.join().unwrap());
        assert_same_weights(&read_weights(&out), &want, strategy);
        let json: serde_json::Value =
            serde_json::from_slice(&std::fs::read(&summary).unwrap()).unwrap();
        let d = &json["datagrams"];
        assert!(
            d["sent"].as_u64().unwrap() > 0,
            "{strategy}: {json}\n{text}"
        );
        assert!(d["received"].as_u64().unwrap() > 0, "{strategy}: {json}");
        assert_eq!(d["bad_mac"], 0, "{strategy}: {json}");
        if let Some(sprayed) = sprayed {
            assert!(sprayed > 0);
            assert!(
                d["unknown_address"].as_u64().unwrap() > 0,
                "{strategy}: no garbage datagram counted: {json}"
            );
        }
    }
}
