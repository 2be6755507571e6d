//! The operator's integration tests, one binary (the crate links once):
//! the CRDs, the desired state as golden files, the controller, the CRDs
//! and RBAC on the real API server.
//!
//! Run one area with `cargo test -p bindery-operator --test it operator::`.

mod common;

mod crd_schema;
mod crds;
mod desired;
mod operator;
mod real_apiserver;
