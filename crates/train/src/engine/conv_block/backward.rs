//! The block's backward pass: the routed outputs' gradients scattered one by one under the
//! pool, dense GEMMs a part of the batch at a time otherwise (see the parent module).

use rayon::prelude::*;

use super::super::gemm::{product, Operand};
use super::super::spare::Lease;
use super::layout::{channels_first, taps_first, taps_last};
use super::{unfold, ConvGrads, ConvSaved, ConvShape, CUT};

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
) -> (Lease<f32>, Vec<f32>) {
    let s = &saved.shape;
    let o = s.out_channels;
    let (oh, ow) = s.conv_hw();
    let plane = s.sample_output_len() / o;
    let mut gy = Lease::filled(samples.len() * oh * ow * o, 0f32);
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
    (gy, bias): &(Lease<f32>, Vec<f32>),
    samples: std::ops::Range<usize>,
    dx: Option<&mut [f32]>,
) -> (Vec<f32>, Vec<f32>) {
    let s = &saved.shape;
    let (o, k) = (s.out_channels, s.patch_len());
    let rows = gy.len() / o;
    let mut patches = Lease::reused(rows * k);
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
    dx.par_chunks_mut(size).enumerate().for_each_init(
        || Lease::reused(s.image_len()),
        |image, (b, dx)| {
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
        },
    );
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
