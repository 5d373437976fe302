//! How each variant of a study is drawn: one colour per technique (the variant's strategy, or
//! the `technique` it names), the same in every chart of every report, and within a
//! technique one line style (dash pattern, markers) and one bar shade per variant, in the
//! order the study file lists them, so that e.g. local SGD with H = 4, 16 and 64 share a
//! colour and differ by dash.

use syncopate_report::{colour_hex, BarStyle, LineStyle, PALETTE_LEN};

use crate::config::StudyConfig;

/// The techniques with a colour of their own (palette index), whatever study they are in.
const TECHNIQUE_COLOURS: [(&str, usize); 10] = [
    ("allreduce", 0),
    ("local-sgd", 1),
    ("diloco", 2),
    ("ring-reduce", 3),
    ("gossip", 4),
    ("p3", 5),
    ("stepwise", 6),
    ("dlcp", 7),
    ("ps", 8),
    ("dlcp-allreduce", 9),
];

/// The technique of a strategy: its name without a `-no-overlap` suffix (a baseline of
/// the same technique).
pub fn technique_of(strategy: &str) -> &str {
    strategy.strip_suffix("-no-overlap").unwrap_or(strategy)
}

/// The palette index of a technique: its own for the known ones, else one derived from
/// its name (stable across studies).
pub fn technique_colour(technique: &str) -> usize {
    TECHNIQUE_COLOURS
        .iter()
        .find(|(name, _)| *name == technique)
        .map_or_else(
            || {
                let hash = technique.bytes().fold(0usize, |h, b| {
                    h.wrapping_mul(31).wrapping_add(usize::from(b))
                });
                hash % PALETTE_LEN
            },
            |&(_, colour)| colour,
        )
}

/// How one variant is drawn.
#[derive(Debug, Clone, PartialEq)]
pub struct VariantStyle {
    /// The variant's label.
    pub label: String,
    /// Its technique.
    pub technique: String,
    /// Palette index of the technique's colour.
    pub colour: usize,
    /// Its line in curves.
    pub line: LineStyle,
    /// Its bars.
    pub bar: BarStyle,
}

/// Every variant's style, in study order.
#[derive(Debug, Clone, Default)]
pub struct Styles(Vec<VariantStyle>);

impl Styles {
    /// The styles of `config`'s variants: the k-th variant of a technique (counted from 0)
    /// gets the k-th of [`LineStyle::DISTINCT`] and bar shade k (filled for the first).
    pub fn of(config: &StudyConfig) -> Self {
        let mut styles: Vec<VariantStyle> = Vec::with_capacity(config.variants.len());
        for v in &config.variants {
            if styles.iter().any(|s| s.label == v.label) {
                continue;
            }
            let technique = v
                .technique
                .clone()
                .unwrap_or_else(|| technique_of(&v.strategy).to_string());
            let k = styles.iter().filter(|s| s.technique == technique).count();
            let line = LineStyle::DISTINCT[k % LineStyle::DISTINCT.len()];
            let bar = match u8::try_from(k) {
                Ok(0) => BarStyle::Filled,
                Ok(k) => BarStyle::Shaded(k),
                Err(_) => BarStyle::Shaded(u8::MAX),
            };
            styles.push(VariantStyle {
                label: v.label.clone(),
                colour: technique_colour(&technique),
                technique,
                line,
                bar,
            });
        }
        Self(styles)
    }

    /// The style of variant `label` (`None`: not a variant of the study).
    pub fn get(&self, label: &str) -> Option<&VariantStyle> {
        self.0.iter().find(|s| s.label == label)
    }

    /// The palette index of variant `label`'s colour.
    pub fn colour(&self, label: &str) -> Option<usize> {
        self.get(label).map(|s| s.colour)
    }

    /// The line style of variant `label` (solid when unknown).
    pub fn line(&self, label: &str) -> LineStyle {
        self.get(label).map_or(LineStyle::Solid, |s| s.line)
    }

    /// The bar style of variant `label` (filled when unknown).
    pub fn bar(&self, label: &str) -> BarStyle {
        self.get(label).map_or(BarStyle::Filled, |s| s.bar)
    }

    /// A palette index no variant uses, for a reference line (the first when all are used).
    pub fn spare_colour(&self) -> usize {
        (0..PALETTE_LEN)
            .find(|c| !self.0.iter().any(|s| s.colour == *c))
            .unwrap_or(0)
    }

