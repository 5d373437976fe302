//! Our own CPU kernels for ResNet's batch-normalised layers, forward (training and
//! inference) and backward: the stem (convolution without bias, batch norm, ReLU) and He
//! et al.'s basic block (two 3x3 convolutions with batch norm, the first possibly strided,
//! and an option-A shortcut: the input subsampled and zero-padded to the new channels).
//!
//! Between layers images are `[B, C, H, W]`; inside a layer they stay channel-major
//! `[C, B, H, W]`, the layout in which a convolution's GEMM `W x cols` leaves them and in
//! which batch norm reads each channel as one run. Every sum runs in a fixed order, so
//! results do not depend on the thread count.

use std::ops::Range;
use std::sync::Mutex;

pub use super::batch_norm::Running;
use super::batch_norm::{self, BatchStats, BnSaved};
use super::gemm::ConvGemm;
use rayon::prelude::*;

use super::unfold::{im2col_into, Layout, Unfold};

/// One convolution without bias followed by batch norm.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ConvBn {
    /// The convolution's input geometry, kernel, stride, padding and input layout.
    pub unfold: Unfold,
    /// Output channels.
    pub out_channels: usize,
}

impl ConvBn {
    /// Output positions per sample.
    fn plane(&self) -> usize {
        let (h, w) = self.unfold.out_hw();
        h * w
    }

    /// The ranges of samples unfolded at a time ([`Unfold::chunks`]).
    fn chunks(&self) -> impl Iterator<Item = Range<usize>> {
        self.unfold.chunks()
    }

    /// Values in the largest part of the column matrix.
    fn chunk_len(&self) -> usize {
        self.unfold.chunk_len()
    }

    /// The convolution as GEMMs; `parallel`: whether one product may use every thread.
    fn gemm(&self, parallel: bool) -> ConvGemm {
        ConvGemm {
            out_channels: self.out_channels,
            rows: self.unfold.rows(),
            columns: self.unfold.columns(),
            parallel,
        }
    }

    /// Runs `f(samples, cols)` on every part of the batch ([`ConvBn::chunks`]) with that
    /// part of `x` unfolded, the parts side by side on the threads (each unfolding into a
    /// column matrix of its own, each product on one thread: small products do not split
    /// well), and returns the results in the parts' order, so that what the caller sums
    /// from them does not depend on the thread count.
    fn per_chunk<T: Send>(
        &self,
        x: &[f32],
        f: impl Fn(Range<usize>, &[f32]) -> T + Sync,
    ) -> Vec<T> {
        let chunks: Vec<Range<usize>> = self.chunks().collect();
        chunks
            .into_par_iter()
            .map(|samples| {
                let mut buffer = take_buffer(self.chunk_len());
                let cols = &mut buffer[..self.unfold.rows() * samples.len() * self.plane()];
                im2col_into(&self.unfold, x, samples.clone(), cols);
                let out = f(samples, cols);
                give_back(buffer);
                out
            })
            .collect()
    }

    /// The convolution's output `[O, B*OH*OW]` (channel-major) of input `x`, the batch's
    /// parts computed side by side.
    fn convolve(&self, weight: &[f32], x: &[f32]) -> Vec<f32> {
        let gemm = self.gemm(false);
        let parts = self.per_chunk(x, |samples, cols| {
            let part = ConvGemm {
                columns: samples.len() * self.plane(),
                ..gemm
            };
            part.forward(weight, cols)
        });
        // The parts are consecutive columns: each output row is their rows in turn, so
        // the output is written in order and never zeroed.
        let mut y = Vec::with_capacity(self.out_channels * gemm.columns);
        for o in 0..self.out_channels {
            for part in &parts {
                let width = part.len() / self.out_channels;
                y.extend_from_slice(&part[o * width..][..width]);
            }
        }
        y
    }

    /// Values in the weight `[O, C, K, K]`.
    pub fn weight_len(&self) -> usize {
        self.out_channels * self.unfold.rows()
    }

