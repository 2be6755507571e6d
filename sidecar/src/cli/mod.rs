//! The `bindery-sidecar` command line.

mod agents_exe_argv;
mod agents_exe_session;
mod args;
mod as_tool;
mod ask;
mod call;
mod check_tools;
mod commands;
mod http;
mod load;
mod media;
mod memory;
mod replay;
mod serve;
mod session_client;
mod telemetry;

pub use args::Cli;
pub use commands::main;
pub use memory::MALLOC_CONF;
