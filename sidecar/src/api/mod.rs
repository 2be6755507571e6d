//! The HTTP API: routes, authentication, views, metrics and the OpenAPI document.

pub mod auth;
pub mod metrics;
pub mod openapi;
pub mod server;
pub mod views;