    /// For a stride-1 convolution whose output keeps the input's size: the convolution
    /// that carries its output's gradient (`[O, B, H, W]`, channel-major) back to its input
    /// (see [`transposed_input_grad`]); `None` for other convolutions.
    fn transposed(&self) -> Option<ConvBn> {
        let u = &self.unfold;
        (u.stride == 1 && 2 * u.padding + 1 == u.kernel).then_some(ConvBn {
            unfold: Unfold {
                channels: self.out_channels,
                layout: Layout::ChannelMajor,
                ..*u
            },
            out_channels: u.channels,
        })
    }
}

/// Column-matrix buffers kept between calls: a fresh one for every part of every
/// convolution was zeroed each time.
static BUFFERS: Mutex<Vec<Vec<f32>>> = Mutex::new(Vec::new());

/// A buffer of at least `len` values (contents unspecified: every user overwrites it).
fn take_buffer(len: usize) -> Vec<f32> {
    let kept = BUFFERS.lock().ok().and_then(|mut b| b.pop());
    let mut buffer = kept.unwrap_or_default();
    if buffer.len() < len {
        buffer.resize(len, 0.0);
    }
    buffer
}

/// Returns a buffer from [`take_buffer`] for reuse.
fn give_back(buffer: Vec<f32>) {
    if let Ok(mut kept) = BUFFERS.lock() {
        kept.push(buffer);
    }
}

/// A layer these kernels run, with the geometry of its input.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ResidualShape {
    /// Convolution, batch norm, ReLU. Parameters: weight, gamma, beta.
    Stem(ConvBn),
    /// The basic block. Parameters: weight, gamma, beta of each convolution in turn.
    Basic {
        /// The first convolution (3x3, padding 1, the block's stride), on the input.
        first: ConvBn,
        /// The second (3x3, stride 1, padding 1), on the first's channel-major output.
        second: ConvBn,
    },
}

impl ResidualShape {
    /// The stem: a KxK convolution at `stride` with `padding` on `[B, C, H, W]` inputs.
    pub fn stem(
        input: [usize; 4],
        out_channels: usize,
        kernel: usize,
        stride: usize,
        padding: usize,
    ) -> Self {
        let [batch, channels, height, width] = input;
        Self::Stem(ConvBn {
            unfold: Unfold {
                batch,
                channels,
                height,
                width,
                kernel,
                stride,
                padding,
                layout: Layout::SampleMajor,
            },
            out_channels,
        })
    }

    /// A basic block with `out_channels` and `stride` on `[B, C, H, W]` inputs.
    pub fn basic(input: [usize; 4], out_channels: usize, stride: usize) -> Self {
        let [batch, channels, height, width] = input;
        let first = Unfold {
            batch,
            channels,
            height,
            width,
            kernel: 3,
            stride,
            padding: 1,
            layout: Layout::SampleMajor,
        };
        let (h, w) = first.out_hw();
        let second = Unfold {
            channels: out_channels,
            height: h,
            width: w,
            stride: 1,
            layout: Layout::ChannelMajor,
            ..first
        };
        Self::Basic {
            first: ConvBn {
                unfold: first,
                out_channels,
            },
            second: ConvBn {
                unfold: second,
                out_channels,
            },
        }
    }

    /// Whether the kernels can run this layer: non-empty, the kernels fit, and a block's
    /// shortcut can pad its input's channels up to its output's.
    pub fn is_valid(&self) -> bool {
        match self {
            Self::Stem(c) => c.unfold.is_valid() && c.out_channels > 0,
            Self::Basic { first, second } => {
                first.unfold.is_valid()
                    && second.unfold.is_valid()
                    && first.out_channels >= first.unfold.channels
            }
        }
    }

    /// The convolutions in order.
    fn convs(&self) -> Vec<ConvBn> {
        match *self {
            Self::Stem(c) => vec![c],
            Self::Basic { first, second } => vec![first, second],
        }
    }

    /// The last convolution (whose output is the layer's).
    fn last(&self) -> ConvBn {
        match *self {
            Self::Stem(c) => c,
            Self::Basic { second, .. } => second,
        }
    }

    /// Dimensions `[B, O, H', W']` of the layer's output.
    pub fn output_dims(&self) -> [usize; 4] {
        let c = self.last();
        let (h, w) = c.unfold.out_hw();
        [c.unfold.batch, c.out_channels, h, w]
    }

    /// Parameter tensors the layer takes (weight, gamma, beta per convolution).
    pub fn param_count(&self) -> usize {
        3 * self.convs().len()
    }
}

