//! Times single burn ops on the flex backend (a diagnostic for the engine's step time):
//! `cargo run --example op_probe`.
use std::time::Instant;

use burn::tensor::module::max_pool2d;
use burn::tensor::ops::MaxPoolOptions;
use burn::tensor::{Device, Distribution, Tensor};

fn time<F: FnMut()>(name: &str, mut f: F) {
    for _ in 0..3 {
        f();
    }
    let mut v = Vec::new();
    for _ in 0..15 {
        let t = Instant::now();
        f();
        v.push(t.elapsed().as_secs_f64() * 1e3);
    }
    v.sort_by(|a, b| a.total_cmp(b));
    println!("{name:<44} {:>8.2} ms", v[v.len() / 2]);
}

fn reshape_pool(x: Tensor<4>) -> Tensor<4> {
    let [b, c, h, w] = x.dims();
    x.reshape([b, c, h / 2, 2, w / 2, 2])
        .max_dim(5)
        .max_dim(3)
        .reshape([b, c, h / 2, w / 2])
}

fn main() {
    let dev = Device::flex().autodiff();
    let y = Tensor::<4>::random([64, 32, 26, 26], Distribution::Default, &dev).require_grad();
    time("max_pool2d fwd", || {
        let _ = max_pool2d(y.clone(), MaxPoolOptions::new([2, 2])).into_data();
    });
    time("max_pool2d fwd+bwd", || {
        let _ = max_pool2d(y.clone(), MaxPoolOptions::new([2, 2]))
            .sum()
            .backward();
    });
    time("reshape+max_dim fwd", || {
        let _ = reshape_pool(y.clone()).into_data();
    });
    time("reshape+max_dim fwd+bwd", || {
        let _ = reshape_pool(y.clone()).sum().backward();
    });
    let a = max_pool2d(y.clone(), MaxPoolOptions::new([2, 2]))
        .inner()
        .into_data();
    let b = reshape_pool(y.clone()).inner().into_data();
    println!("same values: {}", a == b);
}
