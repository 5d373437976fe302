//! Tests of the step sequencer: the order of actions for each strategy and plan.

use super::*;
use proptest::prelude::*;

/// Runs until the sequencer waits or finishes, finishing every computation at once.
fn run_until_wait(s: &mut StepSequencer) -> Vec<Action> {
    let mut out = Vec::new();
    loop {
        match s.poll_action() {
            Action::Wait | Action::Finished => return out,
            a => {
                if matches!(a, Action::Forward(_) | Action::Backward(_)) {
                    s.compute_done();
                }
                out.push(a);
            }
        }
    }
}

/// Two layers, the second owning key 0.
fn layers() -> Vec<Range<usize>> {
    vec![0..0, 0..1]
}

fn plan(strategy: StrategyKind, steps: u64) -> StepPlan {
    StepPlan::new(strategy, steps, layers())
}

#[test]
fn forward_overlap_waits_for_each_layers_values_then_for_step_done() {
    use Action::*;
    let mut s = StepSequencer::new(plan(StrategyKind::P3, 2));
    assert_eq!(
        run_until_wait(&mut s),
        vec![
            LoadBatch(0),
            Forward(0),
            Forward(1),
            Loss,
            Begin(0),
            Backward(1),
            HandOver(1),
            Backward(0),
            HandOver(0),
            BackwardDone,
            StepEnd(0),
            LoadBatch(1),
            Forward(0)
        ]
    );
    // Layer 1 of step 1 needs key 0.
    assert_eq!(s.awaiting(), Awaiting::Params(1));
    s.handle_event(WorkerEvent::ParamsReady(0));
    assert_eq!(run_until_wait(&mut s), vec![Forward(1), Loss]);
    s.handle_event(WorkerEvent::StepDone);
    assert_eq!(run_until_wait(&mut s)[0], Begin(1));
    assert!(!s.finished());
    s.handle_event(WorkerEvent::ParamsReady(0));
    assert!(run_until_wait(&mut s).is_empty());
    s.handle_event(WorkerEvent::StepDone);
    assert_eq!(s.poll_action(), Finished, "{}", s.describe());
}

#[test]
fn all_reduce_begins_first_and_optimizes_after_step_done() {
    use Action::*;
    let mut s = StepSequencer::new(plan(StrategyKind::Allreduce, 1));
    let acts = run_until_wait(&mut s);
    assert_eq!(&acts[..3], &[LoadBatch(0), Begin(0), Forward(0)]);
    assert_eq!(acts.last(), Some(&BackwardDone));
    s.handle_event(WorkerEvent::GradReady(0));
    s.handle_event(WorkerEvent::StepDone);
    assert_eq!(run_until_wait(&mut s), vec![Optimize, StepEnd(0)]);
    assert!(s.finished());
}

#[test]
fn parameter_servers_without_overlap_never_optimize_locally() {
    let mut s = StepSequencer::new(plan(StrategyKind::PsNoOverlap, 1));
    run_until_wait(&mut s);
    s.handle_event(WorkerEvent::StepDone);
    assert_eq!(run_until_wait(&mut s), vec![Action::StepEnd(0)]);
    assert!(s.finished());
}

#[test]
fn weight_averaging_optimizes_each_layer_before_handing_it_over() {
    use Action::*;
    let mut p = plan(StrategyKind::Allreduce, 1);
    p.optimizer = OptimizerPlace::BeforeSync;
    let mut s = StepSequencer::new(p);
    let acts = run_until_wait(&mut s);
    let tail = &acts[acts.len() - 7..];
    assert_eq!(
        tail,
        &[
            Backward(1),
            OptimizeLayer(1),
            HandOver(1),
            Backward(0),
            OptimizeLayer(0),
            HandOver(0),
            BackwardDone
        ]
    );
    s.handle_event(WorkerEvent::StepDone);
    assert_eq!(run_until_wait(&mut s), vec![StepEnd(0)]);
}

