use super::*;

const STUDY: &str = r#"
name = "t"
steps = 4
workers = [2, 4]
bandwidths = ["1gbit", "10gbit"]
scale = "1/16"
[[models]]
name = "profile:vgg19"
[[models]]
name = "lenet"
bandwidths = ["100mbit"]
[[variants]]
label = "ps (fifo)"
strategy = "ps"
[[variants]]
label = "p3"
strategy = "p3"
scheduler = "priority"
"#;

#[test]
fn expands_the_matrix() {
    let c: StudyConfig = toml::from_str(STUDY).unwrap();
    c.validate().unwrap();
    let runs = c.runs();
    assert_eq!(runs.len(), 2 * 2 * 2 + 2 * 2);
    let ids: std::collections::HashSet<_> = runs.iter().map(|r| &r.id).collect();
    assert_eq!(ids.len(), runs.len(), "run ids are unique");
    let first = &runs[0];
    assert_eq!(first.id, "profile_vgg19-ps_fifo_-1gbit-w2-s42");
    assert!(first.args.windows(2).any(|w| w == ["--scale", "1/16"]));
    assert!(first.args.windows(2).any(|w| w == ["--servers", "2"]));
    let lenet = runs.iter().find(|r| r.model == "lenet").unwrap();
    assert!(!lenet.args.iter().any(|a| a == "--scale"));
}

#[test]
fn rejects_bad_studies() {
    let bad = STUDY.replace("steps = 4", "steps = 0");
    let c: StudyConfig = toml::from_str(&bad).unwrap();
    assert!(c.validate().is_err());
    assert!(toml::from_str::<StudyConfig>(&STUDY.replace("steps = 4", "stepz = 4")).is_err());
}

#[test]
fn runs_that_would_share_a_directory_are_refused() {
    // "ps [fifo]" and "ps (fifo)" make the same file-name-safe id.
    let text = format!("{STUDY}\n[[variants]]\nlabel = \"ps [fifo]\"\nstrategy = \"ps\"\n");
    let config: StudyConfig = toml::from_str(&text).unwrap();
    let err = config.validate().unwrap_err().to_string();
    assert!(err.contains("share the directory"), "{err}");
}

/// Every study shipped in `studies/` loads and validates (names, strategies, distinct run
/// directories), so a typo there is a test failure, not a surprise an hour into a study.
#[test]
fn the_shipped_studies_are_valid() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../studies");
    let mut seen = 0;
    for entry in std::fs::read_dir(&dir).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_some_and(|e| e == "toml") {
            let config = StudyConfig::load(&path).unwrap_or_else(|e| panic!("{e:#}"));
            assert!(!config.runs().is_empty(), "{}", path.display());
            seen += 1;
        }
    }
    assert!(seen >= 5, "{seen} studies in {}", dir.display());
}

const NETWORKS: &str = r#"
name = "n"
steps = 4
workers = [4]
bandwidths = ["1gbit"]
[[networks]]
label = "wan"
bandwidth = "100mbit"
latency = "50ms"
[[networks]]
bandwidth = "10mbit"
latency = "5ms"
[[models]]
name = "lenet"
[[models]]
name = "resnet20"
networks = [{ bandwidth = "100mbit" }]
[[variants]]
label = "allreduce"
strategy = "allreduce"
steps = 8
"#;

#[test]
fn named_networks_add_a_latency_and_name_the_runs() {
    let c: StudyConfig = toml::from_str(NETWORKS).unwrap();
    c.validate().unwrap();
    let runs = c.runs();
    let names: Vec<(&str, &str, &str)> = runs
        .iter()
        .map(|r| (r.model.as_str(), r.network.as_str(), r.id.as_str()))
        .collect();
    assert_eq!(
        names,
        [
            ("lenet", "1gbit", "lenet-allreduce-1gbit-w4-s42"),
            ("lenet", "wan", "lenet-allreduce-wan-w4-s42"),
            ("lenet", "10mbit+5ms", "lenet-allreduce-10mbit_5ms-w4-s42"),
            ("resnet20", "100mbit", "resnet20-allreduce-100mbit-w4-s42"),
        ]
    );
    let wan = &runs[1];
    assert_eq!((wan.bandwidth.as_str(), wan.latency_ms), ("100mbit", 50.0));
    assert_eq!(wan.arg("--bandwidth"), Some("100mbit"));
    assert_eq!(wan.arg("--latency"), Some("50ms"));
    assert_eq!(wan.arg("--steps"), Some("8"), "the variant's own steps");
    // A plain bandwidth gives the arguments it always gave (finished runs stay valid).
    assert_eq!(runs[0].arg("--latency"), None);
    assert_eq!(runs[0].latency_ms, 0.0);
}

#[test]
fn bad_networks_and_simulated_real_models_are_refused() {
    let bad = NETWORKS.replace("latency = \"50ms\"", "latency = \"50 parsecs\"");
    let c: StudyConfig = toml::from_str(&bad).unwrap();
    let err = format!("{:#}", c.validate().unwrap_err());
    assert!(err.contains("network 'wan'"), "{err}");
    let bad = NETWORKS.replace("bandwidth = \"10mbit\"", "bandwidth = \"fast\"");
    let c: StudyConfig = toml::from_str(&bad).unwrap();
    assert!(c.validate().is_err());
    let simulated = NETWORKS.replace("steps = 4", "steps = 4\nkind = \"simulate\"");
    let c: StudyConfig = toml::from_str(&simulated).unwrap();
    let err = format!("{:#}", c.validate().unwrap_err());
    assert!(err.contains("model lenet"), "{err}");
    let c: StudyConfig = toml::from_str(
        &simulated
            .replace("name = \"lenet\"", "name = \"profile:resnet50\"")
            .replace("name = \"resnet20\"", "name = \"profile:vgg16\""),
    )
    .unwrap();
    c.validate().unwrap();
    assert_eq!(c.kind.commands(), ["simulate"]);
    // An agreement study simulates too: profiles only.
    let agreement = NETWORKS.replace("steps = 4", "steps = 4\nkind = \"agreement\"");
    let c: StudyConfig = toml::from_str(&agreement).unwrap();
    assert!(format!("{:#}", c.validate().unwrap_err()).contains("model lenet"));
    assert_eq!(c.kind.commands(), ["launch", "simulate"]);
}

#[test]
fn the_variants_alternate_seed_by_seed() {
    let c: StudyConfig = toml::from_str(&format!("seeds = [1, 2]\n{STUDY}")).unwrap();
    c.validate().unwrap();
    let runs = c.runs();
    let cell: Vec<(u64, &str)> = runs[..4]
        .iter()
        .map(|r| (r.seed, r.variant.as_str()))
        .collect();
    assert_eq!(
        cell,
        [(1, "ps (fifo)"), (1, "p3"), (2, "ps (fifo)"), (2, "p3")]
    );
}
