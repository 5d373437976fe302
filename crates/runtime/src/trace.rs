//! Timelines in the Chrome trace event format (viewable in Perfetto): each process records
//! the spans of a window of steps into `trace-rank<R>.json`; [`merge_traces`] joins a job's
//! files into one `trace.json` with one track per process.
//!
//! A worker's track has three threads: [`COMPUTE`] (forward and backward per layer, waits on
//! communication, the optimizer, data loading), [`SEND`] (per frame, from the moment the
//! scheduler handed it to the network interface to its last byte on the socket; gradient
//! slices entering the scheduler's queue are instants there) and [`RECEIVE`] (per frame, from
//! its header to its last byte; applying a slice on a server is a span of its own).

use std::ops::Range;
use std::path::{Path, PathBuf};
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};
use syncopate_core::wire::Header;

/// Thread of the compute spans.
pub const COMPUTE: usize = 0;
/// Thread of the frames sent (and of gradient slices queued for sending).
pub const SEND: usize = 1;
/// Thread of the frames received (and of slices applied by a server).
pub const RECEIVE: usize = 2;

/// One complete span ("ph": "X").
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TraceEvent {
    /// What ran (`forward conv1`, `wait params fc1`, ...).
    pub name: String,
    /// Category: `compute`, `wait`, `data`, `optimizer`.
    pub cat: String,
    /// Phase: "X" (complete event) for spans, "i" for instants, "M" for metadata.
    pub ph: String,
    /// Start, microseconds since the Unix epoch (a clock every process of a machine shares).
    pub ts: f64,
    /// Duration, microseconds.
    #[serde(default)]
    pub dur: f64,
    /// Process: the rank.
    pub pid: usize,
    /// Thread: [`COMPUTE`], [`SEND`] or [`RECEIVE`].
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

    /// Records a compute-thread span of `step` from `start` to `end`.
    pub fn span(&mut self, step: u64, cat: &str, name: &str, start: Instant, end: Instant) {
        self.span_on(COMPUTE, step, cat, name, start, end);
    }

    /// Records a span of `step` on thread `tid`.
    pub fn span_on(
        &mut self,
        tid: usize,
        step: u64,
        cat: &str,
        name: &str,
        start: Instant,
        end: Instant,
    ) {
        let dur = end.saturating_duration_since(start).as_secs_f64() * 1e6;
        self.record(tid, step, cat, name, "X", start, dur);
    }

    /// Records an instant of `step` on thread `tid`.
    pub fn instant(&mut self, tid: usize, step: u64, cat: &str, name: &str, at: Instant) {
        self.record(tid, step, cat, name, "i", at, 0.0);
    }

    /// Records a frame's trip through the network interface (the [`SEND`] thread).
    pub fn frame_sent(&mut self, header: &Header, queued: Instant, written: Instant) {
        let name = frame_label(header);
        self.span_on(SEND, header.step, "send", &name, queued, written);
    }

    /// Records a frame from `peer` on the [`RECEIVE`] thread, from its header's arrival at
    /// `arrived` to `until`.
    pub fn frame_received(
        &mut self,
        peer: usize,
        header: &Header,
        arrived: Instant,
        until: Instant,
    ) {
        let name = format!("{} from {peer}", frame_label(header));
        self.span_on(RECEIVE, header.step, "receive", &name, arrived, until);
    }

    #[allow(clippy::too_many_arguments)]
    fn record(
        &mut self,
        tid: usize,
        step: u64,
        cat: &str,
        name: &str,
        ph: &str,
        at: Instant,
        dur: f64,
    ) {
        if !self.records(step) {
            return;
        }
        let event = TraceEvent {
            name: name.to_string(),
            cat: cat.to_string(),
            ph: ph.into(),
            ts: self.micros(at),
            dur,
            pid: self.rank,
            tid,
            args: serde_json::json!({ "step": step }),
        };
        self.events.push(event);
    }

    /// Takes over the events of `other` (another thread's recorder of this process).
    pub fn absorb(&mut self, other: TraceRecorder) {
        self.events.extend(other.events);
    }

    fn micros(&self, t: Instant) -> f64 {
        // Instants before the origin (another thread's recorder) count backwards.
        let after = t.saturating_duration_since(self.origin).as_secs_f64();
        let before = self.origin.saturating_duration_since(t).as_secs_f64();
        self.origin_us + (after - before) * 1e6
    }

    /// Writes `dir/trace-rank<R>.json` (a JSON array of events, with the process's and the
    /// threads' names).
    pub fn write(&self, dir: &Path, process_name: &str) -> std::io::Result<PathBuf> {
        let meta = |name: &str, tid: usize, value: &str| TraceEvent {
            name: name.into(),
            cat: String::new(),
            ph: "M".into(),
            ts: 0.0,
            dur: 0.0,
            pid: self.rank,
            tid,
            args: serde_json::json!({ "name": value }),
        };
        let mut events = vec![
            meta("process_name", COMPUTE, process_name),
            meta("thread_name", COMPUTE, "compute"),
            meta("thread_name", SEND, "send"),
            meta("thread_name", RECEIVE, "receive"),
        ];
        events.extend(self.events.iter().cloned());
        let path = dir.join(format!("trace-rank{}.json", self.rank));
        std::fs::write(&path, serde_json::to_string(&events)?)?;
        Ok(path)
    }
}

/// A frame's name on the timeline: `push k3 @40000+40000` (kind, key, offset, values).
pub fn frame_label(header: &Header) -> String {
    let kind = format!("{:?}", header.kind).to_lowercase();
    format!(
        "{kind} k{} @{}+{}",
        header.key, header.offset, header.length
    )
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
        // Per process: four metadata events and the one span of step 1.
        assert_eq!(events.len(), 10);
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

    #[test]
    fn instants_and_other_threads_keep_their_step_window_and_thread() {
        let mut compute = TraceRecorder::new(3, 5..6);
        let mut frames = TraceRecorder::new(3, 5..6);
        let t = Instant::now();
        frames.instant(SEND, 5, "enqueue", "enqueue k0", t);
        frames.instant(SEND, 6, "enqueue", "enqueue k0", t);
        frames.span_on(RECEIVE, 5, "receive", "params k0 @0+10", t, t);
        compute.absorb(frames);
        assert_eq!(compute.events.len(), 2);
        assert_eq!(compute.events[0].ph, "i");
        assert_eq!(compute.events[0].tid, SEND);
        assert_eq!(compute.events[1].tid, RECEIVE);
        let header = syncopate_core::wire::Header::data(
            syncopate_core::wire::FrameKind::Push,
            5,
            3,
            40000,
            40000,
        );
        assert_eq!(frame_label(&header), "push k3 @40000+40000");
    }
}
