//! The OpenAPI 3.1 document of the HTTP API, served at `GET /openapi.json`.
//!
//! Written by hand with `serde_json::json!`: one function per operation, a
//! few helpers for the pieces they share (error responses, security, the
//! `wait`/`timeout` query parameters) and the schemas under `components`.
//! [`ROUTES`] lists every route; the tests check that the document and the
//! list agree.

use serde_json::{json, Map, Value};

/// Every route of the API as `(METHOD, path)`, the path in OpenAPI form
/// (`{id}`, not `:id`).
pub const ROUTES: &[(&str, &str)] = &[
    ("GET", "/healthz"),
    ("GET", "/readyz"),
    ("GET", "/metrics"),
    ("GET", "/openapi.json"),
    ("GET", "/v1/agents"),
    ("GET", "/v1/agents/{slug}"),
    ("POST", "/v1/sessions"),
    ("GET", "/v1/sessions"),
    ("GET", "/v1/sessions/{id}"),
    ("POST", "/v1/sessions/{id}/messages"),
    ("POST", "/v1/sessions/{id}/resume"),
    ("POST", "/v1/sessions/{id}/cancel"),
    ("POST", "/v1/sessions/{id}/fork"),
    ("POST", "/v1/continuations/{token}"),
    ("PUT", "/v1/sessions/{id}/params"),
    ("DELETE", "/v1/sessions/{id}/token"),
    ("GET", "/v1/sessions/{id}/events"),
    ("POST", "/mcp"),
    ("GET", "/"),
    ("GET", "/chat.js"),
    ("GET", "/chat.css"),
];

/// The 422 codes of a request that sets parameters on a new session.
const NEW_SESSION_PARAM_CODES: &[&str] = &["unknown_params", "invalid_params", "params_required"];
/// The 422 codes of a request that sets parameters on an existing session.
const PARAM_CODES: &[&str] = &["unknown_params", "invalid_params"];

/// The whole document; `version` is the server's, shown as `info.version`.
pub fn document(version: &str) -> Value {
    json!({
        "openapi": "3.1.0",
        "info": {
            "title": "Bindery",
            "version": version,
            "description": "Bindery's agent server: run an agent in a session, talk to it, \
                watch its events. Parameter values are write-only: no response ever \
                carries a secret value, and agent views carry no values at all.",
            "license": { "name": "Apache-2.0", "identifier": "Apache-2.0" },
        },
        "tags": [
            { "name": "health", "description": "Liveness, readiness, metrics and this document." },
            { "name": "agents", "description": "The agents this server runs." },
            { "name": "sessions", "description": "Conversations with an agent, their runs and parameters." },
            { "name": "mcp", "description": "The agents as MCP tools (MCP's Streamable HTTP transport)." },
            { "name": "chat", "description": "The chat page, for a person trying an agent." },
        ],
        "security": owner(),
        "paths": paths(),
        "components": {
            "securitySchemes": {
                "ownerToken": {
                    "type": "http",
                    "scheme": "bearer",
                    "description": "The owner token, given to the server at start-up. Allowed everywhere.",
                },
                "sessionToken": {
                    "type": "http",
                    "scheme": "bearer",
                    "description": "A session token (`st_…`), handed out once when a session is \
                        created or forked with `session_token: true`. Valid for that session \
                        only, and only on the operations that list it.",
                },
            },
            "parameters": parameters(),
            "responses": {
                "Unauthorized": error_response(
                    "No valid token: none given, a wrong one, or a session token for another session.",
                    &[],
                ),
            },
            "schemas": schemas(),
        },
    })
}

// ---------------------------------------------------------------------------
// Shared pieces.

/// `{"$ref": "#/components/schemas/<name>"}`.
fn schema(name: &str) -> Value {
    json!({ "$ref": format!("#/components/schemas/{name}") })
}

/// `{"$ref": "#/components/parameters/<name>"}`.
fn parameter(name: &str) -> Value {
    json!({ "$ref": format!("#/components/parameters/{name}") })
}

/// Security: the owner token only.
fn owner() -> Value {
    json!([{ "ownerToken": [] }])
}

/// Security: the owner token, or a session token for this session.
fn owner_or_session() -> Value {
    json!([{ "ownerToken": [] }, { "sessionToken": [] }])
}

/// Security: none.
fn public() -> Value {
    json!([])
}

/// A JSON response body.
fn json_response(description: &str, body: Value) -> Value {
    json!({
        "description": description,
        "content": { "application/json": { "schema": body } },
    })
}

/// An error response; `codes`, when given, are the `error` values it may carry.
fn error_response(description: &str, codes: &[&str]) -> Value {
    let body = if codes.is_empty() {
        schema("Error")
    } else {
        json!({
            "allOf": [
                schema("Error"),
                { "properties": { "error": { "enum": codes } } },
            ],
        })
    };
    json_response(description, body)
}

fn unauthorized() -> Value {
    json!({ "$ref": "#/components/responses/Unauthorized" })
}

fn bad_request() -> Value {
    error_response(
        "The body is not valid JSON or does not have the expected shape, or a query \
         parameter is malformed.",
        &["bad_request"],
    )
}

fn session_not_found() -> Value {
    error_response("No such session.", &["not_found"])
}

