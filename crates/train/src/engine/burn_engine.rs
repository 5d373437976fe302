//! The engine on burn 0.22's `flex` CPU backend with `autodiff`.
//!
//! Every parameter is a flat 1-D leaf tensor (reshaped inside the layer), so a parameter and
//! its gradient are always one contiguous buffer that can be read without a copy and
//! replaced from a received buffer. The optimizer is ours (flat slices, see
//! `syncopate_core::optim`), so replacing a leaf never loses optimizer state.

use std::ops::Range;

use burn::backend::Flex;
use burn::tensor::activation::{log_softmax, relu};
use burn::tensor::module::{
    avg_pool2d, batch_norm as burn_batch_norm, batch_norm_train, conv2d, linear, max_pool2d,
};
use burn::tensor::ops::{AvgPoolOptions, ConvOptions, MaxPoolOptions};
use burn::tensor::{Device, Tensor, TensorData};

use super::batch_norm;
use super::conv_block::{self, ConvSaved, ConvShape};
use super::flat::{FlatView, LayerGrads};
use super::residual::{self, GridImages, ResidualSaved, ResidualShape, Running};
use super::{BackwardMode, LayerwiseEngine, OnLayer, StepOutput};
use crate::data::Batch;
use crate::error::{Result, TrainError};
use crate::model::{LayerOp, ModelSpec};

mod act;

use act::Act;

const BN_EPS: f64 = batch_norm::EPS;
const BN_MOMENTUM: f32 = 0.1;

/// Running statistics of one batch-norm.
#[derive(Clone)]
struct BnStats {
    mean: Vec<f32>,
    var: Vec<f32>,
}

impl BnStats {
    /// Folds one batch's statistics (biased variance over `n` values) into the running
    /// estimates, as PyTorch does: momentum 0.1, the unbiased variance.
    fn update(&mut self, mean: &[f32], var: &[f32], n: usize) {
        let unbiased = if n > 1 {
            n as f32 / (n - 1) as f32
        } else {
            1.0
        };
        for (r, &m) in self.mean.iter_mut().zip(mean) {
            *r = *r * (1.0 - BN_MOMENTUM) + m * BN_MOMENTUM;
        }
        for (r, &v) in self.var.iter_mut().zip(var) {
            *r = *r * (1.0 - BN_MOMENTUM) + v * BN_MOMENTUM * unbiased;
        }
    }
}

/// A layer our own kernels run, with its geometry.
enum Kernel {
    Conv(ConvShape),
    Residual(ResidualShape),
}

/// What a layer run by our own kernels kept for its backward pass.
enum Saved {
    Conv(ConvSaved),
    Residual(ResidualSaved),
}

/// Training mode (batch statistics, graph) or inference (running statistics, no graph).
#[derive(Clone, Copy, PartialEq, Eq)]
enum Mode {
    Train,
    Eval,
}

/// State of the forward pass in progress.
struct Pass {
    labels: Vec<u8>,
    /// Input leaf of each layer (segmented mode; `None` for layer 0 or in whole mode).
    inputs: Vec<Option<Act>>,
    /// Output of each layer.
    outputs: Vec<Act>,
    next_input: Option<Act>,
    loss: Option<Tensor<1>>,
    /// What each layer run by our own kernels kept for its backward pass.
    saved: Vec<Option<Saved>>,
}

impl Pass {
    /// The next layer's input, taken out (an error once the last layer has run).
    fn take_input(&mut self) -> Result<Act> {
        self.next_input
            .take()
            .ok_or_else(|| TrainError::Config("forward pass already finished".into()))
    }
}

/// The burn-backed [`LayerwiseEngine`].
pub struct BurnEngine {
    spec: ModelSpec,
    layer_keys: Vec<Range<usize>>,
    device: Device,
    inner_device: Device,
    params: Vec<Tensor<1>>,
    bn: Vec<Vec<BnStats>>,
    mode: BackwardMode,
    pass: Option<Pass>,
}

/// The values of a tensor, copied to a host vector.
fn host_values<const D: usize>(t: Tensor<D>) -> Result<Vec<f32>> {
    t.inner()
        .into_data()
        .try_into_vec::<f32>()
        .map_err(|e| TrainError::Backend(format!("reading a tensor: {e:?}")))
}

