//! How loss-tolerant packets travel (`--transport`): which strategies and networks the
//! datagram transport applies to, DLCP's packet size on each transport, each process's
//! datagram addresses and the rate controller's settings.

use std::net::{IpAddr, Ipv4Addr};
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use syncopate_core::net::{NetworkProfile, RateConfig};
use syncopate_core::strategy::StrategyKind;
use syncopate_core::wire::datagram::{max_packet_bytes, DEFAULT_MTU};

use crate::comm::DatagramOptions;

/// How loss-tolerant packets travel.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Transport {
    /// On the TCP links, with every other frame (the emulation flags decide their fate).
    #[default]
    Tcp,
    /// As UDP datagrams that the real network may drop; the TCP links keep the handshake,
    /// control and reliable frames.
    Udp,
}

/// Why a transport does not apply to a job, or its settings are wrong.
#[derive(Debug, thiserror::Error)]
pub enum TransportError {
    /// `--transport udp` for a strategy whose frames are all reliable.
    #[error(
        "--transport udp applies to --strategy dlcp and dlcp-allreduce only: the frames \
         of {0} are all reliable and travel on TCP"
    )]
    ReliableStrategy(&'static str),
    /// `--transport udp` on an emulated network.
    #[error(
        "--transport udp sends over the real network: the emulation flags (--bandwidth, \
         --latency, --loss, --queue, --ingress, --network ...) do not apply to it (only \
         --paths, the number of real paths); shape a real network instead, e.g. with \
         scripts/netns-cluster.sh"
    )]
    Emulated,
    /// No packet fits the MTU (never for [`DEFAULT_MTU`]).
    #[error("no packet fits a {DEFAULT_MTU}-byte MTU")]
    NoPacketFits,
    /// `--packet-bytes` larger than one unfragmented datagram carries.
    #[error(
        "--packet-bytes {bytes}: with --transport udp a packet travels as one datagram and \
         must fit a {DEFAULT_MTU}-byte MTU unfragmented: at most {fits} bytes"
    )]
    PacketTooLarge {
        /// The packet size given.
        bytes: usize,
        /// The largest that fits.
        fits: usize,
    },
    /// A setting of the datagram transport given for tcp.
    #[error("{0} applies to --transport udp only")]
    UdpOnly(&'static str),
    /// `--udp-addrs` with another count than the paths.
    #[error(
        "--udp-addrs gives {given} address(es) for {paths} path(s): give one per path \
         (--paths {paths})"
    )]
    AddressCount {
        /// Addresses given.
        given: usize,
        /// The network's paths.
        paths: usize,
    },
    /// Several paths off loopback without `--udp-addrs`.
    #[error(
        "--paths {0} with --transport udp: give this host's address on each path with \
         --udp-addrs IP,IP,..."
    )]
    NoAddresses(usize),
    /// The `--rate-control` file could not be read.
    #[error("--rate-control: reading {}", path.display())]
    ReadRateControl {
        /// The file.
        path: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// The `--rate-control` file is not the rate controller's TOML.
    #[error("--rate-control {}", path.display())]
    ParseRateControl {
        /// The file.
        path: PathBuf,
        /// Why.
        #[source]
        source: toml::de::Error,
    },
    /// The `--rate-control` settings are out of their ranges.
    #[error("--rate-control {}: {reason}", path.display())]
    InvalidRateControl {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        reason: String,
    },
}

impl Transport {
    /// Every transport, in the order `--help` lists them.
    pub const ALL: [Transport; 2] = [Transport::Tcp, Transport::Udp];

