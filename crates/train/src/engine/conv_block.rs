//! Our own CPU kernels for a convolution block without batch norm: a KxK convolution
//! (stride 1, zero padding P) with bias, ReLU and an optional 2x2 max-pool, forward and
//! backward. `lenet` and `vgg-mini` are made of such blocks, and burn-flex's `conv2d` and
//! `max_pool2d` spend 3-10x the time of these kernels at their shapes
//! (docs/BENCHMARKS.md, "Step time").
//!
//! The method: the batch is unfolded once into a column matrix `cols` of shape
//! `[C*K*K, B*OH*OW]` (im2col, the batch side by side), so each pass is one large GEMM:
//!
//! - forward: `Y[O, B*OH*OW] = W[O, C*K*K] x cols`; bias, ReLU, pooling and the transpose
//!   back to `[B, O, PH, PW]` are one pass over `Y`, which records for every output the
//!   element of `Y` it came from (its *route*; none where ReLU cut it);
//! - backward: the output gradient is routed back into `gY[O, B*OH*OW]`; then
//!   `dW = gY x cols^T`, `db = row sums of gY` and, when the input needs a gradient,
//!   `dx = col2im(W^T x gY)`.
//!
//! Every sum runs in a fixed order whatever the thread count, so results are deterministic.

use super::gemm::ConvGemm;
use super::unfold::{im2col, Layout, Unfold};

/// No route: the output is zero (ReLU) and passes no gradient.
const CUT: u32 = u32::MAX;

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

    /// The unfolding of the block's input for its GEMM.
    fn unfold(&self) -> Unfold {
        Unfold {
            batch: self.batch,
            channels: self.in_channels,
            height: self.height,
            width: self.width,
            kernel: self.kernel,
            stride: 1,
            padding: self.padding,
            layout: Layout::SampleMajor,
        }
    }

    /// The block's convolution as GEMMs.
    fn gemm(&self) -> ConvGemm {
        ConvGemm {
            out_channels: self.out_channels,
            rows: self.patch_len(),
            columns: self.columns(),
            parallel: true,
        }
    }

    /// Rows of the column matrix: one per (channel, kernel row, kernel column).
    fn patch_len(&self) -> usize {
        self.in_channels * self.kernel * self.kernel
    }

    /// Columns of the column matrix: one per (sample, output position).
    fn columns(&self) -> usize {
        let (h, w) = self.conv_hw();
        self.batch * h * w
    }

    /// Whether the kernels can run this block (non-empty, the kernel fits, the pool has a
    /// window, and routes fit in 32 bits).
    pub fn is_valid(&self) -> bool {
        self.batch > 0
            && self.in_channels > 0
            && self.out_channels > 0
            && self.kernel > 0
            && self.height + 2 * self.padding >= self.kernel
            && self.width + 2 * self.padding >= self.kernel
            && (!self.pool || self.conv_hw().0 >= 2 && self.conv_hw().1 >= 2)
            && self.out_channels * self.columns() < CUT as usize
    }
}

/// What the forward pass keeps for the backward pass.
pub struct ConvSaved {
    shape: ConvShape,
    /// The unfolded input, `[C*K*K, B*OH*OW]`.
    cols: Vec<f32>,
    /// For every output value, the index in `Y` it came from, or [`CUT`].
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
    let cols = im2col(&shape.unfold(), input);
    let y = shape.gemm().forward(weight, &cols);
    let (out, route) = bias_relu_pool(shape, &y, bias);
    let saved = keep.then_some(ConvSaved {
        shape: *shape,
        cols,
        route,
    });
    (out, saved)
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
    let (n, o) = (shape.columns(), shape.out_channels);
    // Route the output gradient back onto Y; the bias gradient sums what passed, per channel.
    let mut gy = vec![0f32; o * n];
    let mut bias = vec![0f32; o];
    let plane = saved.route.len() / (shape.batch * o);
    let planes = saved
        .route
        .chunks_exact(plane)
        .zip(output_grad.chunks_exact(plane));
    // Planes are [B, O] in order: plane i belongs to channel i % O.
    for (i, (routes, grads)) in planes.enumerate() {
        let mut sum = 0f32;
        for (&r, &g) in routes.iter().zip(grads) {
            if r != CUT {
                gy[r as usize] += g;
                sum += g;
            }
        }
        bias[i % o] += sum;
    }
    let gemm = shape.gemm();
    let dw = gemm.weight_grad(&gy, &saved.cols);
    let input = need_input.then(|| gemm.input_grad(&shape.unfold(), weight, &gy));
    ConvGrads {
        weight: dw,
        bias,
        input,
    }
}

/// Adds the bias, applies ReLU and the pool, and transposes `Y[O, B, OH, OW]` into the
/// output `[B, O, H', W']`, recording each output's route. Branch-free inner loops: which
/// element wins a window is data, and mispredicted branches cost more than the arithmetic.
fn bias_relu_pool(s: &ConvShape, y: &[f32], bias: &[f32]) -> (Vec<f32>, Vec<u32>) {
    let (oh, ow) = s.conv_hw();
    let [_, _, ph, pw] = s.output_dims();
    let n = s.columns();
    let len = s.batch * s.out_channels * ph * pw;
    let mut out = vec![0f32; len];
    let mut route = vec![CUT; len];
    for b in 0..s.batch {
        for (o, &bo) in bias.iter().enumerate() {
            let base = o * n + b * oh * ow;
            let plane = &y[base..][..oh * ow];
            let at = (b * s.out_channels + o) * ph * pw;
            let out = &mut out[at..][..ph * pw];
            let route = &mut route[at..][..ph * pw];
            let rows = out.chunks_exact_mut(pw).zip(route.chunks_exact_mut(pw));
            for (py, (out, route)) in rows.enumerate() {
                if s.pool {
                    let top = 2 * py * ow;
                    let row0 = &plane[top..][..2 * pw];
                    let row1 = &plane[top + ow..][..2 * pw];
                    let windows = row0.chunks_exact(2).zip(row1.chunks_exact(2));
                    for (px, ((r0, r1), (out, route))) in windows
                        .zip(out.iter_mut().zip(route.iter_mut()))
                        .enumerate()
                    {
                        let (a, b, c, d) = (r0[0], r0[1], r1[0], r1[1]);
                        let m = a.max(b).max(c.max(d));
                        // The first maximum in row-major window order, as burn's max-pool,
                        // without branches: k = 0..3 is the first of a, b, c, d equal to m.
                        let not = |v: f32| usize::from(v != m);
                        let k = not(a) * (1 + not(b) * (1 + not(c)));
                        let at = (k & 1) + (k >> 1) * ow;
                        emit(m + bo, base + top + 2 * px + at, out, route);
                    }
                } else {
                    let row = &plane[py * ow..][..pw];
                    for (px, (&v, (out, route))) in row
                        .iter()
                        .zip(out.iter_mut().zip(route.iter_mut()))
                        .enumerate()
                    {
                        emit(v + bo, base + py * ow + px, out, route);
                    }
                }
            }
        }
    }
    (out, route)
}

/// Writes ReLU(`v`) and the route of `v` (index `from` in `Y`), or no route where ReLU cuts.
#[inline(always)]
fn emit(v: f32, from: usize, out: &mut f32, route: &mut u32) {
    *out = v.max(0.0);
    // All ones (CUT) unless v > 0, without a branch.
    *route = from as u32 | u32::from(v > 0.0).wrapping_sub(1);
}

#[cfg(test)]
mod tests;