/// A tensor's values in place (copied only where it is a strided view): reading a layer's
/// input or gradient this way allocates nothing, where a host copy cost three large buffers.
fn to_view<const D: usize>(t: Tensor<D>) -> Result<FlatView> {
    t.inner()
        .try_into_primitive::<Flex>()
        .map(FlatView::new)
        .map_err(|e| TrainError::Backend(format!("tensor is not on the flex backend: {e:?}")))
}

impl BurnEngine {
    /// An engine for `spec` with parameters initialised from `seed`.
    pub fn new(spec: ModelSpec, seed: u64) -> Result<Self> {
        let init = spec.init_params(seed);
        Self::with_params(spec, init)
    }

    /// An engine for `spec` with the given initial parameter values (one `Vec` per key).
    pub fn with_params(spec: ModelSpec, values: Vec<Vec<f32>>) -> Result<Self> {
        if spec.is_profile() {
            return Err(TrainError::Model(format!(
                "{} is a compute profile: it is replayed by distributed jobs \
                 (`syncopate launch --model {}`), not trained",
                spec.name, spec.name
            )));
        }
        let inner_device = Device::flex();
        let device = inner_device.clone().autodiff();
        let bn = spec
            .layers
            .iter()
            .map(|l| {
                let (count, channels) = match l.op {
                    LayerOp::Conv {
                        batch_norm: true,
                        out_channels,
                        ..
                    } => (1, out_channels),
                    LayerOp::BasicBlock { out_channels, .. } => (2, out_channels),
                    _ => (0, 0),
                };
                (0..count)
                    .map(|_| BnStats {
                        mean: vec![0.0; channels],
                        var: vec![1.0; channels],
                    })
                    .collect()
            })
            .collect();
        let mut engine = Self {
            layer_keys: spec.layer_keys(),
            spec,
            device,
            inner_device,
            params: Vec::new(),
            bn,
            mode: BackwardMode::Segmented,
            pass: None,
        };
        let keys = engine.spec.keys();
        if values.len() != keys.len() {
            return Err(TrainError::Param(format!(
                "{} initial tensors for a model with {} keys",
                values.len(),
                keys.len()
            )));
        }
        for (k, v) in keys.iter().zip(values) {
            if v.len() != k.numel {
                return Err(TrainError::Param(format!(
                    "key {} ({}) needs {} values, got {}",
                    k.key,
                    k.name,
                    k.numel,
                    v.len()
                )));
            }
            engine.params.push(engine.leaf(v));
        }
        Ok(engine)
    }

    /// Chooses segmented (default) or whole-model backward.
    pub fn set_backward_mode(&mut self, mode: BackwardMode) {
        self.mode = mode;
    }

    fn leaf(&self, values: Vec<f32>) -> Tensor<1> {
        let n = values.len();
        Tensor::<1>::from_data(TensorData::new(values, [n]), &self.device).require_grad()
    }

    fn batch_tensor(&self, batch: &Batch, device: &Device) -> Result<Tensor<4>> {
        if batch.shape != self.spec.input {
            return Err(TrainError::Model(format!(
                "model {} expects samples of shape {:?}, the data has {:?}",
                self.spec.name, self.spec.input, batch.shape
            )));
        }
        let [c, h, w] = batch.shape;
        if batch.is_empty() || batch.images.len() != batch.len() * c * h * w {
            return Err(TrainError::Config(format!(
                "batch of {} labels holds {} values",
                batch.len(),
                batch.images.len()
            )));
        }
        Ok(Tensor::<4>::from_data(
            TensorData::new(batch.images.clone(), [batch.len(), c, h, w]),
            device,
        ))
    }

