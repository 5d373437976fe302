//! A worker's rows that grow with the run ([`Log`]: its per-step rows, `steps-rank<R>.csv`,
//! and rank 0's evaluations, `evals-rank0.csv`), appended to a file as they come rather
//! than held in a checkpoint: a checkpoint records only how many bytes of the file it covers
//! and their SHA-256 ([`RowsMark`]), and a resumed job cuts the file back to that mark before
//! appending, so its rows are the whole job's and a checkpoint's size does not grow with
//! the steps done.
//!
//! Where the file lives: beside the checkpoints (`DIR/rows-rank<R>.csv`,
//! `DIR/evals-rank<R>.csv`) when the worker writes checkpoints, so that a resumed job finds
//! it; else straight in the metrics folder; else nowhere (nothing would read the rows). At
//! the end it is copied to the metrics folder when it lives elsewhere.

use std::fs::File;
use std::io::{BufWriter, Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};

use crate::error::RunError;

/// The first line of `steps-rank<R>.csv`.
const HEADER: &str =
    "step,t_end_s,step_s,loss,data_s,compute_s,wait_s,optimizer_s,tensors,tensor_p50_s,tensor_p99_s,sent_bytes,sent_before_bytes\n";
/// The first line of `evals-rank<R>.csv`.
pub(super) const EVAL_HEADER: &str = "epoch,step,t_s,test_accuracy,test_loss\n";

/// Which of a worker's growing files.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Log {
    /// One row per step.
    Steps,
    /// One row per evaluation.
    Evals,
}

impl Log {
    /// The file's first line.
    fn header(self) -> &'static str {
        match self {
            Log::Steps => HEADER,
            Log::Evals => EVAL_HEADER,
        }
    }

    /// The file of worker `rank` beside its checkpoints in `dir`.
    fn beside_checkpoints(self, dir: &Path, rank: usize) -> PathBuf {
        match self {
            Log::Steps => rows_in(dir, rank),
            Log::Evals => dir.join(format!("evals-rank{rank}.csv")),
        }
    }

    /// The file of worker `rank` in the metrics folder `dir`.
    pub(super) fn in_metrics(self, dir: &Path, rank: usize) -> PathBuf {
        match self {
            Log::Steps => steps_csv_in(dir, rank),
            Log::Evals => dir.join(format!("evals-rank{rank}.csv")),
        }
    }
}

/// How much of a rows file a checkpoint covers: its first `bytes` bytes, whose SHA-256 is
/// `sha256`.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub(super) struct RowsMark {
    /// Bytes covered, the header included.
    pub(super) bytes: u64,
    /// Their SHA-256, hex.
    pub(super) sha256: String,
}

/// The name of worker `rank`'s rows file in a checkpoint folder.
pub(super) fn rows_in(checkpoint_dir: &Path, rank: usize) -> PathBuf {
    checkpoint_dir.join(format!("rows-rank{rank}.csv"))
}

/// The name of worker `rank`'s rows in a metrics folder.
pub(super) fn steps_csv_in(metrics_dir: &Path, rank: usize) -> PathBuf {
    metrics_dir.join(format!("steps-rank{rank}.csv"))
}

/// Worker `rank`'s `log`: beside its checkpoints (`checkpoints`), else in `metrics`, else
/// nowhere; resumed from `resumed` (the resumed folder and its checkpoint's mark), it goes
/// on from the checkpoint's rows, which are returned too (the header left out).
pub(super) fn open(
    log: Log,
    rank: usize,
    checkpoints: Option<&Path>,
    metrics: Option<&Path>,
    resumed: Option<(&Path, &RowsMark)>,
) -> Result<(StepRows, String), RunError> {
    let path = match (checkpoints, metrics) {
        (Some(dir), _) => Some(log.beside_checkpoints(dir, rank)),
        (None, Some(dir)) => Some(log.in_metrics(dir, rank)),
        (None, None) => None,
    };
    let (rows, prefix) = match (resumed, path) {
        (Some((dir, mark)), path) => {
            StepRows::resume(&log.beside_checkpoints(dir, rank), mark, path.as_deref())?
        }
        (None, Some(path)) => (StepRows::create(&path, log.header())?, Vec::new()),
        (None, None) => (StepRows::default(), Vec::new()),
    };
    let text = String::from_utf8_lossy(&prefix);
    let rows_only = text.split_once('\n').map_or("", |(_, rest)| rest);
    Ok((rows, rows_only.to_string()))
}