#[test]
fn evaluation_waits_for_every_value_of_the_step() {
    let mut p = plan(StrategyKind::P3, 4);
    p.eval = EvalSchedule {
        enabled: true,
        steps_per_epoch: 2,
        every: None,
    };
    let mut s = StepSequencer::new(p);
    let acts = run_until_wait(&mut s);
    assert!(acts.contains(&Action::StepEnd(0)), "{acts:?}");
    assert_eq!(s.awaiting(), Awaiting::Params(1));
    s.handle_event(WorkerEvent::ParamsReady(0));
    s.handle_event(WorkerEvent::StepDone);
    let acts = run_until_wait(&mut s);
    assert_eq!(acts.last(), Some(&Action::StepEnd(1)), "{acts:?}");
    s.handle_event(WorkerEvent::StepDone);
    assert!(run_until_wait(&mut s).is_empty(), "key 0 is still missing");
    s.handle_event(WorkerEvent::ParamsReady(0));
    let evaluate = Action::Evaluate {
        step: 1,
        epoch_end: true,
        last: false,
    };
    assert_eq!(run_until_wait(&mut s)[0], evaluate);
}

/// Runs a one-layer all-reduce plan to its end, answering every step at once.
fn run_to_end(p: StepPlan) -> Vec<Action> {
    let mut s = StepSequencer::new(p);
    let mut acts = Vec::new();
    while !s.finished() {
        acts.extend(run_until_wait(&mut s));
        s.handle_event(WorkerEvent::StepDone);
    }
    acts
}

/// Buffers are relayed at every evaluation point of the job, before the evaluation and
/// on workers that do not evaluate too (all workers stop at the same steps); without
/// buffers to relay, a worker that does not evaluate never stops.
#[test]
fn buffers_are_relayed_at_every_evaluation_point_before_evaluating() {
    let eval = |enabled| EvalSchedule {
        enabled,
        steps_per_epoch: 3,
        every: None,
    };
    let relays = |acts: &[Action]| -> Vec<u64> {
        acts.iter()
            .filter_map(|a| match a {
                Action::SyncBuffers(step) => Some(*step),
                _ => None,
            })
            .collect()
    };
    let p = plan(StrategyKind::Allreduce, 7).with_buffer_sync(true);
    let evaluator = run_to_end(p.clone().with_eval(eval(true)));
    assert_eq!(relays(&evaluator), vec![2, 5, 6]);
    let at = |a: Action| evaluator.iter().position(|&b| b == a).unwrap();
    let evaluate = Action::Evaluate {
        step: 2,
        epoch_end: true,
        last: false,
    };
    assert!(
        at(Action::SyncBuffers(2)) + 1 == at(evaluate),
        "{evaluator:?}"
    );
    let other = run_to_end(p.with_eval(eval(false)));
    assert_eq!(relays(&other), vec![2, 5, 6]);
    assert!(!other.iter().any(|a| matches!(a, Action::Evaluate { .. })));
    let no_buffers = run_to_end(plan(StrategyKind::Allreduce, 7).with_eval(eval(true)));
    assert!(relays(&no_buffers).is_empty());
}

#[test]
fn checkpoints_follow_evaluations_once_every_value_is_in() {
    let mut p = plan(StrategyKind::P3, 6).with_checkpoints(CheckpointSchedule { every: Some(2) });
    p.eval = EvalSchedule {
        enabled: true,
        steps_per_epoch: 0,
        every: Some(2),
    };
    let mut s = StepSequencer::new(p);
    let mut acts = run_until_wait(&mut s);
    s.handle_event(WorkerEvent::ParamsReady(0));
    s.handle_event(WorkerEvent::StepDone);
    acts.extend(run_until_wait(&mut s));
    s.handle_event(WorkerEvent::ParamsReady(0));
    s.handle_event(WorkerEvent::StepDone);
    let after = run_until_wait(&mut s);
    let evaluate = Action::Evaluate {
        step: 1,
        epoch_end: false,
        last: false,
    };
    assert_eq!(after[..2], [evaluate, Action::Checkpoint(1)], "{after:?}");
    assert!(!acts.contains(&Action::Checkpoint(0)), "{acts:?}");
}

