//! The README against the code: its crate map names exactly the workspace's members, and its
//! strategy table names every strategy in core's table.

use std::collections::BTreeSet;
use std::path::Path;

use syncopate_core::strategy::StrategyKind;

fn repo_file(rel: &str) -> String {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../..")
        .join(rel);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// The lines of the README section headed `## {title}`, up to the next `## ` heading.
fn section<'a>(readme: &'a str, title: &str) -> Vec<&'a str> {
    let heading = format!("## {title}");
    let mut lines = readme.lines().skip_while(|l| l.trim() != heading);
    assert!(lines.next().is_some(), "README has no section `{heading}`");
    lines.take_while(|l| !l.starts_with("## ")).collect()
}

/// The first cell of every row of the section's table (`| cell | ...`), header and rule apart.
fn first_cells<'a>(lines: &[&'a str]) -> Vec<&'a str> {
    lines
        .iter()
        .filter_map(|l| l.strip_prefix('|'))
        .filter_map(|l| l.split('|').next())
        .map(str::trim)
        .filter(|c| c.starts_with('`'))
        .collect()
}

#[test]
fn crate_map_names_exactly_the_workspace_members() {
    let manifest: toml::Value = toml::from_str(&repo_file("Cargo.toml")).unwrap();
    let members: BTreeSet<String> = manifest["workspace"]["members"]
        .as_array()
        .expect("[workspace] members")
        .iter()
        .map(|m| m.as_str().unwrap().trim_end_matches('/').to_string())
        .collect();
    let readme = repo_file("README.md");
    let mapped: BTreeSet<String> = first_cells(&section(&readme, "The crates"))
        .into_iter()
        .map(|c| c.trim_matches('`').trim_end_matches('/').to_string())
        .collect();
    for m in &mapped {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..").join(m);
        assert!(
            dir.join("Cargo.toml").is_file(),
            "the README's crate map names {m}, which is no crate"
        );
    }
    let missing: Vec<_> = members.difference(&mapped).collect();
    let extra: Vec<_> = mapped.difference(&members).collect();
    assert!(
        missing.is_empty(),
        "workspace members missing from the README's crate map: {missing:?}"
    );
    assert!(
        extra.is_empty(),
        "the README's crate map names non-members: {extra:?}"
    );
}

#[test]
fn strategy_table_names_every_strategy() {
    let readme = repo_file("README.md");
    let listed: BTreeSet<&str> = first_cells(&section(&readme, "Strategies"))
        .into_iter()
        .map(|c| c.trim_matches('`'))
        .collect();
    let missing: Vec<&str> = StrategyKind::ALL
        .iter()
        .map(|s| s.name())
        .filter(|n| !listed.contains(n))
        .collect();
    assert!(
        missing.is_empty(),
        "strategies missing from the README's strategy table: {missing:?}"
    );
}
