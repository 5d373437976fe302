//! Our own CPU kernels for a convolution block without batch norm: a KxK convolution
//! (stride 1, zero padding P) with bias, ReLU and an optional 2x2 max-pool, forward and
//! backward. `lenet` and `vgg-mini` are made of such blocks, and burn-flex's `conv2d` and
//! `max_pool2d` spend 3-10x the time of these kernels at their shapes
//! (docs/BENCHMARKS.md, "ResNet-20 and LeNet steps vs PyTorch on the CPU").
//!
//! The method: the input is copied once to a zero-padded channels-last image
//! `[B, H+2P, W+2P, C]`, where one kernel row of a patch is `K*C` contiguous values.
//!
//! - forward, a part of the batch at a time (small enough to stay in the core's cache):
//!   the part's patches `[positions, K*K*C]` (whole rows copied from the image), one GEMM
//!   `Y[positions, O] = patches x W^T` that reads them in place, then bias, ReLU and pool in
//!   one pass over `Y`, which records for every output the position it came from (its
//!   *route*; none where ReLU cut it);
//! - backward: only routed outputs carry a gradient (a quarter or less of the positions
//!   under the pool), so each is scattered on its own: `dW[o] += g x patch` and
//!   `dx[patch] += g x W[o]`, `K` contiguous runs of `K*C` values each. The weight's
//!   gradient is split by output channel and the input's by sample, so every sum runs in
//!   a fixed order whatever the thread count and results are deterministic.

use rayon::prelude::*;

use super::gemm::{product, Operand};
use super::spare::Lease;
use layout::{channels_last, taps_first, transpose_into};

mod backward;
mod layout;

pub use backward::backward;

/// No route: the output is zero (ReLU) and passes no gradient.
const CUT: u32 = u32::MAX;

/// Patches shorter than this have their gradients computed by dense GEMMs even under the
/// pool (see [`ConvShape::scatters_gradients`]).
const SCATTER_PATCH: usize = 16;

/// Bytes of patches unfolded at a time: a part's patches and products stay in the core's
/// L2 cache (1 MiB here) from the unfolding to the pooling.
const PART_BYTES: usize = 512 << 10;
/// The geometry of one block.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ConvShape {
    /// Samples in the batch.
    pub batch: usize,
    /// Input channels.
    pub in_channels: usize,
    /// Input height.
    pub height: usize,
    /// Input width.
    pub width: usize,
    /// Output channels.
    pub out_channels: usize,
    /// Kernel side.
    pub kernel: usize,
    /// Zero padding on every side.
    pub padding: usize,
    /// Whether a 2x2, stride-2 max-pool follows the ReLU.
    pub pool: bool,
}

impl ConvShape {
    /// Height and width of the convolution's output.
    pub fn conv_hw(&self) -> (usize, usize) {
        (
            self.height + 2 * self.padding + 1 - self.kernel,
            self.width + 2 * self.padding + 1 - self.kernel,
        )
    }

    /// Dimensions `[B, O, H', W']` of the block's output (after the pool, if any).
    pub fn output_dims(&self) -> [usize; 4] {
        let (h, w) = self.conv_hw();
        let (h, w) = if self.pool { (h / 2, w / 2) } else { (h, w) };
        [self.batch, self.out_channels, h, w]
    }

    /// Values in the input.
    pub fn input_len(&self) -> usize {
        self.batch * self.in_channels * self.height * self.width
    }

    /// Values in the weight `[O, C, K, K]`.
    pub fn weight_len(&self) -> usize {
        self.out_channels * self.patch_len()
    }

    /// Values in one patch: `K*K*C`, ordered (kernel row, kernel column, channel).
    fn patch_len(&self) -> usize {
        self.in_channels * self.kernel * self.kernel
    }

    /// Height and width of the zero-padded input.
    fn padded_hw(&self) -> (usize, usize) {
        (
            self.height + 2 * self.padding,
            self.width + 2 * self.padding,
        )
    }

    /// Values in one sample's padded channels-last image.
    fn image_len(&self) -> usize {
        let (h, w) = self.padded_hw();
        h * w * self.in_channels
    }

    /// Values in one sample's output.
    fn sample_output_len(&self) -> usize {
        let [_, o, h, w] = self.output_dims();
        o * h * w
    }

    /// Whether the backward pass scatters each routed output's gradient on its own (under
    /// the pool, where at most a quarter of the positions carry one, and patches long
    /// enough for vectors) rather than run dense GEMMs.
    fn scatters_gradients(&self) -> bool {
        self.pool && self.patch_len() >= SCATTER_PATCH
    }

    /// Samples whose patches fit in [`PART_BYTES`] (at least one).
    fn samples_per_part(&self) -> usize {
        let (h, w) = self.conv_hw();
        let bytes = h * w * self.patch_len() * std::mem::size_of::<f32>();
        (PART_BYTES / bytes.max(1)).clamp(1, self.batch.max(1))
    }

