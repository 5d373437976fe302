//! The periodic strategies (local SGD, DiLoCo, step-wise averaging with a period), driven
//! in-process like every other strategy and checked against direct arithmetic.

use super::*;

/// The workers of `plan` for a model of keys of `sizes`.
fn workers(plan: &SyncPlan, sizes: &[usize]) -> Vec<Box<dyn WorkerSync>> {
    (0..plan.workers)
        .map(|r| -> Box<dyn WorkerSync> { plan.worker_endpoint(r, keys(sizes)) })
        .collect()
}

fn periodic(kind: StrategyKind, n: usize, every: u64) -> SyncPlan {
    SyncPlan {
        average_every: every,
        ..SyncPlan::new(kind, n, 0)
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(16))]

    /// Local SGD: between sync steps every worker keeps exactly the weights it handed over;
    /// at every H-th step all hold the same bits, the mean of what they handed over.
    #[test]
    fn local_sgd_keeps_its_own_weights_and_averages_every_h_steps(
        n in 1usize..5,
        every in 1u64..4,
        sizes in prop::collection::vec(1usize..40, 1..4),
        bucket in 1usize..80,
        seed: u64,
    ) {
        let plan = SyncPlan { bucket_bytes: 4 * bucket, ..periodic(StrategyKind::LocalSgd, n, every) };
        prop_assert!(plan.validate().is_ok());
        let steps = 7;
        let results = drive(&mut workers(&plan, &sizes), &mut [], &sizes, steps, seed);
        for step in 0..steps {
            for (key, &len) in sizes.iter().enumerate() {
                let got = |rank: usize| &results[step as usize][rank][key];
                if Periodic::is_sync_step(every, step) {
                    let want = mean_grad(step, n, key, len);
                    prop_assert!(close(got(0), &want), "step {} key {}", step, key);
                    for rank in 1..n {
                        prop_assert_eq!(got(rank), got(0));
                    }
                } else {
                    for rank in 0..n {
                        prop_assert_eq!(got(rank), &grad(step, rank, key, len));
                    }
                }
            }
        }
    }
}

/// H = 1: local SGD is the ring all-reduce of the weights every step, bit for bit.
#[test]
fn local_sgd_every_step_is_the_ring_all_reduce_of_the_weights() {
    let sizes = [5, 33, 2];
    for n in [1, 2, 3, 5] {
        let local = periodic(StrategyKind::LocalSgd, n, 1);
        let ring = SyncPlan::new(StrategyKind::Allreduce, n, 0);
        let a = drive(&mut workers(&local, &sizes), &mut [], &sizes, 4, 7);
        let b = drive(&mut workers(&ring, &sizes), &mut [], &sizes, 4, 8);
        assert_eq!(a, b, "{n} workers");
    }
}

/// DiLoCo's outer step at every H-th step, computed by hand in f64 from the same handed-over
/// weights: the mean outer gradient `anchor - w`, Nesterov momentum, the new anchor; in
/// between each worker keeps its own weights.
#[test]
fn diloco_applies_nesterov_to_the_mean_change_every_h_steps() {
    let sizes = [4, 9];
    let (n, every, steps) = (3, 2, 6);
    let plan = SyncPlan {
        outer: OuterOptions {
            lr: 0.7,
            momentum: 0.9,
        },
        ..periodic(StrategyKind::Diloco, n, every)
    };
    let results = drive(&mut workers(&plan, &sizes), &mut [], &sizes, steps, 3);
    for (key, &len) in sizes.iter().enumerate() {
        // The anchor starts at zero: the endpoints were given no initial weights.
        let (mut anchor, mut v) = (vec![0f64; len], vec![0f64; len]);
        for step in 0..steps {
            let got = |rank: usize| &results[step as usize][rank][key];
            if !Periodic::is_sync_step(every, step) {
                for rank in 0..n {
                    assert_eq!(got(rank), &grad(step, rank, key, len));
                }
                continue;
            }
            for i in 0..len {
                let mean_w: f64 = (0..n)
                    .map(|r| grad(step, r, key, len)[i] as f64)
                    .sum::<f64>()
                    / n as f64;
                let d = anchor[i] - mean_w;
                v[i] = 0.9 * v[i] + d;
                anchor[i] -= 0.7 * (d + 0.9 * v[i]);
            }
            let want: Vec<f32> = anchor.iter().map(|&a| a as f32).collect();
            assert!(
                close(got(0), &want),
                "step {step} key {key}: {:?} vs {want:?}",
                got(0)
            );
            for rank in 1..n {
                assert_eq!(got(rank), got(0));
            }
        }
    }
}

