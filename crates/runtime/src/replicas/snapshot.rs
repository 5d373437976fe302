//! The snapshot files: one worker's weights at one evaluation point, every key in key order
//! as flat little-endian f32 (`step-000050-rank1.f32`), plus rank 0's buffers (batch-norm
//! running statistics) in the order of [`LayerwiseEngine::buffers`]
//! (`step-000050-rank0.buffers.f32`). Written atomically: a temporary file renamed into
//! place.

use std::path::{Path, PathBuf};

use syncopate_train::engine::LayerwiseEngine;

use super::ReplicaError;

/// The snapshot of worker `rank`'s weights after `step` steps.
pub fn snapshot_file(dir: &Path, step: u64, rank: usize) -> PathBuf {
    dir.join(format!("step-{step:06}-rank{rank}.f32"))
}

/// Rank 0's buffers after `step` steps.
pub fn buffers_file(dir: &Path, step: u64) -> PathBuf {
    dir.join(format!("step-{step:06}-rank0.buffers.f32"))
}

/// The step and rank of a weight snapshot's file name, `None` for any other name.
pub(super) fn parse_name(name: &str) -> Option<(u64, usize)> {
    let rest = name.strip_prefix("step-")?.strip_suffix(".f32")?;
    let (step, rank) = rest.split_once("-rank")?;
    Some((step.parse().ok()?, rank.parse().ok()?))
}

/// Writes `engine`'s weights after `step` steps as worker `rank`'s snapshot in `dir`
/// (created if needed); rank 0 also writes its buffers.
pub fn write_snapshot(
    engine: &dyn LayerwiseEngine,
    dir: &Path,
    step: u64,
    rank: usize,
) -> Result<(), ReplicaError> {
    std::fs::create_dir_all(dir).map_err(|e| ReplicaError::io(dir, e))?;
    let mut bytes = Vec::new();
    for key in 0..engine.spec().keys().len() {
        append_le(&mut bytes, &engine.param(key)?);
    }
    write_atomic(&snapshot_file(dir, step, rank), &bytes)?;
    if rank == 0 {
        let mut bytes = Vec::new();
        for (_, values) in engine.buffers()? {
            append_le(&mut bytes, &values);
        }
        write_atomic(&buffers_file(dir, step), &bytes)?;
    }
    Ok(())
}

fn append_le(out: &mut Vec<u8>, values: &[f32]) {
    out.reserve(values.len() * 4);
    for v in values {
        out.extend_from_slice(&v.to_le_bytes());
    }
}

/// Writes `bytes` to a temporary file beside `path`, then renames it into place.
pub fn write_atomic(path: &Path, bytes: &[u8]) -> Result<(), ReplicaError> {
    let mut tmp = path.as_os_str().to_owned();
    tmp.push(".tmp");
    let tmp = PathBuf::from(tmp);
    std::fs::write(&tmp, bytes).map_err(|e| ReplicaError::io(&tmp, e))?;
    std::fs::rename(&tmp, path).map_err(|e| ReplicaError::io(path, e))
}

/// Reads the `values` f32 values of the snapshot at `path`; a missing file, or one of
/// another length (truncated, or of another model), is an error naming it.
pub fn read_values(path: &Path, values: usize) -> Result<Vec<f32>, ReplicaError> {
    let bytes = std::fs::read(path).map_err(|e| match e.kind() {
        std::io::ErrorKind::NotFound => ReplicaError::Missing(path.to_path_buf()),
        _ => ReplicaError::io(path, e),
    })?;
    let expected = values as u64 * 4;
    if bytes.len() as u64 != expected {
        return Err(ReplicaError::Size {
            path: path.to_path_buf(),
            found: bytes.len() as u64,
            expected,
        });
    }
    Ok(bytes
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect())
}

/// The evaluation steps that have a weight snapshot in `dir`, in order.
pub fn snapshot_steps(dir: &Path) -> Result<Vec<u64>, ReplicaError> {
    let entries = std::fs::read_dir(dir).map_err(|e| ReplicaError::io(dir, e))?;
    let mut steps = Vec::new();
    for entry in entries {
        let entry = entry.map_err(|e| ReplicaError::io(dir, e))?;
        if let Some((step, _)) = entry.file_name().to_str().and_then(parse_name) {
            steps.push(step);
        }
    }
    steps.sort_unstable();
    steps.dedup();
    Ok(steps)
}

/// Removes every snapshot file (weights, buffers, unfinished temporaries) left in `dir` by
/// an earlier job, so that only this job's are read; anything else stays.
pub fn clear_snapshots(dir: &Path) -> Result<(), ReplicaError> {
    let entries = match std::fs::read_dir(dir) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        other => other.map_err(|e| ReplicaError::io(dir, e))?,
    };
    for entry in entries {
        let entry = entry.map_err(|e| ReplicaError::io(dir, e))?;
        let name = entry.file_name();
        let Some(name) = name.to_str() else { continue };
        let base = name.strip_suffix(".tmp").unwrap_or(name);
        let base = base.replace(".buffers.f32", ".f32");
        if parse_name(&base).is_some() {
            std::fs::remove_file(entry.path()).map_err(|e| ReplicaError::io(&entry.path(), e))?;
        }
    }
    Ok(())
}

/// Removes the snapshots of `steps` for ranks `0..workers` (and rank 0's buffers), then
/// `dir` itself if nothing else is left in it.
pub fn remove_snapshots(dir: &Path, steps: &[u64], workers: usize) -> Result<(), ReplicaError> {
    for &step in steps {
        let files = (0..workers)
            .map(|rank| snapshot_file(dir, step, rank))
            .chain([buffers_file(dir, step)]);
        for path in files {
            match std::fs::remove_file(&path) {
                Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                    return Err(ReplicaError::io(&path, e))
                }
                _ => {}
            }
        }
    }
    // A folder that still holds something (the user's files) stays.
    let _ = std::fs::remove_dir(dir);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip() {
        let dir = Path::new("/x");
        let name = snapshot_file(dir, 50, 3);
        let name = name.file_name().and_then(|n| n.to_str()).unwrap();
        assert_eq!(name, "step-000050-rank3.f32");
        assert_eq!(parse_name(name), Some((50, 3)));
        assert_eq!(parse_name("step-000050-rank0.buffers.f32"), None);
        assert_eq!(parse_name("step-000050-rank0.f32.tmp"), None);
    }

    #[test]
    fn clearing_removes_snapshots_only() {
        let dir = tempfile::tempdir().unwrap();
        let names = [
            "step-000001-rank0.f32",
            "step-000001-rank0.buffers.f32",
            "step-000002-rank1.f32.tmp",
            "notes.txt",
        ];
        for name in names {
            std::fs::write(dir.path().join(name), b"x").unwrap();
        }
        clear_snapshots(dir.path()).unwrap();
        clear_snapshots(&dir.path().join("absent")).unwrap();
        let left: Vec<_> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(left, ["notes.txt"]);
    }

    #[test]
    fn a_truncated_snapshot_is_an_error_naming_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = snapshot_file(dir.path(), 7, 1);
        std::fs::write(&path, [0u8; 10]).unwrap();
        let err = read_values(&path, 4).unwrap_err().to_string();
        assert!(err.contains(&path.display().to_string()), "{err}");
        assert!(err.contains("10 bytes") && err.contains("16"), "{err}");
        let missing = snapshot_file(dir.path(), 7, 2);
        let err = read_values(&missing, 4).unwrap_err().to_string();
        assert!(err.contains(&missing.display().to_string()), "{err}");
        assert!(err.contains("missing"), "{err}");
    }
}
