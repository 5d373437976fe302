use super::*;
use serde_json::json;

fn summary(json: serde_json::Value) -> Summary {
    serde_json::from_value(with_whole_worker0(json)).unwrap()
}

#[test]
fn a_summary_whose_worker0_lacks_a_field_is_an_error_naming_it() {
    let mut json = with_whole_worker0(json!({}));
    json["worker0"]
        .as_object_mut()
        .unwrap()
        .remove("step_seconds");
    let err = serde_json::from_value::<Summary>(json).unwrap_err();
    assert!(
        err.to_string().contains("missing field `step_seconds`"),
        "{err}"
    );
    let err = serde_json::from_value::<Summary>(json!({"steps": 2})).unwrap_err();
    assert!(err.to_string().contains("missing field `worker0`"), "{err}");
}

#[test]
fn bytes_per_step_is_the_mean_over_workers_when_their_metrics_are_there() {
    let s = summary(json!({"steps": 2, "worker0": {"bytes_per_step": 5.0}}));
    let mut r = WorkerResources {
        mean_cpu_percent: 1.0,
        peak_rss_bytes: 1.0,
        net_bytes: 3e6,
        disk_bytes: 0.0,
    };
    assert_eq!(mean_bytes_per_step(&s, &r), 1.5e6);
    r.net_bytes = f64::NAN;
    assert_eq!(
        mean_bytes_per_step(&s, &r),
        5.0,
        "worker 0's without metrics"
    );
    let job_level = summary(json!({"steps": 2, "bytes_per_step": 7.0,
        "worker0": {"bytes_per_step": 5.0}}));
    assert_eq!(mean_bytes_per_step(&job_level, &r), 7.0, "job level first");
    let none = summary(json!({"steps": 2, "bytes_per_step": null,
        "worker0": {"bytes_per_step": null}}));
    assert!(mean_bytes_per_step(&none, &r).is_nan());
}

#[test]
fn figures_are_read_from_the_job_level_first_then_worker_0() {
    let s = summary(json!({"textbook_bytes_per_step": 100.0,
        "worker0": {"textbook_bytes_per_step": 9.0}}));
    assert_eq!(
        first_number([s.textbook_bytes_per_step, s.worker0.textbook_bytes_per_step]),
        100.0
    );
    let s = summary(json!({"textbook_bytes_per_step": null,
        "worker0": {"textbook_bytes_per_step": 9.0}}));
    assert_eq!(
        first_number([s.textbook_bytes_per_step, s.worker0.textbook_bytes_per_step]),
        9.0
    );
    assert!(first_number([f64::NAN, f64::NAN]).is_nan());
}

#[test]
fn evaluations_with_and_without_the_optional_fields() {
    let s = summary(json!({"worker0": {"evaluations": [
        {"step": 1, "seconds": 0.5, "accuracy": 0.3, "loss": 2.0},
        {"step": 2, "seconds": 1.0, "accuracy": 0.6, "loss": 1.0, "average_accuracy": 0.7,
            "divergence": 0.01},
        {"step": 3, "seconds": null, "accuracy": 0.7, "loss": 1.0}
    ]}}));
    let e = timed_evaluations(&s);
    assert_eq!(e.len(), 2);
    assert!(e[0].average_accuracy.is_none() && e[0].divergence.is_none());
    assert_eq!(
        (e[1].average_accuracy, e[1].divergence),
        (Some(0.7), Some(0.01))
    );
    assert!(timed_evaluations(&summary(json!({}))).is_empty());
}

#[test]
fn ideal_bound_is_the_longer_of_compute_and_communication() {
    let compute = ideal_step_seconds("profile:vgg19", None).unwrap();
    assert!((0.7..0.9).contains(&compute), "{compute}");
    // 143.7 M parameters at 1 Gbit/s: 4.6 s of pushing.
    let slow = ideal_step_seconds("profile:vgg19", Some(1e9)).unwrap();
    assert!((slow - 143_667_240.0 * 32.0 / 1e9).abs() < 1e-9);
    assert_eq!(ideal_step_seconds("lenet", Some(1e9)), None);
}

#[test]
fn step_time_runs_from_step_end_to_step_end_after_the_warm_up() {
    // Steps 3 and 5 start after a synchronisation between steps (0.1 s each).
    let ends = [0.5, 0.6, 0.8, 0.9, 1.1];
    let mean = step_seconds_between_ends(&ends, 1).unwrap();
    assert!((mean - 0.15).abs() < 1e-12, "{mean}");
    assert_eq!(step_seconds_between_ends(&ends, 0), Some(1.1 / 5.0));
    // A warm-up as long as the run keeps one step.
    assert!((step_seconds_between_ends(&ends, 9).unwrap() - 0.2).abs() < 1e-12);
    assert_eq!(
        step_seconds_between_ends(&[0.5], 1),
        Some(0.5),
        "one step: its own"
    );
    assert_eq!(step_seconds_between_ends(&[], 0), None);
    assert_eq!(step_seconds_between_ends(&[f64::NAN, 1.0], 1), None);
}
