//! Bindery's agent server: agent definitions, parameters, bindings, tools,
//! the LLM loop and the session API.

#[cfg(feature = "server")]
pub mod api;
pub mod bindings;
#[cfg(feature = "cli")]
pub mod cli;
pub mod diagnostic;
#[cfg(feature = "server")]
pub mod llm;
#[cfg(feature = "server")]
pub mod metrics;
pub mod params;
pub mod report;
#[cfg(feature = "server")]
pub mod session;
pub mod spec;
pub mod tools;
pub mod tree;
