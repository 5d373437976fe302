//! Our own CPU kernels for a convolution block without batch norm: a KxK convolution
//! (stride 1, zero padding P) with bias, ReLU and an optional 2x2 max-pool, forward and
//! backward. `lenet` and `vgg-mini` are made of such blocks, and burn-flex's `conv2d` and
//! `max_pool2d` spend 3-10x the time of these kernels at their shapes
//! (docs/BENCHMARKS.md, "Step time").
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
    image: Vec<f32>,
    /// For every output value, the position `oy * (W+2P) + ox` of the convolution output it
    /// came from (where its patch starts in the padded image), or [`CUT`].
    route: Vec<u32>,
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
    let (mut out, mut route) = (vec![0f32; len], vec![CUT; len]);
    let part = shape.samples_per_part() * shape.sample_output_len();
    out.par_chunks_mut(part)
        .zip(route.par_chunks_mut(part))
        .enumerate()
        .for_each_init(Vec::new, |buffer, (i, (out, route))| {
            let first = i * shape.samples_per_part();
            let part = Part { first, out, route };
            forward_part(shape, &image, &weight, bias, part, buffer);
        });
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

/// The gradients of the block whose forward pass left `saved`, given the gradient of its
/// output and the weight it ran with; the input's gradient only with `need_input`.
///
/// # Panics
/// When a buffer's length does not match the block (a caller's bug).
pub fn backward(
    saved: &ConvSaved,
    weight: &[f32],
    output_grad: &[f32],
    need_input: bool,
) -> ConvGrads {
    let shape = &saved.shape;
    assert_eq!(output_grad.len(), saved.route.len(), "output gradient");
    assert_eq!(weight.len(), shape.weight_len(), "weight");
    let weight = taps_first(shape, weight);
    let (weight_taps, bias, input) = if shape.scatters_gradients() {
        let (dw, bias) = weight_grads(saved, output_grad);
        let input = need_input.then(|| input_grad(saved, &weight, output_grad));
        (dw, bias, input)
    } else {
        dense_backward(saved, &weight, output_grad, need_input)
    };
    ConvGrads {
        weight: taps_last(shape, &weight_taps),
        bias,
        input,
    }
}

/// The gradients (weight taps first, bias, input when asked) by GEMMs, a part of the
/// batch at a time ([`ConvShape::samples_per_part`], side by side): the output gradient
/// routed back onto the products `gY[positions, O]`, then `dW = gY^T x patches` and the
/// patches' gradient `gY x W` folded back onto the input. The parts' weight and bias
/// gradients are added in order.
fn dense_backward(
    saved: &ConvSaved,
    weight: &[f32],
    grad: &[f32],
    need_input: bool,
) -> (Vec<f32>, Vec<f32>, Option<Vec<f32>>) {
    let s = &saved.shape;
    let per = s.samples_per_part();
    let ranges: Vec<_> = (0..s.batch)
        .step_by(per)
        .map(|b| b..(b + per).min(s.batch))
        .collect();
    let mut dx = need_input.then(|| vec![0f32; s.input_len()]);
    let dx_parts: Vec<Option<&mut [f32]>> = match dx.as_mut() {
        Some(dx) => dx
            .chunks_mut(per * s.in_channels * s.height * s.width)
            .map(Some)
            .collect(),
        None => ranges.iter().map(|_| None).collect(),
    };
    let positions = positions_of_routes(s);
    let parts: Vec<_> = ranges
        .into_par_iter()
        .zip(dx_parts)
        .map(|(samples, dx)| {
            let gy = routed_products(saved, grad, samples.clone(), &positions);
            dense_part(saved, weight, &gy, samples, dx)
        })
        .collect();
    let (mut dw, mut bias) = (vec![0f32; s.weight_len()], vec![0f32; s.out_channels]);
    for (part_dw, part_bias) in parts {
        add(&mut dw, &part_dw);
        add(&mut bias, &part_bias);
    }
    (dw, bias, dx)
}

