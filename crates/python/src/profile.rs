//! Compute profiles read by core's parser (`syncopate_core::profile`), for
//! `syncopate.profile_format`: one parser for Rust and Python alike.

use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList};
use syncopate_core::profile::ModelProfile;

pyo3::create_exception!(
    _native,
    ProfileError,
    pyo3::exceptions::PyValueError,
    "A profile's text is not in the format: `args` are (line, reason), line 0 for the whole text."
);

/// Parses a profile's `text` with core's parser: a dict with `name` (the `# model:` line's,
/// else `name`), `batch_size` (or None), `comments` (the free comment lines) and `layers`
/// in execution order, each a dict with `name`, `op`, `forward_ns`, `backward_ns` and
/// `tensors` (the sizes of its parameter tensors, empty for none). Raises `ProfileError`.
#[pyfunction]
#[pyo3(signature = (text, name = "profile"))]
pub fn parse_profile<'py>(py: Python<'py>, text: &str, name: &str) -> PyResult<Bound<'py, PyDict>> {
    let (profile, notes) = ModelProfile::parse_with_notes(name, text).map_err(|e| {
        let line = e.line().unwrap_or(0);
        let message = e.to_string();
        let prefix = format!("line {line}: ");
        let reason = message
            .strip_prefix(&prefix)
            .unwrap_or(&message)
            .to_string();
        ProfileError::new_err((line, reason))
    })?;
    let layers = PyList::empty(py);
    for l in &profile.layers {
        let layer = PyDict::new(py);
        layer.set_item("name", &l.name)?;
        layer.set_item("op", &l.op)?;
        layer.set_item("forward_ns", l.forward_ns)?;
        layer.set_item("backward_ns", l.backward_ns)?;
        layer.set_item("tensors", l.tensor_sizes())?;
        layers.append(layer)?;
    }
    let out = PyDict::new(py);
    out.set_item("name", notes.model.unwrap_or(profile.name))?;
    out.set_item("batch_size", profile.batch_size)?;
    out.set_item("comments", notes.comments)?;
    out.set_item("layers", layers)?;
    Ok(out)
}
