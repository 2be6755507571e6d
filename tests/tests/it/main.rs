//! Tests across the binaries, one test binary: the charts on the real
//! control plane (helm install to helm uninstall), the test kubelet that
//! runs their pods, and the LLM client against the mock model.
//!
//! Run one area with `cargo test -p bindery-tests --test it charts::`.

mod charts;
mod kubelet;
mod llm_client;
