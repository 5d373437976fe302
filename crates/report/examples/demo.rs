//! Writes a demo line chart SVG to the path given as the first argument.

use syncopate_report::{LineChart, LineStyle, Scale, Series};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let path = std::env::args().nth(1).ok_or("usage: demo OUTPUT.svg")?;
    let workers = [1.0, 2.0, 4.0, 8.0, 16.0, 32.0];
    let line = |name: &str, style, f: fn(f64) -> f64| Series {
        name: name.into(),
        points: workers.iter().map(|&w| (w, f(w))).collect(),
        style,
        colour: None,
    };
    let chart = LineChart {
        title: "Scaling of synchronisation strategies".into(),
        x_label: "workers".into(),
        y_label: "samples / s".into(),
        x_scale: Scale::Log,
        y_scale: Scale::Log,
        series: vec![
            line("linear ideal", LineStyle::Dashed, |w| 1000.0 * w),
            line("ring allreduce", LineStyle::Solid, |w| {
                1000.0 * w / (1.0 + 0.02 * w)
            }),
            line("parameter server", LineStyle::Solid, |w| {
                1000.0 * w / (1.0 + 0.15 * w)
            }),
            line("measured", LineStyle::Points, |w| {
                950.0 * w / (1.0 + 0.03 * w)
            }),
        ],
        width: 800,
        height: 500,
    };
    std::fs::write(&path, chart.to_svg()?)?;
    println!("wrote {path}");
    Ok(())
}
