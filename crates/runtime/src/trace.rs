//! Timelines in the Chrome trace event format (viewable in Perfetto): each process records
//! the spans of a window of steps (forward and backward per layer, waits on communication,
//! the optimizer, data loading) into `trace-rank<R>.json`; [`merge_traces`] joins a job's
//! files into one `trace.json` with one track per process.

use std::ops::Range;
use std::path::{Path, PathBuf};
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};

/// One complete span ("ph": "X").
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TraceEvent {
    /// What ran (`forward conv1`, `wait params fc1`, ...).
    pub name: String,
    /// Category: `compute`, `wait`, `data`, `optimizer`.
    pub cat: String,
    /// Phase: always "X" (complete event) for spans, "M" for metadata.
    pub ph: String,
    /// Start, microseconds since the Unix epoch (a clock every process of a machine shares).
    pub ts: f64,
    /// Duration, microseconds.
    #[serde(default)]
    pub dur: f64,
    /// Process: the rank.
    pub pid: usize,
    /// Thread: 0.
    pub tid: usize,
    /// Extra fields (the step; a metadata event's name).
    #[serde(default)]
    pub args: serde_json::Value,
}

/// Records the spans of the steps in a window.
#[derive(Debug)]
pub struct TraceRecorder {
    rank: usize,
    window: Range<u64>,
    origin: Instant,
    origin_us: f64,
    events: Vec<TraceEvent>,
}

impl TraceRecorder {
    /// A recorder for process `rank` keeping steps `window` (0-based, end exclusive).
    pub fn new(rank: usize, window: Range<u64>) -> Self {
        let origin_us = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0.0, |d| d.as_secs_f64() * 1e6);
        Self {
            rank,
            window,
            origin: Instant::now(),
            origin_us,
            events: Vec::new(),
        }
    }

    /// Whether `step` is recorded.
    pub fn records(&self, step: u64) -> bool {
        self.window.contains(&step)
    }

    /// Records a span of `step` from `start` to `end`.
    pub fn span(&mut self, step: u64, cat: &str, name: &str, start: Instant, end: Instant) {
        if !self.records(step) {
            return;
        }
        let us = |t: Instant| {
            self.origin_us + t.saturating_duration_since(self.origin).as_secs_f64() * 1e6
        };
        self.events.push(TraceEvent {
            name: name.to_string(),
            cat: cat.to_string(),
            ph: "X".into(),
            ts: us(start),
            dur: end.saturating_duration_since(start).as_secs_f64() * 1e6,
            pid: self.rank,
            tid: 0,
            args: serde_json::json!({ "step": step }),
        });
    }

    /// Writes `dir/trace-rank<R>.json` (a JSON array of events, with the process's name).
    pub fn write(&self, dir: &Path, process_name: &str) -> std::io::Result<PathBuf> {
        let mut events = vec![TraceEvent {
            name: "process_name".into(),
            cat: String::new(),
            ph: "M".into(),
            ts: 0.0,
            dur: 0.0,
            pid: self.rank,
            tid: 0,
            args: serde_json::json!({ "name": process_name }),
        }];
        events.extend(self.events.iter().cloned());
        let path = dir.join(format!("trace-rank{}.json", self.rank));
        std::fs::write(&path, serde_json::to_string(&events)?)?;
        Ok(path)
    }
}

/// Joins every `trace-rank<R>.json` in `dir` into `dir/trace.json`
/// (`{"traceEvents": [...]}`); returns its path, or `None` when there was nothing to merge.
pub fn merge_traces(dir: &Path) -> std::io::Result<Option<PathBuf>> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with("trace-rank") && n.ends_with(".json"))
        })
        .collect();
    if files.is_empty() {
        return Ok(None);
    }
    files.sort();
    let mut all: Vec<TraceEvent> = Vec::new();
    for f in files {
        let events: Vec<TraceEvent> = serde_json::from_slice(&std::fs::read(&f)?)
            .map_err(|e| std::io::Error::other(format!("{}: {e}", f.display())))?;
        all.extend(events);
    }
    let path = dir.join("trace.json");
    std::fs::write(
        &path,
        serde_json::to_string(&serde_json::json!({ "traceEvents": all }))?,
    )?;
    Ok(Some(path))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_the_window_and_merges_into_chrome_json() {
        let dir = tempfile::tempdir().unwrap();
        for rank in 0..2 {
            let mut r = TraceRecorder::new(rank, 1..2);
            let t = Instant::now();
            r.span(0, "compute", "forward conv1", t, t);
            r.span(
                1,
                "compute",
                "forward conv1",
                t,
                t + std::time::Duration::from_millis(2),
            );
            r.span(2, "wait", "wait params", t, t);
            r.write(dir.path(), &format!("worker {rank}")).unwrap();
        }
        let path = merge_traces(dir.path()).unwrap().unwrap();
        let json: serde_json::Value =
            serde_json::from_slice(&std::fs::read(path).unwrap()).unwrap();
        let events = json["traceEvents"].as_array().unwrap();
        // Per process: one metadata event and the one span of step 1.
        assert_eq!(events.len(), 4);
        let spans: Vec<_> = events.iter().filter(|e| e["ph"] == "X").collect();
        assert_eq!(spans.len(), 2);
        assert!(spans
            .iter()
            .all(|e| (e["dur"].as_f64().unwrap() - 2000.0).abs() < 1.0));
        assert_eq!(spans[0]["pid"], 0);
        assert_eq!(spans[1]["pid"], 1);
        assert!(merge_traces(tempfile::tempdir().unwrap().path())
            .unwrap()
            .is_none());
    }
}