fn invalid_params(codes: &[&str]) -> Value {
    error_response(
        "Parameters that are not declared by the agent (`unknown_params`), values that \
         do not fit (`invalid_params`: wrong type, a secret that is not a string, a \
         message-scope parameter where only session values are taken) or required \
         parameters left unbound (`params_required`). `params` names the parameters.",
        codes,
    )
}

/// A required JSON request body.
fn request_body(name: &str) -> Value {
    json!({
        "required": true,
        "content": { "application/json": { "schema": schema(name) } },
    })
}

/// A JSON request body that may be left out.
fn optional_request_body(name: &str) -> Value {
    json!({
        "required": false,
        "content": { "application/json": { "schema": schema(name) } },
    })
}

fn parameters() -> Value {
    json!({
        "SessionId": {
            "name": "id",
            "in": "path",
            "required": true,
            "description": "The session's id.",
            "schema": { "type": "string" },
        },
        "Wait": {
            "name": "wait",
            "in": "query",
            "required": false,
            "description": "Wait for the run this request starts to finish before answering.",
            "schema": { "type": "boolean", "default": false },
        },
        "Timeout": {
            "name": "timeout",
            "in": "query",
            "required": false,
            "description": "With `wait=true`: how many seconds to wait at most (default 60, \
                at most 600; more is a 400). A run still going then is answered with 202.",
            "schema": { "type": "integer", "minimum": 0, "maximum": 600, "default": 60 },
        },
        "LastEventId": {
            "name": "Last-Event-ID",
            "in": "header",
            "required": false,
            "description": "Replay the stored events after this one (an event's `id`) \
                before following new ones.",
            "schema": { "type": "integer", "minimum": 0 },
        },
    })
}

// ---------------------------------------------------------------------------
// Paths.

fn paths() -> Value {
    let operations = [
        ("GET", "/healthz", healthz()),
        ("GET", "/readyz", readyz()),
        ("GET", "/metrics", metrics()),
        ("GET", "/openapi.json", openapi()),
        ("GET", "/v1/agents", list_agents()),
        ("GET", "/v1/agents/{slug}", get_agent()),
        ("POST", "/v1/sessions", create_session()),
        ("GET", "/v1/sessions", list_sessions()),
        ("GET", "/v1/sessions/{id}", get_session()),
        ("POST", "/v1/sessions/{id}/messages", post_message()),
        ("POST", "/v1/sessions/{id}/resume", resume_session()),
        ("POST", "/v1/sessions/{id}/cancel", cancel_session()),
        ("POST", "/v1/sessions/{id}/fork", fork_session()),
        ("POST", "/v1/continuations/{token}", post_continuation()),
        ("PUT", "/v1/sessions/{id}/params", set_params()),
        ("DELETE", "/v1/sessions/{id}/token", revoke_session_tokens()),
        ("GET", "/v1/sessions/{id}/events", stream_events()),
        ("POST", "/mcp", mcp()),
        (
            "GET",
            "/",
            chat_file("chatPage", "The chat page", "text/html"),
        ),
        (
            "GET",
            "/chat.js",
            chat_file("chatScript", "The chat page's script", "text/javascript"),
        ),
        (
            "GET",
            "/chat.css",
            chat_file("chatStyle", "The chat page's style sheet", "text/css"),
        ),
    ];
    let mut paths = Map::new();
    for (method, path, operation) in operations {
        let item = paths
            .entry(path)
            .or_insert_with(|| Value::Object(Map::new()));
        if let Value::Object(item) = item {
            item.insert(method.to_ascii_lowercase(), operation);
        }
    }
    Value::Object(paths)
}

fn healthz() -> Value {
    json!({
        "operationId": "healthz",
        "tags": ["health"],
        "summary": "Liveness: the process is up",
        "security": public(),
        "responses": {
            "200": json_response("Up.", schema("Health")),
        },
    })
}

fn readyz() -> Value {
    json!({
        "operationId": "readyz",
        "tags": ["health"],
        "summary": "Readiness: the server can take requests",
        "security": public(),
        "responses": {
            "200": json_response("Ready.", schema("Ready")),
            "503": error_response(
                "Not ready: starting, or the session store does not answer.",
                &["starting", "store_unavailable"],
            ),
        },
    })
}

fn metrics() -> Value {
    json!({
        "operationId": "metrics",
        "tags": ["health"],
        "summary": "Prometheus metrics",
        "security": public(),
        "responses": {
            "200": {
                "description": "The metrics as OpenMetrics text.",
                "content": { "application/openmetrics-text": { "schema": { "type": "string" } } },
            },
        },
    })
}

fn openapi() -> Value {
    json!({
        "operationId": "openapi",
        "tags": ["health"],
        "summary": "This document",
        "security": public(),
        "responses": {
            "200": json_response("The OpenAPI 3.1 document.", json!({ "type": "object" })),
        },
    })
}

fn list_agents() -> Value {
    json!({
        "operationId": "listAgents",
        "tags": ["agents"],
        "summary": "The agents this server runs",
        "security": owner(),
        "responses": {
            "200": json_response("Every agent.", schema("AgentList")),
            "401": unauthorized(),
        },
    })
}

