//! `--transport udp`: which strategies and networks the datagram transport applies to, the
//! packet size that fits one unfragmented datagram, and each process's datagram addresses.

use std::net::{IpAddr, Ipv4Addr};
use std::path::Path;

use anyhow::{bail, Context, Result};
use clap::ValueEnum;
use serde::{Deserialize, Serialize};
use syncopate_core::net::{NetworkProfile, RateConfig};
use syncopate_core::wire::datagram::{max_packet_bytes, DEFAULT_MTU};
use syncopate_runtime::comm::DatagramOptions;
use syncopate_runtime::job::JobLayout;

/// How loss-tolerant packets travel.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, ValueEnum, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Transport {
    /// On the TCP links, with every other frame (the emulation flags decide their fate).
    #[default]
    Tcp,
    /// As UDP datagrams that the real network may drop; the TCP links keep the handshake,
    /// control and reliable frames.
    Udp,
}

/// Checks `--transport udp` against the job and sizes DLCP's packets for it: one packet,
/// one datagram, within an Ethernet MTU without IP fragmentation (a lost fragment loses
/// the whole datagram). `packet_bytes_given`: whether `--packet-bytes` was set (then it
/// must fit; otherwise the largest that fits is taken).
pub fn apply(transport: Transport, layout: &mut JobLayout, packet_bytes_given: bool) -> Result<()> {
    if transport == Transport::Tcp {
        return Ok(());
    }
    let strategy = layout.sync.strategy;
    if !strategy.loss_tolerant() {
        bail!(
            "--transport udp applies to --strategy dlcp and dlcp-allreduce only: the frames \
             of {} are all reliable and travel on TCP",
            strategy.name()
        );
    }
    let n = &layout.network;
    let bare = NetworkProfile {
        paths: n.paths,
        buffer_bytes: n.buffer_bytes,
        ..NetworkProfile::default()
    };
    if *n != bare {
        bail!(
            "--transport udp sends over the real network: the emulation flags (--bandwidth, \
             --latency, --loss, --queue, --ingress, --network ...) do not apply to it (only \
             --paths, the number of real paths); shape a real network instead, e.g. with \
             scripts/netns-cluster.sh"
        );
    }
    let Some(fits) = max_packet_bytes(DEFAULT_MTU) else {
        bail!("no packet fits a {DEFAULT_MTU}-byte MTU");
    };
    let dlcp = &mut layout.sync.dlcp;
    let bytes = dlcp.packet_elems.saturating_mul(4);
    if packet_bytes_given && bytes > fits {
        bail!(
            "--packet-bytes {bytes}: with --transport udp a packet travels as one datagram and \
             must fit a {DEFAULT_MTU}-byte MTU unfragmented: at most {fits} bytes"
        );
    }
    if !packet_bytes_given {
        dlcp.packet_elems = fits / 4;
    }
    Ok(())
}

/// This process's datagram options under `--transport udp` (`None` for tcp): its address
/// on each of the network's paths, from `--udp-addrs`, else `bind_ip` for one path, else
/// (on loopback) 127.0.0.1, 127.0.0.2, ... one per path.
pub fn options(
    transport: Transport,
    udp_addrs: &[IpAddr],
    layout: &JobLayout,
    bind_ip: IpAddr,
) -> Result<Option<DatagramOptions>> {
    if transport == Transport::Tcp {
        if !udp_addrs.is_empty() {
            bail!("--udp-addrs applies to --transport udp only");
        }
        return Ok(None);
    }
    let paths = layout.network.paths;
    let addrs = if !udp_addrs.is_empty() {
        if udp_addrs.len() != paths {
            bail!(
                "--udp-addrs gives {} address(es) for {paths} path(s): give one per path \
                 (--paths {paths})",
                udp_addrs.len()
            );
        }
        udp_addrs.to_vec()
    } else if paths == 1 {
        vec![bind_ip]
    } else if bind_ip.is_loopback() {
        (1..=paths)
            .map(|p| IpAddr::V4(Ipv4Addr::new(127, 0, 0, p as u8)))
            .collect()
    } else {
        bail!("--paths {paths} with --transport udp: give this host's address on each path with --udp-addrs IP,IP,...");
    };
    Ok(Some(DatagramOptions {
        addrs,
        rate: RateConfig::default(),
    }))
}

