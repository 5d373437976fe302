//! Builds a job's processes as the runtime does: the (scaled) keys of the model, the
//! registry, every rank's state machine and the peers it has links to.

use std::ops::Range;

use syncopate_core::profile::ModelProfile;
use syncopate_core::registry::{KeyInfo, TensorRegistry};
use syncopate_core::strategy::{Rank, ServerOptim, ServerSync, WorkerSync};

use crate::config::SimConfig;
use crate::SimError;

/// A rank's state machine (a worker's or a server's endpoint).
pub(crate) enum RankEndpoint {
    /// A worker (any strategy).
    Worker(Box<dyn WorkerSync>),
    /// A parameter server.
    Server(Box<dyn ServerSync + Send>),
}

/// The model's keys at the configured scale (one per layer with parameters, numbered from the
/// input) and the keys owned by each layer.
pub(crate) fn model_keys(
    profile: &ModelProfile,
    cfg: &SimConfig,
) -> (Vec<KeyInfo>, Vec<Range<usize>>) {
    let keys: Vec<KeyInfo> = profile
        .keys()
        .into_iter()
        .map(|(layer, numel)| KeyInfo {
            numel: cfg.scaled(numel),
            layer,
        })
        .collect();
    let mut next = 0;
    let layer_keys = (0..profile.layers.len())
        .map(|layer| {
            let start = next;
            while keys.get(next).is_some_and(|k| k.layer == layer) {
                next += 1;
            }
            start..next
        })
        .collect();
    (keys, layer_keys)
}

/// The parameter-server registry, as the runtime cuts and places it.
pub(crate) fn registry(cfg: &SimConfig, keys: &[KeyInfo]) -> TensorRegistry {
    cfg.plan().registry(keys.to_vec())
}

/// For every key, `(server index, slices)` of each server owning part of it.
pub(crate) fn key_owners(reg: &TensorRegistry) -> Vec<Vec<(usize, u32)>> {
    (0..reg.keys().len())
        .map(|key| {
            let mut per_server = vec![0u32; reg.servers()];
            reg.slices_of(key)
                .for_each(|s| per_server[reg.owner(s)] += 1);
            let owners = per_server.into_iter().enumerate().filter(|&(_, n)| n > 0);
            owners.collect()
        })
        .collect()
}

/// [`key_owners`] of `cfg`'s registry where it has servers (none without).
pub(crate) fn server_key_owners(cfg: &SimConfig, keys: &[KeyInfo]) -> Vec<Vec<(usize, u32)>> {
    if cfg.servers == 0 {
        return Vec::new();
    }
    key_owners(&registry(cfg, keys))
}

/// Every rank's state machine, built by the core's factory as the runtime builds them:
/// workers `0..N`, then servers (plain SGD from zeros: the simulator times, it does not train).
pub(crate) fn rank_endpoints(
    cfg: &SimConfig,
    keys: &[KeyInfo],
) -> Result<Vec<RankEndpoint>, SimError> {
    let plan = cfg.plan();
    let endpoints = plan.endpoints(keys.to_vec());
    let workers = (0..plan.workers).map(|r| Ok(RankEndpoint::Worker(endpoints.worker(r))));
    let servers = (plan.workers..plan.world_size()).map(|r| {
        let initial = keys.iter().map(|k| vec![0.0; k.numel]).collect();
        let server = endpoints.server(r, initial, ServerOptim::plain(0.01));
        server
            .map(RankEndpoint::Server)
            .map_err(|e| SimError::Config(e.to_string()))
    });
    workers.chain(servers).collect()
}

/// The ranks `rank` has links to (as the runtime's).
pub(crate) fn peers(cfg: &SimConfig, rank: Rank) -> Vec<Rank> {
    cfg.plan().peers(rank)
}

#[cfg(test)]
mod tests {
    use super::*;
    use syncopate_core::profile::LayerProfile;
    use syncopate_core::strategy::StrategyKind;

    fn layer(params: usize) -> LayerProfile {
        LayerProfile {
            name: format!("l{params}"),
            op: "op".into(),
            forward_ns: 1,
            backward_ns: 2,
            param_count: params,
            tensors: Vec::new(),
        }
    }

    #[test]
    fn keys_are_scaled_and_owned_by_their_layers() {
        let profile = ModelProfile {
            name: "m".into(),
            batch_size: None,
            layers: vec![layer(0), layer(1000), layer(0), layer(33)],
        };
        let mut cfg = SimConfig::new(StrategyKind::P3, 2, 1);
        cfg.scale = 0.125;
        let (keys, owned) = model_keys(&profile, &cfg);
        assert_eq!(
            keys,
            vec![
                KeyInfo {
                    numel: 125,
                    layer: 1
                },
                KeyInfo { numel: 5, layer: 3 }
            ]
        );
        assert_eq!(owned, vec![0..0, 0..1, 1..1, 1..2]);
        assert_eq!(rank_endpoints(&cfg, &keys).ok().map(|r| r.len()), Some(3));
        assert_eq!(peers(&cfg, 0), vec![2]);
        assert_eq!(peers(&cfg, 2), vec![0, 1]);
        let ring = SimConfig::new(StrategyKind::Allreduce, 2, 0);
        assert_eq!(peers(&ring, 1), vec![0]);
        cfg.sync.slice_params = 200;
        cfg.sync.servers = 3;
        let owners = key_owners(&registry(&cfg, &keys));
        assert_eq!(owners, vec![vec![(0, 2), (1, 2), (2, 1)], vec![(2, 1)]]);
    }
}
