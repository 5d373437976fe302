//! Aggregation arithmetic on `f32` slices: the inner loops of every strategy.
//!
//! Written as plain zipped loops over equal-length slices so that the compiler vectorises
//! them (no bounds checks inside, no branches).

/// `acc[i] += x[i]`.
///
/// # Panics
/// Panics if the lengths differ (a programming error; frame lengths are validated before).
pub fn add_assign(acc: &mut [f32], x: &[f32]) {
    assert_eq!(acc.len(), x.len(), "add_assign: lengths differ");
    for (a, &b) in acc.iter_mut().zip(x) {
        *a += b;
    }
}

/// `x[i] *= factor`.
pub fn scale(x: &mut [f32], factor: f32) {
    for v in x {
        *v *= factor;
    }
}

/// `out[i] = (a[i] + b[i])`, a fused copy-and-add for the first two contributions.
///
/// # Panics
/// Panics if the lengths differ.
pub fn sum_into(out: &mut [f32], a: &[f32], b: &[f32]) {
    assert!(
        out.len() == a.len() && a.len() == b.len(),
        "sum_into: lengths differ"
    );
    for ((o, &x), &y) in out.iter_mut().zip(a).zip(b) {
        *o = x + y;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        /// Adding N contributions then scaling by 1/N gives the element-wise mean, and the
        /// fused `sum_into` equals a copy followed by `add_assign` bit for bit.
        #[test]
        fn aggregation_matches_the_reference(
            parts in prop::collection::vec(prop::collection::vec(-1e3f32..1e3, 17), 1..6)
        ) {
            let mut acc = parts[0].clone();
            for p in &parts[1..] { add_assign(&mut acc, p); }
            scale(&mut acc, 1.0 / parts.len() as f32);
            for i in 0..17 {
                let mut s = parts[0][i];
                for p in &parts[1..] { s += p[i]; }
                prop_assert_eq!(acc[i], s * (1.0 / parts.len() as f32));
            }
            if parts.len() >= 2 {
                let mut fused = vec![0.0; 17];
                sum_into(&mut fused, &parts[0], &parts[1]);
                let mut two = parts[0].clone();
                add_assign(&mut two, &parts[1]);
                prop_assert_eq!(fused, two);
            }
        }
    }
}
