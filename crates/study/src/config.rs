//! A study file: the matrix of runs (models x variants x networks x workers x seeds), each a
//! `syncopate launch` of real training or, for a `kind = "simulate"` study, a `syncopate
//! simulate` on virtual time, or for a `kind = "agreement"` study both; a `kind = "kernel"`
//! study runs each job on the network-namespace testbed, a `kind = "fidelity"` study there
//! and on the emulator, a `kind = "simulator-kernel"` study there and in the simulator.

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
    /// What each run is: real training (`launch`, the default) or the simulator (`simulate`).
    #[serde(default)]
    pub kind: StudyKind,
    /// Bandwidths of the models that do not list their own ("unlimited" allowed): each a
    /// network of that bandwidth and no added latency, named by it.
    #[serde(default)]
    pub bandwidths: Vec<String>,
    /// Named networks of the models that do not list their own, after `bandwidths`.
    #[serde(default)]
    pub networks: Vec<NetworkEntry>,
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

/// What a study's runs are.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum StudyKind {
    /// Real training: every run a `syncopate launch` of processes over emulated links.
    #[default]
    Launch,
    /// The simulator: every run a `syncopate simulate` of a profile model on virtual time
    /// (seconds for a run of 1,024 workers), for questions of scale.
    Simulate,
    /// The simulator against the runtime: every cell a `syncopate launch` of a profile model
    /// (tensors and network scaled by `scale`) and a `syncopate simulate` of it at full size,
    /// reported side by side with the ratio of their step times.
    Agreement,
    /// The kernel's network: every cell a job on the network-namespace testbed
    /// (`scripts/netns-cluster.sh`: one host per process, the network's bandwidth the
    /// kernel's htb bottleneck, its `testbed` flags the rest). Root only.
    Kernel,
    /// The emulator against the kernel: every cell a job on the testbed (as `kernel`) and a
    /// `syncopate launch` on the emulated network (the network's bandwidth and `args`),
    /// reported side by side with the ratio of their step times. Root only.
    Fidelity,
    /// The simulator against the kernel: every cell a job of a profile model on the testbed
    /// (as `kernel`) and a `syncopate simulate` of it with the network's `args`, reported
    /// side by side with the ratio of their step times. Root only.
    #[serde(rename = "simulator-kernel")]
    SimulatorKernel,
}

impl StudyKind {
    /// The `syncopate` subcommands that run one cell, in order.
    pub fn commands(self) -> &'static [&'static str] {
        match self {
            StudyKind::Launch => &["launch"],
            StudyKind::Simulate => &["simulate"],
            StudyKind::Agreement => &["launch", "simulate"],
            StudyKind::Kernel => &[TESTBED],
            StudyKind::Fidelity => &[TESTBED, "launch"],
            StudyKind::SimulatorKernel => &[TESTBED, "simulate"],
        }
    }

    /// Whether a cell runs on the network-namespace testbed.
    pub fn uses_testbed(self) -> bool {
        self.commands().contains(&TESTBED)
    }
}

/// The name of a cell's command on the namespace testbed (`scripts/netns-cluster.sh`).
pub const TESTBED: &str = "testbed";

/// A named network: every process's interface at `bandwidth`, every link `latency` long
/// (one way), e.g. a wide-area link of 100 Mbit/s with 50 ms.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NetworkEntry {
    /// Name in run ids, tables and charts (default: the bandwidth, and the latency when one
    /// is given, e.g. `100mbit+50ms`).
    pub label: Option<String>,
    /// `--bandwidth` (e.g. `100mbit`, `unlimited`).
    pub bandwidth: String,
    /// `--latency`, one way (e.g. `50ms`; default none).
    pub latency: Option<String>,
    /// Extra flags of every run on this network (e.g. `["--loss", "1%"]`, or `--network`
    /// and a network file).
    #[serde(default)]
    pub args: Vec<String>,
    /// In a kernel or fidelity study, flags of `scripts/netns-cluster.sh` for this network
    /// besides `--bottleneck BANDWIDTH` (e.g. `["--loss", "1%"]`, `["--paths", "2"]`).
    #[serde(default)]
    pub testbed: Vec<String>,
}

