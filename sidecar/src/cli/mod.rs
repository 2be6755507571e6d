//! The `bindery-sidecar` command line.

mod args;
mod commands;
mod serve;
mod telemetry;
mod trim;

pub use args::Cli;
pub use commands::main;
