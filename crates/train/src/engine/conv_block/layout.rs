//! The layouts the block's kernels convert between: the input's planes and padded
//! channels-last images, the weight's taps, and row-major transposes.

use rayon::prelude::*;

use super::super::spare::Lease;
use super::ConvShape;

/// The input `[B, C, H, W]` as zero-padded channels-last images `[B, H+2P, W+2P, C]`.
pub(super) fn channels_last(s: &ConvShape, x: &[f32]) -> Lease<f32> {
    let (c, h, w, p) = (s.in_channels, s.height, s.width, s.padding);
    let (_, wp) = s.padded_hw();
    let mut image = Lease::filled(s.batch * s.image_len(), 0f32);
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
pub(super) fn channels_first(s: &ConvShape, image: &[f32], x: &mut [f32]) {
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
pub(super) fn taps_first(s: &ConvShape, weight: &[f32]) -> Vec<f32> {
    let k2 = s.kernel * s.kernel;
    transpose_each(weight, s.in_channels, k2)
}

/// The inverse of [`taps_first`].
pub(super) fn taps_last(s: &ConvShape, weight: &[f32]) -> Vec<f32> {
    let k2 = s.kernel * s.kernel;
    transpose_each(weight, k2, s.in_channels)
}

/// Transposes each `rows x cols` matrix of `m` (row-major, one after the other).
pub(super) fn transpose_each(m: &[f32], rows: usize, cols: usize) -> Vec<f32> {
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
pub(super) fn transpose_into<T: Copy>(m: &[T], rows: usize, cols: usize, t: &mut [T]) {
    for (j, line) in t.chunks_exact_mut(rows).take(cols).enumerate() {
        for (r, v) in line.iter_mut().enumerate() {
            *v = m[r * cols + j];
        }
    }
}
