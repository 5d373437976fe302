//! Layer-wise models, datasets and the training engine of Syncopate.
//!
//! A model is an ordered list of layers ([`model::ModelSpec`]); each layer owns named
//! parameter tensors, numbered as *keys* from the input. The [`engine::LayerwiseEngine`]
//! trait is the only way the rest of Syncopate touches the tensor library (burn 0.22 on its
//! `flex` CPU backend): it runs forward layer by layer with a hook before each layer,
//! backward layer by layer with each layer's gradients handed out as soon as they exist, and
//! reads or replaces a parameter as a flat `f32` buffer.

pub mod checkpoint;
pub mod data;
pub mod engine;
pub mod error;
pub mod model;
pub mod profiling;
pub mod trainer;

pub use error::{Result, TrainError};