#[test]
fn checkpoint_points_count_from_the_jobs_first_step_and_include_the_last() {
    let c = CheckpointSchedule { every: Some(10) };
    let due: Vec<u64> = (0..25).filter(|&s| c.due(s, 25)).collect();
    assert_eq!(due, vec![9, 19, 24]);
    assert!((0..30).all(|s| !CheckpointSchedule::default().due(s, 30)));
    assert!((0..30).all(|s| !CheckpointSchedule { every: Some(0) }.due(s, 30)));
}

#[test]
fn a_resumed_plan_starts_at_its_first_step() {
    use Action::*;
    let p = plan(StrategyKind::Allreduce, 5).resumed_at(3);
    let mut s = StepSequencer::new(p);
    assert_eq!(run_until_wait(&mut s)[..2], [LoadBatch(3), Begin(3)]);
    let done = StepSequencer::new(plan(StrategyKind::Allreduce, 5).resumed_at(9));
    assert_eq!(done.step(), 5, "a checkpoint past the end runs nothing");
}

#[test]
fn stragglers_parse_and_refuse_nonsense() {
    let s: Straggler = "2:1.5".parse().unwrap();
    assert_eq!(
        s,
        Straggler {
            rank: 2,
            factor: 1.5
        }
    );
    assert_eq!(Straggler::slowdown(&[s], 2), 1.5);
    assert_eq!(Straggler::slowdown(&[s], 1), 1.0);
    for bad in ["2", "x:2", "1:0.5", "1:nan", "1:inf", "-1:2"] {
        let e = bad.parse::<Straggler>().unwrap_err().to_string();
        assert!(e.contains("--slow-worker"), "{e}");
    }
    assert!(Straggler::check(&[s], 3).is_ok());
    assert!(Straggler::check(&[s], 2).is_err());
}

#[test]
fn evaluation_points() {
    let e = EvalSchedule {
        enabled: true,
        steps_per_epoch: 5,
        every: Some(3),
    };
    let due: Vec<u64> = (0..11).filter(|&s| e.due(s, 11)).collect();
    assert_eq!(due, vec![2, 4, 5, 8, 9, 10]);
    let off = EvalSchedule {
        enabled: false,
        ..e
    };
    assert!((0..11).all(|s| !off.due(s, 11)));
}

/// Drives a sequencer against a strategy model that answers every step after a random
/// delay, delivering keys in random order.
fn drive(strategy: StrategyKind, steps: u64, layers: Vec<Range<usize>>, seed: u64) -> Vec<Action> {
    let keys = layers.iter().map(|r| r.end).max().unwrap_or(0);
    let mut s = StepSequencer::new(StepPlan::new(strategy, steps, layers));
    let mut rng = seed;
    let mut draw = move |n: u64| {
        rng = rng
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (rng >> 33) % n.max(1)
    };
    let mut pending: Vec<WorkerEvent> = Vec::new();
    let mut log = Vec::new();
    for _ in 0..100_000 {
        match s.poll_action() {
            Action::Finished => return log,
            Action::Wait => {
                assert!(
                    !pending.is_empty(),
                    "waits with nothing pending: {}",
                    s.describe()
                );
                let i = draw(pending.len() as u64) as usize;
                // StepDone only once every value of the step is out.
                let i = if pending[i] == WorkerEvent::StepDone && pending.len() > 1 {
                    (i + 1) % pending.len()
                } else {
                    i
                };
                s.handle_event(pending.remove(i));
            }
            a @ (Action::Forward(_) | Action::Backward(_)) => {
                s.compute_done();
                log.push(a);
            }
            a @ Action::Begin(_) => {
                assert!(pending.is_empty(), "begins before the last step ended");
                if OptimizerPlace::of(strategy) != OptimizerPlace::AfterSync {
                    pending.extend((0..keys).map(WorkerEvent::ParamsReady));
                }
                pending.push(WorkerEvent::StepDone);
                log.push(a);
            }
            a => log.push(a),
        }
    }
    panic!("no end: {}", s.describe());
}

