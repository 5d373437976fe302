//! Per-process resource sampling: CPU (user, system), resident memory, disk bytes read and
//! written (`/proc/self/io`) and bytes sent and received on the job's links (counted by our
//! transport), every interval, written as CSV.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Bytes on a process's links, per link and in total, and the bytes its buffer pools keep,
/// shared between the transport and the sampler.
#[derive(Debug, Default)]
pub struct TrafficTotals {
    /// Bytes written to the links' sockets.
    pub sent: AtomicU64,
    /// Bytes read from them.
    pub received: AtomicU64,
    /// Per link, in the transport's link order.
    pub links: Vec<LinkTraffic>,
    /// Bytes the transport keeps in frame buffers for reuse, not in use (stored by the
    /// transport about once a second).
    pub frame_pool_bytes: AtomicU64,
    /// Bytes the protocol endpoint keeps in buffers for reuse, not in use
    /// ([`syncopate_core::strategy::Endpoint::pooled_bytes`], stored with the above).
    pub endpoint_pool_bytes: AtomicU64,
}

/// Bytes on one link.
#[derive(Debug, Default)]
pub struct LinkTraffic {
    /// The peer's rank.
    pub peer: usize,
    /// Bytes written to the socket.
    pub sent: AtomicU64,
    /// Bytes read from it.
    pub received: AtomicU64,
    /// What the emulated network did to the frames sent on it so far.
    pub net: LinkNet,
}

/// The emulated network's counters of one link (frames sent on it), shared with the
/// sampler: stored by the transport, read by the sampler.
#[derive(Debug, Default)]
pub struct LinkNet {
    /// Frames lost on the way (and retransmitted, for reliable frames).
    pub frames_lost: AtomicU64,
    /// Retransmissions.
    pub frames_retransmitted: AtomicU64,
    /// Frames dropped by a full queue.
    pub frames_dropped: AtomicU64,
    /// Total time frames waited in the queue before serialising, nanoseconds.
    pub queueing_ns: AtomicU64,
}

impl LinkNet {
    /// Stores `c`'s counters.
    pub fn store(&self, c: &syncopate_core::net::NetCounters) {
        self.frames_lost.store(c.frames_lost, Ordering::Relaxed);
        (self.frames_retransmitted).store(c.frames_retransmitted, Ordering::Relaxed);
        self.frames_dropped
            .store(c.frames_dropped, Ordering::Relaxed);
        self.queueing_ns
            .store(c.queueing_ns_total, Ordering::Relaxed);
    }

    /// The counters: frames lost, retransmitted, dropped, and the queueing delay in ns.
    pub fn load(&self) -> [u64; 4] {
        [
            self.frames_lost.load(Ordering::Relaxed),
            self.frames_retransmitted.load(Ordering::Relaxed),
            self.frames_dropped.load(Ordering::Relaxed),
            self.queueing_ns.load(Ordering::Relaxed),
        ]
    }
}

impl TrafficTotals {
    /// Counters for links to `peers` (in that order).
    pub fn for_peers(peers: impl IntoIterator<Item = usize>) -> Self {
        Self {
            links: peers
                .into_iter()
                .map(|peer| LinkTraffic {
                    peer,
                    ..LinkTraffic::default()
                })
                .collect(),
            ..Self::default()
        }
    }

    /// Counts `n` bytes sent on link `index`.
    pub fn add_sent(&self, index: usize, n: u64) {
        self.sent.fetch_add(n, Ordering::Relaxed);
        if let Some(l) = self.links.get(index) {
            l.sent.fetch_add(n, Ordering::Relaxed);
        }
    }

    /// Counts `n` bytes received on link `index`.
    pub fn add_received(&self, index: usize, n: u64) {
        self.received.fetch_add(n, Ordering::Relaxed);
        if let Some(l) = self.links.get(index) {
            l.received.fetch_add(n, Ordering::Relaxed);
        }
    }
}

