//! Parsers of the human-readable quantities a network profile is written in (bandwidths,
//! durations, sizes, probabilities), and the serde helpers that accept either a number or
//! such a string in a TOML profile.

/// A malformed bandwidth, duration, size or probability.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{what} '{input}': {why}")]
pub struct ParseError {
    what: &'static str,
    input: String,
    why: &'static str,
}

impl ParseError {
    fn new(what: &'static str, input: &str, why: &'static str) -> Self {
        Self {
            what,
            input: input.into(),
            why,
        }
    }
}

/// Splits `12.5gbit` into `(12.5, "gbit")`; `None` unless the number is finite and >= 0.
fn split_number(s: &str) -> Option<(f64, String)> {
    let s = s.trim();
    let idx = s
        .find(|c: char| !(c.is_ascii_digit() || c == '.' || c == 'e' || c == 'E' || c == '_'))
        .unwrap_or(s.len());
    let (num, unit) = s.split_at(idx);
    let num: f64 = num.replace('_', "").parse().ok()?;
    (num.is_finite() && num >= 0.0).then(|| (num, unit.trim().to_ascii_lowercase()))
}

/// Parses a bandwidth such as `1gbit`, `100mbit`, `25Gbit/s`, `10gbps`, `500kbit` or a
/// plain number of bits per second; `unlimited`/`none` gives `None`.
pub fn parse_bandwidth(s: &str) -> Result<Option<f64>, ParseError> {
    let err = |why| ParseError::new("bandwidth", s, why);
    let lower = s.trim().to_ascii_lowercase();
    if matches!(lower.as_str(), "unlimited" | "none" | "inf" | "0") {
        return Ok(None);
    }
    let (n, unit) =
        split_number(s).ok_or_else(|| err("expected a number then a unit, e.g. 1gbit"))?;
    let unit = unit.trim_end_matches("/s").trim_end_matches("ps");
    let factor = match unit {
        "" | "bit" | "b" => 1.0,
        "kbit" | "k" | "kb" => 1e3,
        "mbit" | "m" | "mb" => 1e6,
        "gbit" | "g" | "gb" => 1e9,
        "tbit" | "t" | "tb" => 1e12,
        _ => return Err(err("unknown unit (use bit, kbit, mbit, gbit or tbit)")),
    };
    let bps = n * factor;
    if !(bps > 0.0 && bps.is_finite()) {
        return Err(err("must be positive and finite"));
    }
    Ok(Some(bps))
}

/// Parses a duration such as `2ms`, `150us`, `1.5s`, `0` (a bare number is seconds).
pub fn parse_duration_ns(s: &str) -> Result<u64, ParseError> {
    let err = |why| ParseError::new("duration", s, why);
    let (n, unit) =
        split_number(s).ok_or_else(|| err("expected a number then a unit, e.g. 2ms"))?;
    let factor = match unit.as_str() {
        "ns" => 1.0,
        "us" | "µs" => 1e3,
        "ms" => 1e6,
        "s" | "" => 1e9,
        _ => return Err(err("unknown unit (use ns, us, ms or s)")),
    };
    let ns = (n * factor).round();
    if ns >= u64::MAX as f64 {
        return Err(err("too long"));
    }
    Ok(ns as u64)
}

/// Parses a size such as `4MiB`, `512KiB`, `1MB`, `65536`.
pub fn parse_size(s: &str) -> Result<usize, ParseError> {
    let err = |why| ParseError::new("size", s, why);
    let (n, unit) =
        split_number(s).ok_or_else(|| err("expected a number then a unit, e.g. 4MiB"))?;
    let factor = match unit.as_str() {
        "" | "b" => 1.0,
        "kb" => 1e3,
        "mb" => 1e6,
        "gb" => 1e9,
        "kib" | "k" => 1024.0,
        "mib" | "m" => 1024.0 * 1024.0,
        "gib" | "g" => 1024.0 * 1024.0 * 1024.0,
        _ => return Err(err("unknown unit (use B, KiB, MiB, GiB, kB, MB, GB)")),
    };
    let bytes = (n * factor).round();
    if bytes >= usize::MAX as f64 {
        return Err(err("too large"));
    }
    Ok(bytes as usize)
}

