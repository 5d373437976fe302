//! Times single burn ops on the flex backend (a diagnostic for the engine's step time).
use std::time::Instant;

use burn::tensor::activation::relu;
use burn::tensor::module::{conv2d, max_pool2d};
use burn::tensor::ops::{ConvOptions, MaxPoolOptions};
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
    println!("{name:<40} {:>8.2} ms", v[v.len() / 2]);
}

fn main() {
    for (label, dev, ad) in [
        ("inner", Device::flex(), false),
        ("autodiff", Device::flex().autodiff(), true),
    ] {
        let x = Tensor::<4>::random([64, 1, 28, 28], Distribution::Default, &dev);
        let w =
            Tensor::<4>::random([32, 1, 3, 3], Distribution::Default, &dev).set_require_grad(ad);
        let b = Tensor::<1>::random([32], Distribution::Default, &dev).set_require_grad(ad);
        let x2 = Tensor::<4>::random([64, 32, 13, 13], Distribution::Default, &dev);
        let w2 =
            Tensor::<4>::random([64, 32, 3, 3], Distribution::Default, &dev).set_require_grad(ad);
        let opt = || ConvOptions::new([1, 1], [0, 0], [1, 1], 1);
        time(&format!("{label} conv1 (no bias)"), || {
            let y = conv2d(x.clone(), w.clone(), None, opt());
            let _ = y.into_data();
        });
        time(&format!("{label} conv1 + bias"), || {
            let y = conv2d(x.clone(), w.clone(), Some(b.clone()), opt());
            let _ = y.into_data();
        });
        time(&format!("{label} conv1 + relu + pool"), || {
            let y = max_pool2d(
                relu(conv2d(x.clone(), w.clone(), None, opt())),
                MaxPoolOptions::new([2, 2]),
            );
            let _ = y.into_data();
        });
        time(&format!("{label} conv2"), || {
            let y = conv2d(x2.clone(), w2.clone(), None, opt());
            let _ = y.into_data();
        });
        let y = Tensor::<4>::random([64, 32, 26, 26], Distribution::Default, &dev);
        time(&format!("{label} relu 64x32x26x26"), || {
            let _ = relu(y.clone()).into_data();
        });
        time(&format!("{label} maxpool 64x32x26x26"), || {
            let _ = max_pool2d(y.clone(), MaxPoolOptions::new([2, 2])).into_data();
        });
    }
}
