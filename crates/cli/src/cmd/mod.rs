//! One module per subcommand.

pub mod bench;
pub mod dist;
pub mod models;
pub mod replicas;
pub mod simulate;
pub mod train;
