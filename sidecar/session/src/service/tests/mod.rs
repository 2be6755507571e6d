//! The session service in process, on tokio's paused clock: what the
//! spawned-binary tests cannot show without waiting (leases, heartbeats,
//! TTLs, `confirmTtl`, timeouts) is moved here by `tokio::time::advance`,
//! against real agent files, a real SQLite store and a scripted model.
//! Tests that only a process shows (the CLI, signals, restarts, TCP) stay
//! in `tests/it`.

mod audit;
mod budgets;
mod harness;
mod leases;
mod pending;
mod runs;
mod ttl;
