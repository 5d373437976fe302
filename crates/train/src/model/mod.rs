//! Layer-wise model descriptions: an ordered list of layers, each owning named parameter
//! tensors, with keys numbered by position from the input.

mod spec;
mod zoo;

pub use spec::{Init, KeySpec, LayerOp, LayerSpec, ModelSpec, ParamSpec};
pub use zoo::{build, MODEL_NAMES};
