//! `syncopate models`: the built-in models, layer by layer, or one's compute profile
//! measured on this host.

use std::path::PathBuf;

use anyhow::{Context, Result};
use clap::Args;
use syncopate_train::model::{self, ModelSpec, MODEL_NAMES};
use syncopate_train::profiling::{self, ProfileRun};

use crate::args::parse_shape;

/// Arguments of `syncopate models`.
#[derive(Debug, Args)]
pub struct ModelsArgs {
    /// Only this model.
    #[arg(long)]
    model: Option<String>,
    /// Input shape CxHxW (default: each model's natural input).
    #[arg(long, value_name = "CxHxW")]
    input: Option<String>,
    /// Classes of the output layer.
    #[arg(long, default_value_t = 10)]
    classes: usize,
    /// Print JSON instead of a table.
    #[arg(long)]
    json: bool,
    /// Measure --model's compute on this host and write it to FILE as a profile (PipeDream's
    /// graph.txt with parameter_tensors): each layer's forward and backward time, the median
    /// over --profile-steps steps at --batch-size, on one process with the machine otherwise
    /// idle. `simulate --model profile:FILE` and `launch --model profile:FILE` replay it, the
    /// model's keys and sizes unchanged.
    #[arg(long, value_name = "FILE", requires = "model")]
    profile: Option<PathBuf>,
    /// Samples per batch of a --profile (the job's batch per worker).
    #[arg(long, default_value_t = 64, requires = "profile")]
    batch_size: usize,
    /// Timed steps of a --profile (after 3 untimed ones).
    #[arg(long, default_value_t = 20, requires = "profile")]
    profile_steps: usize,
}

fn natural_input(name: &str) -> [usize; 3] {
    match name {
        "resnet20" | "vgg-mini" => [3, 32, 32],
        _ => [1, 28, 28],
    }
}

/// Prints each model's layers, keys and parameter counts.
pub fn run(args: ModelsArgs) -> Result<()> {
    let names: Vec<String> = match &args.model {
        Some(m) => vec![m.clone()],
        None => MODEL_NAMES.iter().map(|s| s.to_string()).collect(),
    };
    let mut specs = Vec::new();
    for name in &names {
        let input = match &args.input {
            Some(s) => parse_shape(s)?,
            None => natural_input(name),
        };
        specs.push(model::build(name, input, args.classes)?);
    }
    if let (Some(path), [spec]) = (&args.profile, specs.as_slice()) {
        return write_profile(spec, path, &args);
    }
    if args.json {
        println!("{}", serde_json::to_string_pretty(&specs)?);
        return Ok(());
    }
    for spec in &specs {
        let [c, h, w] = spec.input;
        println!(
            "{}  (input {c}x{h}x{w}, {} classes): {} layers, {} keys, {} parameters ({:.2} MB fp32)",
            spec.name,
            spec.classes,
            spec.layers.len(),
            spec.keys().len(),
            spec.num_params(),
            spec.num_params() as f64 * 4.0 / 1e6
        );
        let keys = spec.keys();
        for (i, layer) in spec.layers.iter().enumerate() {
            let n: usize = layer.params.iter().map(|p| p.numel()).sum();
            let key_list: Vec<String> = keys
                .iter()
                .filter(|k| k.layer == i)
                .zip(&layer.params)
                .map(|(k, p)| format!("{}:{}{:?}", k.key, p.name, k.shape))
                .collect();
            println!(
                "  {i:>2} {:<16} out {:<14} {:>10} params  keys {}",
                layer.name,
                format!("{:?}", layer.output_shape),
                n,
                key_list.join(" ")
            );
        }
        println!();
    }
    Ok(())
}

/// Measures `spec`'s profile and writes it to `path`, saying what it measured.
fn write_profile(spec: &ModelSpec, path: &std::path::Path, args: &ModelsArgs) -> Result<()> {
    let run = ProfileRun {
        batch_size: args.batch_size,
        warmup: 3,
        steps: args.profile_steps,
        seed: 1,
    };
    let profile = profiling::measure(spec, &run)?;
    let text = format!(
        "# measured on one process of an otherwise idle host by: syncopate models --model {} \
         --profile FILE --batch-size {} --profile-steps {}\n{}",
        spec.name,
        run.batch_size,
        run.steps,
        profile.to_graph_text()
    );
    std::fs::write(path, text)
        .with_context(|| format!("writing the profile {}", path.display()))?;
    println!(
        "{}: forward {:.2} ms, backward {:.2} ms at batch {} (median of {} steps), {} parameters; \
         wrote {} (replay: --model profile:{})",
        spec.name,
        profile.forward_ns() as f64 / 1e6,
        profile.backward_ns() as f64 / 1e6,
        run.batch_size,
        run.steps,
        profile.param_count(),
        path.display(),
        path.display()
    );
    Ok(())
}
