//! The HTTP API: routes, authentication, views, metrics, the OpenAPI
//! document and MCP over HTTP.

pub mod auth;
pub mod mcp;
pub mod metrics;
pub mod openapi;
pub mod server;
pub mod views;
