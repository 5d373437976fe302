//! One module per subcommand.

pub mod bench;
pub mod dist;
pub mod models;
pub mod train;
