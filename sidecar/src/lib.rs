//! Bindery's agent server: agent definitions, parameters, bindings, tools,
//! the LLM loop and the session API.

#[cfg(feature = "server")]
pub mod llm;
pub mod params;
