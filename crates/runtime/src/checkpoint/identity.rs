//! What a checkpoint must agree on with the job that resumes it: the job's identity (model,
//! strategy, processes, token and every setting that changes the weights), how two
//! identities differ, and the key under which a job's checkpoint files are authenticated.

use std::collections::BTreeMap;

use hmac::{Hmac, Mac};
use serde::{Deserialize, Serialize};
use sha2::Sha256;

use crate::auth::JobToken;

type HmacSha256 = Hmac<Sha256>;

/// The settings of a job that change the bits of its weights, besides those its identity
/// names by themselves: `name -> value`, for instance `--batch-size -> 64` or
/// `plan.slice_params -> 40000`.
pub type WeightSettings = BTreeMap<String, String>;

/// What a checkpoint must agree on with the job that resumes it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct JobIdentity {
    /// The model's name.
    pub model: String,
    /// The model's fingerprint (layers and shapes), hex.
    pub fingerprint: String,
    /// The strategy's name.
    pub strategy: String,
    /// Worker processes.
    pub workers: usize,
    /// Server processes.
    pub servers: usize,
    /// A keyed digest of the job token (never the token itself), hex.
    pub token: String,
    /// The run's id, hex: made afresh when a job starts from nothing, adopted from the
    /// checkpoint by every resume, so that the step folders of two jobs sharing a folder
    /// (and even a token and settings) are told apart. Not a setting: a resume never
    /// compares it.
    pub run: String,
    /// Every other setting that changes the weights (slicing, buckets, batch size,
    /// learning-rate schedule, seed, loss bounds, ...).
    pub settings: WeightSettings,
    /// The key of this job's checkpoint MACs (derived from the token; never written).
    #[serde(skip)]
    pub(super) key: MacKey,
}

/// One way in which a checkpoint's job differs from the job that would resume it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Difference {
    /// The setting.
    pub field: String,
    /// The checkpoint's value.
    pub found: String,
    /// This job's value.
    pub want: String,
}

impl std::fmt::Display for Difference {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.field == TOKEN_FIELD {
            return f.write_str(
                "it was written under another job token (give that job's --token or \
                 --token-file, or resume from the folder holding its job.token)",
            );
        }
        write!(
            f,
            "{} was {} there and is {} here",
            self.field, self.found, self.want
        )
    }
}

/// The [`Difference::field`] of a checkpoint written under another token.
const TOKEN_FIELD: &str = "job token";

impl JobIdentity {
    /// The identity of a job of `model` (with `fingerprint`) run by `strategy` over
    /// `workers` and `servers` processes under `token`, with the other `settings` that
    /// change its weights.
    pub fn new(
        model: &str,
        fingerprint: u64,
        strategy: &str,
        (workers, servers): (usize, usize),
        token: &JobToken,
        settings: WeightSettings,
    ) -> Self {
        Self {
            model: model.to_string(),
            fingerprint: format!("{fingerprint:016x}"),
            strategy: strategy.to_string(),
            workers,
            servers,
            token: token_digest(token),
            run: run_of(token),
            settings,
            key: MacKey::of(token),
        }
    }

    /// This identity with the run id `run` (see [`JobIdentity::run`]).
    pub fn with_run(self, run: &str) -> Self {
        Self {
            run: run.to_string(),
            ..self
        }
    }

    /// Whether a checkpoint of `other` was written by this very run: the same settings,
    /// token and run id.
    pub fn same_run(&self, other: &JobIdentity) -> bool {
        self.run == other.run && self.differences(other).is_empty()
    }

    /// Every field in which `other` (a checkpoint's) differs from this identity, in a fixed
    /// order; empty when they agree. The token's difference never shows either token.
    pub fn differences(&self, other: &JobIdentity) -> Vec<Difference> {
        let mut fields = vec![
            ("model", other.model.clone(), self.model.clone()),
            (
                "model fingerprint",
                other.fingerprint.clone(),
                self.fingerprint.clone(),
            ),
            ("strategy", other.strategy.clone(), self.strategy.clone()),
            (
                "worker count",
                other.workers.to_string(),
                self.workers.to_string(),
            ),
            (
                "server count",
                other.servers.to_string(),
                self.servers.to_string(),
            ),
        ];
        if other.token != self.token {
            fields.push((TOKEN_FIELD, "another".into(), "this job's".into()));
        }
        let mut found: Vec<Difference> = fields
            .into_iter()
            .filter(|(_, a, b)| a != b)
            .map(|(field, found, want)| Difference {
                field: field.to_string(),
                found,
                want,
            })
            .collect();
        let names: std::collections::BTreeSet<&String> =
            self.settings.keys().chain(other.settings.keys()).collect();
        let unset = || "(not set)".to_string();
        for name in names {
            let (theirs, ours) = (other.settings.get(name), self.settings.get(name));
            if theirs != ours {
                found.push(Difference {
                    field: name.clone(),
                    found: theirs.cloned().unwrap_or_else(unset),
                    want: ours.cloned().unwrap_or_else(unset),
                });
            }
        }
        found
    }
}

