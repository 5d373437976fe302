//! The replica statistics in a job's outputs: three more columns in worker 0's evaluations
//! CSV, and fields of the job's summary JSON.

use serde_json::Value;

use super::{ReplicaError, ReplicaPoint};

/// The columns added to each row of the evaluations CSV.
const COLUMNS: &str = "average_accuracy,average_loss,divergence";

/// `csv` (worker 0's `evals-rank0.csv`: `epoch,step,...`) with the columns
/// `average_accuracy,average_loss,divergence` appended; a row whose step has no point gets
/// empty cells.
pub fn add_to_eval_csv(csv: &str, points: &[ReplicaPoint]) -> Result<String, ReplicaError> {
    let mut lines = csv.lines();
    let header = lines
        .next()
        .ok_or_else(|| ReplicaError::Csv("the evaluations CSV is empty".into()))?;
    let mut out = format!("{header},{COLUMNS}\n");
    for line in lines.filter(|l| !l.trim().is_empty()) {
        let step = line
            .split(',')
            .nth(1)
            .and_then(|s| s.trim().parse::<u64>().ok())
            .ok_or_else(|| {
                ReplicaError::Csv(format!("evaluations CSV row '{line}' has no step"))
            })?;
        let cells = points
            .iter()
            .find(|p| p.step == step)
            .map_or(",,".to_string(), |p| {
                format!(
                    "{:.5},{:.5},{:e}",
                    p.average_accuracy, p.average_loss, p.divergence
                )
            });
        out.push_str(&format!("{line},{cells}\n"));
    }
    Ok(out)
}

/// Fills the replica statistics into a job summary (as `launch --summary-json` writes it):
/// `worker0.evaluations[i].average_accuracy`, `.average_loss` and `.divergence` for each
/// evaluation with a point of its step, and at the top level `average_accuracy`,
/// `average_loss` and `divergence` of the last point.
pub fn add_to_summary(summary: &mut Value, points: &[ReplicaPoint]) {
    if let Some(evals) = summary
        .pointer_mut("/worker0/evaluations")
        .and_then(Value::as_array_mut)
    {
        for eval in evals.iter_mut() {
            let step = eval.get("step").and_then(Value::as_u64);
            if let Some(p) = points.iter().find(|p| Some(p.step) == step) {
                set_fields(eval, p);
            }
        }
    }
    if let Some(last) = points.last() {
        set_fields(summary, last);
    }
}

fn set_fields(object: &mut Value, p: &ReplicaPoint) {
    if let Some(map) = object.as_object_mut() {
        map.insert("average_accuracy".into(), p.average_accuracy.into());
        map.insert("average_loss".into(), p.average_loss.into());
        map.insert("divergence".into(), p.divergence.into());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn point(step: u64) -> ReplicaPoint {
        ReplicaPoint {
            step,
            average_accuracy: 0.5,
            average_loss: 1.25,
            divergence: 0.0,
        }
    }

    #[test]
    fn csv_rows_gain_their_steps_figures() {
        let csv = "epoch,step,t_s,test_accuracy,test_loss\n1,5,0.1,0.4,2.0\n1,10,0.2,0.5,1.0\n";
        let out = add_to_eval_csv(csv, &[point(10)]).unwrap();
        let lines: Vec<&str> = out.lines().collect();
        assert_eq!(
            lines[0],
            "epoch,step,t_s,test_accuracy,test_loss,average_accuracy,average_loss,divergence"
        );
        assert_eq!(lines[1], "1,5,0.1,0.4,2.0,,,");
        assert_eq!(lines[2], "1,10,0.2,0.5,1.0,0.50000,1.25000,0e0");
        assert!(add_to_eval_csv("h\nx\n", &[]).is_err());
    }

    #[test]
    fn summary_gains_per_evaluation_and_last_figures() {
        let mut json = serde_json::json!({
            "worker0": {"evaluations": [{"step": 5}, {"step": 10}]}
        });
        add_to_summary(&mut json, &[point(5), point(10)]);
        assert_eq!(json["worker0"]["evaluations"][0]["average_accuracy"], 0.5);
        assert_eq!(json["worker0"]["evaluations"][1]["divergence"], 0.0);
        assert_eq!(json["average_loss"], 1.25);
    }
}