    /// The transport's name on the command line and in files.
    pub fn name(self) -> &'static str {
        match self {
            Transport::Tcp => "tcp",
            Transport::Udp => "udp",
        }
    }

    /// What the transport does, in one sentence (`--help`).
    pub fn description(self) -> &'static str {
        match self {
            Transport::Tcp => {
                "On the TCP links, with every other frame (the emulation flags decide their fate)"
            }
            Transport::Udp => {
                "As UDP datagrams that the real network may drop; the TCP links keep the \
                 handshake, control and reliable frames"
            }
        }
    }

    /// The transport named `name`, if any.
    pub fn from_name(name: &str) -> Option<Transport> {
        Self::ALL.into_iter().find(|t| t.name() == name)
    }

    /// DLCP's packet payload in values on this transport: `given_bytes` (`--packet-bytes`,
    /// a positive multiple of 4) where given, else `default_elems` on tcp; on udp a packet
    /// is one datagram within an Ethernet MTU without IP fragmentation (a lost fragment
    /// loses the whole datagram), so a given size must fit and the default is the largest
    /// that does. The one place a job's packet size is decided.
    pub fn packet_elems(
        self,
        given_bytes: Option<usize>,
        default_elems: usize,
    ) -> Result<usize, TransportError> {
        if self == Transport::Tcp {
            return Ok(given_bytes.map_or(default_elems, |b| b / 4));
        }
        let fits = max_packet_bytes(DEFAULT_MTU).ok_or(TransportError::NoPacketFits)?;
        match given_bytes {
            Some(bytes) if bytes > fits => Err(TransportError::PacketTooLarge { bytes, fits }),
            Some(bytes) => Ok(bytes / 4),
            None => Ok(fits / 4),
        }
    }

    /// Checks this transport against the job's strategy and network: udp carries the
    /// packets of the loss-tolerant strategies only, over the real network (no emulation
    /// but the number of paths).
    pub fn check(
        self,
        strategy: StrategyKind,
        network: &NetworkProfile,
    ) -> Result<(), TransportError> {
        if self == Transport::Tcp {
            return Ok(());
        }
        if !strategy.loss_tolerant() {
            return Err(TransportError::ReliableStrategy(strategy.name()));
        }
        let bare = NetworkProfile {
            paths: network.paths,
            buffer_bytes: network.buffer_bytes,
            ..NetworkProfile::default()
        };
        if *network != bare {
            return Err(TransportError::Emulated);
        }
        Ok(())
    }

    /// This process's datagram options (`None` for tcp): its address on each of the
    /// network's `paths`, from `udp_addrs` (`--udp-addrs`), else `bind_ip` for one path,
    /// else (on loopback) 127.0.0.1, 127.0.0.2, ... one per path; the rate controller's
    /// settings from `rate_file` (`--rate-control`) over core's defaults.
    pub fn datagram_options(
        self,
        udp_addrs: &[IpAddr],
        rate_file: Option<&Path>,
        paths: usize,
        bind_ip: IpAddr,
    ) -> Result<Option<DatagramOptions>, TransportError> {
        let rate = self.rate_config(rate_file)?;
        if self == Transport::Tcp {
            if !udp_addrs.is_empty() {
                return Err(TransportError::UdpOnly("--udp-addrs"));
            }
            return Ok(None);
        }
        let addrs = if !udp_addrs.is_empty() {
            if udp_addrs.len() != paths {
                return Err(TransportError::AddressCount {
                    given: udp_addrs.len(),
                    paths,
                });
            }
            udp_addrs.to_vec()
        } else if paths == 1 {
            vec![bind_ip]
        } else if bind_ip.is_loopback() {
            (1..=paths)
                .map(|p| IpAddr::V4(Ipv4Addr::new(127, 0, 0, p as u8)))
                .collect()
        } else {
            return Err(TransportError::NoAddresses(paths));
        };
        Ok(Some(DatagramOptions { addrs, rate }))
    }
}

impl std::fmt::Display for Transport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl Transport {
    /// The datagram rate controller's settings (`--rate-control`): core's defaults, or the
    /// TOML file `file` over them, checked (udp only).
    pub fn rate_config(self, file: Option<&Path>) -> Result<RateConfig, TransportError> {
        rate_config(self, file)
    }
}

/// See [`Transport::rate_config`].
fn rate_config(transport: Transport, file: Option<&Path>) -> Result<RateConfig, TransportError> {
    let Some(path) = file else {
        return Ok(RateConfig::default());
    };
    if transport == Transport::Tcp {
        return Err(TransportError::UdpOnly("--rate-control"));
    }
    let text = std::fs::read_to_string(path).map_err(|source| TransportError::ReadRateControl {
        path: path.to_path_buf(),
        source,
    })?;
    let config: RateConfig =
        toml::from_str(&text).map_err(|source| TransportError::ParseRateControl {
            path: path.to_path_buf(),
            source,
        })?;
    config
        .validate()
        .map_err(|reason| TransportError::InvalidRateControl {
            path: path.to_path_buf(),
            reason,
        })?;
    Ok(config)
}

