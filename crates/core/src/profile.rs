//! Per-layer compute profiles of real models: forward/backward time and parameter tensors of
//! every layer, in execution order. The runtime replays a model's compute from a profile
//! (sleeping while parameter-sized buffers travel for real) and the simulator uses the same
//! numbers. Sans-IO: parsing takes `&str`; the built-in profiles are embedded in the crate.
//!
//! One text format: PipeDream's `graph.txt` (node lines `name -- op -- metrics`, edge lines
//! `\tnodeA -- nodeB`), with two backward-compatible extensions that profiles written by
//! Syncopate's PyTorch profiler use:
//! - a node metric `parameter_tensors=N1;N2;...`: the sizes (in `f32` values) of the layer's
//!   parameter tensors, in the model's order, summing to `parameter_size / 4`; without it a
//!   layer's parameters are one tensor;
//! - lines starting with `#` are comments; `# batch_size: N` and `# parameters: N` are
//!   headers (the batch the times were measured at; the model's parameter total, checked
//!   against the layers); `# model: NAME` and the other comments are kept apart
//!   ([`ProfileNotes`]).

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};

/// The PipeDream profiles embedded in the crate (see `profiles/SOURCE.md`).
const RESNET50_GRAPH: &str = include_str!("../profiles/resnet50.graph.txt");
const VGG16_GRAPH: &str = include_str!("../profiles/vgg16.graph.txt");
const BUILTIN_NAMES: &[&str] = &["resnet50", "vgg16", "vgg19", "sockeye"];
/// The batch size of the PipeDream measurements.
const PIPEDREAM_BATCH: usize = 128;

/// Why a profile could not be parsed or built. The `usize` fields are 1-based line numbers.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ProfileError {
    /// The text holds no node lines.
    #[error("profile has no nodes")]
    NoNodes,
    /// (line, reason): the line has neither the node, the edge nor the header shape, or what
    /// it says contradicts itself or the rest of the profile.
    #[error("line {0}: {1}")]
    Malformed(usize, String),
    /// (line, field): a node line lacks a metric.
    #[error("line {0}: missing field `{1}`")]
    MissingField(usize, &'static str),
    /// (line, field, text): a metric is not a finite, non-negative number in range.
    #[error("line {0}: bad number for `{1}`: '{2}'")]
    BadNumber(usize, String, String),
    /// (line, bytes): `parameter_size` is not a whole number of fp32 values.
    #[error("line {0}: parameter_size {1} is not a multiple of 4 bytes")]
    ParamBytes(usize, u64),
    /// (line, name): a second node line with the same name.
    #[error("line {0}: duplicate node '{1}'")]
    DuplicateNode(usize, String),
    /// (line, name): an edge names a node that has no node line.
    #[error("line {0}: edge to unknown node '{1}'")]
    UnknownNode(usize, String),
    /// (line, name): the edges form a cycle, so there is no execution order; names the
    /// first node (by line) that could not be ordered.
    #[error("line {0}: node '{1}' is on or after a cycle in the graph")]
    Cycle(usize, String),
    /// (name, known names): `builtin` was asked for a model it does not know.
    #[error("unknown built-in profile '{0}' (known: {1})")]
    UnknownModel(String, String),
    /// `scaled` was given a factor below 1 or not finite.
    #[error("scale factor {0} must be finite and at least 1")]
    BadScale(f64),
    /// A derived built-in (VGG-19) did not find the layout it expects in its base profile.
    #[error("cannot derive profile: {0}")]
    Layout(String),
}

impl ProfileError {
    /// The 1-based line at fault, where one is.
    pub fn line(&self) -> Option<usize> {
        match self {
            ProfileError::Malformed(line, _)
            | ProfileError::MissingField(line, _)
            | ProfileError::BadNumber(line, ..)
            | ProfileError::ParamBytes(line, _)
            | ProfileError::DuplicateNode(line, _)
            | ProfileError::UnknownNode(line, _)
            | ProfileError::Cycle(line, _) => Some(*line),
            _ => None,
        }
    }
}

