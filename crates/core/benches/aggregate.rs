//! Throughput of the aggregation and optimizer inner loops on 1 Mi-element slices (4 MiB,
//! one frame): `cargo bench --workspace --profile dev --bench aggregate`.

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use syncopate_core::aggregate::{add_assign, scale};
use syncopate_core::{Sgd, SgdConfig};

fn bench(c: &mut Criterion) {
    let n = 1 << 20;
    let x: Vec<f32> = (0..n).map(|i| (i % 13) as f32 * 0.1).collect();
    let mut acc = vec![1.0f32; n];
    let mut g = c.benchmark_group("aggregate_4MiB");
    g.throughput(Throughput::Bytes((n * 4) as u64));
    g.bench_function("add_assign", |b| b.iter(|| add_assign(&mut acc, &x)));
    g.bench_function("scale", |b| b.iter(|| scale(&mut acc, 0.5)));
    let sgd = Sgd::new(SgdConfig {
        momentum: 0.9,
        weight_decay: 1e-4,
    });
    let mut w = vec![0.5f32; n];
    let mut v = vec![0.0f32; n];
    g.bench_function("sgd_momentum_wd", |b| {
        b.iter(|| sgd.step(0.01, &mut w, &x, &mut v))
    });
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