    /// Runs one layer on `input` with `params` (autodiff leaves in training, plain tensors in
    /// inference).
    fn apply(&mut self, layer: usize, input: Act, params: &[Tensor<1>], mode: Mode) -> Result<Act> {
        let spec = &self.spec.layers[layer];
        let name = spec.name.clone();
        match spec.op {
            LayerOp::Conv {
                in_channels,
                out_channels,
                kernel,
                stride,
                padding,
                batch_norm: bn,
                pool,
            } => {
                let x = input.into_image(&name)?;
                let w = params[0]
                    .clone()
                    .reshape([out_channels, in_channels, kernel, kernel]);
                let options = ConvOptions::new([stride, stride], [padding, padding], [1, 1], 1);
                let y = self.conv_norm_relu(layer, x, w, options, bn, params, mode)?;
                Ok(Act::Image(if pool {
                    max_pool2d(y, MaxPoolOptions::new([2, 2]))
                } else {
                    y
                }))
            }
            LayerOp::Linear {
                in_features,
                out_features,
                relu: with_relu,
            } => {
                let x = input.into_flat()?;
                let w = params[0].clone().reshape([in_features, out_features]);
                let y = linear(x, w, Some(params[1].clone()));
                Ok(Act::Flat(if with_relu { relu(y) } else { y }))
            }
            LayerOp::BasicBlock {
                in_channels,
                out_channels,
                stride,
            } => {
                let x = input.into_image(&name)?;
                let shape = (in_channels, out_channels, stride);
                Ok(Act::Image(self.basic_block(layer, x, params, mode, shape)?))
            }
            LayerOp::PoolLinear {
                in_channels,
                out_features,
            } => {
                let x = input.into_image(&name)?;
                let [b, c, _, _] = x.dims();
                let pooled = x.mean_dim(3).mean_dim(2).reshape([b, c]);
                let w = params[0].clone().reshape([in_channels, out_features]);
                Ok(Act::Flat(linear(pooled, w, Some(params[1].clone()))))
            }
            LayerOp::Profiled { .. } => Err(TrainError::Model(format!(
                "layer {name} is a profiled layer: it has no computation"
            ))),
        }
    }

    /// The forward pass in progress, taken out; `missing` is the error when there is none.
    fn take_pass(&mut self, missing: &str) -> Result<Pass> {
        self.pass
            .take()
            .ok_or_else(|| TrainError::Config(missing.into()))
    }

    /// A convolution layer's body: the convolution of `x` by `w`, then its batch norm (with
    /// `batch_norm`; a bias otherwise), then ReLU.
    #[allow(clippy::too_many_arguments)]
    fn conv_norm_relu(
        &mut self,
        layer: usize,
        x: Tensor<4>,
        w: Tensor<4>,
        options: ConvOptions<2>,
        batch_norm: bool,
        params: &[Tensor<1>],
        mode: Mode,
    ) -> Result<Tensor<4>> {
        let y = if batch_norm {
            let y = conv2d(x, w, None, options);
            self.norm(layer, 0, y, &params[1], &params[2], mode)?
        } else {
            conv2d(x, w, Some(params[1].clone()), options)
        };
        Ok(relu(y))
    }

    /// A basic block (`(in_channels, out_channels, stride)`) on `x`: two 3x3 convolutions
    /// with batch norm, plus the shortcut, then ReLU.
    fn basic_block(
        &mut self,
        layer: usize,
        x: Tensor<4>,
        params: &[Tensor<1>],
        mode: Mode,
        (in_channels, out_channels, stride): (usize, usize, usize),
    ) -> Result<Tensor<4>> {
        let w1 = params[0].clone().reshape([out_channels, in_channels, 3, 3]);
        let w2 = params[3]
            .clone()
            .reshape([out_channels, out_channels, 3, 3]);
        let y = conv2d(
            x.clone(),
            w1,
            None,
            ConvOptions::new([stride, stride], [1, 1], [1, 1], 1),
        );
        let y = relu(self.norm(layer, 0, y, &params[1], &params[2], mode)?);
        let y = conv2d(y, w2, None, ConvOptions::new([1, 1], [1, 1], [1, 1], 1));
        let y = self.norm(layer, 1, y, &params[4], &params[5], mode)?;
        let shortcut = if stride != 1 || in_channels != out_channels {
            let sub = avg_pool2d(x, AvgPoolOptions::new([1, 1]).with_stride([stride, stride]));
            let [b, _, h, w] = sub.dims();
            let extra = out_channels - in_channels;
            let before = extra / 2;
            let device = if mode == Mode::Train {
                &self.device
            } else {
                &self.inner_device
            };
            let zeros = |c| Tensor::<4>::zeros([b, c, h, w], device);
            Tensor::cat(vec![zeros(before), sub, zeros(extra - before)], 1)
        } else {
            x
        };
        Ok(relu(y + shortcut))
    }

