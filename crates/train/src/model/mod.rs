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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn profile_files_resolve_with_one_key_per_tensor() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("tiny.graph.txt");
        let text = "# batch_size: 8\n\
            a -- Conv -- forward_compute_time=1, backward_compute_time=2, parameter_size=40, \
            parameter_tensors=8;2\n\
            b -- ReLU -- forward_compute_time=1, backward_compute_time=1, parameter_size=0\n\
            c -- Linear -- forward_compute_time=1, backward_compute_time=1, parameter_size=12\n";
        std::fs::write(&path, text).unwrap();
        let model = format!("{PROFILE_PREFIX}{}", path.display());
        let profile = load_profile(&model).unwrap();
        assert_eq!(
            (profile.name.as_str(), profile.batch_size),
            ("tiny", Some(8))
        );
        let spec = profile_model(&model, 1.0).unwrap();
        let keys: Vec<(String, usize)> = (spec.keys().into_iter())
            .map(|k| (k.name, k.numel))
            .collect();
        let want = [("a.params0", 8), ("a.params1", 2), ("c.params", 3)];
        assert_eq!(keys, want.map(|(n, s)| (n.to_string(), s)));

        let missing = dir.path().join("gone.txt");
        let e = load_profile(&format!("profile:{}", missing.display())).unwrap_err();
        assert!(e.to_string().contains("cannot read profile file"), "{e}");
        let e = load_profile("profile:lenet").unwrap_err().to_string();
        assert!(e.contains("not a built-in (resnet50"), "{e}");
        std::fs::write(&path, text.replace("8;2", "8;3")).unwrap();
        let e = load_profile(&model).unwrap_err().to_string();
        assert!(
            e.contains("tiny.graph.txt: line 2: parameter_tensors"),
            "{e}"
        );
    }
}
