use super::*;

fn chart(series: Vec<Series>, x_scale: Scale, y_scale: Scale) -> LineChart {
    LineChart {
        title: "Throughput vs workers".into(),
        x_label: "workers".into(),
        y_label: "samples/s".into(),
        x_scale,
        y_scale,
        series,
        width: 640,
        height: 400,
    }
}

fn series(name: &str, points: Vec<(f64, f64)>, style: LineStyle) -> Series {
    Series {
        name: name.into(),
        points,
        style,
        colour: None,
    }
}

fn svg_ok(svg: &str) {
    assert!(svg.starts_with("<svg"), "{svg}");
    assert!(svg.trim_end().ends_with("</svg>"), "{svg}");
}

#[test]
fn line_chart_three_series_log_x() {
    let xs = [1.0, 2.0, 4.0, 8.0, 16.0];
    let c = chart(
        vec![
            series(
                "ring allreduce",
                xs.iter().map(|&x| (x, 100.0 * x * 0.9)).collect(),
                LineStyle::Solid,
            ),
            series(
                "linear ideal",
                xs.iter().map(|&x| (x, 100.0 * x)).collect(),
                LineStyle::Dashed,
            ),
            series(
                "parameter server",
                xs.iter().map(|&x| (x, 100.0 * x.sqrt())).collect(),
                LineStyle::Points,
            ),
        ],
        Scale::Log,
        Scale::Linear,
    );
    let svg = c.to_svg().unwrap();
    svg_ok(&svg);
    for text in [
        "ring allreduce",
        "linear ideal",
        "parameter server",
        "workers",
        "samples/s",
        "Throughput vs workers",
    ] {
        assert!(svg.contains(text), "missing {text}");
    }
    // Three distinct colours.
    for c in &PALETTE[..3] {
        assert!(
            svg.contains(&format!("#{:02X}{:02X}{:02X}", c.0, c.1, c.2)),
            "missing colour {c:?}"
        );
    }
}

#[test]
fn awkward_line_data_renders() {
    let nan = f64::NAN;
    let cases = vec![
        vec![],
        vec![series("one", vec![(3.0, 5.0)], LineStyle::Solid)],
        vec![series("empty", vec![], LineStyle::Dashed)],
        vec![series(
            "nan",
            vec![
                (nan, 1.0),
                (1.0, nan),
                (2.0, 3.0),
                (nan, nan),
                (3.0, 4.0),
                (4.0, 1.0),
            ],
            LineStyle::Dashed,
        )],
        vec![series("all nan", vec![(nan, nan); 3], LineStyle::Solid)],
        vec![series(
            "flat",
            vec![(1.0, 2.0), (2.0, 2.0), (3.0, 2.0)],
            LineStyle::Solid,
        )],
        vec![series(
            "same x",
            vec![(0.0, 0.0), (0.0, 0.0)],
            LineStyle::Points,
        )],
        vec![series(
            "negative",
            vec![(-1.0, -5.0), (0.0, 0.0), (1.0, 7.0)],
            LineStyle::Solid,
        )],
        vec![series(
            "huge",
            vec![
                (-f64::MAX, f64::MAX),
                (f64::MAX, -f64::MAX),
                (f64::INFINITY, 1.0),
            ],
            LineStyle::Solid,
        )],
        vec![series(
            "tiny",
            vec![(1e-300, 1e-300), (f64::MIN_POSITIVE, 2e-300)],
            LineStyle::Dashed,
        )],
    ];
    for s in cases {
        for xs in [Scale::Linear, Scale::Log] {
            for ys in [Scale::Linear, Scale::Log] {
                let svg = chart(s.clone(), xs, ys).to_svg().unwrap();
                svg_ok(&svg);
                for ser in &s {
                    assert!(svg.contains(&ser.name));
                }
            }
        }
    }
}

#[test]
fn series_names_are_escaped_in_svg() {
    let svg = chart(
        vec![series(
            "a<b & \"c\"",
            vec![(1.0, 1.0), (2.0, 2.0)],
            LineStyle::Solid,
        )],
        Scale::Linear,
        Scale::Linear,
    )
    .to_svg()
    .unwrap();
    assert!(svg.contains("a&lt;b &amp; &quot;c&quot;"));
}

#[test]
fn bad_size_is_an_error() {
    let mut c = chart(vec![], Scale::Linear, Scale::Linear);
    c.width = 0;
    assert!(matches!(c.to_svg(), Err(ChartError::InvalidSize { .. })));
    let mut b = bars();
    b.height = 10;
    assert!(matches!(b.to_svg(), Err(ChartError::InvalidSize { .. })));
    b.height = MAX_SIZE + 1;
    assert!(matches!(b.to_svg(), Err(ChartError::InvalidSize { .. })));
    (b.width, b.height) = (MIN_SIZE, MIN_SIZE);
    svg_ok(&b.to_svg().unwrap());
    (c.width, c.height) = (MIN_SIZE, MIN_SIZE);
    c.series = vec![series("s", vec![(1.0, 1.0), (2.0, 3.0)], LineStyle::Dashed)];
    svg_ok(&c.to_svg().unwrap());
}

