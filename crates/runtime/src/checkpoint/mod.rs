//! Checkpoints of a job on disk: where each process writes its state, how a resumed job
//! finds the newest step that every process completed, and what it refuses.
//!
//! Every N steps (core's [`CheckpointSchedule`](syncopate_core::step::CheckpointSchedule))
//! each process writes what it owns into `DIR/step-<S>/`, where S is the number of steps
//! done: `rank-<R>.safetensors` (its state), perhaps `rank-<R>.json` (what it measured), and
//! then `rank-<R>.toml`, its manifest: the step, the job's identity ([`JobIdentity`]: model,
//! strategy, processes and every setting that changes the weights) and a MAC of each file
//! (HMAC-SHA256 under a key derived from the job token, over the step, rank, identity and
//! the file's bytes), so a file changed by anyone without the token is refused; the
//! manifest itself carries a MAC over all its other fields (`manifest_mac`), so that no
//! line of it can be removed or altered either. Every file
//! is written atomically (temporary file, fsync, rename, fsync of the folder), so a process
//! killed mid-write leaves either nothing or a whole file. A step is complete when every
//! rank's manifest is there, names this job, and its files have the MACs it names.
//!
//! Processes may drift any number of steps apart (a step-wise averaging worker does not
//! wait for the slowest), so pruning goes by what is complete, never by a count of steps:
//! after each checkpoint a process removes its own files of the steps older than the
//! second newest step whose manifests every rank of this run has written. The two newest
//! complete steps (the older one in case the newer turns out corrupt) and every newer step
//! stay, whatever the drift. Only this run's steps count, and only its files go: the
//! identity in every manifest names the run ([`JobIdentity::run`]), so the steps of another
//! job in the same folder are never taken for newer ones. A job started afresh refuses a
//! folder holding step folders already ([`claim_fresh`]) unless told to replace them.

mod identity;
mod plan;
#[cfg(test)]
mod tests;

use std::fs::File;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

pub use identity::{new_run_id, settings_of, Difference, JobIdentity, WeightSettings};
pub use plan::{JobFolders, TrainingFlags};

/// Where and how often a process writes checkpoints (`--checkpoint-dir`, `--checkpoint-every`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CheckpointPlan {
    /// The job's checkpoint folder.
    pub dir: PathBuf,
    /// Steps between two checkpoints.
    pub every: u64,
    /// The run id a job started afresh writes under (see [`JobIdentity::run`]; `None`: one
    /// derived from the token); a resumed job goes on under its checkpoint's.
    pub run: Option<String>,
}

impl CheckpointPlan {
    /// `job` under the run id this plan gives a job started afresh.
    pub fn fresh_identity(&self, job: JobIdentity) -> JobIdentity {
        match &self.run {
            Some(run) => job.with_run(run),
            None => job,
        }
    }
}

/// The format of the manifests this version writes (the first had none and a plain SHA-256
/// of the state; the second no run id and no MAC of the manifest itself).
const MANIFEST_FORMAT: u32 = 3;

/// A process's manifest: `step-<S>/rank-<R>.toml`.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct Manifest {
    /// [`MANIFEST_FORMAT`].
    format: u32,
    /// Steps done when the state was taken.
    step: u64,
    /// The rank whose state it is.
    rank: usize,
    /// The job that wrote it.
    job: JobIdentity,
    /// The state file, in the same folder.
    file: String,
    /// MAC of the state file (see [`file_mac`]), hex.
    mac: String,
    /// MAC of the process's record (`rank-<R>.json`: what it measured so far), if it
    /// wrote one.
    #[serde(default)]
    record_mac: Option<String>,
    /// MAC of every other field of the manifest (see [`Manifest::mac`]), hex.
    #[serde(default)]
    manifest_mac: Option<String>,
}

impl Manifest {
    /// The MAC of this manifest's fields but `manifest_mac`, under `job`'s key.
    fn mac(&self, job: &JobIdentity) -> String {
        with_manifest_bytes(self, |bytes| job.key.mac(&[b"manifest", bytes]))
    }

    /// Whether `manifest_mac` is the MAC of the other fields under `job`'s key.
    fn verifies(&self, job: &JobIdentity) -> bool {
        let Some(want) = &self.manifest_mac else {
            return false;
        };
        with_manifest_bytes(self, |bytes| job.key.verifies(&[b"manifest", bytes], want))
    }
}

