//! A study file: the matrix of runs (models x variants x bandwidths x workers x seeds).

use std::path::Path;

use anyhow::{bail, Context, Result};
use serde::{Deserialize, Serialize};

/// A study as written in its TOML file.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StudyConfig {
    /// Name: the study's directory under the output folder.
    pub name: String,
    /// What the study is for (shown in the report).
    #[serde(default)]
    pub description: String,
    /// Steps of every run.
    pub steps: u64,
    /// First steps left out of the throughput (start-up, first pulls).
    #[serde(default = "default_warmup")]
    pub warmup_steps: u64,
    /// Samples per step per worker.
    #[serde(default = "default_batch")]
    pub batch_size: usize,
    /// Worker counts.
    #[serde(default = "default_workers")]
    pub workers: Vec<usize>,
    /// Parameter servers of the strategies that use them (default: as many as workers).
    pub servers: Option<usize>,
    /// Seeds.
    #[serde(default = "default_seeds")]
    pub seeds: Vec<u64>,
    /// Bandwidths of the models that do not list their own ("unlimited" allowed).
    #[serde(default)]
    pub bandwidths: Vec<String>,
    /// `--scale` of profile models (e.g. "1/16").
    pub scale: Option<String>,
    /// Extra flags for every run.
    #[serde(default)]
    pub args: Vec<String>,
    /// Models.
    pub models: Vec<ModelEntry>,
    /// Strategy variants.
    pub variants: Vec<Variant>,
}

fn default_warmup() -> u64 {
    2
}
fn default_batch() -> usize {
    64
}
fn default_workers() -> Vec<usize> {
    vec![2]
}
fn default_seeds() -> Vec<u64> {
    vec![42]
}

/// One model of the matrix.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ModelEntry {
    /// `--model` value (`lenet`, `profile:vgg19`, ...).
    pub name: String,
    /// Name in run ids, tables and charts (default: `name`), to run one model twice with
    /// other flags (e.g. on two datasets).
    pub label: Option<String>,
    /// Bandwidths for this model (default: the study's).
    #[serde(default)]
    pub bandwidths: Vec<String>,
    /// Extra flags for this model's runs (e.g. `--dataset mnist`).
    #[serde(default)]
    pub args: Vec<String>,
}

impl ModelEntry {
    /// The name runs and charts show.
    pub fn display_name(&self) -> &str {
        self.label.as_deref().unwrap_or(&self.name)
    }
}

/// One strategy variant: a strategy and the flags that switch its mechanisms.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Variant {
    /// Label in tables and plots.
    pub label: String,
    /// `--strategy`.
    pub strategy: String,
    /// `--scheduler` (default: the strategy's).
    pub scheduler: Option<String>,
    /// Extra flags.
    #[serde(default)]
    pub args: Vec<String>,
}

/// One run of the matrix.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct RunSpec {
    /// Directory name under the study's folder.
    pub id: String,
    /// Model.
    pub model: String,
    /// Variant label.
    pub variant: String,
    /// Bandwidth as written ("unlimited" when none).
    pub bandwidth: String,
    /// Workers.
    pub workers: usize,
    /// Seed.
    pub seed: u64,
    /// The `syncopate launch` arguments.
    pub args: Vec<String>,
}