fn get_agent() -> Value {
    json!({
        "operationId": "getAgent",
        "tags": ["agents"],
        "summary": "One agent",
        "security": owner(),
        "parameters": [{
            "name": "slug",
            "in": "path",
            "required": true,
            "description": "The agent's slug.",
            "schema": { "type": "string" },
        }],
        "responses": {
            "200": json_response("The agent.", schema("AgentView")),
            "401": unauthorized(),
            "404": error_response("No such agent.", &["not_found"]),
        },
    })
}

fn create_session() -> Value {
    json!({
        "operationId": "createSession",
        "tags": ["sessions"],
        "summary": "Start a session, or fork one, and optionally a first run",
        "description": "With `prompt`, a first run starts at once. With `fork`, the new \
            session starts from a copy of that session's conversation and parameters.",
        "security": owner(),
        "parameters": [parameter("Wait"), parameter("Timeout")],
        "requestBody": request_body("CreateSessionRequest"),
        "responses": {
            "201": json_response(
                "Created, and the run (if any) finished. `session_token` is there, this \
                 once, when it was asked for.",
                schema("SessionView"),
            ),
            "202": json_response(
                "Created, and a run was started and not waited for.",
                schema("SessionView"),
            ),
            "400": bad_request(),
            "401": unauthorized(),
            "403": error_response(
                "Parameters that may not be set here: process-scope or pinned ones.",
                &["forbidden_params"],
            ),
            "404": error_response("No such agent, or no such session to fork from.", &["not_found"]),
            "422": invalid_params(NEW_SESSION_PARAM_CODES),
        },
    })
}

fn list_sessions() -> Value {
    json!({
        "operationId": "listSessions",
        "tags": ["sessions"],
        "summary": "Every session",
        "security": owner(),
        "responses": {
            "200": json_response("The sessions.", schema("SessionList")),
            "401": unauthorized(),
        },
    })
}

fn get_session() -> Value {
    json!({
        "operationId": "getSession",
        "tags": ["sessions"],
        "summary": "One session",
        "security": owner_or_session(),
        "parameters": [parameter("SessionId")],
        "responses": {
            "200": json_response("The session.", schema("SessionView")),
            "401": unauthorized(),
            "404": session_not_found(),
        },
    })
}

fn post_message() -> Value {
    json!({
        "operationId": "postMessage",
        "tags": ["sessions"],
        "summary": "Say something: add a user message and start a run",
        "security": owner_or_session(),
        "parameters": [parameter("SessionId"), parameter("Wait"), parameter("Timeout")],
        "requestBody": request_body("MessageRequest"),
        "responses": {
            "200": json_response("The run finished (waited for).", schema("SessionView")),
            "202": json_response("The run started and was not waited for.", schema("SessionView")),
            "400": bad_request(),
            "401": unauthorized(),
            "403": error_response(
                "Parameters this caller may not set: process-scope or pinned ones, or \
                 any session value of a sealed session for a session-token holder.",
                &["forbidden_params"],
            ),
            "404": session_not_found(),
            "409": error_response(
                "A run is in progress (`run_in_progress`), the session waits for pending \
                 calls (`waiting_external`), or required parameters are still unbound \
                 (`params_required`).",
                &["run_in_progress", "waiting_external", "params_required"],
            ),
            "422": invalid_params(PARAM_CODES),
        },
    })
}

fn resume_session() -> Value {
    json!({
        "operationId": "resumeSession",
        "tags": ["sessions"],
        "summary": "Start a run again from where the conversation stands",
        "description": "For a session whose last run failed or was cancelled; `params` may \
            first bind what was missing.",
        "security": owner(),
        "parameters": [parameter("SessionId"), parameter("Wait"), parameter("Timeout")],
        "requestBody": optional_request_body("ResumeRequest"),
        "responses": {
            "200": json_response("The run finished (waited for).", schema("SessionView")),
            "202": json_response("The run started and was not waited for.", schema("SessionView")),
            "400": bad_request(),
            "401": unauthorized(),
            "404": session_not_found(),
            "409": error_response(
                "A run is in progress, a pending call is not answered yet, or required \
                 parameters are still unbound.",
                &["run_in_progress", "waiting_external", "params_required"],
            ),
            "422": invalid_params(PARAM_CODES),
        },
    })
}

fn cancel_session() -> Value {
    json!({
        "operationId": "cancelSession",
        "tags": ["sessions"],
        "summary": "Cancel the run in progress (or the calls it waits for)",
        "security": owner_or_session(),
        "parameters": [parameter("SessionId")],
        "responses": {
            "200": json_response("Cancelled.", schema("SessionView")),
            "401": unauthorized(),
            "404": session_not_found(),
            "409": error_response("No run is in progress.", &["not_running"]),
        },
    })
}

fn fork_session() -> Value {
    json!({
        "operationId": "forkSession",
        "tags": ["sessions"],
        "summary": "Start a new session from a copy of this one",
        "description": "The copy takes the conversation (up to `at_turn` when given) and \
            the session's parameter values; `params` then changes them. With `prompt`, a \
            first run starts at once.",
        "security": owner(),
        "parameters": [parameter("SessionId")],
        "requestBody": optional_request_body("ForkRequest"),
        "responses": {
            "201": json_response(
                "The new session. `session_token` is there, this once, when it was asked for.",
                schema("SessionView"),
            ),
            "400": bad_request(),
            "401": unauthorized(),
            "403": error_response(
                "Session-token holders may not fork, or parameters that may not be set \
                 (process-scope or pinned ones).",
                &[],
            ),
            "404": session_not_found(),
            "422": invalid_params(NEW_SESSION_PARAM_CODES),
        },
    })
}

