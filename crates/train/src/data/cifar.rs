//! CIFAR-10 binary batches: records of one label byte and 3x32x32 channel-major pixels.

use std::path::Path;

use super::Split;
use crate::error::{Result, TrainError};

const RECORD: usize = 1 + 3 * 32 * 32;
const TRAIN_FILES: [&str; 5] = [
    "data_batch_1.bin",
    "data_batch_2.bin",
    "data_batch_3.bin",
    "data_batch_4.bin",
    "data_batch_5.bin",
];

/// Loads the five training batches and the test batch from `dir` (or its
/// `cifar-10-batches-bin` sub-directory, as the archive unpacks).
pub fn load_cifar10(dir: &Path, mean: f32, std: f32) -> Result<(Split, Split)> {
    let nested = dir.join("cifar-10-batches-bin");
    let dir = if nested.is_dir() {
        nested.as_path()
    } else {
        dir
    };
    let mut train = empty();
    for name in TRAIN_FILES {
        append(&mut train, &dir.join(name), mean, std)?;
    }
    let mut test = empty();
    append(&mut test, &dir.join("test_batch.bin"), mean, std)?;
    Ok((train, test))
}

fn empty() -> Split {
    Split {
        images: Vec::new(),
        labels: Vec::new(),
        shape: [3, 32, 32],
    }
}

/// Parses one batch file into `split`; exposed to the tests through `load_cifar10`.
fn append(split: &mut Split, path: &Path, mean: f32, std: f32) -> Result<()> {
    let bytes = std::fs::read(path).map_err(|source| TrainError::Io {
        path: path.to_path_buf(),
        source,
    })?;
    if bytes.is_empty() || bytes.len() % RECORD != 0 {
        return Err(TrainError::BadData {
            path: path.to_path_buf(),
            reason: format!(
                "{} bytes is not a whole number of {RECORD}-byte CIFAR-10 records (truncated?)",
                bytes.len()
            ),
        });
    }
    let scale = 1.0 / (255.0 * std);
    let offset = mean / std;
    for record in bytes.chunks_exact(RECORD) {
        split.labels.push(record[0]);
        split
            .images
            .extend(record[1..].iter().map(|&p| f32::from(p) * scale - offset));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write_batches(dir: &Path, records: usize, truncate_last: bool) {
        let mut rec = vec![3u8];
        rec.extend(std::iter::repeat_n(128u8, RECORD - 1));
        let data: Vec<u8> = rec.iter().copied().cycle().take(RECORD * records).collect();
        for name in TRAIN_FILES {
            std::fs::write(dir.join(name), &data).unwrap();
        }
        let mut test = data.clone();
        if truncate_last {
            test.pop();
        }
        std::fs::write(dir.join("test_batch.bin"), test).unwrap();
    }

    #[test]
    fn loads_all_batches() {
        let dir = tempfile::tempdir().unwrap();
        write_batches(dir.path(), 2, false);
        let (train, test) = load_cifar10(dir.path(), 0.0, 1.0).unwrap();
        assert_eq!(train.len(), 10);
        assert_eq!(test.len(), 2);
        assert_eq!(train.images.len(), 10 * 3072);
        assert_eq!(test.labels, vec![3, 3]);
    }

    #[test]
    fn truncated_batch_is_a_clear_error() {
        let dir = tempfile::tempdir().unwrap();
        write_batches(dir.path(), 2, true);
        let err = load_cifar10(dir.path(), 0.0, 1.0).unwrap_err().to_string();
        assert!(
            err.contains("test_batch.bin") && err.contains("truncated"),
            "{err}"
        );
    }

    #[test]
    fn missing_batch_names_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let err = load_cifar10(dir.path(), 0.0, 1.0).unwrap_err().to_string();
        assert!(err.contains("data_batch_1.bin"), "{err}");
    }
}
