//! One module per subcommand.

pub mod models;
pub mod train;
