use super::*;
use std::path::Path;

const STUDY: &str = r#"
name = "fake"
steps = 4
warmup_steps = 1
batch_size = 8
bandwidths = ["1gbit", "100mbit"]
[[models]]
name = "lenet"
[[variants]]
label = "zeta (new)"
strategy = "ps"
[[variants]]
label = "alpha (old)"
strategy = "allreduce"
"#;

/// A summary as `launch` writes it; the first variant's runs also carry every optional
/// field (job level and per evaluation), the second's none of them.
fn summary(optional: bool, scale: f64) -> serde_json::Value {
    let eval = |step: u64, acc: f64| {
        let mut e = serde_json::json!({"step": step, "seconds": step as f64 * 0.5,
            "accuracy": acc, "loss": 1.0});
        if optional {
            e["average_accuracy"] = (acc + 0.05).into();
            e["divergence"] = (0.01 / step as f64).into();
        }
        e
    };
    let mut s = serde_json::json!({
        "test_accuracy": 0.8 * scale, "wall_seconds": 2.0, "target_accuracy": 0.5,
        "time_to_accuracy_s": 1.0 * scale, "steps_to_accuracy": 2,
        "worker0": {"step_seconds": [0.5, 0.4, 0.4, 0.4],
            "times": {"compute": 1.0, "wait": 0.4, "optimizer": 0.2},
            "evaluations": [eval(1, 0.4 * scale), eval(2, 0.8 * scale)]},
    });
    s = crate::rows::with_whole_worker0(s);
    s["worker0"]["bytes_per_step"] = serde_json::Value::Null;
    s["worker0"]["textbook_bytes_per_step"] = serde_json::Value::Null;
    if optional {
        s["average_accuracy"] = 0.85.into();
        s["divergence"] = 0.002.into();
        s["worker0"]["bytes_per_step"] = 2.0e6.into();
        s["worker0"]["textbook_bytes_per_step"] = 1.8e6.into();
        s["frames_lost"] = 7.into();
        s["dlcp"] = serde_json::json!({"realised_loss": 0.0125});
        s["worker0"]["tensor_completion"] =
            serde_json::json!({"count": 8, "p50_s": 0.01, "p99_s": 0.03, "max_s": 0.04});
    }
    s
}

fn write_run(dir: &Path, id: &str, optional: bool, scale: f64) {
    let run = dir.join("runs").join(id);
    std::fs::create_dir_all(&run).unwrap();
    let json = serde_json::to_string(&summary(optional, scale)).unwrap();
    std::fs::write(run::summary_path(&run), json).unwrap();
    let header = "t_s,cpu_user_pct,cpu_system_pct,rss_bytes,disk_read_bytes,disk_write_bytes,net_sent_bytes,net_received_bytes";
    for rank in 0..2 {
        let rows = "0,50,10,1000000,0,0,0,0\n1,80,10,2000000,4096,8192,3000000,3000000\n";
        std::fs::write(
            run.join(format!("metrics-rank{rank}.csv")),
            format!("{header}\n{rows}"),
        )
        .unwrap();
    }
    // The first variant's rows record the bytes sent per step (worker 1 sends three times
    // worker 0's); the second's are from before they did.
    for rank in 0..2 {
        let rows = if optional {
            let b = 1e6 * (1.0 + 2.0 * rank as f64);
            format!("step,t_end_s,step_s,loss,sent_bytes\n1,0.5,0.5,2.0,{b}\n2,1.0,0.5,1.5,{b}\n")
        } else {
            "step,t_end_s,step_s,loss\n1,0.5,0.5,2.0\n2,1.0,0.5,1.5\n".to_string()
        };
        std::fs::write(run.join(format!("steps-rank{rank}.csv")), rows).unwrap();
    }
}

/// A study directory with every run finished, as `syncopate study` leaves it.
fn fake_study() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("study.toml"), STUDY).unwrap();
    let config = StudyConfig::load(&dir.path().join("study.toml")).unwrap();
    for run in config.runs() {
        let first = run.variant == config.variants[0].label;
        write_run(dir.path(), &run.id, first, if first { 1.0 } else { 0.9 });
    }
    dir
}

/// The SVG charts of a report page.
fn charts(html: &str) -> Vec<&str> {
    html.split("<div class=\"chart\">").skip(1).collect()
}

fn chart_titled<'a>(html: &'a str, title: &str) -> &'a str {
    charts(html)
        .into_iter()
        .find(|c| {
            syncopate_report::svg_texts(c)
                .iter()
                .any(|t| t.starts_with(title))
        })
        .unwrap_or_else(|| panic!("no chart titled {title}"))
}