impl NetworkEntry {
    /// A network of `bandwidth` alone, named by it (what an entry of `bandwidths` is).
    pub fn of_bandwidth(bandwidth: &str) -> Self {
        Self {
            label: None,
            bandwidth: bandwidth.to_string(),
            latency: None,
            args: Vec::new(),
            testbed: Vec::new(),
        }
    }

    /// The name runs and charts show.
    pub fn display_name(&self) -> String {
        match (&self.label, &self.latency) {
            (Some(label), _) => label.clone(),
            (None, Some(latency)) => format!("{}+{latency}", self.bandwidth),
            (None, None) => self.bandwidth.clone(),
        }
    }

    /// The one-way latency in milliseconds (0 without one).
    pub fn latency_ms(&self) -> Result<f64> {
        match &self.latency {
            Some(l) => Ok(syncopate_core::net::parse_duration_ns(l)? as f64 / 1e6),
            None => Ok(0.0),
        }
    }
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
    /// Bandwidths for this model (default, with `networks`: the study's).
    #[serde(default)]
    pub bandwidths: Vec<String>,
    /// Named networks for this model, after `bandwidths` (default, with `bandwidths`: the
    /// study's).
    #[serde(default)]
    pub networks: Vec<NetworkEntry>,
    /// Worker counts of this model's runs (default: the study's).
    #[serde(default)]
    pub workers: Vec<usize>,
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
    /// The technique whose colour the variant is drawn in (default: the strategy, without
    /// a `-no-overlap` suffix).
    pub technique: Option<String>,
    /// `--scheduler` (default: the strategy's).
    pub scheduler: Option<String>,
    /// Steps of this variant's runs (default: the study's), e.g. a whole averaging period
    /// of a simulated local SGD.
    pub steps: Option<u64>,
    /// The label of the variant this one is set against in a simulated study's
    /// `table.md` (its step time over the baseline's, on the same network, workers and seed).
    pub baseline: Option<String>,
    /// Extra flags.
    #[serde(default)]
    pub args: Vec<String>,
    /// In a kernel or fidelity study, flags of `scripts/netns-cluster.sh` for this variant
    /// (e.g. `["--cc", "bbr"]`); what follows a `--` goes to the testbed's job processes
    /// only (e.g. `["--", "--transport", "udp"]`, which the emulator refuses).
    #[serde(default)]
    pub testbed: Vec<String>,
}

impl Variant {
    /// Whether its strategy has parameter servers.
    pub fn uses_servers(&self) -> bool {
        syncopate_core::strategy::StrategyKind::from_name(&self.strategy)
            .is_some_and(|s| s.uses_servers())
    }
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
    /// The network's name (its bandwidth as written for an entry of `bandwidths`).
    pub network: String,
    /// Bandwidth as written ("unlimited" when none).
    pub bandwidth: String,
    /// One-way latency of every link, milliseconds (0: none added).
    pub latency_ms: f64,
    /// Workers.
    pub workers: usize,
    /// Seed.
    pub seed: u64,
    /// The `syncopate launch` arguments.
    pub args: Vec<String>,
    /// In a kernel or fidelity study, the testbed's arguments: `scripts/netns-cluster.sh`'s
    /// flags, then `--` and its job processes' flags.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub testbed: Vec<String>,
}

impl RunSpec {
    /// The value given to `flag` in the run's arguments (the last, when given twice).
    pub fn arg(&self, flag: &str) -> Option<&str> {
        self.args
            .iter()
            .rposition(|a| a == flag)
            .and_then(|i| self.args.get(i + 1))
            .map(String::as_str)
    }
}

