//! Reports for Syncopate: SVG charts drawn with `plotters` (SVG backend only, so no fonts or
//! system libraries are needed: text is written as SVG `<text>` elements) and a small
//! self-contained HTML page builder to put them in; and [`summary`], the typed run summary a
//! distributed job writes and a study's report reads.
//!
//! Charts never panic on awkward data: non-finite values, magnitudes beyond 1e300 and, on a
//! log axis, non-positive values are skipped, and empty, single-point or constant data still gives a valid SVG.
#![warn(missing_docs)]

mod grouped;
mod html;
pub mod summary;

pub use grouped::{BarSeries, BarStyle, GroupedBars};
pub use html::HtmlReport;

use plotters::coord::combinators::WithKeyPoints;
use plotters::coord::ranged1d::ValueFormatter;
use plotters::coord::types::{RangedCoordf64, RangedCoordusize};
use plotters::element::IntoDynElement;
use plotters::prelude::*;

/// The smallest chart width and height, in pixels, that [`LineChart::to_svg`] and
/// [`StackedBars::to_svg`] accept (smaller leaves no room for the plot).
pub const MIN_SIZE: u32 = 120;

/// The largest chart width and height, in pixels, that the charts accept (pixel coordinates
/// must stay far from `i32` overflow).
pub const MAX_SIZE: u32 = 20_000;

/// Ten distinct colours (Tableau 10); series and parts cycle through them.
const PALETTE: [RGBColor; 10] = [
    RGBColor(78, 121, 167),
    RGBColor(242, 142, 43),
    RGBColor(225, 87, 89),
    RGBColor(118, 183, 178),
    RGBColor(89, 161, 79),
    RGBColor(237, 201, 72),
    RGBColor(176, 122, 161),
    RGBColor(255, 157, 167),
    RGBColor(156, 117, 95),
    RGBColor(186, 176, 172),
];

/// Number of distinct colours; a colour index cycles through them (index modulo this).
pub const PALETTE_LEN: usize = PALETTE.len();

fn colour(i: usize) -> RGBColor {
    PALETTE[i % PALETTE.len()]
}

/// The colour of palette index `i` as `#RRGGBB` (as the SVGs write it), e.g. for a legend
/// outside the charts.
pub fn colour_hex(i: usize) -> String {
    let c = colour(i);
    format!("#{:02X}{:02X}{:02X}", c.0, c.1, c.2)
}

/// Why a chart could not be rendered.
#[derive(Debug, thiserror::Error)]
pub enum ChartError {
    /// The requested width or height is outside [`MIN_SIZE`]..=[`MAX_SIZE`].
    #[error("chart size {width}x{height} is outside {MIN_SIZE}..={MAX_SIZE} pixels per side")]
    InvalidSize {
        /// Requested width in pixels.
        width: u32,
        /// Requested height in pixels.
        height: u32,
    },
    /// A stacked-bar part does not have exactly one value per category.
    #[error("stacked bars: part `{part}` has {got} values but there are {expected} categories")]
    PartLength {
        /// Name of the offending part.
        part: String,
        /// Number of categories.
        expected: usize,
        /// Number of values the part has.
        got: usize,
    },
    /// `plotters` reported a drawing failure.
    #[error("plotters could not draw the chart: {0}")]
    Render(String),
}

fn render<E: std::fmt::Display>(e: E) -> ChartError {
    ChartError::Render(e.to_string())
}

/// How a series is drawn.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LineStyle {
    /// A solid line through the points.
    Solid,
    /// A dashed line, e.g. for an ideal bound.
    Dashed,
    /// Markers only, no line.
    Points,
    /// A dotted line.
    Dotted,
    /// A line of long dashes.
    LongDashed,
    /// A solid line with a marker on every point.
    SolidMarked,
    /// A dashed line with a marker on every point.
    DashedMarked,
}