proptest! {
    /// Whatever order the values arrive in, every strategy runs every layer's forward and
    /// backward once a step, hands over every layer, and finishes.
    #[test]
    fn every_strategy_runs_every_layer_once_a_step(
        seed in any::<u64>(),
        steps in 1u64..5,
        sizes in proptest::collection::vec(0usize..3, 1..6),
    ) {
        let mut next = 0;
        let layers: Vec<Range<usize>> = sizes.iter().map(|&n| { next += n; next - n..next }).collect();
        for strategy in StrategyKind::ALL {
            let log = drive(strategy, steps, layers.clone(), seed);
            let count = |f: &dyn Fn(&Action) -> bool| log.iter().filter(|a| f(a)).count() as u64;
            let n = layers.len() as u64;
            prop_assert_eq!(count(&|a| matches!(a, Action::Forward(_))), n * steps);
            prop_assert_eq!(count(&|a| matches!(a, Action::Backward(_))), n * steps);
            prop_assert_eq!(count(&|a| matches!(a, Action::HandOver(_))), n * steps);
            prop_assert_eq!(count(&|a| matches!(a, Action::Begin(_))), steps);
            prop_assert_eq!(count(&|a| matches!(a, Action::StepEnd(_))), steps);
        }
    }
}

mod tuning_tests {
    use super::*;

    /// Runs one step to its end with every event in at once; returns the actions.
    fn one_step(s: &mut StepSequencer) -> Vec<Action> {
        let mut out = Vec::new();
        loop {
            let a = s.poll_action();
            match a {
                Action::Forward(_) | Action::Backward(_) => s.compute_done(),
                Action::BackwardDone => s.handle_event(WorkerEvent::StepDone),
                Action::Wait | Action::Finished => return out,
                _ => {}
            }
            out.push(a);
            if matches!(a, Action::StepEnd(_)) {
                return out;
            }
        }
    }

    #[test]
    fn step_times_feed_the_tuner_and_its_changes_start_the_next_step() {
        let spec = TuneSpec::credit(4, 1, 1 << 10);
        let plan = StepPlan::new(StrategyKind::Allreduce, 40, vec![0..1, 1..2])
            .with_tuning(Some(spec))
            .with_eval(EvalSchedule {
                enabled: true,
                steps_per_epoch: 1000,
                every: Some(5),
            });
        let mut s = StepSequencer::new(plan);
        let (mut now, mut credits) = (0u64, vec![4usize]);
        for _ in 0..40 {
            let actions = one_step(&mut s);
            if let Some(i) = actions.iter().position(|a| matches!(a, Action::Retune(_))) {
                assert!(matches!(actions[i + 1], Action::LoadBatch(_)));
                if let Action::Retune(k) = actions[i] {
                    credits.push(k.credit_bytes);
                }
            }
            // Faster with more credit up to 16; evaluations would look slow.
            let credit = *credits.last().unwrap();
            now += if credit >= 16 {
                1_000_000
            } else {
                16_000_000 / credit as u64
            };
            let evaluates = s.plan().eval.due(s.step(), 40);
            s.handle_step_end(now);
            if evaluates {
                now += 1_000_000_000;
            }
        }
        let tuner = s.tuner().unwrap();
        assert!(tuner.settled(), "{:?}", tuner.trials());
        assert_eq!(tuner.knobs().credit_bytes, 16, "{:?}", tuner.trials());
        assert_eq!(*credits.last().unwrap(), 16);
        assert!(
            tuner.trials().iter().all(|t| t.step_seconds < 0.5),
            "an evaluation counted as a step: {:?}",
            tuner.trials()
        );
    }
}
