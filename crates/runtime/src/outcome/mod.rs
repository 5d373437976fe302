//! What a finished distributed job leaves: its summary (`--summary-json`: worker 0's,
//! the members' files beside it and what `launch` merges from them) and its replicas'
//! statistics, and its `config.toml` ([`config`]). Kept apart from [`crate::job`]: the worker and server loops use `job`, and
//! the summary reads theirs.

pub mod config;
pub mod replicas;
pub mod summary;
