//! Per-layer compute profiles of real models: forward/backward time and parameter count of
//! every layer, in execution order. The runtime replays a model's compute from a profile
//! (sleeping while parameter-sized buffers travel for real) and the simulator uses the same
//! numbers. Sans-IO: parsing takes `&str`; the built-in profiles are embedded in the crate.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};

/// The PipeDream profiles embedded in the crate (see `profiles/SOURCE.md`).
const RESNET50_GRAPH: &str = include_str!("../profiles/resnet50.graph.txt");
const VGG16_GRAPH: &str = include_str!("../profiles/vgg16.graph.txt");
const BUILTIN_NAMES: &[&str] = &["resnet50", "vgg16", "vgg19", "sockeye"];

/// Why a profile could not be parsed or built. The `usize` fields are 1-based line numbers.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ProfileError {
    /// The text holds no node lines.
    #[error("profile has no nodes")]
    NoNodes,
    /// (line, reason): the line has neither the node nor the edge shape.
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
    let (mut fwd, mut bwd, mut bytes) = (None, None, None);
    let ns_max = (1u64 << 63) as f64; // about 292 years
    let bytes_max = (1u64 << 53) as f64; // integers are exact in f64 below 2^53
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
            k @ "parameter_size" => match number(line, k, value, 1.0, bytes_max)? {
                b if b.fract() == 0.0 => bytes = Some(b as u64),
                _ => return Err(ProfileError::BadNumber(line, k.into(), value.into())),
            },
            _ => {} // activation_size and anything else is not used
        }
    }
    let missing = |field| ProfileError::MissingField(line, field);
    let bytes = bytes.ok_or_else(|| missing("parameter_size"))?;
    if !bytes.is_multiple_of(4) {
        return Err(ProfileError::ParamBytes(line, bytes));
    }
    Ok(LayerProfile {
        name: name.into(),
        op: text[first + SEP.len()..last].trim().into(),
        forward_ns: fwd.ok_or_else(|| missing("forward_compute_time"))?.round() as u64,
        backward_ns: bwd.ok_or_else(|| missing("backward_compute_time"))?.round() as u64,
        param_count: usize::try_from(bytes / 4).map_err(|_| {
            ProfileError::BadNumber(line, "parameter_size".into(), bytes.to_string())
        })?,
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

impl ModelProfile {
    /// Parses a PipeDream `graph.txt` profile and orders its nodes by a topological sort of
    /// its edges (Kahn's algorithm, ties broken by node number, smallest first).
    pub fn parse(name: &str, text: &str) -> Result<Self, ProfileError> {
        let mut nodes: Vec<(usize, LayerProfile)> = Vec::new();
        let mut index: HashMap<String, usize> = HashMap::new();
        let mut edges: Vec<(usize, &str, &str)> = Vec::new();
        for (line, raw) in text.lines().enumerate().map(|(i, raw)| (i + 1, raw)) {
            if raw.trim().is_empty() {
                continue;
            } else if raw.starts_with('\t') {
                let Some((a, b)) = raw.trim().split_once(" -- ") else {
                    return Err(ProfileError::Malformed(
                        line,
                        "edge is not `\\tnodeA -- nodeB`".into(),
                    ));
                };
                edges.push((line, a.trim(), b.trim()));
                continue;
            }
            let layer = parse_node(line, raw)?;
            if index.insert(layer.name.clone(), nodes.len()).is_some() {
                return Err(ProfileError::DuplicateNode(line, layer.name));
            }
            nodes.push((line, layer));
        }
        if nodes.is_empty() {
            return Err(ProfileError::NoNodes);
        }
        let (mut successors, mut in_degree) =
            (vec![Vec::new(); nodes.len()], vec![0usize; nodes.len()]);
        for &(line, a, b) in &edges {
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
        let mut slots: Vec<Option<LayerProfile>> =
            nodes.into_iter().map(|(_, l)| Some(l)).collect();
        let layers = order.into_iter().filter_map(|i| slots[i].take()).collect();
        Ok(Self {
            name: name.into(),
            layers,
        })
    }

    /// A built-in profile by name (see [`ModelProfile::builtin_names`]): `resnet50` and
    /// `vgg16` are the embedded PipeDream measurements, `vgg19` is derived from `vgg16`, and
    /// `sockeye` is built from layer shapes with estimated times (see `sockeye`'s table).
    pub fn builtin(name: &str) -> Result<Self, ProfileError> {
        match name {
            "resnet50" => Self::parse(name, RESNET50_GRAPH),
            "vgg16" => Self::parse(name, VGG16_GRAPH),
            "vgg19" => vgg19(),
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

    /// The parameter tensors ("keys"): one per layer with parameters, numbered from the
    /// input, as (layer index, param_count).
    pub fn keys(&self) -> Vec<(usize, usize)> {
        let with_params = self
            .layers
            .iter()
            .enumerate()
            .filter(|(_, l)| l.param_count > 0);
        with_params.map(|(i, l)| (i, l.param_count)).collect()
    }

    /// Same profile with every layer's parameter count divided by `factor` (rounded up, at
    /// least 1 for layers that had parameters); compute times and names unchanged. For
    /// `--scale 1/16`. Error if `factor` < 1 or not finite.
    pub fn scaled(&self, factor: f64) -> Result<Self, ProfileError> {
        if !factor.is_finite() || factor < 1.0 {
            return Err(ProfileError::BadScale(factor));
        }
        let mut out = self.clone();
        for l in out.layers.iter_mut().filter(|l| l.param_count > 0) {
            l.param_count =
                ((l.param_count as f64 / factor).ceil() as usize).clamp(1, l.param_count);
        }
        Ok(out)
    }

    /// A stable 64-bit fingerprint (FNV-1a) of the layers: names, ops, times and parameter
    /// counts, in order. The model name is not included.
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
        }
    });
    ModelProfile {
        name: "sockeye".into(),
        layers: layers.collect(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// Whether `ns` is within `tol` milliseconds of `want_ms`.
    fn near(ns: u64, want_ms: f64, tol: f64) -> bool {
        (ns as f64 / 1e6 - want_ms).abs() < tol
    }

    fn names(p: &ModelProfile) -> Vec<&str> {
        p.layers.iter().map(|l| l.name.as_str()).collect()
    }

    /// Checks `name`'s (params, forward ms without `Input`, with it, backward ms) against
    /// SOURCE.md (whose forward totals leave out the `Input` node) and that every edge of
    /// `text` goes forward in the layer order. Returns the ops of the keys' layers.
    fn check(
        name: &str,
        text: &str,
        (params, fwd, fwd_all, bwd): (usize, f64, f64, f64),
    ) -> Vec<String> {
        let p = ModelProfile::builtin(name).unwrap();
        assert_eq!(
            (p.param_count(), p.layers[0].op.as_str()),
            (params, "Input")
        );
        let compute: u64 = p
            .layers
            .iter()
            .filter(|l| l.op != "Input")
            .map(|l| l.forward_ns)
            .sum();
        assert!(
            near(compute, fwd, 0.1),
            "{name}: forward without Input {compute} ns"
        );
        assert!(
            near(p.forward_ns(), fwd_all, 1e-6),
            "{name}: forward {} ns",
            p.forward_ns()
        );
        assert!(
            near(p.backward_ns(), bwd, 0.1),
            "{name}: backward {} ns",
            p.backward_ns()
        );
        let pos: HashMap<&str, usize> = names(&p).into_iter().zip(0..).collect();
        let edges = text.lines().filter(|l| l.starts_with('\t'));
        let edges: Vec<_> = edges.filter_map(|l| l.trim().split_once(" -- ")).collect();
        assert!(!edges.is_empty());
        for (a, b) in edges {
            assert!(pos[a] < pos[b], "{name}: edge {a} -> {b} goes backward");
        }
        assert_eq!(p.keys().iter().map(|k| k.1).sum::<usize>(), params);
        p.keys()
            .iter()
            .map(|&(i, _)| p.layers[i].op.clone())
            .collect()
    }

    #[test]
    fn resnet50_totals_and_order() {
        let ops = check(
            "resnet50",
            RESNET50_GRAPH,
            (25_557_032, 182.5, 201.450, 260.9),
        );
        assert!(
            ops[0].starts_with("Conv2d(3, 64, kernel_size=(7, 7)"),
            "{}",
            ops[0]
        );
        assert!(ops[ops.len() - 1].starts_with("Linear(in_features=2048, out_features=1000"));
    }

    #[test]
    fn vgg16_totals_and_order() {
        let ops = check("vgg16", VGG16_GRAPH, (138_357_544, 233.9, 251.874, 438.6));
        assert_eq!(ops.len(), 16);
        assert!(ops[0].starts_with("Conv2d(3, 64"));
        assert!(ops[15].starts_with("Linear(in_features=4096, out_features=1000"));
        let p = ModelProfile::builtin("vgg16").unwrap();
        assert_eq!(names(&p)[..4], ["node1", "node2", "node3", "node4"]);
        assert_eq!(names(&p)[31..35], ["node32", "node33", "node34", "node35"]);
    }

    #[test]
    fn vgg19_derived() {
        let v16 = ModelProfile::builtin("vgg16").unwrap();
        let v19 = ModelProfile::builtin("vgg19").unwrap();
        assert_eq!(v19.param_count(), 143_667_240);
        assert_eq!(
            (v19.layers.len(), v19.keys().len()),
            (v16.layers.len() + 6, 19)
        );
        let fc6 = v19
            .layers
            .iter()
            .find(|l| l.op.starts_with("Linear(in_features=25088"));
        assert_eq!(fc6.map(|l| l.param_count), Some(102_764_544));
        let i = names(&v19)
            .iter()
            .position(|&n| n == "node16_copy")
            .unwrap();
        assert_eq!(
            names(&v19)[i - 1..i + 2],
            ["node17", "node16_copy", "node17_copy"]
        );
        assert!(v19.layers[i + 2].op.starts_with("MaxPool2d"));
        assert_eq!(v19.layers[i].param_count, 590_080);
        assert_ne!(v16.fingerprint(), v19.fingerprint());
    }

    #[test]
    fn sockeye_shapes_and_builtins() {
        let p = ModelProfile::builtin("sockeye").unwrap();
        assert_eq!(p.param_count(), 27_202_586);
        let counts: Vec<usize> = p.layers.iter().map(|l| l.param_count).collect();
        let table = [
            8_800_256, 2_101_248, 2_101_248, 3_945_472, 3_149_824, 2_101_248,
        ];
        assert_eq!(
            counts,
            [&table[..], &[525_312, 524_800, 3_953_178]].concat()
        );
        assert!(near(p.forward_ns(), 9.25, 0.01) && near(p.backward_ns(), 18.5, 0.02));
        for name in ModelProfile::builtin_names() {
            assert_eq!(&ModelProfile::builtin(name).unwrap().name, name);
        }
        let e = ModelProfile::builtin("alexnet").unwrap_err().to_string();
        assert!(
            e.contains("'alexnet'") && e.contains("resnet50, vgg16, vgg19, sockeye"),
            "{e}"
        );
    }

    const M: &str = "forward_compute_time=1.5, backward_compute_time=2, parameter_size=16.0";

    #[test]
    fn parse_small_graph_and_errors() {
        let text = format!(
            "node3 -- ReLU -- {M}\nnode1 -- In -- {M}\nnode2 -- X(a -- b) -- {M}\n\tnode1 -- node2"
        );
        let p = ModelProfile::parse("t", &text).unwrap();
        assert_eq!(
            (names(&p), p.layers[1].op.as_str()),
            (vec!["node1", "node2", "node3"], "X(a -- b)")
        );
        let l = &p.layers[0];
        assert_eq!(
            (l.forward_ns, l.backward_ns, l.param_count),
            (1_500_000, 2_000_000, 4)
        );
        use ProfileError as E;
        let cycle =
            format!("node1 -- A -- {M}\nnode2 -- B -- {M}\n\tnode1 -- node2\n\tnode2 -- node1");
        let cases = [
            (String::new(), E::NoNodes),
            ("\n  \n".into(), E::NoNodes),
            (
                format!("node0 -- In -- {M}\nn -- A -- forward_compute_time=x1"),
                E::BadNumber(2, "forward_compute_time".into(), "x1".into()),
            ),
            (
                "n -- A -- parameter_size=4.5".into(),
                E::BadNumber(1, "parameter_size".into(), "4.5".into()),
            ),
            (
                "n -- A -- backward_compute_time=-1".into(),
                E::BadNumber(1, "backward_compute_time".into(), "-1".into()),
            ),
            (
                format!("node1 -- In -- {M}\n\tnode1 -- node9"),
                E::UnknownNode(2, "node9".into()),
            ),
            (cycle, E::Cycle(1, "node1".into())),
            (
                "n -- A -- forward_compute_time=1, parameter_size=0".into(),
                E::MissingField(1, "backward_compute_time"),
            ),
            (
                "n -- A -- forward_compute_time=1, backward_compute_time=1, parameter_size=6"
                    .into(),
                E::ParamBytes(1, 6),
            ),
            (
                format!("node1 -- A -- {M}\nnode1 -- B -- {M}"),
                E::DuplicateNode(2, "node1".into()),
            ),
            (
                "node1 -- A".into(),
                E::Malformed(1, "expected `name -- op -- metrics`".into()),
            ),
        ];
        for (text, want) in cases {
            assert_eq!(ModelProfile::parse("t", &text), Err(want), "{text:?}");
        }
        let e = ModelProfile::parse("t", &format!("node1 -- In -- {M}\n\tnode1 -- x")).unwrap_err();
        assert_eq!(e.to_string(), "line 2: edge to unknown node 'x'");
    }

    #[test]
    fn scaled_divides_counts_and_keeps_times() {
        let p = ModelProfile::builtin("vgg16").unwrap();
        let s = p.scaled(16.0).unwrap();
        for (a, b) in p.layers.iter().zip(&s.layers) {
            assert_eq!(b.param_count, a.param_count.div_ceil(16));
            assert_eq!(
                (a.forward_ns, a.backward_ns, &a.name),
                (b.forward_ns, b.backward_ns, &b.name)
            );
        }
        assert_eq!(
            (s.keys().len(), p.scaled(1.0).unwrap()),
            (p.keys().len(), p.clone())
        );
        let tiny = ModelProfile::parse("t", &format!("n -- A -- {M}"))
            .unwrap()
            .scaled(1e9)
            .unwrap();
        assert_eq!(tiny.layers[0].param_count, 1);
        for f in [0.5, 0.0, -1.0, f64::NAN, f64::INFINITY] {
            assert!(p.scaled(f).is_err(), "{f}");
        }
    }

    #[test]
    fn fingerprint_stable() {
        let a = ModelProfile::parse("x", VGG16_GRAPH).unwrap();
        assert_eq!(
            a.fingerprint(),
            ModelProfile::parse("y", VGG16_GRAPH).unwrap().fingerprint()
        );
        assert_ne!(a.fingerprint(), a.scaled(2.0).unwrap().fingerprint());
        assert_ne!(
            a.fingerprint(),
            ModelProfile::builtin("resnet50").unwrap().fingerprint()
        );
    }

    proptest! {
        #[test]
        fn parse_never_panics(
            any_text in any::<String>(),
            parts in prop::collection::vec(prop_oneof![
                Just("node1"), Just("node2"), Just("node18446744073709551616"), Just(" -- "), Just("\t"),
                Just("\n"), Just("="), Just(", "), Just("forward_compute_time"), Just("backward_compute_time"),
                Just("parameter_size"), Just("1e300"), Just("4.0"), Just("-1"), Just("NaN"), Just("é"),
            ], 0..40),
        ) {
            let _ = ModelProfile::parse("p", &any_text);
            let _ = ModelProfile::parse("p", &parts.concat());
        }
    }
}