/// What a profile's comment lines say besides its headers.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ProfileNotes {
    /// The model's name, from a `# model: NAME` line (the last one).
    pub model: Option<String>,
    /// The other comment lines, in order, without their `#` and trimmed.
    pub comments: Vec<String>,
}

/// One layer (a node of the profiled graph) in execution order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LayerProfile {
    /// Node name from the profile, e.g. `node4` (copies made for VGG-19 end in `_copy`).
    pub name: String,
    /// The operator as profiled, e.g. `Conv2d(64, 64, kernel_size=(3, 3), ...)`.
    pub op: String,
    /// Forward compute time in nanoseconds.
    pub forward_ns: u64,
    /// Backward compute time in nanoseconds.
    pub backward_ns: u64,
    /// Number of `f32` parameters (`parameter_size / 4`); 0 for layers without parameters.
    pub param_count: usize,
    /// The sizes of the layer's parameter tensors in the model's order (e.g. a convolution's
    /// weight, then its bias), summing to `param_count`. Empty: the layer's parameters are
    /// one tensor of `param_count` values (all PipeDream profiles); the parser leaves a
    /// single size out too, so two profiles of the same tensors compare equal.
    pub tensors: Vec<usize>,
}

impl LayerProfile {
    /// The sizes of the layer's parameter tensors (one key each): `tensors`, or one tensor
    /// of `param_count` where `tensors` is empty; nothing for a layer without parameters.
    pub fn tensor_sizes(&self) -> Vec<usize> {
        if self.tensors.is_empty() {
            (self.param_count > 0)
                .then_some(self.param_count)
                .into_iter()
                .collect()
        } else {
            self.tensors.clone()
        }
    }
}

/// A model's profile: layers in execution order from the input.
///
/// PipeDream profiles include the `Input` node, whose forward time (about 18-19 ms at batch
/// 128) is input loading rather than layer compute; the totals below include it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ModelProfile {
    /// Model name, e.g. `vgg16`.
    pub name: String,
    /// Layers in execution order, input first.
    pub layers: Vec<LayerProfile>,
    /// The batch size the times were measured at, where the profile says it
    /// (`# batch_size: N`).
    pub batch_size: Option<usize>,
}

/// A metric's value times `scale`: finite, non-negative and below `max` (keeps casts exact).
fn number(
    line: usize,
    field: &str,
    value: &str,
    scale: f64,
    max: f64,
) -> Result<f64, ProfileError> {
    match value.trim().parse::<f64>().map(|v| v * scale) {
        Ok(v) if v.is_finite() && v >= 0.0 && v < max => Ok(v),
        _ => Err(ProfileError::BadNumber(line, field.into(), value.into())),
    }
}

/// Integers are exact in f64 below 2^53: the bound of every count a profile holds.
const COUNT_MAX: f64 = (1u64 << 53) as f64;

/// A whole, non-negative count below 2^53 (parameter bytes, tensor sizes, header values).
fn count(line: usize, field: &str, value: &str) -> Result<u64, ProfileError> {
    match number(line, field, value, 1.0, COUNT_MAX)? {
        v if v.fract() == 0.0 => Ok(v as u64),
        _ => Err(ProfileError::BadNumber(line, field.into(), value.into())),
    }
}

/// The sizes in `parameter_tensors=N1;N2;...`: each a positive whole number.
fn tensor_sizes(line: usize, value: &str) -> Result<Vec<usize>, ProfileError> {
    const FIELD: &str = "parameter_tensors";
    value
        .split(';')
        .map(|size| match count(line, FIELD, size)? {
            0 => Err(ProfileError::BadNumber(line, FIELD.into(), size.into())),
            n => usize::try_from(n)
                .map_err(|_| ProfileError::BadNumber(line, FIELD.into(), size.into())),
        })
        .collect()
}

