//! Shared helpers for Bindery's cross-binary tests.

pub mod bench;
pub mod children;
pub mod control_plane;
pub mod eventually;
pub mod fixtures;
pub mod helm;
pub mod idp;
pub mod kubectl;
pub mod mcp_client;
pub mod mock_llm;
pub mod mock_mcp;
pub mod netns;
pub mod node;
pub mod node_fixtures;
pub mod node_kube;
pub mod postgres;
pub mod postgrest;
pub mod provider_mock;
pub mod relay;
pub mod scripts;
pub mod sidecar;

/// The first file named `name` in a directory of `PATH`.
pub fn on_path(name: &str) -> Option<std::path::PathBuf> {
    std::env::split_paths(&std::env::var_os("PATH")?)
        .map(|d| d.join(name))
        .find(|f| f.is_file())
}
