//! The kernels against burn's own `conv2d`, `relu` and `max_pool2d` with autodiff.

use burn::tensor::activation::relu;
use burn::tensor::module::{conv2d, max_pool2d};
use burn::tensor::ops::{ConvOptions, MaxPoolOptions};
use burn::tensor::{Device, Tensor, TensorData};
use proptest::prelude::*;
use rand::{Rng, SeedableRng};

use super::*;

fn values(n: usize, rng: &mut rand_chacha::ChaCha8Rng) -> Vec<f32> {
    (0..n).map(|_| rng.gen_range(-1.0f32..1.0)).collect()
}

fn host(t: Tensor<4>) -> Vec<f32> {
    t.into_data().try_into_vec::<f32>().unwrap()
}

/// Output and gradients (weight, bias, input) of the block computed by burn, for the output
/// gradient `g`.
fn reference(
    s: &ConvShape,
    x: &[f32],
    w: &[f32],
    b: &[f32],
    g: &[f32],
) -> (Vec<f32>, Vec<f32>, Vec<f32>, Vec<f32>) {
    let dev = Device::flex().autodiff();
    let k = s.kernel;
    let xt = Tensor::<4>::from_data(
        TensorData::new(x.to_vec(), [s.batch, s.in_channels, s.height, s.width]),
        &dev,
    )
    .require_grad();
    let wt = Tensor::<4>::from_data(
        TensorData::new(w.to_vec(), [s.out_channels, s.in_channels, k, k]),
        &dev,
    )
    .require_grad();
    let bt =
        Tensor::<1>::from_data(TensorData::new(b.to_vec(), [s.out_channels]), &dev).require_grad();
    let options = ConvOptions::new([1, 1], [s.padding, s.padding], [1, 1], 1);
    let mut y = relu(conv2d(xt.clone(), wt.clone(), Some(bt.clone()), options));
    if s.pool {
        y = max_pool2d(y, MaxPoolOptions::new([2, 2]));
    }
    let gt = Tensor::<4>::from_data(TensorData::new(g.to_vec(), s.output_dims()), &dev);
    let out = host(y.clone().inner());
    let grads = (y * gt).sum().backward();
    let gw = host(wt.grad(&grads).unwrap());
    let gb = bt
        .grad(&grads)
        .unwrap()
        .into_data()
        .try_into_vec::<f32>()
        .unwrap();
    let gx = host(xt.grad(&grads).unwrap());
    (out, gw, gb, gx)
}

fn assert_close(what: &str, ours: &[f32], theirs: &[f32]) {
    assert_eq!(ours.len(), theirs.len(), "{what}: lengths");
    let scale = theirs.iter().map(|v| v.abs()).fold(1.0f32, f32::max);
    for (i, (a, b)) in ours.iter().zip(theirs).enumerate() {
        assert!(
            (a - b).abs() <= 1e-5 * scale,
            "{what}[{i}]: ours {a}, burn {b} (scale {scale})"
        );
    }
}

fn check(s: ConvShape, seed: u64) {
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
    let x = values(s.input_len(), &mut rng);
    let w = values(s.weight_len(), &mut rng);
    let b = values(s.out_channels, &mut rng);
    let out_len: usize = s.output_dims().iter().product();
    let g = values(out_len, &mut rng);
    let (out, saved) = forward(&s, &x, &w, &b, true);
    let grads = backward(&saved.unwrap(), &w, &g, true);
    let (r_out, r_gw, r_gb, r_gx) = reference(&s, &x, &w, &b, &g);
    assert_close("output", &out, &r_out);
    assert_close("weight gradient", &grads.weight, &r_gw);
    assert_close("bias gradient", &grads.bias, &r_gb);
    assert_close("input gradient", &grads.input.unwrap(), &r_gx);
}

#[test]
fn lenet_blocks_match_burn() {
    let conv1 = ConvShape {
        batch: 4,
        in_channels: 1,
        height: 28,
        width: 28,
        out_channels: 32,
        kernel: 3,
        padding: 0,
        pool: true,
    };
    check(conv1, 1);
    let conv2 = ConvShape {
        in_channels: 32,
        height: 13,
        width: 13,
        out_channels: 64,
        ..conv1
    };
    check(conv2, 2);
}

