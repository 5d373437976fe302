//! A job's checkpoint settings as its flags give them: the folders it resumes from and
//! writes into, the plan each process follows, and the settings its checkpoints record.

use std::path::Path;

use syncopate_train::data::DatasetKind;
use syncopate_train::trainer::OptimConfig;

use super::{claim_fresh, CheckpointError, CheckpointPlan, WeightSettings};

/// The folders of a job's checkpoints: the one it writes into (`--checkpoint-dir`) and
/// the one it resumes from (`--resume`).
#[derive(Debug, Clone, Copy, Default)]
pub struct JobFolders<'a> {
    /// `--checkpoint-dir`.
    pub checkpoint_dir: Option<&'a Path>,
    /// `--resume`.
    pub resume: Option<&'a Path>,
}

impl JobFolders<'_> {
    /// Whether the job writes its checkpoints into a folder other than the one it resumes
    /// from (every job started afresh does): one that must hold no other job's.
    pub fn writes_into_another_folder(&self) -> bool {
        match (self.checkpoint_dir, self.resume) {
            (Some(to), Some(from)) => !same_folder(to, from),
            (to, _) => to.is_some(),
        }
    }

    /// `--checkpoint-every N` into `--checkpoint-dir` (or, resuming, the `--resume`
    /// folder), under `run` (`--run-id`); a folder other than the one resumed from is
    /// claimed for the job ([`claim_fresh`], deleting another job's steps if `replace`).
    pub fn plan(
        &self,
        every: Option<u64>,
        replace: bool,
        run: Option<&str>,
    ) -> Result<Option<CheckpointPlan>, CheckpointError> {
        let Some(every) = every else {
            return Ok(None);
        };
        let Some(dir) = self.checkpoint_dir.or(self.resume) else {
            return Err(CheckpointError::NoFolder);
        };
        if self.writes_into_another_folder() {
            claim_fresh(dir, replace)?;
        }
        Ok(Some(CheckpointPlan {
            dir: dir.to_path_buf(),
            every,
            run: run.map(str::to_string),
        }))
    }
}

/// Whether `a` and `b` name the same folder (as written, or once resolved).
fn same_folder(a: &Path, b: &Path) -> bool {
    a == b
        || matches!(
            (a.canonicalize(), b.canonicalize()),
            (Ok(a), Ok(b)) if a == b
        )
}

/// The training settings that change the weights, as a job's flags give them.
#[derive(Debug, Clone, Copy)]
pub struct TrainingFlags<'a> {
    /// The optimizer they resolve to (its schedule spans the run's steps).
    pub optim: &'a OptimConfig,
    /// `--batch-size`.
    pub batch_size: usize,
    /// `--seed`.
    pub seed: u64,
    /// `--dataset`.
    pub dataset: DatasetKind,
    /// `--synthetic-samples`.
    pub synthetic_samples: usize,
    /// `--synthetic-shape`, if given.
    pub synthetic_shape: Option<&'a str>,
}

impl TrainingFlags<'_> {
    /// The settings as the job's checkpoints record them, by flag.
    pub fn weight_settings(&self) -> WeightSettings {
        let optim = self.optim;
        let mut out = WeightSettings::new();
        for (flag, value) in [
            ("--lr", optim.lr.to_string()),
            ("--momentum", optim.sgd.momentum.to_string()),
            ("--weight-decay", optim.sgd.weight_decay.to_string()),
            ("--lr-schedule", format!("{:?}", optim.schedule)),
            ("--batch-size", self.batch_size.to_string()),
            ("--seed", self.seed.to_string()),
            ("--dataset", format!("{:?}", self.dataset)),
            ("--synthetic-samples", self.synthetic_samples.to_string()),
            (
                "--synthetic-shape",
                self.synthetic_shape.unwrap_or_default().to_string(),
            ),
        ] {
            out.insert(flag.to_string(), value);
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_fresh_job_writes_into_its_own_folder_and_a_resumed_one_may_not() {
        let dir = tempfile::tempdir().unwrap();
        let folders = JobFolders {
            checkpoint_dir: Some(dir.path()),
            resume: Some(dir.path()),
        };
        assert!(!folders.writes_into_another_folder());
        let fresh = JobFolders {
            resume: None,
            ..folders
        };
        assert!(fresh.writes_into_another_folder());
        assert!(!JobFolders::default().writes_into_another_folder());
    }

    #[test]
    fn a_plan_needs_a_folder() {
        let none = JobFolders::default();
        assert!(none.plan(None, false, None).unwrap().is_none());
        let err = none.plan(Some(5), false, None).unwrap_err().to_string();
        assert!(err.contains("--checkpoint-dir"), "{err}");
        let dir = tempfile::tempdir().unwrap();
        let folders = JobFolders {
            checkpoint_dir: Some(dir.path()),
            resume: None,
        };
        let plan = folders.plan(Some(5), false, Some("ab")).unwrap().unwrap();
        assert_eq!((plan.every, plan.run.as_deref()), (5, Some("ab")));
    }
}
