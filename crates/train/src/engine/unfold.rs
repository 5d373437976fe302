//! im2col and its adjoint col2im: a convolution's input unfolded into a column matrix
//! `[C*K*K, B*OH*OW]` (the batch side by side), so that the convolution is one GEMM. The
//! input may be laid out `[B, C, H, W]` (between layers) or `[C, B, H, W]` (inside a
//! residual block, where a GEMM's output is used as it is).

use std::ops::Range;

use rayon::prelude::*;

/// Memory order of an image batch.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Layout {
    /// `[B, C, H, W]`: sample-major, as burn and the data loader hold images.
    SampleMajor,
    /// `[C, B, H, W]`: channel-major, as a GEMM `W x cols` leaves its output.
    ChannelMajor,
}

/// The geometry of one unfolding: a KxK kernel at stride S over a zero-padded input.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Unfold {
    /// Samples in the batch.
    pub batch: usize,
    /// Input channels.
    pub channels: usize,
    /// Input height.
    pub height: usize,
    /// Input width.
    pub width: usize,
    /// Kernel side.
    pub kernel: usize,
    /// Step between two output positions.
    pub stride: usize,
    /// Zero padding on every side.
    pub padding: usize,
    /// How the input (and col2im's output) is laid out.
    pub layout: Layout,
}

/// Bytes of column matrix unfolded at a time: a part that stays in the last-level cache
/// (8 MiB here) between the step writing it and the step reading it.
const CHUNK_BYTES: usize = 2 << 20;

impl Unfold {
    /// The ranges of samples unfolded at a time: as many as keep a part of the column
    /// matrix within [`CHUNK_BYTES`].
    pub fn chunks(&self) -> impl Iterator<Item = Range<usize>> {
        let batch = self.batch;
        let (h, w) = self.out_hw();
        let per_sample = self.rows() * h * w * std::mem::size_of::<f32>();
        let step = (CHUNK_BYTES / per_sample.max(1)).clamp(1, batch.max(1));
        (0..batch)
            .step_by(step)
            .map(move |s| s..(s + step).min(batch))
    }

    /// Values in the largest part of the column matrix (see [`Unfold::chunks`]).
    pub fn chunk_len(&self) -> usize {
        let samples = self.chunks().map(|r| r.len()).max().unwrap_or(0);
        let (h, w) = self.out_hw();
        self.rows() * samples * h * w
    }

    /// Height and width of the convolution's output.
    pub fn out_hw(&self) -> (usize, usize) {
        let side = |n: usize| (n + 2 * self.padding - self.kernel) / self.stride + 1;
        (side(self.height), side(self.width))
    }

    /// Whether the kernel fits the padded input and nothing is empty.
    pub fn is_valid(&self) -> bool {
        self.batch > 0
            && self.channels > 0
            && self.kernel > 0
            && self.stride > 0
            && self.height + 2 * self.padding >= self.kernel
            && self.width + 2 * self.padding >= self.kernel
    }

    /// Rows of the column matrix: one per (channel, kernel row, kernel column).
    pub fn rows(&self) -> usize {
        self.channels * self.kernel * self.kernel
    }

    /// Columns of the column matrix: one per (sample, output position).
    pub fn columns(&self) -> usize {
        let (h, w) = self.out_hw();
        self.batch * h * w
    }

    /// Values in the input.
    pub fn input_len(&self) -> usize {
        self.batch * self.channels * self.height * self.width
    }

    /// Offset of the image plane of `sample` and `channel` in the input.
    fn plane(&self, sample: usize, channel: usize) -> usize {
        let plane = self.height * self.width;
        match self.layout {
            Layout::SampleMajor => (sample * self.channels + channel) * plane,
            Layout::ChannelMajor => (channel * self.batch + sample) * plane,
        }
    }

