//! `syncopate study`: a small matrix runs for real, writes its CSV and report, and a second
//! invocation keeps the finished runs instead of running them again.

use std::process::Command;

const EXE: &str = env!("CARGO_BIN_EXE_syncopate");

/// Writes the study `text` as `<dir>/<name>.toml` and returns its path.
fn write_study(dir: &std::path::Path, name: &str, text: &str) -> std::path::PathBuf {
    let study = dir.join(format!("{name}.toml"));
    std::fs::write(&study, text).unwrap();
    study
}

/// Runs `syncopate study --quiet --out OUT STUDY`.
fn run_study(out: &std::path::Path, study: &std::path::Path) -> std::process::Output {
    Command::new(EXE)
        .args(["study", "--quiet", "--out"])
        .arg(out)
        .arg(study)
        .output()
        .unwrap()
}

#[test]
fn study_runs_reports_and_resumes() {
    let dir = tempfile::tempdir().unwrap();
    let study = write_study(
        dir.path(),
        "tiny",
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
    );
    let out = dir.path().join("out");
    let run = || {
        let o = run_study(&out, &study);
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
    // The printed table: what varies (the network) and the telling figures, in 100 columns.
    let table: Vec<&str> = first
        .lines()
        .skip_while(|l| !l.starts_with("every run:"))
        .take_while(|l| !l.starts_with("report:"))
        .collect();
    assert_eq!(table.len(), 1 + 1 + 4 + 1, "{first}");
    let columns: Vec<&str> = table[1].split_whitespace().take(2).collect();
    assert_eq!(columns, ["network", "variant"], "{first}");
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
    let study = write_study(
        dir.path(),
        "resumed",
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
    );
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
    let o = run_study(&out, &study);
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

/// A study over a wide-area network entry (bandwidth and latency): the CSV names the
/// network and its latency, and has the bytes a worker sent to the target, the compute
/// utilisation and the bytes per step, each within what the run can have: local SGD
/// averaging every second step sends about half what all-reduce sends every step.
#[test]
fn a_study_over_a_wide_area_network_reports_bytes_to_target_and_utilisation() {
    let dir = tempfile::tempdir().unwrap();
    let study = write_study(
        dir.path(),
        "wan",
        r#"
name = "wan"
steps = 6
warmup_steps = 1
batch_size = 8
workers = [2]
args = ["--dataset", "synthetic", "--synthetic-samples", "256", "--eval-every", "2", "--target-accuracy", "0.01"]
[[networks]]
label = "wan"
bandwidth = "100mbit"
latency = "20ms"
[[models]]
name = "lenet"
[[variants]]
label = "allreduce"
strategy = "allreduce"
[[variants]]
label = "local-sgd H=2"
strategy = "local-sgd"
args = ["--average-every", "2"]
"#,
    );
    let out = dir.path().join("out");
    let o = run_study(&out, &study);
    assert!(o.status.success(), "{o:?}");
    let csv = std::fs::read_to_string(out.join("wan/results.csv")).unwrap();
    let mut lines = csv.lines();
    let header: Vec<&str> = lines.next().unwrap().split(',').collect();
    let rows: Vec<Vec<&str>> = lines.map(|l| l.split(',').collect()).collect();
    assert_eq!(rows.len(), 2, "{csv}");
    let cell = |row: &Vec<&str>, name: &str| -> String {
        let i = header.iter().position(|h| *h == name).unwrap();
        row[i].to_string()
    };
    let number = |row: &Vec<&str>, name: &str| cell(row, name).parse::<f64>().unwrap();
    let mut bytes_per_step = Vec::new();
    for row in &rows {
        assert_eq!(cell(row, "network"), "wan", "{csv}");
        assert_eq!(cell(row, "bandwidth"), "100mbit");
        assert_eq!(number(row, "latency_ms"), 20.0);
        // Every evaluation reaches 1 %: the first one, after step 2, sets the target.
        assert_eq!(number(row, "steps_to_accuracy"), 2.0, "{csv}");
        let per_step = number(row, "bytes_per_step");
        let to_target = number(row, "bytes_to_accuracy");
        assert!(per_step > 0.0, "{csv}");
        // Two of six steps' bytes, measured: more than nothing, less than the whole run.
        assert!(0.0 < to_target && to_target < per_step * 6.0, "{csv}");
        let utilisation = number(row, "compute_utilisation");
        assert!(0.0 < utilisation && utilisation <= 1.0, "{csv}");
        bytes_per_step.push(per_step);
    }
    assert!(
        bytes_per_step[1] < 0.75 * bytes_per_step[0],
        "local SGD every 2nd step sends about half of all-reduce's: {csv}"
    );
    let html = std::fs::read_to_string(out.join("wan/report.html")).unwrap();
    assert!(html.contains("lenet @ wan: accuracy of worker 0 vs MB sent per worker"));
    assert!(html.contains("local-sgd H=2 (local-sgd)"), "the legend");
    let run = out.join("wan/runs/lenet-local-sgd_h_2-wan-w2-s42");
    let toml = std::fs::read_to_string(run.join("run.toml")).unwrap();
    assert!(toml.contains("\"--latency\",\n    \"20ms\""), "{toml}");
    let steps = std::fs::read_to_string(run.join("steps-rank1.csv")).unwrap();
    assert!(
        steps
            .lines()
            .next()
            .unwrap()
            .ends_with(",sent_bytes,sent_before_bytes"),
        "{steps}"
    );
}

/// `studies/autotune-quick.toml`, the credit scheduler with and without `--autotune` in the
/// simulator, p3 first and the rest after: `table.md` (and the report) sets both against p3
/// and says what the search chose, and `matrix.csv` has a row per run with its baseline.
#[test]
fn the_autotune_study_sets_the_credit_scheduler_against_p3() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let study = root.join("studies/autotune-quick.toml");
    let dir = tempfile::tempdir().unwrap();
    // p3 alone first (`--variants`), then the rest of the matrix.
    let o = Command::new(EXE)
        .args(["study", "--quiet", "--variants", "p3", "--out"])
        .arg(dir.path())
        .arg(&study)
        .output()
        .unwrap();
    assert!(o.status.success(), "{o:?}");
    let runs = std::fs::read_dir(dir.path().join("autotune-quick/runs")).unwrap();
    assert_eq!(runs.count(), 1);
    let o = run_study(dir.path(), &study);
    assert!(o.status.success(), "{o:?}");
    let report = std::fs::read_to_string(dir.path().join("autotune-quick/report.html")).unwrap();
    assert!(
        report.contains("profile:resnet50, 4 workers"),
        "the matrix in the report"
    );
    let table = std::fs::read_to_string(dir.path().join("autotune-quick/table.md")).unwrap();
    assert!(
        table.contains("| network | p3 | credit (fixed) | credit --autotune |"),
        "{table}"
    );
    let row = table.lines().last().unwrap();
    assert!(row.starts_with("| 1gbit | 0."), "{table}");
    assert!(row.contains("; after the search "), "{table}");
    let csv = std::fs::read_to_string(dir.path().join("autotune-quick/matrix.csv")).unwrap();
    let baselines: Vec<&str> = csv
        .lines()
        .skip(1)
        .map(|l| l.split(',').nth(7).unwrap())
        .collect();
    assert_eq!(baselines, ["", "p3", "p3"], "{csv}");
}
