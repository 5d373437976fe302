//! Emulated links: the profile (bandwidth, latency, send buffer) and the arithmetic that
//! turns it into release times. Time is passed in as nanoseconds from any fixed origin; the
//! runtime uses a monotonic clock, the simulator its virtual clock.

use serde::{Deserialize, Serialize};

/// How a link behaves.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LinkProfile {
    /// Bandwidth in bits per second; `None` means as fast as the transport goes.
    #[serde(with = "bandwidth_serde", default)]
    pub bandwidth_bps: Option<f64>,
    /// One-way latency in nanoseconds.
    #[serde(default)]
    pub latency_ns: u64,
    /// The send window: bytes the sender may have given to the link and not yet serialised;
    /// the scheduler is asked for the next frame only when the link holds less than this,
    /// which bounds how far ahead of a late urgent frame the queued ones can be.
    #[serde(default = "default_buffer")]
    pub buffer_bytes: usize,
}

fn default_buffer() -> usize {
    DEFAULT_BUFFER_BYTES
}

/// Default send window of a link (256 KiB: 2 ms at 1 Gbit/s, a few P3 slices).
pub const DEFAULT_BUFFER_BYTES: usize = 256 << 10;

impl Default for LinkProfile {
    fn default() -> Self {
        Self {
            bandwidth_bps: None,
            latency_ns: 0,
            buffer_bytes: DEFAULT_BUFFER_BYTES,
        }
    }
}

/// A malformed bandwidth, duration or size.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{what} '{input}': {why}")]
pub struct ParseError {
    what: &'static str,
    input: String,
    why: &'static str,
}

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
    let err = |why| ParseError {
        what: "bandwidth",
        input: s.into(),
        why,
    };
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
    if bps <= 0.0 {
        return Err(err("must be positive"));
    }
    Ok(Some(bps))
}

/// Parses a duration such as `2ms`, `150us`, `1.5s`, `0`.
pub fn parse_duration_ns(s: &str) -> Result<u64, ParseError> {
    let err = |why| ParseError {
        what: "duration",
        input: s.into(),
        why,
    };
    let (n, unit) =
        split_number(s).ok_or_else(|| err("expected a number then a unit, e.g. 2ms"))?;
    let factor = match unit.as_str() {
        "ns" => 1.0,
        "us" | "µs" => 1e3,
        "ms" => 1e6,
        "s" | "" => 1e9,
        _ => return Err(err("unknown unit (use ns, us, ms or s)")),
    };
    Ok((n * factor).round() as u64)
}

/// Parses a size such as `4MiB`, `512KiB`, `1MB`, `65536`.
pub fn parse_size(s: &str) -> Result<usize, ParseError> {
    let err = |why| ParseError {
        what: "size",
        input: s.into(),
        why,
    };
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
    Ok((n * factor).round() as usize)
}

mod bandwidth_serde {
    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(v: &Option<f64>, s: S) -> Result<S::Ok, S::Error> {
        match v {
            Some(bps) => s.serialize_f64(*bps),
            None => s.serialize_none(),
        }
    }

    #[derive(Deserialize)]
    #[serde(untagged)]
    enum Either {
        Number(f64),
        Text(String),
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Option<f64>, D::Error> {
        match Option::<Either>::deserialize(d)? {
            None => Ok(None),
            Some(Either::Number(n)) if n > 0.0 => Ok(Some(n)),
            Some(Either::Number(_)) => Ok(None),
            Some(Either::Text(t)) => super::parse_bandwidth(&t).map_err(serde::de::Error::custom),
        }
    }
}

/// The sender's side of an emulated link: a serialising queue at the link's bandwidth
/// followed by the propagation delay.
#[derive(Debug, Clone)]
pub struct Shaper {
    profile: LinkProfile,
    free_at_ns: u64,
}

impl Shaper {
    /// A shaper for `profile`.
    pub fn new(profile: LinkProfile) -> Self {
        Self {
            profile,
            free_at_ns: 0,
        }
    }

    /// The profile.
    pub fn profile(&self) -> &LinkProfile {
        &self.profile
    }

    /// Nanoseconds that `bytes` occupy the link at its bandwidth.
    pub fn transmission_ns(&self, bytes: usize) -> u64 {
        match self.profile.bandwidth_bps {
            Some(bps) => ((bytes as f64 * 8.0 / bps) * 1e9).round() as u64,
            None => 0,
        }
    }

    /// Schedules a frame of `bytes` offered at `now_ns`: it starts serialising when the link
    /// is free, and is delivered (released to the receiver) after its last bit plus the
    /// latency. Returns the delivery time.
    pub fn schedule(&mut self, now_ns: u64, bytes: usize) -> u64 {
        let start = now_ns.max(self.free_at_ns);
        let done = start + self.transmission_ns(bytes);
        self.free_at_ns = done;
        done + self.profile.latency_ns
    }

    /// When the link finishes serialising what it has been given.
    pub fn free_at_ns(&self) -> u64 {
        self.free_at_ns
    }

    /// Bytes given to the link and not yet serialised at `now_ns` (0 without a bandwidth).
    pub fn backlog_bytes(&self, now_ns: u64) -> usize {
        match self.profile.bandwidth_bps {
            Some(bps) => {
                let ns = self.free_at_ns.saturating_sub(now_ns) as f64;
                (ns * 1e-9 * bps / 8.0).ceil() as usize
            }
            None => 0,
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
    fn profile_from_toml() {
        let p: LinkProfile =
            toml::from_str("bandwidth_bps = \"1gbit\"\nlatency_ns = 1000").unwrap();
        assert_eq!(p.bandwidth_bps, Some(1e9));
        assert_eq!(p.buffer_bytes, DEFAULT_BUFFER_BYTES);
    }

    /// 100 MB at 1 Gbit/s takes 0.8 s, whatever the frame size, plus the latency once.
    #[test]
    fn shaper_times_are_exact() {
        let mut s = Shaper::new(LinkProfile {
            bandwidth_bps: Some(1e9),
            latency_ns: 1_000_000,
            buffer_bytes: 1 << 20,
        });
        let mut last = 0;
        for _ in 0..100 {
            last = s.schedule(0, 1_000_000);
        }
        assert_eq!(s.free_at_ns(), 800_000_000);
        assert_eq!(last, 801_000_000);
        // A frame offered after the link went idle starts at its offer time.
        assert_eq!(
            s.schedule(900_000_000, 125),
            900_000_000 + 1_000 + 1_000_000
        );
    }
}
