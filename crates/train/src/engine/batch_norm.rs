//! Batch normalisation over activations in the padded channels-last layout of [`Grid`]
//! (every pixel's channels contiguous), forward in training and inference mode, and
//! backward. Statistics are summed in `f64`, each sample's sums on one thread and the
//! samples' sums added in order, so results do not depend on the thread count. Outputs are
//! zero at the layout's pads.

use rayon::prelude::*;

use super::grid::Grid;
use super::pool;

/// The epsilon added to the variance (PyTorch's default).
pub const EPS: f64 = 1e-5;

/// What the training forward keeps for the backward pass.
pub struct BnSaved {
    /// The normalised input `(z - mean) / sqrt(var + eps)` (its pads unspecified).
    pub normalised: Vec<f32>,
    /// `1 / sqrt(var + eps)` per channel.
    pub inv_std: Vec<f32>,
}

impl Drop for BnSaved {
    /// Gives the normalised values back to the pool.
    fn drop(&mut self) {
        pool::give_back(std::mem::take(&mut self.normalised));
    }
}

/// The batch's own statistics, for the running estimates.
pub struct BatchStats {
    /// Mean per channel.
    pub mean: Vec<f32>,
    /// Biased variance per channel (divided by the pixel count).
    pub var: Vec<f32>,
}

/// Per channel, two sums over every pixel of `a` and `b` (grid layout; `b` may be `a`):
/// `row(first, second, a_row, b_row)` adds one row of pixels' terms into `first` and
/// `second` (`f32`, a row at a time: a short sum), which are then added up in `f64`.
fn channel_sums(
    grid: &Grid,
    a: &[f32],
    b: &[f32],
    row: impl Fn(&mut [f32], &mut [f32], &[f32], &[f32]) + Sync,
) -> (Vec<f64>, Vec<f64>) {
    let c = grid.channels;
    let per_sample: Vec<(Vec<f64>, Vec<f64>)> = grid
        .samples(a)
        .zip(grid.samples(b))
        .map(|(sa, sb)| {
            let (mut first, mut second) = (vec![0f64; c], vec![0f64; c]);
            let (mut r1, mut r2) = (vec![0f32; c], vec![0f32; c]);
            for (ra, rb) in grid.pixel_rows(sa).zip(grid.pixel_rows(sb)) {
                r1.fill(0.0);
                r2.fill(0.0);
                row(&mut r1, &mut r2, ra, rb);
                first
                    .iter_mut()
                    .zip(&r1)
                    .for_each(|(s, v)| *s += f64::from(*v));
                second
                    .iter_mut()
                    .zip(&r2)
                    .for_each(|(s, v)| *s += f64::from(*v));
            }
            (first, second)
        })
        .collect();
    let (mut first, mut second) = (vec![0f64; c], vec![0f64; c]);
    for (f, s) in per_sample {
        first.iter_mut().zip(f).for_each(|(a, v)| *a += v);
        second.iter_mut().zip(s).for_each(|(a, v)| *a += v);
    }
    (first, second)
}

/// Training mode: normalises `z` by its batch statistics, then scales by `gamma` and
/// shifts by `beta`, then applies ReLU with `relu` (in the same pass). Returns the output,
/// what backward needs and the statistics.
pub fn forward_train(
    grid: &Grid,
    z: &[f32],
    gamma: &[f32],
    beta: &[f32],
    relu: bool,
) -> (Vec<f32>, BnSaved, BatchStats) {
    let c = grid.channels;
    assert!(
        gamma.len() == c && beta.len() == c && z.len() == grid.len(),
        "batch norm shapes"
    );
    let m = grid.pixels() as f64;
    let (sum, _) = channel_sums(grid, z, z, |s, _, z, _| {
        for px in z.chunks_exact(c) {
            s.iter_mut().zip(px).for_each(|(s, v)| *s += v);
        }
    });
    let mean32: Vec<f32> = sum.iter().map(|s| (s / m) as f32).collect();
    let (dev, _) = channel_sums(grid, z, z, |s, _, z, _| {
        for px in z.chunks_exact(c) {
            let terms = s.iter_mut().zip(px).zip(&mean32);
            terms.for_each(|((s, v), mean)| *s += (v - mean) * (v - mean));
        }
    });
    let var: Vec<f64> = dev.iter().map(|s| s / m).collect();
    let inv_std: Vec<f32> = var
        .iter()
        .map(|v| (1.0 / (v + EPS).sqrt()) as f32)
        .collect();
    let (mut normalised, mut out) = (grid.buffer(), grid.buffer());
    grid.samples_mut(&mut normalised)
        .zip(grid.samples_mut(&mut out))
        .zip(grid.samples(z))
        .for_each(|((xhat, out), z)| {
            let rows = grid.pixel_rows_mut(xhat).zip(grid.pixel_rows_mut(out));
            for ((xhat, out), z) in rows.zip(grid.pixel_rows(z)) {
                let pixels = xhat.chunks_exact_mut(c).zip(out.chunks_exact_mut(c));
                for ((xhat, out), z) in pixels.zip(z.chunks_exact(c)) {
                    let per_channel = mean32.iter().zip(&inv_std).zip(gamma.iter().zip(beta));
                    let values = xhat.iter_mut().zip(out.iter_mut()).zip(z);
                    for (((xhat, out), z), ((mean, inv), (g, b))) in values.zip(per_channel) {
                        let x = (z - mean) * inv;
                        *xhat = x;
                        *out = activate(x * g + b, relu);
                    }
                }
            }
        });
    grid.zero_pads(&mut out);
    let batch = BatchStats {
        mean: mean32,
        var: var.iter().map(|v| *v as f32).collect(),
    };
    (
        out,
        BnSaved {
            normalised,
            inv_std,
        },
        batch,
    )
}