/// One sample.
#[derive(Debug, Clone, PartialEq)]
pub struct Sample {
    /// Seconds since the sampler started.
    pub t: f64,
    /// User CPU over the last interval, percent of one core.
    pub cpu_user_pct: f64,
    /// System CPU over the last interval, percent of one core.
    pub cpu_system_pct: f64,
    /// Resident set size, bytes.
    pub rss_bytes: u64,
    /// Bytes the program holds on its heap (`None` unless the binary counts them, see
    /// [`crate::heap`]): resident memory that grows while this does not is the allocator
    /// keeping freed pages, not a leak.
    pub heap_bytes: Option<u64>,
    /// Of the live heap, the bytes the transport keeps in frame buffers for reuse.
    pub frame_pool_bytes: u64,
    /// Of the live heap, the bytes the protocol endpoint keeps in buffers for reuse.
    pub endpoint_pool_bytes: u64,
    /// Bytes read from storage so far.
    pub disk_read_bytes: u64,
    /// Bytes written to storage so far.
    pub disk_write_bytes: u64,
    /// Bytes sent on the links so far.
    pub net_sent_bytes: u64,
    /// Bytes received on the links so far.
    pub net_received_bytes: u64,
    /// Per link: `(peer, bytes sent, bytes received)` so far.
    pub links: Vec<(usize, u64, u64)>,
    /// Per link, in the same order: frames lost, retransmitted and dropped by the emulated
    /// network so far, and the queueing delay in nanoseconds.
    pub link_net: Vec<[u64; 4]>,
}

/// The CSV header of [`Sample`] rows; per-link columns (`sent_to_rank<R>`,
/// `received_from_rank<R>`) follow, then the emulated network's per link
/// (`lost_to_rank<R>`, `retransmitted_to_rank<R>`, `dropped_to_rank<R>`,
/// `queueing_ns_to_rank<R>`).
pub const CSV_HEADER: &str = "t_s,cpu_user_pct,cpu_system_pct,rss_bytes,heap_bytes,frame_pool_bytes,endpoint_pool_bytes,disk_read_bytes,disk_write_bytes,net_sent_bytes,net_received_bytes";

/// The CSV header for samples of these links.
pub fn csv_header(links: &[(usize, u64, u64)]) -> String {
    let mut header = CSV_HEADER.to_string();
    for (peer, _, _) in links {
        header.push_str(&format!(",sent_to_rank{peer},received_from_rank{peer}"));
    }
    for (peer, _, _) in links {
        header.push_str(&format!(
            ",lost_to_rank{peer},retransmitted_to_rank{peer},dropped_to_rank{peer},queueing_ns_to_rank{peer}"
        ));
    }
    header
}

impl Sample {
    /// The sample as a CSV row.
    pub fn csv_row(&self) -> String {
        let mut row = format!(
            "{:.3},{:.1},{:.1},{},{},{},{},{},{},{},{}",
            self.t,
            self.cpu_user_pct,
            self.cpu_system_pct,
            self.rss_bytes,
            self.heap_bytes.map(|b| b.to_string()).unwrap_or_default(),
            self.frame_pool_bytes,
            self.endpoint_pool_bytes,
            self.disk_read_bytes,
            self.disk_write_bytes,
            self.net_sent_bytes,
            self.net_received_bytes
        );
        for (_, sent, received) in &self.links {
            row.push_str(&format!(",{sent},{received}"));
        }
        for i in 0..self.links.len() {
            let [lost, retransmitted, dropped, queueing] =
                self.link_net.get(i).copied().unwrap_or_default();
            row.push_str(&format!(",{lost},{retransmitted},{dropped},{queueing}"));
        }
        row
    }
}

/// CPU ticks (user, system) of this process, from `/proc/self/stat`.
fn cpu_ticks() -> Option<(u64, u64)> {
    let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
    // The command name may hold spaces and parentheses: fields start after the last ')'.
    let rest = &stat[stat.rfind(')')? + 1..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // After the name: state is field 3 of stat(5), utime 14 and stime 15 (1-based).
    let utime = fields.get(11)?.parse().ok()?;
    let stime = fields.get(12)?.parse().ok()?;
    Some((utime, stime))
}

fn field(text: &str, name: &str) -> Option<u64> {
    text.lines()
        .find_map(|l| l.strip_prefix(name))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
}

/// Resident set size in bytes, from `/proc/self/status`.
fn rss_bytes() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    field(&status, "VmRSS:").map(|kb| kb * 1024)
}

