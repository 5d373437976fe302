//! Which runs of a study to run now: some of its variants and networks (`syncopate study
//! --variants A,B --networks X,Y`), the rest of the matrix left for later.

use anyhow::{bail, Result};

use crate::config::{RunSpec, StudyConfig};

/// The variants and networks to run (empty: all of them).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Selection {
    /// Variant labels.
    pub variants: Vec<String>,
    /// Network names.
    pub networks: Vec<String>,
}

impl Selection {
    /// Fails, naming what the study has, when a name selected is none of its variants or
    /// networks.
    pub fn check(&self, config: &StudyConfig) -> Result<()> {
        let runs = config.runs();
        let check = |what: &str, wanted: &[String], name: fn(&RunSpec) -> &str| -> Result<()> {
            let mut known: Vec<&str> = Vec::new();
            for run in &runs {
                if !known.contains(&name(run)) {
                    known.push(name(run));
                }
            }
            if let Some(w) = wanted.iter().find(|w| !known.contains(&w.as_str())) {
                bail!(
                    "the study has no {what} '{w}' (its {what}s: {})",
                    known.join(", ")
                );
            }
            Ok(())
        };
        check("variant", &self.variants, |r| &r.variant)?;
        check("network", &self.networks, |r| &r.network)
    }

    /// Whether `run` is selected.
    pub fn keeps(&self, run: &RunSpec) -> bool {
        let wanted =
            |names: &[String], name: &str| names.is_empty() || names.iter().any(|n| n == name);
        wanted(&self.variants, &run.variant) && wanted(&self.networks, &run.network)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_selection_keeps_the_runs_it_names_and_refuses_unknown_names() {
        let config = StudyConfig::parse(
            "name = \"s\"\nsteps = 2\nbandwidths = [\"1gbit\", \"10gbit\"]\n\
             [[models]]\nname = \"lenet\"\n\
             [[variants]]\nlabel = \"ps\"\nstrategy = \"ps\"\n\
             [[variants]]\nlabel = \"ring\"\nstrategy = \"allreduce\"\n",
        )
        .unwrap();
        let all = Selection::default();
        assert!(config.runs().iter().all(|r| all.keeps(r)));
        let some = Selection {
            variants: vec!["ring".into()],
            networks: vec!["10gbit".into()],
        };
        some.check(&config).unwrap();
        let kept: Vec<String> = config
            .runs()
            .into_iter()
            .filter(|r| some.keeps(r))
            .map(|r| r.id)
            .collect();
        assert_eq!(kept, ["lenet-ring-10gbit-w2-s42"]);
        let wrong = Selection {
            networks: vec!["5gbit".into()],
            ..Selection::default()
        };
        let err = format!("{:#}", wrong.check(&config).unwrap_err());
        assert!(
            err.contains("no network '5gbit' (its networks: 1gbit, 10gbit)"),
            "{err}"
        );
    }
}
