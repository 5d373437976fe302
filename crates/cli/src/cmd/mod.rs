//! One module per subcommand.

pub mod bench;
pub mod dist;
pub mod models;
pub mod sim_faults;
pub mod simulate;
pub mod summary;
pub mod train;
pub mod transfer;

#[cfg(test)]
mod sync_tests;
