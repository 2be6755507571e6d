//! The OpenAPI 3.1 document of the HTTP API, served at `GET /openapi.json`.
//!
//! Derived with utoipa, not written: each handler's `#[utoipa::path]` gives
//! its route, security, parameters and responses, `server::routes` registers
//! it once for both the router and the document (utoipa-axum's
//! `OpenApiRouter`), and the view and request types derive their schemas.
//! This module holds what is not a handler: the document's frame (info,
//! tags, security schemes), the error bodies with the `error` codes each
//! route may answer, and the schemas of JSON that no Rust type of the API
//! holds (events, pending items, turns, JSON-RPC messages).

// utoipa's derives spell out paths that are in scope.
#![allow(unused_qualifications)]

use std::collections::BTreeMap;

use serde_json::Value;
use utoipa::openapi::content::ContentBuilder;
use utoipa::openapi::extensions::ExtensionsBuilder;
use utoipa::openapi::schema::{
    AllOfBuilder, ArrayBuilder, ObjectBuilder, Schema, SchemaType, Type,
};
use utoipa::openapi::security::{HttpAuthScheme, HttpBuilder, SecurityRequirement, SecurityScheme};
use utoipa::openapi::tag::TagBuilder;
use utoipa::openapi::{
    ComponentsBuilder, InfoBuilder, LicenseBuilder, OpenApi as Document, Ref, RefOr, Response,
    ResponseBuilder,
};
use utoipa::{PartialSchema, ToResponse, ToSchema};

use crate::session::wire::{Delta, SessionEvent};

/// The `delta` event: streamed text, never stored, so not a
/// [`SessionEvent`]; `x-events` lists it with the stored kinds.
const DELTA: &str = "delta";

/// The path of the events route, whose 200 gets `x-events`.
pub const EVENTS_PATH: &str = "/v1/sessions/{id}/events";

/// The document for `api`, the routes' part that `server::routes`
/// collected; `version` is the server's, shown as `info.version`.
pub fn document(mut api: Document, version: &str) -> Value {
    api.info = InfoBuilder::new()
        .title("Bindery")
        .version(version)
        .description(Some(
            "Bindery's agent server: run an agent in a session, talk to it, watch its \
             events. Parameter values are write-only: no response ever carries a secret \
             value, and agent views carry no values at all.",
        ))
        .license(Some(
            LicenseBuilder::new()
                .name("Apache-2.0")
                .identifier(Some("Apache-2.0"))
                .build(),
        ))
        .build();
    api.tags = Some(
        [
            ("health", "Liveness, readiness, metrics and this document."),
            ("agents", "The agents this server runs."),
            (
                "sessions",
                "Conversations with an agent, their runs and parameters.",
            ),
            (
                "mcp",
                "The agents as MCP tools (MCP's Streamable HTTP transport).",
            ),
            (
                "approvals",
                "What waits for a person, for the approver and the links of webhook notices.",
            ),
            ("chat", "The chat page, for a person trying an agent."),
        ]
        .into_iter()
        .map(|(name, description)| {
            TagBuilder::new()
                .name(name)
                .description(Some(description))
                .build()
        })
        .collect(),
    );
    api.security = Some(vec![SecurityRequirement::new(
        "ownerToken",
        Vec::<String>::new(),
    )]);
    let bearer = |description: &str| {
        SecurityScheme::Http(
            HttpBuilder::new()
                .scheme(HttpAuthScheme::Bearer)
                .description(Some(description))
                .build(),
        )
    };
    let components = ComponentsBuilder::new()
        .security_scheme(
            "ownerToken",
            bearer("The owner token, given to the server at start-up. Allowed everywhere."),
        )
        .security_scheme(
            "sessionToken",
            bearer(
                "A session token (`st_…`), handed out once when a session is created or \
                 forked with `session_token: true`. Valid for that session only, and only on \
                 the operations that list it.",
            ),
        )
        .security_scheme(
            "approverToken",
            bearer(
                "The approver token (`serve --approver-token-file`): lists pending approvals \
                 and answers them; reads nothing else.",
            ),
        )
        .security_scheme(
            "mcpClientToken",
            bearer(
                "The MCP client token (`serve --mcp-client-token-file`): on `/mcp`, the \
                 agents' exposed tools only, answering nothing.",
            ),
        )
        .response_from::<Unauthorized>()
        .build();
    let mut schemas = vec![(Delta::name().into_owned(), Delta::schema())];
    SessionEvent::schemas(&mut schemas);
    let c = api.components.get_or_insert_with(Default::default);
    c.security_schemes.extend(components.security_schemes);
    c.responses.extend(components.responses);
    c.schemas.extend(schemas);
    let kinds = SessionEvent::kinds()
        .into_iter()
        .chain([(DELTA, Delta::name().into_owned())]);
    let events = kinds
        .map(|(kind, schema)| {
            let to = serde_json::json!({ "$ref": format!("#/components/schemas/{schema}") });
            (kind.to_string(), to)
        })
        .collect::<serde_json::Map<_, _>>();
    if let Some(RefOr::T(ok)) = api
        .paths
        .paths
        .get_mut(EVENTS_PATH)
        .and_then(|item| item.get.as_mut())
        .and_then(|op| op.responses.responses.get_mut("200"))
    {
        ok.extensions = Some(
            ExtensionsBuilder::new()
                .add("x-events", Value::Object(events))
                .build(),
        );
    }
    let mut doc = serde_json::to_value(&api).expect("the OpenAPI document serialises");
    if let Some(paths) = doc["paths"].as_object_mut() {
        paths
            .values_mut()
            .filter_map(Value::as_object_mut)
            .flat_map(|item| item.values_mut())
            .for_each(optional_means_absent);
    }
    add_links(&mut doc);
    doc
}

