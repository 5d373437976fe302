//! Checkpoints of a job on disk: where each process writes its state, how a resumed job
//! finds the newest step that every process completed, and what it refuses.
//!
//! Every N steps (core's [`CheckpointSchedule`](syncopate_core::step::CheckpointSchedule))
//! each process writes what it owns into `DIR/step-<S>/`, where S is the number of steps
//! done: `rank-<R>.safetensors` (its state) and then `rank-<R>.toml`, its manifest (the
//! step, the job's identity and the state file's SHA-256). Both are written atomically
//! (temporary file, fsync, rename, fsync of the folder), so a process killed mid-write leaves
//! either nothing or a whole file. A step is complete when every rank's manifest is there,
//! names this job, and its file has the checksum it names. Each process keeps its files of
//! the last two steps it wrote: processes are at most one step apart, so the older one is
//! complete whenever the newer one is not.

use std::fs::File;
use std::io::Write;
use std::path::{Path, PathBuf};

use hmac::{Hmac, Mac};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::auth::JobToken;

/// Where and how often a process writes checkpoints (`--checkpoint-dir`, `--checkpoint-every`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CheckpointPlan {
    /// The job's checkpoint folder.
    pub dir: PathBuf,
    /// Steps between two checkpoints.
    pub every: u64,
}

/// What a checkpoint must agree on with the job that resumes it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct JobIdentity {
    /// The model's name.
    pub model: String,
    /// The model's fingerprint (layers and shapes), hex.
    pub fingerprint: String,
    /// The strategy's name.
    pub strategy: String,
    /// Worker processes.
    pub workers: usize,
    /// Server processes.
    pub servers: usize,
    /// A keyed digest of the job token (never the token itself), hex.
    pub token: String,
}

impl JobIdentity {
    /// The identity of a job of `model` (with `fingerprint`) run by `strategy` over
    /// `workers` and `servers` processes under `token`.
    pub fn new(
        model: &str,
        fingerprint: u64,
        strategy: &str,
        workers: usize,
        servers: usize,
        token: &JobToken,
    ) -> Self {
        Self {
            model: model.to_string(),
            fingerprint: format!("{fingerprint:016x}"),
            strategy: strategy.to_string(),
            workers,
            servers,
            token: token_digest(token),
        }
    }

    /// The first field in which `other` differs from this identity, as
    /// `(field, other's value, this one's)`.
    fn mismatch(&self, other: &JobIdentity) -> Option<(&'static str, String, String)> {
        let fields = [
            ("model", other.model.clone(), self.model.clone()),
            (
                "model fingerprint",
                other.fingerprint.clone(),
                self.fingerprint.clone(),
            ),
            ("strategy", other.strategy.clone(), self.strategy.clone()),
            (
                "worker count",
                other.workers.to_string(),
                self.workers.to_string(),
            ),
            (
                "server count",
                other.servers.to_string(),
                self.servers.to_string(),
            ),
        ];
        if let Some(m) = fields.into_iter().find(|(_, a, b)| a != b) {
            return Some(m);
        }
        (other.token != self.token).then(|| ("token", "another".into(), "this job's".into()))
    }
}

/// HMAC-SHA256(token, label): tells tokens apart without revealing them.
fn token_digest(token: &JobToken) -> String {
    type HmacSha256 = Hmac<Sha256>;
    let mut mac = match HmacSha256::new_from_slice(token.to_hex().as_bytes()) {
        Ok(mac) => mac,
        Err(_) => return String::new(), // HMAC takes keys of any length
    };
    mac.update(b"syncopate-v1 checkpoint token");
    hex::encode(&mac.finalize().into_bytes()[..16])
}

/// A process's manifest: `step-<S>/rank-<R>.toml`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
struct Manifest {
    /// Steps done when the state was taken.
    step: u64,
    /// The rank whose state it is.
    rank: usize,
    /// The job that wrote it.
    job: JobIdentity,
    /// The state file, in the same folder.
    file: String,
    /// SHA-256 of the state file, hex.
    sha256: String,
    /// SHA-256 of the process's record (`rank-<R>.json`: what it measured so far), if it
    /// wrote one.
    #[serde(default)]
    record_sha256: Option<String>,
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
    /// The newest checkpoint belongs to another job.
    #[error(
        "checkpoint {path} is not of this job: its {field} is {found}, this job's is {want} \
         (resume with the same model, strategy, --workers, --servers and token)"
    )]
    OtherJob {
        /// The manifest.
        path: PathBuf,
        /// What differs.
        field: &'static str,
        /// The checkpoint's value.
        found: String,
        /// This job's value.
        want: String,
    },
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

fn sha256_hex(bytes: &[u8]) -> String {
    hex::encode(Sha256::digest(bytes))
}