/// The rate controller's settings: core's defaults, or `--rate-control FILE` over them
/// (udp only).
pub fn rate_config(transport: Transport, file: Option<&Path>) -> Result<RateConfig> {
    let Some(path) = file else {
        return Ok(RateConfig::default());
    };
    if transport == Transport::Tcp {
        bail!("--rate-control applies to --transport udp only");
    }
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("--rate-control: reading {}", path.display()))?;
    let config: RateConfig =
        toml::from_str(&text).with_context(|| format!("--rate-control {}", path.display()))?;
    config
        .validate()
        .map_err(|e| anyhow::anyhow!("--rate-control {}: {e}", path.display()))?;
    Ok(config)
}

#[cfg(test)]
mod tests {
    use super::*;
    use syncopate_core::strategy::{StrategyKind, SyncPlan};

    fn layout(strategy: StrategyKind, network: NetworkProfile) -> JobLayout {
        JobLayout {
            sync: SyncPlan::new(strategy, 2, usize::from(strategy.uses_servers())),
            network,
            net_seed: 0,
        }
    }

    #[test]
    fn udp_takes_the_largest_packet_that_fits_one_datagram() {
        let mut l = layout(StrategyKind::Dlcp, NetworkProfile::default());
        apply(Transport::Udp, &mut l, false).unwrap();
        assert_eq!(l.sync.dlcp.packet_elems * 4, 1388);
        let mut l = layout(StrategyKind::Dlcp, NetworkProfile::default());
        l.sync.dlcp.packet_elems = 2048;
        let e = apply(Transport::Udp, &mut l, true).unwrap_err().to_string();
        assert!(e.contains("at most 1388 bytes"), "{e}");
    }

    #[test]
    fn udp_is_refused_for_reliable_strategies_and_emulated_networks() {
        let mut l = layout(StrategyKind::P3, NetworkProfile::default());
        let e = apply(Transport::Udp, &mut l, false)
            .unwrap_err()
            .to_string();
        assert!(e.contains("dlcp and dlcp-allreduce only"), "{e}");
        let lossy = NetworkProfile {
            loss: 0.01,
            ..NetworkProfile::default()
        };
        let mut l = layout(StrategyKind::Dlcp, lossy);
        let e = apply(Transport::Udp, &mut l, false)
            .unwrap_err()
            .to_string();
        assert!(e.contains("emulation flags"), "{e}");
        let mut l = layout(StrategyKind::Dlcp, NetworkProfile::default());
        apply(Transport::Tcp, &mut l, false).unwrap();
        assert_eq!(
            l.sync.dlcp.packet_elems,
            SyncPlan::new(StrategyKind::Dlcp, 2, 1).dlcp.packet_elems
        );
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
        let two = NetworkProfile {
            paths: 2,
            ..NetworkProfile::default()
        };
        let l = layout(StrategyKind::Dlcp, two);
        let local = IpAddr::V4(Ipv4Addr::LOCALHOST);
        let o = options(Transport::Udp, &[], &l, local).unwrap().unwrap();
        assert_eq!(
            o.addrs,
            [
                "127.0.0.1".parse::<IpAddr>().unwrap(),
                "127.0.0.2".parse().unwrap()
            ]
        );
        let remote: IpAddr = "10.77.0.2".parse().unwrap();
        let e = options(Transport::Udp, &[], &l, remote)
            .unwrap_err()
            .to_string();
        assert!(e.contains("--udp-addrs"), "{e}");
        let e = options(Transport::Udp, &[remote], &l, remote)
            .unwrap_err()
            .to_string();
        assert!(e.contains("one per path"), "{e}");
        let e = options(Transport::Tcp, &[remote], &l, remote)
            .unwrap_err()
            .to_string();
        assert!(e.contains("--transport udp only"), "{e}");
        assert!(options(Transport::Tcp, &[], &l, remote).unwrap().is_none());
    }
}
