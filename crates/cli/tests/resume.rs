//! Real processes on 127.0.0.1: a resumed job must run with the settings its checkpoint was
//! written with (each difference is named), it reports the whole job's step rows, and a
//! checkpoint's size does not grow with the steps done.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

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
        "plan.slice_params was 1000 there and is 1001 here",
        "--batch-size was 8 there and is 4 here",
        "--lr was 0.05 there and is 0.07 here",
        "--seed was 3 there and is 9 here",
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

/// A worker's checkpoint holds no per-step rows and no evaluations: after 60 steps it is
/// the size it was after 30 (up to the digits of its times), where rows copied into it
/// would add about 80 bytes a step and evaluations about 100 bytes each (rank 0 evaluates
/// every 5 steps).
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
            "--eval-every",
            "5",
        ],
    ));
    let size = |step: &str, rank: usize| {
        let at = ck.join(format!("step-000000{step}"));
        [".json", ".safetensors"]
            .iter()
            .map(|f| {
                std::fs::metadata(at.join(format!("rank-{rank}{f}")))
                    .unwrap()
                    .len()
            })
            .sum::<u64>()
    };
    for rank in [0, 1] {
        let (early, late) = (size("30", rank), size("60", rank));
        assert!(
            late.abs_diff(early) < 200,
            "rank {rank}: after 30 steps {early} bytes, after 60 {late}"
        );
    }
    let rows = std::fs::read_to_string(ck.join("rows-rank0.csv")).unwrap();
    assert_eq!(rows.lines().count(), 61, "{rows}");
    let evals = std::fs::read_to_string(ck.join("evals-rank0.csv")).unwrap();
    assert_eq!(evals.lines().count(), 13, "{evals}");
}

/// The step folders of `ck` whose every rank (of `world`) has written its manifest, oldest
/// first.
fn complete_steps(ck: &Path, world: usize) -> Vec<PathBuf> {
    let mut steps: Vec<PathBuf> = std::fs::read_dir(ck)
        .map(|d| d.flatten().map(|e| e.path()).collect())
        .unwrap_or_default();
    steps.retain(|p| {
        p.file_name()
            .is_some_and(|n| n.to_string_lossy().starts_with("step-"))
            && (0..world).all(|r| p.join(format!("rank-{r}.toml")).is_file())
    });
    steps.sort();
    steps
}

fn names(steps: &[PathBuf]) -> Vec<String> {
    steps
        .iter()
        .map(|p| p.file_name().unwrap().to_string_lossy().into_owned())
        .collect()
}

