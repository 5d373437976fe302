//! Batch normalisation over channel-major activations `[C, B*H*W]` (each channel's values
//! contiguous), forward in training and inference mode, and backward. Statistics are
//! accumulated in `f64` in a fixed order; channels run in parallel.

use rayon::prelude::*;

/// The epsilon added to the variance (PyTorch's default).
pub const EPS: f64 = 1e-5;

/// What the training forward keeps for the backward pass.
pub struct BnSaved {
    /// The normalised input `(z - mean) / sqrt(var + eps)`, `[C, M]`.
    pub normalised: Vec<f32>,
    /// `1 / sqrt(var + eps)` per channel.
    pub inv_std: Vec<f32>,
}

/// The batch's own statistics, for the running estimates.
pub struct BatchStats {
    /// Mean per channel.
    pub mean: Vec<f32>,
    /// Biased variance per channel (divided by M).
    pub var: Vec<f32>,
}

/// Training mode: normalises `z` (`[C, M]`) by its batch statistics, then scales by `gamma`
/// and shifts by `beta`, then applies ReLU with `relu` (in the same pass). Returns the
/// output, what backward needs and the statistics.
pub fn forward_train(
    z: &[f32],
    gamma: &[f32],
    beta: &[f32],
    relu: bool,
) -> (Vec<f32>, BnSaved, BatchStats) {
    let c = gamma.len();
    assert!(
        c > 0 && beta.len() == c && z.len().is_multiple_of(c),
        "batch norm shapes"
    );
    let m = z.len() / c;
    let mut normalised = vec![0f32; z.len()];
    let mut out = vec![0f32; z.len()];
    let stats: Vec<(f32, f32, f32)> = z
        .par_chunks(m)
        .zip(normalised.par_chunks_mut(m))
        .zip(out.par_chunks_mut(m))
        .enumerate()
        .map(|(ch, ((z, xhat), out))| {
            let mean = lane_sum(z, z, |v, _| (f64::from(v), 0.0)).0 / m as f64;
            let var = lane_sum(z, z, |v, _| ((f64::from(v) - mean).powi(2), 0.0)).0 / m as f64;
            let inv_std = (1.0 / (var + EPS).sqrt()) as f32;
            let (mean32, g, b) = (mean as f32, gamma[ch], beta[ch]);
            for ((x, o), &v) in xhat.iter_mut().zip(out.iter_mut()).zip(z) {
                *x = (v - mean32) * inv_std;
                *o = activate(*x * g + b, relu);
            }
            (mean32, var as f32, inv_std)
        })
        .collect();
    let saved = BnSaved {
        normalised,
        inv_std: stats.iter().map(|s| s.2).collect(),
    };
    let batch = BatchStats {
        mean: stats.iter().map(|s| s.0).collect(),
        var: stats.iter().map(|s| s.1).collect(),
    };
    (out, saved, batch)
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

/// Inference mode: normalises `z` (`[C, M]`) in place by running statistics, then applies
/// ReLU with `relu`.
pub fn forward_eval(z: &mut [f32], gamma: &[f32], beta: &[f32], running: Running, relu: bool) {
    let Running { mean, var } = running;
    let c = gamma.len();
    assert!(
        c > 0 && [beta.len(), mean.len(), var.len()] == [c; 3] && z.len().is_multiple_of(c),
        "batch norm shapes"
    );
    let m = z.len() / c;
    z.par_chunks_mut(m).enumerate().for_each(|(ch, z)| {
        let scale = gamma[ch] / (f64::from(var[ch]) + EPS).sqrt() as f32;
        let shift = beta[ch] - mean[ch] * scale;
        for v in z {
            *v = activate(*v * scale + shift, relu);
        }
    });
}

/// The gradients of a training-mode batch norm.
pub struct BnGrads {
    /// Of its input, `[C, M]`.
    pub input: Vec<f32>,
    /// Of `gamma`.
    pub gamma: Vec<f32>,
    /// Of `beta`.
    pub beta: Vec<f32>,
}

/// Backward of [`forward_train`] given the output gradient `g` (`[C, M]`).
pub fn backward(saved: &BnSaved, gamma: &[f32], g: &[f32]) -> BnGrads {
    let c = gamma.len();
    assert!(
        c > 0 && g.len() == saved.normalised.len() && saved.inv_std.len() == c,
        "batch norm gradient shapes"
    );
    let m = g.len() / c;
    let mut input = vec![0f32; g.len()];
    let sums: Vec<(f32, f32)> = g
        .par_chunks(m)
        .zip(saved.normalised.par_chunks(m))
        .zip(input.par_chunks_mut(m))
        .enumerate()
        .map(|(ch, ((g, xhat), dz))| {
            let (dbeta, dgamma) =
                lane_sum(g, xhat, |g, x| (f64::from(g), f64::from(g) * f64::from(x)));
            let scale = gamma[ch] * saved.inv_std[ch];
            let (mean_g, mean_gx) = ((dbeta / m as f64) as f32, (dgamma / m as f64) as f32);
            for ((d, &g), &x) in dz.iter_mut().zip(g).zip(xhat) {
                *d = scale * (g - mean_g - x * mean_gx);
            }
            (dgamma as f32, dbeta as f32)
        })
        .collect();
    BnGrads {
        input,
        gamma: sums.iter().map(|s| s.0).collect(),
        beta: sums.iter().map(|s| s.1).collect(),
    }
}

/// Lanes of a [`lane_sum`]: independent running sums, so that the additions vectorise (one
/// running sum is a chain of dependent additions, 4 cycles each).
const LANES: usize = 8;

/// The sums over `i` of `f(a[i], b[i])`'s two parts, in `f64`, over [`LANES`] interleaved
/// running sums added up at the end: a fixed order, whatever the thread count.
fn lane_sum(a: &[f32], b: &[f32], f: impl Fn(f32, f32) -> (f64, f64)) -> (f64, f64) {
    let (mut first, mut second) = ([0f64; LANES], [0f64; LANES]);
    let (a_lanes, b_lanes) = (a.chunks_exact(LANES), b.chunks_exact(LANES));
    let (a_rest, b_rest) = (a_lanes.remainder(), b_lanes.remainder());
    for (a, b) in a_lanes.zip(b_lanes) {
        for i in 0..LANES {
            let (x, y) = f(a[i], b[i]);
            first[i] += x;
            second[i] += y;
        }
    }
    for (i, (&a, &b)) in a_rest.iter().zip(b_rest).enumerate() {
        let (x, y) = f(a, b);
        first[i] += x;
        second[i] += y;
    }
    (first.iter().sum(), second.iter().sum())
}
