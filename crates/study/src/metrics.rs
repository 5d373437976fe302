//! What a finished run's processes recorded about their resources: the per-process CSVs
//! (`metrics-rank<R>.csv`), read by column name, and their per-worker means.

use std::path::Path;

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
