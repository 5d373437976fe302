use super::*;
use crate::auth::JobToken;

fn token(byte: &str) -> JobToken {
    JobToken::from_hex(&byte.repeat(32)).unwrap()
}

fn settings(pairs: &[(&str, &str)]) -> WeightSettings {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

fn job_with(workers: usize, servers: usize, pairs: &[(&str, &str)]) -> JobIdentity {
    JobIdentity::new(
        "lenet",
        7,
        "ps",
        (workers, servers),
        &token("ab"),
        settings(pairs),
    )
}

fn job(workers: usize) -> JobIdentity {
    job_with(workers, 1, &[("--batch-size", "64"), ("--seed", "42")])
}

fn write_one(dir: &Path, step: u64, job: &JobIdentity, rank: usize) {
    let state = format!("{step}/{rank}");
    let record = format!("record {step}/{rank}");
    let written = ProcessState {
        state: state.as_bytes(),
        record: (rank == 0).then_some(record.as_bytes()),
    };
    write(dir, step, rank, job, written).unwrap();
}

fn write_all(dir: &Path, step: u64, job: &JobIdentity, ranks: std::ops::Range<usize>) {
    for rank in ranks {
        write_one(dir, step, job, rank);
    }
}

#[test]
fn the_newest_step_every_rank_completed_is_chosen() {
    let dir = tempfile::tempdir().unwrap();
    let j = job(2);
    write_all(dir.path(), 10, &j, 0..3);
    write_all(dir.path(), 20, &j, 0..2); // the server was killed before step 20
    let p = newest_complete(dir.path(), &j).unwrap();
    assert_eq!(p.step, 10);
    assert_eq!(newest_complete_any(dir.path()), Some(10));
    assert_eq!(p.read_state(2).unwrap(), b"10/2");
    assert_eq!(p.read_record(0).unwrap().unwrap(), b"record 10/0");
    assert_eq!(p.read_record(1).unwrap(), None);
    write_all(dir.path(), 20, &j, 2..3);
    assert_eq!(newest_complete(dir.path(), &j).unwrap().step, 20);
    std::fs::write(step_dir(dir.path(), 20).join(record_name(0)), b"x").unwrap();
    let p = newest_complete(dir.path(), &j).unwrap();
    assert_eq!(p.step, 10, "a corrupt record");
}

#[test]
fn a_corrupt_or_truncated_state_is_passed_over() {
    let dir = tempfile::tempdir().unwrap();
    let j = job(2);
    write_all(dir.path(), 10, &j, 0..3);
    write_all(dir.path(), 20, &j, 0..3);
    std::fs::write(step_dir(dir.path(), 20).join(state_name(1)), b"20/").unwrap();
    let p = newest_complete(dir.path(), &j).unwrap();
    assert_eq!(p.step, 10);
}

#[test]
fn ranks_in_step_keep_the_two_newest_complete_steps() {
    let dir = tempfile::tempdir().unwrap();
    let j = job(2);
    for step in [10, 20, 30, 40] {
        write_all(dir.path(), step, &j, 0..3);
    }
    // Ranks 0 and 1 wrote step 40 while 20 and 30 were the complete ones.
    assert_eq!(steps_in(dir.path()).unwrap(), vec![40, 30, 20]);
    assert_eq!(written_by_all(dir.path(), &j).unwrap(), vec![40, 30]);
    std::fs::write(step_dir(dir.path(), 40).join(state_name(2)), b"4").unwrap();
    assert_eq!(newest_complete(dir.path(), &j).unwrap().step, 30);
}

/// Four step-wise averaging workers, worker 3 a straggler: all four checkpoint steps 4 and
/// 5, then workers 0 to 2 run on to step 9 while worker 3 is still in step 6. Keeping each
/// rank's last two steps would leave steps 8 and 9 to workers 0-2 and 4 and 5 to worker 3,
/// then 5 and 6 once it writes step 6: no step complete. Step 5 must stay until newer
/// steps are complete.
#[test]
fn drifting_ranks_never_lose_the_newest_complete_step() {
    let dir = tempfile::tempdir().unwrap();
    let j = job_with(4, 0, &[]);
    write_all(dir.path(), 4, &j, 0..4);
    write_all(dir.path(), 5, &j, 0..4);
    for step in 6..=9 {
        write_all(dir.path(), step, &j, 0..3);
    }
    assert_eq!(newest_complete(dir.path(), &j).unwrap().step, 5);
    assert_eq!(newest_complete_any(dir.path()), Some(5));
    assert_eq!(steps_in(dir.path()).unwrap(), vec![9, 8, 7, 6, 5, 4]);
    // The straggler completes step 6: step 5 is still the spare, its own step 4 goes.
    write_one(dir.path(), 6, &j, 3);
    assert_eq!(newest_complete(dir.path(), &j).unwrap().step, 6);
    assert!(!step_dir(dir.path(), 4).join(manifest_name(3)).exists());
    assert!(step_dir(dir.path(), 5).join(manifest_name(3)).exists());
    // Step 7 complete: the next checkpoint of worker 0 drops its step 5, never step 6.
    write_one(dir.path(), 7, &j, 3);
    write_one(dir.path(), 10, &j, 0);
    assert!(!step_dir(dir.path(), 5).join(manifest_name(0)).exists());
    assert!(step_dir(dir.path(), 6).join(manifest_name(0)).exists());
    assert_eq!(newest_complete(dir.path(), &j).unwrap().step, 7);
}

#[test]
fn another_jobs_checkpoint_is_refused_naming_every_difference() {
    let dir = tempfile::tempdir().unwrap();
    write_all(dir.path(), 10, &job(2), 0..3);
    let other = job_with(
        3,
        1,
        &[
            ("--batch-size", "32"),
            ("--seed", "42"),
            ("plan.slice_params", "1001"),
        ],
    );
    let err = newest_complete(dir.path(), &other).unwrap_err().to_string();
    for said in [
        "worker count was 2 there and is 3 here",
        "--batch-size was 64 there and is 32 here",
        "plan.slice_params was (not set) there and is 1001 here",
    ] {
        assert!(err.contains(said), "{said:?} missing from: {err}");
    }
    assert!(!err.contains("--seed"), "{err}");
    let j = JobIdentity::new("lenet", 7, "ps", (2, 1), &token("cd"), job(2).settings);
    let err = newest_complete(dir.path(), &j).unwrap_err().to_string();
    assert!(
        err.contains("it was written under another job token"),
        "{err}"
    );
    assert!(!err.contains("this job's is"), "{err}");
    assert!(!err.contains(&"ab".repeat(32)), "the token leaks: {err}");
}

#[test]
fn identities_that_agree_have_no_differences() {
    assert!(job(2).differences(&job(2)).is_empty());
    let d = job(2).differences(&job_with(2, 1, &[("--batch-size", "64")]));
    assert_eq!(
        d,
        vec![Difference {
            field: "--seed".into(),
            found: "(not set)".into(),
            want: "42".into(),
        }]
    );
}

#[test]
fn settings_of_a_structure_name_each_leaf() {
    #[derive(Serialize)]
    struct Inner {
        bound: f64,
        on: bool,
    }
    #[derive(Serialize)]
    struct Outer {
        slice_params: usize,
        name: &'static str,
        skipped: u8,
        dlcp: Inner,
    }
    let value = Outer {
        slice_params: 1000,
        name: "fifo",
        skipped: 1,
        dlcp: Inner {
            bound: 0.1,
            on: true,
        },
    };
    let got = settings_of("plan", &value, &["skipped"]);
    let want = settings(&[
        ("plan.slice_params", "1000"),
        ("plan.name", "fifo"),
        ("plan.dlcp.bound", "0.1"),
        ("plan.dlcp.on", "true"),
    ]);
    assert_eq!(got, want);
}

/// Rewrites rank 1's state of step 10 with `state` and its manifest's MAC with one
/// computed under `key_of`'s key (its identity otherwise the checkpoint's).
fn forge(dir: &Path, state: &[u8], key_of: &JobIdentity) {
    let at = step_dir(dir, 10);
    std::fs::write(at.join(state_name(1)), state).unwrap();
    let path = at.join(manifest_name(1));
    let mut manifest: Manifest = toml::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    let mut signer = manifest.job.clone();
    signer.key = key_of.key.clone();
    manifest.mac = file_mac(&signer, "state", 10, 1, state);
    manifest.manifest_mac = Some(manifest.mac(&signer));
    std::fs::write(&path, toml::to_string(&manifest).unwrap()).unwrap();
}

#[test]
fn a_state_edited_and_resigned_without_the_token_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let j = job(2);
    write_all(dir.path(), 10, &j, 0..3);
    let stranger = JobIdentity::new("lenet", 7, "ps", (2, 1), &token("cd"), j.settings.clone());
    std::fs::write(step_dir(dir.path(), 10).join(state_name(1)), b"forged").unwrap();
    let err = newest_complete(dir.path(), &j).unwrap_err().to_string();
    assert!(
        err.contains("rank 1's state is missing or fails its MAC"),
        "{err}"
    );
    forge(dir.path(), b"forged", &stranger);
    let err = newest_complete(dir.path(), &j).unwrap_err().to_string();
    assert!(err.contains("was altered"), "{err}");
    // The same edit under the job's own key is taken: the MAC is what refused it.
    forge(dir.path(), b"forged", &j);
    let p = newest_complete(dir.path(), &j).unwrap();
    assert_eq!(p.read_state(1).unwrap(), b"forged");
}