/// `v`, through ReLU with `relu` (a loop invariant: the compiler takes it out of loops).
#[inline(always)]
fn activate(v: f32, relu: bool) -> f32 {
    if relu {
        v.max(0.0)
    } else {
        v
    }
}

/// Running statistics of one batch norm, for inference.
#[derive(Clone, Copy)]
pub struct Running<'a> {
    /// Running mean per channel.
    pub mean: &'a [f32],
    /// Running (unbiased) variance per channel.
    pub var: &'a [f32],
}

/// Inference mode: normalises `z` in place by running statistics, then applies ReLU with
/// `relu`; zeroes its pads.
pub fn forward_eval(
    grid: &Grid,
    z: &mut [f32],
    gamma: &[f32],
    beta: &[f32],
    running: Running,
    relu: bool,
) {
    let Running { mean, var } = running;
    let c = grid.channels;
    assert!(
        [gamma.len(), beta.len(), mean.len(), var.len()] == [c; 4] && z.len() == grid.len(),
        "batch norm shapes"
    );
    let scale: Vec<f32> = (0..c)
        .map(|ch| gamma[ch] / (f64::from(var[ch]) + EPS).sqrt() as f32)
        .collect();
    let shift: Vec<f32> = (0..c).map(|ch| beta[ch] - mean[ch] * scale[ch]).collect();
    grid.samples_mut(z).for_each(|s| {
        for row in grid.pixel_rows_mut(s) {
            for px in row.chunks_exact_mut(c) {
                let per_channel = scale.iter().zip(&shift);
                for (v, (scale, shift)) in px.iter_mut().zip(per_channel) {
                    *v = activate(*v * scale + shift, relu);
                }
            }
        }
    });
    grid.zero_pads(z);
}

/// The gradients of a training-mode batch norm.
pub struct BnGrads {
    /// Of its input (zero at the pads).
    pub input: Vec<f32>,
    /// Of `gamma`.
    pub gamma: Vec<f32>,
    /// Of `beta`.
    pub beta: Vec<f32>,
}

/// Backward of [`forward_train`] given the output gradient `g`.
pub fn backward(grid: &Grid, saved: &BnSaved, gamma: &[f32], g: &[f32]) -> BnGrads {
    let c = grid.channels;
    assert!(
        gamma.len() == c && g.len() == grid.len() && saved.normalised.len() == g.len(),
        "batch norm gradient shapes"
    );
    let m = grid.pixels() as f64;
    let (dbeta, dgamma) = channel_sums(grid, g, &saved.normalised, |sg, sgx, g, x| {
        for (g, x) in g.chunks_exact(c).zip(x.chunks_exact(c)) {
            let sums = sg.iter_mut().zip(sgx.iter_mut());
            for ((sg, sgx), (g, x)) in sums.zip(g.iter().zip(x)) {
                *sg += g;
                *sgx += g * x;
            }
        }
    });
    let scale: Vec<f32> = (0..c).map(|ch| gamma[ch] * saved.inv_std[ch]).collect();
    let mean_g: Vec<f32> = dbeta.iter().map(|s| (s / m) as f32).collect();
    let mean_gx: Vec<f32> = dgamma.iter().map(|s| (s / m) as f32).collect();
    let mut input = grid.buffer();
    grid.samples_mut(&mut input)
        .zip(grid.samples(g))
        .zip(grid.samples(&saved.normalised))
        .for_each(|((dz, g), xhat)| {
            let rows = grid.pixel_rows_mut(dz).zip(grid.pixel_rows(g));
            for ((dz, g), xhat) in rows.zip(grid.pixel_rows(xhat)) {
                let pixels = dz.chunks_exact_mut(c).zip(g.chunks_exact(c));
                for ((dz, g), xhat) in pixels.zip(xhat.chunks_exact(c)) {
                    let per_channel = scale.iter().zip(mean_g.iter().zip(&mean_gx));
                    let values = dz.iter_mut().zip(g.iter().zip(xhat));
                    for ((dz, (g, x)), (scale, (mg, mgx))) in values.zip(per_channel) {
                        *dz = scale * (g - mg - x * mgx);
                    }
                }
            }
        });
    grid.zero_pads(&mut input);
    BnGrads {
        input,
        gamma: dgamma.iter().map(|v| *v as f32).collect(),
        beta: dbeta.iter().map(|v| *v as f32).collect(),
    }
}
