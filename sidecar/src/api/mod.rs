//! Pieces of the HTTP API that stand on their own: Prometheus metrics and the OpenAPI document.
pub mod metrics;
pub mod openapi;