/// Parses one node line, `name -- op -- metrics` (`line` is its number, for errors). The op
/// is what lies between the first and the last ` -- `, so it may itself contain one.
fn parse_node(line: usize, text: &str) -> Result<LayerProfile, ProfileError> {
    const SEP: &str = " -- ";
    let malformed = |why: &str| ProfileError::Malformed(line, why.into());
    let (first, last) = match (text.find(SEP), text.rfind(SEP)) {
        (Some(f), Some(l)) if f < l => (f, l),
        _ => return Err(malformed("expected `name -- op -- metrics`")),
    };
    let name = text[..first].trim();
    if name.is_empty() || name.contains(char::is_whitespace) {
        return Err(malformed("bad node name"));
    }
    let (mut fwd, mut bwd, mut bytes, mut tensors) = (None, None, None, Vec::new());
    let ns_max = (1u64 << 63) as f64; // about 292 years
    for item in text[last + SEP.len()..].split(',').map(str::trim) {
        let Some((key, value)) = item.split_once('=') else {
            if item.is_empty() {
                continue;
            }
            return Err(malformed(&format!("metric '{item}' is not key=value")));
        };
        match key.trim() {
            k @ "forward_compute_time" => fwd = Some(number(line, k, value, 1e6, ns_max)?),
            k @ "backward_compute_time" => bwd = Some(number(line, k, value, 1e6, ns_max)?),
            k @ "parameter_size" => bytes = Some(count(line, k, value)?),
            "parameter_tensors" => tensors = tensor_sizes(line, value)?,
            _ => {} // activation_size and anything else is not used
        }
    }
    let missing = |field| ProfileError::MissingField(line, field);
    let bytes = bytes.ok_or_else(|| missing("parameter_size"))?;
    if !bytes.is_multiple_of(4) {
        return Err(ProfileError::ParamBytes(line, bytes));
    }
    let param_count = usize::try_from(bytes / 4)
        .map_err(|_| ProfileError::BadNumber(line, "parameter_size".into(), bytes.to_string()))?;
    let tensor_total = tensors.iter().fold(0usize, |s, &n| s.saturating_add(n));
    if !tensors.is_empty() && tensor_total != param_count {
        return Err(malformed(&format!(
            "parameter_tensors sum to {tensor_total} values, parameter_size holds {param_count}"
        )));
    }
    if tensors.len() == 1 {
        tensors.clear(); // one tensor is what no sizes mean
    }
    Ok(LayerProfile {
        name: name.into(),
        op: text[first + SEP.len()..last].trim().into(),
        forward_ns: fwd.ok_or_else(|| missing("forward_compute_time"))?.round() as u64,
        backward_ns: bwd.ok_or_else(|| missing("backward_compute_time"))?.round() as u64,
        param_count,
        tensors,
    })
}

/// Tie-break key for the topological sort: `node12` sorts by 12; names without a trailing
/// number sort after all numbered ones, by name.
fn order_key(name: &str) -> (u64, &str) {
    let stem = name.trim_end_matches(|c: char| c.is_ascii_digit());
    (name[stem.len()..].parse().unwrap_or(u64::MAX), name)
}

/// FNV-1a, 64-bit.
fn fnv1a(hash: u64, bytes: &[u8]) -> u64 {
    bytes.iter().fold(hash, |h, &b| {
        (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3)
    })
}

/// The headers a profile may carry (`# key: value` lines), with the line each was on.
#[derive(Debug, Default)]
struct Headers {
    /// `# batch_size: N`.
    batch_size: Option<(usize, usize)>,
    /// `# parameters: N`: the model's parameter total.
    parameters: Option<(usize, usize)>,
    /// The model's name and the free comments.
    notes: ProfileNotes,
}

impl Headers {
    /// Reads a comment line (`text` after its `#`): a known header is recorded, the model's
    /// name and anything else kept as notes.
    fn read(&mut self, line: usize, text: &str) -> Result<(), ProfileError> {
        let Some((key, value)) = text.split_once(':') else {
            self.notes.comments.push(text.trim().into());
            return Ok(());
        };
        let slot = match key.trim() {
            "batch_size" => &mut self.batch_size,
            "parameters" => &mut self.parameters,
            "model" if !value.trim().is_empty() => {
                self.notes.model = Some(value.trim().into());
                return Ok(());
            }
            _ => {
                self.notes.comments.push(text.trim().into());
                return Ok(());
            }
        };
        if slot.is_some() {
            let why = format!("second `{}` header", key.trim());
            return Err(ProfileError::Malformed(line, why));
        }
        let n = usize::try_from(count(line, key.trim(), value)?)
            .map_err(|_| ProfileError::BadNumber(line, key.trim().into(), value.into()))?;
        *slot = Some((line, n));
        Ok(())
    }
}