/// `value`'s serialised fields as settings named `prefix.field` (nested fields joined with
/// dots), each value in compact JSON (strings without quotes), leaving out the fields
/// named in `skip`.
pub fn settings_of(prefix: &str, value: &impl Serialize, skip: &[&str]) -> WeightSettings {
    let mut out = WeightSettings::new();
    match serde_json::to_value(value) {
        Ok(v) => flatten(prefix, &v, skip, &mut out),
        Err(e) => {
            out.insert(prefix.to_string(), format!("(unencodable: {e})"));
        }
    }
    out
}

fn flatten(name: &str, value: &serde_json::Value, skip: &[&str], out: &mut WeightSettings) {
    match value {
        serde_json::Value::Object(fields) => {
            for (field, v) in fields.iter().filter(|(f, _)| !skip.contains(&f.as_str())) {
                flatten(&format!("{name}.{field}"), v, skip, out);
            }
        }
        serde_json::Value::String(s) => {
            out.insert(name.to_string(), s.clone());
        }
        other => {
            out.insert(name.to_string(), other.to_string());
        }
    }
}

/// A fresh run id (see [`JobIdentity::run`]): 16 random hex digits.
pub fn new_run_id() -> String {
    use rand::RngCore;
    let mut bytes = [0u8; 8];
    rand::rngs::OsRng.fill_bytes(&mut bytes);
    hex::encode(bytes)
}

/// The run id of a job started without one (not by `launch`): derived from its token, so
/// that every process of the job names the same run.
fn run_of(token: &JobToken) -> String {
    hex::encode(&keyed(token, b"syncopate-v1 checkpoint run")[..8])
}

/// HMAC-SHA256(token, label): tells tokens apart without revealing them.
fn token_digest(token: &JobToken) -> String {
    hex::encode(&keyed(token, b"syncopate-v1 checkpoint token")[..16])
}

fn keyed(token: &JobToken, label: &[u8]) -> [u8; 32] {
    let mut mac = match HmacSha256::new_from_slice(token.to_hex().as_bytes()) {
        Ok(mac) => mac,
        Err(_) => return [0; 32], // HMAC takes keys of any length
    };
    mac.update(label);
    mac.finalize().into_bytes().into()
}

/// The key of a job's checkpoint MACs: HMAC-SHA256 of the job token and a label of its
/// own, so it says nothing of the token nor of the token's digest in the manifests.
#[derive(Clone, Default, PartialEq, Eq)]
pub(super) struct MacKey([u8; 32]);

impl std::fmt::Debug for MacKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("MacKey(..)")
    }
}

impl MacKey {
    fn of(token: &JobToken) -> Self {
        Self(keyed(token, b"syncopate-v1 checkpoint mac key"))
    }

    /// HMAC-SHA256 under this key of every part of `parts`, each preceded by its length
    /// (so no two lists of parts give the same input), hex.
    pub(super) fn mac(&self, parts: &[&[u8]]) -> String {
        self.over(parts)
            .map(|mac| hex::encode(mac.finalize().into_bytes()))
            .unwrap_or_default()
    }

    /// Whether `want` (hex) is the MAC of `parts`, compared in constant time.
    pub(super) fn verifies(&self, parts: &[&[u8]], want: &str) -> bool {
        match (hex::decode(want), self.over(parts)) {
            (Ok(want), Some(mac)) => mac.verify_slice(&want).is_ok(),
            _ => false,
        }
    }

    fn over(&self, parts: &[&[u8]]) -> Option<HmacSha256> {
        let mut mac = HmacSha256::new_from_slice(&self.0).ok()?;
        for part in parts {
            mac.update(&(part.len() as u64).to_le_bytes());
            mac.update(part);
        }
        Some(mac)
    }
}
