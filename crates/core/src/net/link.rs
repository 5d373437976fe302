//! The simple link of earlier versions: a profile of bandwidth, latency and send window
//! ([`LinkProfile`]) and a lossless FIFO serialiser ([`Shaper`]). The full model is
//! [`super::NetworkProfile`] and [`super::Port`]; with the default profile a port gives
//! exactly the shaper's release times.

use serde::{Deserialize, Serialize};

use super::{backlog_bytes, transmission_ns};

/// How a link behaves.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LinkProfile {
    /// Bandwidth in bits per second; `None` means as fast as the transport goes.
    #[serde(with = "super::parse::serde_helpers::bandwidth", default)]
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
        transmission_ns(self.profile.bandwidth_bps, bytes)
    }

    /// Schedules a frame of `bytes` offered at `now_ns`: it starts serialising when the link
    /// is free, and is delivered (released to the receiver) after its last bit plus the
    /// latency. Returns the delivery time.
    pub fn schedule(&mut self, now_ns: u64, bytes: usize) -> u64 {
        let start = now_ns.max(self.free_at_ns);
        let done = start.saturating_add(self.transmission_ns(bytes));
        self.free_at_ns = done;
        done.saturating_add(self.profile.latency_ns)
    }

    /// When the link finishes serialising what it has been given.
    pub fn free_at_ns(&self) -> u64 {
        self.free_at_ns
    }

    /// Bytes given to the link and not yet serialised at `now_ns` (0 without a bandwidth).
    pub fn backlog_bytes(&self, now_ns: u64) -> usize {
        backlog_bytes(self.profile.bandwidth_bps, self.free_at_ns, now_ns)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
