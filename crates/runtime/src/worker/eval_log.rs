//! Rank 0's evaluations: kept as points for the summary, and appended as rows of
//! `evals-rank0.csv` to their own file (see [`super::step_rows`]), so that a checkpoint
//! keeps only their mark and a resumed job reads the points back.

use syncopate_train::trainer::Evaluation;

use super::step_rows::StepRows;
use super::EvalPoint;
use crate::error::RunError;

impl EvalPoint {
    /// Worker 0's own evaluation after `step` steps and `seconds` of training (the
    /// average's fields left for `launch` to fill in).
    fn of_worker(step: u64, seconds: f64, accuracy: f64, loss: f64) -> Self {
        Self {
            step,
            seconds,
            accuracy,
            loss,
            average_accuracy: None,
            average_loss: None,
            divergence: None,
        }
    }
}

/// Rank 0's evaluations: as points, and as the rows of `evals-rank0.csv` appended to their
/// file (see [`step_rows`]), so a checkpoint keeps only their mark.
#[derive(Default)]
pub(super) struct EvalLog {
    pub(super) rows: StepRows,
    pub(super) points: Vec<EvalPoint>,
}

impl EvalLog {
    /// Records the evaluation `eval` of epoch `epoch`, after `step` steps and `seconds` of
    /// training (each number in full, so a resumed job reads back the same points).
    pub(super) fn push(
        &mut self,
        epoch: u64,
        step: u64,
        seconds: f64,
        eval: &Evaluation,
    ) -> Result<(), RunError> {
        let (accuracy, loss) = (eval.accuracy, eval.loss);
        (self.rows).push(&format!("{epoch},{step},{seconds},{accuracy},{loss}\n"))?;
        self.points
            .push(EvalPoint::of_worker(step, seconds, accuracy, loss));
        Ok(())
    }

    /// The log going on into `rows` from the evaluations a checkpoint covered (`earlier`:
    /// their CSV rows, no header).
    pub(super) fn resumed(rows: StepRows, earlier: &str) -> Result<Self, RunError> {
        let point = |line: &str| -> Option<EvalPoint> {
            let mut cells = line.split(',').skip(1);
            let mut next = || cells.next()?.parse::<f64>().ok();
            let (step, seconds, accuracy, loss) = (next()?, next()?, next()?, next()?);
            Some(EvalPoint::of_worker(step as u64, seconds, accuracy, loss))
        };
        let points = (earlier.lines())
            .map(|line| {
                point(line).ok_or_else(|| {
                    RunError::Local(format!(
                        "the checkpoint's evaluations hold a malformed row: {line:?}"
                    ))
                })
            })
            .collect::<Result<_, _>>()?;
        Ok(Self { rows, points })
    }
}

#[cfg(test)]
mod tests {
    use super::super::step_rows;
    use super::*;

    #[test]
    fn evaluations_read_back_from_their_rows_are_the_same_points() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("evals.csv");
        let mut log = EvalLog {
            rows: StepRows::create(&path, step_rows::EVAL_HEADER).unwrap(),
            points: Vec::new(),
        };
        for (step, accuracy) in [(5, 0.1 + 0.2), (10, 1.0 / 3.0)] {
            let eval = Evaluation {
                accuracy,
                loss: 2.0 / 3.0,
                samples: 10,
            };
            log.push(1, step, step as f64 * 0.1, &eval).unwrap();
        }
        log.rows.finish(None).unwrap();
        let text = std::fs::read_to_string(&path).unwrap();
        let rows = text.split_once('\n').unwrap().1;
        let again = EvalLog::resumed(StepRows::default(), rows).unwrap();
        let key = |p: &EvalPoint| (p.step, p.seconds, p.accuracy, p.loss);
        let (a, b): (Vec<_>, Vec<_>) = (
            log.points.iter().map(key).collect(),
            again.points.iter().map(key).collect(),
        );
        assert_eq!(a, b);
        let broken = EvalLog::resumed(StepRows::default(), "1,5,0.5\n")
            .err()
            .unwrap();
        assert!(broken.to_string().contains("malformed row"), "{broken}");
    }
}
