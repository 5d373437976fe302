//! `scripts/bench_table.py ratio`, the calibration ladder's verdict on a rung: the model's
//! median over the kernel's, its bootstrap interval, and whether the runs can tell agreement
//! within 5 % at all.

use std::process::Command;

/// `(ratio, low, high, verdict)` for the kernel's and the model's times, or `None` without
/// python3.
fn ratio(kernel: &[f64], model: &[f64]) -> Option<(f64, f64, f64, String)> {
    let list = |v: &[f64]| v.iter().map(f64::to_string).collect::<Vec<_>>().join(",");
    let out = match Command::new("python3")
        .args(["../../scripts/bench_table.py", "ratio"])
        .args([list(kernel), list(model)])
        .output()
    {
        Ok(out) => out,
        Err(e) => {
            eprintln!("!!! SKIPPED: bench_table.py needs python3 ({e})");
            return None;
        }
    };
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8(out.stdout).unwrap();
    let fields: Vec<&str> = text.split_whitespace().collect();
    assert_eq!(fields.len(), 4, "{text}");
    let number = |i: usize| fields[i].parse::<f64>().unwrap();
    Some((number(0), number(1), number(2), fields[3].to_string()))
}

#[test]
fn tight_runs_that_agree_are_within() {
    let Some((r, lo, hi, verdict)) = ratio(&[0.835, 0.834, 0.836], &[0.837, 0.837, 0.838]) else {
        return;
    };
    assert!((r - 0.837 / 0.835).abs() < 1e-3);
    assert!(lo <= r && r <= hi);
    assert_eq!(verdict, "within");
}

#[test]
fn tight_runs_twice_as_long_are_outside() {
    let Some((r, _, _, verdict)) = ratio(&[1.0, 1.01, 0.99], &[2.0, 2.02, 1.98]) else {
        return;
    };
    assert!((r - 2.0).abs() < 1e-9);
    assert_eq!(verdict, "outside");
}

#[test]
fn spread_runs_cannot_tell_five_percent() {
    // Equal medians, but runs as spread as the kernel's at 5 % loss: one timeout more or less.
    let kernel = [2.0, 2.5, 2.7, 3.1, 4.3];
    let model = [2.1, 2.4, 2.7, 3.5, 4.9];
    let Some((r, lo, hi, verdict)) = ratio(&kernel, &model) else {
        return;
    };
    assert!((r - 1.0).abs() < 1e-9);
    assert!(lo < 0.95 && hi > 1.05, "{lo}-{hi}");
    assert_eq!(verdict, "undecided");
}

/// The stderr of `bench_table.py ratio ARGS`, which must fail, or `None` without python3.
fn refused(args: &[&str]) -> Option<String> {
    let out = match Command::new("python3")
        .args(["../../scripts/bench_table.py", "ratio"])
        .args(args)
        .output()
    {
        Ok(out) => out,
        Err(e) => {
            eprintln!("!!! SKIPPED: bench_table.py needs python3 ({e})");
            return None;
        }
    };
    assert!(!out.status.success());
    Some(String::from_utf8_lossy(&out.stderr).into_owned())
}

#[test]
fn a_time_that_is_not_one_is_refused() {
    if let Some(err) = refused(&["1,x", "2"]) {
        assert!(err.contains("not a comma-separated list"));
    }
}

#[test]
fn a_goal_that_is_not_a_fraction_is_refused() {
    if let Some(err) = refused(&["1,2", "1,2", "--within", "-1"]) {
        assert!(err.contains("a fraction above 0 and below 1"));
    }
}