/// The operations a session's id opens, each with the name of its path
/// parameter.
const SESSION_OPERATIONS: &[&str] = &[
    "getSession",
    "postMessage",
    "resumeSession",
    "cancelSession",
    "forkSession",
    "setSessionParams",
    "revokeSessionTokens",
    "streamEvents",
];

/// The answers that name a session: (path, method, status, where its id
/// is in the body, whether it is a session view with `pending` items).
const SESSION_ANSWERS: &[(&str, &str, &str, &str, bool)] = &[
    (
        "/v1/sessions",
        "get",
        "200",
        "/sessions/0/session_id",
        false,
    ),
    ("/v1/sessions", "post", "201", "/session_id", true),
    ("/v1/sessions/{id}", "get", "200", "/session_id", true),
    (
        "/v1/sessions/{id}/messages",
        "post",
        "202",
        "/session_id",
        true,
    ),
    ("/v1/sessions/{id}/fork", "post", "201", "/session_id", true),
    (
        "/v1/sessions/{id}/params",
        "put",
        "200",
        "/session_id",
        true,
    ),
    (
        "/v1/continuations/{token}",
        "post",
        "200",
        "/session_id",
        true,
    ),
];

/// OpenAPI links: how one answer feeds the next request. A session's id
/// (from its view or the list) opens its routes; a pending item's
/// continuation token opens the continuation route; an agent's slug its
/// view and a new session. A client (or a fuzzer's stateful phase) can
/// follow them.
fn add_links(doc: &mut Value) {
    let link = |operation: &str, parameter: &str, from: &str| {
        serde_json::json!({
            "operationId": operation,
            "parameters": { parameter: format!("$response.body#{from}") },
        })
    };
    let mut add = |path: &str, method: &str, status: &str, name: &str, to: Value| {
        let response = &mut doc["paths"][path][method]["responses"][status];
        assert!(
            response.is_object(),
            "no {status} answer of {method} {path} to link from"
        );
        response["links"][name] = to;
    };
    for (path, method, status, id, view) in SESSION_ANSWERS {
        for operation in SESSION_OPERATIONS {
            add(path, method, status, operation, link(operation, "id", id));
        }
        if *view {
            let to = link("postContinuation", "token", "/pending/0/continuation_token");
            add(path, method, status, "postContinuation", to);
        }
    }
    let to = link("getAgent", "slug", "/agents/0/slug");
    add("/v1/agents", "get", "200", "getAgent", to);
    let to = serde_json::json!({
        "operationId": "createSession",
        "requestBody": { "agent": "$response.body#/agents/0/slug" },
    });
    add("/v1/agents", "get", "200", "createSession", to);
}