/// The open rows file.
struct Sink {
    path: PathBuf,
    file: BufWriter<File>,
    bytes: u64,
    digest: Sha256,
}

/// A worker's per-step rows: appended to a file, or dropped when there is none.
#[derive(Default)]
pub(super) struct StepRows {
    sink: Option<Sink>,
}

fn failed<'a>(path: &'a Path, what: &'a str) -> impl FnOnce(std::io::Error) -> RunError + 'a {
    move |e| RunError::Local(format!("{what} {}: {e}", path.display()))
}

/// Creates (or empties) the file at `path`, and the folders above it: a job's first rows come
/// before its first checkpoint creates the checkpoint folder.
fn create_file(path: &Path) -> Result<File, RunError> {
    if let Some(parent) = path.parent().filter(|p| !p.as_os_str().is_empty()) {
        std::fs::create_dir_all(parent).map_err(failed(parent, "creating"))?;
    }
    File::create(path).map_err(failed(path, "creating"))
}

impl StepRows {
    /// A new rows file at `path`, holding `header`.
    pub(super) fn create(path: &Path, header: &str) -> Result<Self, RunError> {
        let file = create_file(path)?;
        let mut rows = Self::open(path, file, Vec::new())?;
        rows.push(header)?;
        Ok(rows)
    }

    fn open(path: &Path, file: File, prefix: Vec<u8>) -> Result<Self, RunError> {
        let mut sink = Sink {
            path: path.to_path_buf(),
            file: BufWriter::new(file),
            bytes: prefix.len() as u64,
            digest: Sha256::new(),
        };
        sink.digest.update(&prefix);
        Ok(Self { sink: Some(sink) })
    }

    /// Goes on from the rows file `from` as a checkpoint left it (`mark`), appending into
    /// `path` (`from` itself cut back to the mark, or a new file starting with its rows);
    /// also returns the bytes the mark covers. Refuses a file shorter than the mark or
    /// whose bytes differ.
    pub(super) fn resume(
        from: &Path,
        mark: &RowsMark,
        path: Option<&Path>,
    ) -> Result<(Self, Vec<u8>), RunError> {
        let prefix = read_prefix(from, mark)?;
        let Some(path) = path else {
            return Ok((Self::default(), prefix));
        };
        let same = matches!(
            (std::fs::canonicalize(from), std::fs::canonicalize(path)),
            (Ok(a), Ok(b)) if a == b
        );
        let file = if same {
            let mut file = std::fs::OpenOptions::new()
                .write(true)
                .open(path)
                .map_err(failed(path, "opening"))?;
            file.set_len(mark.bytes)
                .and_then(|()| file.seek(SeekFrom::End(0)).map(drop))
                .map_err(failed(path, "cutting back"))?;
            file
        } else {
            let mut file = create_file(path)?;
            file.write_all(&prefix).map_err(failed(path, "writing"))?;
            file
        };
        let rows = Self::open(path, file, prefix.clone())?;
        Ok((rows, prefix))
    }

    /// Appends `row` (a whole line).
    pub(super) fn push(&mut self, row: &str) -> Result<(), RunError> {
        let Some(sink) = &mut self.sink else {
            return Ok(());
        };
        sink.file
            .write_all(row.as_bytes())
            .map_err(failed(&sink.path, "writing"))?;
        sink.bytes += row.len() as u64;
        sink.digest.update(row.as_bytes());
        Ok(())
    }

    /// Makes every row so far durable and returns how far they go (`None`: no file).
    pub(super) fn mark(&mut self) -> Result<Option<RowsMark>, RunError> {
        let Some(sink) = &mut self.sink else {
            return Ok(None);
        };
        sink.file
            .flush()
            .and_then(|()| sink.file.get_ref().sync_data())
            .map_err(failed(&sink.path, "syncing"))?;
        Ok(Some(RowsMark {
            bytes: sink.bytes,
            sha256: hex::encode(sink.digest.clone().finalize()),
        }))
    }

