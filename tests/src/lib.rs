//! Shared helpers for Bindery's cross-binary tests.

pub mod mock_llm;
pub mod sidecar;