/// Storage bytes (read, written), from `/proc/self/io`.
fn disk_bytes() -> Option<(u64, u64)> {
    let io = std::fs::read_to_string("/proc/self/io").ok()?;
    Some((field(&io, "read_bytes:")?, field(&io, "write_bytes:")?))
}

/// Takes samples on a background thread until [`ResourceSampler::finish`].
pub struct ResourceSampler {
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<std::io::Result<Vec<Sample>>>>,
}

/// Why a process's resource sampling failed.
#[derive(Debug, thiserror::Error)]
pub enum SamplerError {
    /// The metrics folder could not be created.
    #[error("creating {}: {source}", dir.display())]
    CreateDir {
        /// The folder.
        dir: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// The CSV file or the sampling thread could not be started.
    #[error("starting the sampler: {0}")]
    Start(std::io::Error),
    /// The samples could not be written.
    #[error("writing the resource samples: {0}")]
    Write(std::io::Error),
}

/// The CSV file of a sampler writing to `path`, its header written.
fn open_csv(
    path: &Path,
    traffic: &TrafficTotals,
) -> std::io::Result<std::io::BufWriter<std::fs::File>> {
    let mut f = std::io::BufWriter::new(std::fs::File::create(path)?);
    let links: Vec<_> = traffic.links.iter().map(|l| (l.peer, 0, 0)).collect();
    writeln!(f, "{}", csv_header(&links))?;
    f.flush()?;
    Ok(f)
}

/// Takes samples of this process: keeps the previous CPU reading, from which each sample's
/// CPU share over the last interval follows.
struct Probe {
    /// When sampling started.
    start: Instant,
    /// The previous sample's time and CPU ticks (user, system).
    last: (Instant, (u64, u64)),
    /// The kernel's clock ticks per second.
    ticks_per_s: f64,
    /// The link totals.
    traffic: Arc<TrafficTotals>,
}

impl Probe {
    fn new(traffic: Arc<TrafficTotals>) -> Self {
        let start = Instant::now();
        Self {
            start,
            last: (start, cpu_ticks().unwrap_or((0, 0))),
            ticks_per_s: rustix::param::clock_ticks_per_second() as f64,
            traffic,
        }
    }

    /// A sample taken now.
    fn sample(&mut self, now: Instant) -> Sample {
        let ticks = cpu_ticks().unwrap_or(self.last.1);
        let dt = (now - self.last.0).as_secs_f64();
        let ticks_per_s = self.ticks_per_s;
        let pct = |a: u64, b: u64| {
            if dt > 0.0 {
                a.saturating_sub(b) as f64 / ticks_per_s / dt * 100.0
            } else {
                0.0
            }
        };
        let (read, write) = disk_bytes().unwrap_or((0, 0));
        let traffic = &self.traffic;
        let sample = Sample {
            t: (now - self.start).as_secs_f64(),
            cpu_user_pct: pct(ticks.0, self.last.1 .0),
            cpu_system_pct: pct(ticks.1, self.last.1 .1),
            rss_bytes: rss_bytes().unwrap_or(0),
            heap_bytes: crate::heap::live_bytes(),
            frame_pool_bytes: traffic.frame_pool_bytes.load(Ordering::Relaxed),
            endpoint_pool_bytes: traffic.endpoint_pool_bytes.load(Ordering::Relaxed),
            disk_read_bytes: read,
            disk_write_bytes: write,
            net_sent_bytes: traffic.sent.load(Ordering::Relaxed),
            net_received_bytes: traffic.received.load(Ordering::Relaxed),
            links: traffic
                .links
                .iter()
                .map(|l| {
                    (
                        l.peer,
                        l.sent.load(Ordering::Relaxed),
                        l.received.load(Ordering::Relaxed),
                    )
                })
                .collect(),
            link_net: traffic.links.iter().map(|l| l.net.load()).collect(),
        };
        self.last = (now, ticks);
        sample
    }
}

/// The sampling thread: a sample every `interval` (the first at once, the last once `stop`
/// is set), written to `out` as it is taken, or kept and returned without one.
fn sample_until(
    stop: &AtomicBool,
    interval: Duration,
    mut probe: Probe,
    mut out: Option<std::io::BufWriter<std::fs::File>>,
) -> std::io::Result<Vec<Sample>> {
    let mut samples = Vec::new();
    loop {
        let now = Instant::now();
        let sample = probe.sample(now);
        match out.as_mut() {
            Some(f) => {
                writeln!(f, "{}", sample.csv_row())?;
                f.flush()?;
            }
            None => samples.push(sample),
        }
        if stop.load(Ordering::Relaxed) {
            return Ok(samples);
        }
        // Sleep in small pieces so that finishing is prompt.
        let wake = now + interval;
        while Instant::now() < wake && !stop.load(Ordering::Relaxed) {
            std::thread::sleep((wake - Instant::now()).min(Duration::from_millis(50)));
        }
    }
}

impl ResourceSampler {
    /// Starts sampling every `interval` (the first sample at once), reading the link totals
    /// from `traffic`; with `path`, [`ResourceSampler::finish`] writes the CSV there.
    pub fn start(
        interval: Duration,
        traffic: Arc<TrafficTotals>,
        path: Option<PathBuf>,
    ) -> std::io::Result<Self> {
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        // With a file, each row is written (and flushed) as it is taken, so memory stays
        // flat however long the job runs and an interrupted job keeps its rows.
        let out = match &path {
            Some(p) => Some(open_csv(p, &traffic)?),
            None => None,
        };
        let thread = std::thread::Builder::new()
            .name("syncopate-sampler".into())
            .spawn(move || sample_until(&flag, interval, Probe::new(traffic), out))?;
        Ok(Self {
            stop,
            thread: Some(thread),
        })
    }