impl StudyConfig {
    /// Reads and checks a study file.
    pub fn load(path: &Path) -> Result<Self> {
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("reading study {}", path.display()))?;
        let config: StudyConfig =
            toml::from_str(&text).with_context(|| format!("study {}", path.display()))?;
        config.validate()?;
        Ok(config)
    }

    fn validate(&self) -> Result<()> {
        if self.name.is_empty() || self.name.contains(['/', '\\']) || self.name.starts_with('.') {
            bail!("study name '{}' must be a plain directory name", self.name);
        }
        if self.steps == 0 {
            bail!("steps must be at least 1");
        }
        if self.models.is_empty() || self.variants.is_empty() {
            bail!("a study needs at least one model and one variant");
        }
        if self.workers.is_empty() || self.workers.contains(&0) || self.seeds.is_empty() {
            bail!("workers and seeds must be non-empty lists (workers >= 1)");
        }
        for m in &self.models {
            if m.bandwidths.is_empty() && self.bandwidths.is_empty() {
                bail!(
                    "model {} has no bandwidths (give `bandwidths` in the study or the model)",
                    m.name
                );
            }
        }
        if let Some(v) = self
            .variants
            .iter()
            .find(|v| syncopate_core::strategy::StrategyKind::from_name(&v.strategy).is_none())
        {
            bail!(
                "variant '{}': no strategy '{}' (known: {})",
                v.label,
                v.strategy,
                syncopate_core::strategy::StrategyKind::ALL
                    .map(|s| s.name())
                    .join(", ")
            );
        }
        let mut ids = std::collections::HashSet::new();
        if let Some(run) = self.runs().into_iter().find(|r| !ids.insert(r.id.clone())) {
            bail!(
                "two runs would share the directory '{}': give the models or variants \
                 distinct labels",
                run.id
            );
        }
        Ok(())
    }

    /// Every run, in the order they execute.
    pub fn runs(&self) -> Vec<RunSpec> {
        let mut runs = Vec::new();
        for model in &self.models {
            let bandwidths = if model.bandwidths.is_empty() {
                &self.bandwidths
            } else {
                &model.bandwidths
            };
            for bandwidth in bandwidths {
                for &workers in &self.workers {
                    for variant in &self.variants {
                        for &seed in &self.seeds {
                            runs.push(self.run(model, variant, bandwidth, workers, seed));
                        }
                    }
                }
            }
        }
        runs
    }

    fn run(
        &self,
        model: &ModelEntry,
        variant: &Variant,
        bandwidth: &str,
        workers: usize,
        seed: u64,
    ) -> RunSpec {
        let uses_servers = syncopate_core::strategy::StrategyKind::from_name(&variant.strategy)
            .is_some_and(|s| s.uses_servers());
        let servers = if uses_servers {
            self.servers.unwrap_or(workers)
        } else {
            0
        };
        let mut args: Vec<String> = [
            "--model",
            &model.name,
            "--strategy",
            &variant.strategy,
            "--workers",
            &workers.to_string(),
            "--servers",
            &servers.to_string(),
            "--steps",
            &self.steps.to_string(),
            "--batch-size",
            &self.batch_size.to_string(),
            "--seed",
            &seed.to_string(),
            "--bandwidth",
            bandwidth,
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        if let Some(s) = &variant.scheduler {
            args.extend(["--scheduler".to_string(), s.clone()]);
        }
        if let (Some(scale), true) = (&self.scale, model.name.starts_with("profile:")) {
            args.extend(["--scale".to_string(), scale.clone()]);
        }
        args.extend(self.args.iter().cloned());
        args.extend(model.args.iter().cloned());
        args.extend(variant.args.iter().cloned());
        let id = sanitize(&format!(
            "{}-{}-{}-w{}-s{}",
            model.display_name(),
            variant.label,
            bandwidth,
            workers,
            seed
        ));
        RunSpec {
            id,
            model: model.display_name().to_string(),
            variant: variant.label.clone(),
            bandwidth: bandwidth.to_string(),
            workers,
            seed,
            args,
        }
    }
}

/// A file-name-safe version of `s`.
fn sanitize(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        if c.is_ascii_alphanumeric() || c == '-' || c == '.' {
            out.push(c.to_ascii_lowercase());
        } else if !out.ends_with('_') {
            out.push('_');
        }
    }
    out.trim_matches('_').to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    const STUDY: &str = r#"
name = "t"
steps = 4
workers = [2, 4]
bandwidths = ["1gbit", "10gbit"]
scale = "1/16"
[[models]]
name = "profile:vgg19"
[[models]]
name = "lenet"
bandwidths = ["100mbit"]
[[variants]]
label = "ps (fifo)"
strategy = "ps"
[[variants]]
label = "p3"
strategy = "p3"
scheduler = "priority"
"#;

    #[test]
    fn expands_the_matrix() {
        let c: StudyConfig = toml::from_str(STUDY).unwrap();
        c.validate().unwrap();
        let runs = c.runs();
        assert_eq!(runs.len(), 2 * 2 * 2 + 2 * 2);
        let ids: std::collections::HashSet<_> = runs.iter().map(|r| &r.id).collect();
        assert_eq!(ids.len(), runs.len(), "run ids are unique");
        let first = &runs[0];
        assert_eq!(first.id, "profile_vgg19-ps_fifo_-1gbit-w2-s42");
        assert!(first.args.windows(2).any(|w| w == ["--scale", "1/16"]));
        assert!(first.args.windows(2).any(|w| w == ["--servers", "2"]));
        let lenet = runs.iter().find(|r| r.model == "lenet").unwrap();
        assert!(!lenet.args.iter().any(|a| a == "--scale"));
    }

    #[test]
    fn rejects_bad_studies() {
        let bad = STUDY.replace("steps = 4", "steps = 0");
        let c: StudyConfig = toml::from_str(&bad).unwrap();
        assert!(c.validate().is_err());
        assert!(toml::from_str::<StudyConfig>(&STUDY.replace("steps = 4", "stepz = 4")).is_err());
    }

    #[test]
    fn runs_that_would_share_a_directory_are_refused() {
        // "ps [fifo]" and "ps (fifo)" make the same file-name-safe id.
        let text = format!("{STUDY}\n[[variants]]\nlabel = \"ps [fifo]\"\nstrategy = \"ps\"\n");
        let config: StudyConfig = toml::from_str(&text).unwrap();
        let err = config.validate().unwrap_err().to_string();
        assert!(err.contains("share the directory"), "{err}");
    }

    /// Every study shipped in `studies/` loads and validates (names, strategies, distinct run
    /// directories), so a typo there is a test failure, not a surprise an hour into a study.
    #[test]
    fn the_shipped_studies_are_valid() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../studies");
        let mut seen = 0;
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            if path.extension().is_some_and(|e| e == "toml") {
                let config = StudyConfig::load(&path).unwrap_or_else(|e| panic!("{e:#}"));
                assert!(!config.runs().is_empty(), "{}", path.display());
                seen += 1;
            }
        }
        assert!(seen >= 5, "{seen} studies in {}", dir.display());
    }
}
