use super::*;

const STUDY: &str = r#"
name = "matrix"
kind = "simulate"
steps = 4
warmup_steps = 1
workers = [2]
seeds = [0]
bandwidths = ["10gbit"]
networks = [{ label = "loss 1 %", bandwidth = "10gbit", args = ["--loss", "1%"] }]
[[models]]
name = "profile:resnet50"
[[models]]
name = "profile:vgg16"
workers = [3]
[[variants]]
label = "p3"
strategy = "p3"
[[variants]]
label = "dlcp"
strategy = "dlcp"
baseline = "p3"
[[variants]]
label = "tuned"
strategy = "p3"
scheduler = "credit"
args = ["--autotune"]
baseline = "p3"
"#;

/// A real report of a tiny simulation, its step times set to `steps`.
fn report(steps: &[f64]) -> SimReport {
    let profile = syncopate_core::profile::ModelProfile::builtin("resnet50").unwrap();
    let allreduce = syncopate_core::strategy::StrategyKind::Allreduce;
    let mut sim = syncopate_sim::SimConfig::new(allreduce, 2, 0);
    (sim.scale, sim.steps) = (1.0 / 1024.0, 1);
    let mut report = syncopate_sim::simulate(&profile, &sim).unwrap();
    report.step_seconds = steps.to_vec();
    report
}

/// Writes every run's report under `dir`: p3 steps of 2 s, dlcp of 1 s with a value in
/// four filled in, the tuned run of 3 s during its two-step search and 1 s after it; the
/// last network's tuned run has not finished.
fn write_runs(config: &StudyConfig, dir: &Path) {
    let runs = config.runs();
    for (i, run) in runs.iter().enumerate() {
        let mut r = match run.variant.as_str() {
            "p3" => report(&[9.0, 2.0, 2.0, 2.0]),
            "dlcp" => report(&[9.0, 1.0, 1.0, 1.0]),
            _ if i + 1 == runs.len() => continue,
            _ => report(&[3.0, 3.0, 1.0, 1.0]),
        };
        if run.variant == "dlcp" {
            r.dlcp = Some(syncopate_core::strategy::LossStats {
                entries: 4,
                entries_filled: 1,
                ..Default::default()
            });
        }
        if run.variant == "tuned" {
            r.autotune = Some(syncopate_core::tune::TuneReport {
                chosen: syncopate_core::tune::Knobs {
                    credit_bytes: (2e6 * r.config.scale) as usize,
                },
                settled: true,
                retunes: 0,
                settled_after_steps: Some(1),
                trials: Vec::new(),
            });
        }
        let run_dir = dir.join("runs").join(&run.id);
        std::fs::create_dir_all(&run_dir).unwrap();
        std::fs::write(summary_path(&run_dir), serde_json::to_string(&r).unwrap()).unwrap();
    }
}

#[test]
fn a_simulated_matrix_sets_each_variant_against_its_baseline() {
    let config = StudyConfig::parse(STUDY).unwrap();
    let runs = config.runs();
    // Two networks of resnet50 at 2 workers, vgg16's at 3, three variants each.
    assert_eq!(runs.len(), 12);
    assert_eq!(runs[11].workers, 3);
    assert!(runs[3].args.windows(2).any(|w| w == ["--loss", "1%"]));
    let dir = tempfile::tempdir().unwrap();
    write_runs(&config, dir.path());
    let rows = collect(&config, dir.path()).unwrap();
    assert_eq!(rows.len(), 11, "the unfinished run is left out");
    let (p3, dlcp, tuned) = (&rows[0], &rows[1], &rows[2]);
    assert_eq!((p3.step_seconds, p3.baseline.as_str()), (2.0, ""));
    assert!(p3.over_baseline.is_nan() && p3.filled_share.is_none());
    assert_eq!((dlcp.over_baseline, dlcp.filled_share), (0.5, Some(0.25)));
    assert_eq!(tuned.step_seconds, 5.0 / 3.0);
    assert_eq!(tuned.search_steps, Some(1));
    assert_eq!(
        (tuned.step_after_search, tuned.baseline_after_search),
        (Some(1.0), Some(2.0))
    );
    assert!((tuned.credit_bytes.unwrap() - 2e6).abs() < 1e3);
    write(&config, dir.path(), &rows).unwrap();
    let table = std::fs::read_to_string(dir.path().join("table.md")).unwrap();
    assert!(table.contains("profile:vgg16, 3 workers"), "{table}");
    assert!(table.contains("| network | p3 | dlcp | tuned |"), "{table}");
    assert!(
        table.contains(
            "| 10gbit | 2.000 | 1.000 (0.50), 25.00 % filled | 1.667 (0.83); after the \
             search 1.000 (0.50), credit 2.00 MB in 1 steps |"
        ),
        "{table}"
    );
    assert!(
        table.trim_end().ends_with("| - |"),
        "the unfinished cell: {table}"
    );
    let csv = std::fs::read_to_string(dir.path().join("matrix.csv")).unwrap();
    assert!(csv.starts_with("id,model,workers,network,seed,variant,step_seconds,baseline"));
    assert_eq!(csv.lines().count(), 12);
}

#[test]
fn a_baseline_must_name_another_variant_of_a_simulated_study() {
    let load = |text: &str| StudyConfig::parse(text).map_err(|e| format!("{e:#}"));
    let err = load(&STUDY.replace(
        "baseline = \"p3\"\n[[variants]]",
        "baseline = \"p4\"\n[[variants]]",
    ))
    .unwrap_err();
    assert!(
        err.contains("its baseline 'p4' is not another variant's label"),
        "{err}"
    );
    let err = load(&STUDY.replace("kind = \"simulate\"", "kind = \"agreement\"")).unwrap_err();
    assert!(err.contains("a baseline is for simulated studies"), "{err}");
    let err = load(&STUDY.replace("workers = [3]", "workers = [0]")).unwrap_err();
    assert!(
        err.contains("model profile:vgg16: its workers must be at least 1"),
        "{err}"
    );
}