    /// The output positions `o0..o1` along one axis of `len` input positions whose input
    /// position `o * stride + tap - padding` lies inside the image.
    fn valid(&self, out: usize, tap: usize, len: usize) -> (usize, usize) {
        let s = self.stride;
        let lo = self.padding.saturating_sub(tap).div_ceil(s).min(out);
        let hi = (len + self.padding)
            .saturating_sub(tap)
            .div_ceil(s)
            .min(out);
        (lo, hi.max(lo))
    }
}

/// Unfolds `x` into `[C*K*K, B*OH*OW]`, zeros where the kernel overlaps the padding. Rows
/// are filled in parallel.
#[cfg(test)]
pub fn im2col(u: &Unfold, x: &[f32]) -> Vec<f32> {
    im2col_samples(u, x, 0..u.batch)
}

/// [`im2col`] of the samples `samples` only: `[C*K*K, len*OH*OW]`.
#[cfg(test)]
pub fn im2col_samples(u: &Unfold, x: &[f32], samples: Range<usize>) -> Vec<f32> {
    let (oh, ow) = u.out_hw();
    let mut cols = vec![0f32; u.rows() * samples.len() * oh * ow];
    im2col_into(u, x, samples, &mut cols);
    cols
}

/// [`im2col_samples`] into `cols`, every element of which it writes (padding included), so
/// that one buffer serves every range of a batch without being cleared.
pub fn im2col_into(u: &Unfold, x: &[f32], samples: Range<usize>, cols: &mut [f32]) {
    let (oh, ow) = u.out_hw();
    let n = samples.len() * oh * ow;
    assert!(
        u.is_valid()
            && x.len() == u.input_len()
            && samples.end <= u.batch
            && cols.len() == u.rows() * n,
        "im2col {u:?}"
    );
    if n == 0 {
        return;
    }
    let k2 = u.kernel * u.kernel;
    cols.par_chunks_mut(n).enumerate().for_each(|(row, dst)| {
        let (c, ki, kj) = (row / k2, row % k2 / u.kernel, row % u.kernel);
        let (x0, x1) = u.valid(ow, kj, u.width);
        let (y0, y1) = u.valid(oh, ki, u.height);
        // A tap that never lands inside the image (a kernel wider than it) reads nothing.
        let (y0, y1) = if x0 < x1 { (y0, y1) } else { (0, 0) };
        for (j, b) in samples.clone().enumerate() {
            let src = &x[u.plane(b, c)..][..u.height * u.width];
            let dst = &mut dst[j * oh * ow..][..oh * ow];
            dst[..y0 * ow].fill(0.0);
            dst[y1 * ow..].fill(0.0);
            if u.stride == 1 && ow == u.width && y0 < y1 {
                copy_shifted(u, (ki, kj), (x0, x1), (y0, y1), src, dst);
                continue;
            }
            for oy in y0..y1 {
                let iy = oy * u.stride + ki - u.padding;
                let line = &src[iy * u.width..][..u.width];
                let out = &mut dst[oy * ow..][..ow];
                out[..x0].fill(0.0);
                out[x1..].fill(0.0);
                let out = &mut out[x0..x1];
                let ix0 = x0 * u.stride + kj - u.padding;
                if u.stride == 1 {
                    out.copy_from_slice(&line[ix0..ix0 + out.len()]);
                } else {
                    for (o, v) in out.iter_mut().zip(line[ix0..].iter().step_by(u.stride)) {
                        *o = *v;
                    }
                }
            }
        }
    });
}