/// Hands `f` the bytes a manifest's own MAC covers: its JSON without `manifest_mac`.
fn with_manifest_bytes<T>(manifest: &Manifest, f: impl FnOnce(&[u8]) -> T) -> T {
    let unsigned = Manifest {
        manifest_mac: None,
        ..manifest.clone()
    };
    f(&serde_json::to_vec(&unsigned).unwrap_or_default())
}

/// Why a checkpoint could not be written or resumed.
#[derive(Debug, thiserror::Error)]
pub enum CheckpointError {
    /// Reading or writing a file failed.
    #[error("checkpoint {path}: {source}")]
    Io {
        /// The file or folder.
        path: PathBuf,
        /// The failure.
        source: std::io::Error,
    },
    /// The newest checkpoint belongs to another job, or to this job run with other
    /// settings.
    #[error(
        "cannot resume from {path}: it was written by a job with other settings: {}. \
         A resume must repeat them",
        differences.iter().map(ToString::to_string).collect::<Vec<_>>().join("; ")
    )]
    OtherJob {
        /// The manifest.
        path: PathBuf,
        /// Every difference, in a fixed order.
        differences: Vec<Difference>,
    },
    /// The manifest was written by an earlier version, which recorded neither the job's
    /// settings nor a keyed MAC.
    #[error(
        "checkpoint {path} was written by an earlier version of syncopate, whose manifests \
         this version cannot check, so it does not resume from it (start the job afresh, or \
         finish it with the version that wrote it)"
    )]
    OldFormat {
        /// The manifest.
        path: PathBuf,
    },
    /// A manifest whose own MAC is missing or wrong: a line of it was removed or altered.
    #[error(
        "checkpoint manifest {path} was altered since it was written (a line removed or \
         changed: its manifest_mac does not match), so it is not resumed from"
    )]
    AlteredManifest {
        /// The manifest.
        path: PathBuf,
    },
    /// A job started afresh found step folders of another job in its checkpoint folder.
    #[error(
        "{} already holds checkpoints of another job ({}). Resume that job with --resume \
         {}, choose another --checkpoint-dir, or give --replace-checkpoints to delete those \
         folders",
        dir.display(),
        steps.iter().map(|p| p.display().to_string()).collect::<Vec<_>>().join(", "),
        dir.display()
    )]
    Occupied {
        /// The checkpoint folder.
        dir: PathBuf,
        /// Its step folders.
        steps: Vec<PathBuf>,
    },
    /// Checkpoints were asked for with no folder to write them into.
    #[error("--checkpoint-every needs --checkpoint-dir DIR (or --resume DIR) to write into")]
    NoFolder,
    /// No step of the folder is complete.
    #[error("no complete checkpoint in {dir}: {why}")]
    NoneComplete {
        /// The checkpoint folder.
        dir: PathBuf,
        /// What each candidate lacked.
        why: String,
    },
}

type Result<T> = std::result::Result<T, CheckpointError>;

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> CheckpointError + '_ {
    move |source| CheckpointError::Io {
        path: path.to_path_buf(),
        source,
    }
}

/// The folder of the checkpoint after `step` steps.
pub fn step_dir(dir: &Path, step: u64) -> PathBuf {
    dir.join(format!("step-{step:08}"))
}

fn state_name(rank: usize) -> String {
    format!("rank-{rank}.safetensors")
}

fn manifest_name(rank: usize) -> String {
    format!("rank-{rank}.toml")
}

fn record_name(rank: usize) -> String {
    format!("rank-{rank}.json")
}

/// Hands `f` what a file's MAC covers: its kind (`state` or `record`), the step, the rank,
/// the job's identity and the file's bytes.
fn with_mac_input<T>(
    job: &JobIdentity,
    (kind, step, rank): (&str, u64, usize),
    bytes: &[u8],
    f: impl FnOnce(&[&[u8]]) -> T,
) -> T {
    let identity = serde_json::to_vec(job).unwrap_or_default();
    let (step, rank) = (step.to_le_bytes(), (rank as u64).to_le_bytes());
    f(&[kind.as_bytes(), &step, &rank, &identity, bytes])
}