/// A profile's lines sorted out: node lines (with their line numbers), the index of each
/// node by name, edges `(line, from, to)` and the headers.
type Lines<'a> = (
    Vec<(usize, LayerProfile)>,
    HashMap<String, usize>,
    Vec<(usize, &'a str, &'a str)>,
    Headers,
);

/// Splits a profile's text into node lines, edges and headers, parsing the node lines.
fn read_lines(text: &str) -> Result<Lines<'_>, ProfileError> {
    let (mut nodes, mut index, mut edges) = (Vec::new(), HashMap::new(), Vec::new());
    let mut headers = Headers::default();
    for (line, raw) in text.lines().enumerate().map(|(i, raw)| (i + 1, raw)) {
        if raw.trim().is_empty() {
            continue;
        } else if let Some(comment) = raw.strip_prefix('#') {
            headers.read(line, comment)?;
        } else if raw.starts_with('\t') {
            let Some((a, b)) = raw.trim().split_once(" -- ") else {
                let why = "edge is not `\\tnodeA -- nodeB`";
                return Err(ProfileError::Malformed(line, why.into()));
            };
            edges.push((line, a.trim(), b.trim()));
        } else {
            let layer = parse_node(line, raw)?;
            if index.insert(layer.name.clone(), nodes.len()).is_some() {
                return Err(ProfileError::DuplicateNode(line, layer.name));
            }
            nodes.push((line, layer));
        }
    }
    Ok((nodes, index, edges, headers))
}

/// The nodes' execution order: a topological sort of the edges (Kahn's algorithm, ties
/// broken by node number, smallest first), as indices into `nodes`.
fn execution_order(
    nodes: &[(usize, LayerProfile)],
    index: &HashMap<String, usize>,
    edges: &[(usize, &str, &str)],
) -> Result<Vec<usize>, ProfileError> {
    let (mut successors, mut in_degree) =
        (vec![Vec::new(); nodes.len()], vec![0usize; nodes.len()]);
    for &(line, a, b) in edges {
        let find = |n: &str| {
            index
                .get(n)
                .copied()
                .ok_or_else(|| ProfileError::UnknownNode(line, n.into()))
        };
        let (from, to) = (find(a)?, find(b)?);
        successors[from].push(to);
        in_degree[to] += 1;
    }
    let key = |i: usize| Reverse((order_key(&nodes[i].1.name), i));
    let mut ready: BinaryHeap<_> = (0..nodes.len())
        .filter(|&i| in_degree[i] == 0)
        .map(key)
        .collect();
    let mut order = Vec::with_capacity(nodes.len());
    while let Some(Reverse((_, i))) = ready.pop() {
        order.push(i);
        for &j in &successors[i] {
            in_degree[j] -= 1;
            if in_degree[j] == 0 {
                ready.push(key(j));
            }
        }
    }
    if let Some(stuck) = (0..nodes.len()).find(|&i| in_degree[i] > 0) {
        // Nodes are stored in line order, so this is the first stuck node by line.
        return Err(ProfileError::Cycle(
            nodes[stuck].0,
            nodes[stuck].1.name.clone(),
        ));
    }
    Ok(order)
}

impl ModelProfile {
    /// Parses a profile in the `graph.txt` format (see the module docs) and orders its nodes
    /// by a topological sort of its edges (Kahn's algorithm, ties broken by node number,
    /// smallest first). A `# parameters: N` header must equal the layers' total.
    pub fn parse(name: &str, text: &str) -> Result<Self, ProfileError> {
        Self::parse_with_notes(name, text).map(|(profile, _)| profile)
    }

