//! Reading what a finished run left, tolerantly: the fields of `summary.json` that older runs
//! lack read as NaN (or nothing), and the per-process resource CSVs (`metrics-rank<R>.csv`)
//! are read by column name.

use std::path::Path;

use serde_json::Value;

/// A number of the run's summary: `name` at the job level, else in worker 0's summary
/// (`worker0.<name>`); an array of numbers (one per worker) gives its mean. NaN when absent
/// or not a number.
pub fn number(json: &Value, name: &str) -> f64 {
    [&json[name], &json["worker0"][name]]
        .into_iter()
        .map(as_mean)
        .find(|v| !v.is_nan())
        .unwrap_or(f64::NAN)
}

/// A number, or the mean of an array of numbers; NaN otherwise.
fn as_mean(v: &Value) -> f64 {
    match v {
        Value::Array(items) => mean_finite(items.iter().filter_map(Value::as_f64)),
        v => v.as_f64().unwrap_or(f64::NAN),
    }
}

/// Mean of the finite values; NaN when there is none.
pub fn mean_finite(values: impl IntoIterator<Item = f64>) -> f64 {
    let (sum, n) = values
        .into_iter()
        .filter(|v| v.is_finite())
        .fold((0.0, 0usize), |(s, n), v| (s + v, n + 1));
    if n == 0 {
        f64::NAN
    } else {
        sum / n as f64
    }
}

/// One evaluation of rank 0 during training.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct EvalSample {
    /// Training seconds so far.
    pub seconds: f64,
    /// Test accuracy of worker 0's replica.
    pub accuracy: f64,
    /// Test accuracy of the exact average of all replicas (NaN when not recorded).
    pub average_accuracy: f64,
    /// Replica divergence (NaN when not recorded).
    pub divergence: f64,
}

/// Rank 0's evaluations: `evaluations` at the job level, else `worker0.evaluations`; entries
/// without `seconds` are left out.
pub fn evaluations(json: &Value) -> Vec<EvalSample> {
    let list = json["evaluations"]
        .as_array()
        .or_else(|| json["worker0"]["evaluations"].as_array());
    let num = |e: &Value, k: &str| e[k].as_f64().unwrap_or(f64::NAN);
    list.map(|l| {
        l.iter()
            .map(|e| EvalSample {
                seconds: num(e, "seconds"),
                accuracy: num(e, "accuracy"),
                average_accuracy: num(e, "average_accuracy"),
                divergence: num(e, "divergence"),
            })
            .filter(|e| e.seconds.is_finite())
            .collect()
    })
    .unwrap_or_default()
}

/// A per-process resource CSV (`metrics-rank<R>.csv`): its header and numeric rows
/// (unparsable cells are NaN).
#[derive(Debug, Clone, Default)]
pub struct MetricsTable {
    columns: Vec<String>,
    rows: Vec<Vec<f64>>,
}

impl MetricsTable {
    /// Reads `path`; `None` when it cannot be read.
    pub fn read(path: &Path) -> Option<Self> {
        let text = std::fs::read_to_string(path).ok()?;
        let mut lines = text.lines();
        let columns = lines.next()?.split(',').map(str::to_string).collect();
        let rows = lines
            .map(|l| {
                l.split(',')
                    .map(|c| c.parse().unwrap_or(f64::NAN))
                    .collect()
            })
            .collect();
        Some(Self { columns, rows })
    }

    /// The values of column `name` (empty when there is no such column).
    pub fn column(&self, name: &str) -> Vec<f64> {
        let Some(i) = self.columns.iter().position(|c| c == name) else {
            return Vec::new();
        };
        self.rows
            .iter()
            .map(|r| r.get(i).copied().unwrap_or(f64::NAN))
            .collect()
    }

    /// Per row, the sum of the named columns (NaN where one is missing).
    pub fn sum_of(&self, names: &[&str]) -> Vec<f64> {
        let columns: Vec<Vec<f64>> = names.iter().map(|n| self.column(n)).collect();
        if columns.iter().any(Vec::is_empty) {
            return Vec::new();
        }
        (0..self.rows.len())
            .map(|i| columns.iter().map(|c| c[i]).sum())
            .collect()
    }

    /// `(t_s, value)` points of the given per-row values, non-finite ones left out.
    pub fn over_time(&self, values: &[f64]) -> Vec<(f64, f64)> {
        self.column("t_s")
            .into_iter()
            .zip(values.iter().copied())
            .filter(|(t, v)| t.is_finite() && v.is_finite())
            .collect()
    }
}

