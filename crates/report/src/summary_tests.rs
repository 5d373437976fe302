use super::*;
use serde_json::json;

/// A summary as worker 0 writes it, with `launch`'s additions.
fn written() -> Value {
    let mut summary = json!({
        "command": "launch", "strategy": "dlcp", "exact": false, "averages": "gradients",
        "effective_contributors": 4.0, "workers": 4, "servers": 2,
        "network": {"bandwidth_bps": 1e8}, "frames_lost": 7, "frames_retransmitted": 3,
        "frames_dropped": 0, "test_accuracy": 0.8, "test_loss": 0.5, "final_loss": 0.6,
        "steps": 120, "wall_seconds": 30.0, "samples_per_sec": 512.0,
        "epoch_accuracy": [0.7, null], "target_accuracy": 0.78, "time_to_accuracy_s": 20.0,
        "steps_to_accuracy": 90, "average_accuracy": 0.81, "average_loss": 0.49,
        "divergence": 0.002, "bytes_per_step": 2e6, "textbook_bytes_per_step": 1.8e6,
    });
    summary["worker0"] = json!({
        "rank": 0, "step_seconds": [0.5, 0.25], "times": {"data": 0.1, "compute": 1.0,
        "wait": 0.4, "optimizer": 0.0}, "bytes_per_step": 2e6,
        "textbook_bytes_per_step": 1.8e6,
        "evaluations": [{"step": 30, "seconds": 5.0, "accuracy": 0.6, "loss": 1.0,
            "average_accuracy": 0.65, "average_loss": 0.9, "divergence": 0.01}],
        "tensor_completion": {"count": 8, "p50_s": 0.01, "p99_s": 0.03, "max_s": 0.04}
    });
    summary["settings"] = json!({"model": "lenet"});
    summary["dlcp"] = json!({"entries": 10, "packets": 4, "realised_loss": 0.0125,
        "probes_per_step": 0.5, "max_key_realised_loss": 0.02,
        "realised_loss_per_key": [0.01, 0.02]});
    summary
}

#[test]
fn a_written_summary_reads_back_typed() {
    let s: JobSummary<Value> = serde_json::from_value(written()).unwrap();
    assert_eq!(
        (s.command.as_str(), s.strategy.as_str()),
        ("launch", "dlcp")
    );
    assert_eq!((s.workers, s.servers, s.steps), (4, 2, 120));
    assert_eq!(s.frames_lost, Some(7));
    assert_eq!(s.test_accuracy, 0.8);
    assert_eq!(s.epoch_accuracy[0], 0.7);
    assert!(s.epoch_accuracy[1].is_nan(), "null reads as NaN");
    assert_eq!(
        (s.target_accuracy, s.time_to_accuracy_s),
        (Some(0.78), Some(20.0))
    );
    assert_eq!(
        (s.average_accuracy, s.divergence),
        (Some(0.81), Some(0.002))
    );
    assert_eq!(s.worker0, written()["worker0"]);
    let dlcp = s.dlcp.as_ref().unwrap();
    assert_eq!(dlcp.realised_loss, 0.0125);
    assert_eq!(dlcp.counters["packets"], 4);
    assert_eq!(s.averages, "gradients");
    assert_eq!(s.settings["model"], "lenet");
}

/// The summary of a run older than most job-level fields still reads: NaN, `None` or empty
/// for what it lacks; worker 0's summary is required.
#[test]
fn an_old_summary_reads_with_what_it_lacks_absent() {
    let s: JobSummary<Value> = serde_json::from_str(r#"{"worker0": {}}"#).unwrap();
    assert!(s.test_accuracy.is_nan() && s.wall_seconds.is_nan() && s.bytes_per_step.is_nan());
    assert_eq!(s.steps, 0);
    assert_eq!(
        (s.frames_lost, s.target_accuracy, s.average_accuracy),
        (None, None, None)
    );
    assert!(s.dlcp.is_none() && s.epoch_accuracy.is_empty());
    let err = serde_json::from_str::<JobSummary<Value>>("{}").unwrap_err();
    assert!(err.to_string().contains("missing field `worker0`"), "{err}");
}

/// The field names and their order, as the summary files have always had them; the writer
/// serialises this very type, so a file keeps its bytes.
#[test]
fn fields_are_written_in_the_files_order() {
    let s: JobSummary<Value> = serde_json::from_value(written()).unwrap();
    let text = serde_json::to_string_pretty(&s).unwrap();
    let keys: Vec<&str> = text
        .lines()
        .filter(|l| l.starts_with("  \"") && !l.starts_with("    "))
        .filter_map(|l| l.trim().split('"').nth(1))
        .collect();
    assert_eq!(
        keys,
        [
            "command",
            "strategy",
            "exact",
            "averages",
            "effective_contributors",
            "workers",
            "servers",
            "network",
            "frames_lost",
            "frames_retransmitted",
            "frames_dropped",
            "test_accuracy",
            "test_loss",
            "final_loss",
            "steps",
            "wall_seconds",
            "samples_per_sec",
            "epoch_accuracy",
            "target_accuracy",
            "time_to_accuracy_s",
            "steps_to_accuracy",
            "average_accuracy",
            "average_loss",
            "divergence",
            "bytes_per_step",
            "textbook_bytes_per_step",
            "worker0",
            "settings",
            "dlcp",
        ]
    );
    // As worker 0 writes it: no `dlcp`, NaN as null, and the optional figures as null.
    let mut first = s.clone();
    first.dlcp = None;
    first.test_accuracy = f64::NAN;
    first.average_accuracy = None;
    let again = serde_json::to_value(&first).unwrap();
    assert!(again.get("dlcp").is_none());
    assert!(again["test_accuracy"].is_null() && again["average_accuracy"].is_null());
    assert_eq!(
        again["worker0"],
        written()["worker0"],
        "worker 0's summary as written"
    );
    let back: JobSummary<Value> = serde_json::from_value(again).unwrap();
    assert!(back.test_accuracy.is_nan());
}