/// utoipa reads an `Option` parameter or body as "may be null"; here it
/// means "may be left out": `null` is no value the server takes there.
fn optional_means_absent(operation: &mut Value) {
    if let Some(params) = operation
        .get_mut("parameters")
        .and_then(Value::as_array_mut)
    {
        for schema in params.iter_mut().filter_map(|p| p.get_mut("schema")) {
            drop_null(schema);
        }
    }
    if let Some(body) = operation.get_mut("requestBody") {
        let schema = body.pointer_mut("/content/application~1json/schema");
        if schema.is_some_and(drop_null) {
            body["required"] = Value::Bool(false);
        }
    }
}

/// Takes `null` out of `schema`'s types; whether there was one.
fn drop_null(schema: &mut Value) -> bool {
    let null = Value::from("null");
    let types = schema.get_mut("type").and_then(Value::as_array_mut);
    if let Some(types) = types.filter(|t| t.contains(&null)) {
        types.retain(|t| *t != null);
        if let [only] = types.as_slice() {
            schema["type"] = only.clone();
        }
        return true;
    }
    let mut one_of = match schema.get("oneOf").and_then(Value::as_array) {
        Some(items) if items.len() == 2 && items.iter().any(|i| i["type"] == null) => items.clone(),
        _ => return false,
    };
    one_of.retain(|i| i["type"] != null);
    *schema = one_of.remove(0);
    true
}

// ---------------------------------------------------------------------------
// Errors.

/// Every error of the session API (`/mcp` answers JSON-RPC errors instead).
#[derive(ToSchema)]
#[schema(as = Error)]
pub struct ErrorBody {
    /// A stable, machine-readable code.
    pub error: String,
    /// For people.
    pub message: String,
    /// The parameters the error is about, when it is about some.
    #[serde(default)]
    pub params: Vec<String>,
}

/// The 401 of every route but the public ones and `/mcp`, a shared
/// response under `components`.
pub struct Unauthorized;

impl<'r> ToResponse<'r> for Unauthorized {
    fn response() -> (&'r str, RefOr<Response>) {
        let response = ResponseBuilder::new()
            .description(
                "No valid token: none given, a wrong one, or a session token for another \
                 session.",
            )
            .content(
                "application/json",
                ContentBuilder::new()
                    .schema(Some(Ref::from_schema_name("Error")))
                    .build(),
            )
            .build();
        ("Unauthorized", response.into())
    }
}

/// The `Error` schema with `error` narrowed to `codes`.
fn error_with(codes: &[&str]) -> RefOr<Schema> {
    AllOfBuilder::new()
        .item(Ref::from_schema_name("Error"))
        .item(
            ObjectBuilder::new().property(
                "error",
                ObjectBuilder::new()
                    .schema_type(SchemaType::Type(Type::String))
                    .enum_values(Some(codes.iter().copied())),
            ),
        )
        .into()
}

