//! The layer-wise training engine: the one interface through which the rest of Syncopate
//! trains a model. Nothing outside this module names a tensor-library type.
//!
//! A step is driven layer by layer so that a distributed driver can interleave
//! communication: [`LayerwiseEngine::begin_forward`], then
//! [`LayerwiseEngine::forward_layer`] for each layer from the input (the driver may wait for
//! and install layer `k`'s fresh parameters just before), then
//! [`LayerwiseEngine::finish_forward`], then [`LayerwiseEngine::backward`], which hands each
//! layer's gradients to a callback as soon as they exist, last layer first.

mod batch_norm;
mod burn_engine;
pub mod conv_block;
mod flat;
mod gemm;
mod grid;
mod grid_conv;
mod pool;
mod profile_engine;
pub mod residual;
mod spare;

/// Runs `f` on a pool of `threads` threads (tests of thread-count independence).
#[cfg(test)]
fn on_threads<R: Send>(threads: usize, f: impl FnOnce() -> R + Send) -> R {
    let pool = rayon::ThreadPoolBuilder::new().num_threads(threads).build();
    pool.expect("a thread pool").install(f)
}

pub use burn_engine::BurnEngine;
pub use flat::{FlatView, LayerGrads};
pub use profile_engine::ProfileEngine;

use crate::data::Batch;
use crate::error::Result;
use crate::model::ModelSpec;

/// Loss and accuracy figures of one forward pass.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct StepOutput {
    /// Mean cross-entropy over the batch.
    pub loss: f32,
    /// Samples whose arg-max prediction equals the label.
    pub correct: usize,
    /// Samples in the batch.
    pub samples: usize,
}

/// How backward is computed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum BackwardMode {
    /// One graph per layer; each layer's input is a detached leaf, so layer `k`'s gradients
    /// are handed out as soon as its segment has run (what overlap needs).
    #[default]
    Segmented,
    /// One graph for the whole model, one backward call, and burn's kernels for every layer
    /// in training and evaluation: the reference the segmented mode (our own kernels) is
    /// checked against; gradients are handed out after it, last layer first.
    Whole,
}

/// What [`LayerwiseEngine::backward`] calls after each layer: the layer, its parameters'
/// gradients, and the engine (for the parameters of the layers whose backward is done).
pub type OnLayer<'a> = dyn FnMut(usize, &LayerGrads, &mut dyn LayerwiseEngine) -> Result<()> + 'a;

/// A model that trains layer by layer (see the module documentation for the call order).
pub trait LayerwiseEngine {
    /// The model this engine trains.
    fn spec(&self) -> &ModelSpec;

    /// Starts a training forward pass over `batch`.
    fn begin_forward(&mut self, batch: &Batch) -> Result<()>;

    /// Runs layer `layer` (layers must run in order from 0).
    fn forward_layer(&mut self, layer: usize) -> Result<()>;

    /// Computes the loss after the last layer.
    fn finish_forward(&mut self) -> Result<StepOutput>;

    /// Back-propagates the last forward pass, calling `on_layer(k, grads, engine)` for each
    /// layer from the last to the first as soon as its parameters' gradients are known.
    /// Through `engine` the callback may read and replace the parameters of layer `k` and of
    /// the layers after it (their backward is done: a local optimizer step per layer), and
    /// nothing else.
    fn backward(&mut self, on_layer: &mut OnLayer<'_>) -> Result<()>;

    /// Zero-copy view of parameter `key`'s current values.
    fn param(&self, key: usize) -> Result<FlatView>;

    /// Replaces parameter `key`'s values (e.g. from a received buffer), adopting the buffer.
    fn set_param(&mut self, key: usize, values: Vec<f32>) -> Result<()>;

    /// Loss and accuracy on `batch` in inference mode (no graph, running statistics).
    fn evaluate(&mut self, batch: &Batch) -> Result<StepOutput>;

    /// Non-trainable state (batch-norm running statistics) as named flat buffers.
    fn buffers(&self) -> Result<Vec<(String, Vec<f32>)>>;

    /// Restores one buffer returned by [`LayerwiseEngine::buffers`].
    fn set_buffer(&mut self, name: &str, values: Vec<f32>) -> Result<()>;

    /// A whole training forward pass, calling `before_layer(k, self)` just before layer `k`
    /// runs (the place to wait for and install layer `k`'s fresh parameters).
    fn forward(
        &mut self,
        batch: &Batch,
        before_layer: &mut dyn FnMut(usize, &mut Self) -> Result<()>,
    ) -> Result<StepOutput>
    where
        Self: Sized,
    {
        self.begin_forward(batch)?;
        for layer in 0..self.spec().layers.len() {
            before_layer(layer, self)?;
            self.forward_layer(layer)?;
        }
        self.finish_forward()
    }
}