/// Parses a probability written as a percentage (`1%`, `0.5 %`) or a fraction (`0.01`), in
/// `[0, 1]`.
pub fn parse_probability(s: &str) -> Result<f64, ParseError> {
    let err = |why| ParseError::new("probability", s, why);
    let t = s.trim();
    let (text, scale) = match t.strip_suffix('%') {
        Some(rest) => (rest.trim(), 0.01),
        None => (t, 1.0),
    };
    let n: f64 = text
        .parse()
        .map_err(|_| err("expected a fraction (0.01) or a percentage (1%)"))?;
    let p = n * scale;
    if !(0.0..=1.0).contains(&p) {
        return Err(err("must be between 0 and 100 %"));
    }
    Ok(p)
}

/// Serde helpers: fields that accept a number or a string with a unit.
pub(crate) mod serde_helpers {
    use serde::{Deserialize, Deserializer, Serializer};

    #[derive(Deserialize)]
    #[serde(untagged)]
    enum Either {
        Number(f64),
        Text(String),
    }

    /// `Option<f64>` bits per second from a number (0 or less: unlimited) or `"1gbit"`.
    pub mod bandwidth {
        use super::*;

        /// Writes the number of bits per second, or nothing when unlimited.
        pub fn serialize<S: Serializer>(v: &Option<f64>, s: S) -> Result<S::Ok, S::Error> {
            match v {
                Some(bps) => s.serialize_f64(*bps),
                None => s.serialize_none(),
            }
        }

        /// Reads a number of bits per second or a bandwidth string.
        pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Option<f64>, D::Error> {
            match Option::<Either>::deserialize(d)? {
                None => Ok(None),
                Some(Either::Number(n)) if n > 0.0 => Ok(Some(n)),
                Some(Either::Number(n)) => Err(serde::de::Error::custom(format!(
                    "bandwidth {n}: must be positive (leave it out for an unlimited link)"
                ))),
                Some(Either::Text(t)) => {
                    super::super::parse_bandwidth(&t).map_err(serde::de::Error::custom)
                }
            }
        }
    }

    /// Nanoseconds from an integer or a duration string (`"1ms"`).
    pub mod duration {
        use super::*;

        /// Writes the integer number of nanoseconds.
        pub fn serialize<S: Serializer>(v: &u64, s: S) -> Result<S::Ok, S::Error> {
            s.serialize_u64(*v)
        }

        /// Reads nanoseconds or a duration string.
        pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<u64, D::Error> {
            match Either::deserialize(d)? {
                Either::Number(n) if n >= 0.0 && n < u64::MAX as f64 => Ok(n.round() as u64),
                Either::Number(n) => Err(serde::de::Error::custom(format!(
                    "duration {n}: must be a non-negative number of nanoseconds"
                ))),
                Either::Text(t) => {
                    super::super::parse_duration_ns(&t).map_err(serde::de::Error::custom)
                }
            }
        }
    }

    /// An optional duration (`None`: unset).
    pub mod opt_duration {
        use super::*;

        /// Writes the integer number of nanoseconds, or nothing.
        pub fn serialize<S: Serializer>(v: &Option<u64>, s: S) -> Result<S::Ok, S::Error> {
            match v {
                Some(ns) => s.serialize_u64(*ns),
                None => s.serialize_none(),
            }
        }

        /// Reads nanoseconds or a duration string.
        pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Option<u64>, D::Error> {
            super::duration::deserialize(d).map(Some)
        }
    }

    /// Bytes from an integer or a size string (`"256KiB"`).
    pub mod size {
        use super::*;

        /// Writes the integer number of bytes.
        pub fn serialize<S: Serializer>(v: &usize, s: S) -> Result<S::Ok, S::Error> {
            s.serialize_u64(*v as u64)
        }

        /// Reads bytes or a size string.
        pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<usize, D::Error> {
            match Either::deserialize(d)? {
                Either::Number(n) if n >= 0.0 && n < usize::MAX as f64 => Ok(n.round() as usize),
                Either::Number(n) => Err(serde::de::Error::custom(format!(
                    "size {n}: must be a non-negative number of bytes"
                ))),
                Either::Text(t) => super::super::parse_size(&t).map_err(serde::de::Error::custom),
            }
        }
    }