/// One tap's rows `y0..y1` of one sample's plane where the output keeps the image's width
/// at stride 1: output position `i` reads input position `i + shift`, so the span from the
/// first valid value to the last is one copy (one call instead of one per row), and the
/// columns outside `x0..x1` that it filled from the neighbouring rows are zeroed after.
fn copy_shifted(
    u: &Unfold,
    (ki, kj): (usize, usize),
    (x0, x1): (usize, usize),
    (y0, y1): (usize, usize),
    src: &[f32],
    dst: &mut [f32],
) {
    let w = u.width;
    let (first, last) = (y0 * w + x0, (y1 - 1) * w + x1);
    let from = (y0 + ki - u.padding) * w + x0 + kj - u.padding;
    dst[first..last].copy_from_slice(&src[from..from + (last - first)]);
    // Column by column (a strided loop, where a fill per row would be a call per row).
    for col in (0..x0).chain(x1..w) {
        for v in dst[y0 * w + col..y1 * w].iter_mut().step_by(w) {
            *v = 0.0;
        }
    }
}

/// Folds `[C*K*K, B*OH*OW]` back onto the input's shape and layout, adding overlapping
/// taps (the adjoint of [`im2col`]; the kernels fold a part of the batch at a time).
#[cfg(test)]
pub fn col2im(u: &Unfold, cols: &[f32]) -> Vec<f32> {
    let mut x = vec![0f32; u.input_len()];
    col2im_add(u, cols, 0..u.batch, &mut x);
    x
}