    /// Values in a part's patches and products (see [`forward_part`]).
    fn part_scratch_len(&self) -> usize {
        let (h, w) = self.conv_hw();
        self.samples_per_part() * h * w * (self.patch_len() + self.out_channels)
    }

    /// Whether the kernels can run this block (non-empty, the kernel fits, the pool has a
    /// window, and a sample's positions fit in a route).
    pub fn is_valid(&self) -> bool {
        self.batch > 0
            && self.in_channels > 0
            && self.out_channels > 0
            && self.kernel > 0
            && self.height + 2 * self.padding >= self.kernel
            && self.width + 2 * self.padding >= self.kernel
            && (!self.pool || self.conv_hw().0 >= 2 && self.conv_hw().1 >= 2)
            && self.conv_hw().0 * self.conv_hw().1 < CUT as usize
    }
}

/// What the forward pass keeps for the backward pass.
pub struct ConvSaved {
    shape: ConvShape,
    /// The input as zero-padded channels-last images, `[B, H+2P, W+2P, C]`.
    image: Lease<f32>,
    /// For every output value, the position `oy * (W+2P) + ox` of the convolution output it
    /// came from (where its patch starts in the padded image), or [`CUT`].
    route: Lease<u32>,
}

impl ConvSaved {
    /// Dimensions `[B, C, H, W]` of the block's input.
    pub fn input_dims(&self) -> [usize; 4] {
        let s = &self.shape;
        [s.batch, s.in_channels, s.height, s.width]
    }
}

/// The gradients of one block.
pub struct ConvGrads {
    /// Of the weight, `[O, C, K, K]`.
    pub weight: Vec<f32>,
    /// Of the bias, `[O]`.
    pub bias: Vec<f32>,
    /// Of the input, `[B, C, H, W]`, when asked for.
    pub input: Option<Vec<f32>>,
}

/// Runs the block on `input` (`[B, C, H, W]`); returns the output (`output_dims`) and, with
/// `keep`, what the backward pass needs.
///
/// # Panics
/// When a buffer's length does not match `shape` (a caller's bug, not an input error).
pub fn forward(
    shape: &ConvShape,
    input: &[f32],
    weight: &[f32],
    bias: &[f32],
    keep: bool,
) -> (Vec<f32>, Option<ConvSaved>) {
    assert!(shape.is_valid(), "invalid convolution block {shape:?}");
    assert_eq!(input.len(), shape.input_len(), "input of {shape:?}");
    assert_eq!(weight.len(), shape.weight_len(), "weight of {shape:?}");
    assert_eq!(bias.len(), shape.out_channels, "bias of {shape:?}");
    let image = channels_last(shape, input);
    let weight = taps_first(shape, weight);
    let len = shape.batch * shape.sample_output_len();
    let (mut out, mut route) = (vec![0f32; len], Lease::filled(len, CUT));
    let part = shape.samples_per_part() * shape.sample_output_len();
    let scratch = shape.part_scratch_len();
    out.par_chunks_mut(part)
        .zip(route.par_chunks_mut(part))
        .enumerate()
        .for_each_init(
            || Lease::reused(scratch),
            |buffer, (i, (out, route))| {
                let first = i * shape.samples_per_part();
                let part = Part { first, out, route };
                forward_part(shape, &image, &weight, bias, part, buffer);
            },
        );
    let saved = keep.then_some(ConvSaved {
        shape: *shape,
        image,
        route,
    });
    (out, saved)
}

/// The outputs and routes of the samples from `first` on (as many as `out` holds).
struct Part<'a> {
    first: usize,
    out: &'a mut [f32],
    route: &'a mut [u32],
}

/// Runs the block on one part of the batch; `buffer` holds its patches and products.
fn forward_part(
    s: &ConvShape,
    image: &[f32],
    weight: &[f32],
    bias: &[f32],
    part: Part,
    buffer: &mut Vec<f32>,
) {
    let per_sample = s.sample_output_len();
    let samples = part.out.len() / per_sample;
    let (oh, ow) = s.conv_hw();
    let positions = oh * ow;
    let rows = samples * positions;
    buffer.resize(rows * (s.patch_len() + s.out_channels), 0.0);
    let (patches, y) = buffer.split_at_mut(rows * s.patch_len());
    unfold(s, image, part.first..part.first + samples, patches);
    let k = s.patch_len();
    let (lhs, rhs) = (Operand::rows(patches, k), Operand::columns(weight, k));
    product(rows, s.out_channels, k, lhs, rhs, y);
    let outputs = part.out.chunks_exact_mut(per_sample);
    let routes = part.route.chunks_exact_mut(per_sample);
    let products = y.chunks_exact(positions * s.out_channels);
    for ((y, out), route) in products.zip(outputs).zip(routes) {
        bias_relu_pool(s, y, bias, out, route);
    }
}

