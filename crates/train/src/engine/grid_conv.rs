//! Convolutions (no bias, zero padding 0 or 1) between batches in the padded channels-last
//! layout of [`Grid`], forward and backward, as GEMMs that read patches in place:
//!
//! - where the output keeps the input's positions (stride 1, `K = 2P + 1`: every 3x3
//!   convolution of a ResNet stage but the first), output position `p` reads kernel row
//!   `ki` of its patch as the `K*C` values from input position `p + (ki - P) * row - P`:
//!   for each kernel row, one GEMM `Y[p, O] += X_ki[p, K*C] x W_ki[K*C, O]` whose left
//!   operand is the image itself, one position (`C` values) between its rows. Nothing is
//!   unfolded. The input's gradient is the same convolution of the output's gradient with
//!   the kernel flipped and its channels swapped; the weight's gradient is
//!   `dW_ki[O, K*C] = dZ^T x X_ki`, both read in place too;
//! - other convolutions (strided), and those with many channels on small images, gather
//!   the patches of their pixels (`K` runs of `K*C` contiguous values each, a few samples
//!   at a time; pad positions are not computed), and strided ones fold the patches'
//!   gradient back the same way.
//!
//! The batch is split into tasks of a fixed size (from the shapes only), run side by side,
//! each GEMM on one thread; partial weight gradients are added in the tasks' order, so
//! results do not depend on the thread count.

use std::ops::Range;

use rayon::prelude::*;

use super::gemm::{product_into, Operand};
use super::grid::Grid;

/// Output values one in-place task computes (a GEMM output that stays in the core's cache).
const TASK_VALUES: usize = 32 << 10;

/// Patch values one gathering task holds.
const PATCH_VALUES: usize = 128 << 10;

/// Channels (the wider side) from which a convolution that could read its patches in
/// place gathers them instead in its forward pass and its input gradient: with 64
/// (ResNet-20's stage 3, 8x8 images) a step took 117.0-124.9 ms against 119.6-132.9 ms
/// in place (2 threads, four alternating rounds); with 32 (stage 2 as well) 121.9-125.0
/// ms. Weight gradients always read in place where they can (gathered, stage 3's
/// backward pass was slower).
const GATHER_CHANNELS: usize = 64;

/// A convolution from one grid to another.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GridConv {
    /// The input's geometry.
    pub input: Grid,
    /// Output channels.
    pub out_channels: usize,
    /// Kernel side.
    pub kernel: usize,
    /// Step between two output pixels.
    pub stride: usize,
    /// Zero padding on every side: 0 or 1.
    pub padding: usize,
}

impl GridConv {
    /// The output's geometry.
    pub fn output(&self) -> Grid {
        let i = &self.input;
        let side = |n: usize| (n + 2 * self.padding - self.kernel) / self.stride + 1;
        Grid {
            batch: i.batch,
            height: side(i.height),
            width: side(i.width),
            channels: self.out_channels,
        }
    }

    /// Whether the kernels can run it: nothing empty, the kernel fits, padding at most 1
    /// (the layout's one zero pixel between rows).
    pub fn is_valid(&self) -> bool {
        let i = &self.input;
        i.batch > 0
            && i.channels > 0
            && self.out_channels > 0
            && self.kernel > 0
            && self.stride > 0
            && self.padding <= 1
            && i.height + 2 * self.padding >= self.kernel
            && i.width + 2 * self.padding >= self.kernel
    }

    /// Values in the weight `[O, C, K, K]`.
    pub fn weight_len(&self) -> usize {
        self.out_channels * self.patch_len()
    }

    /// Whether the output keeps the input's positions (patches read in place).
    pub fn in_place(&self) -> bool {
        self.stride == 1 && self.kernel == 2 * self.padding + 1
    }

    /// Whether the forward pass (and the input gradient's) reads patches in place, else
    /// gathers them, pixels only. In place, every pad position's product is computed too
    /// (the pad column and row: 6 % of a 32x32 image's positions, 27 % of an 8x8 one's);
    /// gathering costs a copy of every patch, small beside the products where channels
    /// are many (see [`GATHER_CHANNELS`]).
    fn reads_in_place(&self) -> bool {
        let widest = self.input.channels.max(self.out_channels);
        self.in_place() && widest < GATHER_CHANNELS
    }

    /// Values in one kernel row of a patch: `K*C`.
    fn run(&self) -> usize {
        self.kernel * self.input.channels
    }

    /// Values in one patch, ordered (kernel row, kernel column, channel).
    fn patch_len(&self) -> usize {
        self.kernel * self.run()
    }

