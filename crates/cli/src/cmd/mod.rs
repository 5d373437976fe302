//! One module per subcommand.

pub mod dist;
pub mod models;
pub mod train;