/// For every padded position a route may hold, the position `oy * OW + ox` in the
/// convolution's output.
fn positions_of_routes(s: &ConvShape) -> Vec<u32> {
    let (_, wp) = s.padded_hw();
    let (oh, ow) = s.conv_hw();
    let mut positions = vec![0u32; oh * wp];
    for (p, q) in positions.iter_mut().enumerate() {
        *q = ((p / wp) * ow + (p % wp).min(ow - 1)) as u32;
    }
    positions
}

/// The output gradient of `samples` routed back onto their products: `gY[positions, O]`
/// (zero where no output routes) and, per channel, the sum of the routed gradients.
fn routed_products(
    saved: &ConvSaved,
    grad: &[f32],
    samples: std::ops::Range<usize>,
    positions: &[u32],
) -> (Vec<f32>, Vec<f32>) {
    let s = &saved.shape;
    let o = s.out_channels;
    let (oh, ow) = s.conv_hw();
    let plane = s.sample_output_len() / o;
    let mut gy = vec![0f32; samples.len() * oh * ow * o];
    let mut bias = vec![0f32; o];
    for (j, b) in samples.enumerate() {
        let gy = &mut gy[j * oh * ow * o..][..oh * ow * o];
        for (oc, db) in bias.iter_mut().enumerate() {
            let at = (b * o + oc) * plane;
            let mut sum = 0f32;
            for (&r, &g) in saved.route[at..][..plane].iter().zip(&grad[at..][..plane]) {
                // Branch-free: a cut output adds zero at position 0.
                let routed = r != CUT;
                let g = if routed { g } else { 0.0 };
                let p = positions[if routed { r as usize } else { 0 }] as usize;
                gy[p * o + oc] += g;
                sum += g;
            }
            *db += sum;
        }
    }
    (gy, bias)
}

/// One part's weight (taps first) and bias gradients from its routed products `gy`, and
/// its samples' input gradient into `dx` when given.
fn dense_part(
    saved: &ConvSaved,
    weight: &[f32],
    (gy, bias): &(Vec<f32>, Vec<f32>),
    samples: std::ops::Range<usize>,
    dx: Option<&mut [f32]>,
) -> (Vec<f32>, Vec<f32>) {
    let s = &saved.shape;
    let (o, k) = (s.out_channels, s.patch_len());
    let rows = gy.len() / o;
    let mut patches = vec![0f32; rows * k];
    unfold(s, &saved.image, samples, &mut patches);
    let mut dw = vec![0f32; o * k];
    let lhs = Operand::columns(gy, o);
    product(o, k, rows, lhs, Operand::rows(&patches, k), &mut dw);
    if let Some(dx) = dx {
        let (lhs, rhs) = (Operand::rows(gy, o), Operand::rows(weight, k));
        product(rows, k, o, lhs, rhs, &mut patches);
        fold(s, &patches, dx);
    }
    (dw, bias.clone())
}

/// Adds the patches' gradient `[positions, K*K*C]` of consecutive samples onto their
/// input gradients `dx` (`[C, H, W]` each): the adjoint of [`unfold`].
fn fold(s: &ConvShape, patches: &[f32], dx: &mut [f32]) {
    let (_, wp) = s.padded_hw();
    let (oh, ow) = s.conv_hw();
    let run = s.kernel * s.in_channels;
    let mut image = vec![0f32; s.image_len()];
    let size = s.in_channels * s.height * s.width;
    let samples = patches.chunks_exact(oh * ow * s.patch_len());
    for (dx, patches) in dx.chunks_exact_mut(size).zip(samples) {
        image.fill(0.0);
        for (p, patch) in patches.chunks_exact(s.patch_len()).enumerate() {
            let first = ((p / ow) * wp + p % ow) * s.in_channels;
            for (ki, values) in patch.chunks_exact(run).enumerate() {
                add(&mut image[first + ki * wp * s.in_channels..][..run], values);
            }
        }
        channels_first(s, &image, dx);
    }
}

