//! Times single burn ops on the flex backend (a diagnostic for the engine's step time):
//! `cargo run --example op_probe`.
// The allocator of the `syncopate` binary, so that timings match it.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

use std::time::Instant;

use burn::tensor::activation::relu;
use burn::tensor::module::{conv2d, max_pool2d};
use burn::tensor::ops::{ConvOptions, MaxPoolOptions};
use burn::tensor::{s, Device, Distribution, Tensor};
use syncopate_train::engine::conv_block::{self, ConvShape};

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

/// 2x2 max-pool as the element-wise maximum of the four stride-2 sub-grids.
fn strided_pool(x: Tensor<4>) -> Tensor<4> {
    let at = |i: usize, j: usize| x.clone().slice(s![.., .., i..;2, j..;2]);
    at(0, 0)
        .max_pair(at(0, 1))
        .max_pair(at(1, 0).max_pair(at(1, 1)))
}

/// 3x3 valid convolution as nine shifted slices stacked along the channels, then one
/// batched matrix product with the weights (im2col through tensor ops).
fn im2col_conv(x: Tensor<4>, w: Tensor<4>, bias: Tensor<1>) -> Tensor<4> {
    let [b, c, h, wd] = x.dims();
    let [o, _, k, _] = w.dims();
    let (oh, ow) = (h - k + 1, wd - k + 1);
    let mut cols = Vec::new();
    for i in 0..k {
        for j in 0..k {
            cols.push(x.clone().slice(s![.., .., i..i + oh, j..j + ow]));
        }
    }
    // [b, k*k*c, oh*ow], rows ordered (i, j, channel).
    let cols = Tensor::cat(cols, 1).reshape([b, k * k * c, oh * ow]);
    let wm = w.permute([0, 2, 3, 1]).reshape([1, o, k * k * c]);
    let y = wm.matmul(cols) + bias.reshape([1, o, 1]);
    y.reshape([b, o, oh, ow])
}

fn main() {
    let dev = Device::flex().autodiff();
    for (b, c, hw, o) in [(64usize, 1usize, 28usize, 32usize), (64, 32, 13, 64)] {
        let x = Tensor::<4>::random([b, c, hw, hw], Distribution::Default, &dev).require_grad();
        let w = Tensor::<4>::random([o, c, 3, 3], Distribution::Default, &dev).require_grad();
        let bias = Tensor::<1>::random([o], Distribution::Default, &dev).require_grad();
        let opts = ConvOptions::new([1, 1], [0, 0], [1, 1], 1);
        time(&format!("conv2d {c}->{o} {hw}x{hw} fwd"), || {
            let _ = conv2d(x.clone(), w.clone(), Some(bias.clone()), opts.clone()).into_data();
        });
        time(&format!("conv2d {c}->{o} {hw}x{hw} fwd+bwd"), || {
            let _ = conv2d(x.clone(), w.clone(), Some(bias.clone()), opts.clone())
                .sum()
                .backward();
        });
        time(&format!("im2col {c}->{o} {hw}x{hw} fwd"), || {
            let _ = im2col_conv(x.clone(), w.clone(), bias.clone()).into_data();
        });
        time(&format!("im2col {c}->{o} {hw}x{hw} fwd+bwd"), || {
            let _ = im2col_conv(x.clone(), w.clone(), bias.clone())
                .sum()
                .backward();
        });
        let a: Vec<f32> = conv2d(x.clone(), w.clone(), Some(bias.clone()), opts.clone())
            .inner()
            .into_data()
            .try_into_vec()
            .unwrap();
        let m: Vec<f32> = im2col_conv(x.clone(), w.clone(), bias.clone())
            .inner()
            .into_data()
            .try_into_vec()
            .unwrap();
        let diff = a
            .iter()
            .zip(&m)
            .map(|(p, q)| (p - q).abs())
            .fold(0f32, f32::max);
        println!("im2col vs conv2d max |diff| {diff:e}");
        // Our kernels for the whole block (conv, bias, ReLU, 2x2 max-pool), single pass.
        let shape = ConvShape {
            batch: b,
            in_channels: c,
            height: hw,
            width: hw,
            out_channels: o,
            kernel: 3,
            padding: 0,
            pool: true,
        };
        let host = |t: Tensor<1>| t.inner().into_data().try_into_vec::<f32>().unwrap();
        let xs = host(x.clone().reshape([b * c * hw * hw]));
        let ws = host(w.clone().reshape([o * c * 9]));
        let bs = host(bias.clone());
        let out_len: usize = shape.output_dims().iter().product();
        let g = vec![0.5f32; out_len];
        time(&format!("block {c}->{o} {hw}x{hw} burn fwd+bwd"), || {
            let y = max_pool2d(
                relu(conv2d(
                    x.clone(),
                    w.clone(),
                    Some(bias.clone()),
                    opts.clone(),
                )),
                MaxPoolOptions::new([2, 2]),
            );
            let _ = y.sum().backward();
        });
        time(&format!("block {c}->{o} {hw}x{hw} ours fwd"), || {
            let _ = conv_block::forward(&shape, &xs, &ws, &bs, false);
        });
        time(
            &format!("block {c}->{o} {hw}x{hw} ours fwd+bwd (weights only)"),
            || {
                let (_, saved) = conv_block::forward(&shape, &xs, &ws, &bs, true);
                let _ = conv_block::backward(&saved.unwrap(), &ws, &g, false);
            },
        );
        time(
            &format!("block {c}->{o} {hw}x{hw} ours fwd+bwd (and input)"),
            || {
                let (_, saved) = conv_block::forward(&shape, &xs, &ws, &bs, true);
                let _ = conv_block::backward(&saved.unwrap(), &ws, &g, true);
            },
        );
    }
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
    time("strided max_pair fwd", || {
        let _ = strided_pool(y.clone()).into_data();
    });
    time("strided max_pair fwd+bwd", || {
        let _ = strided_pool(y.clone()).sum().backward();
    });
    let a = max_pool2d(y.clone(), MaxPoolOptions::new([2, 2]))
        .inner()
        .into_data();
    let b = reshape_pool(y.clone()).inner().into_data();
    let c = strided_pool(y.clone()).inner().into_data();
    println!("same values: {} {}", a == b, a == c);
}