    /// The layer `layer` on `input` when our own kernels run it: a convolution with stride
    /// 1 and no batch norm (conv, bias, ReLU, optional 2x2 pool), a batch-normalised
    /// convolution without pool, or a basic block; never the last layer (whose output feeds
    /// the loss).
    fn our_kernel(&self, layer: usize, input: &Act) -> Result<Option<Kernel>> {
        let dims = match input {
            Act::Image(x) => x.dims(),
            Act::Grid(g) => g.dims(),
            Act::Flat(_) => return Ok(None),
        };
        let [batch, channels, height, width] = dims;
        let expected = match self.spec.layers[layer].op {
            LayerOp::Conv { in_channels, .. } | LayerOp::BasicBlock { in_channels, .. } => {
                in_channels
            }
            _ => return Ok(None),
        };
        if channels != expected {
            return Err(TrainError::Model(format!(
                "layer {} expects {expected} input channels, got {channels}",
                self.spec.layers[layer].name
            )));
        }
        if layer + 1 == self.spec.layers.len() {
            return Ok(None);
        }
        let kernel = match self.spec.layers[layer].op {
            LayerOp::Conv {
                in_channels,
                out_channels,
                kernel,
                stride: 1,
                padding,
                batch_norm: false,
                pool,
            } => {
                let shape = ConvShape {
                    batch,
                    in_channels,
                    height,
                    width,
                    out_channels,
                    kernel,
                    padding,
                    pool,
                };
                shape.is_valid().then_some(Kernel::Conv(shape))
            }
            LayerOp::Conv {
                out_channels,
                kernel,
                stride,
                padding,
                batch_norm: true,
                pool: false,
                ..
            } => {
                let shape = ResidualShape::stem(dims, out_channels, kernel, stride, padding);
                shape.is_valid().then_some(Kernel::Residual(shape))
            }
            LayerOp::BasicBlock {
                out_channels,
                stride,
                ..
            } => {
                let shape = ResidualShape::basic(dims, out_channels, stride);
                shape.is_valid().then_some(Kernel::Residual(shape))
            }
            _ => None,
        };
        Ok(kernel)
    }

    /// Runs a layer with our kernels (training mode with `train`, else inference with the
    /// running statistics); its output is a tensor on `device`.
    fn run_kernel(
        &mut self,
        layer: usize,
        kernel: &Kernel,
        input: Act,
        device: &Device,
        train: bool,
    ) -> Result<(Act, Option<Saved>)> {
        let name = self.spec.layers[layer].name.clone();
        let params = self.layer_params(layer)?;
        let views: Vec<&[f32]> = params.iter().map(|p| &p[..]).collect();
        match kernel {
            Kernel::Conv(shape) => {
                let x = to_view(input.materialise(device).into_image(&name)?)?;
                let (out, saved) = conv_block::forward(shape, &x, views[0], views[1], train);
                let dims = shape.output_dims();
                let out = Tensor::<4>::from_data(TensorData::new(out, dims), device);
                Ok((Act::Image(out), saved.map(Saved::Conv)))
            }
            Kernel::Residual(shape) => {
                let x = match input {
                    Act::Grid(g) => g,
                    other => {
                        let x = to_view(other.into_image(&name)?)?;
                        GridImages::of_planes(shape.input_dims(), &x)
                    }
                };
                let stats = &self.bn[layer];
                let running: Vec<Running> = stats
                    .iter()
                    .map(|s| Running {
                        mean: &s.mean,
                        var: &s.var,
                    })
                    .collect();
                let fwd = residual::forward(shape, &x, &views, (!train).then_some(&running[..]));
                let [b, _, h, w] = shape.output_dims();
                let n = b * h * w;
                for (stats, batch) in self.bn[layer].iter_mut().zip(&fwd.stats) {
                    stats.update(&batch.mean, &batch.var, n);
                }
                Ok((Act::Grid(fwd.output), fwd.saved.map(Saved::Residual)))
            }
        }
    }

    /// The values of layer `layer`'s parameters.
    fn layer_params(&self, layer: usize) -> Result<Vec<FlatView>> {
        self.layer_keys[layer]
            .clone()
            .map(|k| to_view(self.params[k].clone()))
            .collect()
    }

