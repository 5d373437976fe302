//! Sans-IO protocol core of Syncopate.
//!
//! Everything that *decides* lives here as plain data structures that take events and
//! return actions, with no threads, sockets, clocks or sleeps: the tensor registry and
//! slicing, the schedulers, the strategies' state machines, the aggregation arithmetic, the
//! optimizer on flat slices and the wire format. The runtime and the simulator are two
//! drivers of this same code (see `DESIGN.md`).

pub mod aggregate;
pub mod buffers;
pub mod datagram;
pub mod json;
pub mod latency;
pub mod liveness;
pub mod net;
pub mod optim;
pub mod pool;
pub mod profile;
pub mod registry;
pub mod scale;
pub mod sched;
pub mod step;
pub mod strategy;
pub mod tune;
pub mod wire;

pub use optim::{LrSchedule, Sgd, SgdConfig};
