//! The padded channels-last layout in which ResNet's kernels keep their activations: a
//! batch of `[H, W, C]` images where every row of pixels is followed by one zero pixel and
//! every image by one zero row, after a leading zero row (and one zero pixel):
//!
//! ```text
//! position of pixel (b, y, x) = lead + (b * (H + 1) + y) * (W + 1) + x
//! ```
//!
//! A pixel's neighbour outside its image (`x = -1`, `x = W`, `y = -1`, `y = H`) is then
//! a zero pixel of the layout: the left pad of a row is the right pad of the row above,
//! and an image's top pad row is the bottom pad row of the image before it. So a
//! convolution with padding 0 or 1 reads its patches in place, and one whose output keeps
//! the image's size (stride 1, `K = 2P + 1`) writes its output at the very positions it
//! reads: every kernel row of every patch is `K*C` contiguous values, one row apart from
//! the next patch's by `C` values, a matrix a GEMM reads as it is (`conv`).

use std::sync::Arc;

use rayon::prelude::*;

use super::pool;

/// The geometry of a batch of images in the padded layout.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Grid {
    /// Samples.
    pub batch: usize,
    /// Image height.
    pub height: usize,
    /// Image width.
    pub width: usize,
    /// Channels (values per pixel).
    pub channels: usize,
}

impl Grid {
    /// Positions from one row of pixels to the next (the row and its pad pixel).
    pub fn row(&self) -> usize {
        self.width + 1
    }

    /// Positions per sample (its rows and its bottom pad row).
    pub fn sample(&self) -> usize {
        (self.height + 1) * self.row()
    }

    /// Zero positions before the first sample (its top pad row and one pixel), and after
    /// the last.
    pub fn lead(&self) -> usize {
        self.row() + 1
    }

    /// Positions from the first sample's first pixel to the end of the last sample.
    pub fn span(&self) -> usize {
        self.batch * self.sample()
    }

    /// Values in the whole layout.
    pub fn len(&self) -> usize {
        (self.span() + 2 * self.lead()) * self.channels
    }

    /// Pixels (not positions) in the batch.
    pub fn pixels(&self) -> usize {
        self.batch * self.height * self.width
    }

    /// The geometry of a batch of dimensions `[B, C, H, W]`.
    pub fn of_dims(dims: [usize; 4]) -> Self {
        let [batch, channels, height, width] = dims;
        Self {
            batch,
            height,
            width,
            channels,
        }
    }

    /// Dimensions `[B, C, H, W]`.
    pub fn dims(&self) -> [usize; 4] {
        [self.batch, self.channels, self.height, self.width]
    }

    /// A zeroed buffer.
    pub fn zeros(&self) -> Vec<f32> {
        vec![0f32; self.len()]
    }

    /// A buffer of [`Grid::len`] values from the pool, holding stale values: its user
    /// writes every value it reads later (pads included, [`Grid::zero_pads`]).
    pub fn buffer(&self) -> Vec<f32> {
        pool::take(self.len())
    }

