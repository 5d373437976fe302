//! One training step (forward + backward + SGD, batch 64) per built-in model.
//!
//! `cargo bench -p syncopate-train --bench step`; figures go in docs/BENCHMARKS.md.

use criterion::{criterion_group, criterion_main, Criterion};
use syncopate_core::{LrSchedule, SgdConfig};
use syncopate_train::data::SyntheticSpec;
use syncopate_train::engine::{BurnEngine, LayerwiseEngine};
use syncopate_train::model::{self, MODEL_NAMES};
use syncopate_train::trainer::{train_step, LocalOptimizer, OptimConfig, StepTimes};

fn input_for(name: &str) -> [usize; 3] {
    match name {
        "resnet20" | "vgg-mini" => [3, 32, 32],
        _ => [1, 28, 28],
    }
}

fn bench_steps(c: &mut Criterion) {
    let mut group = c.benchmark_group("train_step_b64");
    group.sample_size(20);
    for name in MODEL_NAMES {
        let shape = input_for(name);
        let data = SyntheticSpec {
            train_len: 64,
            test_len: 1,
            shape,
            ..Default::default()
        }
        .generate();
        let batch = data.train.gather(&(0..64).collect::<Vec<_>>());
        let spec = model::build(name, shape, 10).expect("built-in model");
        let mut engine = BurnEngine::new(spec.clone(), 1).expect("engine");
        let sizes: Vec<usize> = spec.keys().iter().map(|k| k.numel).collect();
        let mut optimizer = LocalOptimizer::new(
            OptimConfig {
                lr: 0.01,
                sgd: SgdConfig::default(),
                schedule: LrSchedule::Constant,
            },
            &sizes,
        );
        let mut grads: Vec<Vec<f32>> = sizes.iter().map(|&n| vec![0.0; n]).collect();
        let mut times = StepTimes::default();
        group.bench_function(name, |b| {
            b.iter(|| {
                train_step(&mut engine, &mut optimizer, &mut grads, &batch, &mut times)
                    .expect("step")
            })
        });
        // Forward + backward alone, the figure comparable with PyTorch's step.
        group.bench_function(format!("{name}/fwd+bwd"), |b| {
            b.iter(|| {
                engine.forward(&batch, &mut |_, _| Ok(())).expect("forward");
                engine.backward(&mut |_, _, _| Ok(())).expect("backward");
            })
        });
    }
    group.finish();
}

criterion_group!(benches, bench_steps);
criterion_main!(benches);