#[test]
fn a_manifest_of_an_earlier_format_is_refused_saying_so() {
    let dir = tempfile::tempdir().unwrap();
    let at = step_dir(dir.path(), 10);
    std::fs::create_dir_all(&at).unwrap();
    let old = "step = 10\nrank = 0\nfile = \"rank-0.safetensors\"\nsha256 = \"00\"\n\n\
               [job]\nmodel = \"lenet\"\nfingerprint = \"0000000000000007\"\nstrategy = \"ps\"\n\
               workers = 1\nservers = 0\ntoken = \"00\"\n";
    std::fs::write(at.join(manifest_name(0)), old).unwrap();
    std::fs::write(at.join(state_name(0)), b"x").unwrap();
    let err = newest_complete(dir.path(), &job_with(1, 0, &[]))
        .unwrap_err()
        .to_string();
    assert!(err.contains("earlier version"), "{err}");
    assert_eq!(newest_complete_any(dir.path()), None);
}

#[test]
fn an_empty_folder_says_so() {
    let dir = tempfile::tempdir().unwrap();
    let err = newest_complete(dir.path(), &job(2))
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("no complete checkpoint") && err.contains("no step-"),
        "{err}"
    );
    assert_eq!(newest_complete_any(dir.path()), None);
    let err = newest_complete(&dir.path().join("nope"), &job(2)).unwrap_err();
    assert!(err.to_string().contains("nope"), "{err}");
}