    /// The parameter gradients of a layer run by our kernels, and the gradient of its input
    /// (none for the first layer).
    fn kernel_backward(
        &self,
        layer: usize,
        saved: &Saved,
        output_grad: Act,
    ) -> Result<(LayerGrads, Option<Act>)> {
        let params = self.layer_params(layer)?;
        let need_input = layer > 0;
        let (grads, input) = match saved {
            Saved::Conv(saved) => {
                let (view, planes);
                let g: &[f32] = match output_grad {
                    Act::Image(g) => {
                        view = to_view(g)?;
                        &view
                    }
                    Act::Flat(g) => {
                        view = to_view(g)?;
                        &view
                    }
                    Act::Grid(g) => {
                        planes = g.planes();
                        &planes
                    }
                };
                let grads = conv_block::backward(saved, &params[0], g, need_input);
                let input = grads.input.map(|gx| {
                    let data = TensorData::new(gx, saved.input_dims());
                    Act::Image(Tensor::<4>::from_data(data, &self.inner_device))
                });
                (vec![grads.weight, grads.bias], input)
            }
            Saved::Residual(saved) => {
                let g = match output_grad {
                    Act::Grid(g) => g,
                    Act::Image(g) => GridImages::of_planes(saved.output_dims(), &to_view(g)?),
                    Act::Flat(g) => GridImages::of_planes(saved.output_dims(), &to_view(g)?),
                };
                let views: Vec<&[f32]> = params.iter().map(|p| &p[..]).collect();
                let grads = residual::backward(saved, &views, g, need_input);
                (grads.params, grads.input.map(Act::Grid))
            }
        };
        let keys = self.layer_keys[layer].clone();
        let grads = LayerGrads {
            grads: keys
                .zip(grads)
                .map(|(k, g)| (k, FlatView::shared(g.into())))
                .collect(),
        };
        Ok((grads, input))
    }

    fn norm(
        &mut self,
        layer: usize,
        slot: usize,
        y: Tensor<4>,
        gamma: &Tensor<1>,
        beta: &Tensor<1>,
        mode: Mode,
    ) -> Result<Tensor<4>> {
        let stats = &mut self.bn[layer][slot];
        match mode {
            Mode::Eval => {
                let device = y.device();
                let n = stats.mean.len();
                let t =
                    |v: &[f32]| Tensor::<1>::from_data(TensorData::new(v.to_vec(), [n]), &device);
                Ok(burn_batch_norm(
                    y,
                    gamma.clone(),
                    beta.clone(),
                    t(&stats.mean),
                    t(&stats.var),
                    BN_EPS,
                ))
            }
            Mode::Train => {
                let [b, _, h, w] = y.dims();
                let out = batch_norm_train(y, gamma.clone(), beta.clone(), BN_EPS);
                let mean = host_values(out.mean.inner())?;
                let var = host_values(out.variance.inner())?;
                stats.update(&mean, &var, b * h * w);
                Ok(out.output)
            }
        }
    }

    fn loss_and_accuracy(&self, logits: Tensor<2>, labels: &[u8]) -> Result<(Tensor<1>, usize)> {
        let [b, classes] = logits.dims();
        let mut onehot = vec![0f32; b * classes];
        for (i, &l) in labels.iter().enumerate() {
            onehot[i * classes + usize::from(l)] = 1.0;
        }
        let device = logits.device();
        let targets = Tensor::<2>::from_data(TensorData::new(onehot, [b, classes]), &device);
        let values: Vec<f32> = logits
            .clone()
            .inner()
            .into_data()
            .try_into_vec::<f32>()
            .map_err(|e| TrainError::Backend(format!("reading logits: {e:?}")))?;
        let correct = values
            .chunks_exact(classes)
            .zip(labels)
            .filter(|(row, &l)| argmax(row) == usize::from(l))
            .count();
        let loss = (log_softmax(logits, 1) * targets)
            .sum()
            .mul_scalar(-1.0 / b as f32);
        Ok((loss, correct))
    }

    fn param_grads(&self, layer: usize, grads: &burn::tensor::Gradients) -> Result<LayerGrads> {
        let mut out = Vec::new();
        for key in self.layer_keys[layer].clone() {
            let p = &self.params[key];
            let g = match p.grad(grads) {
                Some(g) => g,
                None => Tensor::zeros([p.dims()[0]], &self.inner_device),
            };
            out.push((key, to_view(g)?));
        }
        Ok(LayerGrads { grads: out })
    }
}