fn post_continuation() -> Value {
    json!({
        "operationId": "postContinuation",
        "tags": ["sessions"],
        "summary": "Answer a pending tool call: a deferred call's result, or a decision",
        "description": "Each item of a session's `pending` carries a `continuation_token`. \
            For a `deferred` call send `result` (the tool's output: a string, or any JSON \
            given to the model as its text); for a `confirm` call send `approve` (and an \
            optional `reason`, which the model reads when the call is refused); for a \
            `needs_selection` item send `choice` (the `id` of one of its `options`), for \
            `needs_confirmation` `approve`, for `needs_input` `input` (the missing \
            fields). A selection or confirmation that rests on lookups past their \
            `ttl_ms` is refused (409 `continuation_expired`) and asked again. The token \
            names its session (`ct_<session id>_<mac>`): no other identifier is needed. \
            `session_id` may say which session the caller means; a token of another \
            session is then unknown (404). A token is good for one answer (a second is \
            409 `continuation_used`), and is bound to the exact call: the tool, the \
            model's arguments and the names of the parameters bound into it; when those \
            changed (the agent was reloaded with other bindings) the answer is 409 \
            `call_changed`. Past the agent's `confirmTtl` the call is closed as not \
            approved (409 `continuation_expired`). When the last pending call is \
            answered the run resumes (unless `resume: false` or `run: none`); `params` \
            then follow the same rules as on resume, so message-scope values come with \
            this request, and a call that gets a secret session value this server no \
            longer holds (after a restart) answers 409 `params_required` until it is \
            given again with `PUT /v1/sessions/{id}/params`. Owner only.",
        "security": owner(),
        "parameters": [{
            "name": "token",
            "in": "path",
            "required": true,
            "description": "The pending item's `continuation_token`.",
            "schema": { "type": "string" },
        }, parameter("Wait"), parameter("Timeout")],
        "requestBody": request_body("ContinuationRequest"),
        "responses": {
            "200": json_response(
                "The answer is recorded; the run it resumed finished or blocked again \
                 (waited for), or no run was started.",
                schema("SessionView"),
            ),
            "202": json_response("The run resumed and was not waited for.", schema("SessionView")),
            "400": bad_request(),
            "401": unauthorized(),
            "403": error_response("Parameters this caller may not set.", &["forbidden_params"]),
            "404": error_response(
                "No pending call of the named session has this token.",
                &["not_found"],
            ),
            "409": error_response(
                "The token was used already, the call changed, the confirmation \
                 expired, or a required or bound secret value is missing.",
                &["continuation_used", "call_changed", "continuation_expired", "params_required", "run_in_progress"],
            ),
            "422": invalid_params(PARAM_CODES),
        },
    })
}

fn set_params() -> Value {
    json!({
        "operationId": "setSessionParams",
        "tags": ["sessions"],
        "summary": "Set or remove session-scope parameter values",
        "security": owner(),
        "parameters": [parameter("SessionId")],
        "requestBody": request_body("SetParamsRequest"),
        "responses": {
            "200": json_response("The session, with its new values.", schema("SessionView")),
            "400": bad_request(),
            "401": unauthorized(),
            "403": error_response(
                "Not allowed: a session token was used, the session is sealed and the \
                 caller is not its owner, or the parameters are process-scope or pinned.",
                &[],
            ),
            "404": session_not_found(),
            "422": error_response(
                "Parameters not declared by the agent (`unknown_params`), or values \
                 that do not fit (`invalid_params`: wrong type, a secret that is not a \
                 string, or a message-scope parameter).",
                PARAM_CODES,
            ),
        },
    })
}

fn revoke_session_tokens() -> Value {
    json!({
        "operationId": "revokeSessionTokens",
        "tags": ["sessions"],
        "summary": "Revoke every session token of this session",
        "security": owner(),
        "parameters": [parameter("SessionId")],
        "responses": {
            "204": { "description": "Revoked (also when there was none)." },
            "401": unauthorized(),
            "404": session_not_found(),
        },
    })
}

/// A JSON-RPC error response of `/mcp`.
fn jsonrpc_error(description: &str) -> Value {
    json_response(description, schema("JsonRpcResponse"))
}

/// A file of the chat page: public, as the page holds no data (the person
/// gives it a token); served with a strict Content-Security-Policy.
fn chat_file(id: &str, summary: &str, media_type: &str) -> Value {
    json!({
        "operationId": id,
        "tags": ["chat"],
        "summary": summary,
        "security": public(),
        "responses": {
            "200": {
                "description": "The file, embedded in the server.",
                "headers": {
                    "Content-Security-Policy": { "schema": { "type": "string" } },
                },
                "content": { media_type: { "schema": { "type": "string" } } },
            },
        },
    })
}

