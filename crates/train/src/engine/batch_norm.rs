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
    /// The input `z` (its pads unspecified): the normalised values are recomputed from it.
    pub input: Vec<f32>,
    /// The batch mean per channel.
    pub mean: Vec<f32>,
    /// `1 / sqrt(var + eps)` per channel.
    pub inv_std: Vec<f32>,
}

impl Drop for BnSaved {
    /// Gives the input back to the pool.
    fn drop(&mut self) {
        pool::give_back(std::mem::take(&mut self.input));
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

/// What is added after the scale and shift: nothing, or a residual of the same grid.
/// ReLU follows with `relu`.
#[derive(Clone, Copy, Default)]
pub struct Then<'a> {
    /// Added before the ReLU (the identity shortcut of a basic block).
    pub residual: Option<&'a [f32]>,
    /// Whether ReLU follows.
    pub relu: bool,
}

/// Training mode: normalises `z` by its batch statistics, then scales by `gamma` and
/// shifts by `beta`, then adds and applies what `then` says (in the same pass). Returns
/// the output (zero at its pads), what backward needs (`z` itself) and the statistics.
pub fn forward_train(
    grid: &Grid,
    z: Vec<f32>,
    gamma: &[f32],
    beta: &[f32],
    then: Then,
) -> (Vec<f32>, BnSaved, BatchStats) {
    let c = grid.channels;
    assert!(
        gamma.len() == c && beta.len() == c && z.len() == grid.len(),
        "batch norm shapes"
    );
    let m = grid.pixels() as f64;
    let (sum, _) = channel_sums(grid, &z, &z, |s, _, z, _| {
        for px in z.chunks_exact(c) {
            s.iter_mut().zip(px).for_each(|(s, v)| *s += v);
        }
    });
    let mean: Vec<f32> = sum.iter().map(|s| (s / m) as f32).collect();
    let (dev, _) = channel_sums(grid, &z, &z, |s, _, z, _| {
        for px in z.chunks_exact(c) {
            let terms = s.iter_mut().zip(px).zip(&mean);
            terms.for_each(|((s, v), mean)| *s += (v - mean) * (v - mean));
        }
    });
    let var: Vec<f64> = dev.iter().map(|s| s / m).collect();
    let inv_std: Vec<f32> = var
        .iter()
        .map(|v| (1.0 / (v + EPS).sqrt()) as f32)
        .collect();
    // y = (z - mean) * inv_std * gamma + beta = z * scale + shift.
    let scale: Vec<f32> = inv_std.iter().zip(gamma).map(|(i, g)| i * g).collect();
    let shift: Vec<f32> = (0..c).map(|ch| beta[ch] - mean[ch] * scale[ch]).collect();
    let mut out = grid.buffer();
    apply(grid, &z, &mut out, (&scale, &shift), then);
    let batch = BatchStats {
        mean: mean.clone(),
        var: var.iter().map(|v| *v as f32).collect(),
    };
    let saved = BnSaved {
        input: z,
        mean,
        inv_std,
    };
    (out, saved, batch)
}

/// Writes `out = then(z * scale + shift)` per channel at every pixel, and zeroes `out`'s
/// pads.
fn apply(grid: &Grid, z: &[f32], out: &mut [f32], (scale, shift): (&[f32], &[f32]), then: Then) {
    let c = grid.channels;
    let residual = then.residual.unwrap_or(z);
    grid.samples_mut(out)
        .zip(grid.samples(z).zip(grid.samples(residual)))
        .for_each(|(out, (z, r))| {
            let rows = grid.pixel_rows_mut(out).zip(grid.pixel_rows(z));
            for ((out, z), r) in rows.zip(grid.pixel_rows(r)) {
                let pixels = out.chunks_exact_mut(c).zip(z.chunks_exact(c));
                for ((out, z), r) in pixels.zip(r.chunks_exact(c)) {
                    let per_channel = scale.iter().zip(shift);
                    let values = out.iter_mut().zip(z.iter().zip(r));
                    for ((out, (z, r)), (scale, shift)) in values.zip(per_channel) {
                        let y = z * scale + shift;
                        let y = if then.residual.is_some() { y + r } else { y };
                        *out = activate(y, then.relu);
                    }
                }
            }
        });
    grid.zero_pads(out);
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

/// Inference mode: normalises `z` by running statistics, then adds and applies what
/// `then` says; returns the output (zero at its pads) and gives `z` back to the pool.
pub fn forward_eval(
    grid: &Grid,
    z: Vec<f32>,
    gamma: &[f32],
    beta: &[f32],
    running: Running,
    then: Then,
) -> Vec<f32> {
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
    let mut out = grid.buffer();
    apply(grid, &z, &mut out, (&scale, &shift), then);
    pool::give_back(z);
    out
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

/// Backward of [`forward_train`] given the output gradient `g` (taken before the ReLU
/// and the residual: the caller applies those).
pub fn backward(grid: &Grid, saved: &BnSaved, gamma: &[f32], g: &[f32]) -> BnGrads {
    let c = grid.channels;
    assert!(
        gamma.len() == c && g.len() == grid.len() && saved.input.len() == g.len(),
        "batch norm gradient shapes"
    );
    let m = grid.pixels() as f64;
    let mean = &saved.mean;
    // Sums of g and of g * (z - mean) (= g * xhat / inv_std).
    let (dbeta, dgz) = channel_sums(grid, g, &saved.input, |sg, sgz, g, z| {
        for (g, z) in g.chunks_exact(c).zip(z.chunks_exact(c)) {
            let sums = sg.iter_mut().zip(sgz.iter_mut());
            for ((sg, sgz), ((g, z), mean)) in sums.zip(g.iter().zip(z).zip(mean)) {
                *sg += g;
                *sgz += g * (z - mean);
            }
        }
    });
    let dgamma: Vec<f64> = (0..c)
        .map(|ch| dgz[ch] * f64::from(saved.inv_std[ch]))
        .collect();
    // dz = k * (g - mean_g - xhat * mean_gx), xhat = (z - mean) * inv: a * g + b * z + d.
    let mut coef = (vec![0f32; c], vec![0f32; c], vec![0f32; c]);
    for ch in 0..c {
        let (inv, k) = (saved.inv_std[ch], gamma[ch] * saved.inv_std[ch]);
        let (mean_g, mean_gx) = ((dbeta[ch] / m) as f32, (dgamma[ch] / m) as f32);
        coef.0[ch] = k;
        coef.1[ch] = -k * mean_gx * inv;
        coef.2[ch] = -k * mean_g + k * mean_gx * inv * mean[ch];
    }
    let mut input = grid.buffer();
    grid.samples_mut(&mut input)
        .zip(grid.samples(g).zip(grid.samples(&saved.input)))
        .for_each(|(dz, (g, z))| {
            let rows = grid.pixel_rows_mut(dz).zip(grid.pixel_rows(g));
            for ((dz, g), z) in rows.zip(grid.pixel_rows(z)) {
                let pixels = dz.chunks_exact_mut(c).zip(g.chunks_exact(c));
                for ((dz, g), z) in pixels.zip(z.chunks_exact(c)) {
                    let per_channel = coef.0.iter().zip(coef.1.iter().zip(&coef.2));
                    let values = dz.iter_mut().zip(g.iter().zip(z));
                    for ((dz, (g, z)), (a, (b, d))) in values.zip(per_channel) {
                        *dz = a * g + b * z + d;
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
