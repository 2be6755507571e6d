//! Shared helpers for Bindery's cross-binary tests.
