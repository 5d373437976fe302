//! Our own CPU kernels for ResNet's batch-normalised layers, forward (training and
//! inference) and backward: the stem (convolution without bias, batch norm, ReLU) and He
//! et al.'s basic block (two 3x3 convolutions with batch norm, the first possibly strided,
//! and an option-A shortcut: the input subsampled and zero-padded to the new channels).
//!
//! Between layers images are `[B, C, H, W]`; inside a layer they stay in the padded
//! channels-last layout of [`Grid`], where convolutions read their patches in place
//! ([`GridConv`]) and batch norm, ReLU and the shortcut work pixel by pixel over every
//! channel. Every sum runs in a fixed order, so results do not depend on the thread count.

pub use super::batch_norm::Running;
use super::batch_norm::{self, BatchStats, BnSaved, Then};
use super::grid::Grid;
pub use super::grid::GridImages;
pub use super::grid_conv::GridConv;
use super::pool;
use rayon::prelude::*;

/// One convolution without bias followed by batch norm.
pub type ConvBn = GridConv;

/// A layer these kernels run, with the geometry of its input.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ResidualShape {
    /// Convolution, batch norm, ReLU. Parameters: weight, gamma, beta.
    Stem(ConvBn),
    /// The basic block. Parameters: weight, gamma, beta of each convolution in turn.
    Basic {
        /// The first convolution (3x3, padding 1, the block's stride), on the input.
        first: ConvBn,
        /// The second (3x3, stride 1, padding 1), on the first's output.
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
        Self::Stem(ConvBn {
            input: Grid::of_dims(input),
            out_channels,
            kernel,
            stride,
            padding,
        })
    }

    /// A basic block with `out_channels` and `stride` on `[B, C, H, W]` inputs.
    pub fn basic(input: [usize; 4], out_channels: usize, stride: usize) -> Self {
        let first = ConvBn {
            input: Grid::of_dims(input),
            out_channels,
            kernel: 3,
            stride,
            padding: 1,
        };
        let second = ConvBn {
            input: first.output(),
            stride: 1,
            ..first
        };
        Self::Basic { first, second }
    }

    /// Whether the kernels can run this layer: non-empty, the kernels fit, padding at most
    /// 1, and a block's shortcut can pad its input's channels up to its output's.
    pub fn is_valid(&self) -> bool {
        match self {
            Self::Stem(c) => c.is_valid(),
            Self::Basic { first, second } => {
                first.is_valid() && second.is_valid() && first.out_channels >= first.input.channels
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

    /// The first convolution (whose input is the layer's).
    fn first(&self) -> ConvBn {
        self.convs()[0]
    }

    /// The last convolution (whose output is the layer's).
    fn last(&self) -> ConvBn {
        match *self {
            Self::Stem(c) => c,
            Self::Basic { second, .. } => second,
        }
    }

    /// Dimensions `[B, C, H, W]` of the layer's input.
    pub fn input_dims(&self) -> [usize; 4] {
        self.first().input.dims()
    }

    /// Dimensions `[B, O, H', W']` of the layer's output.
    pub fn output_dims(&self) -> [usize; 4] {
        let g = self.last().output();
        [g.batch, g.channels, g.height, g.width]
    }

    /// Parameter tensors the layer takes (weight, gamma, beta per convolution).
    pub fn param_count(&self) -> usize {
        3 * self.convs().len()
    }
}

/// What a training forward pass keeps for the backward pass.
pub struct ResidualSaved {
    shape: ResidualShape,
    /// The layer's input.
    input: GridImages,
    /// Per convolution, its batch norm's normalised values.
    norms: Vec<BnSaved>,
    /// A block's hidden activation after its ReLU (the second convolution's input).
    hidden: Vec<f32>,
    /// The layer's output after its ReLU.
    output: GridImages,
}

impl Drop for ResidualSaved {
    /// Gives the hidden activation back to the pool.
    fn drop(&mut self) {
        pool::give_back(std::mem::take(&mut self.hidden));
    }
}

impl ResidualSaved {
    /// Dimensions `[B, C, H, W]` of the layer's input.
    pub fn input_dims(&self) -> [usize; 4] {
        self.shape.input_dims()
    }

    /// Dimensions `[B, O, H', W']` of the layer's output.
    pub fn output_dims(&self) -> [usize; 4] {
        self.shape.output_dims()
    }
}

/// The result of a forward pass.
pub struct Forward {
    /// The output.
    pub output: GridImages,
    /// What backward needs (training only).
    pub saved: Option<ResidualSaved>,
    /// Each batch norm's batch statistics (training only), for the running estimates.
    pub stats: Vec<BatchStats>,
}

/// Runs the layer on `input` with its parameters in order: in training
/// mode (`running` none: batch statistics, keeps what backward needs) or in inference mode
/// with each batch norm's running statistics.
///
/// # Panics
/// When a buffer's length does not match the shape (a caller's bug, not an input error).
pub fn forward(
    shape: &ResidualShape,
    input: &GridImages,
    params: &[&[f32]],
    running: Option<&[Running]>,
) -> Forward {
    assert!(shape.is_valid(), "invalid residual layer {shape:?}");
    assert_eq!(params.len(), shape.param_count(), "parameters of {shape:?}");
    assert_eq!(input.grid, shape.first().input, "input of {shape:?}");
    let x = &input.values;
    let mut norms = Vec::new();
    let mut stats = Vec::new();
    let mut conv = |i: usize, c: &ConvBn, x: &[f32], then: Then| {
        let params = &params[3 * i..3 * i + 3];
        let (y, kept) = conv_bn(c, x, params, running.map(|r| r[i]), then);
        if let Some((bn, batch)) = kept {
            norms.push(bn);
            stats.push(batch);
        }
        y
    };
    let (hidden, output) = match shape {
        ResidualShape::Stem(c) => {
            let y = conv(0, c, x, RELU);
            (Vec::new(), y)
        }
        ResidualShape::Basic { first, second } => {
            let hidden = conv(0, first, x, RELU);
            let y = if identity(first) {
                let then = Then {
                    residual: Some(x),
                    relu: true,
                };
                conv(1, second, &hidden, then)
            } else {
                let mut y = conv(1, second, &hidden, Then::default());
                add_shortcut(first, x, &mut y);
                relu(&mut y);
                y
            };
            (hidden, y)
        }
    };
    let out = GridImages::new(shape.last().output(), output);
    let saved = running.is_none().then(|| ResidualSaved {
        shape: *shape,
        input: input.clone(),
        norms,
        hidden,
        output: out.clone(),
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
    /// Of the input, when asked for.
    pub input: Option<GridImages>,
}

/// The gradients of the layer whose training forward left `saved`, given its output's
/// gradient and the parameters it ran with; the input's gradient only
/// with `need_input`.
///
/// # Panics
/// When a buffer's length does not match the layer (a caller's bug).
pub fn backward(
    saved: &ResidualSaved,
    params: &[&[f32]],
    output_grad: GridImages,
    need_input: bool,
) -> ResidualGrads {
    let shape = &saved.shape;
    assert_eq!(output_grad.grid, shape.last().output(), "output gradient");
    assert_eq!(params.len(), shape.param_count(), "parameters");
    let mut g = output_grad.into_values();
    relu_backward(&saved.output.values, &mut g);
    let (params, input) = match *shape {
        ResidualShape::Stem(c) => {
            let grads = conv_bn_backward(
                &c,
                &saved.input.values,
                &saved.norms[0],
                params,
                &g,
                need_input,
            );
            (vec![grads.weight, grads.gamma, grads.beta], grads.input)
        }
        ResidualShape::Basic { first, second } => {
            let p2 = &params[3..6];
            let second = conv_bn_backward(&second, &saved.hidden, &saved.norms[1], p2, &g, true);
            let mut hidden = second.input.unwrap_or_default();
            relu_backward(&saved.hidden, &mut hidden);
            let x = &saved.input.values;
            let first = conv_bn_backward(&first, x, &saved.norms[0], params, &hidden, need_input);
            let input = first.input.map(|mut dx| {
                shortcut_backward(&shape.first(), &g, &mut dx);
                dx
            });
            pool::give_back(hidden);
            let grads = vec![
                first.weight,
                first.gamma,
                first.beta,
                second.weight,
                second.gamma,
                second.beta,
            ];
            (grads, input)
        }
    };
    pool::give_back(g);
    ResidualGrads {
        params,
        input: input.map(|dx| GridImages::new(shape.first().input, dx)),
    }
}

/// Batch norm's epilogue of the stem and of a block's first convolution.
const RELU: Then = Then {
    residual: None,
    relu: true,
};

/// Whether the block's shortcut is its input as it is (stride 1, as many channels out as
/// in): then batch norm adds it in its own pass.
fn identity(first: &ConvBn) -> bool {
    first.stride == 1 && first.out_channels == first.input.channels
}

/// Convolution then batch norm (then what `then` says, in batch norm's pass): the output
/// (grid layout, zero at the pads) and, in training mode, the batch norm's saved values
/// and batch statistics.
fn conv_bn(
    c: &ConvBn,
    x: &[f32],
    params: &[&[f32]],
    running: Option<Running>,
    then: Then,
) -> (Vec<f32>, Option<(BnSaved, BatchStats)>) {
    let (weight, gamma, beta) = (params[0], params[1], params[2]);
    assert_eq!(weight.len(), c.weight_len(), "weight of {c:?}");
    assert!(
        gamma.len() == c.out_channels && beta.len() == c.out_channels,
        "batch norm of {c:?}"
    );
    let z = c.forward(weight, x);
    let grid = c.output();
    match running {
        Some(r) => (
            batch_norm::forward_eval(&grid, z, gamma, beta, r, then),
            None,
        ),
        None => {
            let (y, bn, stats) = batch_norm::forward_train(&grid, z, gamma, beta, then);
            (y, Some((bn, stats)))
        }
    }
}

/// The gradients of a convolution with batch norm.
struct ConvBnGrads {
    weight: Vec<f32>,
    gamma: Vec<f32>,
    beta: Vec<f32>,
    /// In the grid layout, when asked for.
    input: Option<Vec<f32>>,
}

/// Backward of [`conv_bn`] on input `x` given the gradient `g` of its output and its
/// parameters (weight, gamma, beta first in `params`).
fn conv_bn_backward(
    c: &ConvBn,
    x: &[f32],
    bn: &BnSaved,
    params: &[&[f32]],
    g: &[f32],
    need_input: bool,
) -> ConvBnGrads {
    let (weight, gamma) = (params[0], params[1]);
    let grads = batch_norm::backward(&c.output(), bn, gamma, g);
    let dz = grads.input;
    let conv_grads = ConvBnGrads {
        weight: c.weight_grad(x, &dz),
        gamma: grads.gamma,
        beta: grads.beta,
        input: need_input.then(|| c.input_grad(weight, &dz)),
    };
    pool::give_back(dz);
    conv_grads
}

/// Adds the option-A shortcut of the block's input `x` to `y` (both grids): `x`
/// subsampled by the stride, its channels centred among the output's (`(O - C) / 2` zero
/// channels before them). Samples in parallel.
fn add_shortcut(first: &ConvBn, x: &[f32], y: &mut [f32]) {
    let (inp, out) = (first.input, first.output());
    let c = inp.channels;
    out.samples_mut(y).zip(inp.samples(x)).for_each(|(y, x)| {
        for (src, dst) in shortcut_pixels(first) {
            let add = y[dst..][..c].iter_mut().zip(&x[src..][..c]);
            add.for_each(|(o, v)| *o += v);
        }
    });
}

/// Adds the input's gradient through the shortcut, from the output's `g`, to `dx`.
fn shortcut_backward(first: &ConvBn, g: &[f32], dx: &mut [f32]) {
    if identity(first) {
        dx.par_chunks_mut(PASS_CHUNK)
            .zip(g.par_chunks(PASS_CHUNK))
            .for_each(|(dx, g)| dx.iter_mut().zip(g).for_each(|(d, v)| *d += v));
        return;
    }
    let (inp, out) = (first.input, first.output());
    let c = inp.channels;
    inp.samples_mut(dx).zip(out.samples(g)).for_each(|(dx, g)| {
        for (src, dst) in shortcut_pixels(first) {
            let add = dx[src..][..c].iter_mut().zip(&g[dst..][..c]);
            add.for_each(|(d, v)| *d += v);
        }
    });
}

/// For every output pixel of one sample, the offsets (within the samples' parts, see
/// [`Grid::samples`]) of the input pixel the shortcut connects it to and of the output's
/// channel `(O - C) / 2`.
fn shortcut_pixels(first: &ConvBn) -> impl Iterator<Item = (usize, usize)> {
    let (inp, out) = (first.input, first.output());
    let (c, o, s) = (inp.channels, out.channels, first.stride);
    let before = (o - c) / 2;
    (0..out.height).flat_map(move |oy| {
        (0..out.width).map(move |ox| {
            let src = s * (oy * inp.row() + ox) * c;
            let dst = (oy * out.row() + ox) * o + before;
            (src, dst)
        })
    })
}

/// Values per task of the element-wise passes.
const PASS_CHUNK: usize = 1 << 14;

/// ReLU in place.
fn relu(v: &mut [f32]) {
    v.par_chunks_mut(PASS_CHUNK)
        .for_each(|v| v.iter_mut().for_each(|x| *x = x.max(0.0)));
}

/// Zeroes the gradient where ReLU's output was zero.
fn relu_backward(output: &[f32], g: &mut [f32]) {
    g.par_chunks_mut(PASS_CHUNK)
        .zip(output.par_chunks(PASS_CHUNK))
        .for_each(|(g, output)| {
            for (g, &y) in g.iter_mut().zip(output) {
                // A select, not a branch: it vectorises.
                *g = if y > 0.0 { *g } else { 0.0 };
            }
        });
}

#[cfg(test)]
mod tests;
