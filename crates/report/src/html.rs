//! A small self-contained HTML page builder.

/// Inline style sheet: the page loads nothing from outside.
const STYLE: &str =
    "body{font-family:sans-serif;max-width:1100px;margin:2em auto;padding:0 1em;color:#222}\
table{border-collapse:collapse;margin:1em 0}\
th,td{border:1px solid #ccc;padding:4px 10px;text-align:right}\
th{background:#f0f0f0}\
td:first-child,th:first-child{text-align:left}\
.chart{margin:1em 0}";

/// A small self-contained HTML page builder: headings, paragraphs, tables and inline SVGs (no
/// external resources, inline CSS), for reports. Text is HTML-escaped; SVGs are inserted as-is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HtmlReport {
    title: String,
    body: String,
}

/// Escapes `&`, `<`, `>`, `"` and `'` for use in HTML text and attribute values.
fn escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

impl HtmlReport {
    /// Starts a page with this title (used for `<title>` and a top-level heading).
    pub fn new(title: &str) -> Self {
        Self {
            title: escape(title),
            body: String::new(),
        }
    }

    /// Appends a section heading.
    pub fn heading(&mut self, text: &str) {
        self.body.push_str(&format!("<h2>{}</h2>\n", escape(text)));
    }

    /// Appends a paragraph of text.
    pub fn paragraph(&mut self, text: &str) {
        self.body.push_str(&format!("<p>{}</p>\n", escape(text)));
    }

    /// Appends a table with a header row and body rows (rows may differ in length).
    pub fn table(&mut self, header: &[&str], rows: &[Vec<String>]) {
        let row = |tag: &str, cells: &mut dyn Iterator<Item = &str>| {
            let cells: String = cells
                .map(|c| format!("<{tag}>{}</{tag}>", escape(c)))
                .collect();
            format!("<tr>{cells}</tr>\n")
        };
        self.body.push_str("<table>\n<thead>\n");
        self.body.push_str(&row("th", &mut header.iter().copied()));
        self.body.push_str("</thead>\n<tbody>\n");
        for r in rows {
            self.body
                .push_str(&row("td", &mut r.iter().map(String::as_str)));
        }
        self.body.push_str("</tbody>\n</table>\n");
    }

    /// Appends an SVG document (e.g. from [`crate::LineChart::to_svg`]) inline, unescaped.
    pub fn svg(&mut self, svg: &str) {
        self.body.push_str("<div class=\"chart\">\n");
        self.body.push_str(svg);
        self.body.push_str("\n</div>\n");
    }

    /// Returns the complete HTML document.
    pub fn finish(self) -> String {
        format!(
            "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n<title>{t}</title>\n<style>{STYLE}</style>\n</head>\n<body>\n<h1>{t}</h1>\n{b}</body>\n</html>\n",
            t = self.title,
            b = self.body
        )
    }
}