/// The MAC of a `kind` file of rank `rank` after `step` steps of `job`, holding `bytes`,
/// under `job`'s key, hex.
fn file_mac(job: &JobIdentity, kind: &str, step: u64, rank: usize, bytes: &[u8]) -> String {
    with_mac_input(job, (kind, step, rank), bytes, |parts| job.key.mac(parts))
}

/// Whether `want` is the MAC of a `kind` file holding `bytes` (see [`file_mac`]).
fn has_mac(job: &JobIdentity, file: (&str, u64, usize), bytes: &[u8], want: &str) -> bool {
    with_mac_input(job, file, bytes, |parts| job.key.verifies(parts, want))
}

/// Writes `bytes` to `path` atomically and durably (temporary file, fsync, rename, fsync
/// of the folder).
fn write_atomic(path: &Path, bytes: &[u8]) -> Result<()> {
    syncopate_train::checkpoint::write_durably(path, bytes).map_err(io(path))
}

fn sync_dir(dir: &Path) -> Result<()> {
    File::open(dir).and_then(|d| d.sync_all()).map_err(io(dir))
}

/// What one process writes at a checkpoint.
#[derive(Debug, Clone, Copy)]
pub struct ProcessState<'a> {
    /// Its state (a safetensors file's bytes).
    pub state: &'a [u8],
    /// What it measured so far (figures a resumed run carries on from), if anything.
    pub record: Option<&'a [u8]>,
}

/// Writes rank `rank`'s checkpoint after `step` steps of job `job` into `dir`, then drops
/// its own files of the steps no longer needed (see the module's doc).
pub fn write(
    dir: &Path,
    step: u64,
    rank: usize,
    job: &JobIdentity,
    written: ProcessState<'_>,
) -> Result<()> {
    let at = step_dir(dir, step);
    std::fs::create_dir_all(&at).map_err(io(&at))?;
    write_atomic(&at.join(state_name(rank)), written.state)?;
    if let Some(record) = written.record {
        write_atomic(&at.join(record_name(rank)), record)?;
    }
    let mut manifest = Manifest {
        format: MANIFEST_FORMAT,
        step,
        rank,
        job: job.clone(),
        file: state_name(rank),
        mac: file_mac(job, "state", step, rank, written.state),
        record_mac: written
            .record
            .map(|r| file_mac(job, "record", step, rank, r)),
        manifest_mac: None,
    };
    manifest.manifest_mac = Some(manifest.mac(job));
    let text = toml::to_string(&manifest).map_err(|e| CheckpointError::Io {
        path: at.join(manifest_name(rank)),
        source: std::io::Error::other(e),
    })?;
    write_atomic(&at.join(manifest_name(rank)), text.as_bytes())?;
    sync_dir(&at)?;
    sync_dir(dir)?;
    prune(dir, rank, job)
}

/// The step folders of `dir` (none when it does not exist), oldest first.
pub fn step_folders(dir: &Path) -> Vec<PathBuf> {
    let mut steps = steps_in(dir).unwrap_or_default();
    steps.reverse();
    steps.into_iter().map(|s| step_dir(dir, s)).collect()
}

/// Readies `dir` for a job started afresh (not resumed): refuses it while it holds step
/// folders, which can only be another job's ([`CheckpointError::Occupied`]), unless
/// `replace`, which deletes them.
pub fn claim_fresh(dir: &Path, replace: bool) -> Result<()> {
    let steps = step_folders(dir);
    if steps.is_empty() {
        return Ok(());
    }
    if !replace {
        return Err(CheckpointError::Occupied {
            dir: dir.to_path_buf(),
            steps,
        });
    }
    for step in steps {
        match std::fs::remove_dir_all(&step) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(io(&step)(e)),
            _ => {}
        }
    }
    Ok(())
}

/// The steps of `dir`'s checkpoint folders, newest first.
fn steps_in(dir: &Path) -> Result<Vec<u64>> {
    let mut steps: Vec<u64> = std::fs::read_dir(dir)
        .map_err(io(dir))?
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.strip_prefix("step-")?.parse().ok())
        .collect();
    steps.sort_unstable_by(|a, b| b.cmp(a));
    Ok(steps)
}

