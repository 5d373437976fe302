//! Real processes on 127.0.0.1: the periodic and decentralised averaging strategies (local
//! SGD, DiLoCo, gossip, step-wise averaging with a period) train, report what they cost, and
//! DiLoCo resumes bit for bit from a checkpoint taken between two outer steps.

use std::path::Path;
use std::process::{Command, Stdio};

mod common;
use common::{read_weights as weights, run_ok};

const EXE: &str = env!("CARGO_BIN_EXE_syncopate");

/// `launch` of LeNet on a small synthetic set, `workers` workers, `steps` steps of 8
/// samples, the given token, plus `flags`.
fn launch(workers: usize, steps: u64, flags: &[&str]) -> Command {
    let mut cmd = Command::new(EXE);
    cmd.args(["launch", "--workers", &workers.to_string()])
        .args(["--model", "lenet", "--dataset", "synthetic"])
        .args(["--synthetic-samples", "512", "--batch-size", "8"])
        .args(["--lr", "0.05", "--lr-schedule", "constant", "--seed", "3"])
        .args(["--steps", &steps.to_string(), "--quiet"])
        .args(["--token", "5a".repeat(32).as_str()])
        .args(flags)
        .stdin(Stdio::null());
    cmd
}

fn path(p: &Path) -> &str {
    p.to_str().unwrap()
}

/// Runs `flags` and returns worker 0's saved weights and the summary JSON.
fn train(
    dir: &Path,
    name: &str,
    workers: usize,
    flags: &[&str],
) -> (Vec<(String, Vec<f32>)>, serde_json::Value) {
    let save = dir.join(format!("{name}.safetensors"));
    let summary = dir.join(format!("{name}.json"));
    run_ok(
        launch(workers, 12, flags)
            .args(["--eval-every", "6", "--save", path(&save)])
            .args(["--summary-json", path(&summary)])
            .args(["--metrics-dir", path(&dir.join(name))]),
    );
    let json = serde_json::from_slice(&std::fs::read(&summary).unwrap()).unwrap();
    (weights(&save), json)
}

/// With plain SGD (no momentum, no weight decay) averaging the weights after every local
/// step is averaging the gradients: local SGD with H = 1 ends where all-reduce does.
#[test]
fn local_sgd_every_step_with_plain_sgd_ends_where_all_reduce_does() {
    let dir = tempfile::tempdir().unwrap();
    let plain = ["--momentum", "0", "--weight-decay", "0"];
    let local = [
        &["--strategy", "local-sgd", "--average-every", "1"][..],
        &plain,
    ]
    .concat();
    let ring = [&["--strategy", "allreduce"][..], &plain].concat();
    let (a, _) = train(dir.path(), "local", 3, &local);
    let (b, _) = train(dir.path(), "ring", 3, &ring);
    for ((name, x), (_, y)) in a.iter().zip(&b) {
        for (x, y) in x.iter().zip(y) {
            assert!((x - y).abs() <= 1e-5 + 1e-4 * y.abs(), "{name}: {x} vs {y}");
        }
    }
}

/// Every averaging strategy trains over real processes, reports the replicas' divergence
/// and the accuracy of their average, and the periodic ones send about 1/H of what
/// all-reduce sends per step.
#[test]
fn every_averaging_strategy_trains_and_the_periodic_ones_send_less() {
    let dir = tempfile::tempdir().unwrap();
    let (_, ring) = train(dir.path(), "ring", 4, &["--strategy", "allreduce"]);
    let ring_bytes = ring["worker0"]["bytes_per_step"].as_f64().unwrap();
    assert!(ring_bytes > 0.0);
    let runs: [(&str, &[&str], f64); 5] = [
        (
            "local",
            &["--strategy", "local-sgd", "--average-every", "4"],
            0.25,
        ),
        (
            "diloco",
            &["--strategy", "diloco", "--average-every", "4"],
            0.25,
        ),
        (
            "stepwise",
            &["--strategy", "stepwise", "--stepwise-every", "3"],
            1.0 / 6.0,
        ),
        ("gossip", &["--strategy", "gossip"], 4.0 / 3.0),
        // Steps 3, 6, 9 and 12 exact (1.5 M), the other eight gossip (2 M).
        (
            "gossip-full",
            &["--strategy", "gossip", "--full-sync-every", "3"],
            22.0 / 18.0,
        ),
    ];
    for (name, flags, share) in runs {
        let (_, json) = train(dir.path(), name, 4, flags);
        let w0 = &json["worker0"];
        let bytes = w0["bytes_per_step"].as_f64().unwrap();
        let ratio = bytes / ring_bytes;
        // Frame headers and a sync step's fixed costs: within 15 % of the textbook share
        // (step-wise: worker 0 sends M in one of its chain's passes, so a range).
        let (low, high) = match name {
            "stepwise" => (0.0, 0.5),
            _ => (share * 0.85, share * 1.15),
        };
        assert!(
            (low..=high).contains(&ratio),
            "{name}: {bytes} bytes per step is {ratio:.3} of all-reduce's, expected about {share:.3}"
        );
        let evals = w0["evaluations"].as_array().unwrap();
        let divergence = |i: usize| evals[i]["divergence"].as_f64().unwrap();
        assert!(evals[1]["average_accuracy"].is_number(), "{name}: {w0}");
        if name == "local" {
            // Step 6 falls between averagings (after steps 4, 8, 12); step 12 on one.
            assert!(
                divergence(0) > 0.0,
                "local: replicas identical between averagings"
            );
            assert_eq!(
                divergence(1),
                0.0,
                "local: replicas differ after an averaging"
            );
        } else {
            assert!(divergence(1) >= 0.0, "{name}: {w0}");
        }
    }
}

/// DiLoCo checkpointed between two outer steps (a job stopped after step 6, outer steps
/// after steps 4, 8 and 12) and resumed to 12 steps ends with exactly the weights of the
/// uninterrupted 12-step job: the anchor and the outer momentum are in the checkpoint.
#[test]
fn diloco_resumes_bit_for_bit_between_outer_steps() {
    let dir = tempfile::tempdir().unwrap();
    let flags = ["--strategy", "diloco", "--average-every", "4"];
    let full = dir.path().join("full.safetensors");
    run_ok(launch(2, 12, &flags).args(["--save", path(&full)]));
    let ck = dir.path().join("ck");
    run_ok(launch(2, 6, &flags).args(["--checkpoint-every", "3", "--checkpoint-dir", path(&ck)]));
    // The checkpoint holds the anchor and the momentum of each of LeNet's 8 keys.
    let state = weights(&ck.join("step-00000006").join("rank-0.safetensors"));
    let outer = state
        .iter()
        .filter(|(n, _)| n.starts_with("strategy."))
        .count();
    assert_eq!(
        outer,
        16,
        "{:?}",
        state.iter().map(|(n, _)| n).collect::<Vec<_>>()
    );
    let resumed = dir.path().join("resumed.safetensors");
    let log = run_ok(
        launch(2, 12, &flags)
            .args(["--resume", path(&ck), "--save", path(&resumed)])
            .args(["--checkpoint-every", "3", "--checkpoint-dir", path(&ck)]),
    );
    assert!(
        log.contains("after step 6"),
        "not resumed after step 6:\n{log}"
    );
    assert!(
        weights(&full) == weights(&resumed),
        "the resumed job's weights differ from the uninterrupted job's"
    );
}