#[test]
fn report_compares_every_variant_per_metric() {
    let dir = fake_study();
    rebuild_report(dir.path()).unwrap();
    let html = std::fs::read_to_string(dir.path().join("report.html")).unwrap();
    for metric in compare::metrics().iter().map(|m| m.name) {
        let chart = chart_titled(&html, &format!("lenet: {metric}"));
        let texts = syncopate_report::svg_texts(chart);
        for label in ["zeta (new)", "alpha (old)", "1gbit", "100mbit"] {
            assert!(
                texts.iter().any(|t| t.starts_with(label)),
                "{metric}: {label} in {texts:?}"
            );
        }
        if metric.contains("accuracy of") {
            assert!(texts.iter().any(|t| t == "1"), "{texts:?}");
            assert!(!texts
                .iter()
                .any(|t| t.parse::<f64>().is_ok_and(|v| v > 1.0)));
        }
    }
    let average = chart_titled(&html, "lenet: final accuracy of the replicas' average");
    let texts = syncopate_report::svg_texts(average);
    assert!(
        texts.contains(&"alpha (old) (not recorded)".into()),
        "{texts:?}"
    );
    let textbook = chart_titled(&html, "lenet: MB sent per step");
    assert!(syncopate_report::svg_texts(textbook).contains(&"zeta (new) (textbook)".into()));
    let acc = chart_titled(&html, "lenet @ 1gbit: accuracy of worker 0 vs wall time");
    let texts = syncopate_report::svg_texts(acc);
    assert!(texts.contains(&"alpha (old)".into()) && texts.contains(&"1".into()));
    chart_titled(&html, "lenet @ 100mbit: accuracy of the replicas' average");
    // Accuracy against the bytes a worker sent: the first variant's evaluations at steps 1
    // and 2 (2 and 4 MB, log axis); the second has no bytes per step at all.
    let by_bytes = chart_titled(&html, "lenet @ 1gbit: accuracy of worker 0 vs MB sent");
    let texts = syncopate_report::svg_texts(by_bytes);
    assert!(texts.contains(&"zeta (new)".into()), "{texts:?}");
    assert!(!texts.contains(&"alpha (old)".into()), "{texts:?}");
    // The legend: every variant with its technique.
    assert!(html.contains("zeta (new) (ps)") && html.contains("alpha (old) (allreduce)"));
    // Per-run detail below the comparison.
    assert!(html.contains("Resources per process"));
    chart_titled(&html, "lenet - alpha (old) @ 1gbit: CPU");
    // The optional columns: filled for the first variant, NaN for the second.
    let csv = std::fs::read_to_string(dir.path().join("results.csv")).unwrap();
    let lines: Vec<&str> = csv.lines().collect();
    assert_eq!(lines.len(), 1 + 4);
    assert!(lines[0].ends_with(
        "average_accuracy,divergence,bytes_per_step,textbook_bytes_per_step,\
         mean_cpu_percent,peak_rss_bytes,net_bytes,disk_bytes,frames_lost,realised_loss,\
         tensor_p50_s,tensor_p99_s,steps_to_accuracy,bytes_to_accuracy,compute_utilisation"
    ));
    assert!(lines[0].starts_with("id,model,variant,network,bandwidth,bandwidth_gbps,latency_ms,"));
    let zeta = lines.iter().find(|l| l.contains("zeta")).unwrap();
    assert!(
        zeta.ends_with(
            "0.8500,2.000e-3,2000000,1800000,75.0,2000000,3000000,12288,7,0.012500,\
             0.010000,0.030000,2,4000000,0.6000"
        ),
        "{zeta}"
    );
    // Bytes to the target: the workers' sent_bytes to step 2 (2 and 6 MB), their mean;
    // compute utilisation: (compute 1.0 + optimizer 0.2) / wall 2.0.
    assert!(
        zeta.contains(",lenet,zeta (new),1gbit,1gbit,1,0,"),
        "{zeta}"
    );
    let alpha = lines.iter().find(|l| l.contains("alpha")).unwrap();
    assert!(
        alpha.ends_with("NaN,NaN,NaN,NaN,75.0,2000000,3000000,12288,NaN,NaN,NaN,NaN,2,NaN,0.6000"),
        "{alpha}"
    );
}

#[test]
fn report_of_old_runs_without_optional_fields_or_metrics() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("study.toml"), STUDY).unwrap();
    let config = StudyConfig::load(&dir.path().join("study.toml")).unwrap();
    for run in config.runs().iter().take(3) {
        let run_dir = dir.path().join("runs").join(&run.id);
        std::fs::create_dir_all(&run_dir).unwrap();
        let summary = crate::rows::with_whole_worker0(serde_json::json!({}));
        std::fs::write(run::summary_path(&run_dir), summary.to_string()).unwrap();
    }
    rebuild_report(dir.path()).unwrap();
    let html = std::fs::read_to_string(dir.path().join("report.html")).unwrap();
    assert!(!html.contains("replicas&#39; average") && !html.contains("replicas' average"));
    assert!(!html.contains("Resources per process"));
    assert!(html.contains("All runs"));
}

#[test]
fn report_of_a_directory_without_a_study_fails() {
    let dir = tempfile::tempdir().unwrap();
    let err = rebuild_report(dir.path()).unwrap_err();
    assert!(format!("{err:#}").contains("study.toml"), "{err:#}");
}
