//! The comparative top of a study's report: per model (and worker count), one chart per
//! metric with every variant in it, and the training curves over time with one line per
//! variant. Each variant keeps one colour in every chart of the report.

use std::path::Path;

use anyhow::Result;
use syncopate_report::summary::Evaluation;
use syncopate_report::{
    BarSeries, BarStyle, GroupedBars, HtmlReport, LineChart, LineStyle, Scale, Series, PALETTE_LEN,
};

use crate::config::StudyConfig;
use crate::metrics::mean_finite;
use crate::rows::RunRow;

/// Each variant's palette index, in the order the study file lists the variants (cycling
/// when there are more variants than colours). A label listed twice keeps its first colour.
pub fn variant_colours(config: &StudyConfig) -> Vec<(String, usize)> {
    config
        .variants
        .iter()
        .enumerate()
        .map(|(i, v)| (v.label.clone(), i % PALETTE_LEN))
        .collect()
}

/// The palette index of `label` (`None`: not a variant of the study).
pub fn colour_of(colours: &[(String, usize)], label: &str) -> Option<usize> {
    colours.iter().find(|(l, _)| l == label).map(|&(_, c)| c)
}

/// What every comparative chart of a study shares: each variant's colour, and how many seeds
/// each bar (their mean) or curve (the first) stands for.
pub struct ChartContext {
    /// Each variant's palette index ([`variant_colours`]).
    pub colours: Vec<(String, usize)>,
    /// Seeds of the study.
    pub seeds: usize,
}

impl ChartContext {
    /// The context of `config`'s charts.
    pub fn of(config: &StudyConfig) -> Self {
        Self {
            colours: variant_colours(config),
            seeds: config.seeds.len(),
        }
    }

    /// The palette index of variant `label`.
    fn colour(&self, label: &str) -> Option<usize> {
        colour_of(&self.colours, label)
    }
}

/// The runs of one model and worker count, with their bandwidths and variants in study order.
pub struct Group<'a> {
    /// Heading: the model, and the worker count when the study has several.
    pub title: String,
    rows: Vec<&'a RunRow>,
    bandwidths: Vec<String>,
    variants: Vec<String>,
}

/// The groups of `rows`: models in study order, then worker counts.
pub fn groups<'a>(config: &StudyConfig, rows: &'a [RunRow]) -> Vec<Group<'a>> {
    let mut out = Vec::new();
    for model in &config.models {
        for &workers in &config.workers {
            let of: Vec<&RunRow> = rows
                .iter()
                .filter(|r| r.model == model.display_name() && r.workers == workers)
                .collect();
            if of.is_empty() {
                continue;
            }
            let title = if config.workers.len() > 1 {
                format!("{}, {workers} workers", model.display_name())
            } else {
                model.display_name().to_string()
            };
            out.push(Group {
                title,
                bandwidths: firsts(of.iter().map(|r| r.bandwidth.as_str())),
                variants: config
                    .variants
                    .iter()
                    .map(|v| v.label.clone())
                    .filter(|l| of.iter().any(|r| &r.variant == l))
                    .collect(),
                rows: of,
            });
        }
    }
    out
}

/// The distinct values in order of first appearance.
fn firsts<'a>(values: impl Iterator<Item = &'a str>) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    for v in values {
        if !out.iter().any(|o| o == v) {
            out.push(v.to_string());
        }
    }
    out
}

impl Group<'_> {
    /// Per bandwidth, the mean over seeds of `value` of `variant`'s runs (NaN: none has it).
    fn cells(&self, variant: &str, value: fn(&RunRow) -> f64) -> Vec<f64> {
        self.bandwidths
            .iter()
            .map(|bw| {
                mean_finite(
                    self.rows
                        .iter()
                        .filter(|r| r.variant == variant && &r.bandwidth == bw)
                        .map(|r| value(r)),
                )
            })
            .collect()
    }

    /// The first run (first seed) of `variant` at `bandwidth`.
    fn first_run(&self, variant: &str, bandwidth: &str) -> Option<&RunRow> {
        self.rows
            .iter()
            .find(|r| r.variant == variant && r.bandwidth == bandwidth)
            .copied()
    }
}

/// The y label of divergence charts: what the figure is.
const DIVERGENCE: &str = "mean over workers of |x_i - mean|² / |mean|²";

/// A figure of a run.
pub type Value = fn(&RunRow) -> f64;

