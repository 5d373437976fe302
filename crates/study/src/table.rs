//! The table of a study's runs: every figure in the HTML report's, the most telling ones on
//! the terminal (narrow enough for 100 columns; the rest is in `results.csv` and
//! `report.html`).

use crate::rows::RunRow;

/// `text` when `v` is finite, `-` otherwise.
pub fn or_dash(v: f64, text: String) -> String {
    if v.is_finite() {
        text
    } else {
        "-".into()
    }
}

/// `v` with `decimals` decimals followed by `unit` (`""`, `" s"`), or `-`.
pub fn fixed(v: f64, decimals: usize, unit: &str) -> String {
    or_dash(v, format!("{v:.decimals$}{unit}"))
}

/// `v` as a percentage with two decimals, or `-`.
pub fn percent_cell(v: f64) -> String {
    or_dash(v, format!("{:.2} %", v * 100.0))
}

/// `v / 1e6` with one decimal, or `-`.
pub fn mega_cell(v: f64) -> String {
    or_dash(v, format!("{:.1}", v / 1e6))
}

/// The header and rows of the summary table (the HTML report's and the printed one's).
pub fn summary_table(rows: &[RunRow]) -> (Vec<&'static str>, Vec<Vec<String>>) {
    let header = vec![
        "model",
        "variant",
        "network",
        "workers",
        "seed",
        "step s",
        "samples/s",
        "ideal samples/s",
        "of ideal",
        "accuracy",
        "avg-model accuracy",
        "divergence",
        "time to accuracy",
        "MB/step",
        "textbook MB/step",
        "CPU %",
        "peak RSS MB",
        "net MB",
        "disk MB",
        "frames lost",
        "realised loss",
        "tensor p99 s",
    ];
    let table = rows.iter().map(table_row).collect();
    (header, table)
}

fn table_row(r: &RunRow) -> Vec<String> {
    vec![
        r.model.clone(),
        r.variant.clone(),
        r.network.clone(),
        r.workers.to_string(),
        r.seed.to_string(),
        format!("{:.3}", r.step_seconds),
        format!("{:.1}", r.samples_per_sec),
        fixed(r.ideal_samples_per_sec, 1, ""),
        or_dash(
            r.fraction_of_ideal,
            format!("{:.0} %", r.fraction_of_ideal * 100.0),
        ),
        percent_cell(r.test_accuracy),
        percent_cell(r.average_accuracy),
        or_dash(r.divergence, format!("{:.3e}", r.divergence)),
        time_to_accuracy_cell(r),
        mega_cell(r.bytes_per_step),
        mega_cell(r.textbook_bytes_per_step),
        fixed(r.mean_cpu_percent, 0, ""),
        mega_cell(r.peak_rss_bytes),
        mega_cell(r.net_bytes),
        mega_cell(r.disk_bytes),
        or_dash(r.frames_lost, format!("{}", r.frames_lost)),
        or_dash(r.realised_loss, format!("{:.3} %", r.realised_loss * 100.0)),
        fixed(r.tensor_p99_s, 4, ""),
    ]
}

/// `12.3 s to 97 %`, `not reached (97 %)` or `-` without a target.
pub fn time_to_accuracy_cell(r: &RunRow) -> String {
    match (
        r.target_accuracy.is_finite(),
        r.time_to_accuracy.is_finite(),
    ) {
        (false, _) => "-".into(),
        (true, true) => format!(
            "{:.1} s to {:.1} %",
            r.time_to_accuracy,
            r.target_accuracy * 100.0
        ),
        (true, false) => format!("not reached ({:.1} %)", r.target_accuracy * 100.0),
    }
}

/// A column of the terminal table: its header, whether its text is left-aligned, its cell.
struct Column {
    header: &'static str,
    left: bool,
    cell: fn(&RunRow) -> String,
}

/// The columns that tell a run from the others (model, network, workers, seed) and the
/// figures that tell how it did.
fn terminal_columns() -> (Vec<Column>, Vec<Column>) {
    let text = |header, cell| Column {
        header,
        left: true,
        cell,
    };
    let figure = |header, cell| Column {
        header,
        left: false,
        cell,
    };
    let place = vec![
        text("model", |r| r.model.clone()),
        text("network", |r| r.network.clone()),
        figure("workers", |r| r.workers.to_string()),
        figure("seed", |r| r.seed.to_string()),
    ];
    let figures = vec![
        text("variant", |r| r.variant.clone()),
        figure("step s", |r| format!("{:.3}", r.step_seconds)),
        figure("samples/s", |r| format!("{:.1}", r.samples_per_sec)),
        figure("accuracy", |r| percent_cell(r.test_accuracy)),
        figure("avg accuracy", |r| percent_cell(r.average_accuracy)),
        figure("time to target", time_to_accuracy_cell),
        figure("MB/step", |r| mega_cell(r.bytes_per_step)),
        figure("CPU %", |r| fixed(r.mean_cpu_percent, 0, "")),
    ];
    (place, figures)
}

/// The lines the terminal shows for `rows`: what every run shares (model, network, workers,
/// seed), the table of the columns that differ and the most telling figures, each column as
/// wide as its widest cell, and where the other figures are.
pub fn terminal_lines(rows: &[RunRow]) -> Vec<String> {
    let (place, figures) = terminal_columns();
    let mut shared = Vec::new();
    let mut columns = Vec::new();
    for column in place {
        let first = rows.first().map(column.cell);
        if rows.iter().all(|r| Some((column.cell)(r)) == first) {
            shared.extend(first.map(|v| format!("{} {v}", column.header)));
        } else {
            columns.push(column);
        }
    }
    columns.extend(figures);
    let table: Vec<Vec<String>> = rows
        .iter()
        .map(|r| columns.iter().map(|c| (c.cell)(r)).collect())
        .collect();
    let widths: Vec<usize> = columns
        .iter()
        .enumerate()
        .map(|(i, c)| {
            table
                .iter()
                .map(|cells| cells[i].chars().count())
                .fold(c.header.len(), usize::max)
        })
        .collect();
    let line = |cells: Vec<&str>| {
        let cells: Vec<String> = cells
            .into_iter()
            .zip(columns.iter().zip(&widths))
            .map(|(cell, (c, &w))| {
                if c.left {
                    format!("{cell:<w$}")
                } else {
                    format!("{cell:>w$}")
                }
            })
            .collect();
        cells.join(" ").trim_end().to_string()
    };
    let mut lines = Vec::new();
    if !shared.is_empty() {
        lines.push(format!("every run: {}", shared.join(", ")));
    }
    lines.push(line(columns.iter().map(|c| c.header).collect()));
    lines.extend(
        table
            .iter()
            .map(|cells| line(cells.iter().map(String::as_str).collect())),
    );
    lines.push(
        "more figures (ideal bound, divergence, memory, network, disk, losses): results.csv, \
         report.html"
            .into(),
    );
    lines
}

#[cfg(test)]
#[path = "table_tests.rs"]
mod tests;
