//! Single-process training: the reference that distributed strategies must reproduce.

use std::sync::Arc;
use std::time::Instant;

use serde::{Deserialize, Serialize};
use syncopate_core::{LrSchedule, Sgd, SgdConfig};

use crate::data::{Batch, EpochSampler, Loader, Split};
use crate::engine::{LayerwiseEngine, StepOutput};
use crate::error::{Result, TrainError};

/// Optimisation settings of a run.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct OptimConfig {
    /// Base learning rate.
    pub lr: f32,
    /// SGD momentum and weight decay.
    pub sgd: SgdConfig,
    /// Learning-rate schedule over steps.
    pub schedule: LrSchedule,
}

/// Time spent in each phase of one step, in seconds.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct StepTimes {
    /// Waiting for the batch from the loader.
    pub data: f64,
    /// Forward pass and loss.
    pub forward: f64,
    /// Backward pass (including copying gradients out).
    pub backward: f64,
    /// Optimizer update and parameter replacement.
    pub optimizer: f64,
}

/// Applies SGD to every key of an engine from gradients gathered during backward.
pub struct LocalOptimizer {
    sgd: Sgd,
    config: OptimConfig,
    velocity: Vec<Vec<f32>>,
    step: u64,
}

impl LocalOptimizer {
    /// Optimizer state (zero velocity) for keys of the given sizes.
    pub fn new(config: OptimConfig, key_sizes: &[usize]) -> Self {
        Self {
            sgd: Sgd::new(config.sgd),
            config,
            velocity: key_sizes.iter().map(|&n| vec![0.0; n]).collect(),
            step: 0,
        }
    }

    /// Learning rate of the current step.
    pub fn lr(&self) -> f32 {
        self.config.schedule.lr_at(self.config.lr, self.step)
    }

    /// Steps applied so far.
    pub fn steps(&self) -> u64 {
        self.step
    }

    /// Updates every key of `engine` with `grads` (one buffer per key) and advances the step.
    pub fn apply(&mut self, engine: &mut dyn LayerwiseEngine, grads: &[Vec<f32>]) -> Result<()> {
        self.apply_keys(engine, 0..grads.len(), grads)?;
        self.advance();
        Ok(())
    }

    /// Updates the keys in `keys` of `engine` with their gradients out of `grads` (one
    /// buffer per key of the model) at the current step's learning rate, without advancing
    /// the step: weight-averaging strategies update layer by layer, then call
    /// [`LocalOptimizer::advance`] once the step's last layer is done.
    pub fn apply_keys(
        &mut self,
        engine: &mut dyn LayerwiseEngine,
        keys: std::ops::Range<usize>,
        grads: &[Vec<f32>],
    ) -> Result<()> {
        let lr = self.lr();
        for key in keys {
            let (Some(grad), Some(velocity)) = (grads.get(key), self.velocity.get_mut(key)) else {
                return Err(TrainError::Config(format!(
                    "no gradient buffer for key {key}"
                )));
            };
            let mut values = engine.param(key)?.to_vec();
            self.sgd.step(lr, &mut values, grad, velocity);
            engine.set_param(key, values)?;
        }
        Ok(())
    }

    /// Moves to the next step's learning rate.
    pub fn advance(&mut self) {
        self.step += 1;
    }

    /// The momentum buffer of every key (what a checkpoint keeps besides the weights).
    pub fn velocity(&self) -> &[Vec<f32>] {
        &self.velocity
    }

    /// Restores a checkpoint taken after `steps` steps: the momentum of every key, as
    /// [`LocalOptimizer::velocity`] gave it.
    pub fn restore(&mut self, velocity: Vec<Vec<f32>>, steps: u64) -> Result<()> {
        let lens = |v: &[Vec<f32>]| v.iter().map(Vec::len).collect::<Vec<_>>();
        if lens(&velocity) != lens(&self.velocity) {
            return Err(TrainError::Config(
                "the checkpoint's momentum does not match the model's keys".into(),
            ));
        }
        self.velocity = velocity;
        self.step = steps;
        Ok(())
    }
}