/// `y += x`.
fn add(y: &mut [f32], x: &[f32]) {
    for (y, x) in y.iter_mut().zip(x) {
        *y += x;
    }
}

/// The gradients of the weight (taps first, `[O, K, K, C]`) and of the bias, one output
/// channel per task, each summing over the batch in order.
fn weight_grads(saved: &ConvSaved, grad: &[f32]) -> (Vec<f32>, Vec<f32>) {
    let s = &saved.shape;
    let o = s.out_channels;
    let mut dw = vec![0f32; s.weight_len()];
    let mut bias = vec![0f32; o];
    let plane = s.sample_output_len() / o;
    dw.par_chunks_mut(s.patch_len())
        .zip(bias.par_iter_mut())
        .enumerate()
        .for_each(|(oc, (dw, db))| {
            for b in 0..s.batch {
                let at = (b * o + oc) * plane;
                let task = WeightGrad {
                    routes: Routes::new(s, &saved.route[at..][..plane], &grad[at..][..plane]),
                    image: &saved.image[b * s.image_len()..][..s.image_len()],
                    dw: &mut *dw,
                };
                *db += pulp::Arch::new().dispatch(task);
            }
        });
    (dw, bias)
}

/// The input's gradient, one sample per task: each routed output adds its gradient times
/// its channel's weight (taps first) onto its patch of a padded channels-last image, which
/// is then cropped into the sample's `[C, H, W]`.
fn input_grad(saved: &ConvSaved, weight: &[f32], grad: &[f32]) -> Vec<f32> {
    let s = &saved.shape;
    let o = s.out_channels;
    let plane = s.sample_output_len() / o;
    let mut dx = vec![0f32; s.input_len()];
    let size = s.in_channels * s.height * s.width;
    dx.par_chunks_mut(size)
        .enumerate()
        .for_each_init(Vec::new, |image, (b, dx)| {
            image.clear();
            image.resize(s.image_len(), 0f32);
            for (oc, w) in weight.chunks_exact(s.patch_len()).enumerate() {
                let at = (b * o + oc) * plane;
                pulp::Arch::new().dispatch(InputGrad {
                    routes: Routes::new(s, &saved.route[at..][..plane], &grad[at..][..plane]),
                    weight: w,
                    image: &mut image[..],
                });
            }
            channels_first(s, image, dx);
        });
    dx
}

/// The routes and gradients of one output plane, and where a patch lies in the padded
/// channels-last image: `K` runs of `run` values, `row` apart, the first at `route * C`.
struct Routes<'a> {
    route: &'a [u32],
    grad: &'a [f32],
    channels: usize,
    run: usize,
    row: usize,
    kernel: usize,
}

impl<'a> Routes<'a> {
    fn new(s: &ConvShape, route: &'a [u32], grad: &'a [f32]) -> Self {
        let c = s.in_channels;
        Routes {
            route,
            grad,
            channels: c,
            run: s.kernel * c,
            row: s.padded_hw().1 * c,
            kernel: s.kernel,
        }
    }
}

/// One output plane's share of its channel's weight gradient, `dw += g x patch` for each
/// routed output; the SIMD task returns the plane's share of the bias gradient.
struct WeightGrad<'a> {
    routes: Routes<'a>,
    image: &'a [f32],
    dw: &'a mut [f32],
}

impl pulp::WithSimd for WeightGrad<'_> {
    type Output = f32;

    #[inline(always)]
    fn with_simd<S: pulp::Simd>(self, _: S) -> f32 {
        let r = &self.routes;
        let mut sum = 0f32;
        for (&q, &g) in r.route.iter().zip(r.grad) {
            if q == CUT {
                continue;
            }
            sum += g;
            let mut from = q as usize * r.channels;
            for dw in self.dw.chunks_exact_mut(r.run).take(r.kernel) {
                axpy(g, &self.image[from..from + r.run], dw);
                from += r.row;
            }
        }
        sum
    }
}

