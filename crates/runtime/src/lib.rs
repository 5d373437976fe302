//! Syncopate's runtime: real processes exchanging frames over TCP.
//!
//! It drives the sans-IO state machines of `syncopate-core` with sockets, emulated links
//! and the training engine of `syncopate-train`; it decides nothing about the protocol
//! itself.

pub mod auth;
pub mod bench;
pub mod checkpoint;
pub mod collective;
pub mod comm;
pub mod env;
pub mod error;
pub mod file_error;
pub mod frame_io;
pub mod heap;
pub mod job;
pub mod launch;
pub mod losses;
pub mod outcome;
pub mod process;
pub mod rendezvous;
pub mod replicas;
pub mod sampler;
pub mod server;
pub mod timer;
pub mod trace;
pub mod worker;
