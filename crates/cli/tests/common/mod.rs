//! Helpers shared by the integration tests that run `syncopate` as real processes.
#![allow(dead_code)] // each test file uses its own share of them

use std::path::Path;
use std::process::{Command, Output};

/// A command's stdout and stderr, for assertion messages.
pub fn text(out: &Output) -> String {
    format!(
        "{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// Runs `cmd`, asserts that it succeeded and returns its stdout and stderr.
pub fn run_ok(cmd: &mut Command) -> String {
    let out = cmd.output().unwrap();
    let text = text(&out);
    assert!(out.status.success(), "command failed:\n{text}");
    text
}

/// Every tensor of a safetensors file, by name.
pub fn read_weights(path: &Path) -> Vec<(String, Vec<f32>)> {
    let bytes = std::fs::read(path).unwrap();
    let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let mut out: Vec<(String, Vec<f32>)> = st
        .tensors()
        .into_iter()
        .map(|(name, t)| {
            let v = t
                .data()
                .chunks_exact(4)
                .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                .collect();
            (name, v)
        })
        .collect();
    out.sort_by(|a, b| a.0.cmp(&b.0));
    out
}
