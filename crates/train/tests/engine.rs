//! Engine tests: segment-wise backward equals whole-model backward for every model,
//! training is deterministic, and checkpoints round-trip.

use std::sync::Arc;

use syncopate_core::{LrSchedule, SgdConfig};
use syncopate_train::checkpoint;
use syncopate_train::data::{Batch, SyntheticSpec};
use syncopate_train::engine::{BackwardMode, BurnEngine, LayerwiseEngine};
use syncopate_train::model::{self, MODEL_NAMES};
use syncopate_train::trainer::{self, Duration, OptimConfig, Silent};

fn input_for(name: &str) -> [usize; 3] {
    match name {
        "resnet20" | "vgg-mini" => [3, 32, 32],
        _ => [1, 28, 28],
    }
}

fn batch(shape: [usize; 3], n: usize, seed: u64) -> Batch {
    let data = SyntheticSpec {
        train_len: n,
        test_len: 1,
        shape,
        seed,
        ..Default::default()
    }
    .generate();
    data.train.gather(&(0..n).collect::<Vec<_>>())
}

/// Per-key gradients of one step, in key order, and the order in which layers were reported.
fn gradients(engine: &mut BurnEngine, batch: &Batch) -> (Vec<Vec<f32>>, Vec<usize>) {
    let keys = engine.spec().keys().len();
    let mut grads = vec![Vec::new(); keys];
    let mut order = Vec::new();
    engine.forward(batch, &mut |_, _| Ok(())).unwrap();
    engine
        .backward(&mut |layer, g, _| {
            order.push(layer);
            for (k, v) in g.iter() {
                grads[k] = v.to_vec();
            }
            Ok(())
        })
        .unwrap();
    (grads, order)
}

/// Segmented backward (our own kernels for the plain convolution blocks, burn for the other
/// layers) gives burn's whole-model gradients, up to float rounding: the two sum in
/// different orders, so they agree to 1e-5 of the largest gradient, not bit for bit.
#[test]
fn segmented_backward_equals_whole_backward_for_every_model() {
    for name in MODEL_NAMES {
        let input = input_for(name);
        let spec = model::build(name, input, 10).unwrap();
        let b = batch(input, 8, 3);
        let mut whole = BurnEngine::new(spec.clone(), 11).unwrap();
        whole.set_backward_mode(BackwardMode::Whole);
        let mut seg = BurnEngine::new(spec.clone(), 11).unwrap();
        let (gw, order_w) = gradients(&mut whole, &b);
        let (gs, order_s) = gradients(&mut seg, &b);
        let layers: Vec<usize> = (0..spec.layers.len()).rev().collect();
        assert_eq!(order_s, layers, "{name}: layers reported last first");
        assert_eq!(order_w, layers);
        for (key, (a, s)) in gw.iter().zip(&gs).enumerate() {
            assert_eq!(a.len(), spec.keys()[key].numel);
            let norm = a.iter().map(|x| x.abs()).fold(0f32, f32::max).max(1e-12);
            assert!(norm > 0.0);
            for (x, y) in a.iter().zip(s) {
                assert!(
                    (x - y).abs() <= 1e-5 * norm,
                    "{name} key {key}: whole {x} vs segmented {y} (max |g| {norm})"
                );
            }
        }
    }
}

/// Our kernels' batch norm (segmented mode) keeps the running statistics burn's does
/// (whole mode) and evaluates with them alike: after two training steps both engines hold
/// the same buffers and evaluate (ours with our kernels, burn with its own) alike.
#[test]
fn running_statistics_and_evaluation_match_burn() {
    let input = input_for("resnet20");
    let spec = model::build("resnet20", input, 10).unwrap();
    let mut whole = BurnEngine::new(spec.clone(), 4).unwrap();
    whole.set_backward_mode(BackwardMode::Whole);
    let mut seg = BurnEngine::new(spec, 4).unwrap();
    for seed in [1, 2] {
        let b = batch(input, 6, seed);
        gradients(&mut whole, &b);
        gradients(&mut seg, &b);
    }
    let (bw, bs) = (whole.buffers().unwrap(), seg.buffers().unwrap());
    assert_eq!(bw.len(), 2 * 19, "mean and variance of 19 batch norms");
    for ((name, a), (name_s, s)) in bw.iter().zip(&bs) {
        assert_eq!(name, name_s);
        assert!(
            a.iter().any(|&v| v != 0.0 && v != 1.0),
            "{name} was updated"
        );
        for (x, y) in a.iter().zip(s) {
            assert!(
                (x - y).abs() <= 1e-4 * x.abs().max(1.0),
                "{name}: burn {x}, ours {y}"
            );
        }
    }
    let test = batch(input, 5, 9);
    let (ew, es) = (whole.evaluate(&test).unwrap(), seg.evaluate(&test).unwrap());
    assert!(
        (ew.loss - es.loss).abs() <= 1e-4 * ew.loss.abs().max(1.0),
        "{ew:?} vs {es:?}"
    );
    assert_eq!(ew.correct, es.correct);
}

