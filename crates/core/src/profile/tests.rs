//! Tests of the profile parser, the built-in profiles and the Syncopate extensions.

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
    let cycle = format!("node1 -- A -- {M}\nnode2 -- B -- {M}\n\tnode1 -- node2\n\tnode2 -- node1");
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
            "n -- A -- forward_compute_time=1, backward_compute_time=1, parameter_size=6".into(),
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
            Just("#"), Just(": "), Just("batch_size"), Just("parameters"), Just("parameter_tensors"),
            Just(";"), Just("0"),
        ], 0..40),
    ) {
        let _ = ModelProfile::parse("p", &any_text);
        let _ = ModelProfile::parse("p", &parts.concat());
    }

    #[test]
    fn graph_text_round_trips(
        layers in prop::collection::vec(
            (0u64..1u64 << 50, 0u64..1u64 << 50, prop::collection::vec(1usize..1 << 20, 0..4)),
            1..12,
        ),
        batch_size in prop::option::of(1usize..4096),
    ) {
        let layers = layers.into_iter().enumerate().map(|(i, (fwd, bwd, tensors))| {
            LayerProfile {
                name: format!("layer{}.conv{i}", 12 - i),
                op: format!("Op({i} -- x)"),
                forward_ns: fwd,
                backward_ns: bwd,
                param_count: tensors.iter().sum(),
                // One tensor is written without sizes and read back as an empty list.
                tensors: if tensors.len() > 1 { tensors } else { Vec::new() },
            }
        });
        let p = ModelProfile { name: "m".into(), layers: layers.collect(), batch_size };
        prop_assert_eq!(ModelProfile::parse("m", &p.to_graph_text()), Ok(p));
    }
}

/// A profile as the PyTorch profiler writes it: headers, module names as node names, tensor
/// sizes, edges that order the nodes against their names' numbers.
const TORCH: &str = "# model: ResNet20 (syncopate.torch.profile)
# batch_size: 32
# parameters: 488

conv1 -- Conv2d(3, 16) -- forward_compute_time=0.5, backward_compute_time=1.25, parameter_size=1728, parameter_tensors=432
relu -- ReLU() -- forward_compute_time=0.125, backward_compute_time=0, parameter_size=0
fc2 -- Linear(in_features=3, out_features=14) -- forward_compute_time=0.001, backward_compute_time=0.002, parameter_size=224, parameter_tensors=42;14
\tconv1 -- relu
\trelu -- fc2
";

#[test]
fn parse_torch_profile_with_tensors_and_headers() {
    let p = ModelProfile::parse("resnet20", TORCH).unwrap();
    assert_eq!(names(&p), ["conv1", "relu", "fc2"]);
    assert_eq!((p.batch_size, p.param_count()), (Some(32), 488));
    assert_eq!(p.keys(), [(0, 432), (2, 42), (2, 14)]);
    assert_eq!(
        (
            p.layers[0].forward_ns,
            p.layers[0].backward_ns,
            p.layers[2].backward_ns
        ),
        (500_000, 1_250_000, 2_000)
    );
    assert!(p.layers[0].tensors.is_empty(), "a single size is no sizes");
    assert_eq!(
        ModelProfile::parse("resnet20", &p.to_graph_text()),
        Ok(p.clone())
    );
    // Tensor sizes take part in the fingerprint; a single tensor equals no sizes.
    let mut swapped = p.clone();
    swapped.layers[2].tensors.reverse();
    assert_ne!(swapped.fingerprint(), p.fingerprint());
    // Scaling divides every tensor and keeps each layer's sum.
    let s = p.scaled(10.0).unwrap();
    assert_eq!(s.keys(), [(0, 44), (2, 5), (2, 2)]);
    assert_eq!(s.layers[2].param_count, 7);
    assert_eq!(
        ModelProfile::builtin("sockeye").unwrap().batch_size,
        Some(64)
    );
    assert_eq!(
        ModelProfile::builtin("vgg19").unwrap().batch_size,
        Some(128)
    );
}

#[test]
fn malformed_torch_profiles_name_line_and_fault() {
    use ProfileError as E;
    let node = "n -- A -- forward_compute_time=1, backward_compute_time=1";
    let cases = [
        (
            format!("{node}, parameter_size=12, parameter_tensors=2;2"),
            E::Malformed(
                1,
                "parameter_tensors sum to 4 values, parameter_size holds 3".into(),
            ),
        ),
        (
            format!("#\n{node}, parameter_size=8, parameter_tensors=2;0"),
            E::BadNumber(2, "parameter_tensors".into(), "0".into()),
        ),
        (
            format!("{node}, parameter_size=8, parameter_tensors=2;x"),
            E::BadNumber(1, "parameter_tensors".into(), "x".into()),
        ),
        (
            format!("{node}, parameter_size=8, parameter_tensors=1.5;0.5"),
            E::BadNumber(1, "parameter_tensors".into(), "1.5".into()),
        ),
        (
            format!("# parameters: 3\n{node}, parameter_size=8"),
            E::Malformed(1, "header says 3 parameters, the layers hold 2".into()),
        ),
        (
            format!("# batch_size: 32\n# batch_size: 64\n{node}, parameter_size=8"),
            E::Malformed(2, "second `batch_size` header".into()),
        ),
        (
            format!("{node}, parameter_size=8\n# batch_size: -1"),
            E::BadNumber(2, "batch_size".into(), " -1".into()),
        ),
        ("# batch_size: 32\n# only comments".into(), E::NoNodes),
    ];
    for (text, want) in cases {
        assert_eq!(ModelProfile::parse("t", &text), Err(want), "{text:?}");
    }
    let e = ModelProfile::parse("t", &TORCH.replace("42;14", "42;15")).unwrap_err();
    assert_eq!(
        e.to_string(),
        "line 7: parameter_tensors sum to 57 values, parameter_size holds 56"
    );
}

#[test]
fn notes_keep_the_model_name_and_the_free_comments() {
    let text = "# model: tiny\n# batch_size: 4\n# measured on a laptop\n#plain\n\
                n1 -- A -- forward_compute_time=1, backward_compute_time=2, parameter_size=8\n";
    let (p, notes) = ModelProfile::parse_with_notes("file", text).unwrap();
    assert_eq!((p.name.as_str(), p.batch_size), ("file", Some(4)));
    assert_eq!(notes.model.as_deref(), Some("tiny"));
    assert_eq!(notes.comments, ["measured on a laptop", "plain"]);
    let e = ModelProfile::parse("x", "# parameters: 3\nn -- A -- parameter_size=8").unwrap_err();
    assert_eq!(e.line(), Some(2));
    assert_eq!(ProfileError::NoNodes.line(), None);
}
