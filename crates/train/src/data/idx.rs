//! IDX files (MNIST, Fashion-MNIST), gzip-compressed or raw.

use std::io::Read;
use std::path::{Path, PathBuf};

use flate2::read::GzDecoder;

use super::Split;
use crate::error::{Result, TrainError};

const IMAGES_MAGIC: u32 = 0x0000_0803;
const LABELS_MAGIC: u32 = 0x0000_0801;

/// Loads `{prefix}-images-idx3-ubyte[.gz]` and `{prefix}-labels-idx1-ubyte[.gz]` from `dir`,
/// scaling pixels to [0, 1] and normalising with `mean`/`std`.
pub fn load_idx_pair(dir: &Path, prefix: &str, mean: f32, std: f32) -> Result<Split> {
    let images_path = find(dir, &format!("{prefix}-images-idx3-ubyte"))?;
    let labels_path = find(dir, &format!("{prefix}-labels-idx1-ubyte"))?;
    let images = read_maybe_gz(&images_path)?;
    let labels = read_maybe_gz(&labels_path)?;
    let (dims, pixels) = parse(&images_path, &images, IMAGES_MAGIC, 3)?;
    let (label_dims, label_bytes) = parse(&labels_path, &labels, LABELS_MAGIC, 1)?;
    if dims[0] != label_dims[0] {
        return Err(TrainError::BadData {
            path: labels_path,
            reason: format!(
                "{} labels for {} images in {}",
                label_dims[0],
                dims[0],
                images_path.display()
            ),
        });
    }
    let scale = 1.0 / (255.0 * std);
    let offset = mean / std;
    Ok(Split {
        images: pixels
            .iter()
            .map(|&p| f32::from(p) * scale - offset)
            .collect(),
        labels: label_bytes.to_vec(),
        shape: [1, dims[1], dims[2]],
    })
}

fn find(dir: &Path, stem: &str) -> Result<PathBuf> {
    // Both the original names and the `.`-for-`-` variant some mirrors use.
    let alt = stem.replacen("-idx", ".idx", 1);
    for name in [stem.to_string(), alt] {
        for candidate in [dir.join(format!("{name}.gz")), dir.join(&name)] {
            if candidate.is_file() {
                return Ok(candidate);
            }
        }
    }
    Err(TrainError::DatasetNotFound {
        dataset: stem.into(),
        looked_for: format!("{0}/{stem}.gz, {0}/{stem}", dir.display()),
        hint: "The directory must hold the four IDX files of the dataset.".into(),
    })
}

fn read_maybe_gz(path: &Path) -> Result<Vec<u8>> {
    let io = |source| TrainError::Io {
        path: path.to_path_buf(),
        source,
    };
    let raw = std::fs::read(path).map_err(io)?;
    if raw.starts_with(&[0x1f, 0x8b]) {
        let mut out = Vec::with_capacity(raw.len() * 4);
        GzDecoder::new(&raw[..])
            .read_to_end(&mut out)
            .map_err(|e| TrainError::BadData {
                path: path.to_path_buf(),
                reason: format!("corrupt or truncated gzip stream: {e}"),
            })?;
        Ok(out)
    } else {
        Ok(raw)
    }
}