    /// Starts sampling process `rank` every `interval` into `dir/metrics-rank<rank>.csv`,
    /// creating `dir` if needed.
    pub fn start_in(
        dir: &Path,
        rank: usize,
        interval: Duration,
        traffic: Arc<TrafficTotals>,
    ) -> Result<Self, SamplerError> {
        std::fs::create_dir_all(dir).map_err(|source| SamplerError::CreateDir {
            dir: dir.to_path_buf(),
            source,
        })?;
        let path = dir.join(format!("metrics-rank{rank}.csv"));
        Self::start(interval, traffic, Some(path)).map_err(SamplerError::Start)
    }

    /// Takes a last sample and stops. Returns the rows when no path was given (with one,
    /// they are in the CSV and none is kept), or the first error writing them.
    pub fn finish(mut self) -> std::io::Result<Vec<Sample>> {
        self.stop.store(true, Ordering::Relaxed);
        match self.thread.take().map(|t| t.join()) {
            Some(Ok(rows)) => rows,
            Some(Err(_)) => Err(std::io::Error::other("the sampler thread panicked")),
            None => Ok(Vec::new()),
        }
    }
}

/// Stops `sampler`, if there is one, and writes its CSV.
pub fn finish_sampler(sampler: Option<ResourceSampler>) -> Result<(), SamplerError> {
    if let Some(s) = sampler {
        s.finish().map_err(SamplerError::Write)?;
    }
    Ok(())
}

impl Drop for ResourceSampler {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

/// Writes samples as CSV.
pub fn write_csv(path: &Path, samples: &[Sample]) -> std::io::Result<()> {
    let mut f = std::io::BufWriter::new(std::fs::File::create(path)?);
    let links = samples.first().map_or(&[][..], |s| &s.links[..]);
    writeln!(f, "{}", csv_header(links))?;
    for s in samples {
        writeln!(f, "{}", s.csv_row())?;
    }
    f.flush()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The figures are sane against a known load: a busy loop shows CPU, writing and syncing
    /// N bytes shows at least N written, the link totals are passed through.
    #[test]
    fn samples_track_a_known_load() {
        let traffic = Arc::new(TrafficTotals::for_peers([3, 5]));
        // The counters before the write, read here: the sampler's first sample may come
        // after it on a busy machine.
        let (_, written_before) = disk_bytes().unwrap();
        let sampler =
            ResourceSampler::start(Duration::from_millis(100), traffic.clone(), None).unwrap();
        let dir = tempfile::tempdir_in(std::env::current_dir().unwrap()).unwrap();
        let n = 8 << 20;
        let mut f = std::fs::File::create(dir.path().join("blob")).unwrap();
        f.write_all(&vec![7u8; n]).unwrap();
        f.sync_all().unwrap();
        let t = Instant::now();
        let mut x = 0u64;
        while t.elapsed() < Duration::from_millis(300) {
            x = x.wrapping_mul(6364136223846793005).wrapping_add(1);
        }
        std::hint::black_box(x);
        traffic.add_sent(0, 12000);
        traffic.add_sent(1, 345);
        traffic.add_received(1, 77);
        let samples = sampler.finish().unwrap();
        assert!(samples.len() >= 3, "{samples:?}");
        let last = samples.last().unwrap();
        assert_eq!(last.net_sent_bytes, 12345);
        assert_eq!(last.net_received_bytes, 77);
        assert_eq!(last.links, vec![(3, 12000, 0), (5, 345, 77)]);
        assert!(last.rss_bytes > 1 << 20);
        let written = last.disk_write_bytes - written_before;
        assert!(
            written >= n as u64,
            "wrote {n} bytes, /proc/self/io says {written}"
        );
        // Not a timing bound (the machine may be busy): only that the loop's CPU shows.
        let busy = samples.iter().map(|s| s.cpu_user_pct).fold(0.0, f64::max);
        assert!(busy > 0.0, "a busy loop shows CPU: {samples:?}");
        assert!(samples.windows(2).all(|w| w[0].t <= w[1].t));
    }

    /// With a path, rows go to the file as they are taken and none is kept in memory.
    #[test]
    fn a_sampler_with_a_file_streams_its_rows() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("m.csv");
        let traffic = Arc::new(TrafficTotals::for_peers([4]));
        let sampler =
            ResourceSampler::start(Duration::from_millis(1), traffic, Some(path.clone())).unwrap();
        // The header is there from the start.
        let text = std::fs::read_to_string(&path).unwrap();
        assert!(text.starts_with(CSV_HEADER), "{text}");
        assert!(text
            .lines()
            .next()
            .unwrap()
            .ends_with("queueing_ns_to_rank4"));
        assert!(sampler.finish().unwrap().is_empty());
        let text = std::fs::read_to_string(&path).unwrap();
        let widths: Vec<usize> = text.lines().map(|l| l.split(',').count()).collect();
        assert!(widths.len() >= 2, "a header and a row at least: {text}");
        assert!(widths.iter().all(|&w| w == widths[0]), "{text}");
        let missing = dir.path().join("no/such/dir/m.csv");
        let traffic = Arc::new(TrafficTotals::for_peers([4]));
        assert!(ResourceSampler::start(Duration::from_millis(1), traffic, Some(missing)).is_err());
    }