fn mcp() -> Value {
    json!({
        "operationId": "mcp",
        "tags": ["mcp"],
        "summary": "MCP over HTTP: one `ask_<agent>` tool per agent, each call one run",
        "description": "MCP's Streamable HTTP transport, stateless: each POST carries one \
            JSON-RPC message (a batch only in protocol 2025-03-26) and is answered with \
            `application/json`; no session id, no server-sent events (`GET /mcp` is 405). \
            Methods: `initialize` (protocol 2025-03-26, 2025-06-18 or 2025-11-25), `ping`, \
            `tools/list`, `tools/call`; in protocol 2026-07-28 `server/discover` instead of \
            `initialize` and `ping`, with the version in each request's `_meta`. A `tools/call` starts a new session on the tool's \
            agent, runs `arguments.prompt` to the end and answers with the model's last \
            text; the session's id is in the result's `_meta` \"bindery.dev/session_id\". \
            Parameter values come from `Agents-Param-<name>` request headers (strings; \
            the name is case-insensitive, `-` read as `_`) and from the call's `_meta` \
            \"agents-exe/params\" (any JSON; wins by name). They are validated like a \
            session creation with a prompt; a refusal is a JSON-RPC error with code \
            -32602 and `data` `{error, status, params}` holding the session API's code \
            (`unknown_params`, `forbidden_params`, `invalid_params`, `params_required`).",
        "security": owner(),
        "parameters": [{
            "name": "MCP-Protocol-Version",
            "in": "header",
            "required": false,
            "description": "The protocol version `initialize` agreed on; 2025-03-26 when absent. \
                Another value is a 400 (a JSON-RPC error).",
            "schema": { "enum": super::mcp::PROTOCOL_VERSIONS },
        }],
        "requestBody": {
            "required": true,
            "content": { "application/json": { "schema": {
                "oneOf": [
                    schema("JsonRpcMessage"),
                    {
                        "type": "array",
                        "description": "A batch (protocol 2025-03-26): each entry that is \
                            not a JSON-RPC message gets an error response of its own.",
                        "items": {},
                    },
                ],
            } } },
        },
        "responses": {
            "200": json_response(
                "The JSON-RPC response; an array of them for a batch.",
                json!({
                    "oneOf": [
                        schema("JsonRpcResponse"),
                        { "type": "array", "items": schema("JsonRpcResponse") },
                    ],
                }),
            ),
            "202": { "description": "Only notifications or responses were posted: nothing to answer." },
            "400": jsonrpc_error(
                "Not JSON, not a JSON-RPC message, an unsupported MCP-Protocol-Version, or a \
                 batch in a protocol version that has none.",
            ),
            "401": jsonrpc_error(
                "No owner token (session tokens are not valid here); the error's code is -32001.",
            ),
            "406": jsonrpc_error("`Accept` does not allow `application/json`."),
        },
    })
}

fn stream_events() -> Value {
    json!({
        "operationId": "streamEvents",
        "tags": ["sessions"],
        "summary": "Follow the session's events (server-sent events)",
        "description": "Each event is sent as `id: <seq>` (left out for `delta`), \
            `event: <kind>` and `data: <JSON>`. With `Last-Event-ID`, the stored events \
            after that id are replayed first. `x-events` gives the `data` schema of \
            each kind.",
        "security": owner_or_session(),
        "parameters": [parameter("SessionId"), parameter("LastEventId")],
        "responses": {
            "200": {
                "description": "The event stream; it stays open.",
                "content": { "text/event-stream": { "schema": {
                    "description": "One server-sent event: `id` (its sequence number), \
                        `event` (a key of `x-events`) and `data` (that event's JSON).",
                    "type": "object",
                    "properties": {
                        "id": { "type": "string" },
                        "event": { "type": "string" },
                        "data": { "type": "string" },
                    },
                } } },
                "x-events": {
                    "run_started": schema("RunStartedEvent"),
                    "message": schema("Turn"),
                    "delta": schema("DeltaEvent"),
                    "tool_call": schema("ToolCallEvent"),
                    "tool_result": schema("ToolResultEvent"),
                    "run_finished": schema("RunFinishedEvent"),
                    "params_changed": schema("ParamsChangedEvent"),
                    "pending": schema("PendingEvent"),
                    "resolved": schema("ResolvedEvent"),
                },
            },
            "401": unauthorized(),
            "404": session_not_found(),
        },
    })
}

// ---------------------------------------------------------------------------
// Schemas.

fn schemas() -> Value {
    let mut all = Map::new();
    for part in [
        basic_schemas(),
        agent_schemas(),
        session_schemas(),
        request_schemas(),
        event_schemas(),
        mcp_schemas(),
    ] {
        if let Value::Object(part) = part {
            all.extend(part);
        }
    }
    Value::Object(all)
}

/// `{"type": "string", "format": "date-time"}` with a description.
fn timestamp(description: &str) -> Value {
    json!({ "type": "string", "format": "date-time", "description": description })
}

fn basic_schemas() -> Value {
    json!({
        "Error": {
            "type": "object",
            "required": ["error", "message"],
            "properties": {
                "error": { "type": "string", "description": "A stable, machine-readable code." },
                "message": { "type": "string", "description": "For people." },
                "params": {
                    "type": "array",
                    "items": { "type": "string" },
                    "description": "The parameters the error is about, when it is about some.",
                },
            },
        },
        "Health": {
            "type": "object",
            "required": ["status"],
            "properties": { "status": { "const": "ok" } },
        },
        "Ready": {
            "type": "object",
            "required": ["status"],
            "properties": { "status": { "const": "ready" } },
        },
        "ParamValues": {
            "type": "object",
            "description": "Parameter name → JSON value; `null` removes the value. Secret \
                values must be strings.",
            "additionalProperties": true,
        },
    })
}

