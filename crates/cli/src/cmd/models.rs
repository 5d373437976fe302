//! `syncopate models`: the built-in models, layer by layer.

use anyhow::Result;
use clap::Args;
use syncopate_train::model::{self, MODEL_NAMES};

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