fn bars() -> StackedBars {
    StackedBars {
        title: "Step time breakdown".into(),
        y_label: "ms".into(),
        categories: vec!["ps".into(), "ring".into(), "hierarchical".into()],
        parts: vec![
            ("forward".into(), vec![10.0, 10.0, 10.0]),
            ("backward".into(), vec![20.0, 20.0, 21.0]),
            ("waiting".into(), vec![15.0, 5.0, 2.0]),
            ("optimizer".into(), vec![3.0, 3.0, 3.0]),
        ],
        width: 640,
        height: 400,
    }
}

#[test]
fn stacked_bars_render() {
    let svg = bars().to_svg().unwrap();
    svg_ok(&svg);
    for text in [
        "forward",
        "backward",
        "waiting",
        "optimizer",
        "ps",
        "ring",
        "hierarchical",
        "ms",
        "Step time breakdown",
    ] {
        assert!(svg.contains(text), "missing {text}");
    }
}

#[test]
fn awkward_bars() {
    let mut b = bars();
    b.parts[0].1 = vec![f64::NAN, -3.0, f64::INFINITY];
    b.parts[1].1 = vec![f64::MAX, 1e300, 1e-300];
    svg_ok(&b.to_svg().unwrap());
    b.parts.clear();
    svg_ok(&b.to_svg().unwrap());
    b.categories.clear();
    svg_ok(&b.to_svg().unwrap());
    b.parts.push(("zero".into(), vec![]));
    svg_ok(&b.to_svg().unwrap());
    b.parts.push(("short".into(), vec![1.0]));
    let err = b.to_svg().unwrap_err();
    assert!(
        matches!(
            err,
            ChartError::PartLength {
                expected: 0,
                got: 1,
                ..
            }
        ),
        "{err}"
    );
}

#[test]
fn svg_texts_are_read_back() {
    let svg = bars().to_svg().unwrap();
    let texts = svg_texts(&svg);
    assert!(
        texts.contains(&"Step time breakdown".to_string()),
        "{texts:?}"
    );
    assert!(texts.contains(&"hierarchical".to_string()));
    assert!(svg_texts("<svg><text a=\"1\">x").is_empty());
    let escaped = "<text>a &lt;b&gt; &amp;&#39;c&#39;&amp;lt;</text>";
    assert_eq!(svg_texts(escaped), ["a <b> &'c'&lt;"]);
}

#[test]
fn tick_format() {
    assert_eq!(fmt_tick(&0.0), "0");
    assert_eq!(fmt_tick(&-0.0), "0");
    assert_eq!(fmt_tick(&2.5), "2.5");
    assert_eq!(fmt_tick(&100.0), "100");
    assert_eq!(fmt_tick(&1e6), "1.0e6");
    assert_eq!(fmt_tick(&0.0001), "1.0e-4");
}

#[test]
fn html_escapes_and_is_self_contained() {
    let mut r = HtmlReport::new("Run <1> & 'friends'");
    r.heading("<script>alert(1)</script>");
    r.paragraph("a \"quoted\" & <b>bold</b> claim");
    r.table(
        &["strategy", "<script>"],
        &[
            vec!["ring".into(), "<script>x</script>".into()],
            vec!["ps".into()],
        ],
    );
    r.svg(&bars().to_svg().unwrap());
    r.svg(&chart(vec![], Scale::Log, Scale::Log).to_svg().unwrap());
    let page = r.finish();
    assert!(page.starts_with("<!DOCTYPE html>"));
    assert!(!page.contains("<script>"));
    assert!(page.contains("<h2>&lt;script&gt;alert(1)&lt;/script&gt;</h2>"));
    assert!(page.contains("<td>&lt;script&gt;x&lt;/script&gt;</td>"));
    assert!(page.contains("<th>&lt;script&gt;</th>"));
    assert!(page.contains("Run &lt;1&gt; &amp; &#39;friends&#39;"));
    assert!(page.contains("a &quot;quoted&quot; &amp; &lt;b&gt;bold&lt;/b&gt; claim"));
    assert_eq!(page.matches("<svg").count(), 2);
    // The only external-looking references are the SVG namespace declarations.
    let ns = r#"xmlns="http://www.w3.org/2000/svg""#;
    assert_eq!(page.matches(ns).count(), 2);
    let urls = page.matches("http://").count() + page.matches("https://").count();
    assert_eq!(urls, page.matches(ns).count());
}

