//! The operator's integration tests, one binary (the crate links once):
//! the CRDs, the desired state as golden files, the controller against
//! the strict API emulator, and the CRDs and RBAC on the real API server.
//!
//! Run one area with `cargo test -p bindery-operator --test it emulator::`.

mod common;

mod crd_schema;
mod crds;
mod desired;
mod emulator;
mod real_apiserver;
