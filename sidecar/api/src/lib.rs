//! The HTTP API: routes, authentication, views, metrics, the OpenAPI
//! document, MCP over HTTP and the chat page.

#![forbid(unsafe_code)]

pub mod approvals;
pub mod audit;
pub mod auth;
pub mod chat;
pub mod event_stream;
pub mod holder;
pub mod mcp;
pub mod openapi;
pub mod origin;
pub mod owner_token;
pub mod peer_tls;
pub mod peers;
pub mod rate_limit;
pub mod request;
pub mod server;
pub mod shares;
pub mod state;
pub mod status;
pub mod stored_agents;
pub mod usage;
pub mod views;
