//! Shared helpers for Bindery's cross-binary tests.

pub mod kube;
pub mod mock_llm;
pub mod sidecar;
