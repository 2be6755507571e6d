//! The adversarial suite: each module plays one actor of the threat model
//! (docs/security.md) against the sinks a value can reach, and fails when a
//! secret, a session's data or an authority crosses its line.

mod cache;
mod clients;
mod egress;
mod listings;
mod logs;
mod mcp_client;
mod own_credentials;
#[cfg(feature = "postgres-tests")]
mod peers;
mod sessions;
mod tool_children;
mod tool_output;
mod tool_processes;
mod tool_slots;