fn grouped() -> GroupedBars {
    GroupedBars {
        title: "Accuracy per bandwidth".into(),
        y_label: "test accuracy".into(),
        categories: vec!["1gbit".into(), "10gbit".into()],
        series: vec![
            BarSeries {
                name: "ps".into(),
                values: vec![0.5, 0.9],
                colour: Some(3),
                style: BarStyle::Filled,
            },
            BarSeries {
                name: "p3 textbook".into(),
                values: vec![f64::NAN, 0.95],
                colour: Some(3),
                style: BarStyle::Outline,
            },
        ],
        y_max: Some(1.0),
        width: 640,
        height: 400,
    }
}

#[test]
fn grouped_bars_render_with_fixed_colours_and_top() {
    let svg = grouped().to_svg().unwrap();
    svg_ok(&svg);
    for text in [
        "ps",
        "p3 textbook",
        "1gbit",
        "10gbit",
        "Accuracy per bandwidth",
    ] {
        assert!(svg.contains(text), "missing {text}");
    }
    assert!(svg.contains(&colour_hex(3)));
    assert!(
        !svg.contains(&colour_hex(0)),
        "only the fixed colour is used"
    );
    // The axis stops at 1: no tick beyond it.
    let texts = svg_texts(&svg);
    assert!(texts.iter().any(|t| t == "1"), "{texts:?}");
    assert!(!texts.iter().any(|t| t == "1.1"), "{texts:?}");
}

#[test]
fn awkward_grouped_bars() {
    let mut g = grouped();
    g.y_max = None;
    g.series[0].values = vec![f64::INFINITY, -1.0];
    g.series[1].values = vec![f64::MAX, 1e-300];
    svg_ok(&g.to_svg().unwrap());
    g.series.clear();
    svg_ok(&g.to_svg().unwrap());
    g.categories.clear();
    svg_ok(&g.to_svg().unwrap());
    g.series.push(grouped().series[0].clone());
    assert!(matches!(
        g.to_svg(),
        Err(ChartError::PartLength {
            expected: 0,
            got: 2,
            ..
        })
    ));
    let mut g = grouped();
    (g.width, g.height) = (MIN_SIZE, MIN_SIZE);
    svg_ok(&g.to_svg().unwrap());
}

#[test]
fn unit_axis_is_zero_to_one_and_colours_are_fixed() {
    let mut s = series(
        "acc",
        vec![(0.0, 0.2), (0.5, 1.0), (1.0, 1.5)],
        LineStyle::Solid,
    );
    s.colour = Some(PALETTE_LEN + 2);
    let svg = chart(vec![s], Scale::Unit, Scale::Unit).to_svg().unwrap();
    svg_ok(&svg);
    assert!(svg.contains(&colour_hex(2)), "indices cycle");
    let texts = svg_texts(&svg);
    assert!(texts.iter().any(|t| t == "1"), "{texts:?}");
    assert!(!texts
        .iter()
        .any(|t| t.parse::<f64>().is_ok_and(|v| v > 1.0)));
    assert_eq!(axis_range([0.3, 0.4].into_iter(), Scale::Unit), (0.0, 1.0));
}

#[test]
fn every_distinct_line_style_draws_differently_and_marks_where_it_says() {
    let points: Vec<(f64, f64)> = (0..5).map(|i| (i as f64, (i * i) as f64)).collect();
    let mut drawn = Vec::new();
    let mut solid_pieces = None;
    for style in LineStyle::DISTINCT {
        let svg = chart(
            vec![series("v", points.clone(), style)],
            Scale::Linear,
            Scale::Linear,
        )
        .to_svg()
        .unwrap();
        svg_ok(&svg);
        // Markers are circles of radius 3: one per point and one in the legend.
        let markers = svg.matches("r=\"3\"").count();
        let want = if style.marks_points() { 5 + 1 } else { 0 };
        assert_eq!(markers, want, "{style:?}");
        // A broken line is drawn as many short pieces (the axes' lines are pieces too).
        let pieces = svg.matches("<polyline").count();
        let solid = *solid_pieces.get_or_insert(pieces);
        assert_eq!(
            pieces > solid + 4,
            style.dash_pattern().is_some(),
            "{style:?}: {pieces} pieces, {solid} for a solid line"
        );
        drawn.push(svg);
    }
    for (i, a) in drawn.iter().enumerate() {
        for b in &drawn[i + 1..] {
            assert_ne!(a, b, "two styles drew the same chart");
        }
    }
}

#[test]
fn shaded_bars_keep_their_colour_and_get_lighter() {
    let mut g = grouped();
    g.series[1].style = BarStyle::Shaded(1);
    let svg = g.to_svg().unwrap();
    assert!(svg.contains(&colour_hex(3)));
    assert!(svg.contains("opacity=\"0.7\""), "{svg}");
    assert_eq!(BarStyle::Shaded(2).opacity(), 1.0 - 0.6);
    assert_eq!(
        BarStyle::Shaded(9).opacity(),
        0.25,
        "never fainter than a quarter"
    );
    assert_eq!(BarStyle::Filled.opacity(), 1.0);
}