/// What a training forward pass keeps for the backward pass.
pub struct ResidualSaved {
    shape: ResidualShape,
    /// The layer's input (the first convolution unfolds it again in backward).
    input: Vec<f32>,
    /// Per convolution, its batch norm's normalised values.
    norms: Vec<BnSaved>,
    /// A block's hidden activation after its ReLU (channel-major; the second convolution's
    /// input).
    hidden: Vec<f32>,
    /// The layer's output after its ReLU (channel-major).
    output: Vec<f32>,
}

impl ResidualSaved {
    /// Dimensions `[B, C, H, W]` of the layer's input.
    pub fn input_dims(&self) -> [usize; 4] {
        let u = self.shape.convs()[0].unfold;
        [u.batch, u.channels, u.height, u.width]
    }
}

/// The result of a forward pass.
pub struct Forward {
    /// The output, `[B, O, H', W']`.
    pub output: Vec<f32>,
    /// What backward needs (training only).
    pub saved: Option<ResidualSaved>,
    /// Each batch norm's batch statistics (training only), for the running estimates.
    pub stats: Vec<BatchStats>,
}

/// Runs the layer on `input` (`[B, C, H, W]`) with its parameters in order: in training
/// mode (`running` none: batch statistics, keeps what backward needs) or in inference mode
/// with each batch norm's running statistics.
///
/// # Panics
/// When a buffer's length does not match the shape (a caller's bug, not an input error).
pub fn forward(
    shape: &ResidualShape,
    input: &[f32],
    params: &[&[f32]],
    running: Option<&[Running]>,
) -> Forward {
    assert!(shape.is_valid(), "invalid residual layer {shape:?}");
    assert_eq!(params.len(), shape.param_count(), "parameters of {shape:?}");
    let mut norms = Vec::new();
    let mut stats = Vec::new();
    let mut conv = |i: usize, c: &ConvBn, x: &[f32], relu: bool| {
        let params = &params[3 * i..3 * i + 3];
        let (y, kept) = conv_bn(c, x, params, running.map(|r| r[i]), relu);
        if let Some((bn, batch)) = kept {
            norms.push(bn);
            stats.push(batch);
        }
        y
    };
    let (hidden, output) = match shape {
        ResidualShape::Stem(c) => {
            let y = conv(0, c, input, true);
            (Vec::new(), y)
        }
        ResidualShape::Basic { first, second } => {
            let hidden = conv(0, first, input, true);
            let mut y = conv(1, second, &hidden, false);
            add_shortcut(first, second, input, &mut y);
            relu(&mut y);
            (hidden, y)
        }
    };
    let [b, o, h, w] = shape.output_dims();
    let out = swap_outer(&output, o, b, h * w);
    let saved = running.is_none().then(|| ResidualSaved {
        shape: *shape,
        input: input.to_vec(),
        norms,
        hidden,
        output,
    });
    Forward {
        output: out,
        saved,
        stats,
    }
}

/// The gradients of a layer.
pub struct ResidualGrads {
    /// Per parameter tensor, in the layer's order.
    pub params: Vec<Vec<f32>>,
    /// Of the input, `[B, C, H, W]`, when asked for.
    pub input: Option<Vec<f32>>,
}

