//! How `results.csv` is written: header and rows from one type ([`table`]), and its numbers,
//! one function per column format (for `#[serde(serialize_with = ...)]` on
//! [`crate::rows::RunRow`]): fixed decimals, scientific, or as Rust displays them; NaN as
//! `NaN`.

use serde::{Serialize, Serializer};

/// A CSV file of `rows`: a header naming the columns (the type's serialised fields), then
/// one line per row, both from that one type; without rows, the header alone (named from
/// `blank`, since serde names the columns only as it writes a row).
pub fn table<T: Serialize>(rows: &[T], blank: &T) -> anyhow::Result<Vec<u8>> {
    let written = if rows.is_empty() {
        std::slice::from_ref(blank)
    } else {
        rows
    };
    let mut out = csv::Writer::from_writer(Vec::new());
    for row in written {
        out.serialize(row)?;
    }
    let text = out.into_inner().map_err(|e| e.into_error())?;
    if rows.is_empty() {
        let header_end = text
            .iter()
            .position(|&b| b == b'\n')
            .map_or(text.len(), |i| i + 1);
        return Ok(text[..header_end].to_vec());
    }
    Ok(text)
}

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
