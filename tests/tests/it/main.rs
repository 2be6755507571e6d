//! Tests across the binaries, one test binary: the charts on the strict
//! emulator (helm install to helm uninstall), the emulator itself, and the
//! LLM client against the mock model.
//!
//! Run one area with `cargo test -p bindery-tests --test it charts::`.

mod charts;
mod emulator;
mod kubelet;
mod llm_client;
