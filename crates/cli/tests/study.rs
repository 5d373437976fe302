//! `syncopate study`: a small matrix runs for real, writes its CSV and report, and a second
//! invocation keeps the finished runs instead of running them again.

use std::process::Command;

const EXE: &str = env!("CARGO_BIN_EXE_syncopate");

#[test]
fn study_runs_reports_and_resumes() {
    let dir = tempfile::tempdir().unwrap();
    let study = dir.path().join("tiny.toml");
    std::fs::write(
        &study,
        r#"
name = "tiny"
steps = 3
warmup_steps = 1
batch_size = 8
workers = [2]
servers = 1
bandwidths = ["unlimited", "1gbit"]
args = ["--dataset", "synthetic", "--synthetic-samples", "256", "--eval-every", "1", "--target-accuracy", "0.01"]
[[models]]
name = "lenet"
[[variants]]
label = "ps (fifo)"
strategy = "ps"
[[variants]]
label = "p3"
strategy = "p3"
"#,
    )
    .unwrap();
    let out = dir.path().join("out");
    let run = || {
        let o = Command::new(EXE)
            .args(["study", "--quiet", "--out"])
            .arg(&out)
            .arg(&study)
            .output()
            .unwrap();
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&o.stdout),
            String::from_utf8_lossy(&o.stderr)
        );
        assert!(o.status.success(), "{text}");
        text
    };
    let first = run();
    assert!(first.contains("report:"), "{first}");
    // The printed table: what varies (the bandwidth) and the telling figures, in 100 columns.
    let table: Vec<&str> = first
        .lines()
        .skip_while(|l| !l.starts_with("every run:"))
        .take_while(|l| !l.starts_with("report:"))
        .collect();
    assert_eq!(table.len(), 1 + 1 + 4 + 1, "{first}");
    assert!(table[1].starts_with("bandwidth variant"), "{first}");
    assert!(table.iter().all(|l| l.chars().count() <= 100), "{first}");
    let csv = std::fs::read_to_string(out.join("tiny/results.csv")).unwrap();
    assert_eq!(csv.lines().count(), 1 + 4, "{csv}");
    let html = std::fs::read_to_string(out.join("tiny/report.html")).unwrap();
    assert!(html.contains("<svg") && html.contains("throughput vs bandwidth"));
    assert!(html.contains("CPU") && html.contains("training loss vs wall time"));
    assert!(
        html.contains("training time to 1.0 % test accuracy"),
        "{html}"
    );
    // Every run records its processes' resources and worker 0's steps.
    let runs = out.join("tiny/runs");
    for run in std::fs::read_dir(&runs).unwrap() {
        let dir = run.unwrap().path();
        for rank in 0..3 {
            let m = std::fs::read_to_string(dir.join(format!("metrics-rank{rank}.csv"))).unwrap();
            assert!(
                m.starts_with("t_s,cpu_user_pct") && m.lines().count() >= 3,
                "{m}"
            );
        }
        let steps = std::fs::read_to_string(dir.join("steps-rank0.csv")).unwrap();
        assert_eq!(steps.lines().count(), 1 + 3, "{steps}");
        // Evaluations every step; any accuracy reaches 1 %, so the first one sets the time.
        let evals = std::fs::read_to_string(dir.join("evals-rank0.csv")).unwrap();
        assert_eq!(evals.lines().count(), 1 + 3, "{evals}");
        let summary: serde_json::Value =
            serde_json::from_slice(&std::fs::read(dir.join("summary.json")).unwrap()).unwrap();
        assert_eq!(summary["steps_to_accuracy"], 1, "{summary}");
        assert!(summary["time_to_accuracy_s"].as_f64().unwrap() > 0.0);
        // The resolved config and the final weights.
        let config: toml::Value =
            toml::from_str(&std::fs::read_to_string(dir.join("config.toml")).unwrap()).unwrap();
        assert!(["ps", "p3"].contains(&config["sync"]["strategy"].as_str().unwrap()));
        assert_eq!(config["job"]["workers"].as_integer(), Some(2));
        assert_eq!(config["job"]["settings"]["model"].as_str(), Some("lenet"));
        assert!(config["sync"]["slice_params"].as_integer().unwrap() > 0);
        let weights = std::fs::read(dir.join("weights.safetensors")).unwrap();
        let tensors = safetensors::SafeTensors::deserialize(&weights).unwrap();
        assert!(tensors.len() >= 8, "{:?}", tensors.names());
    }
    // Interrupted study: one run's summary is gone; only that run runs again.
    let victim = std::fs::read_dir(&runs)
        .unwrap()
        .next()
        .unwrap()
        .unwrap()
        .path();
    std::fs::remove_file(victim.join("summary.json")).unwrap();
    let second = run();
    assert!(
        second.contains("3 run(s) were already finished"),
        "{second}"
    );
    assert!(victim.join("summary.json").is_file());
}

