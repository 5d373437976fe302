//! Real processes on 127.0.0.1: a resumed job must run with the settings its checkpoint was
//! written with (each difference is named), it reports the whole job's step rows, and a
//! checkpoint's size does not grow with the steps done.

use std::path::Path;
use std::process::Command;

mod common;
use common::{run_ok, text};

const EXE: &str = env!("CARGO_BIN_EXE_syncopate");

/// `launch` of LeNet on a small synthetic set with `flags` after the common ones.
fn launch(steps: u64, flags: &[&str]) -> Command {
    let mut cmd = Command::new(EXE);
    cmd.arg("launch")
        .args(["--model", "lenet", "--dataset", "synthetic"])
        .args(["--synthetic-samples", "4096", "--lr-schedule", "constant"])
        .args(["--steps", &steps.to_string(), "--quiet"])
        .args(flags);
    cmd
}

fn path(p: &Path) -> &str {
    p.to_str().unwrap()
}

/// The reproduction: p3 over two servers, checkpoints after steps 5 and 10, the
/// step-10 one removed. Resuming with another --slice-params, --batch-size, --lr and --seed
/// is refused before training, naming each difference; resuming with the same flags goes
/// on and reports the whole job's step rows.
#[test]
fn a_resume_with_other_settings_is_refused_naming_each_difference() {
    let dir = tempfile::tempdir().unwrap();
    let ck = dir.path().join("ck");
    let job = |slice: &str, batch: &str, lr: &str, seed: &str| {
        let flags = ["--strategy", "p3", "--workers", "2", "--servers", "2"];
        let mut cmd = launch(10, &flags);
        cmd.args(["--slice-params", slice, "--batch-size", batch])
            .args(["--lr", lr, "--seed", seed]);
        cmd
    };
    let original = ("1000", "8", "0.05", "3");
    run_ok(job(original.0, original.1, original.2, original.3).args([
        "--checkpoint-every",
        "5",
        "--checkpoint-dir",
        path(&ck),
    ]));
    std::fs::remove_dir_all(ck.join("step-00000010")).unwrap();
    let out = job("1001", "4", "0.07", "9")
        .args(["--resume", path(&ck)])
        .output()
        .unwrap();
    let log = text(&out);
    assert!(
        !out.status.success(),
        "a resume with other settings ran:\n{log}"
    );
    for said in [
        "plan.slice_params is 1000, this job's is 1001",
        "--batch-size is 8, this job's is 4",
        "--lr is 0.05, this job's is 0.07",
        "--seed is 3, this job's is 9",
    ] {
        assert!(log.contains(said), "{said:?} missing from:\n{log}");
    }
    assert!(!ck.join("step-00000010").exists(), "it trained:\n{log}");

    let metrics = dir.path().join("metrics");
    let log = run_ok(job(original.0, original.1, original.2, original.3).args([
        "--resume",
        path(&ck),
        "--metrics-dir",
        path(&metrics),
    ]));
    assert!(
        log.contains("resuming from the checkpoint after step 5"),
        "{log}"
    );
    let rows = std::fs::read_to_string(metrics.join("steps-rank0.csv")).unwrap();
    let steps: Vec<&str> = rows
        .lines()
        .skip(1)
        .filter_map(|l| l.split(',').next())
        .collect();
    let want: Vec<String> = (1..=10).map(|s| s.to_string()).collect();
    assert_eq!(steps, want, "the step rows of the whole job:\n{rows}");
}

/// A worker's checkpoint holds no per-step rows: after 60 steps it is the size it was after
/// 30 (up to the digits of its times), where rows copied into it would add about 80 bytes
/// a step.
#[test]
fn a_checkpoint_does_not_grow_with_the_steps_done() {
    let dir = tempfile::tempdir().unwrap();
    let ck = dir.path().join("ck");
    run_ok(&mut launch(
        60,
        &[
            "--strategy",
            "allreduce",
            "--workers",
            "2",
            "--batch-size",
            "4",
            "--checkpoint-every",
            "30",
            "--checkpoint-dir",
            path(&ck),
        ],
    ));
    let size = |step: &str| {
        let at = ck.join(format!("step-000000{step}"));
        ["rank-1.json", "rank-1.safetensors"]
            .iter()
            .map(|f| std::fs::metadata(at.join(f)).unwrap().len())
            .sum::<u64>()
    };
    let (early, late) = (size("30"), size("60"));
    assert!(
        late.abs_diff(early) < 200,
        "after 30 steps {early} bytes, after 60 {late}"
    );
    let rows = std::fs::read_to_string(ck.join("rows-rank0.csv")).unwrap();
    assert_eq!(rows.lines().count(), 61, "{rows}");
}
