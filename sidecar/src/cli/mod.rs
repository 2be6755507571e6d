//! The `bindery-sidecar` command line.

mod args;
mod commands;

pub use args::Cli;
pub use commands::main;