    #[test]
    fn csv_has_a_header_and_a_row_per_sample() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("m.csv");
        let s = Sample {
            t: 1.0,
            cpu_user_pct: 50.0,
            cpu_system_pct: 2.0,
            rss_bytes: 10,
            heap_bytes: Some(9),
            frame_pool_bytes: 6,
            endpoint_pool_bytes: 8,
            disk_read_bytes: 1,
            disk_write_bytes: 2,
            net_sent_bytes: 3,
            net_received_bytes: 4,
            links: vec![(2, 3, 4)],
            link_net: vec![[5, 5, 0, 7]],
        };
        write_csv(&path, &[s.clone(), s]).unwrap();
        let text = std::fs::read_to_string(&path).unwrap();
        assert_eq!(text.lines().count(), 3);
        assert!(text.starts_with(CSV_HEADER));
        let header: Vec<_> = text.lines().next().unwrap().split(',').collect();
        let row: Vec<_> = text.lines().nth(1).unwrap().split(',').collect();
        assert_eq!(header.len(), row.len());
        assert_eq!(
            header[3..7],
            [
                "rss_bytes",
                "heap_bytes",
                "frame_pool_bytes",
                "endpoint_pool_bytes"
            ]
        );
        assert_eq!(row[3..7], ["10", "9", "6", "8"]);
        assert_eq!(
            header[11..],
            [
                "sent_to_rank2",
                "received_from_rank2",
                "lost_to_rank2",
                "retransmitted_to_rank2",
                "dropped_to_rank2",
                "queueing_ns_to_rank2"
            ]
        );
        assert_eq!(row[13..], ["5", "5", "0", "7"]);
    }
}
