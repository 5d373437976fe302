//! One module per subcommand (and `stats`, what their outputs share).

pub mod bench;
pub mod dist;
pub mod models;
pub mod sim_faults;
pub mod simulate;
mod stats;
pub mod summary;
pub mod train;
pub mod transfer;

#[cfg(test)]
mod sync_tests;