/// An error response body that may carry only these `error` codes; used
/// inline in a handler's `responses(...)`.
macro_rules! error_codes {
    ($($(#[$doc:meta])* $name:ident = [$($code:literal),+ $(,)?];)*) => {$(
        $(#[$doc])*
        pub struct $name;

        impl PartialSchema for $name {
            fn schema() -> RefOr<Schema> {
                error_with(&[$($code),+])
            }
        }

        impl ToSchema for $name {
            fn schemas(schemas: &mut Vec<(String, RefOr<Schema>)>) {
                schemas.push((ErrorBody::name().into(), ErrorBody::schema()));
                ErrorBody::schemas(schemas);
            }
        }
    )*};
}

error_codes! {
    /// The body or a query parameter cannot be read.
    BadRequest = ["bad_request"];
    /// No such agent, session or pending call.
    NotFound = ["not_found"];
    /// Parameters this caller may not set.
    ForbiddenParams = ["forbidden_params"];
    /// Parameters this caller may not set, or a pending call only the
    /// owner may answer.
    ForbiddenAnswer = ["forbidden", "forbidden_params"];
    /// Parameters refused on a new session.
    NewSessionParams = ["unknown_params", "invalid_params", "params_required"];
    /// Parameters refused on an existing session.
    SessionParams = ["unknown_params", "invalid_params"];
    /// A run cannot start now.
    RunBlocked = ["run_in_progress", "waiting_external", "params_required", "peer_tls_required"];
    /// Nothing to cancel.
    NotRunning = ["not_running"];
    /// An answer to a pending call that cannot be taken.
    AnswerRefused = [
        "continuation_used",
        "call_changed",
        "continuation_expired",
        "params_required",
        "run_in_progress",
        "peer_tls_required",
    ];
    /// Not ready.
    NotReady = ["starting", "store_unavailable"];
    /// Agents are not kept over the API on this server.
    StoredAgentsDisabled = ["stored_agents_disabled"];
    /// A file agent has this slug.
    AgentExists = ["agent_exists"];
    /// The agent's definition does not load.
    InvalidAgent = ["invalid_agent"];
}

/// The text of a 422 for parameters (each route adds its codes).
pub const INVALID_PARAMS: &str = "Parameters that are not declared by the agent \
    (`unknown_params`), values that do not fit (`invalid_params`: wrong type, a secret that \
    is not a string, a message-scope parameter where only session values are taken) or \
    required parameters left unbound (`params_required`). `params` names the parameters.";

/// The text of a 400.
pub const BAD_REQUEST: &str = "The body is not valid JSON or does not have the expected \
    shape, or a query parameter is malformed.";

// ---------------------------------------------------------------------------
// Small shapes.

/// `{"status": "ok"}`.
#[derive(ToSchema)]
pub struct Health {
    pub status: HealthStatus,
}

#[derive(ToSchema)]
pub enum HealthStatus {
    #[serde(rename = "ok")]
    Ok,
}

/// `{"status": "ready"}`.
#[derive(ToSchema)]
pub struct Ready {
    pub status: ReadyStatus,
}

#[derive(ToSchema)]
pub enum ReadyStatus {
    #[serde(rename = "ready")]
    Ready,
}

/// Parameter name → JSON value; `null` removes the value. Secret values
/// must be strings.
#[derive(ToSchema)]
pub struct ParamValues(pub BTreeMap<String, Value>);

/// `GET /v1/agents`.
#[derive(ToSchema)]
pub struct AgentList {
    pub agents: Vec<super::views::AgentView>,
}

/// `GET /v1/sessions`.
#[derive(ToSchema)]
pub struct SessionList {
    pub sessions: Vec<super::views::SessionSummary>,
}

/// Who sets it: the server (process), a session, or each message.
#[derive(ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum Scope {
    Process,
    Session,
    Message,
}

/// `POST /v1/sessions/{id}/fork`'s body.
#[derive(ToSchema)]
pub struct ForkRequest {
    #[serde(default)]
    pub params: ParamValues,
    /// Values pinned for the new session. The source's pins are kept;
    /// this replaces one (`null` drops it, and its value).
    #[serde(default)]
    pub pin: ParamValues,
    /// A first message: starts a run.
    #[serde(default)]
    pub prompt: String,
    #[serde(default)]
    pub seal: bool,
    /// Hand out a session token for the new session.
    #[serde(default)]
    pub session_token: bool,
    /// Copy only the turns before this index (0: none); past the source's
    /// last turn is a 400.
    #[serde(default)]
    #[schema(minimum = 0)]
    pub at_turn: u64,
}

/// Without `params` (or with an empty body) nothing changes; any other key
/// is refused (422).
#[derive(ToSchema)]
#[serde(deny_unknown_fields)]
pub struct SetParamsRequest {
    #[serde(default)]
    pub params: ParamValues,
}

// ---------------------------------------------------------------------------
// Events.

/// One server-sent event: `id` (its sequence number), `event` (a key of
/// `x-events`) and `data` (that event's JSON).
#[derive(ToSchema)]
pub struct SseEvent {
    #[serde(default)]
    pub id: String,
    #[serde(default)]
    pub event: String,
    #[serde(default)]
    pub data: String,
}

// ---------------------------------------------------------------------------
// MCP.

/// `{"type": [..types]}`.
fn one_of_types(types: &[Type]) -> Schema {
    ObjectBuilder::new()
        .schema_type(SchemaType::Array(types.to_vec()))
        .into()
}

fn request_id() -> Schema {
    one_of_types(&[Type::String, Type::Integer])
}

fn response_id() -> Schema {
    one_of_types(&[Type::String, Type::Integer, Type::Null])
}

#[derive(ToSchema)]
pub enum JsonRpcVersion {
    #[serde(rename = "2.0")]
    V2,
}

/// A JSON-RPC 2.0 request, notification or response.
#[derive(ToSchema)]
pub struct JsonRpcMessage {
    #[schema(inline)]
    pub jsonrpc: JsonRpcVersion,
    #[serde(default)]
    #[schema(schema_with = request_id)]
    pub id: Value,
    #[serde(default)]
    pub method: String,
    /// The method's parameters (an object); any other value is answered,
    /// like an unknown method, with a JSON-RPC error in a 200.
    #[serde(default)]
    pub params: Value,
}

/// What `/mcp` takes: one JSON-RPC message, or (protocol 2025-03-26) a batch.
#[derive(ToSchema)]
#[serde(untagged)]
pub enum McpRequest {
    One(JsonRpcMessage),
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
            .enum_values(Some(super::mcp::PROTOCOL_VERSIONS.iter().copied()))
            .into()
    }
}