/// Whether rank `rank`'s manifest in `at` was written by `job`'s run (a manifest is
/// written last, so its files are whole).
fn written_by(at: &Path, rank: usize, job: &JobIdentity) -> bool {
    parse_manifest(at, rank).is_ok_and(|m| m.job.same_run(job))
}

/// The steps of `dir` in which each rank of `job` has written its manifest, naming this
/// run, newest first.
fn written_by_all(dir: &Path, job: &JobIdentity) -> Result<Vec<u64>> {
    let mut steps = steps_in(dir)?;
    steps.retain(|&step| {
        let at = step_dir(dir, step);
        (0..job.workers + job.servers).all(|rank| written_by(&at, rank, job))
    });
    Ok(steps)
}

/// Removes `rank`'s files from every step folder older than the second newest step that
/// every rank of `job`'s run has written (nothing while there are fewer than two), and
/// folders left empty: the two newest complete steps and every newer one stay, and so do
/// the files of any other job.
fn prune(dir: &Path, rank: usize, job: &JobIdentity) -> Result<()> {
    let Some(&oldest_kept) = written_by_all(dir, job)?.get(1) else {
        return Ok(());
    };
    for step in steps_in(dir)?.into_iter().filter(|&s| s < oldest_kept) {
        let at = step_dir(dir, step);
        let own = at.join(manifest_name(rank));
        if own.exists() && !written_by(&at, rank, job) {
            continue; // another job's
        }
        for name in [manifest_name(rank), state_name(rank), record_name(rank)] {
            let path = at.join(name);
            match std::fs::remove_file(&path) {
                Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(io(&path)(e)),
                _ => {}
            }
        }
        // Fails while other ranks' files are still there; the last one out removes it.
        let _ = std::fs::remove_dir(&at);
    }
    Ok(())
}

/// The newest complete checkpoint of a folder, from which a job resumes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResumePoint {
    /// Steps done.
    pub step: u64,
    /// Its folder.
    pub dir: PathBuf,
    /// The job resuming it (whose key checks its files), with the run id of the checkpoint.
    job: JobIdentity,
}

impl ResumePoint {
    /// The run id of the checkpoint, which the resumed job goes on under.
    pub fn run(&self) -> &str {
        &self.job.run
    }

    /// Rank `rank`'s state, checked against its manifest's MAC.
    pub fn read_state(&self, rank: usize) -> Result<Vec<u8>> {
        let path = self.dir.join(state_name(rank));
        let bytes = std::fs::read(&path).map_err(io(&path))?;
        let manifest = read_manifest(&self.dir, rank, &self.job)?;
        self.check_read(&path, "state", rank, &bytes, &manifest.mac)?;
        Ok(bytes)
    }

    /// Rank `rank`'s record, checked against its manifest (`None`: it wrote none).
    pub fn read_record(&self, rank: usize) -> Result<Option<Vec<u8>>> {
        let Some(want) = read_manifest(&self.dir, rank, &self.job)?.record_mac else {
            return Ok(None);
        };
        let path = self.dir.join(record_name(rank));
        let bytes = std::fs::read(&path).map_err(io(&path))?;
        self.check_read(&path, "record", rank, &bytes, &want)?;
        Ok(Some(bytes))
    }

    /// Refuses `bytes` read from `path` unless `want` is their MAC.
    fn check_read(
        &self,
        path: &Path,
        kind: &str,
        rank: usize,
        bytes: &[u8],
        want: &str,
    ) -> Result<()> {
        if has_mac(&self.job, (kind, self.step, rank), bytes, want) {
            return Ok(());
        }
        Err(io(path)(std::io::Error::other(
            "its MAC differs from the manifest's (changed since it was checked)",
        )))
    }
}

/// Reads rank `rank`'s manifest in `at`, checked against its own MAC under `job`'s key
/// ([`CheckpointError::AlteredManifest`] when it fails, [`CheckpointError::OldFormat`]
/// for an earlier format).
fn read_manifest(at: &Path, rank: usize, job: &JobIdentity) -> Result<Manifest> {
    let manifest = parse_manifest(at, rank)?;
    if manifest.verifies(job) {
        return Ok(manifest);
    }
    Err(CheckpointError::AlteredManifest {
        path: at.join(manifest_name(rank)),
    })
}

