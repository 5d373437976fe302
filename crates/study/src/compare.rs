//! The comparative top of a study's report: per model (and worker count), one chart per
//! metric with every variant in it, and the training curves over time with one line per
//! variant. Each variant keeps one colour in every chart of the report.

use syncopate_report::{BarSeries, BarStyle, GroupedBars, LineChart, LineStyle, Scale, Series};

use crate::config::StudyConfig;
use crate::metrics::mean_finite;
use crate::rows::RunRow;
use crate::styles::Styles;

/// What every comparative chart of a study shares: each variant's style, and how many seeds
/// each bar (their mean) or curve (the first) stands for.
pub struct ChartContext {
    /// Each variant's colour, line and bar style ([`Styles`]).
    pub styles: Styles,
    /// Seeds of the study.
    pub seeds: usize,
}

impl ChartContext {
    /// The context of `config`'s charts.
    pub fn of(config: &StudyConfig) -> Self {
        Self {
            styles: Styles::of(config),
            seeds: config.seeds.len(),
        }
    }

    /// A line of variant `label` through `points`, in its colour and line style.
    pub fn series(&self, label: &str, points: Vec<(f64, f64)>) -> Series {
        Series {
            name: label.to_string(),
            points,
            style: self.styles.line(label),
            colour: self.styles.colour(label),
        }
    }
}

/// The runs of one model and worker count, with their networks and variants in study order.
pub struct Group<'a> {
    /// Heading: the model, and the worker count when the study has several.
    pub title: String,
    /// The runs.
    pub rows: Vec<&'a RunRow>,
    /// The networks the runs have, in order of first appearance.
    pub networks: Vec<String>,
    /// The variants the runs have, in study order.
    pub variants: Vec<String>,
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
                networks: firsts(of.iter().map(|r| r.network.as_str())),
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
    /// Per network, the mean over seeds of `value` of `variant`'s runs (NaN: none has it).
    fn cells(&self, variant: &str, value: fn(&RunRow) -> f64) -> Vec<f64> {
        self.networks
            .iter()
            .map(|net| {
                mean_finite(
                    self.rows
                        .iter()
                        .filter(|r| r.variant == variant && &r.network == net)
                        .map(|r| value(r)),
                )
            })
            .collect()
    }

    /// The first run (first seed) of `variant` on `network`.
    pub fn first_run(&self, variant: &str, network: &str) -> Option<&RunRow> {
        self.rows
            .iter()
            .find(|r| r.variant == variant && r.network == network)
            .copied()
    }
}

/// The y label of divergence charts: what the figure is.
pub const DIVERGENCE: &str = "mean over workers of |x_i - mean|² / |mean|²";

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
        m("MB sent per worker to the target", "MB per worker", |r| {
            r.bytes_to_accuracy / 1e6
        }),
        Metric {
            fraction: true,
            ..m(
                "compute utilisation (worker 0)",
                "compute seconds / wall seconds",
                |r| r.compute_utilisation,
            )
        },
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
    if m.name == "training time" || m.name.ends_with("to the target") {
        let target = group
            .rows
            .iter()
            .map(|r| r.target_accuracy)
            .find(|t| t.is_finite())
            .unwrap_or(f64::NAN);
        let to = if m.name == "training time" {
            " to"
        } else {
            ","
        };
        title.push_str(&format!(
            "{to} {:.1} % test accuracy (no bar: not reached)",
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
        let colour = context.styles.colour(v);
        let values = group.cells(v, m.value);
        series.push(BarSeries {
            name: if values.iter().any(|v| v.is_finite()) {
                v.clone()
            } else {
                format!("{v} (not recorded)")
            },
            values,
            colour,
            style: context.styles.bar(v),
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
    series.retain(|s| s.style != BarStyle::Outline || any(s));
    Some(GroupedBars {
        title: metric_title(group, m, context.seeds),
        y_label: m.y_label.into(),
        categories: group.networks.clone(),
        series,
        y_max: m.fraction.then_some(1.0),
        width: 820.max(40 * (group.variants.len() * group.networks.len()) as u32 + 300),
        height: 420,
    })
}

/// Throughput against bandwidth (log axis) per variant next to the ideal bound, for groups
/// whose model has one (profile models); `None` otherwise.
pub fn ideal_chart(group: &Group, context: &ChartContext) -> Option<LineChart> {
    let gbps = |net: &String| {
        group
            .rows
            .iter()
            .find(|r| &r.network == net)
            .map_or(f64::NAN, |r| r.bandwidth_gbps)
    };
    let xs: Vec<f64> = group.networks.iter().map(gbps).collect();
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
        .map(|v| context.series(v, line(group.cells(v, |r| r.samples_per_sec))))
        .collect();
    series.push(Series {
        name: "ideal max(compute, comm)".into(),
        points: ideal,
        style: LineStyle::Dashed,
        colour: Some(context.styles.spare_colour()),
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

/// Per network, the mean of `value` over every run of the group.
fn mean_per_bandwidth(group: &Group, value: fn(&RunRow) -> f64) -> Vec<f64> {
    group
        .networks
        .iter()
        .map(|net| {
            mean_finite(
                group
                    .rows
                    .iter()
                    .filter(|r| &r.network == net)
                    .map(|r| value(r)),
            )
        })
        .collect()
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

    fn row(variant: &str, network: &str, seed: u64, value: f64) -> RunRow {
        RunRow {
            variant: variant.into(),
            network: network.into(),
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
            let by_name: Vec<(&str, Option<usize>, BarStyle)> = chart
                .series
                .iter()
                .map(|s| (s.name.as_str(), s.colour, s.style))
                .collect();
            // Both variants are of the parameter server's technique: its colour, the second
            // a lighter shade of it.
            assert_eq!(
                by_name,
                [
                    ("ps", Some(8), BarStyle::Filled),
                    ("p3", Some(8), BarStyle::Shaded(1))
                ],
                "{}",
                m.name
            );
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
