//! The session API in process: `router(state)` driven by
//! `tower::ServiceExt::oneshot`, over the session service on a SQLite
//! store in a temporary directory and the mock model's script answered in
//! process; tokio's paused clock where time matters. The API's logic
//! (budgets, pending calls, `depends_on`, approvals) is tested here; what
//! only a process shows (the CLI, signals, restarts, TCP, the real
//! stores) stays in the sidecar's `tests/it`.
//!
//! Run one area with `cargo test -p bindery-api --test inproc budgets::`.

mod harness;

mod approvals;
mod audit;
mod budgets;
mod depends;
mod end_users;
mod helpers;
mod limits;
mod mcp_per_user;
mod pending;
mod promises;
mod sessions;
mod shares;
mod tool_cache;
