//! The schemas of `POST /mcp`'s JSON-RPC messages in `/openapi.json`. The
//! handler reads and writes them as JSON (rmcp's types are a client's),
//! so these describe the wire rather than build it.

// utoipa's derives spell out paths that are in scope.
#![allow(unused_qualifications)]

use serde_json::Value;
use utoipa::openapi::schema::{ArrayBuilder, ObjectBuilder, Schema, SchemaType, Type};
use utoipa::openapi::RefOr;
use utoipa::{PartialSchema, ToSchema};

/// `{"type": [..types]}`.
fn one_of_types(types: &[Type]) -> Schema {
    ObjectBuilder::new()
        .schema_type(SchemaType::Array(types.to_vec()))
        .into()
}

fn response_id() -> Schema {
    one_of_types(&[Type::String, Type::Integer, Type::Null])
}

#[derive(ToSchema)]
pub enum JsonRpcVersion {
    #[serde(rename = "2.0")]
    V2,
}

/// A request's id: a string, or an integer JSON-RPC can carry (64 bits).
fn request_id() -> Schema {
    let integer = ObjectBuilder::new()
        .schema_type(Type::Integer)
        .minimum(Some(i64::MIN as f64))
        .maximum(Some(i64::MAX as f64));
    utoipa::openapi::schema::OneOfBuilder::new()
        .item(ObjectBuilder::new().schema_type(Type::String))
        .item(integer)
        .into()
}

/// A JSON-RPC 2.0 request (with an `id`) or notification (without).
#[derive(ToSchema)]
pub struct JsonRpcRequest {
    #[schema(inline)]
    pub jsonrpc: JsonRpcVersion,
    #[serde(default)]
    #[schema(schema_with = request_id)]
    pub id: Value,
    pub method: String,
    /// The method's parameters (left out: none).
    #[serde(default)]
    #[schema(value_type = Object)]
    pub params: Value,
}

/// A JSON-RPC 2.0 response a client posts to a request of the server's
/// (an elicitation's answer), with that request's id: taken, and
/// answered 202.
#[derive(ToSchema)]
pub struct JsonRpcResult {
    #[schema(inline)]
    pub jsonrpc: JsonRpcVersion,
    #[schema(schema_with = request_id)]
    pub id: Value,
    #[schema(value_type = Object)]
    pub result: Value,
}

/// A JSON-RPC 2.0 error response a client posts: taken, and answered 202.
#[derive(ToSchema)]
pub struct JsonRpcErrorReply {
    #[schema(inline)]
    pub jsonrpc: JsonRpcVersion,
    #[schema(schema_with = request_id)]
    pub id: Value,
    #[schema(value_type = Object)]
    pub error: Value,
}

/// A JSON-RPC 2.0 request, notification or response.
#[derive(ToSchema)]
#[serde(untagged)]
pub enum JsonRpcMessage {
    Request(#[schema(inline)] JsonRpcRequest),
    Result(#[schema(inline)] JsonRpcResult),
    Error(#[schema(inline)] JsonRpcErrorReply),
}

/// What `/mcp` takes: one JSON-RPC message, or (protocol 2025-03-26) a batch.
#[derive(ToSchema)]
#[serde(untagged)]
pub enum McpRequest {
    One(#[schema(inline)] JsonRpcMessage),
    Batch(#[schema(inline)] McpBatch),
}

/// A batch (protocol 2025-03-26): each entry that is not a JSON-RPC
/// message gets an error response of its own. An empty one is no request
/// at all (so JSON-RPC has it), and is answered with a 400.
pub struct McpBatch;

impl PartialSchema for McpBatch {
    fn schema() -> RefOr<Schema> {
        ArrayBuilder::new()
            .items(ObjectBuilder::new().schema_type(SchemaType::AnyValue))
            .min_items(Some(1))
            .description(Some(
                "A batch (protocol 2025-03-26): each entry that is not a JSON-RPC message \
                 gets an error response of its own. An empty one is no request at all, and \
                 is answered with a 400.",
            ))
            .into()
    }
}

impl ToSchema for McpBatch {}

/// The JSON-RPC response; an array of them for a batch.
#[derive(ToSchema)]
#[serde(untagged)]
pub enum McpResponse {
    One(JsonRpcResponse),
    Batch(Vec<JsonRpcResponse>),
}

#[derive(ToSchema)]
pub struct JsonRpcResponse {
    #[schema(inline)]
    pub jsonrpc: JsonRpcVersion,
    #[schema(schema_with = response_id)]
    pub id: Value,
    #[serde(default)]
    #[schema(value_type = Object)]
    pub result: Value,
    #[serde(default)]
    pub error: JsonRpcError,
}

#[derive(ToSchema)]
pub struct JsonRpcError {
    /// -32602 for parameters the session API would refuse (and other
    /// invalid params), -32001 without a token `/mcp` takes, -32601 for an
    /// unknown method, -32600/-32700 for malformed messages; in protocol
    /// 2026-07-28 also -32022 (a version not spoken) and -32020 (a header
    /// that disagrees with the body).
    pub code: i64,
    pub message: String,
    #[serde(default)]
    pub data: McpErrorDetail,
}

/// What an error's `data` holds: the session API's error, or the versions
/// spoken when the one asked for is not.
#[derive(ToSchema)]
#[serde(untagged)]
pub enum McpErrorDetail {
    Session(McpErrorData),
    Version(UnsupportedVersion),
}

/// A protocol version this server does not speak (-32022).
#[derive(ToSchema)]
pub struct UnsupportedVersion {
    pub requested: String,
    pub supported: Vec<String>,
}

/// The session API's error, for errors it would also give.
#[derive(ToSchema)]
pub struct McpErrorData {
    /// The session API's code, e.g. `unknown_params`.
    pub error: String,
    /// The HTTP status the session API would answer with.
    pub status: i64,
    #[serde(default)]
    pub params: Vec<String>,
}

/// The `MCP-Protocol-Version` header's values.
pub struct McpProtocolVersion;

impl PartialSchema for McpProtocolVersion {
    fn schema() -> RefOr<Schema> {
        ObjectBuilder::new()
            .schema_type(SchemaType::Type(Type::String))
            .enum_values(Some(super::PROTOCOL_VERSIONS.iter().copied()))
            .into()
    }
}

impl ToSchema for McpProtocolVersion {}