    /// The input position where kernel row `ki` of the patch of the output pixel at `base`
    /// (the input position of its top-left pixel, padding not counted) starts.
    fn run_start(&self, base: usize, ki: usize) -> usize {
        base + ki * self.input.row() - self.padding * (self.input.row() + 1)
    }

    /// Positions per in-place task.
    fn task_positions(&self) -> usize {
        let widest = self.out_channels.max(self.input.channels);
        (TASK_VALUES / widest).max(16)
    }

    /// Samples per gathering task.
    fn task_samples(&self) -> usize {
        let per = self.output().sample() * self.patch_len().max(self.out_channels);
        (PATCH_VALUES / per.max(1)).clamp(1, self.input.batch)
    }

    /// The output of input `x` (in a buffer from the pool); its pad values are
    /// unspecified.
    ///
    /// # Panics
    /// When a buffer's length does not match (a caller's bug).
    pub fn forward(&self, weight: &[f32], x: &[f32]) -> Vec<f32> {
        assert!(self.is_valid(), "convolution {self:?}");
        assert_eq!(weight.len(), self.weight_len(), "weight of {self:?}");
        assert_eq!(x.len(), self.input.len(), "input of {self:?}");
        let w = hwio(
            weight,
            self.out_channels,
            self.input.channels,
            self.kernel,
            false,
        );
        let mut y = self.output().buffer();
        self.forward_into(&w, x, &mut y);
        y
    }

    /// Writes the output of input `x` into `y` (pads unspecified); `w` is `[K, K, C, O]`.
    fn forward_into(&self, w: &[f32], x: &[f32], y: &mut [f32]) {
        if self.reads_in_place() {
            self.forward_in_place(w, x, y);
        } else {
            self.forward_gathered(w, x, y);
        }
    }

    /// [`GridConv::forward`] reading patches in place; `w` is `[K, K, C, O]`.
    fn forward_in_place(&self, w: &[f32], x: &[f32], y: &mut [f32]) {
        let (o, c, run) = (self.out_channels, self.input.channels, self.run());
        let g = &self.input;
        let chunk = self.task_positions();
        let span = &mut y[g.lead() * o..(g.lead() + g.span()) * o];
        span.par_chunks_mut(chunk * o)
            .enumerate()
            .for_each(|(i, dst)| {
                let (base, n) = (g.lead() + i * chunk, dst.len() / o);
                for ki in 0..self.kernel {
                    let lhs = Operand::strided(&x[self.run_start(base, ki) * c..], c, 1);
                    let rhs = Operand::rows(&w[ki * run * o..][..run * o], o);
                    product_into((n, o, run), lhs, rhs, dst, o, ki > 0);
                }
            });
    }

    /// [`GridConv::forward`] over gathered patches of the pixels only (no pad position's
    /// product is computed), their outputs then copied to their positions; `w` is
    /// `[K, K, C, O]`.
    fn forward_gathered(&self, w: &[f32], x: &[f32], y: &mut [f32]) {
        let (o, pl, out) = (self.out_channels, self.patch_len(), self.output());
        let per = self.task_samples() * out.sample() * o;
        y[out.lead() * o..(out.lead() + out.span()) * o]
            .par_chunks_mut(per)
            .enumerate()
            .for_each_init(
                || (Vec::new(), Vec::new()),
                |(patches, products), (i, dst)| {
                    let count = dst.len() / (out.sample() * o);
                    let first = i * self.task_samples();
                    let n = count * out.height * out.width;
                    patches.resize(n * pl, 0.0);
                    products.resize(n * o, 0.0);
                    self.gather(x, first..first + count, patches);
                    let lhs = Operand::rows(patches, pl);
                    product_into((n, o, pl), lhs, Operand::rows(w, o), products, o, false);
                    let pixels = pixel_positions(&out, count).zip(products.chunks_exact(o));
                    for (p, v) in pixels {
                        dst[p * o..][..o].copy_from_slice(v);
                    }
                },
            );
    }

    /// Writes the patches of every output pixel of `samples`, one row of
    /// [`GridConv::patch_len`] values each.
    fn gather(&self, x: &[f32], samples: Range<usize>, patches: &mut [f32]) {
        let (inp, out) = (&self.input, self.output());
        let (c, run, s) = (inp.channels, self.run(), self.stride);
        let mut rows = patches.chunks_exact_mut(self.patch_len());
        for b in samples {
            for (p, row) in pixel_positions(&out, 1).zip(rows.by_ref()) {
                let (oy, ox) = (p / out.row(), p % out.row());
                let base = inp.lead() + b * inp.sample() + s * (oy * inp.row() + ox);
                for (ki, dst) in row.chunks_exact_mut(run).enumerate() {
                    dst.copy_from_slice(&x[self.run_start(base, ki) * c..][..run]);
                }
            }
        }
    }

