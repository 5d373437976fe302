use super::*;
use syncopate_core::strategy::StrategyKind;

/// Widest line the terminal table may print, in characters: a terminal of 100 columns.
const TERMINAL_WIDTH: usize = 100;

/// A finished run of the demo's shape (LeNet, 4 workers, 100 Mbit/s) with figures as wide as
/// they get: a slow step, a high rate, full accuracy, a target never reached.
fn demo_row(variant: &str) -> RunRow {
    RunRow {
        variant: variant.into(),
        network: "100mbit".into(),
        seed: 42,
        step_seconds: 12.345,
        samples_per_sec: 123_456.7,
        test_accuracy: 1.0,
        average_accuracy: 0.9876,
        target_accuracy: 1.0,
        bytes_per_step: 1234.5e6,
        mean_cpu_percent: 1600.0,
        ..RunRow::empty("lenet", 4)
    }
}

/// The demo's variants and every strategy under its own (longest) name fit 100 columns.
#[test]
fn the_demo_table_fits_a_100_column_terminal() {
    let mut labels = vec!["ps (fifo)".to_string()];
    labels.extend(StrategyKind::ALL.iter().map(|s| s.name().to_string()));
    assert!(labels.iter().any(|l| l == "allreduce-no-overlap"));
    let rows: Vec<RunRow> = labels.iter().map(|l| demo_row(l)).collect();
    let lines = terminal_lines(&rows);
    for line in &lines {
        assert!(
            line.chars().count() <= TERMINAL_WIDTH,
            "{} characters: {line}",
            line.chars().count()
        );
    }
    assert_eq!(
        lines[0],
        "every run: model lenet, network 100mbit, workers 4, seed 42"
    );
    let header = &lines[1];
    for column in [
        "variant",
        "samples/s",
        "accuracy",
        "avg accuracy",
        "time to target",
    ] {
        assert!(header.contains(column), "{header}");
    }
    assert!(!header.contains("model"), "{header}");
    assert!(lines[2].contains("not reached (100.0 %)"), "{}", lines[2]);
    assert_eq!(lines.len(), 1 + 1 + labels.len() + 1);
    assert!(lines.last().unwrap().contains("results.csv"));
}

/// What differs between runs gets a column; text is left-aligned, figures right-aligned.
#[test]
fn columns_for_what_differs_between_runs() {
    let mut slow = demo_row("p3");
    slow.network = "1gbit".into();
    slow.samples_per_sec = 5.0;
    let lines = terminal_lines(&[demo_row("ps"), slow]);
    assert_eq!(lines[0], "every run: model lenet, workers 4, seed 42");
    assert!(lines[1].starts_with("network variant "), "{}", lines[1]);
    assert!(lines[3].starts_with("1gbit   p3      "), "{}", lines[3]);
    let column = lines[1].find("samples/s").unwrap() + "samples/s".len();
    assert!(lines[3][..column].ends_with(" 5.0"), "{}", lines[3]);
    assert!(terminal_lines(&[])[0].starts_with("variant"));
}