/// One metric compared across variants.
pub struct Metric {
    /// What is measured (the chart's title after the group's).
    pub name: &'static str,
    /// Label of the y axis.
    pub y_label: &'static str,
    /// The value of a run.
    pub value: fn(&RunRow) -> f64,
    /// A reference figure drawn as an outlined bar next to each variant's: its name and value.
    pub reference: Option<(&'static str, Value)>,
    /// A fraction: the axis is fixed to [0, 1].
    pub fraction: bool,
}

/// The metrics compared, in report order; a metric no run has is left out.
pub fn metrics() -> Vec<Metric> {
    let m = |name, y_label, value: fn(&RunRow) -> f64| Metric {
        name,
        y_label,
        value,
        reference: None,
        fraction: false,
    };
    let fraction = |name, value| Metric {
        fraction: true,
        ..m(name, "test accuracy", value)
    };
    vec![
        m("throughput vs bandwidth", "samples/s (all workers)", |r| {
            r.samples_per_sec
        }),
        m("step time", "seconds per step", |r| r.step_seconds),
        m("compute per step (worker 0)", "seconds per step", |r| {
            r.compute_per_step
        }),
        m(
            "waiting on communication per step (worker 0)",
            "seconds per step",
            |r| r.wait_per_step,
        ),
        m(
            "per-tensor completion time, p99 (worker 0)",
            "seconds from hand-over to values back",
            |r| r.tensor_p99_s,
        ),
        m("training time", "seconds of training", |r| {
            r.time_to_accuracy
        }),
        fraction("final accuracy of worker 0", |r| r.test_accuracy),
        fraction("final accuracy of the replicas' average", |r| {
            r.average_accuracy
        }),
        m("replica divergence", DIVERGENCE, |r| r.divergence),
        Metric {
            reference: Some(("textbook", |r| r.textbook_bytes_per_step / 1e6)),
            ..m("MB sent per step per worker", "MB per step", |r| {
                r.bytes_per_step / 1e6
            })
        },
        m("mean CPU per worker", "% of one core", |r| {
            r.mean_cpu_percent
        }),
        m("peak memory (RSS) per worker", "MB", |r| {
            r.peak_rss_bytes / 1e6
        }),
        m("MB sent on the links per worker", "MB", |r| {
            r.net_bytes / 1e6
        }),
        m("disk read + written per worker", "MB", |r| {
            r.disk_bytes / 1e6
        }),
    ]
}

/// The chart's title: group, metric, target (time to accuracy) and how seeds are combined.
fn metric_title(group: &Group, m: &Metric, seeds: usize) -> String {
    let mut title = format!("{}: {}", group.title, m.name);
    if m.name == "training time" {
        let target = group
            .rows
            .iter()
            .map(|r| r.target_accuracy)
            .find(|t| t.is_finite())
            .unwrap_or(f64::NAN);
        title.push_str(&format!(
            " to {:.1} % test accuracy (no bar: not reached)",
            target * 100.0
        ));
    }
    if seeds > 1 {
        title.push_str(&format!(" (mean of {seeds} seeds)"));
    }
    title
}

/// The bars of `m`, one series per variant (and its reference); `None` when no run has it.
pub fn metric_chart(group: &Group, m: &Metric, context: &ChartContext) -> Option<GroupedBars> {
    let mut series = Vec::new();
    for v in &group.variants {
        let colour = context.colour(v);
        let values = group.cells(v, m.value);
        series.push(BarSeries {
            name: if values.iter().any(|v| v.is_finite()) {
                v.clone()
            } else {
                format!("{v} (not recorded)")
            },
            values,
            colour,
            style: BarStyle::Filled,
        });
        if let Some((what, value)) = m.reference {
            series.push(BarSeries {
                name: format!("{v} ({what})"),
                values: group.cells(v, value),
                colour,
                style: BarStyle::Outline,
            });
        }
    }
    let any = |s: &BarSeries| s.values.iter().any(|v| v.is_finite());
    if !series.iter().any(any) {
        return None;
    }
    series.retain(|s| s.style == BarStyle::Filled || any(s));
    Some(GroupedBars {
        title: metric_title(group, m, context.seeds),
        y_label: m.y_label.into(),
        categories: group.bandwidths.clone(),
        series,
        y_max: m.fraction.then_some(1.0),
        width: 820.max(40 * (group.variants.len() * group.bandwidths.len()) as u32 + 300),
        height: 420,
    })
}

/// A curve over training time of a run: a column of an evaluation or the loss of
/// `steps-rank0.csv`.
#[derive(Clone, Copy)]
enum Curve {
    Loss,
    Eval(fn(&Evaluation) -> f64),
}

/// The curves over time: name, y label, fixed [0, 1] axis, where the points come from.
fn curves() -> [(&'static str, &'static str, bool, Curve); 4] {
    [
        (
            "accuracy of worker 0",
            "test accuracy",
            true,
            Curve::Eval(|e| e.accuracy),
        ),
        (
            "accuracy of the replicas' average",
            "test accuracy",
            true,
            Curve::Eval(|e| e.average_accuracy.unwrap_or(f64::NAN)),
        ),
        (
            "replica divergence",
            DIVERGENCE,
            false,
            Curve::Eval(|e| e.divergence.unwrap_or(f64::NAN)),
        ),
        ("training loss", "loss (worker 0)", false, Curve::Loss),
    ]
}

fn curve_points(dir: &Path, run: &RunRow, curve: Curve) -> Vec<(f64, f64)> {
    match curve {
        Curve::Loss => csv_points(
            &dir.join("runs").join(&run.id).join("steps-rank0.csv"),
            1,
            3,
        ),
        Curve::Eval(f) => run
            .evaluations
            .iter()
            .map(|e| (e.seconds, f(e)))
            .filter(|p| p.1.is_finite())
            .collect(),
    }
}

/// Per bandwidth, each curve against training time with one line per variant (its first
/// seed); curves no run has are left out.
pub fn time_charts(dir: &Path, group: &Group, context: &ChartContext) -> Vec<LineChart> {
    let note = if context.seeds > 1 {
        " (first seed)"
    } else {
        ""
    };
    let mut charts = Vec::new();
    for bw in &group.bandwidths {
        for (what, y_label, fraction, curve) in curves() {
            let series: Vec<Series> = group
                .variants
                .iter()
                .filter_map(|v| group.first_run(v, bw))
                .map(|r| Series {
                    name: r.variant.clone(),
                    points: curve_points(dir, r, curve),
                    style: LineStyle::Solid,
                    colour: context.colour(&r.variant),
                })
                .filter(|s| !s.points.is_empty())
                .collect();
            if series.is_empty() {
                continue;
            }
            charts.push(LineChart {
                title: format!("{} @ {bw}: {what} vs wall time{note}", group.title),
                x_label: "seconds of training".into(),
                y_label: y_label.into(),
                x_scale: Scale::Linear,
                y_scale: if fraction { Scale::Unit } else { Scale::Linear },
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

/// Throughput against bandwidth (log axis) per variant next to the ideal bound, for groups
/// whose model has one (profile models); `None` otherwise.
pub fn ideal_chart(group: &Group, context: &ChartContext) -> Option<LineChart> {
    let gbps = |bw: &String| {
        group
            .rows
            .iter()
            .find(|r| &r.bandwidth == bw)
            .map_or(f64::NAN, |r| r.bandwidth_gbps)
    };
    let xs: Vec<f64> = group.bandwidths.iter().map(gbps).collect();
    let line = |values: Vec<f64>| xs.iter().copied().zip(values).collect::<Vec<_>>();
    let ideal: Vec<(f64, f64)> = line(mean_per_bandwidth(group, |r| r.ideal_samples_per_sec))
        .into_iter()
        .filter(|p| p.0.is_finite() && p.1.is_finite())
        .collect();
    if ideal.is_empty() {
        return None;
    }
    let mut series: Vec<Series> = group
        .variants
        .iter()
        .map(|v| Series {
            name: v.clone(),
            points: line(group.cells(v, |r| r.samples_per_sec)),
            style: LineStyle::Solid,
            colour: context.colour(v),
        })
        .collect();
    series.push(Series {
        name: "ideal max(compute, comm)".into(),
        points: ideal,
        style: LineStyle::Dashed,
        // Past the variants' colours.
        colour: Some(context.colours.len()),
    });
    let note = if context.seeds > 1 {
        " (mean of seeds)"
    } else {
        ""
    };
    Some(LineChart {
        title: format!(
            "{}: throughput vs bandwidth and the ideal bound{note}",
            group.title
        ),
        x_label: "bandwidth per worker, Gbit/s (full-size model)".into(),
        y_label: "samples/s (all workers)".into(),
        x_scale: Scale::Log,
        y_scale: Scale::Linear,
        series,
        width: 820,
        height: 480,
    })
}

/// Per bandwidth, the mean of `value` over every run of the group.
fn mean_per_bandwidth(group: &Group, value: fn(&RunRow) -> f64) -> Vec<f64> {
    group
        .bandwidths
        .iter()
        .map(|bw| {
            mean_finite(
                group
                    .rows
                    .iter()
                    .filter(|r| &r.bandwidth == bw)
                    .map(|r| value(r)),
            )
        })
        .collect()
}

/// Every comparative chart of the study, group by group, under a heading each.
pub fn comparative_section(
    html: &mut HtmlReport,
    config: &StudyConfig,
    dir: &Path,
    rows: &[RunRow],
) -> Result<()> {
    let context = ChartContext::of(config);
    for group in groups(config, rows) {
        html.heading(&group.title);
        if let Some(chart) = ideal_chart(&group, &context) {
            html.svg(&chart.to_svg()?);
        }
        for m in metrics() {
            if let Some(chart) = metric_chart(&group, &m, &context) {
                html.svg(&chart.to_svg()?);
            }
        }
        for chart in time_charts(dir, &group, &context) {
            html.svg(&chart.to_svg()?);
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn study(labels: &[&str]) -> StudyConfig {
        let variants: String = labels
            .iter()
            .map(|l| format!("[[variants]]\nlabel = \"{l}\"\nstrategy = \"ps\"\n"))
            .collect();
        toml::from_str(&format!(
            "name = \"t\"\nsteps = 2\nbandwidths = [\"1gbit\", \"10gbit\"]\n\
             [[models]]\nname = \"lenet\"\n{variants}"
        ))
        .unwrap()
    }

    #[test]
    fn colours_follow_the_study_file_and_cycle() {
        let labels: Vec<String> = (0..PALETTE_LEN + 2).map(|i| format!("v{i}")).collect();
        let refs: Vec<&str> = labels.iter().map(String::as_str).collect();
        let colours = variant_colours(&study(&refs));
        for (i, (label, c)) in colours.iter().enumerate() {
            assert_eq!((label.as_str(), *c), (refs[i], i % PALETTE_LEN));
        }
        assert_eq!(colour_of(&colours, "v1"), Some(1));
        assert_eq!(colour_of(&colours, &format!("v{PALETTE_LEN}")), Some(0));
        assert_eq!(colour_of(&colours, "nope"), None);
        // The study file's order decides, not the labels.
        let swapped = variant_colours(&study(&["b", "a"]));
        assert_eq!(colour_of(&swapped, "b"), Some(0));
        assert_eq!(colour_of(&swapped, "a"), Some(1));
    }

    fn row(variant: &str, bandwidth: &str, seed: u64, value: f64) -> RunRow {
        RunRow {
            variant: variant.into(),
            bandwidth: bandwidth.into(),
            seed,
            samples_per_sec: value,
            test_accuracy: value / 1000.0,
            ..RunRow::empty("lenet", 2)
        }
    }

    #[test]
    fn a_variant_has_the_same_colour_in_every_chart() {
        let config = study(&["ps", "p3"]);
        let context = ChartContext::of(&config);
        // Rows listed in an order that differs from the study file's; p3 lacks one bandwidth.
        let rows = vec![
            row("p3", "10gbit", 42, 300.0),
            row("ps", "1gbit", 42, 100.0),
            row("ps", "10gbit", 42, 200.0),
        ];
        let groups = groups(&config, &rows);
        assert_eq!(groups.len(), 1);
        let g = &groups[0];
        assert_eq!(g.variants, ["ps", "p3"]);
        for m in metrics() {
            let Some(chart) = metric_chart(g, &m, &context) else {
                continue;
            };
            let by_name: Vec<(&str, Option<usize>)> = chart
                .series
                .iter()
                .map(|s| (s.name.as_str(), s.colour))
                .collect();
            assert_eq!(by_name, [("ps", Some(0)), ("p3", Some(1))], "{}", m.name);
            assert_eq!(chart.y_max, m.fraction.then_some(1.0));
        }
        let tput = metric_chart(g, &metrics()[0], &context).unwrap();
        assert_eq!(tput.categories, ["10gbit", "1gbit"]);
        assert_eq!(tput.series[0].values, [200.0, 100.0]);
        assert!(tput.series[1].values[1].is_nan(), "no run: no bar");
    }

    #[test]
    fn seeds_are_averaged() {
        let config = study(&["ps"]);
        let rows = vec![
            row("ps", "1gbit", 1, 100.0),
            row("ps", "1gbit", 2, 300.0),
            row("ps", "1gbit", 3, f64::NAN),
        ];
        let groups = groups(&config, &rows);
        let context = ChartContext {
            seeds: 3,
            ..ChartContext::of(&config)
        };
        let chart = metric_chart(&groups[0], &metrics()[0], &context).unwrap();
        assert_eq!(chart.series[0].values, [200.0]);
        assert!(chart.title.contains("mean of 3 seeds"), "{}", chart.title);
    }
}