/// Adds the fold of the column matrix of the samples `samples` (`[C*K*K, len*OH*OW]`) onto
/// those samples of `x`. Image planes are folded in parallel, each tap after tap in a fixed
/// order, so the sums do not depend on the thread count.
pub fn col2im_add(u: &Unfold, cols: &[f32], samples: Range<usize>, x: &mut [f32]) {
    let (oh, ow) = u.out_hw();
    let n = samples.len() * oh * ow;
    assert!(
        u.is_valid()
            && cols.len() == u.rows() * n
            && x.len() == u.input_len()
            && samples.end <= u.batch,
        "col2im {u:?}"
    );
    let k2 = u.kernel * u.kernel;
    let plane = u.height * u.width;
    let fold = |b: usize, c: usize, dst: &mut [f32]| {
        let at = (b - samples.start) * oh * ow;
        for t in 0..k2 {
            let (ki, kj) = (t / u.kernel, t % u.kernel);
            let src = &cols[(c * k2 + t) * n + at..][..oh * ow];
            let (x0, x1) = u.valid(ow, kj, u.width);
            let (y0, y1) = u.valid(oh, ki, u.height);
            if x0 == x1 {
                continue;
            }
            for oy in y0..y1 {
                let iy = oy * u.stride + ki - u.padding;
                let ix0 = x0 * u.stride + kj - u.padding;
                let line = &mut dst[iy * u.width + ix0..(iy + 1) * u.width];
                let add = &src[oy * ow + x0..oy * ow + x1];
                if u.stride == 1 {
                    // A plain zip, which vectorises (step_by does not).
                    for (d, v) in line.iter_mut().zip(add) {
                        *d += v;
                    }
                } else {
                    for (d, v) in line.iter_mut().step_by(u.stride).zip(add) {
                        *d += v;
                    }
                }
            }
        }
    };
    match u.layout {
        Layout::SampleMajor => {
            let planes =
                &mut x[samples.start * u.channels * plane..samples.end * u.channels * plane];
            planes
                .par_chunks_mut(plane)
                .enumerate()
                .for_each(|(i, dst)| {
                    fold(samples.start + i / u.channels, i % u.channels, dst);
                });
        }
        Layout::ChannelMajor => {
            x.par_chunks_mut(u.batch * plane)
                .enumerate()
                .for_each(|(c, channel)| {
                    let planes = &mut channel[samples.start * plane..samples.end * plane];
                    for (j, dst) in planes.chunks_exact_mut(plane).enumerate() {
                        fold(samples.start + j, c, dst);
                    }
                });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A direct convolution-style gather: the column matrix by definition.
    fn im2col_by_definition(u: &Unfold, x: &[f32]) -> Vec<f32> {
        let (oh, ow) = u.out_hw();
        let n = u.columns();
        let mut cols = vec![0f32; u.rows() * n];
        for c in 0..u.channels {
            for ki in 0..u.kernel {
                for kj in 0..u.kernel {
                    let row = (c * u.kernel + ki) * u.kernel + kj;
                    for b in 0..u.batch {
                        for oy in 0..oh {
                            for ox in 0..ow {
                                let iy = (oy * u.stride + ki) as isize - u.padding as isize;
                                let ix = (ox * u.stride + kj) as isize - u.padding as isize;
                                let inside = iy >= 0
                                    && ix >= 0
                                    && (iy as usize) < u.height
                                    && (ix as usize) < u.width;
                                if inside {
                                    let at = u.plane(b, c) + iy as usize * u.width + ix as usize;
                                    cols[row * n + (b * oh + oy) * ow + ox] = x[at];
                                }
                            }
                        }
                    }
                }
            }
        }
        cols
    }

    fn geometries() -> Vec<Unfold> {
        let mut all = Vec::new();
        for layout in [Layout::SampleMajor, Layout::ChannelMajor] {
            for (kernel, stride, padding) in [
                (3, 1, 1),
                (3, 2, 1),
                (1, 2, 0),
                (5, 3, 2),
                (2, 2, 0),
                (7, 1, 3),
            ] {
                for (height, width) in [(7, 5), (8, 8), (5, 9), (1, 2)] {
                    let u = Unfold {
                        batch: 2,
                        channels: 3,
                        height,
                        width,
                        kernel,
                        stride,
                        padding,
                        layout,
                    };
                    if u.is_valid() {
                        all.push(u);
                    }
                }
            }
        }
        all
    }

    #[test]
    fn im2col_is_the_gather_by_definition() {
        for u in geometries() {
            let x: Vec<f32> = (0..u.input_len()).map(|i| i as f32 + 1.0).collect();
            assert_eq!(im2col(&u, &x), im2col_by_definition(&u, &x), "{u:?}");
        }
    }

    /// Unfolding and folding a range of samples at a time gives the whole batch's results.
    #[test]
    fn sample_ranges_compose_to_the_whole_batch() {
        for u in geometries() {
            let u = Unfold { batch: 3, ..u };
            let x: Vec<f32> = (0..u.input_len()).map(|i| (i % 11) as f32).collect();
            let whole = im2col(&u, &x);
            let c: Vec<f32> = (0..whole.len()).map(|i| (i % 3) as f32).collect();
            let folded = col2im(&u, &c);
            let (oh, ow) = u.out_hw();
            let (n, p) = (u.columns(), oh * ow);
            let mut by_parts = vec![0f32; u.input_len()];
            for samples in [0..1, 1..3] {
                let part = im2col_samples(&u, &x, samples.clone());
                let w = samples.len() * p;
                let rows_of_part: Vec<f32> = (0..u.rows())
                    .flat_map(|r| c[r * n + samples.start * p..][..w].to_vec())
                    .collect();
                for r in 0..u.rows() {
                    assert_eq!(part[r * w..][..w], whole[r * n + samples.start * p..][..w]);
                }
                col2im_add(&u, &rows_of_part, samples, &mut by_parts);
            }
            assert_eq!(by_parts, folded, "{u:?}");
        }
    }

    /// col2im is im2col's adjoint: <im2col(x), c> = <x, col2im(c)> for any x and c.
    #[test]
    fn col2im_is_the_adjoint_of_im2col() {
        for u in geometries() {
            let x: Vec<f32> = (0..u.input_len()).map(|i| (i % 7) as f32 - 3.0).collect();
            let c: Vec<f32> = (0..u.rows() * u.columns())
                .map(|i| (i % 5) as f32 - 2.0)
                .collect();
            let lhs: f32 = im2col(&u, &x).iter().zip(&c).map(|(a, b)| a * b).sum();
            let rhs: f32 = x.iter().zip(col2im(&u, &c)).map(|(a, b)| a * b).sum();
            assert_eq!(lhs, rhs, "{u:?}");
        }
    }
}
