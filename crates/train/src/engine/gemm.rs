//! One dense matrix product on the CPU for our kernels: operands are row-major slices or
//! their transposes, read in place by the `gemm` crate (threads for large products).

use gemm::Parallelism;

use super::unfold::{col2im_add, Unfold};

/// A row-major matrix operand, or the transpose of one.
pub(crate) struct Operand<'a> {
    data: &'a [f32],
    row_stride: isize,
    col_stride: isize,
}

impl<'a> Operand<'a> {
    /// `data` read as a row-major matrix with `cols` columns.
    pub(crate) fn rows(data: &'a [f32], cols: usize) -> Self {
        Self {
            data,
            row_stride: cols as isize,
            col_stride: 1,
        }
    }

    /// The transpose of `data` read as a row-major matrix with `cols` columns.
    pub(crate) fn columns(data: &'a [f32], cols: usize) -> Self {
        Self {
            data,
            row_stride: 1,
            col_stride: cols as isize,
        }
    }

    /// Whether an `r x c` matrix fits in `data`.
    fn holds(&self, r: usize, c: usize) -> bool {
        r == 0
            || c == 0
            || (r - 1) * (self.row_stride as usize) + (c - 1) * (self.col_stride as usize)
                < self.data.len()
    }
}

/// `dst[m, n] = lhs[m, k] x rhs[k, n]`, or `dst += lhs x rhs` with `accumulate`; `dst` is
/// row-major with `dst_stride` values between its rows.
#[allow(clippy::too_many_arguments)]
fn matmul(
    m: usize,
    n: usize,
    k: usize,
    dst: &mut [f32],
    dst_stride: usize,
    accumulate: bool,
    lhs: Operand,
    rhs: Operand,
    parallel: bool,
) {
    assert!(
        dst_stride >= n
            && (m == 0 || n == 0 || dst.len() >= (m - 1) * dst_stride + n)
            && lhs.holds(m, k)
            && rhs.holds(k, n)
    );
    let threads = rayon::current_num_threads();
    let parallelism = if parallel && threads > 1 && m * n * k >= 1 << 18 {
        Parallelism::Rayon(threads)
    } else {
        Parallelism::None
    };
    // SAFETY: the assertion above keeps every element the strides reach inside the slices,
    // and `dst` does not alias the operands (it is borrowed mutably).
    unsafe {
        gemm::gemm(
            m,
            n,
            k,
            dst.as_mut_ptr(),
            1,
            dst_stride as isize,
            accumulate,
            lhs.data.as_ptr(),
            lhs.col_stride,
            lhs.row_stride,
            rhs.data.as_ptr(),
            rhs.col_stride,
            rhs.row_stride,
            if accumulate { 1.0 } else { 0.0 },
            1.0,
            false,
            false,
            false,
            parallelism,
        );
    }
}

/// `dst[m, n] = lhs[m, k] x rhs[k, n]` into the row-major `dst`, on the calling thread.
pub(crate) fn product(m: usize, n: usize, k: usize, lhs: Operand, rhs: Operand, dst: &mut [f32]) {
    matmul(m, n, k, dst, n, false, lhs, rhs, false);
}

/// The three products of a convolution run as a GEMM over its column matrix
/// `cols[rows, columns]` (see `unfold`), with a weight `[out_channels, rows]`, whole or a
/// range of columns at a time (the output's and its gradient's `[O, columns]` buffers are
/// whole; the column matrix holds only the range's columns).
#[derive(Clone, Copy, Debug)]
pub(crate) struct ConvGemm {
    /// Output channels.
    pub out_channels: usize,
    /// Rows of the column matrix (input channels x kernel taps).
    pub rows: usize,
    /// Columns of the column matrix (samples x output positions).
    pub columns: usize,
    /// Whether one product may use every thread (false where the caller already runs
    /// products side by side, one per thread).
    pub parallel: bool,
}

impl ConvGemm {
    /// The output `Y[O, columns] = W x cols`.
    pub fn forward(&self, weight: &[f32], cols: &[f32]) -> Vec<f32> {
        let mut y = vec![0f32; self.out_channels * self.columns];
        self.forward_columns(weight, cols, &mut y, 0);
        y
    }

    /// Writes the output's columns `first..` from the range's column matrix `cols`.
    pub fn forward_columns(&self, weight: &[f32], cols: &[f32], y: &mut [f32], first: usize) {
        let (o, rows, n) = (self.out_channels, self.rows, self.columns);
        let width = cols.len() / rows;
        let lhs = Operand::rows(weight, rows);
        matmul(
            o,
            width,
            rows,
            &mut y[first..],
            n,
            false,
            lhs,
            Operand::rows(cols, width),
            self.parallel,
        );
    }

    /// The part of the weight's gradient that the columns `first..` of the range's `cols`
    /// give, as a weight-shaped matrix of its own. Computed as its transpose
    /// `cols x gY^T`, whose long operand is the left one: 1.2x faster for ResNet-20's
    /// backward pass than `gY x cols^T` (the right operand's packing dominated).
    pub fn weight_grad_part(&self, gy: &[f32], cols: &[f32], first: usize) -> Vec<f32> {
        let (o, rows, n) = (self.out_channels, self.rows, self.columns);
        let width = cols.len() / rows;
        // dW^T[rows, O] = cols x gY^T: the long operand as the left one.
        let mut dwt = vec![0f32; rows * o];
        let rhs = Operand {
            data: &gy[first..],
            row_stride: 1,
            col_stride: n as isize,
        };
        matmul(
            rows,
            o,
            width,
            &mut dwt,
            o,
            false,
            Operand::rows(cols, width),
            rhs,
            self.parallel,
        );
        let mut dw = vec![0f32; o * rows];
        for (r, row) in dwt.chunks_exact(o).enumerate() {
            for (oi, v) in row.iter().enumerate() {
                dw[oi * rows + r] = *v;
            }
        }
        dw
    }

    /// The input's gradient for the unfolding `u`, given the output's `gy[O, columns]`:
    /// the column matrix's gradient `W^T x gY`, a part of the batch at a time
    /// ([`Unfold::chunks`]) into one buffer that stays in cache, each part folded back onto
    /// the input (col2im) at once.
    pub fn input_grad(&self, u: &Unfold, weight: &[f32], gy: &[f32]) -> Vec<f32> {
        let (oh, ow) = u.out_hw();
        let mut dx = vec![0f32; u.input_len()];
        let mut dcols = vec![0f32; u.chunk_len()];
        for samples in u.chunks() {
            let width = samples.len() * oh * ow;
            let dcols = &mut dcols[..self.rows * width];
            self.cols_grad_columns(weight, gy, samples.start * oh * ow, width, dcols);
            col2im_add(u, dcols, samples, &mut dx);
        }
        dx
    }

    /// Writes into `dcols` the gradient of the range's column matrix, columns
    /// `first..first + width` (every element of `dcols` is written).
    pub fn cols_grad_columns(
        &self,
        weight: &[f32],
        gy: &[f32],
        first: usize,
        width: usize,
        dcols: &mut [f32],
    ) {
        let (o, rows, n) = (self.out_channels, self.rows, self.columns);
        let rhs = Operand {
            data: &gy[first..],
            row_stride: n as isize,
            col_stride: 1,
        };
        let lhs = Operand::columns(weight, rows);
        matmul(
            rows,
            width,
            o,
            &mut dcols[..rows * width],
            width,
            false,
            lhs,
            rhs,
            self.parallel,
        );
    }
}
