//! Small statistics the commands' outputs share.

/// The `q` quantile of `numbers` (the value at `q` of their count, sorted), NaN for none.
pub(crate) fn quantile(numbers: &[f64], q: f64) -> f64 {
    let mut sorted = numbers.to_vec();
    sorted.sort_by(f64::total_cmp);
    let i = ((q * sorted.len() as f64) as usize).min(sorted.len().saturating_sub(1));
    sorted.get(i).copied().unwrap_or(f64::NAN)
}
