//! Frame MACs are on in every process of a job unless `--no-frame-mac` is given, and the
//! choice reaches the processes `launch` starts.

use clap::Parser;

use super::JobArgs;

#[derive(Parser)]
struct Launch {
    #[command(flatten)]
    job: JobArgs,
}

/// The job `launch` resolves from `flags`, as its children receive it (encoded and decoded).
fn handed_job(flags: &[&str]) -> anyhow::Result<JobArgs> {
    let job = Launch::try_parse_from(["launch"].iter().chain(flags))?.job;
    let encoded = serde_json::to_string(&job)?;
    Ok(serde_json::from_str(&encoded)?)
}

/// Whether a process given `flags` tags and checks its frames.
fn frame_macs(flags: &[&str]) -> anyhow::Result<bool> {
    Ok(handed_job(flags)?.comm_options()?.frame_mac)
}

#[test]
fn frame_macs_are_on_by_default() {
    assert!(frame_macs(&[]).unwrap());
    assert!(frame_macs(&["--strategy", "p3", "--servers", "2"]).unwrap());
}

#[test]
fn no_frame_mac_turns_them_off() {
    assert!(!frame_macs(&["--no-frame-mac"]).unwrap());
}

#[test]
fn frame_mac_is_still_accepted_and_contradicting_it_is_refused() {
    assert!(frame_macs(&["--frame-mac"]).unwrap());
    let both = frame_macs(&["--frame-mac", "--no-frame-mac"]).unwrap_err();
    assert!(both.to_string().contains("cannot be used with"), "{both}");
}
