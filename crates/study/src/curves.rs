//! The curves of a study's report, one panel per model, network and worker count: the
//! accuracy of worker 0 and of the replicas' average against training time and against the
//! bytes a worker had sent (log axis), the replicas' divergence and the training loss
//! against time; one line per variant (its first seed), in its technique's colour and its
//! own dash.

use std::path::Path;

use syncopate_report::{LineChart, Scale};
use syncopate_runtime::worker::EvalPoint;

use crate::compare::{ChartContext, Group, DIVERGENCE};
use crate::rows::RunRow;

/// What a curve's points are read from: a figure of each evaluation, or the loss of
/// `steps-rank0.csv`.
#[derive(Clone, Copy)]
enum Curve {
    Loss,
    Eval(fn(&EvalPoint) -> f64),
}

/// What a curve runs against.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Against {
    /// Seconds of training (evaluations excluded).
    Time,
    /// Megabytes a worker had sent (mean over workers), log axis.
    Bytes,
}

/// One kind of curve: its name, y label, whether it is a fraction (axis fixed to [0, 1]),
/// where its points come from and what it runs against.
struct CurveKind {
    what: &'static str,
    y_label: &'static str,
    fraction: bool,
    curve: Curve,
    against: Against,
}

/// The curves of a panel, in report order.
fn curve_kinds() -> Vec<CurveKind> {
    let accuracy = |what, curve, against| CurveKind {
        what,
        y_label: "test accuracy",
        fraction: true,
        curve,
        against,
    };
    let worker0 = Curve::Eval(|e| e.accuracy);
    let average = Curve::Eval(|e| e.average_accuracy.unwrap_or(f64::NAN));
    vec![
        accuracy("accuracy of worker 0", worker0, Against::Time),
        accuracy("accuracy of worker 0", worker0, Against::Bytes),
        accuracy("accuracy of the replicas' average", average, Against::Time),
        accuracy("accuracy of the replicas' average", average, Against::Bytes),
        CurveKind {
            what: "replica divergence",
            y_label: DIVERGENCE,
            fraction: false,
            curve: Curve::Eval(|e| e.divergence.unwrap_or(f64::NAN)),
            against: Against::Time,
        },
        CurveKind {
            what: "training loss",
            y_label: "loss (worker 0)",
            fraction: false,
            curve: Curve::Loss,
            against: Against::Time,
        },
    ]
}

/// The points of one run's curve.
fn curve_points(dir: &Path, run: &RunRow, curve: Curve, against: Against) -> Vec<(f64, f64)> {
    match (curve, against) {
        (Curve::Loss, _) => csv_points(
            &dir.join("runs").join(&run.id).join("steps-rank0.csv"),
            1,
            3,
        ),
        (Curve::Eval(f), Against::Time) => run
            .evaluations
            .iter()
            .map(|e| (e.seconds, f(e)))
            .filter(|p| p.1.is_finite())
            .collect(),
        (Curve::Eval(f), Against::Bytes) => run
            .evaluations
            .iter()
            .zip(&run.evaluation_bytes)
            .map(|(e, bytes)| (bytes / 1e6, f(e)))
            .filter(|p| p.0.is_finite() && p.1.is_finite())
            .collect(),
    }
}

/// Per network, every curve with one line per variant (its first seed); curves no run has
/// are left out.
pub fn curve_charts(dir: &Path, group: &Group, context: &ChartContext) -> Vec<LineChart> {
    let note = if context.seeds > 1 {
        " (first seed)"
    } else {
        ""
    };
    let mut charts = Vec::new();
    for network in &group.networks {
        for kind in curve_kinds() {
            let series: Vec<_> = group
                .variants
                .iter()
                .filter_map(|v| group.first_run(v, network))
                .map(|r| context.series(&r.variant, curve_points(dir, r, kind.curve, kind.against)))
                .filter(|s| !s.points.is_empty())
                .collect();
            if series.is_empty() {
                continue;
            }
            let (against, x_label, x_scale) = match kind.against {
                Against::Time => ("wall time", "seconds of training", Scale::Linear),
                Against::Bytes => (
                    "MB sent per worker",
                    "MB a worker had sent (mean over workers)",
                    Scale::Log,
                ),
            };
            charts.push(LineChart {
                title: format!(
                    "{} @ {network}: {} vs {against}{note}",
                    group.title, kind.what
                ),
                x_label: x_label.into(),
                y_label: kind.y_label.into(),
                x_scale,
                y_scale: if kind.fraction {
                    Scale::Unit
                } else {
                    Scale::Linear
                },
                series,
                width: 820,
                height: 420,
            });
        }
    }
    charts
}

/// `(x, y)` columns of a CSV file, rows with non-finite values left out.
fn csv_points(path: &Path, x: usize, y: usize) -> Vec<(f64, f64)> {
    let Ok(text) = std::fs::read_to_string(path) else {
        return Vec::new();
    };
    text.lines()
        .skip(1)
        .filter_map(|l| {
            let v: Vec<f64> = l
                .split(',')
                .map(|c| c.parse().unwrap_or(f64::NAN))
                .collect();
            Some((*v.get(x)?, *v.get(y)?))
        })
        .filter(|(a, b)| a.is_finite() && b.is_finite())
        .collect()
}