/// A run interrupted after a checkpoint resumes from it: the study goes on from step 10
/// rather than from scratch, and the run's figures cover all 20 steps (the evaluations and
/// step rows made before the interruption come back from the checkpoint).
#[test]
fn an_interrupted_run_resumes_from_its_checkpoint() {
    let dir = tempfile::tempdir().unwrap();
    let study = dir.path().join("resumed.toml");
    std::fs::write(
        &study,
        r#"
name = "resumed"
steps = 20
warmup_steps = 1
batch_size = 8
workers = [2]
bandwidths = ["unlimited"]
args = ["--dataset", "synthetic", "--synthetic-samples", "256", "--eval-every", "5", "--lr-schedule", "constant"]
[[models]]
name = "lenet"
[[variants]]
label = "allreduce"
strategy = "allreduce"
"#,
    )
    .unwrap();
    let out = dir.path().join("out");
    let run_dir = out.join("resumed/runs/lenet-allreduce-unlimited-w2-s42");
    // The first half of the run, as an interrupted study would have left it.
    let first_half = Command::new(EXE)
        .args([
            "launch",
            "--model",
            "lenet",
            "--strategy",
            "allreduce",
            "--workers",
            "2",
        ])
        .args(["--steps", "10", "--batch-size", "8", "--seed", "42"])
        .args([
            "--dataset",
            "synthetic",
            "--synthetic-samples",
            "256",
            "--eval-every",
            "5",
        ])
        .args([
            "--lr-schedule",
            "constant",
            "--quiet",
            "--checkpoint-every",
            "10",
        ])
        .arg("--checkpoint-dir")
        .arg(run_dir.join("checkpoints"))
        .output()
        .unwrap();
    assert!(first_half.status.success(), "{first_half:?}");
    let o = Command::new(EXE)
        .args(["study", "--quiet", "--out"])
        .arg(&out)
        .arg(&study)
        .output()
        .unwrap();
    assert!(o.status.success(), "{o:?}");
    let log = std::fs::read_to_string(run_dir.join("log.txt")).unwrap();
    assert!(
        log.contains("resuming the interrupted run after its step 10"),
        "{log}"
    );
    let evals = std::fs::read_to_string(run_dir.join("evals-rank0.csv")).unwrap();
    let steps: Vec<&str> = evals
        .lines()
        .skip(1)
        .map(|l| l.split(',').nth(1).unwrap())
        .collect();
    // Every 5 steps and at the epoch's end (256 samples / (2 x 8) = 16 steps).
    assert_eq!(steps, ["5", "10", "15", "16", "20"], "{evals}");
    let rows = std::fs::read_to_string(run_dir.join("steps-rank0.csv")).unwrap();
    assert_eq!(rows.lines().count(), 1 + 20, "{rows}");
    assert!(
        !run_dir.join("checkpoints").exists(),
        "a finished run keeps no checkpoints"
    );
}