fn argmax(row: &[f32]) -> usize {
    let mut best = 0;
    for (i, &v) in row.iter().enumerate() {
        if v > row[best] {
            best = i;
        }
    }
    best
}

fn scalar(t: Tensor<1>) -> Result<f32> {
    let v: Vec<f32> = t
        .inner()
        .into_data()
        .try_into_vec::<f32>()
        .map_err(|e| TrainError::Backend(format!("reading the loss: {e:?}")))?;
    v.first()
        .copied()
        .ok_or_else(|| TrainError::Backend("empty loss tensor".into()))
}

impl LayerwiseEngine for BurnEngine {
    fn spec(&self) -> &ModelSpec {
        &self.spec
    }

    fn begin_forward(&mut self, batch: &Batch) -> Result<()> {
        let x = self.batch_tensor(batch, &self.device)?;
        let layers = self.spec.layers.len();
        self.pass = Some(Pass {
            labels: batch.labels.clone(),
            inputs: Vec::with_capacity(layers),
            outputs: Vec::with_capacity(layers),
            next_input: Some(Act::Image(x)),
            loss: None,
            saved: Vec::with_capacity(layers),
        });
        Ok(())
    }

    fn forward_layer(&mut self, layer: usize) -> Result<()> {
        let mut pass = self.take_pass("forward_layer before begin_forward")?;
        if layer != pass.outputs.len() {
            return Err(TrainError::Config(format!(
                "layer {layer} run out of order (expected {})",
                pass.outputs.len()
            )));
        }
        let input = pass.take_input()?;
        if self.mode == BackwardMode::Segmented {
            if let Some(kernel) = self.our_kernel(layer, &input)? {
                let device = self.device.clone();
                let (out, saved) = self.run_kernel(layer, &kernel, input, &device, true)?;
                pass.inputs.push(None);
                pass.saved.push(saved);
                pass.outputs.push(out.clone());
                pass.next_input = Some(out);
                self.pass = Some(pass);
                return Ok(());
            }
        }
        pass.saved.push(None);
        let input = if layer > 0 && self.mode == BackwardMode::Segmented {
            let leaf = input.materialise(&self.device).detach_leaf();
            pass.inputs.push(Some(leaf.clone()));
            leaf
        } else {
            pass.inputs.push(None);
            input
        };
        let params: Vec<Tensor<1>> = self.params[self.layer_keys[layer].clone()].to_vec();
        let out = self.apply(layer, input, &params, Mode::Train)?;
        pass.outputs.push(out.clone());
        pass.next_input = Some(out);
        self.pass = Some(pass);
        Ok(())
    }

    fn finish_forward(&mut self) -> Result<StepOutput> {
        let layers = self.spec.layers.len();
        let mut pass = self.take_pass("finish_forward before begin_forward")?;
        if pass.outputs.len() != layers {
            return Err(TrainError::Config(format!(
                "finish_forward after {} of {layers} layers",
                pass.outputs.len()
            )));
        }
        let logits = pass.take_input()?.materialise(&self.device).into_flat()?;
        let (loss, correct) = self.loss_and_accuracy(logits, &pass.labels)?;
        let out = StepOutput {
            loss: scalar(loss.clone())?,
            correct,
            samples: pass.labels.len(),
        };
        pass.loss = Some(loss);
        self.pass = Some(pass);
        Ok(out)
    }

