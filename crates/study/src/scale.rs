//! The comparative part of a simulated study's report (`kind = "simulate"`): per model and
//! network, the step time, the bytes each worker sends per step and the compute utilisation
//! against the number of workers (log axis), one line per variant in its technique's colour.

use syncopate_report::{HtmlReport, LineChart, Scale};

use crate::compare::ChartContext;
use crate::config::StudyConfig;
use crate::metrics::mean_finite;
use crate::rows::RunRow;

/// A figure against the number of workers: its name, y label, y scale and value.
type Figure = (&'static str, &'static str, Scale, fn(&RunRow) -> f64);

/// The figures charted against the number of workers.
const FIGURES: [Figure; 3] = [
    (
        "step time",
        "seconds per step (virtual time)",
        Scale::Log,
        |r| r.step_seconds,
    ),
    (
        "bytes sent per worker per step",
        "MB per worker per step",
        Scale::Log,
        |r| r.bytes_per_step / 1e6,
    ),
    (
        "compute utilisation",
        "compute seconds / step seconds",
        Scale::Unit,
        |r| r.compute_utilisation,
    ),
];

/// Per variant, `(workers, mean over seeds of value)` of `rows`, workers ascending.
fn points(rows: &[&RunRow], variant: &str, value: fn(&RunRow) -> f64) -> Vec<(f64, f64)> {
    let mut workers: Vec<usize> = rows
        .iter()
        .filter(|r| r.variant == variant)
        .map(|r| r.workers)
        .collect();
    workers.sort_unstable();
    workers.dedup();
    workers
        .into_iter()
        .map(|n| {
            let of_n = rows
                .iter()
                .filter(|r| r.variant == variant && r.workers == n)
                .map(|r| value(r));
            (n as f64, mean_finite(of_n))
        })
        .collect()
}

/// The charts of the runs of one model on one network.
pub fn scale_charts(
    title: &str,
    rows: &[&RunRow],
    variants: &[String],
    context: &ChartContext,
) -> Vec<LineChart> {
    FIGURES
        .iter()
        .filter_map(|&(what, y_label, y_scale, value)| {
            let series: Vec<_> = variants
                .iter()
                .map(|v| context.series(v, points(rows, v, value)))
                .filter(|s| s.points.iter().any(|p| p.1.is_finite()))
                .collect();
            (!series.is_empty()).then(|| LineChart {
                title: format!("{title}: {what} vs workers"),
                x_label: "workers".into(),
                y_label: y_label.into(),
                x_scale: Scale::Log,
                y_scale,
                series,
                width: 820,
                height: 460,
            })
        })
        .collect()
}

/// Every scale chart of the study, model by model and network by network.
pub fn scale_section(
    html: &mut HtmlReport,
    config: &StudyConfig,
    rows: &[RunRow],
) -> anyhow::Result<()> {
    let context = ChartContext::of(config);
    let variants: Vec<String> = config.variants.iter().map(|v| v.label.clone()).collect();
    for model in &config.models {
        for network in config.networks_of(model) {
            let name = network.display_name();
            let of: Vec<&RunRow> = rows
                .iter()
                .filter(|r| r.model == model.display_name() && r.network == name)
                .collect();
            if of.is_empty() {
                continue;
            }
            let title = format!("{} @ {name}", model.display_name());
            html.heading(&title);
            for chart in scale_charts(&title, &of, &variants, &context) {
                html.svg(&chart.to_svg()?);
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(variant: &str, workers: usize, step: f64, bytes: f64) -> RunRow {
        RunRow {
            variant: variant.into(),
            network: "1gbit".into(),
            step_seconds: step,
            bytes_per_step: bytes,
            ..RunRow::empty("resnet50", workers)
        }
    }

    #[test]
    fn one_line_per_variant_against_workers_in_its_style() {
        let config: StudyConfig = toml::from_str(
            "name = \"s\"\nkind = \"simulate\"\nsteps = 2\nbandwidths = [\"1gbit\"]\n\
             [[models]]\nname = \"profile:resnet50\"\n\
             [[variants]]\nlabel = \"allreduce\"\nstrategy = \"allreduce\"\n\
             [[variants]]\nlabel = \"stepwise\"\nstrategy = \"stepwise\"\n\
             [[variants]]\nlabel = \"stepwise /4\"\nstrategy = \"stepwise\"\n",
        )
        .unwrap();
        let rows = [
            row("stepwise", 64, 2.0, 1e6),
            row("stepwise", 4, 1.0, 2e6),
            row("allreduce", 4, 1.5, 4e6),
        ];
        let refs: Vec<&RunRow> = rows.iter().collect();
        let variants: Vec<String> = config.variants.iter().map(|v| v.label.clone()).collect();
        let charts = scale_charts("m", &refs, &variants, &ChartContext::of(&config));
        assert_eq!(charts.len(), 2, "no run has a compute utilisation");
        let step = &charts[0];
        assert_eq!(step.title, "m: step time vs workers");
        assert_eq!(step.x_scale, Scale::Log);
        let names: Vec<&str> = step.series.iter().map(|s| s.name.as_str()).collect();
        assert_eq!(
            names,
            ["allreduce", "stepwise"],
            "a variant without runs is left out"
        );
        assert_eq!(step.series[1].points, [(4.0, 1.0), (64.0, 2.0)]);
        assert_eq!(charts[1].series[0].points, [(4.0, 4.0)]);
        assert_ne!(step.series[0].colour, step.series[1].colour);
        step.to_svg().unwrap();
    }
}