/// DiLoCo with an outer rate of 1 and no momentum is local SGD (to float rounding).
#[test]
fn diloco_with_unit_rate_and_no_momentum_is_local_sgd() {
    let sizes = [6, 3];
    let plain = SyncPlan {
        outer: OuterOptions {
            lr: 1.0,
            momentum: 0.0,
        },
        ..periodic(StrategyKind::Diloco, 4, 3)
    };
    let local = periodic(StrategyKind::LocalSgd, 4, 3);
    let a = drive(&mut workers(&plain, &sizes), &mut [], &sizes, 6, 1);
    let b = drive(&mut workers(&local, &sizes), &mut [], &sizes, 6, 2);
    for (step, (a, b)) in a.iter().zip(&b).enumerate() {
        for (ra, rb) in a.iter().zip(b) {
            for (ka, kb) in ra.iter().zip(rb) {
                assert!(close(ka, kb), "step {step}: {ka:?} vs {kb:?}");
            }
        }
    }
}

/// Step-wise averaging every H-th step: the chain's rounds are counted in sync steps (the
/// head rotates once per pass), every other step keeps the worker's own weights.
#[test]
fn stepwise_with_a_period_passes_the_chain_every_h_steps() {
    let sizes = [7, 3];
    let (n, every, steps) = (3, 2, 6);
    let plan = periodic(StrategyKind::Stepwise, n, every);
    let schedule = plan.chain_schedule().expect("a chain");
    let results = drive(&mut workers(&plan, &sizes), &mut [], &sizes, steps, 11);
    for step in 0..steps {
        for (key, &len) in sizes.iter().enumerate() {
            for (rank, per_key) in results[step as usize].iter().enumerate() {
                let got = &per_key[key];
                if Periodic::is_sync_step(every, step) {
                    // Round r of the chain takes the values of step `step`.
                    let round = step / every;
                    let mut sum = vec![0f32; len];
                    let pos = schedule.position(rank, round);
                    for p in 0..=pos {
                        let g = grad(step, schedule.rank_at(p, round), key, len);
                        sum.iter_mut().zip(&g).for_each(|(s, x)| *s += x);
                    }
                    let f = 1.0 / (pos + 1) as f32;
                    let want: Vec<f32> = sum.iter().map(|s| s * f).collect();
                    assert_eq!(got, &want, "step {step} rank {rank} key {key}");
                } else {
                    assert_eq!(got, &grad(step, rank, key, len));
                }
            }
        }
    }
}

/// A local step sends nothing and is done as soon as backward is.
#[test]
fn a_local_step_sends_nothing() {
    let plan = periodic(StrategyKind::LocalSgd, 3, 4);
    let mut w = plan.worker_endpoint(1, keys(&[3]));
    w.begin_step(0);
    w.handle_gradient(0, &[1.0, 2.0, 3.0]);
    w.handle_backward_done();
    let mut out = Vec::new();
    for link in [0, 2] {
        assert!(!w.poll_transmit(link, &mut out));
    }
    assert_eq!(w.poll_event(), Some(WorkerEvent::ParamsReady(0)));
    assert_eq!(w.take_values(0), vec![1.0, 2.0, 3.0]);
    assert_eq!(w.poll_event(), Some(WorkerEvent::StepDone));
    assert!(out.is_empty());
}