/// Reads rank `rank`'s manifest in `at` without checking its MAC; one of an earlier
/// format is [`CheckpointError::OldFormat`].
fn parse_manifest(at: &Path, rank: usize) -> Result<Manifest> {
    let path = at.join(manifest_name(rank));
    let text = std::fs::read_to_string(&path).map_err(io(&path))?;
    let table: toml::Table =
        toml::from_str(&text).map_err(|e| io(&path)(std::io::Error::other(e)))?;
    let format = table.get("format").and_then(toml::Value::as_integer);
    if format.is_none_or(|f| f < i64::from(MANIFEST_FORMAT)) {
        return Err(CheckpointError::OldFormat { path });
    }
    toml::from_str(&text).map_err(|e| io(&path)(std::io::Error::other(e)))
}

/// The newest step of `dir` that every rank of `job` completed. A checkpoint of another job
/// (or of this one with other settings) or of an earlier format is refused; incomplete or
/// corrupt steps are passed over (the reasons are in the error when none is complete).
pub fn newest_complete(dir: &Path, job: &JobIdentity) -> Result<ResumePoint> {
    let steps = steps_in(dir)?;
    let mut why = Vec::new();
    for step in steps {
        let at = step_dir(dir, step);
        match check_step(&at, step, job)? {
            Ok(run) => {
                return Ok(ResumePoint {
                    step,
                    dir: at,
                    job: job.clone().with_run(&run),
                })
            }
            Err(reason) => why.push(format!("step {step}: {reason}")),
        }
    }
    if why.is_empty() {
        why.push("it holds no step-<S> folder".into());
    }
    Err(CheckpointError::NoneComplete {
        dir: dir.to_path_buf(),
        why: why.join("; "),
    })
}

/// The newest step of `dir` whose manifests every rank of the job that wrote it wrote,
/// naming the same job, whatever that job was (`None`: no such step, or no readable
/// folder): for a caller that only decides whether to resume, leaving the checks against
/// its job (settings and MACs, which need the token) to the job itself.
pub fn newest_complete_any(dir: &Path) -> Option<u64> {
    steps_in(dir).ok()?.into_iter().find(|&step| {
        let at = step_dir(dir, step);
        let Ok(first) = parse_manifest(&at, 0) else {
            return false;
        };
        (0..first.job.workers + first.job.servers).all(|rank| {
            parse_manifest(&at, rank)
                .is_ok_and(|m| m.step == step && m.rank == rank && m.job.same_run(&first.job))
        })
    })
}

/// The run id of the checkpoint in `at` when it is complete, else why it is not.
fn check_step(
    at: &Path,
    step: u64,
    job: &JobIdentity,
) -> Result<std::result::Result<String, String>> {
    let mut run: Option<String> = None;
    for rank in 0..job.workers + job.servers {
        let manifest = match parse_manifest(at, rank) {
            Ok(manifest) => manifest,
            Err(e @ CheckpointError::OldFormat { .. }) => return Err(e),
            Err(_) => return Ok(Err(format!("rank {rank} has no readable manifest"))),
        };
        let path = at.join(manifest_name(rank));
        let differences = job.differences(&manifest.job);
        if !differences.is_empty() {
            return Err(CheckpointError::OtherJob { path, differences });
        }
        if !manifest.verifies(job) {
            return Err(CheckpointError::AlteredManifest { path });
        }
        if run.get_or_insert_with(|| manifest.job.run.clone()) != &manifest.job.run {
            return Ok(Err(format!("rank {rank}'s manifest names another run")));
        }
        if manifest.step != step || manifest.rank != rank || manifest.file != state_name(rank) {
            return Ok(Err(format!("rank {rank}'s manifest names another file")));
        }
        let writer = job.clone().with_run(&manifest.job.run);
        let file_ok = |name: String, kind: &str, want: &str| {
            std::fs::read(at.join(name))
                .is_ok_and(|b| has_mac(&writer, (kind, step, rank), &b, want))
        };
        let record_ok = manifest
            .record_mac
            .as_ref()
            .is_none_or(|want| file_ok(record_name(rank), "record", want));
        if !file_ok(state_name(rank), "state", &manifest.mac) || !record_ok {
            return Ok(Err(format!(
                "rank {rank}'s state is missing or fails its MAC"
            )));
        }
    }
    Ok(Ok(run.unwrap_or_default()))
}