    /// The weight's gradient `[O, C, K, K]` given the input `x` and the output's gradient
    /// `dz` (zero at its pads).
    ///
    /// # Panics
    /// When a buffer's length does not match (a caller's bug).
    pub fn weight_grad(&self, x: &[f32], dz: &[f32]) -> Vec<f32> {
        assert_eq!(x.len(), self.input.len(), "input of {self:?}");
        assert_eq!(dz.len(), self.output().len(), "output gradient of {self:?}");
        let parts = if self.in_place() {
            self.weight_grad_in_place(x, dz)
        } else {
            self.weight_grad_gathered(x, dz)
        };
        let mut sum = vec![0f32; self.weight_len()];
        for part in parts {
            sum.iter_mut().zip(part).for_each(|(s, p)| *s += p);
        }
        let (o, c, k) = (self.out_channels, self.input.channels, self.kernel);
        ohwi_to_oihw(&sum, o, c, k)
    }

    /// Per task, its part of the weight's gradient `[O, K, K, C]`, patches read in place.
    fn weight_grad_in_place(&self, x: &[f32], dz: &[f32]) -> Vec<Vec<f32>> {
        let (o, c, run, pl) = (
            self.out_channels,
            self.input.channels,
            self.run(),
            self.patch_len(),
        );
        let g = &self.input;
        // As many tasks as the forward pass has: with 4x larger tasks, stage 3's weight
        // gradient was 3 tasks on 2 threads.
        let chunk = self.task_positions();
        let tasks = g.span().div_ceil(chunk);
        (0..tasks)
            .into_par_iter()
            .map(|i| {
                let base = g.lead() + i * chunk;
                let n = chunk.min(g.span() - i * chunk);
                let lhs = || Operand::columns(&dz[base * o..][..n * o], o);
                let mut dw = vec![0f32; o * pl];
                for ki in 0..self.kernel {
                    let rhs = Operand::strided(&x[self.run_start(base, ki) * c..], c, 1);
                    product_into((o, run, n), lhs(), rhs, &mut dw[ki * run..], pl, false);
                }
                dw
            })
            .collect()
    }

    /// Per task, its part of the weight's gradient `[O, K, K, C]`, over gathered patches.
    fn weight_grad_gathered(&self, x: &[f32], dz: &[f32]) -> Vec<Vec<f32>> {
        let (o, pl, out) = (self.out_channels, self.patch_len(), self.output());
        let per = self.task_samples();
        let tasks: Vec<Range<usize>> = (0..out.batch)
            .step_by(per)
            .map(|b| b..(b + per).min(out.batch))
            .collect();
        tasks
            .into_par_iter()
            .map(|samples| {
                let n = samples.len() * out.height * out.width;
                let mut patches = vec![0f32; n * pl];
                self.gather(x, samples.clone(), &mut patches);
                let at = (out.lead() + samples.start * out.sample()) * o;
                let dz = &dz[at..];
                let pixels = pixel_positions(&out, samples.len());
                let dz: Vec<f32> = pixels.flat_map(|p| &dz[p * o..][..o]).copied().collect();
                let lhs = Operand::columns(&dz, o);
                let mut dw = vec![0f32; o * pl];
                product_into(
                    (o, pl, n),
                    lhs,
                    Operand::rows(&patches, pl),
                    &mut dw,
                    pl,
                    false,
                );
                dw
            })
            .collect()
    }

    /// The input's gradient (zero at its pads; in a buffer from the pool) given the output's `dz` (zero at its pads).
    ///
    /// # Panics
    /// When a buffer's length does not match (a caller's bug).
    pub fn input_grad(&self, weight: &[f32], dz: &[f32]) -> Vec<f32> {
        assert_eq!(weight.len(), self.weight_len(), "weight of {self:?}");
        assert_eq!(dz.len(), self.output().len(), "output gradient of {self:?}");
        let (o, c, k) = (self.out_channels, self.input.channels, self.kernel);
        let mut dx = self.input.buffer();
        if self.in_place() {
            let transposed = GridConv {
                input: self.output(),
                out_channels: c,
                ..*self
            };
            let w = hwio(weight, o, c, k, true);
            transposed.forward_into(&w, dz, &mut dx);
        } else {
            dx.fill(0.0);
            self.input_grad_folded(&oihw_to_ohwi(weight, o, c, k), dz, &mut dx);
        }
        self.input.zero_pads(&mut dx);
        dx
    }