    /// [`ModelProfile::parse`], with what the comment lines say besides the headers.
    pub fn parse_with_notes(name: &str, text: &str) -> Result<(Self, ProfileNotes), ProfileError> {
        let (nodes, index, edges, headers) = read_lines(text)?;
        if nodes.is_empty() {
            return Err(ProfileError::NoNodes);
        }
        let order = execution_order(&nodes, &index, &edges)?;
        let mut slots: Vec<Option<LayerProfile>> =
            nodes.into_iter().map(|(_, l)| Some(l)).collect();
        let layers = order.into_iter().filter_map(|i| slots[i].take()).collect();
        let profile = Self {
            name: name.into(),
            layers,
            batch_size: headers.batch_size.map(|(_, n)| n),
        };
        if let Some((line, n)) = headers.parameters {
            if n != profile.param_count() {
                let why = format!(
                    "header says {n} parameters, the layers hold {}",
                    profile.param_count()
                );
                return Err(ProfileError::Malformed(line, why));
            }
        }
        Ok((profile, headers.notes))
    }

    /// The profile in the `graph.txt` format (see the module docs), which
    /// [`ModelProfile::parse`] reads back to an equal profile (the name aside) where node
    /// names are unique and free of whitespace and ops hold no line break, as parsed ones
    /// are: the headers, node lines in execution order, and a chain of edges that fixes it.
    pub fn to_graph_text(&self) -> String {
        use std::fmt::Write as _;
        let ms = |ns: u64| format!("{}.{:06}", ns / 1_000_000, ns % 1_000_000);
        let mut text = format!("# model: {}\n", self.name);
        if let Some(batch) = self.batch_size {
            let _ = writeln!(text, "# batch_size: {batch}");
        }
        let _ = writeln!(text, "# parameters: {}", self.param_count());
        for l in &self.layers {
            let _ = write!(
                text,
                "{} -- {} -- forward_compute_time={}, backward_compute_time={}, \
                 parameter_size={}",
                l.name,
                l.op,
                ms(l.forward_ns),
                ms(l.backward_ns),
                l.param_count as u128 * 4
            );
            if !l.tensors.is_empty() {
                let sizes: Vec<String> = l.tensors.iter().map(usize::to_string).collect();
                let _ = write!(text, ", parameter_tensors={}", sizes.join(";"));
            }
            text.push('\n');
        }
        for pair in self.layers.windows(2) {
            let _ = writeln!(text, "\t{} -- {}", pair[0].name, pair[1].name);
        }
        text
    }

    /// A built-in profile by name (see [`ModelProfile::builtin_names`]): `resnet50` and
    /// `vgg16` are the embedded PipeDream measurements, `vgg19` is derived from `vgg16`, and
    /// `sockeye` is built from layer shapes with estimated times (see `sockeye`'s table).
    /// The PipeDream ones were measured at batch size 128.
    pub fn builtin(name: &str) -> Result<Self, ProfileError> {
        let pipedream = |p: Self| Self {
            batch_size: Some(PIPEDREAM_BATCH),
            ..p
        };
        match name {
            "resnet50" => Self::parse(name, RESNET50_GRAPH).map(pipedream),
            "vgg16" => Self::parse(name, VGG16_GRAPH).map(pipedream),
            "vgg19" => vgg19().map(pipedream),
            "sockeye" => Ok(sockeye()),
            _ => Err(ProfileError::UnknownModel(
                name.into(),
                BUILTIN_NAMES.join(", "),
            )),
        }
    }