/// The gradients of the layer whose training forward left `saved`, given its output's
/// gradient (`[B, O, H', W']`) and the parameters it ran with; the input's gradient only
/// with `need_input`.
///
/// # Panics
/// When a buffer's length does not match the layer (a caller's bug).
pub fn backward(
    saved: &ResidualSaved,
    params: &[&[f32]],
    output_grad: &[f32],
    need_input: bool,
) -> ResidualGrads {
    let shape = &saved.shape;
    let [b, o, h, w] = shape.output_dims();
    assert_eq!(output_grad.len(), saved.output.len(), "output gradient");
    assert_eq!(params.len(), shape.param_count(), "parameters");
    let mut g = swap_outer(output_grad, b, o, h * w);
    relu_backward(&saved.output, &mut g);
    match *shape {
        ResidualShape::Stem(c) => {
            let grads = conv_bn_backward(&c, &saved.input, &saved.norms[0], params, &g, need_input);
            ResidualGrads {
                params: vec![grads.weight, grads.gamma, grads.beta],
                input: grads.input,
            }
        }
        ResidualShape::Basic { first, second } => {
            let shortcut = need_input.then(|| shortcut_backward(&first, &second, &g));
            let p2 = &params[3..6];
            let second = conv_bn_backward(&second, &saved.hidden, &saved.norms[1], p2, &g, true);
            let mut hidden = second.input.unwrap_or_default();
            relu_backward(&saved.hidden, &mut hidden);
            let first = conv_bn_backward(
                &first,
                &saved.input,
                &saved.norms[0],
                params,
                &hidden,
                need_input,
            );
            let input = first.input.zip(shortcut).map(|(mut dx, s)| {
                dx.iter_mut().zip(s).for_each(|(d, s)| *d += s);
                dx
            });
            ResidualGrads {
                params: vec![
                    first.weight,
                    first.gamma,
                    first.beta,
                    second.weight,
                    second.gamma,
                    second.beta,
                ],
                input,
            }
        }
    }
}

/// Convolution then batch norm (then ReLU with `relu`, in batch norm's pass): the output
/// `[O, B*OH*OW]` (channel-major) and, in training mode, the batch norm's saved values and
/// batch statistics. The input is unfolded a few
/// samples at a time, so that each part of the column matrix is still in cache when the
/// GEMM reads it.
fn conv_bn(
    c: &ConvBn,
    x: &[f32],
    params: &[&[f32]],
    running: Option<Running>,
    relu: bool,
) -> (Vec<f32>, Option<(BnSaved, BatchStats)>) {
    let (weight, gamma, beta) = (params[0], params[1], params[2]);
    assert_eq!(weight.len(), c.weight_len(), "weight of {c:?}");
    assert!(
        gamma.len() == c.out_channels && beta.len() == c.out_channels,
        "batch norm of {c:?}"
    );
    let mut z = c.convolve(weight, x);
    match running {
        Some(r) => {
            batch_norm::forward_eval(&mut z, gamma, beta, r, relu);
            (z, None)
        }
        None => {
            let (y, bn, stats) = batch_norm::forward_train(&z, gamma, beta, relu);
            (y, Some((bn, stats)))
        }
    }
}

/// The gradients of a convolution with batch norm.
struct ConvBnGrads {
    weight: Vec<f32>,
    gamma: Vec<f32>,
    beta: Vec<f32>,
    /// In the convolution's input layout, when asked for.
    input: Option<Vec<f32>>,
}

/// Backward of [`conv_bn`] on input `x` given the gradient `g` of its output and its
/// parameters (weight, gamma, beta first in `params`). The input is unfolded again, a few
/// samples at a time, as in the forward pass.
fn conv_bn_backward(
    c: &ConvBn,
    x: &[f32],
    bn: &BnSaved,
    params: &[&[f32]],
    g: &[f32],
    need_input: bool,
) -> ConvBnGrads {
    let (weight, gamma) = (params[0], params[1]);
    let grads = batch_norm::backward(bn, gamma, g);
    let dz = &grads.input;
    let gemm = c.gemm(false);
    let partial_weight_grads = c.per_chunk(x, |samples, cols| {
        gemm.weight_grad_part(dz, cols, samples.start * c.plane())
    });
    let mut dw = vec![0f32; c.weight_len()];
    for part in partial_weight_grads {
        dw.iter_mut().zip(part).for_each(|(d, p)| *d += p);
    }
    let dx = need_input.then(|| match c.transposed() {
        Some(t) => transposed_input_grad(c, &t, weight, dz),
        None => c.gemm(true).input_grad(&c.unfold, weight, dz),
    });
    ConvBnGrads {
        weight: dw,
        gamma: grads.gamma,
        beta: grads.beta,
        input: dx,
    }
}