    fn backward(&mut self, on_layer: &mut OnLayer<'_>) -> Result<()> {
        let mut pass = self.take_pass("backward before a forward pass")?;
        let loss = pass
            .loss
            .take()
            .ok_or_else(|| TrainError::Config("backward before finish_forward".into()))?;
        let layers = self.spec.layers.len();
        match self.mode {
            BackwardMode::Whole => {
                let grads = loss.backward();
                for layer in (0..layers).rev() {
                    let layer_grads = self.param_grads(layer, &grads)?;
                    on_layer(layer, &layer_grads, self)?;
                }
            }
            BackwardMode::Segmented => {
                // The gradient of the current layer's output, from the layer above it.
                let mut g_up: Option<Act> = None;
                for layer in (0..layers).rev() {
                    let grads = if layer + 1 == layers {
                        loss.backward()
                    } else {
                        let g = g_up.take().ok_or_else(|| {
                            TrainError::Backend(format!(
                                "no gradient reached the input of layer {}",
                                layer + 1
                            ))
                        })?;
                        if let Some(saved) = pass.saved[layer].take() {
                            let (grads, g_input) = self.kernel_backward(layer, &saved, g)?;
                            on_layer(layer, &grads, self)?;
                            g_up = g_input;
                            continue;
                        }
                        let g = g.materialise(&self.inner_device);
                        pass.outputs[layer].clone().weighted_sum(g)?.backward()
                    };
                    let layer_grads = self.param_grads(layer, &grads)?;
                    on_layer(layer, &layer_grads, self)?;
                    if layer > 0 {
                        // The gradient of layer k's input leaf is layer k-1's output gradient.
                        g_up = pass.inputs[layer]
                            .as_ref()
                            .and_then(|leaf| leaf.grad(&grads));
                    }
                }
            }
        }
        Ok(())
    }

    fn param(&self, key: usize) -> Result<FlatView> {
        let p = self
            .params
            .get(key)
            .ok_or_else(|| TrainError::Param(format!("no parameter key {key}")))?;
        to_view(p.clone())
    }

    fn set_param(&mut self, key: usize, values: Vec<f32>) -> Result<()> {
        let Some(p) = self.params.get(key) else {
            return Err(TrainError::Param(format!("no parameter key {key}")));
        };
        let want = p.dims()[0];
        if values.len() != want {
            return Err(TrainError::Param(format!(
                "key {key} needs {want} values, got {}",
                values.len()
            )));
        }
        self.params[key] = self.leaf(values);
        Ok(())
    }

    fn evaluate(&mut self, batch: &Batch) -> Result<StepOutput> {
        let mut act = Act::Image(self.batch_tensor(batch, &self.inner_device)?);
        for layer in 0..self.spec.layers.len() {
            // Whole mode is burn's own computation throughout: the reference for our kernels.
            let ours = match self.mode {
                BackwardMode::Segmented => self.our_kernel(layer, &act)?,
                BackwardMode::Whole => None,
            };
            if let Some(kernel) = ours {
                let device = self.inner_device.clone();
                act = self.run_kernel(layer, &kernel, act, &device, false)?.0;
                continue;
            }
            let params: Vec<Tensor<1>> = self.params[self.layer_keys[layer].clone()]
                .iter()
                .map(|p| p.clone().inner())
                .collect();
            let input = act.materialise(&self.inner_device);
            act = self.apply(layer, input, &params, Mode::Eval)?;
        }
        let (loss, correct) = self.loss_and_accuracy(
            act.materialise(&self.inner_device).into_flat()?,
            &batch.labels,
        )?;
        Ok(StepOutput {
            loss: scalar(loss)?,
            correct,
            samples: batch.len(),
        })
    }

    fn buffers(&self) -> Result<Vec<(String, Vec<f32>)>> {
        let mut out = Vec::new();
        for (layer, stats) in self.bn.iter().enumerate() {
            for (slot, s) in stats.iter().enumerate() {
                let name = &self.spec.layers[layer].name;
                out.push((format!("{name}.bn{slot}.running_mean"), s.mean.clone()));
                out.push((format!("{name}.bn{slot}.running_var"), s.var.clone()));
            }
        }
        Ok(out)
    }

    fn set_buffer(&mut self, name: &str, values: Vec<f32>) -> Result<()> {
        for (layer, stats) in self.bn.iter_mut().enumerate() {
            for (slot, s) in stats.iter_mut().enumerate() {
                let prefix = format!("{}.bn{slot}.", self.spec.layers[layer].name);
                let Some(which) = name.strip_prefix(&prefix) else {
                    continue;
                };
                let target = match which {
                    "running_mean" => &mut s.mean,
                    "running_var" => &mut s.var,
                    _ => continue,
                };
                if values.len() != target.len() {
                    return Err(TrainError::Param(format!(
                        "buffer {name} needs {} values, got {}",
                        target.len(),
                        values.len()
                    )));
                }
                *target = values;
                return Ok(());
            }
        }
        Err(TrainError::Param(format!("no buffer named {name}")))
    }
}
