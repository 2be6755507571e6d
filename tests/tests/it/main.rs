//! Tests across the binaries, one test binary: the charts on the real
//! control plane, and the LLM client against the mock model. (The charts'
//! pods run on a real node: `tests/tests/node/`.)
//!
//! The charts need the real control plane, helm and the Python tools of
//! tests/requirements.txt (`tests/setup.sh` installs them) and are
//! compiled with the `cluster-tests` feature only; the identity server's
//! harness needs Keycloak (tests/idp/install.sh) and is compiled with
//! `interop-tests` only.
//!
//! Run one area with `cargo test -p bindery-tests --features cluster-tests --test it charts::`.

#[cfg(feature = "cluster-tests")]
mod charts;
#[cfg(feature = "interop-tests")]
mod idp;
mod llm_client;
