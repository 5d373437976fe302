//! Weights saved and loaded as safetensors: one tensor per key (named `layer.param`, with
//! its logical shape) and one per buffer, plus the model name and fingerprint as metadata.

use std::collections::{BTreeMap, HashMap};
use std::path::Path;

use safetensors::tensor::{Dtype, SafeTensors, TensorView};

use crate::engine::LayerwiseEngine;
use crate::error::{Result, TrainError};
use crate::model::ModelSpec;

fn le_bytes(values: &[f32]) -> Vec<u8> {
    values.iter().flat_map(|v| v.to_le_bytes()).collect()
}

/// One named `f32` tensor of a checkpoint file.
#[derive(Debug, Clone, PartialEq)]
pub struct NamedTensor {
    /// Its name in the file.
    pub name: String,
    /// Its logical shape.
    pub shape: Vec<usize>,
    /// Its values, row-major.
    pub values: Vec<f32>,
}

/// Every parameter (named `layer.param`) and buffer of `engine`, in key order.
pub fn engine_tensors(engine: &dyn LayerwiseEngine) -> Result<Vec<NamedTensor>> {
    let mut named = Vec::new();
    for k in engine.spec().keys() {
        let values = engine.param(k.key)?.to_vec();
        named.push(NamedTensor {
            name: k.name,
            shape: k.shape,
            values,
        });
    }
    for (name, values) in engine.buffers()? {
        let shape = vec![values.len()];
        named.push(NamedTensor {
            name,
            shape,
            values,
        });
    }
    Ok(named)
}

/// `tensors` as the bytes of a safetensors file whose metadata holds `metadata` and the
/// model's name and fingerprint; `path` only names the file in errors. The same tensors and
/// metadata always give the same bytes (the metadata is one entry, `syncopate`, whose
/// `key=value` pairs are sorted: safetensors writes a map's entries in random order).
pub fn encode(
    spec: &ModelSpec,
    tensors: &[NamedTensor],
    metadata: BTreeMap<String, String>,
    path: &Path,
) -> Result<Vec<u8>> {
    let err = |reason: String| TrainError::Checkpoint {
        path: path.to_path_buf(),
        reason,
    };
    let bytes: Vec<Vec<u8>> = tensors.iter().map(|t| le_bytes(&t.values)).collect();
    let views = tensors
        .iter()
        .zip(&bytes)
        .map(|(t, b)| {
            TensorView::new(Dtype::F32, t.shape.clone(), b)
                .map(|v| (t.name.clone(), v))
                .map_err(|e| err(format!("tensor {}: {e}", t.name)))
        })
        .collect::<Result<Vec<_>>>()?;
    let mut metadata = metadata;
    metadata.insert("model".to_string(), spec.name.clone());
    metadata.insert(
        "fingerprint".to_string(),
        format!("{:016x}", spec.fingerprint()),
    );
    let line = metadata
        .iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect::<Vec<_>>()
        .join(" ");
    let metadata = HashMap::from([("syncopate".to_string(), line)]);
    safetensors::serialize(views, &Some(metadata)).map_err(|e| err(e.to_string()))
}

/// Writes every parameter and buffer of `engine` to `path`, atomically and durably (see
/// [`write_durably`]): an interrupted save, or a crash after it, never leaves a truncated
/// or lost file.
pub fn save(engine: &dyn LayerwiseEngine, path: &Path) -> Result<()> {
    let bytes = encode(
        engine.spec(),
        &engine_tensors(engine)?,
        BTreeMap::new(),
        path,
    )?;
    let io = |source| TrainError::Io {
        path: path.to_path_buf(),
        source,
    };
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).map_err(io)?;
    }
    write_durably(path, &bytes).map_err(io)
}

/// Writes `bytes` to `path` atomically and durably: into `path` with `.tmp` appended to
/// its extension, fsynced, renamed over `path`, and the folder fsynced, so that after a
/// crash `path` holds either its old contents or all of `bytes`.
pub fn write_durably(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    use std::io::Write as _;
    let mut tmp_name = path.file_name().unwrap_or_default().to_os_string();
    tmp_name.push(".tmp");
    let tmp = path.with_file_name(tmp_name);
    let mut file = std::fs::File::create(&tmp)?;
    file.write_all(bytes)?;
    file.sync_all()?;
    std::fs::rename(&tmp, path)?;
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    std::fs::File::open(dir)?.sync_all()
}

/// A checkpoint file read into memory: its tensors by name and its metadata.
pub struct Decoded<'a> {
    st: SafeTensors<'a>,
    path: &'a Path,
}

impl<'a> Decoded<'a> {
    /// Parses the bytes of the safetensors file at `path`.
    pub fn parse(bytes: &'a [u8], path: &'a Path) -> Result<Self> {
        Ok(Self {
            st: parse(bytes, path)?,
            path,
        })
    }

    /// The tensor `name`, which must be `F32` of `shape`.
    pub fn tensor(&self, name: &str, shape: &[usize]) -> Result<Vec<f32>> {
        read_tensor(&self.st, self.path, name, shape)
    }

    /// Loads every parameter and buffer of `engine` (see [`load`]).
    pub fn load_into(&self, engine: &mut dyn LayerwiseEngine) -> Result<()> {
        let spec = engine.spec().clone();
        for k in spec.keys() {
            let values = self.tensor(&k.name, &k.shape)?;
            engine.set_param(k.key, values)?;
        }
        for (name, current) in engine.buffers()? {
            let values = self.tensor(&name, &[current.len()])?;
            engine.set_buffer(&name, values)?;
        }
        Ok(())
    }
}

/// Reads every key of `spec` from the checkpoint at `path` (for processes, such as
/// parameter servers, that hold values without an engine).
pub fn load_values(spec: &ModelSpec, path: &Path) -> Result<Vec<Vec<f32>>> {
    let bytes = read_file(path)?;
    let st = parse(&bytes, path)?;
    spec.keys()
        .iter()
        .map(|k| read_tensor(&st, path, &k.name, &k.shape))
        .collect()
}

/// Loads `path` into `engine`, checking that every key and buffer is present with the right
/// shape (a checkpoint of another model is refused, naming the first mismatch).
pub fn load(engine: &mut dyn LayerwiseEngine, path: &Path) -> Result<()> {
    let bytes = read_file(path)?;
    Decoded::parse(&bytes, path)?.load_into(engine)
}

fn read_file(path: &Path) -> Result<Vec<u8>> {
    std::fs::read(path).map_err(|source| TrainError::Io {
        path: path.to_path_buf(),
        source,
    })
}

fn parse<'a>(bytes: &'a [u8], path: &Path) -> Result<SafeTensors<'a>> {
    SafeTensors::deserialize(bytes).map_err(|e| TrainError::Checkpoint {
        path: path.to_path_buf(),
        reason: format!("not a safetensors file: {e}"),
    })
}

fn read_tensor(st: &SafeTensors<'_>, path: &Path, name: &str, shape: &[usize]) -> Result<Vec<f32>> {
    let err = |reason: String| TrainError::Checkpoint {
        path: path.to_path_buf(),
        reason,
    };
    let t = st.tensor(name).map_err(|_| {
        err(format!(
            "has no tensor {name}; is it a checkpoint of this model?"
        ))
    })?;
    if t.dtype() != Dtype::F32 || t.shape() != shape {
        return Err(err(format!(
            "tensor {name} is {:?} {:?}, the model needs F32 {shape:?}",
            t.dtype(),
            t.shape()
        )));
    }
    Ok(t.data()
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect())
}
