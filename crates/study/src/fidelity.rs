//! Fidelity studies (`kind = "fidelity"`): every cell of the matrix runs twice, on the
//! kernel's network (the namespace testbed, `scripts/netns-cluster.sh`: one host per
//! process, the kernel's htb, qdiscs and nftables) and on our emulator (`syncopate launch`
//! with the network's bandwidth and `args`), and the report sets the two mean step times
//! side by side with their ratio and each side's time to the target accuracy.

use std::path::{Path, PathBuf};

use anyhow::Result;
use serde::Serialize;

use crate::config::StudyConfig;
use crate::csv_format;
use crate::pairs::{job_side, PairRow};
use crate::run::{emulator_dir, kernel_dir};
use crate::table::fixed;

/// What one cell of a fidelity study measured: the columns of its row of `results.csv` after
/// its place ([`crate::pairs::Place`]), in this order.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct FidelityRow {
    /// Worker 0's mean step on the testbed after the warm-up steps, seconds.
    #[serde(serialize_with = "csv_format::f4")]
    pub kernel_step_seconds: f64,
    /// Worker 0's mean step on the emulator after the warm-up steps, seconds.
    #[serde(serialize_with = "csv_format::f4")]
    pub emulator_step_seconds: f64,
    /// Emulator over kernel (1: they agree).
    #[serde(serialize_with = "csv_format::f4")]
    pub emulator_over_kernel: f64,
    /// Seconds to the target accuracy on the testbed (`None`: not reached, or no target).
    pub kernel_time_to_accuracy_s: Option<f64>,
    /// Seconds to the target accuracy on the emulator.
    pub emulator_time_to_accuracy_s: Option<f64>,
}

impl PairRow for FidelityRow {
    const HEADER: &'static [&'static str] = &HEADER;
    const EXPLAINED: &'static str = EXPLAINED;
    const SIDES: [fn(&Path) -> PathBuf; 2] = [kernel_dir, emulator_dir];

    fn cells(&self) -> Vec<String> {
        let r = self;
        let seconds = |v: Option<f64>| v.map_or("-".to_string(), |s| fixed(s, 1, " s"));
        vec![
            fixed(r.kernel_step_seconds, 4, " s"),
            fixed(r.emulator_step_seconds, 4, " s"),
            fixed(r.emulator_over_kernel, 3, ""),
            seconds(r.kernel_time_to_accuracy_s),
            seconds(r.emulator_time_to_accuracy_s),
        ]
    }

    fn read(config: &StudyConfig, _: &Path, first: &str, second: &str) -> Result<Self> {
        row(config, first, second)
    }
}

/// The figures of a cell from its testbed job's summary and its emulated job's (texts).
pub fn row(config: &StudyConfig, kernel: &str, emulator: &str) -> Result<FidelityRow> {
    let (kernel, kernel_step_seconds) = job_side(config, kernel, "testbed job")?;
    let (emulator, emulator_step_seconds) = job_side(config, emulator, "emulated job")?;
    Ok(FidelityRow {
        kernel_step_seconds,
        emulator_step_seconds,
        emulator_over_kernel: emulator_step_seconds / kernel_step_seconds,
        kernel_time_to_accuracy_s: kernel.time_to_accuracy_s,
        emulator_time_to_accuracy_s: emulator.time_to_accuracy_s,
    })
}

/// The header of the table's figures (after the cell's place).
const HEADER: [&str; 5] = [
    "kernel step",
    "emulator step",
    "emulator / kernel",
    "kernel to target",
    "emulator to target",
];

/// What the figures of a fidelity study are.
const EXPLAINED: &str =
    "Every cell runs twice: on the kernel's network (scripts/netns-cluster.sh: \
    one network namespace per process, the network's bandwidth as the kernel's htb bottleneck, \
    its testbed flags for queues, loss and paths) and on our emulator (`syncopate launch` with \
    the network's bandwidth and flags), the same job and seed. Step: worker 0's mean step time \
    after the warm-up steps. Emulator / kernel: 1 when the emulator is faithful.";

#[cfg(test)]
#[path = "fidelity_tests.rs"]
mod tests;
