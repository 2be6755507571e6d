//! Tests across the binaries, one test binary: the charts on the real
//! control plane (helm install to helm uninstall), the test kubelet that
//! runs their pods, and the LLM client against the mock model.
//!
//! The charts and the kubelet need the real control plane, helm and the
//! Python tools of tests/requirements.txt (`tests/setup.sh` installs them)
//! and are compiled with the `cluster-tests` feature only; the chart test
//! of replicas on PostgreSQL with `postgres-tests` too.
//!
//! Run one area with `cargo test -p bindery-tests --features cluster-tests --test it charts::`.

#[cfg(feature = "cluster-tests")]
mod charts;
#[cfg(feature = "cluster-tests")]
mod kubelet;
mod llm_client;