/// Whether the file at `path` exists and has the SHA-256 `want`.
fn has_checksum(path: &Path, want: &str) -> bool {
    std::fs::read(path).is_ok_and(|b| sha256_hex(&b) == want)
}

/// Writes `bytes` to `path` atomically and durably: a temporary file, fsync, rename.
fn write_atomic(path: &Path, bytes: &[u8]) -> Result<()> {
    let tmp = path.with_extension("tmp");
    let mut file = File::create(&tmp).map_err(io(&tmp))?;
    file.write_all(bytes).map_err(io(&tmp))?;
    file.sync_all().map_err(io(&tmp))?;
    std::fs::rename(&tmp, path).map_err(io(path))
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
/// its own files of all but the last two steps it wrote.
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
    let manifest = Manifest {
        step,
        rank,
        job: job.clone(),
        file: state_name(rank),
        sha256: sha256_hex(written.state),
        record_sha256: written.record.map(sha256_hex),
    };
    let text = toml::to_string(&manifest).map_err(|e| CheckpointError::Io {
        path: at.join(manifest_name(rank)),
        source: std::io::Error::other(e),
    })?;
    write_atomic(&at.join(manifest_name(rank)), text.as_bytes())?;
    sync_dir(&at)?;
    sync_dir(dir)?;
    prune(dir, rank)
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

/// Removes `rank`'s files from every step folder but the two newest that hold its
/// manifest, and folders left empty.
fn prune(dir: &Path, rank: usize) -> Result<()> {
    let mine: Vec<u64> = steps_in(dir)?
        .into_iter()
        .filter(|&s| step_dir(dir, s).join(manifest_name(rank)).exists())
        .collect();
    for &step in mine.iter().skip(2) {
        let at = step_dir(dir, step);
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
}

impl ResumePoint {
    /// Rank `rank`'s state, checked against its manifest's checksum.
    pub fn read_state(&self, rank: usize) -> Result<Vec<u8>> {
        let path = self.dir.join(state_name(rank));
        let bytes = std::fs::read(&path).map_err(io(&path))?;
        let manifest = read_manifest(&self.dir, rank)?;
        check_read(&path, &bytes, &manifest.sha256)?;
        Ok(bytes)
    }

    /// Rank `rank`'s record, checked against its manifest (`None`: it wrote none).
    pub fn read_record(&self, rank: usize) -> Result<Option<Vec<u8>>> {
        let Some(want) = read_manifest(&self.dir, rank)?.record_sha256 else {
            return Ok(None);
        };
        let path = self.dir.join(record_name(rank));
        let bytes = std::fs::read(&path).map_err(io(&path))?;
        check_read(&path, &bytes, &want)?;
        Ok(Some(bytes))
    }
}

/// Refuses `bytes` read from `path` unless their SHA-256 is `want`.
fn check_read(path: &Path, bytes: &[u8], want: &str) -> Result<()> {
    if sha256_hex(bytes) == want {
        return Ok(());
    }
    Err(io(path)(std::io::Error::other(
        "its checksum differs from the manifest's (changed since it was checked)",
    )))
}

fn read_manifest(at: &Path, rank: usize) -> Result<Manifest> {
    let path = at.join(manifest_name(rank));
    let text = std::fs::read_to_string(&path).map_err(io(&path))?;
    toml::from_str(&text).map_err(|e| io(&path)(std::io::Error::other(e)))
}

/// The newest step of `dir` that every rank of `job` completed. A checkpoint of another job
/// is refused; incomplete or corrupt steps are passed over (the reasons are in the error
/// when none is complete).
pub fn newest_complete(dir: &Path, job: &JobIdentity) -> Result<ResumePoint> {
    let steps = steps_in(dir)?;
    let mut why = Vec::new();
    for step in steps {
        let at = step_dir(dir, step);
        match check_step(&at, step, job)? {
            None => return Ok(ResumePoint { step, dir: at }),
            Some(reason) => why.push(format!("step {step}: {reason}")),
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

/// The newest step of `dir` that every rank of the job that wrote it completed, whatever
/// that job was (`None`: no complete step, or no readable folder): for a caller that only
/// decides whether to resume, leaving the checks against its job to the job itself.
pub fn newest_complete_any(dir: &Path) -> Option<u64> {
    steps_in(dir).ok()?.into_iter().find(|&step| {
        let at = step_dir(dir, step);
        read_manifest(&at, 0).is_ok_and(|m| matches!(check_step(&at, step, &m.job), Ok(None)))
    })
}

/// Why the checkpoint in `at` is incomplete (`None`: it is complete).
fn check_step(at: &Path, step: u64, job: &JobIdentity) -> Result<Option<String>> {
    for rank in 0..job.workers + job.servers {
        let Ok(manifest) = read_manifest(at, rank) else {
            return Ok(Some(format!("rank {rank} has no readable manifest")));
        };
        if let Some((field, found, want)) = job.mismatch(&manifest.job) {
            return Err(CheckpointError::OtherJob {
                path: at.join(manifest_name(rank)),
                field,
                found,
                want,
            });
        }
        if manifest.step != step || manifest.rank != rank || manifest.file != state_name(rank) {
            return Ok(Some(format!("rank {rank}'s manifest names another file")));
        }
        let record_ok = manifest
            .record_sha256
            .as_ref()
            .is_none_or(|want| has_checksum(&at.join(record_name(rank)), want));
        if !has_checksum(&at.join(state_name(rank)), &manifest.sha256) || !record_ok {
            return Ok(Some(format!(
                "rank {rank}'s state is missing or fails its checksum"
            )));
        }
    }
    Ok(None)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn job(workers: usize) -> JobIdentity {
        let token = JobToken::from_hex(&"ab".repeat(32)).unwrap();
        JobIdentity::new("lenet", 7, "ps", workers, 1, &token)
    }

    fn write_all(dir: &Path, step: u64, job: &JobIdentity, ranks: std::ops::Range<usize>) {
        for rank in ranks {
            let state = format!("{step}/{rank}");
            let record = format!("record {step}/{rank}");
            let written = ProcessState {
                state: state.as_bytes(),
                record: (rank == 0).then_some(record.as_bytes()),
            };
            write(dir, step, rank, job, written).unwrap();
        }
    }

    #[test]
    fn the_newest_step_every_rank_completed_is_chosen() {
        let dir = tempfile::tempdir().unwrap();
        let j = job(2);
        write_all(dir.path(), 10, &j, 0..3);
        write_all(dir.path(), 20, &j, 0..2); // the server was killed before step 20
        let p = newest_complete(dir.path(), &j).unwrap();
        assert_eq!(p.step, 10);
        assert_eq!(newest_complete_any(dir.path()), Some(10));
        assert_eq!(p.read_state(2).unwrap(), b"10/2");
        assert_eq!(p.read_record(0).unwrap().unwrap(), b"record 10/0");
        assert_eq!(p.read_record(1).unwrap(), None);
        write_all(dir.path(), 20, &j, 2..3);
        assert_eq!(newest_complete(dir.path(), &j).unwrap().step, 20);
        std::fs::write(step_dir(dir.path(), 20).join(record_name(0)), b"x").unwrap();
        assert_eq!(
            newest_complete_any(dir.path()),
            Some(10),
            "a corrupt record"
        );
    }

    #[test]
    fn a_corrupt_or_truncated_state_is_passed_over() {
        let dir = tempfile::tempdir().unwrap();
        let j = job(2);
        write_all(dir.path(), 10, &j, 0..3);
        write_all(dir.path(), 20, &j, 0..3);
        std::fs::write(step_dir(dir.path(), 20).join(state_name(1)), b"20/").unwrap();
        let p = newest_complete(dir.path(), &j).unwrap();
        assert_eq!(p.step, 10);
    }

    #[test]
    fn each_rank_keeps_its_last_two_steps() {
        let dir = tempfile::tempdir().unwrap();
        let j = job(2);
        for step in [10, 20, 30, 40] {
            write_all(dir.path(), step, &j, 0..3);
        }
        assert_eq!(steps_in(dir.path()).unwrap(), vec![40, 30]);
    }

    #[test]
    fn another_jobs_checkpoint_is_refused_naming_what_differs() {
        let dir = tempfile::tempdir().unwrap();
        write_all(dir.path(), 10, &job(2), 0..3);
        let err = newest_complete(dir.path(), &job(3))
            .unwrap_err()
            .to_string();
        assert!(err.contains("worker count is 2, this job's is 3"), "{err}");
        let other = JobToken::from_hex(&"cd".repeat(32)).unwrap();
        let j = JobIdentity::new("lenet", 7, "ps", 2, 1, &other);
        let err = newest_complete(dir.path(), &j).unwrap_err().to_string();
        assert!(err.contains("token"), "{err}");
        assert!(!err.contains(&"ab".repeat(32)), "the token leaks: {err}");
    }

    #[test]
    fn an_empty_folder_says_so() {
        let dir = tempfile::tempdir().unwrap();
        let err = newest_complete(dir.path(), &job(2))
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("no complete checkpoint") && err.contains("no step-"),
            "{err}"
        );
        assert_eq!(newest_complete_any(dir.path()), None);
        let err = newest_complete(&dir.path().join("nope"), &job(2)).unwrap_err();
        assert!(err.to_string().contains("nope"), "{err}");
    }
}
