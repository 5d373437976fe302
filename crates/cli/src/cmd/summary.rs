//! `syncopate summary FILE FIELD...`: selected figures of a result file, read through the
//! type that wrote it, as plain values on one line (tab-separated), for scripts. A field the
//! type does not have is an error that names it, so a renamed field fails the script instead
//! of reading as an empty string.

use std::path::PathBuf;

use anyhow::{anyhow, bail, Context, Result};
use clap::{Args, ValueEnum};
use serde_json::Value;
use syncopate_report::summary::JobSummary;
use syncopate_runtime::server::ServerSummary;
use syncopate_runtime::worker::{OwnLoss, WorkerSummary};
use syncopate_sim::SimReport;

use super::stats::quantile;
use super::transfer::TransferReport;

/// `syncopate summary`.
#[derive(Debug, Args)]
#[command(after_help = "Examples:\n  \
    syncopate summary run.json samples_per_sec\n  \
    syncopate summary --skip 5 --decimals 4 run.json worker0.step_seconds:mean time_to_accuracy_s\n  \
    syncopate summary --kind simulate sim.json mean_step_seconds network.frames_dropped\n\n\
    A FIELD is a dotted path into the file as its type writes it (`worker0.times.compute`, \
    `traffic.0.bytes_sent`); one that names a list of numbers may end in `:mean`, `:median`, \
    `:p50`, `:p90`, `:p99`, `:min`, `:max`, `:sum` or `:len`, taken over the list after --skip \
    entries (NaN for an empty list). Numbers print as Rust writes them (or with --decimals), \
    strings as they are, lists and objects as JSON, an absent optional figure as --null.")]
pub struct SummaryArgs {
    /// The file: a job summary (`launch --summary-json`), a member's summary
    /// (`summary.worker-N.json`, `summary.server-N.json`), a simulator report (`simulate
    /// --json`) or a transfer (`transfer --json`).
    pub file: PathBuf,
    /// The fields to print, in this order (see below).
    #[arg(required = true)]
    pub fields: Vec<String>,
    /// What the file is (default: told from its fields).
    #[arg(long, value_enum, default_value_t = FileKind::Auto)]
    pub kind: FileKind,
    /// Leave out the first N entries of a list before `:mean` and the other reductions
    /// (warm-up steps).
    #[arg(long, default_value_t = 0)]
    pub skip: usize,
    /// Print every number that is not a whole count with this many decimals.
    #[arg(long)]
    pub decimals: Option<usize>,
    /// What an absent optional figure (JSON null) prints as.
    #[arg(long, default_value = "-")]
    pub null: String,
    /// First print a line of the field names (a TSV header).
    #[arg(long)]
    pub header: bool,
}

/// The formats `syncopate summary` reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum FileKind {
    /// Told from the file: `worker0` makes a job summary, `rank` and `updates` a server's,
    /// `rank` alone a worker's, `config` a simulator report, `completion_s` a transfer.
    Auto,
    /// A job summary (`syncopate launch --summary-json`).
    Job,
    /// A loss-tolerant worker's own summary (`summary.worker-N.json`).
    Member,
    /// One server's own summary (`summary.server-N.json`).
    Server,
    /// A simulator report (`syncopate simulate --json`).
    Simulate,
    /// A transfer (`syncopate transfer --json`).
    Transfer,
}

/// Prints the fields of `args.file` on one line.
pub fn run(args: SummaryArgs) -> Result<()> {
    let text = std::fs::read_to_string(&args.file)
        .with_context(|| format!("reading {}", args.file.display()))?;
    let value = typed_value(&text, args.kind)
        .with_context(|| format!("reading {} as a result file", args.file.display()))?;
    let mut cells = Vec::with_capacity(args.fields.len());
    for field in &args.fields {
        let cell = field_value(&value, field, args.skip)
            .with_context(|| format!("{}: field '{field}'", args.file.display()))?;
        cells.push(format_cell(&cell, args.decimals, &args.null));
    }
    if args.header {
        println!("{}", args.fields.join("\t"));
    }
    println!("{}", cells.join("\t"));
    Ok(())
}

