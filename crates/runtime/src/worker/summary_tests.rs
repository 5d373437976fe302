//! The worker's summary, written and read back as the same type.

use super::*;

/// The summary a worker writes reads back as the same type: NaN figures (written as
/// `null`) come back NaN, and a missing field is an error naming it.
#[test]
fn a_written_summary_reads_back_and_a_missing_field_is_named() {
    let summary = WorkerSummary {
        final_loss: f64::NAN,
        step_seconds: vec![0.5, f64::NAN],
        evaluations: vec![EvalPoint {
            step: 3,
            seconds: 1.5,
            accuracy: f64::NAN,
            loss: 2.0,
            average_accuracy: Some(0.5),
            average_loss: None,
            divergence: None,
        }],
        ..WorkerSummary::default()
    };
    let json = serde_json::to_value(&summary).unwrap();
    assert!(json["final_loss"].is_null());
    let back: WorkerSummary = serde_json::from_value(json.clone()).unwrap();
    assert!(back.final_loss.is_nan() && back.step_seconds[1].is_nan());
    assert!(back.evaluations[0].accuracy.is_nan());
    assert_eq!(back.evaluations[0].average_accuracy, Some(0.5));
    let mut partial = json;
    partial.as_object_mut().unwrap().remove("times");
    let err = serde_json::from_value::<WorkerSummary>(partial).unwrap_err();
    assert!(err.to_string().contains("missing field `times`"), "{err}");
}