    /// Names accepted by [`ModelProfile::builtin`].
    pub fn builtin_names() -> &'static [&'static str] {
        BUILTIN_NAMES
    }

    /// Total forward time of one iteration in nanoseconds (all layers, `Input` included).
    pub fn forward_ns(&self) -> u64 {
        self.layers
            .iter()
            .fold(0, |s, l| s.saturating_add(l.forward_ns))
    }

    /// Total backward time of one iteration in nanoseconds.
    pub fn backward_ns(&self) -> u64 {
        self.layers
            .iter()
            .fold(0, |s, l| s.saturating_add(l.backward_ns))
    }

    /// Total number of `f32` parameters.
    pub fn param_count(&self) -> usize {
        self.layers
            .iter()
            .fold(0, |s, l| s.saturating_add(l.param_count))
    }

    /// The parameter tensors ("keys"): each layer's tensors (see
    /// [`LayerProfile::tensor_sizes`]), numbered from the input, as (layer index, size).
    pub fn keys(&self) -> Vec<(usize, usize)> {
        let per_layer = self.layers.iter().enumerate();
        per_layer
            .flat_map(|(i, l)| l.tensor_sizes().into_iter().map(move |n| (i, n)))
            .collect()
    }

    /// Same profile with every parameter tensor divided by `factor` (rounded up, at least 1
    /// for tensors that had values) and each layer's count the sum of its tensors; compute
    /// times and names unchanged. For `--scale 1/16`. Error if `factor` < 1 or not finite.
    pub fn scaled(&self, factor: f64) -> Result<Self, ProfileError> {
        if !factor.is_finite() || factor < 1.0 {
            return Err(ProfileError::BadScale(factor));
        }
        let shrink = |n: usize| ((n as f64 / factor).ceil() as usize).clamp(1, n.max(1));
        let mut out = self.clone();
        for l in out.layers.iter_mut().filter(|l| l.param_count > 0) {
            l.tensors.iter_mut().for_each(|n| *n = shrink(*n));
            l.param_count = match l.tensors.is_empty() {
                true => shrink(l.param_count),
                false => l.tensors.iter().sum(),
            };
        }
        Ok(out)
    }

    /// A stable 64-bit fingerprint (FNV-1a) of the layers: names, ops, times, parameter
    /// counts and (for layers of several tensors) the tensor sizes, in order. The model name
    /// and the batch size are not included.
    pub fn fingerprint(&self) -> u64 {
        let mut h = fnv1a(
            0xcbf2_9ce4_8422_2325,
            &(self.layers.len() as u64).to_le_bytes(),
        );
        for l in &self.layers {
            for s in [&l.name, &l.op] {
                h = fnv1a(fnv1a(h, &(s.len() as u64).to_le_bytes()), s.as_bytes());
            }
            for v in [l.forward_ns, l.backward_ns, l.param_count as u64] {
                h = fnv1a(h, &v.to_le_bytes());
            }
            if l.tensors.len() > 1 {
                for v in std::iter::once(l.tensors.len()).chain(l.tensors.iter().copied()) {
                    h = fnv1a(h, &(v as u64).to_le_bytes());
                }
            }
        }
        h
    }
}

/// VGG-19 from the VGG-16 profile: VGG-19 adds one 3x3 conv (+ ReLU) at the end of blocks 3,
/// 4 and 5 (conv3_4 256->256, conv4_4 and conv5_4 512->512). For each, a copy of the block's
/// last conv and its ReLU (same times and parameter count, names `<node>_copy`) is inserted
/// right after that ReLU, i.e. just before the block's max-pool.
fn vgg19() -> Result<ModelProfile, ProfileError> {
    let base = ModelProfile::parse("vgg16", VGG16_GRAPH)?;
    let is = |i: usize, op: &str| base.layers.get(i).is_some_and(|l| l.op.starts_with(op));
    let pools: Vec<usize> = (0..base.layers.len())
        .filter(|&i| is(i, "MaxPool2d"))
        .collect();
    if pools.len() != 5 {
        return Err(ProfileError::Layout(format!(
            "VGG-16 has {} max-pools, not 5",
            pools.len()
        )));
    }
    let mut layers = base.layers.clone();
    for &pool in pools[2..].iter().rev() {
        // Blocks 5, 4, 3: inserting from the back keeps the earlier indices valid.
        if pool < 2 || !is(pool - 2, "Conv2d") || !is(pool - 1, "ReLU") {
            return Err(ProfileError::Layout(format!(
                "no Conv2d, ReLU before layer {pool}"
            )));
        }
        for (k, l) in base.layers[pool - 2..pool].iter().enumerate() {
            layers.insert(
                pool + k,
                LayerProfile {
                    name: format!("{}_copy", l.name),
                    ..l.clone()
                },
            );
        }
    }
    Ok(ModelProfile {
        name: "vgg19".into(),
        layers,
        batch_size: base.batch_size,
    })
}