impl LineStyle {
    /// The styles that tell lines of one colour apart, in the order they are handed out
    /// (cycling past the end).
    pub const DISTINCT: [LineStyle; 6] = [
        LineStyle::Solid,
        LineStyle::Dashed,
        LineStyle::Dotted,
        LineStyle::LongDashed,
        LineStyle::SolidMarked,
        LineStyle::DashedMarked,
    ];

    /// Dash and gap lengths in pixels of a broken line (`None`: a solid line or no line).
    pub fn dash_pattern(self) -> Option<(u32, u32)> {
        match self {
            LineStyle::Dashed | LineStyle::DashedMarked => Some((8, 5)),
            LineStyle::Dotted => Some((2, 4)),
            LineStyle::LongDashed => Some((16, 6)),
            LineStyle::Solid | LineStyle::SolidMarked | LineStyle::Points => None,
        }
    }

    /// Whether every point carries a marker.
    pub fn marks_points(self) -> bool {
        matches!(
            self,
            LineStyle::Points | LineStyle::SolidMarked | LineStyle::DashedMarked
        )
    }
}

/// Axis scale.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scale {
    /// Linear axis.
    Linear,
    /// Base-10 logarithmic axis; non-positive values are skipped.
    Log,
    /// Linear axis fixed to [0, 1] (accuracies and other fractions); values outside are
    /// skipped.
    Unit,
}

/// One line on a chart.
#[derive(Debug, Clone, PartialEq)]
pub struct Series {
    /// Name shown in the legend.
    pub name: String,
    /// `(x, y)` points, drawn in order; unusable points break the line.
    pub points: Vec<(f64, f64)>,
    /// How the series is drawn.
    pub style: LineStyle,
    /// Palette index of the series' colour (cycling past [`PALETTE_LEN`]); `None`: the
    /// series' position in its chart. A fixed index keeps a series' colour the same across
    /// charts.
    pub colour: Option<usize>,
}

/// A line chart: several series against one x axis.
#[derive(Debug, Clone, PartialEq)]
pub struct LineChart {
    /// Title drawn above the plot.
    pub title: String,
    /// Label of the x axis.
    pub x_label: String,
    /// Label of the y axis.
    pub y_label: String,
    /// Scale of the x axis.
    pub x_scale: Scale,
    /// Scale of the y axis.
    pub y_scale: Scale,
    /// The series, each in its own colour.
    pub series: Vec<Series>,
    /// Picture width in pixels.
    pub width: u32,
    /// Picture height in pixels.
    pub height: u32,
}

/// A stacked bar chart (e.g. a step's time broken into forward, backward, waiting, optimizer).
#[derive(Debug, Clone, PartialEq)]
pub struct StackedBars {
    /// Title drawn above the plot.
    pub title: String,
    /// Label of the y axis.
    pub y_label: String,
    /// One bar per category, labelled with its name.
    pub categories: Vec<String>,
    /// `(part name, one value per category)`, stacked bottom-up in this order. Negative,
    /// non-finite and larger than 1e300 values are drawn as zero.
    pub parts: Vec<(String, Vec<f64>)>,
    /// Picture width in pixels.
    pub width: u32,
    /// Picture height in pixels.
    pub height: u32,
}

/// Largest magnitude drawn: beyond it, axis spans overflow and `plotters` cannot place ticks.
pub(crate) const LIMIT: f64 = 1e300;

fn usable(v: f64, scale: Scale) -> bool {
    match scale {
        Scale::Linear => v.abs() <= LIMIT,
        Scale::Log => v.abs() <= LIMIT && v > 0.0,
        Scale::Unit => (0.0..=1.0).contains(&v),
    }
}

