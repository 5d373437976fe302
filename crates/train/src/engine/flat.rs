//! Zero-copy flat views of parameters and gradients.

use std::ops::Deref;
use std::sync::Arc;

use burn::backend::flex::FlexTensor;

/// A contiguous `&[f32]` view of a parameter or gradient, sharing the tensor's storage (or a
/// shared buffer, for engines that hold plain vectors). A clone shares them too.
#[derive(Clone)]
pub struct FlatView {
    storage: Storage,
}

#[derive(Clone)]
enum Storage {
    Tensor(FlexTensor),
    Shared(Arc<[f32]>),
}

impl FlatView {
    /// Wraps a tensor, making it contiguous first if it is a strided view.
    pub(crate) fn new(tensor: FlexTensor) -> Self {
        let tensor = if tensor.as_slice::<f32>().is_some() {
            tensor
        } else {
            tensor.to_contiguous()
        };
        Self {
            storage: Storage::Tensor(tensor),
        }
    }

    /// Wraps a shared buffer.
    pub(crate) fn shared(values: Arc<[f32]>) -> Self {
        Self {
            storage: Storage::Shared(values),
        }
    }
}

impl Deref for FlatView {
    type Target = [f32];

    fn deref(&self) -> &[f32] {
        match &self.storage {
            // `new` guarantees a contiguous f32 tensor, so the view always exists.
            Storage::Tensor(t) => t.as_slice::<f32>().unwrap_or(&[]),
            Storage::Shared(v) => v,
        }
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

    /// `(key, gradient)` pairs in key order, as views a clone of which shares the values.
    pub fn views(&self) -> impl Iterator<Item = (usize, &FlatView)> {
        self.grads.iter().map(|(k, v)| (*k, v))
    }

    /// The gradient of `key`, if it belongs to this layer.
    pub fn get(&self, key: usize) -> Option<&[f32]> {
        self.grads
            .iter()
            .find(|(k, _)| *k == key)
            .map(|(_, v)| &**v)
    }
}