/// The P3 paper's Sockeye (English->Vietnamese): 2-layer LSTM encoder, 2-layer LSTM decoder
/// with input feeding, 512 hidden units, 512-wide embeddings, MLP attention. LSTM layers use
/// PyTorch's count `4*h*(in+h) + 8*h`. Parameters per layer, in execution order:
///
/// | layer | shape | parameters |
/// |---|---|---|
/// | src_embed | Embedding(17188, 512) | 8,800,256 |
/// | enc_lstm1 | LSTM(512, 512) | 2,101,248 |
/// | enc_lstm2 | LSTM(512, 512) | 2,101,248 |
/// | tgt_embed | Embedding(7706, 512) | 3,945,472 |
/// | dec_lstm1 | LSTM(512 embedding + 512 attentional state, 512) | 3,149,824 |
/// | dec_lstm2 | LSTM(512, 512) | 2,101,248 |
/// | attention | MLP: key proj 512x512 + bias, query proj 512x512, score vector 512 | 525,312 |
/// | attn_hidden | Linear(1024, 512) + bias (context + state, tanh) | 524,800 |
/// | output | Linear(512, 7706) + bias | 3,953,178 |
/// | **total** | | **27,202,586** |
///
/// **The times are estimates, not measurements.** Assumptions: one iteration is a batch of
/// 64 sentences x 25 tokens (1,600 source and 1,600 target tokens); every non-embedding
/// layer costs forward `2 * param_count * 1600` FLOPs (attention scores over source
/// positions are ignored), embedding lookups cost nothing; backward = 2 x forward; effective
/// throughput 5 TFLOP/s = 5,000 FLOP/ns. That is half the ~10 TFLOP/s that the VGG-16
/// profile's large layers reach (fc6: 2 x 102.8 M x 128 FLOPs in 2.475 ms; conv1_2: 473 GFLOP
/// in 46.2 ms), because recurrent layers run step by step on 64-row matrices. Result:
/// forward 9.25 ms, backward 18.5 ms per iteration.
fn sockeye() -> ModelProfile {
    const TOKENS: u64 = 64 * 25;
    const FLOP_PER_NS: u64 = 5_000;
    let lstm = |input: usize, h: usize| 4 * h * (input + h) + 8 * h;
    let shapes: [(&str, &str, usize); 9] = [
        ("src_embed", "Embedding(17188, 512)", 17_188 * 512),
        ("enc_lstm1", "LSTM(512, 512)", lstm(512, 512)),
        ("enc_lstm2", "LSTM(512, 512)", lstm(512, 512)),
        ("tgt_embed", "Embedding(7706, 512)", 7_706 * 512),
        ("dec_lstm1", "LSTM(1024, 512)", lstm(1024, 512)),
        ("dec_lstm2", "LSTM(512, 512)", lstm(512, 512)),
        (
            "attention",
            "MLPAttention(512, 512)",
            (512 * 512 + 512) + 512 * 512 + 512,
        ),
        (
            "attn_hidden",
            "Linear(in_features=1024, out_features=512, bias=True)",
            1024 * 512 + 512,
        ),
        (
            "output",
            "Linear(in_features=512, out_features=7706, bias=True)",
            512 * 7_706 + 7_706,
        ),
    ];
    let layers = shapes.iter().map(|&(name, op, param_count)| {
        let flops = if op.starts_with("Embedding") {
            0
        } else {
            2 * param_count as u64 * TOKENS
        };
        let forward_ns = (flops + FLOP_PER_NS / 2) / FLOP_PER_NS;
        LayerProfile {
            name: name.into(),
            op: op.into(),
            forward_ns,
            backward_ns: 2 * forward_ns,
            param_count,
            tensors: Vec::new(),
        }
    });
    ModelProfile {
        name: "sockeye".into(),
        layers: layers.collect(),
        batch_size: Some(64),
    }
}

#[cfg(test)]
mod tests;