/// Only DiLoCo keeps state of its own, and a checkpoint's state of another shape is refused.
#[test]
fn only_diloco_keeps_state_and_it_round_trips() {
    let sizes = [2, 3];
    let mut d = periodic(StrategyKind::Diloco, 2, 2).worker_endpoint(0, keys(&sizes));
    d.handle_initial_weights(1, &[1.0, 2.0, 3.0]);
    let state = d.sync_state();
    assert_eq!(state.len(), 4);
    assert_eq!(state[1], vec![1.0, 2.0, 3.0]);
    let mut fresh = periodic(StrategyKind::Diloco, 2, 2).worker_endpoint(0, keys(&sizes));
    fresh.restore_sync_state(state.clone()).unwrap();
    assert_eq!(fresh.sync_state(), state);
    assert!(fresh.restore_sync_state(vec![vec![0.0; 2]]).is_err());
    let mut local = periodic(StrategyKind::LocalSgd, 2, 2).worker_endpoint(0, keys(&sizes));
    assert!(local.sync_state().is_empty());
    assert!(local.restore_sync_state(state).is_err());
}

#[test]
fn the_period_applies_where_it_means_something() {
    let err = |p: SyncPlan| p.validate().map_err(|e| e.to_string()).unwrap_err();
    assert!(err(periodic(StrategyKind::LocalSgd, 2, 0)).contains("average_every"));
    assert!(err(periodic(StrategyKind::Allreduce, 2, 4)).contains("local-sgd, diloco"));
    let outer = SyncPlan {
        outer: OuterOptions {
            lr: 0.5,
            momentum: 0.0,
        },
        ..SyncPlan::new(StrategyKind::LocalSgd, 2, 0)
    };
    assert!(err(outer).contains("diloco"));
    assert_eq!(
        periodic(StrategyKind::Diloco, 4, 16).sync_descriptor(),
        "diloco/fifo/bucket=25000000/every=16/outer-lr=0.7/outer-momentum=0.9"
    );
    assert_eq!(SyncPlan::new(StrategyKind::LocalSgd, 2, 0).average_every, 8);
    let local = periodic(StrategyKind::LocalSgd, 4, 4);
    assert_eq!(local.textbook_bytes_per_step(1000.0), 1500.0 / 4.0);
}

/// Gossip with an exact average every H-th step: those steps give every worker the mean,
/// every other step each worker's mix with its ring neighbours, whatever the interleaving.
#[test]
fn gossip_with_full_syncs_mixes_in_between_and_averages_every_h_steps() {
    let sizes = [5, 20];
    let (every, steps) = (3, 7);
    for n in [2, 3, 5] {
        let plan = SyncPlan {
            full_sync_every: every,
            ..SyncPlan::new(StrategyKind::Gossip, n, 0)
        };
        assert!(plan.validate().is_ok());
        let results = drive(&mut workers(&plan, &sizes), &mut [], &sizes, steps, 5);
        for step in 0..steps {
            for (key, &len) in sizes.iter().enumerate() {
                for (rank, per_key) in results[step as usize].iter().enumerate() {
                    let got = &per_key[key];
                    let want = if Periodic::is_sync_step(every, step) {
                        mean_grad(step, n, key, len)
                    } else {
                        let own = grad(step, rank, key, len);
                        let peers: Vec<Vec<f32>> = gossip_peers(rank, n)
                            .into_iter()
                            .map(|p| grad(step, p, key, len))
                            .collect();
                        let peers: Vec<&[f32]> = peers.iter().map(Vec::as_slice).collect();
                        let mut mixed = vec![0.0; len];
                        mix_into(&mut mixed, &own, &peers, gossip_weights(n));
                        mixed
                    };
                    assert!(close(got, &want), "{n} workers step {step} rank {rank}");
                }
            }
        }
    }
}
