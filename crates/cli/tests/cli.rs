//! The command's own surface: `--help` names every command and nothing promised for later,
//! and `syncopate models` lists every built-in model with figures that add up.

use std::process::Command;

const EXE: &str = env!("CARGO_BIN_EXE_syncopate");

fn stdout(args: &[&str]) -> String {
    let out = Command::new(EXE).args(args).output().unwrap();
    assert!(
        out.status.success(),
        "{args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

#[test]
fn help_names_every_command_and_promises_nothing() {
    let help = stdout(&["--help"]);
    for command in [
        "train",
        "launch",
        "worker",
        "server",
        "models",
        "bench-comm",
        "study",
        "simulate",
        "report",
    ] {
        assert!(
            help.contains(&format!("  {command} ")),
            "{command} missing:\n{help}"
        );
    }
    assert!(!help.contains("(later)"), "{help}");
}

#[test]
fn models_lists_each_model_with_its_parameters() {
    let out = stdout(&["models"]);
    for model in ["mlp", "lenet", "resnet20"] {
        let header = out
            .lines()
            .find(|l| l.starts_with(&format!("{model} ")))
            .unwrap_or_else(|| panic!("{model} missing:\n{out}"));
        // "lenet  (...): 4 layers, 8 keys, 225034 parameters (0.90 MB fp32)": the layers'
        // parameters add up to the model's.
        let total: u64 = header
            .split(" parameters")
            .next()
            .and_then(|h| h.rsplit(' ').next())
            .and_then(|n| n.parse().ok())
            .unwrap_or_else(|| panic!("no parameter count in {header}"));
        let layers: u64 = out
            .lines()
            .skip_while(|l| !l.starts_with(&format!("{model} ")))
            .skip(1)
            .take_while(|l| !l.trim().is_empty())
            .filter_map(|l| {
                l.split(" params")
                    .next()?
                    .rsplit(' ')
                    .next()?
                    .parse::<u64>()
                    .ok()
            })
            .sum();
        assert_eq!(layers, total, "{model}:\n{out}");
    }
}

/// Checkpoint flags that cannot work are refused before any process starts, saying why.
#[test]
fn checkpoint_flags_that_cannot_work_are_refused_up_front() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("missing");
    let job = [
        "launch",
        "--model",
        "lenet",
        "--dataset",
        "synthetic",
        "--steps",
        "2",
    ];
    let cases: [(Vec<&str>, &str); 2] = [
        (
            vec!["--resume", missing.to_str().unwrap()],
            "no such folder",
        ),
        (
            vec!["--checkpoint-every", "2"],
            "--checkpoint-every needs --checkpoint-dir",
        ),
    ];
    for (flags, why) in cases {
        let out = Command::new(EXE).args(job).args(&flags).output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{flags:?}");
        assert!(
            err.contains(why) && !err.contains("launching"),
            "{flags:?}: {err}"
        );
    }
}

/// `--mesh` where it cannot apply (not a ring all-reduce, or 2 workers) is refused before any
/// process starts, rather than silently ignored.
#[test]
fn mesh_where_it_cannot_apply_is_refused_up_front() {
    for flags in [
        ["--strategy", "p3", "--workers", "3"],
        ["--strategy", "allreduce", "--workers", "2"],
    ] {
        let mut flags = flags.to_vec();
        flags.push("--mesh");
        refused_before_any_process(&flags, "--mesh links the workers");
    }
}

/// `launch --model mlp --steps 2 FLAGS` fails with `why` before it starts any process.
fn refused_before_any_process(flags: &[&str], why: &str) {
    let out = Command::new(EXE)
        .args(["launch", "--model", "mlp", "--steps", "2"])
        .args(flags)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{flags:?}");
    assert!(
        err.contains(why) && !err.contains("launching") && !err.contains("[worker 0]"),
        "{flags:?}: {err}"
    );
}

/// A liveness or network setting that no process could run with is refused by `launch`
/// itself, before any worker starts, rather than inside every child (or never: a path count
/// in the billions used to hang).
#[test]
fn impossible_timeouts_and_path_counts_are_refused_up_front() {
    let cases: [(&[&str], &str); 3] = [
        (&["--peer-timeout", "0"], "--peer-timeout must be positive"),
        (&["--paths", "100000000000"], "give 1 to 64"),
        (&["--paths", "0"], "--paths"),
    ];
    for (flags, why) in cases {
        refused_before_any_process(flags, why);
    }
}
