//! Weights saved and loaded as safetensors: one tensor per key (named `layer.param`, with
//! its logical shape) and one per buffer, plus the model name and fingerprint as metadata.

use std::collections::HashMap;
use std::path::Path;

use safetensors::tensor::{Dtype, SafeTensors, TensorView};

use crate::engine::LayerwiseEngine;
use crate::error::{Result, TrainError};
use crate::model::ModelSpec;

fn le_bytes(values: &[f32]) -> Vec<u8> {
    values.iter().flat_map(|v| v.to_le_bytes()).collect()
}

/// Writes every parameter and buffer of `engine` to `path` (atomically: a temporary file
/// renamed into place, so an interrupted save never leaves a truncated checkpoint).
pub fn save(engine: &dyn LayerwiseEngine, path: &Path) -> Result<()> {
    let err = |reason: String| TrainError::Checkpoint {
        path: path.to_path_buf(),
        reason,
    };
    let spec = engine.spec();
    let mut named: Vec<(String, Vec<usize>, Vec<u8>)> = Vec::new();
    for k in spec.keys() {
        named.push((k.name, k.shape, le_bytes(&engine.param(k.key)?)));
    }
    for (name, values) in engine.buffers()? {
        named.push((name, vec![values.len()], le_bytes(&values)));
    }
    let views = named
        .iter()
        .map(|(name, shape, bytes)| {
            TensorView::new(Dtype::F32, shape.clone(), bytes)
                .map(|v| (name.clone(), v))
                .map_err(|e| err(format!("tensor {name}: {e}")))
        })
        .collect::<Result<Vec<_>>>()?;
    let metadata = HashMap::from([
        ("model".to_string(), spec.name.clone()),
        (
            "fingerprint".to_string(),
            format!("{:016x}", spec.fingerprint()),
        ),
    ]);
    let bytes = safetensors::serialize(views, &Some(metadata)).map_err(|e| err(e.to_string()))?;
    let tmp = path.with_extension("safetensors.tmp");
    let io = |source| TrainError::Io {
        path: path.to_path_buf(),
        source,
    };
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).map_err(io)?;
    }
    std::fs::write(&tmp, bytes).map_err(io)?;
    std::fs::rename(&tmp, path).map_err(io)?;
    Ok(())
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
    let st = parse(&bytes, path)?;
    let spec = engine.spec().clone();
    for k in spec.keys() {
        let values = read_tensor(&st, path, &k.name, &k.shape)?;
        engine.set_param(k.key, values)?;
    }
    for (name, current) in engine.buffers()? {
        let values = read_tensor(&st, path, &name, &[current.len()])?;
        engine.set_buffer(&name, values)?;
    }
    Ok(())
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
