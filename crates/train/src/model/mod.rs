//! Layer-wise model descriptions: an ordered list of layers, each owning named parameter
//! tensors, with keys numbered by position from the input.

mod spec;
mod zoo;

pub use spec::{Init, KeySpec, LayerOp, LayerSpec, ModelSpec, ParamSpec};
pub use zoo::{build, MODEL_NAMES};

use crate::error::{Result, TrainError};
use syncopate_core::profile::ModelProfile;

/// The prefix of models replayed from a compute profile: `profile:vgg19`,
/// `profile:path/to/graph.txt`.
pub const PROFILE_PREFIX: &str = "profile:";

/// Whether a `--model` value names a compute profile.
pub fn is_profile_name(model: &str) -> bool {
    model.starts_with(PROFILE_PREFIX)
}

/// The file extension of profile files (`resnet20.graph.txt`).
pub const PROFILE_EXTENSION: &str = ".txt";

/// Whether the part after `profile:` names a file rather than a built-in: it contains a
/// path separator, ends in [`PROFILE_EXTENSION`], or is an existing file.
fn names_profile_file(what: &str) -> bool {
    what.contains('/')
        || what.contains(std::path::MAIN_SEPARATOR)
        || what.ends_with(PROFILE_EXTENSION)
        || std::path::Path::new(what).is_file()
}

/// Resolves `profile:NAME` (a built-in profile) or `profile:FILE` (a file in the
/// `graph.txt` format, e.g. one written by the PyTorch profiler; its name is the file's, less
/// `.graph.txt`). Errors name the file and, for a malformed one, the line and what is wrong.
pub fn load_profile(model: &str) -> Result<ModelProfile> {
    let what = model.strip_prefix(PROFILE_PREFIX).unwrap_or(model);
    if ModelProfile::builtin_names().contains(&what) {
        return ModelProfile::builtin(what).map_err(|e| TrainError::Model(e.to_string()));
    }
    if !names_profile_file(what) {
        return Err(TrainError::Model(format!(
            "unknown profile '{what}': not a built-in ({}) and not a file",
            ModelProfile::builtin_names().join(", ")
        )));
    }
    let text = std::fs::read_to_string(what)
        .map_err(|e| TrainError::Model(format!("cannot read profile file {what}: {e}")))?;
    let file_name = std::path::Path::new(what)
        .file_name()
        .map_or_else(|| what.to_string(), |s| s.to_string_lossy().into_owned());
    let name = (file_name.strip_suffix(".graph.txt"))
        .or_else(|| file_name.strip_suffix(PROFILE_EXTENSION))
        .unwrap_or(&file_name);
    ModelProfile::parse(name, &text)
        .map_err(|e| TrainError::Model(format!("profile file {what}: {e}")))
}

/// Resolves `profile:NAME` or `profile:FILE` (see [`load_profile`]), with every tensor
/// divided by `scale` (1 keeps the full size).
pub fn profile_model(model: &str, scale: f64) -> Result<ModelSpec> {
    let profile = load_profile(model)?;
    let profile = (profile.scaled(scale))
        .map_err(|e| TrainError::Model(format!("profile {}: {e}", profile.name)))?;
    Ok(ModelSpec::from_profile(&profile))
}