/// CPU (user + system, % of one core) per sample.
pub const CPU: &[&str] = &["cpu_user_pct", "cpu_system_pct"];
/// Resident memory per sample, bytes.
pub const RSS: &[&str] = &["rss_bytes"];
/// Bytes sent on the links so far.
pub const NET: &[&str] = &["net_sent_bytes"];
/// Bytes read and written on storage so far.
pub const DISK: &[&str] = &["disk_read_bytes", "disk_write_bytes"];

/// Per-worker means of a run's resources (NaN when the run has no metrics).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct WorkerResources {
    /// Mean CPU over the run, % of one core.
    pub mean_cpu_percent: f64,
    /// Peak resident memory, bytes.
    pub peak_rss_bytes: f64,
    /// Bytes sent on the links over the run.
    pub net_bytes: f64,
    /// Bytes read and written on storage over the run.
    pub disk_bytes: f64,
}

/// The means over workers `0..workers` of their metrics files in `run_dir`.
pub fn worker_resources(run_dir: &Path, workers: usize) -> WorkerResources {
    let tables: Vec<MetricsTable> = (0..workers)
        .filter_map(|r| MetricsTable::read(&run_dir.join(format!("metrics-rank{r}.csv"))))
        .collect();
    let per_worker = |names: &[&str], reduce: fn(Vec<f64>) -> f64| {
        mean_finite(tables.iter().map(|t| reduce(t.sum_of(names))))
    };
    WorkerResources {
        mean_cpu_percent: per_worker(CPU, mean_finite),
        peak_rss_bytes: per_worker(RSS, max_finite),
        net_bytes: per_worker(NET, max_finite),
        disk_bytes: per_worker(DISK, max_finite),
    }
}

/// Largest finite value (cumulative counters: the last); NaN when there is none.
fn max_finite(values: Vec<f64>) -> f64 {
    values
        .into_iter()
        .filter(|v| v.is_finite())
        .fold(f64::NAN, f64::max)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn numbers_are_looked_up_tolerantly() {
        let j = json!({
            "divergence": 0.25,
            "worker0": {"bytes_per_step": 100.0, "divergence": 9.0, "per_worker": [1.0, 3.0]},
            "average_accuracy": null
        });
        assert_eq!(number(&j, "divergence"), 0.25, "job level first");
        assert_eq!(number(&j, "bytes_per_step"), 100.0, "then worker 0");
        assert_eq!(number(&j, "per_worker"), 2.0, "arrays give their mean");
        assert!(number(&j, "average_accuracy").is_nan());
        assert!(number(&j, "textbook_bytes_per_step").is_nan());
        assert!(number(&json!([1, 2]), "x").is_nan());
    }

    #[test]
    fn evaluations_with_and_without_the_optional_fields() {
        let j = json!({"worker0": {"evaluations": [
            {"step": 1, "seconds": 0.5, "accuracy": 0.3, "loss": 2.0},
            {"step": 2, "seconds": 1.0, "accuracy": 0.6, "average_accuracy": 0.7, "divergence": 0.01},
            {"step": 3}
        ]}});
        let e = evaluations(&j);
        assert_eq!(e.len(), 2);
        assert!(e[0].average_accuracy.is_nan() && e[0].divergence.is_nan());
        assert_eq!((e[1].average_accuracy, e[1].divergence), (0.7, 0.01));
        assert!(evaluations(&json!({})).is_empty());
    }

    #[test]
    fn worker_resources_are_per_worker_means() {
        let dir = tempfile::tempdir().unwrap();
        let header = "t_s,cpu_user_pct,cpu_system_pct,rss_bytes,disk_read_bytes,disk_write_bytes,net_sent_bytes,net_received_bytes";
        for (rank, scale) in [(0, 1.0), (1, 3.0), (2, 100.0)] {
            let rows: String = (0..3)
                .map(|i| {
                    let i = i as f64;
                    format!(
                        "{i},{},{},{},{},{},{},0\n",
                        10.0 * scale,
                        10.0 * scale,
                        (1.0 + i) * scale,
                        i * scale,
                        i * scale,
                        10.0 * i * scale
                    )
                })
                .collect();
            let path = dir.path().join(format!("metrics-rank{rank}.csv"));
            std::fs::write(path, format!("{header}\n{rows}bad,row\n")).unwrap();
        }
        // Rank 2 is a server: left out.
        let r = worker_resources(dir.path(), 2);
        assert_eq!(r.mean_cpu_percent, 40.0);
        assert_eq!(r.peak_rss_bytes, 6.0);
        assert_eq!(r.net_bytes, 40.0);
        assert_eq!(r.disk_bytes, 8.0);
        let none = worker_resources(&dir.path().join("missing"), 2);
        assert!(none.mean_cpu_percent.is_nan() && none.disk_bytes.is_nan());
    }
}
