//! A client for OpenAI-compatible chat-completions endpoints.
//!
//! [`ChatClient`] sends a [`Conversation`] (messages and tool definitions,
//! encoded as they are added) to
//! `POST {base_url}/chat/completions` and returns a [`ChatResponse`]: the
//! assistant's text, the tool calls it asked for, why it stopped and the
//! token usage. [`ChatClient::complete_streaming`] does the same with
//! `stream: true`, forwarding [`StreamDelta`]s as the server-sent events
//! arrive.
//!
//! Rate limits (429), server errors (5xx) and failed connections are retried
//! with exponential backoff (honouring `Retry-After`); everything else is
//! reported at once as an [`LlmError`]. The API key is held as a
//! [`SecretString`](bindery_params::SecretString) and only ever leaves the
//! process in the `Authorization` header, to the endpoint's own origin
//! ([`egress`]: a redirect elsewhere is not followed).

#![forbid(unsafe_code)]

mod anthropic;
mod bedrock;
mod call_ids;
mod client;
pub mod content;
mod conversation;
mod credentials;
mod dialect;
pub mod egress;
mod error;
mod gemini;
mod parse;
mod responses;
mod sent;
mod turn;
mod types;

pub use client::{falls_back, ChatClient, LocalModel};
pub use credentials::AwsKeys;

/// `tools` exactly as `provider`'s requests carry them (`describe --tools`).
pub fn tools_as_sent(
    provider: bindery_spec::provider::Provider,
    tools: &[ToolDefinition],
) -> Result<Vec<serde_json::Value>, LlmError> {
    dialect::tools(provider, tools)
}
pub use content::{Content, ContentPart, Media};
pub use conversation::Conversation;
pub use error::LlmError;
pub use turn::Turn;
pub use types::{
    ChatMessage, ChatRequest, ChatResponse, FellBack, ModelEndpoint, Reasoning, ReplyLimits,
    StreamDelta, ToolCall, ToolDefinition, Usage,
};
