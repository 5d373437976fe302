//! Zero-copy flat views of parameters and gradients.

use std::ops::Deref;

use burn::backend::flex::FlexTensor;

/// A contiguous `&[f32]` view of a parameter or gradient, sharing the tensor's storage.
pub struct FlatView {
    tensor: FlexTensor,
}

impl FlatView {
    /// Wraps a tensor, making it contiguous first if it is a strided view.
    pub(crate) fn new(tensor: FlexTensor) -> Self {
        let tensor = if tensor.as_slice::<f32>().is_some() {
            tensor
        } else {
            tensor.to_contiguous()
        };
        Self { tensor }
    }
}

impl Deref for FlatView {
    type Target = [f32];

    fn deref(&self) -> &[f32] {
        // `new` guarantees a contiguous f32 tensor, so the view always exists.
        self.tensor.as_slice::<f32>().unwrap_or(&[])
    }
}

impl std::fmt::Debug for FlatView {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "FlatView(len={})", self.len())
    }
}

/// The gradients of one layer's parameters, by key.
#[derive(Debug)]
pub struct LayerGrads {
    pub(crate) grads: Vec<(usize, FlatView)>,
}

impl LayerGrads {
    /// `(key, gradient)` pairs in key order.
    pub fn iter(&self) -> impl Iterator<Item = (usize, &[f32])> {
        self.grads.iter().map(|(k, v)| (*k, &**v))
    }

    /// The gradient of `key`, if it belongs to this layer.
    pub fn get(&self, key: usize) -> Option<&[f32]> {
        self.grads
            .iter()
            .find(|(k, _)| *k == key)
            .map(|(_, v)| &**v)
    }
}