#[test]
fn forward_hook_runs_before_each_layer_and_can_install_parameters() {
    let spec = model::build("mlp", [1, 28, 28], 10).unwrap();
    let b = batch([1, 28, 28], 4, 1);
    let mut engine = BurnEngine::new(spec.clone(), 1).unwrap();
    let reference = engine.forward(&b, &mut |_, _| Ok(())).unwrap();
    let mut seen = Vec::new();
    let zeroed = engine
        .forward(&b, &mut |layer, e| {
            seen.push(layer);
            if layer == 2 {
                for key in spec.layer_keys()[2].clone() {
                    let n = e.param(key)?.len();
                    e.set_param(key, vec![0.0; n])?;
                }
            }
            Ok(())
        })
        .unwrap();
    assert_eq!(seen, vec![0, 1, 2]);
    // A zero classifier gives uniform predictions: loss ln(10).
    assert!((zeroed.loss - 10f32.ln()).abs() < 1e-5, "{}", zeroed.loss);
    assert!((reference.loss - zeroed.loss).abs() > 1e-4);
}

#[test]
fn param_views_and_replacement() {
    let spec = model::build("lenet", [1, 28, 28], 10).unwrap();
    let init = spec.init_params(5);
    let mut engine = BurnEngine::new(spec.clone(), 5).unwrap();
    assert_eq!(&*engine.param(4).unwrap(), &init[4][..]);
    engine.set_param(1, vec![0.5; 32]).unwrap();
    assert!(engine.param(1).unwrap().iter().all(|&v| v == 0.5));
    assert!(engine.set_param(1, vec![0.5; 31]).is_err());
    assert!(engine.set_param(99, vec![]).is_err());
    assert!(engine.param(99).is_err());
    let wrong = batch([3, 32, 32], 2, 1);
    assert!(engine.begin_forward(&wrong).is_err());
}

fn short_run(seed: u64) -> (Vec<Vec<f32>>, f64) {
    let data = SyntheticSpec {
        train_len: 256,
        test_len: 64,
        seed,
        ..Default::default()
    }
    .generate();
    let spec = model::build("lenet", data.train.shape, 10).unwrap();
    let mut engine = BurnEngine::new(spec.clone(), seed).unwrap();
    let optim = OptimConfig {
        lr: 0.05,
        sgd: SgdConfig {
            momentum: 0.9,
            weight_decay: 1e-4,
        },
        schedule: LrSchedule::Constant,
    };
    let summary = trainer::run(
        &mut engine,
        Arc::new(data.train),
        &data.test,
        16,
        Duration::Steps(12),
        optim,
        seed,
        &mut Silent,
    )
    .unwrap();
    let weights = (0..spec.keys().len())
        .map(|k| engine.param(k).unwrap().to_vec())
        .collect();
    (weights, summary.final_loss)
}

#[test]
fn same_seed_same_weights_bit_for_bit() {
    let (a, loss_a) = short_run(9);
    let (b, loss_b) = short_run(9);
    assert_eq!(a, b);
    assert_eq!(loss_a.to_bits(), loss_b.to_bits());
    let (c, _) = short_run(10);
    assert_ne!(a, c);
}

#[test]
fn checkpoint_round_trip_and_mismatch() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("w.safetensors");
    let spec = model::build("resnet20", [3, 32, 32], 10).unwrap();
    let mut a = BurnEngine::new(spec.clone(), 1).unwrap();
    // One training forward moves the batch-norm running statistics away from their defaults.
    a.forward(&batch([3, 32, 32], 4, 2), &mut |_, _| Ok(()))
        .unwrap();
    checkpoint::save(&a, &path).unwrap();
    let mut b = BurnEngine::new(spec.clone(), 2).unwrap();
    checkpoint::load(&mut b, &path).unwrap();
    for k in 0..spec.keys().len() {
        assert_eq!(&*a.param(k).unwrap(), &*b.param(k).unwrap());
    }
    assert_eq!(a.buffers().unwrap(), b.buffers().unwrap());
    let eval = batch([3, 32, 32], 4, 3);
    assert_eq!(a.evaluate(&eval).unwrap(), b.evaluate(&eval).unwrap());

    let other = model::build("lenet", [1, 28, 28], 10).unwrap();
    let mut c = BurnEngine::new(other, 1).unwrap();
    let err = checkpoint::load(&mut c, &path).unwrap_err().to_string();
    assert!(err.contains("conv1.weight"), "{err}");

    std::fs::write(&path, b"not a checkpoint").unwrap();
    assert!(checkpoint::load(&mut b, &path).is_err());
}