fn agent_schemas() -> Value {
    json!({
        "AgentView": {
            "type": "object",
            "description": "An agent as callers see it: what it takes, never any value.",
            "required": ["slug", "parameters", "tools"],
            "properties": {
                "slug": { "type": "string" },
                "announce": { "type": "string", "description": "What the agent says it is for." },
                "parameters": { "type": "array", "items": schema("ParameterView") },
                "tools": {
                    "type": "array",
                    "items": { "type": "string" },
                    "description": "The names of the tools the agent may call.",
                },
                "waits": {
                    "type": "object",
                    "additionalProperties": { "enum": ["confirm", "deferred"] },
                    "description": "The tools whose calls wait, by name: for a person's \
                        approval (`confirm`) or for the client's result (`deferred`).",
                },
                "depends_on": {
                    "type": "object",
                    "additionalProperties": { "type": "array", "items": { "type": "string" } },
                    "description": "The tools with `depends_on`, by name: their lookups, in \
                        order. Their calls may stop at `needs_input`, `needs_selection` or \
                        `needs_confirmation`.",
                },
            },
        },
        "ParameterView": {
            "type": "object",
            "required": ["name", "scope", "secret", "required", "bound", "pinned"],
            "properties": {
                "name": { "type": "string" },
                "description": { "type": "string" },
                "scope": {
                    "enum": ["process", "session", "message"],
                    "description": "Who sets it: the server (process), a session, or each message.",
                },
                "secret": { "type": "boolean" },
                "required": { "type": "boolean" },
                "bound": {
                    "type": "boolean",
                    "description": "A value is bound at process level.",
                },
                "pinned": {
                    "type": "boolean",
                    "description": "The process-level value may not be overridden.",
                },
            },
        },
        "AgentList": {
            "type": "object",
            "required": ["agents"],
            "properties": { "agents": { "type": "array", "items": schema("AgentView") } },
        },
    })
}

fn session_schemas() -> Value {
    json!({
        "SessionStatus": {
            "enum": ["idle", "running", "failed", "waiting_external"],
            "description": "`idle`: ready for a message; `running`: a run is in progress; \
                `failed`: the last run failed (see `status_detail`); `waiting_external`: \
                the run stopped with tool calls pending (see `pending`).",
        },
        "SessionView": {
            "type": "object",
            "required": [
                "session_id", "agent", "status", "version", "created_at", "updated_at",
                "sealed", "params", "secret_params", "session", "pending",
            ],
            "properties": {
                "session_id": { "type": "string" },
                "agent": { "type": "string", "description": "The agent's slug." },
                "status": schema("SessionStatus"),
                "status_detail": {
                    "type": ["string", "null"],
                    "description": "Why the last run failed, stopped, or what it waits for.",
                },
                "version": {
                    "type": "integer",
                    "description": "Bumped on every change of the session.",
                },
                "created_at": timestamp("RFC 3339."),
                "updated_at": timestamp("RFC 3339."),
                "forked_from": {
                    "type": ["string", "null"],
                    "description": "The session this one was forked from.",
                },
                "parent_session_id": {
                    "type": ["string", "null"],
                    "description": "The session this one was forked from (agents-server's name; same as `forked_from`).",
                },
                "owner": {
                    "type": "string",
                    "description": "Who created the session: `owner` (this API) or `mcp` (a call on /mcp).",
                },
                "sealed": {
                    "type": "boolean",
                    "description": "Only the owner may change parameters.",
                },
                "params": {
                    "type": "object",
                    "additionalProperties": true,
                    "description": "The session's non-secret values, by parameter name.",
                },
                "secret_params": {
                    "type": "array",
                    "items": { "type": "string" },
                    "description": "The names of the secret values the session holds; never the values.",
                },
                "session": {
                    "type": "object",
                    "required": ["turns"],
                    "properties": {
                        "turns": {
                            "type": "array",
                            "items": schema("Turn"),
                            "description": "The conversation, oldest first.",
                        },
                    },
                },
                "pending": {
                    "type": "array",
                    "items": schema("PendingItem"),
                    "description": "Tool calls the run waits for, each answered through \
                        its continuation. A session-token holder sees them without tokens.",
                },
                "session_token": {
                    "type": "string",
                    "description": "A new session token (`st_…`), only in the response that \
                        created it (session creation or fork with `session_token: true`).",
                },
            },
        },
        "SessionSummary": {
            "type": "object",
            "required": ["session_id", "agent", "status", "created_at", "updated_at"],
            "properties": {
                "session_id": { "type": "string" },
                "agent": { "type": "string" },
                "status": schema("SessionStatus"),
                "created_at": timestamp("RFC 3339."),
                "updated_at": timestamp("RFC 3339."),
                "forked_from": { "type": ["string", "null"] },
            },
        },
        "SessionList": {
            "type": "object",
            "required": ["sessions"],
            "properties": { "sessions": { "type": "array", "items": schema("SessionSummary") } },
        },
        "Turn": {
            "type": "object",
            "description": "One message of the conversation: an OpenAI chat message.",
            "required": ["role"],
            "properties": {
                "role": { "enum": ["user", "assistant", "tool"] },
                "content": {
                    "type": ["string", "null"],
                    "description": "The text; `null` for an assistant message with tool calls only.",
                },
                "tool_calls": {
                    "type": "array",
                    "items": schema("ToolCall"),
                    "description": "Assistant messages: the tools the model called.",
                },
                "tool_call_id": {
                    "type": "string",
                    "description": "Tool messages: the call this answers.",
                },
            },
        },
        "ToolCall": {
            "type": "object",
            "required": ["id", "type", "function"],
            "properties": {
                "id": { "type": "string" },
                "type": { "const": "function" },
                "function": {
                    "type": "object",
                    "required": ["name", "arguments"],
                    "properties": {
                        "name": { "type": "string" },
                        "arguments": {
                            "type": "string",
                            "description": "JSON text as the model sent it; not necessarily valid.",
                        },
                    },
                },
            },
        },
    })
}