/// Checks the header and returns the dimensions and the payload of exactly the stated size.
fn parse<'a>(
    path: &Path,
    bytes: &'a [u8],
    magic: u32,
    rank: usize,
) -> Result<(Vec<usize>, &'a [u8])> {
    let bad = |reason: String| TrainError::BadData {
        path: path.to_path_buf(),
        reason,
    };
    let header_len = 4 + 4 * rank;
    if bytes.len() < header_len {
        return Err(bad(format!(
            "file is {} bytes, shorter than the {header_len}-byte IDX header",
            bytes.len()
        )));
    }
    let word = |i: usize| u32::from_be_bytes([bytes[i], bytes[i + 1], bytes[i + 2], bytes[i + 3]]);
    let found = word(0);
    if found != magic {
        return Err(bad(format!(
            "magic number {found:#010x}, expected {magic:#010x} (is this the right IDX file?)"
        )));
    }
    let dims: Vec<usize> = (0..rank).map(|d| word(4 + 4 * d) as usize).collect();
    let expected = dims
        .iter()
        .try_fold(1usize, |acc, &d| acc.checked_mul(d))
        .ok_or_else(|| bad("dimensions overflow".into()))?;
    let payload = &bytes[header_len..];
    if payload.len() < expected {
        return Err(bad(format!(
            "truncated: header announces {dims:?} = {expected} bytes, file holds {}",
            payload.len()
        )));
    }
    if payload.len() > expected {
        return Err(bad(format!(
            "{} trailing bytes after the {expected} announced by the header",
            payload.len() - expected
        )));
    }
    Ok((dims, payload))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    fn idx_images(n: u32, h: u32, w: u32, fill: u8) -> Vec<u8> {
        let mut v = Vec::new();
        v.extend_from_slice(&IMAGES_MAGIC.to_be_bytes());
        for d in [n, h, w] {
            v.extend_from_slice(&d.to_be_bytes());
        }
        v.extend(std::iter::repeat_n(fill, (n * h * w) as usize));
        v
    }

    fn idx_labels(n: u32) -> Vec<u8> {
        let mut v = Vec::new();
        v.extend_from_slice(&LABELS_MAGIC.to_be_bytes());
        v.extend_from_slice(&n.to_be_bytes());
        v.extend((0..n).map(|i| (i % 10) as u8));
        v
    }

    fn gz(bytes: &[u8]) -> Vec<u8> {
        let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
        e.write_all(bytes).unwrap();
        e.finish().unwrap()
    }

    #[test]
    fn loads_raw_and_gzip() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(
            dir.path().join("train-images-idx3-ubyte.gz"),
            gz(&idx_images(5, 4, 3, 255)),
        )
        .unwrap();
        std::fs::write(dir.path().join("train-labels-idx1-ubyte"), idx_labels(5)).unwrap();
        let s = load_idx_pair(dir.path(), "train", 0.0, 1.0).unwrap();
        assert_eq!(s.len(), 5);
        assert_eq!(s.shape, [1, 4, 3]);
        assert!(s.images.iter().all(|&x| (x - 1.0).abs() < 1e-6));
        assert_eq!(s.labels, vec![0, 1, 2, 3, 4]);
    }

    /// Writes the images (a file named `images_file`) and the labels of the train split into
    /// `dir`, and returns the error loading them gives.
    fn pair_error(dir: &Path, images_file: &str, images: &[u8], labels: &[u8]) -> String {
        std::fs::write(dir.join(images_file), images).unwrap();
        std::fs::write(dir.join("train-labels-idx1-ubyte"), labels).unwrap();
        load_idx_pair(dir, "train", 0.0, 1.0)
            .unwrap_err()
            .to_string()
    }

    #[test]
    fn truncated_images_are_a_clear_error() {
        let dir = tempfile::tempdir().unwrap();
        let mut img = idx_images(5, 4, 3, 1);
        img.truncate(img.len() - 7);
        let err = pair_error(dir.path(), "train-images-idx3-ubyte", &img, &idx_labels(5));
        assert!(err.contains("truncated"), "{err}");
    }

    #[test]
    fn truncated_gzip_is_a_clear_error() {
        let dir = tempfile::tempdir().unwrap();
        let mut img = gz(&idx_images(50, 28, 28, 7));
        img.truncate(img.len() / 2);
        let err = pair_error(
            dir.path(),
            "train-images-idx3-ubyte.gz",
            &img,
            &idx_labels(50),
        );
        assert!(err.contains("gzip"), "{err}");
    }

    #[test]
    fn mismatched_counts_and_magic_are_clear_errors() {
        let dir = tempfile::tempdir().unwrap();
        let images = idx_images(5, 2, 2, 0);
        let err =
            |labels: &[u8]| pair_error(dir.path(), "train-images-idx3-ubyte", &images, labels);
        let e = err(&idx_labels(4));
        assert!(e.contains("4 labels for 5 images"), "{e}");
        let e = err(&idx_images(5, 2, 2, 0));
        assert!(e.contains("magic"), "{e}");
        let e = err(&[0u8, 0]);
        assert!(e.contains("shorter"), "{e}");
    }

    #[test]
    fn missing_files_name_the_paths() {
        let dir = tempfile::tempdir().unwrap();
        let err = load_idx_pair(dir.path(), "t10k", 0.0, 1.0)
            .unwrap_err()
            .to_string();
        assert!(err.contains("t10k-images-idx3-ubyte"), "{err}");
    }
}
