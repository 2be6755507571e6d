//! The `bindery-sidecar` command line.

mod args;
mod commands;
mod serve;

pub use args::Cli;
pub use commands::main;