fn request_schemas() -> Value {
    json!({
        "CreateSessionRequest": {
            "type": "object",
            "required": ["agent"],
            "properties": {
                "agent": { "type": "string", "description": "The agent's slug." },
                "prompt": { "type": "string", "description": "A first message: starts a run." },
                "params": schema("ParamValues"),
                "seal": {
                    "type": "boolean",
                    "description": "Only the owner may change the parameters from now on.",
                },
                "session_token": {
                    "type": "boolean",
                    "description": "Hand out a session token in the response.",
                },
                "fork": {
                    "type": "string",
                    "description": "The id of a session to start from a copy of.",
                },
                "run": schema("RunMode"),
            },
        },
        "MessageRequest": {
            "type": "object",
            "required": ["prompt"],
            "properties": {
                "prompt": { "type": "string" },
                "params": schema("ParamValues"),
                "run": schema("RunMode"),
            },
        },
        "ResumeRequest": {
            "type": "object",
            "properties": { "params": schema("ParamValues"), "run": schema("RunMode") },
        },
        "ForkRequest": {
            "type": "object",
            "properties": {
                "params": schema("ParamValues"),
                "prompt": { "type": "string", "description": "A first message: starts a run." },
                "seal": { "type": "boolean" },
                "session_token": {
                    "type": "boolean",
                    "description": "Hand out a session token for the new session.",
                },
                "at_turn": {
                    "type": "integer",
                    "minimum": 0,
                    "description": "Copy only the turns before this index (0: none); past \
                        the source's last turn is a 400.",
                },
            },
        },
        "ContinuationRequest": {
            "type": "object",
            "description": "`result` for a deferred call, `approve` for a confirmation, \
                `choice` for a selection, `input` for missing user-owned fields.",
            "additionalProperties": false,
            "properties": {
                "choice": {
                    "type": "string",
                    "description": "The `id` of the chosen option (`needs_selection`).",
                },
                "input": {
                    "type": "object",
                    "description": "The user-owned fields a `needs_input` item lists as `missing`.",
                },
                "result": { "description": "The deferred tool's result: any JSON value." },
                "approve": { "type": "boolean", "description": "A confirmation's decision." },
                "reason": {
                    "type": "string",
                    "description": "Why the call is refused; the model reads it.",
                },
                "session_id": {
                    "type": "string",
                    "description": "The session the caller means (optional).",
                },
                "resume": {
                    "type": "boolean",
                    "description": "`false`: record the answer only; a later resume goes on.",
                },
                "run": schema("RunMode"),
                "params": schema("ParamValues"),
            },
        },
        "RunMode": {
            "enum": ["none", "step", "until_blocked"],
            "description": "How far the run goes: `until_blocked` (default) until the model \
                answers or a call waits; `step` one model turn and its tool calls; `none` no \
                run (creation only).",
        },
        "SetParamsRequest": {
            "type": "object",
            "description": "Without `params` (or with an empty body) nothing changes.",
            "properties": { "params": schema("ParamValues") },
        },
    })
}