/// One output plane's share of a sample's input gradient, `image[patch] += g x weight`
/// for each routed output.
struct InputGrad<'a> {
    routes: Routes<'a>,
    weight: &'a [f32],
    image: &'a mut [f32],
}

impl pulp::WithSimd for InputGrad<'_> {
    type Output = ();

    #[inline(always)]
    fn with_simd<S: pulp::Simd>(self, _: S) {
        let r = &self.routes;
        for (&q, &g) in r.route.iter().zip(r.grad) {
            if q == CUT {
                continue;
            }
            let mut to = q as usize * r.channels;
            for w in self.weight.chunks_exact(r.run).take(r.kernel) {
                axpy(g, w, &mut self.image[to..to + r.run]);
                to += r.row;
            }
        }
    }
}

/// `y += a * x`.
#[inline(always)]
fn axpy(a: f32, x: &[f32], y: &mut [f32]) {
    for (y, x) in y.iter_mut().zip(x) {
        *y += a * x;
    }
}

/// The input `[B, C, H, W]` as zero-padded channels-last images `[B, H+2P, W+2P, C]`.
fn channels_last(s: &ConvShape, x: &[f32]) -> Vec<f32> {
    let (c, h, w, p) = (s.in_channels, s.height, s.width, s.padding);
    let (_, wp) = s.padded_hw();
    let mut image = vec![0f32; s.batch * s.image_len()];
    image
        .par_chunks_mut(s.image_len())
        .zip(x.par_chunks(c * h * w))
        .for_each(|(image, x)| {
            for (ci, plane) in x.chunks_exact(h * w).enumerate() {
                for (y, line) in plane.chunks_exact(w).enumerate() {
                    let row = &mut image[((y + p) * wp + p) * c..][..w * c];
                    for (dst, v) in row.iter_mut().skip(ci).step_by(c).zip(line) {
                        *dst = *v;
                    }
                }
            }
        });
    image
}

/// One sample's `[C, H, W]` from its padded channels-last image (the padding dropped).
fn channels_first(s: &ConvShape, image: &[f32], x: &mut [f32]) {
    let (c, h, w, p) = (s.in_channels, s.height, s.width, s.padding);
    let (_, wp) = s.padded_hw();
    for (ci, plane) in x.chunks_exact_mut(h * w).enumerate() {
        for (y, line) in plane.chunks_exact_mut(w).enumerate() {
            let row = &image[((y + p) * wp + p) * c..][..w * c];
            for (dst, v) in line.iter_mut().zip(row.iter().skip(ci).step_by(c)) {
                *dst = *v;
            }
        }
    }
}

/// The weight `[O, C, K, K]` as `[O, K, K, C]`, the order of a patch.
fn taps_first(s: &ConvShape, weight: &[f32]) -> Vec<f32> {
    let k2 = s.kernel * s.kernel;
    transpose_each(weight, s.in_channels, k2)
}

/// The inverse of [`taps_first`].
fn taps_last(s: &ConvShape, weight: &[f32]) -> Vec<f32> {
    let k2 = s.kernel * s.kernel;
    transpose_each(weight, k2, s.in_channels)
}

/// Transposes each `rows x cols` matrix of `m` (row-major, one after the other).
fn transpose_each(m: &[f32], rows: usize, cols: usize) -> Vec<f32> {
    let mut t = vec![0f32; m.len()];
    for (src, dst) in m
        .chunks_exact(rows * cols)
        .zip(t.chunks_exact_mut(rows * cols))
    {
        transpose_into(src, rows, cols, dst);
    }
    t
}

/// Writes the transpose of the row-major `rows x cols` matrix `m` into `t`, in `t`'s order.
fn transpose_into<T: Copy>(m: &[T], rows: usize, cols: usize, t: &mut [T]) {
    for (j, line) in t.chunks_exact_mut(rows).take(cols).enumerate() {
        for (r, v) in line.iter_mut().enumerate() {
            *v = m[r * cols + j];
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