/// Axis range covering `values` (unusable ones skipped), padded by 5% of the span (in log
/// space for a log axis); a default range when nothing is usable.
fn axis_range(values: impl Iterator<Item = f64>, scale: Scale) -> (f64, f64) {
    if scale == Scale::Unit {
        return (0.0, 1.0);
    }
    let log = scale == Scale::Log;
    let (mut lo, mut hi) = (f64::INFINITY, f64::NEG_INFINITY);
    for v in values.filter(|&v| usable(v, scale)) {
        let t = if log { v.log10() } else { v };
        lo = lo.min(t);
        hi = hi.max(t);
    }
    if lo > hi {
        return if log { (1.0, 10.0) } else { (0.0, 1.0) };
    }
    let pad = if hi > lo {
        (hi / 2.0 - lo / 2.0) * 0.1
    } else if log {
        0.5
    } else if lo == 0.0 {
        1.0
    } else {
        lo.abs() * 0.1
    };
    let (mut a, mut b) = (lo - pad, hi + pad);
    if !(a.is_finite() && b.is_finite() && a < b) {
        (a, b) = (lo, hi);
    }
    if log {
        (10f64.powf(a), 10f64.powf(b))
    } else {
        (a, b)
    }
}

/// Tick label: up to three decimals, scientific notation for very large or small values.
fn fmt_tick(v: &f64) -> String {
    let a = v.abs();
    if a != 0.0 && !(1e-3..1e5).contains(&a) {
        return format!("{v:.1e}");
    }
    let s = format!("{v:.3}");
    let s = s.trim_end_matches('0').trim_end_matches('.');
    if s == "-0" {
        "0".into()
    } else {
        s.into()
    }
}

/// The contents of an SVG's `<text>` elements (titles, tick labels, legend entries), trimmed
/// and unescaped, in document order: what a check of a rendered chart looks at.
pub fn svg_texts(svg: &str) -> Vec<String> {
    svg.split("<text")
        .skip(1)
        .filter_map(|t| {
            let body = &t[t.find('>')? + 1..];
            Some(unescape(body[..body.find("</text>")?].trim()))
        })
        .collect()
}

/// Text with XML's predefined entities replaced by their characters.
fn unescape(text: &str) -> String {
    [
        ("&lt;", "<"),
        ("&gt;", ">"),
        ("&quot;", "\""),
        ("&#39;", "'"),
        ("&apos;", "'"),
        ("&amp;", "&"),
    ]
    .iter()
    .fold(text.to_string(), |t, (entity, c)| t.replace(entity, c))
}

/// A bar chart's plot: integer x units labelled with categories at key points, f64 values.
pub(crate) type CategoryChart<'a, 'b> =
    ChartContext<'a, SVGBackend<'b>, Cartesian2d<WithKeyPoints<RangedCoordusize>, RangedCoordf64>>;

/// The axes of a bar chart: category names under the bars, no vertical grid lines.
pub(crate) fn draw_category_mesh(
    chart: &mut CategoryChart,
    cat_label: &dyn Fn(&usize) -> String,
    y_label: &str,
) -> Result<(), ChartError> {
    chart
        .configure_mesh()
        .label_style(("sans-serif", 14))
        .axis_desc_style(("sans-serif", 16))
        .disable_x_mesh()
        .x_label_formatter(cat_label)
        .y_label_formatter(&fmt_tick)
        .y_desc(y_label)
        .light_line_style(WHITE.mix(0.0))
        .draw()
        .map_err(render)
}

/// A chart on `area` as every chart of the reports is framed: `title` above in `title_size`
/// points, a 12-pixel margin, room for the axis labels.
pub(crate) fn framed_chart<'a, 'b, DB: DrawingBackend>(
    area: &'a DrawingArea<DB, plotters::coord::Shift>,
    title: &str,
    title_size: u32,
) -> ChartBuilder<'a, 'b, DB> {
    let mut builder = ChartBuilder::on(area);
    builder
        .caption(title, ("sans-serif", title_size))
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(64);
    builder
}

/// Draws the legend of `chart`'s labelled series in a framed box at `position`.
fn draw_series_legend<'a, DB: DrawingBackend + 'a, CT: CoordTranslate>(
    chart: &mut ChartContext<'a, DB, CT>,
    position: SeriesLabelPosition,
) -> Result<(), ChartError> {
    chart
        .configure_series_labels()
        .label_font(("sans-serif", 14))
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .position(position)
        .draw()
        .map_err(render)
}

