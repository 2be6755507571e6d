//! Shared helpers for Bindery's cross-binary tests.

pub mod control_plane;
pub mod helm;
pub mod kubectl;
pub mod kubelet;
pub mod mcp_client;
pub mod mock_llm;
pub mod postgres;
pub mod postgrest;
pub mod sidecar;