    /// An optional size (`None`: unbounded).
    pub mod opt_size {
        use super::*;

        /// Writes the integer number of bytes, or nothing.
        pub fn serialize<S: Serializer>(v: &Option<usize>, s: S) -> Result<S::Ok, S::Error> {
            match v {
                Some(b) => s.serialize_u64(*b as u64),
                None => s.serialize_none(),
            }
        }

        /// Reads bytes, a size string, or `"unlimited"`.
        pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Option<usize>, D::Error> {
            match Option::<Either>::deserialize(d)? {
                None => Ok(None),
                Some(Either::Text(t)) if t.trim().eq_ignore_ascii_case("unlimited") => Ok(None),
                Some(Either::Text(t)) => super::super::parse_size(&t)
                    .map(Some)
                    .map_err(serde::de::Error::custom),
                Some(Either::Number(n)) if n >= 0.0 && n < usize::MAX as f64 => {
                    Ok(Some(n.round() as usize))
                }
                Some(Either::Number(n)) => Err(serde::de::Error::custom(format!(
                    "size {n}: must be a non-negative number of bytes"
                ))),
            }
        }
    }

    /// A probability from a fraction (`0.01`) or a percentage string (`"1%"`). Range checks
    /// are left to `validate()`, which names the field.
    pub mod probability {
        use super::*;

        /// Writes the fraction.
        pub fn serialize<S: Serializer>(v: &f64, s: S) -> Result<S::Ok, S::Error> {
            s.serialize_f64(*v)
        }

        /// Reads a fraction or a percentage string.
        pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<f64, D::Error> {
            match Either::deserialize(d)? {
                Either::Number(n) => Ok(n),
                Either::Text(t) => {
                    super::super::parse_probability(&t).map_err(serde::de::Error::custom)
                }
            }
        }
    }

    /// An optional probability.
    pub mod opt_probability {
        use super::*;

        /// Writes the fraction, or nothing.
        pub fn serialize<S: Serializer>(v: &Option<f64>, s: S) -> Result<S::Ok, S::Error> {
            match v {
                Some(p) => s.serialize_f64(*p),
                None => s.serialize_none(),
            }
        }

        /// Reads a fraction or a percentage string.
        pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Option<f64>, D::Error> {
            match Option::<Either>::deserialize(d)? {
                None => Ok(None),
                Some(Either::Number(n)) => Ok(Some(n)),
                Some(Either::Text(t)) => super::super::parse_probability(&t)
                    .map(Some)
                    .map_err(serde::de::Error::custom),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_units() {
        assert_eq!(parse_bandwidth("1gbit").unwrap(), Some(1e9));
        assert_eq!(parse_bandwidth("100Mbit/s").unwrap(), Some(1e8));
        assert_eq!(parse_bandwidth("25gbps").unwrap(), Some(25e9));
        assert_eq!(parse_bandwidth("unlimited").unwrap(), None);
        assert!(parse_bandwidth("fast").is_err());
        assert!(parse_bandwidth("1 parsec")
            .unwrap_err()
            .to_string()
            .contains("unit"));
        assert_eq!(parse_duration_ns("2ms").unwrap(), 2_000_000);
        assert_eq!(parse_duration_ns("150us").unwrap(), 150_000);
        assert_eq!(parse_size("4MiB").unwrap(), 4 << 20);
        assert_eq!(parse_size("1MB").unwrap(), 1_000_000);
    }

    #[test]
    fn parses_probabilities() {
        assert_eq!(parse_probability("1%").unwrap(), 0.01);
        assert_eq!(parse_probability("0.25").unwrap(), 0.25);
        assert_eq!(parse_probability("100 %").unwrap(), 1.0);
        assert!(parse_probability("101%").is_err());
        assert!(parse_probability("-1%").is_err());
        assert!(parse_probability("NaN").is_err());
        assert!(parse_probability("lots").is_err());
    }
}
