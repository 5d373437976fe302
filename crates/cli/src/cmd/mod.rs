//! One module per subcommand.

pub mod bench;
pub mod dist;
pub mod models;
pub mod sim_faults;
pub mod simulate;
pub mod train;

#[cfg(test)]
mod sync_tests;
