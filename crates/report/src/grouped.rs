//! Grouped bars: one group per category (e.g. a bandwidth), one bar per series (e.g. a
//! strategy) in each, every series in its own, optionally fixed, colour.

use plotters::prelude::*;

use crate::{check_size, colour, draw_category_mesh, framed_chart, render, ChartError, LIMIT};

/// How a bar is drawn.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BarStyle {
    /// A filled bar (a measurement).
    Filled,
    /// An outline only (a reference figure next to a measurement).
    Outline,
    /// A filled bar in a lighter shade of the series' colour: shade `k` (1, 2, ...) is
    /// lighter the larger `k` (down to a quarter of the colour), to tell apart series that
    /// share a colour.
    Shaded(u8),
}

impl BarStyle {
    /// How much of the colour a bar's fill keeps over the white background (1 for a
    /// filled bar; 0 for an outline, which has no fill).
    pub fn opacity(self) -> f64 {
        match self {
            BarStyle::Filled => 1.0,
            BarStyle::Outline => 0.0,
            BarStyle::Shaded(k) => (1.0 - 0.3 * f64::from(k)).max(0.25),
        }
    }
}

/// One series of a [`GroupedBars`] chart: one value per category.
#[derive(Debug, Clone, PartialEq)]
pub struct BarSeries {
    /// Name shown in the legend.
    pub name: String,
    /// One value per category; a negative or non-finite value draws no bar.
    pub values: Vec<f64>,
    /// Palette index of the series' colour; `None`: the series' position in its chart.
    pub colour: Option<usize>,
    /// How the bars are drawn.
    pub style: BarStyle,
}

/// A grouped bar chart: per category, one bar per series side by side, with the legend in a
/// column right of the plot (so it never hides a bar).
#[derive(Debug, Clone, PartialEq)]
pub struct GroupedBars {
    /// Title drawn above the plot.
    pub title: String,
    /// Label of the y axis.
    pub y_label: String,
    /// One group of bars per category, labelled with its name.
    pub categories: Vec<String>,
    /// The series, each with exactly one value per category.
    pub series: Vec<BarSeries>,
    /// Top of the y axis (e.g. 1 for accuracies; taller bars are cut there); `None`: fitted
    /// to the data. The axis starts at 0.
    pub y_max: Option<f64>,
    /// Picture width in pixels.
    pub width: u32,
    /// Picture height in pixels.
    pub height: u32,
}

/// Pixel height of one legend row.
const LEGEND_ROW: i32 = 20;

impl GroupedBars {
    /// Renders the chart as a standalone SVG document.
    pub fn to_svg(&self) -> Result<String, ChartError> {
        check_size(self.width, self.height)?;
        self.check_lengths()?;
        let top = self.top();
        let k = self.series.len().max(1);
        // Integer x units: category i spans [i * slot, (i + 1) * slot), bar j of it
        // [i * slot + 2j + 1, i * slot + 2j + 3]; its label is the key point i * slot + k + 1.
        let slot = 2 * k + 2;
        let n = self.categories.len();
        let mut buf = String::new();
        {
            let root =
                SVGBackend::with_string(&mut buf, (self.width, self.height)).into_drawing_area();
            root.fill(&WHITE).map_err(render)?;
            let legend_width = (self.width / 4).min(220);
            let (plot, legend) = root.split_horizontally(self.width - legend_width);
            let mut chart = framed_chart(&plot, &self.title, 22)
                .build_cartesian_2d(
                    (0..n.max(1) * slot)
                        .with_key_points((0..n).map(|i| i * slot + k + 1).collect()),
                    0.0..top,
                )
                .map_err(render)?;
            let cat_label = |v: &usize| self.categories.get(v / slot).cloned().unwrap_or_default();
            draw_category_mesh(&mut chart, &cat_label, &self.y_label)?;
            for (j, s) in self.series.iter().enumerate() {
                let style = bar_style(s, j);
                let bars: Vec<_> = s
                    .values
                    .iter()
                    .enumerate()
                    .filter(|(_, v)| v.is_finite() && **v >= 0.0 && **v <= LIMIT)
                    .map(|(i, v)| {
                        let x = i * slot + 2 * j + 1;
                        Rectangle::new([(x, 0.0), (x + 2, v.min(top))], style)
                    })
                    .collect();
                chart.draw_series(bars).map_err(render)?;
            }
            drop(chart);
            self.draw_legend(&legend)?;
            root.present().map_err(render)?;
        }
        Ok(buf)
    }

    fn check_lengths(&self) -> Result<(), ChartError> {
        let n = self.categories.len();
        match self.series.iter().find(|s| s.values.len() != n) {
            Some(s) => Err(ChartError::PartLength {
                part: s.name.clone(),
                expected: n,
                got: s.values.len(),
            }),
            None => Ok(()),
        }
    }

    /// Top of the y axis: the fixed one, or the tallest bar plus 10 %, or 1 without bars.
    fn top(&self) -> f64 {
        if let Some(top) = self.y_max.filter(|t| t.is_finite() && *t > 0.0) {
            return top;
        }
        let tallest = self
            .series
            .iter()
            .flat_map(|s| s.values.iter().copied())
            .filter(|v| v.is_finite() && *v <= LIMIT)
            .fold(0.0, f64::max);
        if tallest > 0.0 {
            tallest * 1.1
        } else {
            1.0
        }
    }

    /// One row per series: a swatch in the bar's style and the series' name.
    fn draw_legend<DB: DrawingBackend>(
        &self,
        area: &DrawingArea<DB, plotters::coord::Shift>,
    ) -> Result<(), ChartError> {
        for (j, s) in self.series.iter().enumerate() {
            let y = 48 + LEGEND_ROW * j as i32;
            area.draw(&Rectangle::new([(4, y), (18, y + 12)], bar_style(s, j)))
                .map_err(render)?;
            area.draw(&Text::new(
                s.name.clone(),
                (24, y - 1),
                ("sans-serif", 14).into_font(),
            ))
            .map_err(render)?;
        }
        Ok(())
    }
}

fn bar_style(s: &BarSeries, position: usize) -> ShapeStyle {
    let c = colour(s.colour.unwrap_or(position));
    match s.style {
        BarStyle::Filled => c.filled(),
        BarStyle::Outline => c.stroke_width(2),
        BarStyle::Shaded(_) => c.mix(s.style.opacity()).filled(),
    }
}