/// The file's JSON as its type writes it: parsed into that type (so a missing field is an
/// error naming it) and written back, so that only the type's fields can be asked for.
fn typed_value(text: &str, kind: FileKind) -> Result<Value> {
    let raw: Value = serde_json::from_str(text).context("not JSON")?;
    let kind = if kind == FileKind::Auto {
        guess_kind(&raw)?
    } else {
        kind
    };
    fn through<T: serde::Serialize + serde::de::DeserializeOwned>(raw: Value) -> Result<Value> {
        let typed: T = serde_json::from_value(raw)?;
        Ok(serde_json::to_value(typed)?)
    }
    match kind {
        FileKind::Job => through::<JobSummary<WorkerSummary>>(raw).context("a job summary"),
        FileKind::Member => through::<OwnLoss>(raw).context("a worker's own summary"),
        FileKind::Server => through::<ServerSummary>(raw).context("a server's summary"),
        FileKind::Simulate => through::<SimReport>(raw).context("a simulator report"),
        FileKind::Transfer | FileKind::Auto => {
            through::<TransferReport>(raw).context("a transfer report")
        }
    }
}

/// Which format `raw` is, from the field only it has.
fn guess_kind(raw: &Value) -> Result<FileKind> {
    let has = |k: &str| raw.get(k).is_some();
    Ok(if has("worker0") {
        FileKind::Job
    } else if has("rank") && has("updates") {
        FileKind::Server
    } else if has("rank") {
        FileKind::Member
    } else if has("config") && has("step_seconds") {
        FileKind::Simulate
    } else if has("completion_s") {
        FileKind::Transfer
    } else {
        bail!(
            "not a job summary (no worker0), member summary (no rank), simulator report (no \
             config) or transfer (no completion_s); give --kind to read it as one"
        )
    })
}

/// The value `field` names in `value`: a dotted path, then an optional `:reduction` of a
/// list of numbers after its first `skip` entries.
fn field_value(value: &Value, field: &str, skip: usize) -> Result<Value> {
    let (path, reduction) = match field.split_once(':') {
        Some((p, r)) => (p, Some(r)),
        None => (field, None),
    };
    let mut at = value;
    let mut walked = String::new();
    for part in path.split('.') {
        let next = match at {
            Value::Object(map) => map.get(part),
            Value::Array(items) => part.parse::<usize>().ok().and_then(|i| items.get(i)),
            _ => None,
        };
        at = next.ok_or_else(|| {
            let here = if walked.is_empty() {
                "the file"
            } else {
                &walked
            };
            anyhow!("no field '{part}' in {here} (it has: {})", children(at))
        })?;
        walked = if walked.is_empty() {
            part.to_string()
        } else {
            format!("{walked}.{part}")
        };
    }
    match reduction {
        None => Ok(at.clone()),
        Some(r) => {
            let items = at
                .as_array()
                .ok_or_else(|| anyhow!("'{path}' is not a list, so it has no :{r}"))?;
            // A NaN is written as null.
            let numbers: Vec<f64> = items
                .iter()
                .skip(skip)
                .map(|v| v.as_f64().unwrap_or(f64::NAN))
                .collect();
            Ok(reduce(&numbers, r)?)
        }
    }
}

/// What `at` offers one level down, for an error message.
fn children(at: &Value) -> String {
    match at {
        Value::Object(map) => map.keys().cloned().collect::<Vec<_>>().join(", "),
        Value::Array(items) => format!("entries 0 to {}", items.len().saturating_sub(1)),
        _ => "nothing: it is a single value".to_string(),
    }
}

/// `reduction` of `numbers` (NaN for an empty list, but `len` and `sum`).
fn reduce(numbers: &[f64], reduction: &str) -> Result<Value> {
    let quantile = |q: f64| quantile(numbers, q);
    let n = numbers.len() as f64;
    let v = match reduction {
        "len" => return Ok(Value::from(numbers.len())),
        "sum" => numbers.iter().sum(),
        "mean" if numbers.is_empty() => f64::NAN,
        "mean" => numbers.iter().sum::<f64>() / n,
        "median" | "p50" => quantile(0.5),
        "p90" => quantile(0.9),
        "p99" => quantile(0.99),
        "min" => numbers.iter().copied().fold(f64::NAN, f64::min),
        "max" => numbers.iter().copied().fold(f64::NAN, f64::max),
        other => bail!("no reduction ':{other}' (mean, median, p50, p90, p99, min, max, sum, len)"),
    };
    // serde_json holds no NaN: a string says it.
    Ok(serde_json::Number::from_f64(v).map_or_else(|| Value::from("NaN"), Value::Number))
}

