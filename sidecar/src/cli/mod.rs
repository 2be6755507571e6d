//! The `bindery-sidecar` command line.

mod agents_exe_argv;
mod agents_exe_session;
mod args;
mod as_tool;
mod ask;
mod audit;
mod call;
mod check_tool_call;
mod check_tools;
mod commands;
mod error;
mod http;
mod load;
mod mcp_stdio;
mod media;
mod memory;
mod one_shot;
mod prompt_script;
mod replay;
mod resume;
mod serve;
mod session_client;
mod telemetry;
mod terminal_text;
mod tool_call_result;

pub use args::Cli;
pub use commands::main;
pub use memory::MALLOC_CONF;