fn event_schemas() -> Value {
    json!({
        "RunStartedEvent": {
            "type": "object",
            "description": "`run_started`: a run began.",
            "additionalProperties": true,
        },
        "DeltaEvent": {
            "type": "object",
            "description": "`delta`: a piece of the assistant's text as it streams in. \
                Not stored, so it has no id and is never replayed.",
            "required": ["content"],
            "properties": { "content": { "type": "string" } },
        },
        "ToolCallEvent": {
            "type": "object",
            "description": "`tool_call`: the model called a tool.",
            "required": ["id", "name", "arguments"],
            "properties": {
                "id": { "type": "string" },
                "name": { "type": "string" },
                "arguments": {
                    "type": "string",
                    "description": "As the model sent them; not necessarily valid JSON.",
                },
            },
        },
        "ToolResultEvent": {
            "type": "object",
            "description": "`tool_result`: what a tool call gave back.",
            "required": ["id", "ok", "output"],
            "properties": {
                "id": { "type": "string", "description": "The tool call's id." },
                "ok": { "type": "boolean" },
                "output": { "type": "string", "description": "As given to the model." },
            },
        },
        "RunFinishedEvent": {
            "type": "object",
            "description": "`run_finished`: the run ended (`blocked`: calls wait, see `pending`).",
            "required": ["status"],
            "properties": {
                "status": { "enum": ["completed", "failed", "cancelled", "max_steps", "blocked"] },
                "detail": { "type": "string" },
            },
        },
        "PendingItem": {
            "type": "object",
            "required": ["tool_call_id", "tool", "disposition", "call"],
            "properties": {
                "tool_call_id": { "type": "string" },
                "continuation_token": {
                    "type": "string",
                    "description": "`ct_…`: POST /v1/continuations/{token} answers the call. \
                        Stored only as a digest; never in events.",
                },
                "tool": { "type": "string", "description": "The model-visible tool name." },
                "via": {
                    "type": "array",
                    "items": { "type": "string" },
                    "description": "The helpers (`prompt_agent_*`) the call was made in, \
                        outermost first; answering it resumes them, then their caller.",
                },
                "disposition": {
                    "enum": ["deferred", "confirm", "needs_input", "needs_selection", "needs_confirmation"],
                    "description": "`deferred`: the client runs the tool and posts the \
                        result; `confirm`: a person approves the call, or not; for a tool \
                        with `depends_on`: `needs_input` (user-owned fields are missing), \
                        `needs_selection` (choose one of `options`), `needs_confirmation` \
                        (approve the prepared write, shown by its `facts`).",
                },
                "missing": {
                    "type": "array",
                    "items": { "type": "string" },
                    "description": "`needs_input`: the fields to send as `input`.",
                },
                "lookup": { "type": "string", "description": "`needs_selection`: the lookup tool the options come from." },
                "options": {
                    "type": "array",
                    "description": "`needs_selection`: what the API offered, in its order. An \
                        `id` is opaque when the lookup's ids are sensitive.",
                    "items": {
                        "type": "object",
                        "properties": {
                            "id": { "type": "string" },
                            "label": { "type": "string" },
                            "facts": { "type": "object" },
                        },
                    },
                },
                "facts": { "type": "object", "description": "`needs_confirmation`: what the chosen options said." },
                "note": { "type": "string", "description": "Why it asks (no exact match, several, the API refused the earlier call)." },
                "call": {
                    "description": "The model's arguments. Bound values never appear.",
                },
                "expires_at": timestamp("When an unanswered confirmation closes as not approved."),
            },
        },
        "PendingEvent": {
            "type": "object",
            "description": "`pending`: the run stopped; these calls wait (no tokens: read \
                them from the session).",
            "required": ["pending"],
            "properties": { "pending": { "type": "array", "items": schema("PendingItem") } },
        },
        "ResolvedEvent": {
            "type": "object",
            "description": "`resolved`: a pending call was answered or closed.",
            "required": ["tool_call_id", "outcome"],
            "properties": {
                "tool_call_id": { "type": "string" },
                "tool": { "type": "string" },
                "outcome": { "enum": ["result", "approved", "chosen", "input", "rejected", "expired", "cancelled"] },
            },
        },
        "ParamsChangedEvent": {
            "type": "object",
            "description": "`params_changed`: session values were set or removed. Names only.",
            "required": ["names"],
            "properties": { "names": { "type": "array", "items": { "type": "string" } } },
        },
    })
}

fn mcp_schemas() -> Value {
    json!({
        "JsonRpcMessage": {
            "type": "object",
            "description": "A JSON-RPC 2.0 request, notification or response.",
            "required": ["jsonrpc"],
            "properties": {
                "jsonrpc": { "const": "2.0" },
                "id": { "type": ["string", "integer"] },
                "method": { "type": "string" },
                "params": {
                    "description": "The method's parameters (an object); any other value \
                        is answered, like an unknown method, with a JSON-RPC error in a 200.",
                },
            },
        },
        "JsonRpcResponse": {
            "type": "object",
            "required": ["jsonrpc", "id"],
            "properties": {
                "jsonrpc": { "const": "2.0" },
                "id": { "type": ["string", "integer", "null"] },
                "result": { "type": "object" },
                "error": schema("JsonRpcError"),
            },
        },
        "JsonRpcError": {
            "type": "object",
            "required": ["code", "message"],
            "properties": {
                "code": {
                    "type": "integer",
                    "description": "-32602 for parameters the session API would refuse (and \
                        other invalid params), -32001 without an owner token, -32601 for an \
                        unknown method, -32600/-32700 for malformed messages.",
                },
                "message": { "type": "string" },
                "data": schema("McpErrorData"),
            },
        },
        "McpErrorData": {
            "type": "object",
            "description": "The session API's error, for errors it would also give.",
            "required": ["error", "status"],
            "properties": {
                "error": { "type": "string", "description": "The session API's code, e.g. `unknown_params`." },
                "status": { "type": "integer", "description": "The HTTP status the session API would answer with." },
                "params": { "type": "array", "items": { "type": "string" } },
            },
        },
    })
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use super::*;

    const METHODS: [&str; 8] = [
        "get", "put", "post", "delete", "options", "head", "patch", "trace",
    ];

    fn doc() -> Value {
        document("1.2.3")
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
            ("post", "/mcp"),
        ] {
            assert_eq!(schemes_of(method, path), ["ownerToken"], "{method} {path}");
        }
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
        assert!(item["disposition"]["enum"]
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
        ];
        assert_eq!(kinds.len(), expected.len());
        for kind in expected {
            assert!(kinds.contains(&kind.to_owned()), "{kind}");
        }
    }
}
