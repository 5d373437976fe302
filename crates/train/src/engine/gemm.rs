//! One dense matrix product on the CPU for our kernels: operands are row-major slices or
//! their transposes, read in place by the `gemm` crate (threads for large products).

use gemm::Parallelism;

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

    /// `data` read as a matrix whose element `(i, j)` is `data[i * row_stride + j *
    /// col_stride]` (rows may overlap: a convolution's patches read in place).
    pub(crate) fn strided(data: &'a [f32], row_stride: usize, col_stride: usize) -> Self {
        Self {
            data,
            row_stride: row_stride as isize,
            col_stride: col_stride as isize,
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

/// `dst[m, n] = lhs[m, k] x rhs[k, n]`, or `dst += lhs x rhs` with `accumulate`, into the
/// row-major `dst` with `dst_stride` values between its rows, on the calling thread.
#[allow(clippy::too_many_arguments)]
pub(crate) fn product_into(
    (m, n, k): (usize, usize, usize),
    lhs: Operand,
    rhs: Operand,
    dst: &mut [f32],
    dst_stride: usize,
    accumulate: bool,
) {
    matmul(m, n, k, dst, dst_stride, accumulate, lhs, rhs, false);
}