impl StudyConfig {
    /// Reads and checks a study file.
    pub fn load(path: &Path) -> Result<Self> {
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("reading study {}", path.display()))?;
        Self::parse(&text).with_context(|| format!("study {}", path.display()))
    }

    /// Parses and checks the text of a study file.
    pub fn parse(text: &str) -> Result<Self> {
        let config: StudyConfig = toml::from_str(text)?;
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
        if let Some(m) = self.models.iter().find(|m| m.workers.contains(&0)) {
            bail!("model {}: its workers must be at least 1", m.display_name());
        }
        self.validate_baselines()?;
        self.validate_testbed()?;
        for m in &self.models {
            let networks = self.networks_of(m);
            if networks.is_empty() {
                bail!(
                    "model {} has no networks (give `bandwidths` or `networks` in the study or \
                     the model)",
                    m.name
                );
            }
            for n in &networks {
                let name = || format!("network '{}'", n.display_name());
                syncopate_core::net::parse_bandwidth(&n.bandwidth).with_context(name)?;
                n.latency_ms().with_context(name)?;
            }
        }
        if let (StudyKind::Simulate | StudyKind::Agreement | StudyKind::SimulatorKernel, Some(m)) = (
            self.kind,
            self.models
                .iter()
                .find(|m| !syncopate_train::model::is_profile_name(&m.name)),
        ) {
            bail!(
                "model {}: a simulated, agreement or simulator-kernel study replays profiles \
                 (profile:resnet50, profile:vgg16, ..., or a built-in model's profile that \
                 `syncopate models --model NAME --profile FILE` measures: profile:FILE)",
                m.name
            );
        }
        if self.variants.iter().any(|v| v.steps == Some(0)) {
            bail!("a variant's steps must be at least 1");
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

    /// Every variant's `baseline` names another variant, and only a simulated study has them.
    fn validate_baselines(&self) -> Result<()> {
        for v in &self.variants {
            let Some(baseline) = &v.baseline else {
                continue;
            };
            if self.kind != StudyKind::Simulate {
                bail!(
                    "variant '{}': a baseline is for simulated studies (kind = \"simulate\"), \
                     whose table.md sets each variant against it",
                    v.label
                );
            }
            if baseline == &v.label || !self.variants.iter().any(|o| &o.label == baseline) {
                bail!(
                    "variant '{}': its baseline '{baseline}' is not another variant's label \
                     (variants: {})",
                    v.label,
                    self.variants
                        .iter()
                        .map(|o| o.label.as_str())
                        .collect::<Vec<_>>()
                        .join(", ")
                );
            }
        }
        Ok(())
    }

    /// A testbed study's networks have no latency (the testbed adds none) and its
    /// parameter-server variants one server (the testbed's last host).
    fn validate_testbed(&self) -> Result<()> {
        if !self.kind.uses_testbed() {
            if let Some(v) = self.variants.iter().find(|v| !v.testbed.is_empty()) {
                bail!(
                    "variant '{}': `testbed` flags are for kernel and fidelity studies",
                    v.label
                );
            }
            return Ok(());
        }
        for m in &self.models {
            if let Some(n) = self.networks_of(m).iter().find(|n| n.latency.is_some()) {
                bail!(
                    "network '{}': the namespace testbed adds no latency (leave `latency` out)",
                    n.display_name()
                );
            }
        }
        let uses_servers = self.variants.iter().any(Variant::uses_servers);
        if uses_servers && self.servers != Some(1) {
            bail!(
                "the namespace testbed has one server host: a kernel or fidelity study with \
                 parameter-server variants says `servers = 1`"
            );
        }
        Ok(())
    }

    /// The worker counts of `model`: its own when it lists any, else the study's.
    pub fn workers_of<'a>(&'a self, model: &'a ModelEntry) -> &'a [usize] {
        if model.workers.is_empty() {
            &self.workers
        } else {
            &model.workers
        }
    }

    /// The networks of `model`: its own `bandwidths` then `networks` when it lists any, else
    /// the study's.
    pub fn networks_of(&self, model: &ModelEntry) -> Vec<NetworkEntry> {
        let (bandwidths, networks) = if model.bandwidths.is_empty() && model.networks.is_empty() {
            (&self.bandwidths, &self.networks)
        } else {
            (&model.bandwidths, &model.networks)
        };
        bandwidths
            .iter()
            .map(|b| NetworkEntry::of_bandwidth(b))
            .chain(networks.iter().cloned())
            .collect()
    }

    /// Every run, in the order they execute (per model, network and worker count: seed by
    /// seed, every variant in turn).
    pub fn runs(&self) -> Vec<RunSpec> {
        let mut runs = Vec::new();
        for model in &self.models {
            for network in self.networks_of(model) {
                for &workers in self.workers_of(model) {
                    // Seeds outermost of the last two: the variants alternate, so a busy
                    // spell of the machine falls on all of them alike.
                    for &seed in &self.seeds {
                        for variant in &self.variants {
                            runs.push(self.run(&Cell {
                                model,
                                variant,
                                network: &network,
                                workers,
                                seed,
                            }));
                        }
                    }
                }
            }
        }
        runs
    }

    fn run(&self, cell: &Cell) -> RunSpec {
        let Cell {
            model,
            variant,
            network,
            workers,
            seed,
        } = *cell;
        let bandwidth = network.bandwidth.as_str();
        let servers = if variant.uses_servers() {
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
            &variant.steps.unwrap_or(self.steps).to_string(),
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
        if let Some(latency) = &network.latency {
            args.extend(["--latency".to_string(), latency.clone()]);
        }
        if let Some(s) = &variant.scheduler {
            args.extend(["--scheduler".to_string(), s.clone()]);
        }
        if let (Some(scale), true) = (&self.scale, model.name.starts_with("profile:")) {
            args.extend(["--scale".to_string(), scale.clone()]);
        }
        args.extend(self.args.iter().cloned());
        args.extend(network.args.iter().cloned());
        args.extend(model.args.iter().cloned());
        args.extend(variant.args.iter().cloned());
        let id = sanitize(&format!(
            "{}-{}-{}-w{}-s{}",
            model.display_name(),
            variant.label,
            network.display_name(),
            workers,
            seed
        ));
        let testbed = match self.kind.uses_testbed() {
            true => self.testbed_args(cell),
            false => Vec::new(),
        };
        RunSpec {
            id,
            model: model.display_name().to_string(),
            variant: variant.label.clone(),
            network: network.display_name(),
            bandwidth: bandwidth.to_string(),
            // Checked by `validate`.
            latency_ms: network.latency_ms().unwrap_or(f64::NAN),
            workers,
            seed,
            args,
            testbed,
        }
    }

    /// The testbed's arguments of a cell: one host per worker and one for the server of a
    /// parameter-server strategy, the network's bandwidth as the bottleneck, the network's
    /// and the variant's testbed flags; after `--`, the job's flags (the emulator's network
    /// flags left out).
    fn testbed_args(&self, cell: &Cell) -> Vec<String> {
        let (model, variant, network) = (cell.model, cell.variant, cell.network);
        let hosts = cell.workers + usize::from(variant.uses_servers());
        let steps = variant.steps.unwrap_or(self.steps).to_string();
        let mut net: Vec<String> = [
            "--hosts",
            &hosts.to_string(),
            "--strategy",
            &variant.strategy,
            "--steps",
            &steps,
            "--bottleneck",
            &network.bandwidth,
        ]
        .map(String::from)
        .to_vec();
        net.extend(network.testbed.iter().cloned());
        let split = variant.testbed.iter().position(|a| a == "--");
        let (variant_net, variant_job) = variant
            .testbed
            .split_at(split.unwrap_or(variant.testbed.len()));
        net.extend(variant_net.iter().cloned());
        net.push("--".into());
        let job = [
            "--model",
            &model.name,
            "--batch-size",
            &self.batch_size.to_string(),
            "--seed",
            &cell.seed.to_string(),
        ];
        net.extend(job.map(String::from));
        if let Some(s) = &variant.scheduler {
            net.extend(["--scheduler".to_string(), s.clone()]);
        }
        net.extend(
            self.args
                .iter()
                .chain(&model.args)
                .chain(&variant.args)
                .cloned(),
        );
        net.extend(variant_job.iter().skip(1).cloned());
        net
    }
}

/// One cell of the matrix, as the study file gives it.
#[derive(Clone, Copy)]
struct Cell<'a> {
    model: &'a ModelEntry,
    variant: &'a Variant,
    network: &'a NetworkEntry,
    workers: usize,
    seed: u64,
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
#[path = "config_tests.rs"]
mod tests;