fn check_size(width: u32, height: u32) -> Result<(), ChartError> {
    let ok = |v| (MIN_SIZE..=MAX_SIZE).contains(&v);
    if !(ok(width) && ok(height)) {
        return Err(ChartError::InvalidSize { width, height });
    }
    Ok(())
}

impl LineChart {
    /// Renders the chart as a standalone SVG document.
    pub fn to_svg(&self) -> Result<String, ChartError> {
        check_size(self.width, self.height)?;
        let all = || self.series.iter().flat_map(|s| s.points.iter());
        let (x0, x1) = axis_range(all().map(|p| p.0), self.x_scale);
        let (y0, y1) = axis_range(all().map(|p| p.1), self.y_scale);
        let mut buf = String::new();
        {
            let root =
                SVGBackend::with_string(&mut buf, (self.width, self.height)).into_drawing_area();
            root.fill(&WHITE).map_err(render)?;
            let mut builder = framed_chart(&root, &self.title, 24);
            match (self.x_scale == Scale::Log, self.y_scale == Scale::Log) {
                (false, false) => self.draw(builder.build_cartesian_2d(x0..x1, y0..y1)),
                (true, false) => {
                    self.draw(builder.build_cartesian_2d((x0..x1).log_scale(), y0..y1))
                }
                (false, true) => {
                    self.draw(builder.build_cartesian_2d(x0..x1, (y0..y1).log_scale()))
                }
                (true, true) => self
                    .draw(builder.build_cartesian_2d((x0..x1).log_scale(), (y0..y1).log_scale())),
            }?;
            root.present().map_err(render)?;
        }
        Ok(buf)
    }

    /// Draws mesh, series and legend on a chart of any combination of axis scales.
    fn draw<'a, 'b: 'a, X, Y, E>(
        &self,
        chart: Result<ChartContext<'a, SVGBackend<'b>, Cartesian2d<X, Y>>, E>,
    ) -> Result<(), ChartError>
    where
        X: Ranged<ValueType = f64> + ValueFormatter<f64>,
        Y: Ranged<ValueType = f64> + ValueFormatter<f64>,
        E: std::fmt::Display,
    {
        let mut chart = chart.map_err(render)?;
        chart
            .configure_mesh()
            .label_style(("sans-serif", 14))
            .axis_desc_style(("sans-serif", 16))
            .x_desc(&self.x_label)
            .y_desc(&self.y_label)
            .x_label_formatter(&fmt_tick)
            .y_label_formatter(&fmt_tick)
            .light_line_style(WHITE.mix(0.0))
            .draw()
            .map_err(render)?;
        for (i, s) in self.series.iter().enumerate() {
            let c = colour(s.colour.unwrap_or(i));
            let line = c.stroke_width(2);
            // Runs of consecutive usable points; an unusable point breaks the line.
            let runs = s
                .points
                .split(|&(x, y)| !(usable(x, self.x_scale) && usable(y, self.y_scale)));
            for run in runs.filter(|r| !r.is_empty()) {
                let markers = || run.iter().map(|&p| Circle::new(p, 3, c.filled()));
                if run.len() == 1 || s.style.marks_points() {
                    chart.draw_series(markers()).map_err(render)?;
                }
                if run.len() > 1 {
                    match (s.style, s.style.dash_pattern()) {
                        (LineStyle::Points, _) => Ok(()),
                        (_, Some((dash, gap))) => chart
                            .draw_series(DashedLineSeries::new(run.to_vec(), dash, gap, line))
                            .map(drop),
                        (_, None) => chart
                            .draw_series(LineSeries::new(run.to_vec(), line))
                            .map(drop),
                    }
                    .map_err(render)?;
                }
            }
            // An empty element carries the legend entry, so even a series with no usable
            // point is listed.
            let anno = chart
                .draw_series(Vec::<PathElement<(f64, f64)>>::new())
                .map_err(render)?;
            anno.label(s.name.as_str());
            let style = s.style;
            anno.legend(move |(x, y)| legend_swatch(style, c, (x, y)));
        }
        if !self.series.is_empty() {
            draw_series_legend(&mut chart, SeriesLabelPosition::UpperLeft)?;
        }
        Ok(())
    }
}

