//! Bindery's agent server: agent definitions, parameters, bindings, tools,
//! the LLM loop and the session API.

pub mod params;
