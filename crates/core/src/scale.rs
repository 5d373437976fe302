//! Scaling a full-size count down with the model (`--scale`): the one rounding rule that
//! the plan's sizes and the network's bytes share.

/// What a full-size count `n` (elements or bytes) becomes at scale `factor`: rounded up, at
/// least 1 unless `n` is 0.
pub fn scale_count(n: usize, factor: f64) -> usize {
    if n == 0 {
        0
    } else {
        ((n as f64 * factor).ceil() as usize).max(1)
    }
}