/// One training step on one process: forward, backward into `grads`, optimizer.
pub fn train_step(
    engine: &mut dyn LayerwiseEngine,
    optimizer: &mut LocalOptimizer,
    grads: &mut [Vec<f32>],
    batch: &Batch,
    times: &mut StepTimes,
) -> Result<StepOutput> {
    let t0 = Instant::now();
    engine.begin_forward(batch)?;
    for layer in 0..engine.spec().layers.len() {
        engine.forward_layer(layer)?;
    }
    let out = engine.finish_forward()?;
    let t1 = Instant::now();
    engine.backward(&mut |_, layer_grads, _| {
        for (key, g) in layer_grads.iter() {
            grads[key].copy_from_slice(g);
        }
        Ok(())
    })?;
    let t2 = Instant::now();
    optimizer.apply(engine, grads)?;
    let t3 = Instant::now();
    times.forward += (t1 - t0).as_secs_f64();
    times.backward += (t2 - t1).as_secs_f64();
    times.optimizer += (t3 - t2).as_secs_f64();
    Ok(out)
}

/// Accuracy and mean loss of `engine` over a whole split (NaN for a profile replay, written
/// as `null` and read back as NaN).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Evaluation {
    /// Fraction of samples classified correctly.
    #[serde(deserialize_with = "syncopate_core::json::nan_if_null")]
    pub accuracy: f64,
    /// Mean cross-entropy.
    #[serde(deserialize_with = "syncopate_core::json::nan_if_null")]
    pub loss: f64,
    /// Samples evaluated.
    pub samples: usize,
}

/// Evaluates `engine` on every sample of `split`, `batch` samples at a time.
pub fn evaluate(
    engine: &mut dyn LayerwiseEngine,
    split: &Split,
    batch: usize,
) -> Result<Evaluation> {
    let batch = batch.max(1);
    let (mut correct, mut loss_sum) = (0usize, 0f64);
    let indices: Vec<usize> = (0..split.len()).collect();
    for chunk in indices.chunks(batch) {
        let out = engine.evaluate(&split.gather(chunk))?;
        correct += out.correct;
        loss_sum += f64::from(out.loss) * chunk.len() as f64;
    }
    let n = split.len().max(1) as f64;
    Ok(Evaluation {
        accuracy: correct as f64 / n,
        loss: loss_sum / n,
        samples: split.len(),
    })
}

/// How long to train.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Duration {
    /// Whole epochs over the training split.
    Epochs(u64),
    /// A number of steps (crossing epoch boundaries as needed).
    Steps(u64),
}

/// What a single-process run reports as it goes.
pub trait Observer {
    /// Once, when training is about to start (after a distributed job has formed).
    fn on_start(&mut self, _total_steps: u64) {}
    /// After each step.
    fn on_step(&mut self, _step: u64, _total: u64, _out: &StepOutput, _samples_per_sec: f64) {}
    /// After each evaluation (end of each epoch, and at the end of the run).
    fn on_eval(&mut self, _epoch: u64, _eval: &Evaluation) {}
    /// Before [`Observer::on_start`], when the job resumes from a checkpoint holding
    /// `steps_done` steps.
    fn on_resume(&mut self, _steps_done: u64) {}
    /// After this process wrote its checkpoint of the first `steps_done` steps.
    fn on_checkpoint(&mut self, _steps_done: u64) {}
}

/// An observer that reports nothing.
pub struct Silent;
impl Observer for Silent {}