    /// Flushes the rows and, when `dest` is another file, copies them there.
    pub(super) fn finish(&mut self, dest: Option<&Path>) -> Result<(), RunError> {
        let Some(sink) = &mut self.sink else {
            return Ok(());
        };
        sink.file.flush().map_err(failed(&sink.path, "writing"))?;
        let Some(dest) = dest.filter(|d| *d != sink.path) else {
            return Ok(());
        };
        std::fs::copy(&sink.path, dest)
            .map(drop)
            .map_err(failed(dest, "copying the step rows to"))
    }
}

/// The first `mark.bytes` bytes of `path`, checked against the mark.
fn read_prefix(path: &Path, mark: &RowsMark) -> Result<Vec<u8>, RunError> {
    let mut prefix = Vec::new();
    File::open(path)
        .and_then(|f| f.take(mark.bytes).read_to_end(&mut prefix))
        .map_err(failed(path, "reading the step rows of the checkpoint from"))?;
    if prefix.len() as u64 != mark.bytes || hex::encode(Sha256::digest(&prefix)) != mark.sha256 {
        return Err(RunError::Local(format!(
            "{}: the step rows the checkpoint covers ({} bytes) are missing or changed",
            path.display(),
            mark.bytes
        )));
    }
    Ok(prefix)
}

/// The `step_s` column of every row of `rows` (rows of `steps-rank<R>.csv`, no header).
pub(super) fn step_seconds(rows: &str) -> Vec<f64> {
    (rows.lines())
        .filter_map(|line| line.split(',').nth(2)?.parse().ok())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(step: u64) -> String {
        format!("{step},0.1,0.{step},1,0,0,0,0,0,0,0\n")
    }

    #[test]
    fn a_resumed_file_is_cut_back_to_the_mark_and_goes_on() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("rows.csv");
        let mut rows = StepRows::create(&path, HEADER).unwrap();
        rows.push(&row(1)).unwrap();
        rows.push(&row(2)).unwrap();
        let mark = rows.mark().unwrap().unwrap();
        rows.push(&row(3)).unwrap(); // after the checkpoint: dropped on resume
        rows.finish(None).unwrap();
        let (mut resumed, prefix) = StepRows::resume(&path, &mark, Some(&path)).unwrap();
        let text = String::from_utf8(prefix).unwrap();
        assert_eq!(
            step_seconds(text.split_once('\n').unwrap().1),
            vec![0.1, 0.2]
        );
        resumed.push(&row(3)).unwrap();
        let copy = dir.path().join("steps.csv");
        resumed.finish(Some(&copy)).unwrap();
        let want = format!("{HEADER}{}{}{}", row(1), row(2), row(3));
        assert_eq!(std::fs::read_to_string(&path).unwrap(), want);
        assert_eq!(std::fs::read_to_string(&copy).unwrap(), want);
    }

    #[test]
    fn the_rows_file_creates_the_folder_it_lives_in() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("checkpoints/not-yet").join("rows.csv");
        let mut rows = StepRows::create(&path, HEADER).unwrap();
        rows.push(&row(1)).unwrap();
        rows.finish(None).unwrap();
        let want = format!("{HEADER}{}", row(1));
        assert_eq!(std::fs::read_to_string(&path).unwrap(), want);
    }

    #[test]
    fn rows_changed_under_the_mark_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("rows.csv");
        let mut rows = StepRows::create(&path, HEADER).unwrap();
        rows.push(&row(1)).unwrap();
        let mark = rows.mark().unwrap().unwrap();
        let other = dir.path().join("elsewhere.csv");
        assert!(StepRows::resume(&path, &mark, Some(&other)).is_ok());
        std::fs::write(&path, HEADER.replace("step,", "stop,")).unwrap();
        let err = StepRows::resume(&path, &mark, None).err().unwrap();
        assert!(err.to_string().contains("missing or changed"), "{err}");
    }
}