#[cfg(test)]
mod tests {
    use super::*;

    const DEFAULT: usize = 2048;

    #[test]
    fn udp_takes_the_largest_packet_that_fits_one_datagram() {
        assert_eq!(
            Transport::Udp.packet_elems(None, DEFAULT).unwrap() * 4,
            1388
        );
        assert_eq!(
            Transport::Udp.packet_elems(Some(400), DEFAULT).unwrap(),
            100
        );
        let e = Transport::Udp
            .packet_elems(Some(8192), DEFAULT)
            .unwrap_err()
            .to_string();
        assert!(e.contains("at most 1388 bytes"), "{e}");
        assert_eq!(Transport::Tcp.packet_elems(None, DEFAULT).unwrap(), DEFAULT);
        assert_eq!(
            Transport::Tcp.packet_elems(Some(8192), DEFAULT).unwrap(),
            2048
        );
    }

    #[test]
    fn udp_is_refused_for_reliable_strategies_and_emulated_networks() {
        let bare = NetworkProfile::default();
        let e = Transport::Udp
            .check(StrategyKind::P3, &bare)
            .unwrap_err()
            .to_string();
        assert!(e.contains("dlcp and dlcp-allreduce only"), "{e}");
        let lossy = NetworkProfile {
            loss: 0.01,
            ..NetworkProfile::default()
        };
        let e = Transport::Udp
            .check(StrategyKind::Dlcp, &lossy)
            .unwrap_err()
            .to_string();
        assert!(e.contains("emulation flags"), "{e}");
        Transport::Udp.check(StrategyKind::Dlcp, &bare).unwrap();
        Transport::Tcp.check(StrategyKind::P3, &lossy).unwrap();
    }

    #[test]
    fn a_rate_control_file_overrides_some_defaults_and_is_checked() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("rate.toml");
        std::fs::write(&file, "t_low_ns = 1000000\nt_high_ns = 4000000\n").unwrap();
        let c = rate_config(Transport::Udp, Some(&file)).unwrap();
        assert_eq!((c.t_low_ns, c.t_high_ns), (1_000_000, 4_000_000));
        assert_eq!(c.beta, RateConfig::default().beta);
        std::fs::write(&file, "t_low_ns = 5000000\nt_high_ns = 4000000\n").unwrap();
        assert!(rate_config(Transport::Udp, Some(&file)).is_err());
        std::fs::write(&file, "t_lo_ns = 1\n").unwrap();
        assert!(rate_config(Transport::Udp, Some(&file)).is_err());
        let e = rate_config(Transport::Tcp, Some(&file))
            .unwrap_err()
            .to_string();
        assert!(e.contains("--transport udp only"), "{e}");
    }

    #[test]
    fn each_path_gets_an_address() {
        let local = IpAddr::V4(Ipv4Addr::LOCALHOST);
        let o = Transport::Udp
            .datagram_options(&[], None, 2, local)
            .unwrap()
            .unwrap();
        assert_eq!(
            o.addrs,
            [
                "127.0.0.1".parse::<IpAddr>().unwrap(),
                "127.0.0.2".parse().unwrap()
            ]
        );
        let remote: IpAddr = "10.77.0.2".parse().unwrap();
        let udp = |addrs: &[IpAddr], t: Transport| {
            t.datagram_options(addrs, None, 2, remote)
                .unwrap_err()
                .to_string()
        };
        assert!(udp(&[], Transport::Udp).contains("--udp-addrs"));
        assert!(udp(&[remote], Transport::Udp).contains("one per path"));
        assert!(udp(&[remote], Transport::Tcp).contains("--transport udp only"));
        let tcp = Transport::Tcp.datagram_options(&[], None, 2, remote);
        assert!(tcp.unwrap().is_none());
    }

    #[test]
    fn names_round_trip() {
        for t in Transport::ALL {
            assert_eq!(Transport::from_name(t.name()), Some(t));
        }
    }
}
