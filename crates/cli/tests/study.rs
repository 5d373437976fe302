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
args = ["--dataset", "synthetic", "--synthetic-samples", "256"]
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
    let csv = std::fs::read_to_string(out.join("tiny/results.csv")).unwrap();
    assert_eq!(csv.lines().count(), 1 + 4, "{csv}");
    let html = std::fs::read_to_string(out.join("tiny/report.html")).unwrap();
    assert!(html.contains("<svg") && html.contains("throughput vs bandwidth"));
    assert!(html.contains("CPU") && html.contains("training loss vs wall time"));
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