/// Writes the patches of `samples`, one row `[K, K, C]` per output position, every value
/// of `patches` (padding comes from the padded image).
fn unfold(s: &ConvShape, image: &[f32], samples: std::ops::Range<usize>, patches: &mut [f32]) {
    let (_, wp) = s.padded_hw();
    let (oh, ow) = s.conv_hw();
    let c = s.in_channels;
    let run = s.kernel * c;
    let size = s.image_len();
    let mut rows = patches.chunks_exact_mut(s.patch_len());
    for b in samples {
        let img = &image[b * size..][..size];
        for (p, row) in (0..oh * ow).zip(rows.by_ref()) {
            let (oy, ox) = (p / ow, p % ow);
            for (ki, dst) in row.chunks_exact_mut(run).enumerate() {
                dst.copy_from_slice(&img[((oy + ki) * wp + ox) * c..][..run]);
            }
        }
    }
}

/// Adds the bias, applies ReLU and the pool to one sample's product `Y[OH*OW, O]` into its
/// output `[O, H', W']`, recording each output's route: one output position at a time,
/// every channel at once (into `best` and `from`, `[H'*W', O]`), then transposed into the
/// channels' planes (stores one position apart in every plane at once would hit the same
/// cache set where a plane is 4 KiB).
fn bias_relu_pool(s: &ConvShape, y: &[f32], bias: &[f32], out: &mut [f32], route: &mut [u32]) {
    let [_, o, ph, pw] = s.output_dims();
    let plane = ph * pw;
    let (mut best, mut from) = (vec![0f32; plane * o], vec![0u32; plane * o]);
    pulp::Arch::new().dispatch(Pool {
        shape: s,
        y,
        bias,
        best: &mut best,
        from: &mut from,
    });
    transpose_into(&best, plane, o, out);
    transpose_into(&from, plane, o, route);
}

/// The SIMD task of [`bias_relu_pool`] before the transpose: `best` and `from` are
/// `[H'*W', O]`.
struct Pool<'a> {
    shape: &'a ConvShape,
    y: &'a [f32],
    bias: &'a [f32],
    best: &'a mut [f32],
    from: &'a mut [u32],
}

impl pulp::WithSimd for Pool<'_> {
    type Output = ();

    #[inline(always)]
    fn with_simd<S: pulp::Simd>(self, _: S) {
        let s = self.shape;
        let (_, ow) = s.conv_hw();
        let (_, wp) = s.padded_hw();
        let [_, o, _, pw] = s.output_dims();
        let row = |p: usize| &self.y[p * o..][..o];
        let outputs = self
            .best
            .chunks_exact_mut(o)
            .zip(self.from.chunks_exact_mut(o));
        for (at, (best, from)) in outputs.enumerate() {
            let (py, px) = (at / pw, at % pw);
            let window = if s.pool {
                let top = 2 * py * ow + 2 * px;
                Window {
                    rows: [row(top), row(top + 1), row(top + ow), row(top + ow + 1)],
                    corner: (2 * (py * wp + px)) as u32,
                    below: wp as u32,
                }
            } else {
                Window {
                    rows: [row(at); 4],
                    corner: (py * wp + px) as u32,
                    below: 0,
                }
            };
            emit(window, self.bias, best, from);
        }
    }
}

/// The products of one pool window, every channel (four times the same row without the
/// pool), and the padded position of its top-left corner and of the row below.
struct Window<'a> {
    rows: [&'a [f32]; 4],
    corner: u32,
    below: u32,
}

/// ReLU(max of a window + bias) and its route for every channel, vectorised over the
/// channels.
#[inline(always)]
fn emit(window: Window, bias: &[f32], best: &mut [f32], from: &mut [u32]) {
    let [r0, r1, r2, r3] = window.rows;
    let (corner, below) = (window.corner, window.below);
    let values = r0.iter().zip(r1).zip(r2.iter().zip(r3)).zip(bias);
    for ((((&a, &b), (&c, &d)), &bo), (best, from)) in values.zip(best.iter_mut().zip(from)) {
        let m = a.max(b).max(c.max(d));
        // The first maximum in row-major window order, as burn's max-pool (selects, not
        // branches: which element wins is data).
        let at = if a == m {
            0
        } else if b == m {
            1
        } else if c == m {
            below
        } else {
            below.wrapping_add(1)
        };
        let v = m + bo;
        *best = v.max(0.0);
        *from = if v > 0.0 {
            corner.wrapping_add(at)
        } else {
            CUT
        };
    }
}

#[cfg(test)]
mod tests;
