//! The operator's integration tests, one binary (the crate links once):
//! the CRDs, the desired state as golden files, the controller, the CRDs
//! and RBAC on the real API server.
//!
//! The last two need the real control plane (`tests/setup.sh` builds it)
//! and are compiled with the `cluster-tests` feature only:
//! `cargo test -p bindery-operator --features cluster-tests --test it operator::`.

mod common;

mod crd_schema;
mod crds;
mod desired;
#[cfg(feature = "cluster-tests")]
mod operator;
#[cfg(feature = "cluster-tests")]
mod real_apiserver;
