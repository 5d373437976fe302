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

/// Resolves `profile:NAME` (a built-in profile) or `profile:FILE` (a PipeDream-format
/// graph file), with every tensor divided by `scale` (1 keeps the full size).
pub fn profile_model(model: &str, scale: f64) -> Result<ModelSpec> {
    let what = model.strip_prefix(PROFILE_PREFIX).unwrap_or(model);
    let profile = if ModelProfile::builtin_names().contains(&what) {
        ModelProfile::builtin(what)
    } else if std::path::Path::new(what).is_file() {
        let text = std::fs::read_to_string(what).map_err(|source| TrainError::Io {
            path: what.into(),
            source,
        })?;
        let name = std::path::Path::new(what)
            .file_stem()
            .map_or_else(|| what.to_string(), |s| s.to_string_lossy().into_owned());
        ModelProfile::parse(&name, &text)
    } else {
        return Err(TrainError::Model(format!(
            "unknown profile '{what}': not a built-in ({}) and not a file",
            ModelProfile::builtin_names().join(", ")
        )));
    };
    let profile = profile
        .and_then(|p| p.scaled(scale))
        .map_err(|e| TrainError::Model(format!("profile {what}: {e}")))?;
    Ok(ModelSpec::from_profile(&profile))
}