/// Both backward methods (the routed scatter under the pool with long patches, dense GEMMs
/// otherwise), with padding, odd sizes and a batch of several parts, give burn's results.
#[test]
fn both_backward_methods_match_burn_over_several_parts() {
    let scatter = ConvShape {
        batch: 5,
        in_channels: 4,
        height: 9,
        width: 11,
        out_channels: 6,
        kernel: 3,
        padding: 1,
        pool: true,
    };
    assert!(scatter.scatters_gradients());
    check(scatter, 3);
    for dense in [
        ConvShape {
            pool: false,
            ..scatter
        },
        ConvShape {
            in_channels: 1,
            ..scatter
        },
    ] {
        assert!(!dense.scatters_gradients());
        check(dense, 4);
    }
    let parts = ConvShape {
        batch: 7,
        in_channels: 32,
        height: 13,
        width: 13,
        out_channels: 8,
        ..scatter
    };
    assert!(parts.samples_per_part() < parts.batch);
    check(parts, 5);
    check(
        ConvShape {
            pool: false,
            ..parts
        },
        6,
    );
}

/// The parts of the batch and the output channels run side by side, yet every output and
/// gradient is the same, bit for bit, on one thread as on three.
#[test]
fn results_do_not_depend_on_the_thread_count() {
    let scatter = ConvShape {
        batch: 9,
        in_channels: 32,
        height: 13,
        width: 13,
        out_channels: 16,
        kernel: 3,
        padding: 0,
        pool: true,
    };
    for s in [
        scatter,
        ConvShape {
            pool: false,
            ..scatter
        },
    ] {
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(7);
        let x = values(s.input_len(), &mut rng);
        let w = values(s.weight_len(), &mut rng);
        let b = values(s.out_channels, &mut rng);
        let g = values(s.output_dims().iter().product(), &mut rng);
        let run = |threads: usize| {
            super::super::on_threads(threads, || {
                let (out, saved) = forward(&s, &x, &w, &b, true);
                let grads = backward(&saved.unwrap(), &w, &g, true);
                (out, grads.weight, grads.bias, grads.input)
            })
        };
        assert!(run(1) == run(3), "{s:?}");
    }
}

#[test]
fn input_gradient_only_when_asked_and_forward_alone_keeps_nothing() {
    let s = ConvShape {
        batch: 2,
        in_channels: 3,
        height: 6,
        width: 5,
        out_channels: 4,
        kernel: 3,
        padding: 1,
        pool: false,
    };
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(5);
    let x = values(s.input_len(), &mut rng);
    let w = values(s.weight_len(), &mut rng);
    let b = values(4, &mut rng);
    let (out, saved) = forward(&s, &x, &w, &b, false);
    assert!(saved.is_none());
    assert_eq!(out.len(), 2 * 4 * 6 * 5);
    let (_, saved) = forward(&s, &x, &w, &b, true);
    let g = vec![1.0; out.len()];
    assert!(backward(&saved.unwrap(), &w, &g, false).input.is_none());
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(24))]

    /// Any block geometry (odd sizes, padding, kernel 1 to 5, with and without the pool)
    /// gives burn's output and gradients.
    #[test]
    fn kernels_match_burn_on_any_geometry(
        batch in 1usize..4,
        in_channels in 1usize..5,
        out_channels in 1usize..6,
        kernel in 1usize..6,
        padding in 0usize..3,
        extra_h in 0usize..7,
        extra_w in 0usize..7,
        pool in any::<bool>(),
        seed in any::<u64>(),
    ) {
        let padding = padding.min(kernel - 1);
        // At least 2x2 outputs, so that the pool has a window.
        let height = (kernel + 1).saturating_sub(2 * padding).max(1) + extra_h;
        let width = (kernel + 1).saturating_sub(2 * padding).max(1) + extra_w;
        let s = ConvShape { batch, in_channels, height, width, out_channels, kernel, padding, pool };
        prop_assume!(s.conv_hw().0 >= 2 && s.conv_hw().1 >= 2);
        check(s, seed);
    }
}