    /// The legend of the whole report as an SVG: one row per variant, its technique's
    /// colour and its line style, and how its bars are shaded.
    pub fn legend_svg(&self) -> String {
        const ROW: usize = 22;
        let height = 16 + ROW * self.0.len();
        let mut svg = format!(
            "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"720\" height=\"{height}\">\n"
        );
        for (i, s) in self.0.iter().enumerate() {
            let y = 16 + ROW * i;
            let colour = colour_hex(s.colour);
            let dash = s.line.dash_pattern().map_or(String::new(), |(d, g)| {
                format!(" stroke-dasharray=\"{d},{g}\"")
            });
            let line = if s.line == LineStyle::Points {
                String::new()
            } else {
                format!(
                    "<line x1=\"8\" y1=\"{y}\" x2=\"56\" y2=\"{y}\" stroke=\"{colour}\" \
                     stroke-width=\"2\"{dash}/>"
                )
            };
            let marker = if s.line.marks_points() {
                format!("<circle cx=\"32\" cy=\"{y}\" r=\"3\" fill=\"{colour}\"/>")
            } else {
                String::new()
            };
            svg.push_str(&format!(
                "{line}{marker}<rect x=\"66\" y=\"{}\" width=\"14\" height=\"12\" \
                 fill=\"{colour}\" fill-opacity=\"{}\" stroke=\"{colour}\"/>\
                 <text x=\"90\" y=\"{}\" font-family=\"sans-serif\" font-size=\"14\">{} \
                 ({})</text>\n",
                y - 6,
                s.bar.opacity(),
                y + 5,
                escape(&s.label),
                escape(&s.technique)
            ));
        }
        svg.push_str("</svg>");
        svg
    }
}

/// `text` with XML's special characters escaped.
fn escape(text: &str) -> String {
    text.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn study(variants: &[(&str, &str)]) -> StudyConfig {
        let variants: String = variants
            .iter()
            .map(|(l, s)| format!("[[variants]]\nlabel = \"{l}\"\nstrategy = \"{s}\"\n"))
            .collect();
        toml::from_str(&format!(
            "name = \"t\"\nsteps = 2\nbandwidths = [\"1gbit\"]\n\
             [[models]]\nname = \"lenet\"\n{variants}"
        ))
        .unwrap()
    }

    #[test]
    fn one_colour_per_technique_and_one_dash_per_variant_of_it() {
        let styles = Styles::of(&study(&[
            ("stepwise", "stepwise"),
            ("allreduce", "allreduce"),
            ("stepwise (fixed)", "stepwise"),
            ("allreduce, no overlap", "allreduce-no-overlap"),
            ("stepwise /10", "stepwise"),
        ]));
        let got: Vec<(usize, LineStyle, BarStyle)> = [
            "stepwise",
            "allreduce",
            "stepwise (fixed)",
            "allreduce, no overlap",
            "stepwise /10",
        ]
        .iter()
        .map(|l| (styles.colour(l).unwrap(), styles.line(l), styles.bar(l)))
        .collect();
        assert_eq!(
            got,
            [
                (6, LineStyle::Solid, BarStyle::Filled),
                (0, LineStyle::Solid, BarStyle::Filled),
                (6, LineStyle::Dashed, BarStyle::Shaded(1)),
                (0, LineStyle::Dashed, BarStyle::Shaded(1)),
                (6, LineStyle::Dotted, BarStyle::Shaded(2)),
            ]
        );
        assert_eq!(styles.get("nope"), None);
        assert_eq!(styles.spare_colour(), 1);
    }

    #[test]
    fn a_technique_keeps_its_colour_across_studies() {
        let a = Styles::of(&study(&[("x", "ps"), ("y", "allreduce")]));
        let b = Styles::of(&study(&[("y2", "allreduce")]));
        assert_eq!(a.colour("y"), b.colour("y2"));
        assert_ne!(a.colour("x"), a.colour("y"));
        // Every named technique has a colour of its own.
        let mut colours: Vec<usize> = TECHNIQUE_COLOURS.iter().map(|t| t.1).collect();
        colours.sort_unstable();
        colours.dedup();
        assert_eq!(colours.len(), TECHNIQUE_COLOURS.len());
        assert_eq!(technique_colour("new-one"), technique_colour("new-one"));
        assert!(technique_colour("new-one") < PALETTE_LEN);
    }

    #[test]
    fn the_legend_lists_every_variant_with_its_dash() {
        let styles = Styles::of(&study(&[("a <1>", "stepwise"), ("b", "stepwise")]));
        let svg = styles.legend_svg();
        assert!(svg.contains("a &lt;1&gt; (stepwise)"), "{svg}");
        assert_eq!(svg.matches("<line").count(), 2);
        assert_eq!(svg.matches("stroke-dasharray=\"8,5\"").count(), 1);
        assert!(svg.contains(&colour_hex(6)));
    }
}
