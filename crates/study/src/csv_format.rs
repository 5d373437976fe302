//! How `results.csv` writes its numbers, one function per column format (for
//! `#[serde(serialize_with = ...)]` on [`crate::rows::RunRow`]): fixed decimals, scientific,
//! or as Rust displays them; NaN as `NaN`.

use serde::Serializer;

/// As Rust displays the number (`1`, `0.5`, `NaN`).
pub fn plain<S: Serializer>(v: &f64, s: S) -> Result<S::Ok, S::Error> {
    s.collect_str(v)
}

/// Scientific, three decimals (`2.000e-3`).
pub fn e3<S: Serializer>(v: &f64, s: S) -> Result<S::Ok, S::Error> {
    s.collect_str(&format_args!("{v:.3e}"))
}

/// Defines `name` writing a number with `digits` decimals, for each `name = digits`.
macro_rules! fixed {
    ($($name:ident = $digits:literal),* $(,)?) => {$(
        #[doc = concat!("With ", stringify!($digits), " decimals.")]
        pub fn $name<S: Serializer>(v: &f64, s: S) -> Result<S::Ok, S::Error> {
            s.collect_str(&format_args!("{:.*}", $digits, v))
        }
    )*};
}

fixed!(f0 = 0, f1 = 1, f2 = 2, f4 = 4, f6 = 6);