/// The outcome of a run, as written by `--summary-json`.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct RunSummary {
    /// Test accuracy at the end, as a fraction.
    pub test_accuracy: f64,
    /// Mean test loss at the end.
    pub test_loss: f64,
    /// Mean training loss over the last (up to) 20 steps.
    pub final_loss: f64,
    /// Steps run.
    pub steps: u64,
    /// Epochs completed (fractional when `--steps` ends mid-epoch).
    pub epochs: f64,
    /// Wall time of the training loop (evaluations included), seconds.
    pub wall_seconds: f64,
    /// Training samples per second over the whole loop (evaluations excluded).
    pub samples_per_sec: f64,
    /// Test accuracy after each epoch.
    pub epoch_accuracy: Vec<f64>,
    /// Total time in each phase of the step, seconds.
    pub step_times: StepTimes,
}

/// Trains `engine` on `train` for `duration`, evaluating on `test` after each epoch.
#[allow(clippy::too_many_arguments)]
pub fn run(
    engine: &mut dyn LayerwiseEngine,
    train: Arc<Split>,
    test: &Split,
    batch_size: usize,
    duration: Duration,
    optim: OptimConfig,
    seed: u64,
    observer: &mut dyn Observer,
) -> Result<RunSummary> {
    let sampler = EpochSampler::new(train.len(), batch_size, 0, 1, seed)?;
    let per_epoch = sampler.steps_per_epoch() as u64;
    let total = match duration {
        Duration::Epochs(e) => e * per_epoch,
        Duration::Steps(s) => s,
    };
    if total == 0 {
        return Err(TrainError::Config("nothing to train: 0 steps".into()));
    }
    let key_sizes: Vec<usize> = engine.spec().keys().iter().map(|k| k.numel).collect();
    let mut grads: Vec<Vec<f32>> = key_sizes.iter().map(|&n| vec![0.0; n]).collect();
    let mut optimizer = LocalOptimizer::new(optim, &key_sizes);
    let mut loader = Loader::spawn(train, sampler, 0, None, 4);
    let mut times = StepTimes::default();
    let mut recent: std::collections::VecDeque<f32> = std::collections::VecDeque::new();
    let mut epoch_accuracy = Vec::new();
    let mut eval_seconds = 0.0;
    let start = Instant::now();
    let mut last = None;
    for step in 0..total {
        let t = Instant::now();
        let Some((epoch, in_epoch, batch)) = loader.next_batch() else {
            return Err(TrainError::Config("the data loader stopped early".into()));
        };
        times.data += t.elapsed().as_secs_f64();
        let out = train_step(engine, &mut optimizer, &mut grads, &batch, &mut times)?;
        if recent.len() == 20 {
            recent.pop_front();
        }
        recent.push_back(out.loss);
        let elapsed = start.elapsed().as_secs_f64() - eval_seconds;
        observer.on_step(
            step + 1,
            total,
            &out,
            ((step + 1) as f64 * batch_size as f64) / elapsed.max(1e-9),
        );
        if in_epoch as u64 + 1 == per_epoch {
            let t = Instant::now();
            let eval = evaluate(engine, test, 256)?;
            eval_seconds += t.elapsed().as_secs_f64();
            epoch_accuracy.push(eval.accuracy);
            observer.on_eval(epoch + 1, &eval);
            last = Some((step, eval));
        }
    }
    let eval = match last {
        Some((s, eval)) if s + 1 == total => eval,
        _ => {
            let t = Instant::now();
            let eval = evaluate(engine, test, 256)?;
            eval_seconds += t.elapsed().as_secs_f64();
            observer.on_eval(total.div_ceil(per_epoch), &eval);
            eval
        }
    };
    let wall = start.elapsed().as_secs_f64();
    Ok(RunSummary {
        test_accuracy: eval.accuracy,
        test_loss: eval.loss,
        final_loss: recent.iter().map(|&l| f64::from(l)).sum::<f64>() / recent.len().max(1) as f64,
        steps: total,
        epochs: total as f64 / per_epoch as f64,
        wall_seconds: wall,
        samples_per_sec: (total as f64 * batch_size as f64) / (wall - eval_seconds).max(1e-9),
        epoch_accuracy,
        step_times: times,
    })
}