/// The sequence: a job runs to its end in a checkpoint folder; a new job with other
/// settings in the same folder is refused up front, naming the folders it would delete;
/// told to replace them, it runs and is killed with SIGKILL once it has written
/// checkpoints. Its checkpoints survive (pruning counts only its own steps), and a resume
/// with its settings goes on from its newest one.
#[test]
fn a_new_job_in_a_used_checkpoint_folder_keeps_its_own_checkpoints() {
    let dir = tempfile::tempdir().unwrap();
    let ck = dir.path().join("ck");
    let common = [
        "--strategy",
        "allreduce",
        "--workers",
        "2",
        "--batch-size",
        "4",
    ];
    let every = ["--checkpoint-every", "5", "--checkpoint-dir", path(&ck)];
    run_ok(launch(20, &common).args(every));
    assert_eq!(
        names(&complete_steps(&ck, 2)),
        ["step-00000015", "step-00000020"]
    );

    let second = |steps: u64| {
        let mut cmd = launch(steps, &common);
        cmd.args(["--lr", "0.2"]);
        cmd
    };
    let out = second(400)
        .args(["--bandwidth", "20mbit"])
        .args(every)
        .output()
        .unwrap();
    let log = text(&out);
    assert!(
        !out.status.success(),
        "a fresh job ran in a used folder:\n{log}"
    );
    for said in ["step-00000015", "step-00000020", "--replace-checkpoints"] {
        assert!(log.contains(said), "{said:?} missing from:\n{log}");
    }
    assert_eq!(
        complete_steps(&ck, 2).len(),
        2,
        "the refusal deleted something"
    );

    let mut job = second(400)
        .args(["--bandwidth", "20mbit", "--replace-checkpoints"])
        .args(every)
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(300);
    // The newest step the second job completed (it keeps its two newest, so three written
    // checkpoints show as step 15).
    let newest_second = |ck: &Path| {
        (complete_steps(ck, 2).iter())
            .filter(|p| {
                std::fs::read_to_string(p.join("rank-0.toml"))
                    .is_ok_and(|m| m.contains("--lr = \"0.2\""))
            })
            .filter_map(|p| names(std::slice::from_ref(p)).pop())
            .filter_map(|n| n.trim_start_matches("step-").parse::<u64>().ok())
            .max()
            .unwrap_or(0)
    };
    while newest_second(&ck) < 15 {
        assert!(
            Instant::now() < deadline,
            "the second job wrote no 3 checkpoints"
        );
        assert!(
            job.try_wait().unwrap().is_none(),
            "the second job ended early"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    job.kill().unwrap(); // SIGKILL; its processes die with it (parent-death signal)
    job.wait().unwrap();
    let kept = complete_steps(&ck, 2);
    assert!(kept.len() >= 2, "{:?}", names(&kept));
    for step in &kept {
        let manifest = std::fs::read_to_string(step.join("rank-0.toml")).unwrap();
        assert!(
            manifest.contains("--lr = \"0.2\""),
            "{} is not the second job's:\n{manifest}",
            step.display()
        );
    }
    let newest = names(&kept).pop().unwrap();
    let done: u64 = newest.trim_start_matches("step-").parse().unwrap();
    // The same settings (the schedule's length is the job's), on an unshaped link.
    let log = run_ok(second(400).args(["--resume", path(&ck)]));
    assert!(
        log.contains(&format!("resuming from the checkpoint after step {done}")),
        "{log}"
    );
}

/// `--resume d --checkpoint-dir e` goes on under d's token and run, keeping the token in e
/// (0600) so that a later `--resume e` finds it; a token file others may write is refused.
#[test]
fn a_job_resumes_into_another_folder() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    let (d, e) = (dir.path().join("d"), dir.path().join("e"));
    let common = [
        "--strategy",
        "allreduce",
        "--workers",
        "2",
        "--batch-size",
        "4",
    ];
    run_ok(launch(10, &common).args(["--checkpoint-every", "5", "--checkpoint-dir", path(&d)]));
    let log = run_ok(launch(15, &common).args(["--resume", path(&d)]).args([
        "--checkpoint-every",
        "5",
        "--checkpoint-dir",
        path(&e),
    ]));
    assert!(
        log.contains("resuming from the checkpoint after step 10"),
        "{log}"
    );
    let token = e.join("job.token");
    assert_eq!(
        std::fs::read(&token).unwrap(),
        std::fs::read(d.join("job.token")).unwrap()
    );
    let mode = std::fs::metadata(&token).unwrap().permissions().mode();
    assert_eq!(mode & 0o777, 0o600);
    assert_eq!(names(&complete_steps(&e, 2)), ["step-00000015"]);
    let log = run_ok(launch(20, &common).args(["--resume", path(&e)]));
    assert!(
        log.contains("resuming from the checkpoint after step 15"),
        "{log}"
    );

    std::fs::set_permissions(&token, std::fs::Permissions::from_mode(0o666)).unwrap();
    let out = launch(25, &common)
        .args(["--resume", path(&e)])
        .output()
        .unwrap();
    let log = text(&out);
    assert!(
        !out.status.success(),
        "a world-writable token was taken:\n{log}"
    );
    assert!(log.contains("chmod 600"), "{log}");
}

/// `--token-file PATH` that does not exist yet: `launch` keeps the token it generates there
/// (0600), not in the checkpoint folder, and a resume with the same flag finds it.
#[test]
fn a_generated_token_can_be_kept_outside_the_checkpoint_folder() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    let (ck, token) = (dir.path().join("ck"), dir.path().join("secret/job.token"));
    std::fs::create_dir_all(token.parent().unwrap()).unwrap();
    let common = [
        "--strategy",
        "allreduce",
        "--workers",
        "2",
        "--batch-size",
        "4",
    ];
    let flags = ["--token-file", path(&token), "--checkpoint-every", "5"];
    run_ok(
        launch(10, &common)
            .args(flags)
            .args(["--checkpoint-dir", path(&ck)]),
    );
    assert!(!ck.join("job.token").exists());
    let mode = std::fs::metadata(&token).unwrap().permissions().mode();
    assert_eq!(mode & 0o777, 0o600);
    let log = run_ok(
        launch(15, &common)
            .args(flags)
            .args(["--resume", path(&ck)]),
    );
    assert!(
        log.contains("resuming from the checkpoint after step 10"),
        "{log}"
    );
}
