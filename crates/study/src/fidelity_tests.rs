use super::*;
use crate::pairs::{collect, write_report, Paired};
use crate::run::{parts, summary_path};

const STUDY: &str = r#"
name = "fidelity"
kind = "fidelity"
steps = 8
warmup_steps = 2
batch_size = 64
workers = [4]
servers = 1
seeds = [1]
args = ["--dataset", "mnist"]
[[networks]]
label = "shallow"
bandwidth = "100mbit"
args = ["--ingress", "--queue", "48000"]
testbed = ["--queue-packets", "32"]
[[models]]
name = "lenet"
[[variants]]
label = "p3-bbr"
strategy = "p3"
testbed = ["--cc", "bbr"]
[[variants]]
label = "dlcp-10"
strategy = "dlcp"
args = ["--loss-bound", "10%", "--packet-bytes", "1388"]
testbed = ["--prio", "--", "--transport", "udp"]
[[variants]]
label = "allreduce"
strategy = "allreduce"
"#;

fn load(text: &str) -> Result<StudyConfig, String> {
    StudyConfig::parse(text).map_err(|e| format!("{e:#}"))
}

fn words(args: &[String]) -> String {
    args.join(" ")
}

#[test]
fn a_fidelity_cell_is_a_testbed_job_and_an_emulated_one() {
    let config = load(STUDY).unwrap();
    let runs = config.runs();
    assert_eq!(runs.len(), 3);
    assert_eq!(
        words(&runs[0].testbed),
        "--hosts 5 --strategy p3 --steps 8 --bottleneck 100mbit --queue-packets 32 --cc bbr \
         -- --model lenet --batch-size 64 --seed 1 --dataset mnist"
    );
    assert_eq!(
        words(&runs[1].testbed),
        "--hosts 5 --strategy dlcp --steps 8 --bottleneck 100mbit --queue-packets 32 --prio \
         -- --model lenet --batch-size 64 --seed 1 --dataset mnist --loss-bound 10% \
         --packet-bytes 1388 --transport udp"
    );
    assert!(words(&runs[2].testbed).starts_with("--hosts 4 --strategy allreduce"));
    // The emulated job: the network's flags, not the testbed's.
    let emulated = words(&runs[1].args);
    assert!(emulated.contains("--bandwidth 100mbit --dataset mnist --ingress --queue 48000"));
    assert!(
        !emulated.contains("udp") && !emulated.contains("--prio"),
        "{emulated}"
    );
    let cell = parts(config.kind, &runs[1], Path::new("runs/c"));
    assert_eq!((cell[0].command, cell[1].command), ("testbed", "launch"));
    assert_eq!(cell[0].dir, Path::new("runs/c/kernel"));
    assert_eq!(
        (cell[0].args.clone(), cell[1].args.clone()),
        (runs[1].testbed.clone(), runs[1].args.clone())
    );
    let kernel = load(&STUDY.replace("\"fidelity\"", "\"kernel\"")).unwrap();
    let cell = parts(kernel.kind, &kernel.runs()[0], Path::new("runs/c"));
    assert_eq!(
        (cell.len(), cell[0].dir.as_path()),
        (1, Path::new("runs/c"))
    );
}

#[test]
fn a_testbed_study_says_what_the_testbed_cannot_do() {
    let err = load(&STUDY.replace("servers = 1", "servers = 2")).unwrap_err();
    assert!(
        err.contains("the namespace testbed has one server host"),
        "{err}"
    );
    let err = load(&STUDY.replace(
        "bandwidth = \"100mbit\"",
        "bandwidth = \"100mbit\"\nlatency = \"5ms\"",
    ))
    .unwrap_err();
    assert!(err.contains("adds no latency"), "{err}");
    let err = load(&STUDY.replace("kind = \"fidelity\"", "kind = \"launch\"")).unwrap_err();
    assert!(
        err.contains("`testbed` flags are for kernel and fidelity studies"),
        "{err}"
    );
}

/// A job summary with worker 0's step times and a time to the target.
fn summary(steps: &[f64], to_target: Option<f64>) -> String {
    let worker = syncopate_runtime::worker::WorkerSummary {
        step_seconds: steps.to_vec(),
        ..Default::default()
    };
    serde_json::json!({"time_to_accuracy_s": to_target, "worker0": worker}).to_string()
}

#[test]
fn the_report_sets_the_emulator_against_the_kernel() {
    let config = load(STUDY).unwrap();
    let dir = tempfile::tempdir().unwrap();
    for (i, run) in config.runs().iter().enumerate() {
        let run_dir = dir.path().join("runs").join(&run.id);
        for (side, step) in [(kernel_dir(&run_dir), 0.2), (emulator_dir(&run_dir), 0.3)] {
            // The last cell's emulated job never finished.
            if i == 2 && step == 0.3 {
                continue;
            }
            std::fs::create_dir_all(&side).unwrap();
            let text = summary(&[9.0, 9.0, step, step], Some(10.0 * step));
            std::fs::write(summary_path(&side), text).unwrap();
        }
    }
    let rows: Vec<Paired<FidelityRow>> = collect(&config, dir.path()).unwrap();
    assert_eq!(rows.len(), 2);
    let figures = &rows[0].figures;
    assert_eq!(
        (figures.kernel_step_seconds, figures.emulator_step_seconds),
        (0.2, 0.3)
    );
    assert!((figures.emulator_over_kernel - 1.5).abs() < 1e-12);
    write_report(&config, dir.path(), &rows).unwrap();
    let table = std::fs::read_to_string(dir.path().join("table.md")).unwrap();
    assert!(
        table.contains(
            "| lenet | p3-bbr | shallow | 4 | 0.2000 s | 0.3000 s | 1.500 | 2.0 s | 3.0 s |"
        ),
        "{table}"
    );
    let csv = std::fs::read_to_string(dir.path().join("results.csv")).unwrap();
    assert!(
        csv.starts_with("id,model,variant,network,workers,seed,kernel_step_seconds"),
        "{csv}"
    );
    assert!(row(&config, "{}", &summary(&[1.0], None)).is_err());
}
