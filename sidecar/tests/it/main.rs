//! The sidecar's integration tests, one binary: each module is one area,
//! driven as a user would (the real `bindery-sidecar` binary over TCP, real
//! files, a mock model). One binary links the crate once instead of once a
//! file, which is most of the tests' build time on two cores.
//!
//! Run one area with `cargo test -p bindery-sidecar --test it server_api::`.
//!
//! The tests that need PostgreSQL, a browser, or other implementations
//! (Node, the Python MCP SDK, schemathesis; `tests/setup.sh` installs them)
//! are compiled with the features `postgres-tests`, `browser-tests` and
//! `interop-tests` only: `cargo test -p bindery-sidecar --features
//! postgres-tests --test it server_postgres::`.

mod common;

mod adversarial;
mod agents_exe_cli;
mod agents_exe_compat;
mod agents_exe_http;
mod agents_exe_resume;
mod agents_exe_sessions;
mod approvals;
mod audit_cli;
mod budgets;
mod builtins;
mod chat_page;
mod cli;
#[cfg(feature = "interop-tests")]
mod end_users;
mod first_run;
#[cfg(feature = "interop-tests")]
mod fuzz_api;
mod live_ttl;
#[cfg(feature = "interop-tests")]
mod mcp;
#[cfg(feature = "interop-tests")]
mod mcp_conformance;
#[cfg(feature = "interop-tests")]
mod mcp_oauth;
mod mcp_server;
#[cfg(feature = "interop-tests")]
mod mcp_tools;
mod media;
mod openapi;
mod otlp;
#[cfg(feature = "postgres-tests")]
mod postgrest;
mod proptest_parsers;
#[cfg(feature = "interop-tests")]
mod providers;
mod replicas;
mod repo_paths;
mod scenario_s2;
mod scrub;
mod server_api;
mod server_depends;
mod server_helpers;
mod server_pending;
#[cfg(feature = "postgres-tests")]
mod server_postgres;
mod server_runs;
mod server_sessions;
mod session_cli;
mod session_pins;
mod store_faults;
mod store_refused;
mod stored_agents;