/// A legend entry's swatch: 24 pixels of the line in its style (four dashes at most), its
/// marker in the middle.
fn legend_swatch<'a, DB: DrawingBackend + 'a>(
    style: LineStyle,
    c: RGBColor,
    (x, y): (i32, i32),
) -> impl IntoDynElement<'a, DB, (i32, i32)> {
    const WIDTH: i32 = 24;
    let line = c.stroke_width(2);
    let (dash, gap) = match (style, style.dash_pattern()) {
        (LineStyle::Points, _) => (0, WIDTH),
        (_, Some((dash, gap))) => (dash as i32, gap as i32),
        (_, None) => (WIDTH / 4, 0),
    };
    let segment = |k: i32| {
        let start = (k * (dash + gap)).min(WIDTH);
        let end = (start + dash).min(WIDTH);
        PathElement::new(vec![(x + start, y), (x + end, y)], line)
    };
    let marker = if style.marks_points() { 3 } else { 0 };
    EmptyElement::at((0, 0))
        + segment(0)
        + segment(1)
        + segment(2)
        + segment(3)
        + Circle::new((x + WIDTH / 2, y), marker, c.filled())
}

impl StackedBars {
    /// Renders the chart as a standalone SVG document.
    pub fn to_svg(&self) -> Result<String, ChartError> {
        check_size(self.width, self.height)?;
        let n = self.categories.len();
        for (part, values) in &self.parts {
            if values.len() != n {
                return Err(ChartError::PartLength {
                    part: part.clone(),
                    expected: n,
                    got: values.len(),
                });
            }
        }
        let clean = |v: f64| if v > 0.0 && v <= LIMIT { v } else { 0.0 };
        let total = |i: usize| self.parts.iter().map(|(_, v)| clean(v[i])).sum::<f64>();
        let top = (0..n)
            .map(total)
            .filter(|t| t.is_finite())
            .fold(0.0, f64::max);
        // Headroom for the legend (one row per part) in the upper right.
        let headroom = 1.15 + 0.06 * self.parts.len().min(10) as f64;
        let top = if top > 0.0 { top * headroom } else { 1.0 };
        let mut buf = String::new();
        {
            let root =
                SVGBackend::with_string(&mut buf, (self.width, self.height)).into_drawing_area();
            root.fill(&WHITE).map_err(render)?;
            let mut chart = framed_chart(&root, &self.title, 24)
                // Integer x units (f64 axes have no default formatting to combine with custom key
                // points): bar i spans [10i + 1, 10i + 9], its label is the key point 10i + 5.
                .build_cartesian_2d(
                    (0..n.max(1).saturating_mul(10))
                        .with_key_points((0..n).map(|i| i * 10 + 5).collect()),
                    0.0..top,
                )
                .map_err(render)?;
            let cat_label = |v: &usize| self.categories.get(v / 10).cloned().unwrap_or_default();
            draw_category_mesh(&mut chart, &cat_label, &self.y_label)?;
            let mut base = vec![0.0; n];
            for (k, (name, values)) in self.parts.iter().enumerate() {
                let c = colour(k);
                let bars: Vec<_> = (0..n)
                    .map(|i| {
                        let (y0, y1) = (base[i], base[i] + clean(values[i]));
                        base[i] = y1;
                        Rectangle::new([(i * 10 + 1, y0), (i * 10 + 9, y1)], c.filled())
                    })
                    .collect();
                chart
                    .draw_series(bars)
                    .map_err(render)?
                    .label(name.as_str())
                    .legend(move |(x, y)| {
                        Rectangle::new([(x, y - 5), (x + 12, y + 5)], c.filled())
                    });
            }
            if !self.parts.is_empty() {
                draw_series_legend(&mut chart, SeriesLabelPosition::UpperRight)?;
            }
            drop(chart);
            root.present().map_err(render)?;
        }
        Ok(buf)
    }
}

#[cfg(test)]
mod tests;
