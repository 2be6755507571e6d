//! Bindery's agent server, the command line over its layers: each layer
//! is a crate of its own (bindery-params, -llm, -tools, -bindings, -tree,
//! -store, -session, -api; ARCHITECTURE.md), so the compiler holds the
//! rule that none names a layer above it.

#[cfg(feature = "cli")]
pub mod cli;
