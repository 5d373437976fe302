//! Prints per-layer forward and backward times of one model (median of 30 steps), to find
//! where a step's time goes: `cargo run --example layer_times -- lenet 64`.

// The allocator of the `syncopate` binary, so that timings match it.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

use std::time::Instant;

use syncopate_train::data::SyntheticSpec;
use syncopate_train::engine::{BurnEngine, LayerwiseEngine};
use syncopate_train::model;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let name = args.next().unwrap_or_else(|| "lenet".into());
    let batch: usize = args.next().map(|b| b.parse()).transpose()?.unwrap_or(64);
    let shape = match name.as_str() {
        "resnet20" | "vgg-mini" => [3, 32, 32],
        _ => [1, 28, 28],
    };
    let data = SyntheticSpec {
        train_len: batch,
        test_len: 1,
        shape,
        ..Default::default()
    }
    .generate();
    let b = data.train.gather(&(0..batch).collect::<Vec<_>>());
    let spec = model::build(&name, shape, 10)?;
    let layers = spec.layers.len();
    let mut engine = BurnEngine::new(spec.clone(), 1)?;
    let mut fwd = vec![Vec::new(); layers + 1];
    let mut bwd = vec![Vec::new(); layers];
    for _ in 0..30 {
        engine.begin_forward(&b)?;
        for (l, times) in fwd.iter_mut().take(layers).enumerate() {
            let t = Instant::now();
            engine.forward_layer(l)?;
            times.push(t.elapsed().as_secs_f64() * 1e3);
        }
        let t = Instant::now();
        engine.finish_forward()?;
        fwd[layers].push(t.elapsed().as_secs_f64() * 1e3);
        let mut last = Instant::now();
        engine.backward(&mut |l, _, _| {
            bwd[l].push(last.elapsed().as_secs_f64() * 1e3);
            last = Instant::now();
            Ok(())
        })?;
    }
    let med = |v: &mut Vec<f64>| {
        v.sort_by(|a, b| a.total_cmp(b));
        v[v.len() / 2]
    };
    let (mut tf, mut tb) = (0.0, 0.0);
    for l in 0..layers {
        let (f, bk) = (med(&mut fwd[l]), med(&mut bwd[l]));
        tf += f;
        tb += bk;
        println!(
            "{:>2} {:<16} fwd {:>8.2} ms  bwd {:>8.2} ms",
            l, spec.layers[l].name, f, bk
        );
    }
    let loss = med(&mut fwd[layers]);
    println!("   loss             fwd {loss:>8.2} ms");
    println!(
        "   total            fwd {:>8.2} ms  bwd {:>8.2} ms",
        tf + loss,
        tb
    );
    Ok(())
}
