//! `syncopate train`: single-process training, the reference for every strategy.

use std::path::PathBuf;
use std::sync::Arc;

use anyhow::{Context, Result};
use clap::Args;
use serde::Serialize;
use syncopate_train::checkpoint;
use syncopate_train::engine::{BurnEngine, LayerwiseEngine};
use syncopate_train::model;
use syncopate_train::trainer::{self, Duration, RunSummary};

use crate::args::TrainSettings;
use crate::progress::TrainProgress;

/// Arguments of `syncopate train`.
#[derive(Debug, Args)]
pub struct TrainArgs {
    #[command(flatten)]
    settings: TrainSettings,
    /// Load initial weights from this safetensors checkpoint.
    #[arg(long, value_name = "FILE")]
    load: Option<PathBuf>,
    /// Save the final weights to this safetensors file.
    #[arg(long, value_name = "FILE")]
    save: Option<PathBuf>,
    /// Write the final figures (test_accuracy, final_loss, steps, wall_seconds,
    /// samples_per_sec, ...) and the resolved settings to this JSON file.
    #[arg(long, value_name = "FILE")]
    summary_json: Option<PathBuf>,
    /// No progress bar (the epoch lines and the final line are still printed).
    #[arg(long, short)]
    quiet: bool,
}

/// What `--summary-json` writes.
#[derive(Serialize)]
struct SummaryFile<'a> {
    command: &'static str,
    model: &'a str,
    dataset: String,
    parameters: usize,
    settings: &'a TrainSettings,
    #[serde(flatten)]
    summary: &'a RunSummary,
}

/// Runs `syncopate train`.
pub fn run(args: TrainArgs) -> Result<()> {
    let s = &args.settings;
    let duration = s.duration()?;
    let dataset = s.load_dataset()?;
    let spec = model::build(&s.model, dataset.train.shape, dataset.classes)?;
    let sampler_steps = (dataset.train.len() / s.batch_size.max(1)) as u64;
    let total = match duration {
        Duration::Epochs(e) => e * sampler_steps,
        Duration::Steps(n) => n,
    };
    let optim = s.optim(total)?;
    let mut engine = BurnEngine::new(spec.clone(), s.seed)?;
    if let Some(path) = &args.load {
        checkpoint::load(&mut engine, path)?;
    }
    eprintln!(
        "training {} ({} parameters) on {} ({} train / {} test samples), batch {}, {} steps",
        spec.name,
        spec.num_params(),
        dataset.name,
        dataset.train.len(),
        dataset.test.len(),
        s.batch_size,
        total
    );
    let mut progress = TrainProgress::new(total, args.quiet);
    let summary = trainer::run(
        &mut engine,
        Arc::new(dataset.train),
        &dataset.test,
        s.batch_size,
        duration,
        optim,
        s.seed,
        &mut progress,
    );
    progress.finish();
    let summary = summary?;
    println!(
        "done: {} steps in {:.1} s, {:.0} samples/s, final loss {:.4}, test accuracy {:.2} %",
        summary.steps,
        summary.wall_seconds,
        summary.samples_per_sec,
        summary.final_loss,
        summary.test_accuracy * 100.0
    );
    if let Some(path) = &args.save {
        checkpoint::save(&engine, path)?;
        println!("weights saved to {}", path.display());
    }
    if let Some(path) = &args.summary_json {
        let file = SummaryFile {
            command: "train",
            model: &spec.name,
            dataset: dataset.name.clone(),
            parameters: engine.spec().num_params(),
            settings: s,
            summary: &summary,
        };
        std::fs::write(path, serde_json::to_string_pretty(&file)? + "\n")
            .with_context(|| format!("writing {}", path.display()))?;
    }
    Ok(())
}