impl ToSchema for McpProtocolVersion {}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use serde_json::json;

    use super::*;

    /// Every route of the API as `(METHOD, path)`: the document lists
    /// these and nothing else.
    const ROUTES: &[(&str, &str)] = &[
        ("GET", "/healthz"),
        ("GET", "/readyz"),
        ("GET", "/metrics"),
        ("GET", "/openapi.json"),
        ("GET", "/v1/agents"),
        ("GET", "/v1/agents/{slug}"),
        ("PUT", "/v1/agents/{slug}"),
        ("DELETE", "/v1/agents/{slug}"),
        ("POST", "/v1/sessions"),
        ("GET", "/v1/sessions"),
        ("GET", "/v1/sessions/{id}"),
        ("POST", "/v1/sessions/{id}/messages"),
        ("POST", "/v1/sessions/{id}/resume"),
        ("POST", "/v1/sessions/{id}/cancel"),
        ("POST", "/v1/sessions/{id}/fork"),
        ("POST", "/v1/continuations/{token}"),
        ("GET", "/v1/approvals"),
        ("POST", "/v1/approvals/{token}"),
        ("GET", "/v1/usage"),
        ("PUT", "/v1/sessions/{id}/params"),
        ("DELETE", "/v1/sessions/{id}/token"),
        ("GET", "/v1/sessions/{id}/events"),
        ("POST", "/mcp"),
        ("GET", "/"),
        ("GET", "/chat.js"),
        ("GET", "/chat.css"),
    ];

    const METHODS: [&str; 8] = [
        "get", "put", "post", "delete", "options", "head", "patch", "trace",
    ];

    fn doc() -> Value {
        document(crate::api::server::routes().into_openapi(), "1.2.3")
    }

    /// Every operation as `(METHOD, path, operation)`.
    fn operations(doc: &Value) -> Vec<(String, String, &Value)> {
        let mut out = Vec::new();
        for (path, item) in doc["paths"].as_object().expect("paths") {
            for (method, op) in item.as_object().expect("path item") {
                assert!(METHODS.contains(&method.as_str()), "{method} {path}");
                out.push((method.to_ascii_uppercase(), path.clone(), op));
            }
        }
        out
    }

    fn collect_refs<'a>(value: &'a Value, out: &mut Vec<&'a str>) {
        match value {
            Value::Object(map) => {
                for (key, v) in map {
                    if key == "$ref" {
                        out.push(v.as_str().expect("$ref is a string"));
                    } else {
                        collect_refs(v, out);
                    }
                }
            }
            Value::Array(items) => items.iter().for_each(|v| collect_refs(v, out)),
            _ => {}
        }
    }

    /// The value itself, or what its `$ref` points at.
    fn resolve<'a>(doc: &'a Value, value: &'a Value) -> &'a Value {
        match value.get("$ref").and_then(Value::as_str) {
            Some(r) => doc
                .pointer(r.strip_prefix('#').expect("local ref"))
                .expect("ref resolves"),
            None => value,
        }
    }

    #[test]
    fn is_an_openapi_3_1_document() {
        let doc = doc();
        let text = serde_json::to_string_pretty(&doc).expect("serialises");
        let back: Value = serde_json::from_str(&text).expect("parses back");
        assert_eq!(back, doc);
        assert_eq!(doc["openapi"], "3.1.0");
        assert_eq!(doc["info"]["version"], "1.2.3");
        assert_eq!(doc["info"]["title"], "Bindery");
    }

    #[test]
    fn every_route_is_documented_and_nothing_else() {
        let doc = doc();
        for (method, path) in ROUTES {
            let op = &doc["paths"][path][method.to_ascii_lowercase()];
            assert!(op.is_object(), "{method} {path} missing");
        }
        let listed: BTreeSet<(String, String)> = ROUTES
            .iter()
            .map(|(m, p)| (m.to_string(), p.to_string()))
            .collect();
        assert_eq!(listed.len(), ROUTES.len(), "ROUTES has duplicates");
        let documented: BTreeSet<(String, String)> = operations(&doc)
            .into_iter()
            .map(|(m, p, _)| (m, p))
            .collect();
        assert_eq!(documented, listed);
    }

    #[test]
    fn every_ref_resolves_to_a_component() {
        let doc = doc();
        let mut refs = Vec::new();
        collect_refs(&doc, &mut refs);
        assert!(refs.len() > 50, "only {} refs?", refs.len());
        for r in refs {
            let pointer = r
                .strip_prefix("#/components/")
                .unwrap_or_else(|| panic!("{r} is not a component ref"));
            assert!(!pointer.is_empty());
            assert!(
                doc.pointer(&r[1..]).is_some_and(Value::is_object),
                "{r} does not resolve"
            );
        }
    }

    #[test]
    fn every_operation_has_an_id_responses_and_security() {
        let doc = doc();
        let schemes = doc["components"]["securitySchemes"]
            .as_object()
            .expect("security schemes");
        let mut ids = BTreeSet::new();
        for (method, path, op) in operations(&doc) {
            let id = op["operationId"]
                .as_str()
                .unwrap_or_else(|| panic!("{method} {path}: no operationId"));
            assert!(ids.insert(id.to_owned()), "operationId {id} twice");

            let responses = op["responses"]
                .as_object()
                .unwrap_or_else(|| panic!("{method} {path}: no responses"));
            assert!(!responses.is_empty(), "{method} {path}: no responses");
            for (code, response) in responses {
                assert!(
                    code.len() == 3 && code.chars().all(|c| c.is_ascii_digit()),
                    "{method} {path}: response code {code}"
                );
                let response = resolve(&doc, response);
                assert!(
                    response["description"].is_string(),
                    "{method} {path} {code}: no description"
                );
                // Every error response carries the Error schema.
                if code.starts_with('4') || code.starts_with('5') {
                    let mut refs = Vec::new();
                    collect_refs(
                        &response["content"]["application/json"]["schema"],
                        &mut refs,
                    );
                    // MCP's errors are JSON-RPC responses, as MCP clients expect.
                    let error = if path == "/mcp" {
                        "#/components/schemas/JsonRpcResponse"
                    } else {
                        "#/components/schemas/Error"
                    };
                    assert!(
                        refs.contains(&error),
                        "{method} {path} {code}: not an {error}"
                    );
                }
            }

            let security = op["security"]
                .as_array()
                .unwrap_or_else(|| panic!("{method} {path}: no security"));
            for requirement in security {
                for scheme in requirement.as_object().expect("requirement").keys() {
                    assert!(schemes.contains_key(scheme), "{method} {path}: {scheme}");
                }
            }
        }
        assert_eq!(ids.len(), ROUTES.len());
    }

    #[test]
    fn path_parameters_are_declared() {
        let doc = doc();
        for (method, path, op) in operations(&doc) {
            let declared: BTreeSet<String> = op["parameters"]
                .as_array()
                .map(|ps| {
                    ps.iter()
                        .map(|p| resolve(&doc, p))
                        .filter(|p| p["in"] == "path")
                        .inspect(|p| assert_eq!(p["required"], true, "{method} {path}"))
                        .map(|p| p["name"].as_str().expect("name").to_owned())
                        .collect()
                })
                .unwrap_or_default();
            let in_path: BTreeSet<String> = path
                .split('/')
                .filter_map(|seg| seg.strip_prefix('{')?.strip_suffix('}'))
                .map(str::to_owned)
                .collect();
            assert_eq!(declared, in_path, "{method} {path}");
        }
    }

    #[test]
    fn security_matches_the_route() {
        let doc = doc();
        let schemes_of = |method: &str, path: &str| -> Vec<String> {
            doc["paths"][path][method]["security"]
                .as_array()
                .expect("security")
                .iter()
                .flat_map(|r| r.as_object().expect("requirement").keys().cloned())
                .collect()
        };
        for path in ["/healthz", "/readyz", "/metrics", "/openapi.json"] {
            assert!(schemes_of("get", path).is_empty(), "{path}");
        }
        for (method, path) in [
            ("get", "/v1/sessions/{id}"),
            ("post", "/v1/sessions/{id}/messages"),
            ("post", "/v1/sessions/{id}/cancel"),
            ("get", "/v1/sessions/{id}/events"),
        ] {
            assert_eq!(
                schemes_of(method, path),
                ["ownerToken", "sessionToken"],
                "{method} {path}"
            );
        }
        for (method, path) in [
            ("get", "/v1/sessions"),
            ("post", "/v1/sessions"),
            ("post", "/v1/sessions/{id}/resume"),
            ("post", "/v1/sessions/{id}/fork"),
            ("put", "/v1/sessions/{id}/params"),
            ("delete", "/v1/sessions/{id}/token"),
        ] {
            assert_eq!(schemes_of(method, path), ["ownerToken"], "{method} {path}");
        }
        assert_eq!(
            schemes_of("post", "/mcp"),
            ["ownerToken", "mcpClientToken", "sessionToken"]
        );
        assert_eq!(
            doc["components"]["securitySchemes"]["sessionToken"]["scheme"],
            "bearer"
        );
    }

    #[test]
    fn params_token_and_fork_routes() {
        let doc = doc();
        let put = &doc["paths"]["/v1/sessions/{id}/params"]["put"];
        assert_eq!(put["operationId"], "setSessionParams");
        assert!(put["responses"]["200"].is_object());
        assert!(put["responses"]["403"].is_object());
        assert_eq!(
            put["responses"]["422"]["content"]["application/json"]["schema"]["allOf"][1]
                ["properties"]["error"]["enum"],
            json!(["unknown_params", "invalid_params"])
        );
        let body = resolve(
            &doc,
            &put["requestBody"]["content"]["application/json"]["schema"],
        );
        // The server takes a body without `params` (nothing changes).
        assert!(body.get("required").is_none(), "{body}");
        assert!(body["properties"]["params"].is_object());

        let delete = &doc["paths"]["/v1/sessions/{id}/token"]["delete"];
        assert!(delete["responses"]["204"].is_object());
        assert!(delete["responses"]["204"].get("content").is_none());

        let fork = &doc["paths"]["/v1/sessions/{id}/fork"]["post"];
        assert!(fork["responses"]["201"].is_object());
        assert!(fork["responses"]["403"].is_object());
        let body = resolve(
            &doc,
            &fork["requestBody"]["content"]["application/json"]["schema"],
        );
        assert_eq!(body["properties"]["at_turn"]["type"], "integer");
    }

    #[test]
    fn continuations_take_a_result_or_a_decision() {
        let doc = doc();
        let op = &doc["paths"]["/v1/continuations/{token}"]["post"];
        for code in ["200", "404", "409"] {
            assert!(op["responses"][code].is_object(), "{code}");
        }
        let body = &doc["components"]["schemas"]["ContinuationRequest"]["properties"];
        for field in [
            "result", "approve", "reason", "resume", "params", "run", "choice", "input",
        ] {
            assert!(body[field].is_object(), "{field}");
        }
        let item = &doc["components"]["schemas"]["PendingItem"]["properties"];
        assert!(resolve(&doc, &item["disposition"])["enum"]
            .as_array()
            .unwrap()
            .contains(&json!("confirm")));
    }

    #[test]
    fn session_view_never_carries_secret_values() {
        let doc = doc();
        let view = &doc["components"]["schemas"]["SessionView"];
        assert_eq!(
            view["properties"]["secret_params"]["items"]["type"],
            "string"
        );
        assert!(view["properties"]["pending"]["items"].is_object());
        let agent = &doc["components"]["schemas"]["ParameterView"];
        assert!(agent["properties"].get("value").is_none());
        assert!(agent["properties"].get("default").is_none());
    }

    #[test]
    fn optional_parameters_and_bodies_may_be_left_out_not_null() {
        let doc = doc();
        for (method, path, op) in operations(&doc) {
            let params = op["parameters"].as_array().cloned().unwrap_or_default();
            let body = &op["requestBody"]["content"]["application/json"]["schema"];
            for schema in params.iter().map(|p| &p["schema"]).chain([body]) {
                let text = schema.to_string();
                assert!(!text.contains(r#""null""#), "{method} {path}: {text}");
            }
        }
        for path in ["/v1/sessions/{id}/fork", "/v1/sessions/{id}/resume"] {
            let body = &doc["paths"][path]["post"]["requestBody"];
            assert_eq!(body["required"], false, "{path}: {body}");
            assert!(body["content"]["application/json"]["schema"]["$ref"].is_string());
        }
        let create = &doc["paths"]["/v1/sessions"]["post"]["requestBody"];
        assert_eq!(create["required"], true, "{create}");
    }

    #[test]
    fn events_route_documents_every_kind() {
        let doc = doc();
        let ok = &doc["paths"]["/v1/sessions/{id}/events"]["get"]["responses"]["200"];
        assert!(ok["content"]["text/event-stream"].is_object());
        let kinds: BTreeSet<&String> = ok["x-events"]
            .as_object()
            .expect("x-events")
            .keys()
            .collect();
        let expected = [
            "run_started",
            "message",
            "delta",
            "tool_call",
            "tool_result",
            "run_finished",
            "params_changed",
            "pending",
            "resolved",
            "budget",
        ];
        assert_eq!(kinds.len(), expected.len());
        for kind in expected {
            assert!(kinds.contains(&kind.to_owned()), "{kind}");
        }
    }
}