/// The identity of `job(2)` under run id `run` (same token, same settings).
fn run_of(run: &str) -> JobIdentity {
    job(2).with_run(run)
}

/// The sequence in one folder: a job ran to its end (steps 35 and 40 kept), then
/// another job under the same token wrote steps 5, 10 and 15. Pruning counts only its own
/// steps, so all of them stay, and so do the first job's.
#[test]
fn pruning_counts_only_this_runs_steps() {
    let dir = tempfile::tempdir().unwrap();
    let (first, second) = (run_of("aaaa"), run_of("bbbb"));
    for step in [35, 40] {
        write_all(dir.path(), step, &first, 0..3);
    }
    for step in [5, 10, 15] {
        write_all(dir.path(), step, &second, 0..3);
    }
    // Each rank prunes its own files as it writes: the other job's steps all stay, and so
    // do this run's two newest complete ones.
    let kept = steps_in(dir.path()).unwrap();
    for step in [40, 35, 15, 10] {
        assert!(kept.contains(&step), "step {step} lost: {kept:?}");
    }
    write_all(dir.path(), 20, &second, 0..3);
    let kept = steps_in(dir.path()).unwrap();
    for step in [40, 35, 20, 15] {
        assert!(kept.contains(&step), "step {step} lost: {kept:?}");
    }
    assert!(
        !kept.contains(&5),
        "step 5 outlived two newer complete steps: {kept:?}"
    );
    let newest = |run: &str| newest_complete(dir.path(), &run_of(run)).unwrap();
    assert_eq!(
        newest("cccc").run(),
        "aaaa",
        "the newest step is the first run's"
    );
    std::fs::remove_dir_all(step_dir(dir.path(), 40)).unwrap();
    std::fs::remove_dir_all(step_dir(dir.path(), 35)).unwrap();
    let p = newest("cccc");
    assert_eq!(
        (p.step, p.run()),
        (20, "bbbb"),
        "a resume goes on under its run"
    );
    assert_eq!(p.read_state(1).unwrap(), b"20/1");
}

#[test]
fn a_fresh_job_refuses_a_used_folder_unless_told_to_replace_it() {
    let dir = tempfile::tempdir().unwrap();
    claim_fresh(&dir.path().join("new"), false).unwrap();
    claim_fresh(dir.path(), false).unwrap();
    write_all(dir.path(), 35, &job(2), 0..3);
    write_all(dir.path(), 40, &job(2), 0..3);
    std::fs::write(dir.path().join("job.token"), "x").unwrap();
    let err = claim_fresh(dir.path(), false).unwrap_err().to_string();
    for said in ["step-00000035", "step-00000040", "--replace-checkpoints"] {
        assert!(err.contains(said), "{said:?} missing from: {err}");
    }
    claim_fresh(dir.path(), true).unwrap();
    assert!(steps_in(dir.path()).unwrap().is_empty());
    assert!(dir.path().join("job.token").exists());
}

/// An edit of a manifest's text, named.
type ManifestEdit = (&'static str, fn(&str) -> String);

#[test]
fn a_manifest_with_a_line_removed_or_altered_is_refused() {
    let j = job(2);
    let edits: [ManifestEdit; 4] = [
        ("record_mac", |m| {
            m.lines()
                .filter(|l| !l.starts_with("record_mac"))
                .collect::<Vec<_>>()
                .join("\n")
        }),
        ("manifest_mac", |m| {
            m.lines()
                .filter(|l| !l.starts_with("manifest_mac"))
                .collect::<Vec<_>>()
                .join("\n")
        }),
        ("run", |m| m.replace("run = \"", "run = \"0")),
        ("file", |m| {
            m.replace("rank-0.safetensors", "rank-0.safetensors ")
        }),
    ];
    for (what, edit) in edits {
        let dir = tempfile::tempdir().unwrap();
        write_all(dir.path(), 10, &j, 0..3);
        let path = step_dir(dir.path(), 10).join(manifest_name(0));
        let text = std::fs::read_to_string(&path).unwrap();
        let edited = edit(&text);
        assert_ne!(edited, text, "{what}: no edit");
        std::fs::write(&path, edited).unwrap();
        let err = newest_complete(dir.path(), &j).unwrap_err().to_string();
        assert!(err.contains("was altered"), "{what}: {err}");
    }
}