/// How a cell prints: whole numbers as they are, others with `decimals` when given.
fn format_cell(v: &Value, decimals: Option<usize>, null: &str) -> String {
    match v {
        Value::Null => null.to_string(),
        Value::String(s) => s.clone(),
        Value::Number(n) if n.is_f64() => match (n.as_f64(), decimals) {
            (Some(f), Some(d)) => format!("{f:.d$}"),
            (Some(f), None) => f.to_string(),
            (None, _) => n.to_string(),
        },
        Value::Number(n) => n.to_string(),
        other => other.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn job() -> Value {
        let worker = WorkerSummary {
            step_seconds: vec![9.0, 1.0, 2.0, 3.0],
            ..Default::default()
        };
        let text = format!(
            r#"{{"strategy": "p3", "steps": 4, "time_to_accuracy_s": null,
                "samples_per_sec": 12.5, "worker0": {}}}"#,
            serde_json::to_string(&worker).unwrap()
        );
        typed_value(&text, FileKind::Auto).unwrap()
    }

    #[test]
    fn fields_and_reductions_read_through_the_type() {
        let v = job();
        let cell = |f: &str, skip| format_cell(&field_value(&v, f, skip).unwrap(), None, "-");
        assert_eq!(cell("strategy", 0), "p3");
        assert_eq!(cell("steps", 0), "4");
        assert_eq!(cell("samples_per_sec", 0), "12.5");
        assert_eq!(cell("time_to_accuracy_s", 0), "-");
        assert_eq!(cell("worker0.step_seconds:mean", 1), "2");
        assert_eq!(cell("worker0.step_seconds:len", 1), "3");
        assert_eq!(cell("worker0.step_seconds:max", 0), "9");
        assert_eq!(cell("worker0.step_seconds:p99", 0), "9");
        assert_eq!(cell("worker0.step_seconds:p90", 0), "9");
        assert_eq!(cell("worker0.step_seconds:median", 0), "3");
        assert_eq!(cell("worker0.step_seconds.0", 0), "9");
        assert_eq!(cell("worker0.step_seconds:mean", 9), "NaN");
        let fixed = field_value(&v, "worker0.step_seconds:mean", 1).unwrap();
        assert_eq!(format_cell(&fixed, Some(3), "-"), "2.000");
    }

    #[test]
    fn a_missing_field_is_an_error_that_names_it() {
        let v = job();
        let err = field_value(&v, "worker0.step_secs:mean", 0).unwrap_err();
        let text = format!("{err:#}");
        assert!(text.contains("no field 'step_secs' in worker0"), "{text}");
        assert!(
            text.contains("step_seconds"),
            "the fields it has are listed: {text}"
        );
        assert!(field_value(&v, "strategy:mean", 0).is_err());
        assert!(field_value(&v, "worker0.step_seconds:mode", 0).is_err());
        // A summary whose worker 0 lacks a field does not read at all.
        let err = typed_value(r#"{"worker0": {"rank": 0}}"#, FileKind::Auto).unwrap_err();
        assert!(format!("{err:#}").contains("missing field"), "{err:#}");
        assert!(typed_value(r#"{"a": 1}"#, FileKind::Auto).is_err());
    }

    #[test]
    fn a_transfer_reads_as_its_type() {
        let text = r#"{"completion_s": 1.5, "flow_completion_s": [1.5], "goodput_mbit_s": 53.3,
            "tcp": "cubic", "egress": {}, "ingress": {}}"#;
        let err = typed_value(text, FileKind::Auto).unwrap_err();
        assert!(format!("{err:#}").contains("a transfer report"), "{err:#}");
        let counters = serde_json::to_value(syncopate_core::net::NetCounters::default()).unwrap();
        let mut raw: Value = serde_json::from_str(text).unwrap();
        raw["egress"] = counters.clone();
        raw["ingress"] = counters;
        let v = typed_value(&raw.to_string(), FileKind::Auto).unwrap();
        let lost = field_value(&v, "egress.frames_lost", 0).unwrap();
        assert_eq!(format_cell(&lost, Some(2), "-"), "0");
        assert_eq!(
            field_value(&v, "completion_s", 0).unwrap(),
            Value::from(1.5)
        );
    }
}