/// The input's gradient of a stride-1 convolution that keeps the image's size, given its
/// output's gradient `dz` (`[O, B, H, W]`): the convolution of `dz` with the kernel
/// transposed (input and output channels swapped) and flipped, run as the forward is (one
/// GEMM with a deep inner dimension per part of the batch) instead of a shallow GEMM into
/// a column matrix that col2im folds back. `t` is [`ConvBn::transposed`]'s convolution.
fn transposed_input_grad(c: &ConvBn, t: &ConvBn, weight: &[f32], dz: &[f32]) -> Vec<f32> {
    let (o, ch, k) = (c.out_channels, c.unfold.channels, c.unfold.kernel);
    let taps = k * k;
    let mut flipped = vec![0f32; weight.len()];
    for oi in 0..o {
        for ci in 0..ch {
            let src = &weight[(oi * ch + ci) * taps..][..taps];
            let dst = &mut flipped[(ci * o + oi) * taps..][..taps];
            dst.iter_mut()
                .zip(src.iter().rev())
                .for_each(|(d, s)| *d = *s);
        }
    }
    let dx = t.convolve(&flipped, dz);
    match c.unfold.layout {
        Layout::ChannelMajor => dx,
        Layout::SampleMajor => {
            let u = &c.unfold;
            swap_outer(&dx, ch, u.batch, u.height * u.width)
        }
    }
}

/// Adds the option-A shortcut of the block's input `x` (`[B, C, H, W]`) to `y`
/// (`[O, B, OH, OW]`): `x` subsampled by the stride, its channels centred among the
/// output's (`(O - C) / 2` zero channels before them).
fn add_shortcut(first: &ConvBn, second: &ConvBn, x: &[f32], y: &mut [f32]) {
    let stride = first.unfold.stride;
    for_each_shortcut_row(first, second, |src, dst, len| {
        let out = &mut y[dst..][..len];
        if stride == 1 {
            out.iter_mut()
                .zip(&x[src..][..len])
                .for_each(|(o, v)| *o += v);
        } else {
            let line = x[src..].iter().step_by(stride);
            out.iter_mut().zip(line).for_each(|(o, v)| *o += v);
        }
    });
}

/// The input's gradient through the shortcut, `[B, C, H, W]`, from the output's `g`.
fn shortcut_backward(first: &ConvBn, second: &ConvBn, g: &[f32]) -> Vec<f32> {
    let mut dx = vec![0f32; first.unfold.input_len()];
    let stride = first.unfold.stride;
    for_each_shortcut_row(first, second, |src, dst, len| {
        let from = &g[dst..][..len];
        if stride == 1 {
            dx[src..][..len]
                .iter_mut()
                .zip(from)
                .for_each(|(d, v)| *d += v);
        } else {
            let line = dx[src..].iter_mut().step_by(stride);
            line.zip(from).for_each(|(d, v)| *d += v);
        }
    });
    dx
}

/// Calls `f(input start, output start, length)` for every output row the shortcut
/// connects: output values `dst..dst + len` pair with the input's `src + i * stride`.
fn for_each_shortcut_row(first: &ConvBn, second: &ConvBn, mut f: impl FnMut(usize, usize, usize)) {
    let u = &first.unfold;
    let (oh, ow) = (second.unfold.height, second.unfold.width);
    let before = (first.out_channels - u.channels) / 2;
    for c in 0..u.channels {
        for b in 0..u.batch {
            let src = (b * u.channels + c) * u.height * u.width;
            let dst = ((c + before) * u.batch + b) * oh * ow;
            for oy in 0..oh {
                f(src + oy * u.stride * u.width, dst + oy * ow, ow);
            }
        }
    }
}

/// ReLU in place.
fn relu(v: &mut [f32]) {
    v.iter_mut().for_each(|x| *x = x.max(0.0));
}

/// Zeroes the gradient where ReLU's output was zero.
fn relu_backward(output: &[f32], g: &mut [f32]) {
    for (g, &y) in g.iter_mut().zip(output) {
        // A select, not a branch: it vectorises.
        *g = if y > 0.0 { *g } else { 0.0 };
    }
}

/// `[A, B, P]` to `[B, A, P]`: swaps the two outer dimensions of planes of `p` values
/// (written in the output's order, so nothing is zeroed first).
fn swap_outer(src: &[f32], a: usize, b: usize, p: usize) -> Vec<f32> {
    let mut dst = Vec::with_capacity(src.len());
    for bi in 0..b {
        for ai in 0..a {
            dst.extend_from_slice(&src[(ai * b + bi) * p..][..p]);
        }
    }
    dst
}

#[cfg(test)]
mod tests;