    /// The samples' parts of `v`, `sample() * channels` values each (row `y` of a sample
    /// starts at `y * row() * channels`).
    pub fn samples<'a>(&self, v: &'a [f32]) -> impl IndexedParallelIterator<Item = &'a [f32]> {
        let (start, per) = (self.lead() * self.channels, self.sample() * self.channels);
        v[start..start + self.batch * per].par_chunks(per)
    }

    /// [`Grid::samples`], mutable.
    pub fn samples_mut<'a>(
        &self,
        v: &'a mut [f32],
    ) -> impl IndexedParallelIterator<Item = &'a mut [f32]> {
        let (start, per) = (self.lead() * self.channels, self.sample() * self.channels);
        v[start..start + self.batch * per].par_chunks_mut(per)
    }

    /// The `W*C` pixel values of each row of one sample's part (see [`Grid::samples`]).
    pub fn pixel_rows<'a>(&self, sample: &'a [f32]) -> impl Iterator<Item = &'a [f32]> {
        let (per_row, w) = (self.row() * self.channels, self.width * self.channels);
        sample
            .chunks_exact(per_row)
            .take(self.height)
            .map(move |r| &r[..w])
    }

    /// [`Grid::pixel_rows`], mutable.
    pub fn pixel_rows_mut<'a>(&self, sample: &'a mut [f32]) -> impl Iterator<Item = &'a mut [f32]> {
        let (per_row, w) = (self.row() * self.channels, self.width * self.channels);
        sample
            .chunks_exact_mut(per_row)
            .take(self.height)
            .map(move |r| &mut r[..w])
    }

    /// Zeroes every value of `v` that is not a pixel's.
    pub fn zero_pads(&self, v: &mut [f32]) {
        let (c, lead) = (self.channels, self.lead() * self.channels);
        v[..lead].fill(0.0);
        let end = lead + self.span() * c;
        v[end..].fill(0.0);
        let (per_row, w) = (self.row() * c, self.width * c);
        self.samples_mut(v).for_each(|s| {
            let (rows, bottom) = s.split_at_mut(self.height * per_row);
            bottom.fill(0.0);
            for r in rows.chunks_exact_mut(per_row) {
                r[w..].fill(0.0);
            }
        });
    }

    /// The batch `[B, C, H, W]` in this layout.
    pub fn grid_of(&self, x: &[f32]) -> Vec<f32> {
        let (c, h, w) = (self.channels, self.height, self.width);
        assert_eq!(x.len(), self.batch * c * h * w, "planes of {self:?}");
        let mut v = self.zeros();
        let per_row = self.row() * c;
        self.samples_mut(&mut v)
            .zip(x.par_chunks(c * h * w))
            .for_each(|(dst, src)| {
                for (ci, plane) in src.chunks_exact(h * w).enumerate() {
                    for (y, line) in plane.chunks_exact(w).enumerate() {
                        let row = &mut dst[y * per_row..][..w * c];
                        for (d, v) in row.iter_mut().skip(ci).step_by(c).zip(line) {
                            *d = *v;
                        }
                    }
                }
            });
        v
    }

    /// The batch `[B, C, H, W]` of the pixels of `v`.
    pub fn planes_of(&self, v: &[f32]) -> Vec<f32> {
        let (c, h, w) = (self.channels, self.height, self.width);
        let mut x = vec![0f32; self.batch * c * h * w];
        let per_row = self.row() * c;
        x.par_chunks_mut(c * h * w)
            .zip(self.samples(v))
            .for_each(|(dst, src)| {
                for (ci, plane) in dst.chunks_exact_mut(h * w).enumerate() {
                    for (y, line) in plane.chunks_exact_mut(w).enumerate() {
                        let row = &src[y * per_row..][..w * c];
                        for (d, v) in line.iter_mut().zip(row.iter().skip(ci).step_by(c)) {
                            *d = *v;
                        }
                    }
                }
            });
        x
    }
}

/// A batch of images in the grid layout: an activation handed from layer to layer (and
/// kept for the backward pass) without being copied.
#[derive(Clone, Debug)]
pub struct GridImages {
    /// The geometry.
    pub grid: Grid,
    /// The values, `grid.len()` of them.
    pub values: Arc<Vec<f32>>,
}

impl GridImages {
    /// The batch `[B, C, H, W]` (`dims`) of `x` in the grid layout.
    pub fn of_planes(dims: [usize; 4], x: &[f32]) -> Self {
        let grid = Grid::of_dims(dims);
        Self::new(grid, grid.grid_of(x))
    }

    /// `values` in the layout of `grid`.
    ///
    /// # Panics
    /// When the length does not match (a caller's bug).
    pub fn new(grid: Grid, values: Vec<f32>) -> Self {
        assert_eq!(values.len(), grid.len(), "values of {grid:?}");
        Self {
            grid,
            values: Arc::new(values),
        }
    }

    /// Dimensions `[B, C, H, W]`.
    pub fn dims(&self) -> [usize; 4] {
        self.grid.dims()
    }

    /// The batch as `[B, C, H, W]`.
    pub fn planes(&self) -> Vec<f32> {
        self.grid.planes_of(&self.values)
    }

    /// The values, copied only where they are shared.
    pub fn into_values(mut self) -> Vec<f32> {
        let values = std::mem::take(&mut self.values);
        Arc::try_unwrap(values).unwrap_or_else(|shared| shared.to_vec())
    }
}

impl Drop for GridImages {
    /// Gives the values back to the pool when nothing else holds them.
    fn drop(&mut self) {
        if let Some(values) = Arc::get_mut(&mut self.values) {
            pool::give_back(std::mem::take(values));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn planes_round_trip_and_pads_are_zero() {
        let g = Grid {
            batch: 2,
            height: 3,
            width: 4,
            channels: 5,
        };
        let x: Vec<f32> = (0..g.pixels() * g.channels)
            .map(|i| i as f32 + 1.0)
            .collect();
        let v = g.grid_of(&x);
        assert_eq!(g.planes_of(&v), x);
        let mut padded = v.clone();
        padded.iter_mut().for_each(|v| *v += 1.0);
        g.zero_pads(&mut padded);
        let nonzero = padded.iter().filter(|v| **v != 0.0).count();
        assert_eq!(nonzero, x.len());
        // Pixel (b, y, x) channel c sits at its position.
        let at = |b: usize, y: usize, x: usize| g.lead() + b * g.sample() + y * g.row() + x;
        let (b, y, xx, c) = (1, 2, 3, 4);
        let plane = ((b * g.channels + c) * g.height + y) * g.width + xx;
        assert_eq!(v[at(b, y, xx) * g.channels + c], x[plane]);
    }
}
