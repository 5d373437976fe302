//! The activation handed from one layer of the burn engine to the next, and its
//! conversions between burn's tensors and our kernels' layout.

use burn::tensor::{Device, Tensor, TensorData};

use crate::engine::residual::GridImages;
use crate::error::{Result, TrainError};

/// An activation between two layers: an image batch or a feature batch.
#[derive(Clone)]
pub(super) enum Act {
    /// An image batch (NCHW).
    Image(Tensor<4>),
    /// A feature batch.
    Flat(Tensor<2>),
    /// An image batch in our kernels' layout, handed from one of them to the next as it is
    /// (made a tensor by [`Act::materialise`] where a burn op needs it).
    Grid(GridImages),
}

impl Act {
    /// The activation cut from its graph and made a leaf that records its own gradient.
    pub(super) fn detach_leaf(self) -> Self {
        match self {
            Act::Image(t) => Act::Image(t.detach().require_grad()),
            Act::Flat(t) => Act::Flat(t.detach().require_grad()),
            Act::Grid(g) => Act::Grid(g),
        }
    }

    /// This leaf's gradient in `grads` (`None` in our kernels' layout).
    pub(super) fn grad(&self, grads: &burn::tensor::Gradients) -> Option<Act> {
        match self {
            Act::Image(t) => t.grad(grads).map(Act::Image),
            Act::Flat(t) => t.grad(grads).map(Act::Flat),
            Act::Grid(_) => None,
        }
    }

    /// `sum(self * g)`: back-propagating it gives `g` as the output gradient.
    pub(super) fn weighted_sum(self, g: Act) -> Result<Tensor<1>> {
        match (self, g) {
            (Act::Image(a), Act::Image(b)) => Ok((a * b).sum()),
            (Act::Flat(a), Act::Flat(b)) => Ok((a * b).sum()),
            _ => Err(TrainError::Backend(
                "activation and its gradient differ in rank".into(),
            )),
        }
    }

    /// The activation as a feature batch (an image batch flattened per sample).
    pub(super) fn into_flat(self) -> Result<Tensor<2>> {
        match self {
            Act::Flat(t) => Ok(t),
            Act::Image(t) => {
                let [b, c, h, w] = t.dims();
                Ok(t.reshape([b, c * h * w]))
            }
            Act::Grid(_) => Err(TrainError::Backend(
                "an activation in our kernels' layout reached a burn op".into(),
            )),
        }
    }

    /// The activation as a burn tensor on `device` (a copy where it is in our kernels'
    /// layout).
    pub(super) fn materialise(self, device: &Device) -> Act {
        match self {
            Act::Grid(g) => Act::Image(Tensor::<4>::from_data(
                TensorData::new(g.planes(), g.dims()),
                device,
            )),
            other => other,
        }
    }

    /// The activation as an image batch; an error naming `layer` otherwise.
    pub(super) fn into_image(self, layer: &str) -> Result<Tensor<4>> {
        match self {
            Act::Image(t) => Ok(t),
            Act::Flat(_) => Err(TrainError::Model(format!(
                "layer {layer} needs an image input"
            ))),
            Act::Grid(_) => Err(TrainError::Backend(format!(
                "layer {layer}: an activation in our kernels' layout reached a burn op"
            ))),
        }
    }
}