    /// Adds to `dx` the fold of the patches' gradient `dZ x W` (`w` is `[O, K, K, C]`), a
    /// few samples at a time.
    fn input_grad_folded(&self, w: &[f32], dz: &[f32], dx: &mut [f32]) {
        let (o, pl, inp, out) = (
            self.out_channels,
            self.patch_len(),
            self.input,
            self.output(),
        );
        let per = self.task_samples();
        let per_sample = inp.sample() * inp.channels;
        dx[inp.lead() * inp.channels..][..inp.span() * inp.channels]
            .par_chunks_mut(per * per_sample)
            .enumerate()
            .for_each_init(Vec::new, |dpatches, (i, dst)| {
                let count = dst.len() / per_sample;
                let n = count * out.sample();
                let at = (out.lead() + i * per * out.sample()) * o;
                dpatches.resize(n * pl, 0.0);
                let lhs = Operand::rows(&dz[at..][..n * o], o);
                product_into((n, pl, o), lhs, Operand::rows(w, pl), dpatches, pl, false);
                self.fold(dpatches, count, dst);
            });
    }

    /// Adds the patches' gradient of `count` samples onto their part `dst` of the input's
    /// gradient (values that fall before it, in the pads of the sample before, dropped).
    fn fold(&self, dpatches: &[f32], count: usize, dst: &mut [f32]) {
        let (inp, out) = (&self.input, self.output());
        let (c, run, s) = (inp.channels, self.run(), self.stride);
        let skip = self.padding * (inp.row() + 1);
        let mut rows = dpatches.chunks_exact(self.patch_len());
        for j in 0..count {
            for (p, row) in (0..out.sample()).zip(rows.by_ref()) {
                let (oy, ox) = (p / out.row(), p % out.row());
                if oy >= out.height || ox >= out.width {
                    continue;
                }
                let base = j * inp.sample() + s * (oy * inp.row() + ox);
                for (ki, src) in row.chunks_exact(run).enumerate() {
                    let start = base + ki * inp.row();
                    if start + self.kernel <= skip {
                        continue;
                    }
                    let cut = skip.saturating_sub(start);
                    let to = &mut dst[(start + cut - skip) * c..][..run - cut * c];
                    to.iter_mut()
                        .zip(&src[cut * c..])
                        .for_each(|(d, v)| *d += v);
                }
            }
        }
    }
}

/// The positions of the pixels of `count` samples of `grid`, counted from the first one's
/// first pixel, in order.
fn pixel_positions(grid: &Grid, count: usize) -> impl Iterator<Item = usize> + '_ {
    (0..count * grid.height).flat_map(move |r| {
        let (b, y) = (r / grid.height, r % grid.height);
        let start = b * grid.sample() + y * grid.row();
        start..start + grid.width
    })
}

/// The weight `[O, C, K, K]` as `[K, K, C, O]` (the matrix a patch row multiplies), or with
/// `flip` as the transposed convolution's: `[K, K, O, C]`, the kernel turned by 180 degrees.
fn hwio(w: &[f32], o: usize, c: usize, k: usize, flip: bool) -> Vec<f32> {
    let mut t = vec![0f32; w.len()];
    for oi in 0..o {
        for ci in 0..c {
            for tap in 0..k * k {
                let v = w[(oi * c + ci) * k * k + tap];
                let at = if flip {
                    ((k * k - 1 - tap) * o + oi) * c + ci
                } else {
                    (tap * c + ci) * o + oi
                };
                t[at] = v;
            }
        }
    }
    t
}

/// The weight `[O, C, K, K]` as `[O, K, K, C]`.
fn oihw_to_ohwi(w: &[f32], o: usize, c: usize, k: usize) -> Vec<f32> {
    let mut t = vec![0f32; w.len()];
    for oi in 0..o {
        for ci in 0..c {
            for tap in 0..k * k {
                t[(oi * k * k + tap) * c + ci] = w[(oi * c + ci) * k * k + tap];
            }
        }
    }
    t
}

/// The inverse of [`oihw_to_ohwi`].
fn ohwi_to_oihw(w: &[f32], o: usize, c: usize, k: usize) -> Vec<f32> {
    let mut t = vec![0f32; w.len()];
    for oi in 0..o {
        for ci in 0..c {
            for tap in 0..k * k {
                t[(oi * c + ci) * k * k + tap] = w[(oi * k * k + tap) * c + ci];
            }
        }
    }
    t
}
