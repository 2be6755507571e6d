//! MCP over HTTP, server side: `POST /mcp`, MCP's Streamable HTTP
//! transport as a stateless JSON endpoint. Each POST carries one JSON-RPC
//! message (or, in protocol 2025-03-26, a batch) and is answered with
//! `application/json`; there is no session id and no server-initiated
//! stream (`GET /mcp` is 405).
//!
//! Methods: `initialize`, `ping`, `tools/list` (one `ask_<slug>` tool per
//! agent) and `tools/call` (one run, see [`bindery_session::ask`]); from
//! protocol 2026-07-28 on, `server/discover` instead of the handshake (see
//! [`stateless`]). Authentication is the session API's (the owner token,
//! the MCP client token, a session token with its session named), checked
//! before the body is read: [`Who`] is the handler's extractor.

pub mod elicit;
pub mod exposed;
pub mod jsonrpc;
pub mod params;
pub mod schema;
pub mod stateless;
pub mod tools;

use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::{FromRequestParts, State};
use axum::http::request::Parts;
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::{json, Value};

use self::jsonrpc::{classify, response, Incoming, RpcError};
use super::auth::{Identified, Identity};
use super::state::AppState;
use bindery_session::error::{Code, ServiceError};
use bindery_session::validate::Caller;
use schema::{JsonRpcResponse, McpProtocolVersion, McpRequest, McpResponse};

/// The protocol versions served, oldest first. All use Streamable HTTP;
/// 2024-11-05's HTTP+SSE transport is not served. The last one has no
/// handshake: see [`stateless`].
pub const PROTOCOL_VERSIONS: &[&str] =
    &["2025-03-26", "2025-06-18", "2025-11-25", stateless::VERSION];
/// The newest version `initialize` agrees to (later ones have no handshake).
const LATEST: &str = "2025-11-25";
/// Assumed when a client sends no `MCP-Protocol-Version` (the spec says so).
const DEFAULT_VERSION: &str = "2025-03-26";

/// An HTTP answer carrying a JSON-RPC error (id `null`: the request was
/// refused before its id was read).
fn refused(status: StatusCode, e: RpcError) -> Response {
    (status, Json(response(Value::Null, Err(e)))).into_response()
}

/// MCP over HTTP: one `ask_<agent>` tool per agent, and the tools of the agents that expose theirs
///
/// MCP's Streamable HTTP transport, stateless: each POST carries one
/// JSON-RPC message (a batch only in protocol 2025-03-26) and is answered
/// with `application/json`; no session id, no server-sent events (`GET /mcp`
/// is 405). Methods: `initialize` (protocol 2025-03-26, 2025-06-18 or
/// 2025-11-25), `ping`, `tools/list`, `tools/call`; in protocol 2026-07-28
/// `server/discover` instead of `initialize` and `ping`, with the version
/// and the client's capabilities in each request's `_meta` and
/// `Mcp-Method`/`Mcp-Name` headers that agree with the body.
///
/// An `ask_<agent>` call starts a new session on the tool's agent (or, with
/// `_meta` "bindery.dev/session_id", posts a message in that session), runs
/// `arguments.prompt` to the end and answers with the model's last text;
/// the session's id is in the result's `_meta` "bindery.dev/session_id".
/// An agent with `spec.mcp.exposeTools` also lists its own tools as its
/// model sees them (bound arguments removed; `<agent>__<tool>` when the
/// server serves several agents): a call runs through the same bindings,
/// confirmations, lookups, cache and scrubber as a model's call, in a
/// session of its own (or the one `_meta` names), and answers with the
/// tool's result. A call that waits for a person did not run: its result is
/// an error whose `structuredContent.pending` holds the items as the
/// session API shows them; on 2026-07-28, to the owner's client that
/// declares elicitation, it is an `input_required` result with one form per
/// item instead.
///
/// Parameter values come from `Agents-Param-<name>` request headers
/// (strings; the name is case-insensitive, `-` read as `_`) and from the
/// call's `_meta` "agents-exe/params" (any JSON; wins by name). They are
/// validated like a session creation; a refusal is a JSON-RPC error with
/// code -32602 and `data` `{error, status, params}` holding the session
/// API's code (`unknown_params`, `forbidden_params`, `invalid_params`,
/// `params_required`).
///
/// The owner token reaches every tool and may answer pending items; the
/// MCP client token (`serve --mcp-client-token-file`) the exposed tools
/// only, answering nothing; a session token, with its session named in a
/// `Bindery-Session-Id` header, that session's `ask_<agent>` only.
#[utoipa::path(post, path = "/mcp", tag = "mcp", operation_id = "mcp",
    security(("ownerToken" = []), ("mcpClientToken" = []), ("sessionToken" = [])),
    params(("MCP-Protocol-Version" = inline(Option<McpProtocolVersion>), Header,
        description = "The protocol version `initialize` agreed on (or, from 2026-07-28, \
            the one in the request's `_meta`); 2025-03-26 when absent. Another value is a \
            400 (a JSON-RPC error)."),
        ("Bindery-Session-Id" = Option<String>, Header,
            description = "With a session token: the session it belongs to (its `ask_<agent>` \
            tool is then the only one listed).")),
    request_body = inline(McpRequest),
    responses(
        (status = 200, description = "The JSON-RPC response; an array of them for a batch.",
            body = inline(McpResponse)),
        (status = 202,
            description = "Only notifications or responses were posted: nothing to answer."),
        (status = 400, body = JsonRpcResponse, description = "Not JSON, not a JSON-RPC \
            message, an unsupported MCP-Protocol-Version, a batch in a protocol version \
            that has none, or (2026-07-28) a request whose `_meta` or headers are missing or \
            disagree with its body."),
        (status = 401, body = JsonRpcResponse, description = "None of the owner token, the MCP \
            client token, or a session token with its session in `Bindery-Session-Id`; the \
            error's code is -32001."),
        (status = 406, body = JsonRpcResponse,
            description = "`Accept` does not allow `application/json`."),
    ),
)]
pub async fn post(
    State(s): State<Arc<AppState>>,
    who: Who,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let who = &who;
    if !accepts_json(&headers) {
        return refused(
            StatusCode::NOT_ACCEPTABLE,
            RpcError::new(
                jsonrpc::INVALID_REQUEST,
                "this endpoint answers with application/json only; accept it",
            ),
        );
    }
    let version = match headers.get("mcp-protocol-version").map(|v| v.to_str()) {
        None => DEFAULT_VERSION,
        Some(Ok(v)) if PROTOCOL_VERSIONS.contains(&v.trim()) => v.trim(),
        Some(v) => {
            return refused(
                StatusCode::BAD_REQUEST,
                stateless::unsupported(v.unwrap_or("(not text)")),
            )
        }
    };
    let message: Value = match serde_json::from_slice(&body) {
        Ok(v) => v,
        Err(e) => {
            return refused(
                StatusCode::BAD_REQUEST,
                RpcError::new(jsonrpc::PARSE_ERROR, format!("the body is not JSON: {e}")),
            )
        }
    };
    match message {
        Value::Array(batch) => post_batch(&s, &headers, who, version, batch).await,
        single => match classify(single) {
            Err((id, e)) => (StatusCode::BAD_REQUEST, Json(response(id, Err(e)))).into_response(),
            Ok(Incoming::NoReply) => StatusCode::ACCEPTED.into_response(),
            Ok(Incoming::Request { id, method, params }) => {
                match stateless::Era::of(&headers, &method, &params) {
                    Err(e) => (StatusCode::BAD_REQUEST, Json(response(id, Err(e)))).into_response(),
                    Ok(stateless::Era::Legacy) => {
                        let outcome =
                            handle(&s, &headers, who, stateless::Era::Legacy, &method, params)
                                .await;
                        Json(response(id, outcome)).into_response()
                    }
                    Ok(stateless::Era::Stateless) => {
                        let outcome = match method.as_str() {
                            "server/discover" => Ok(stateless::discover(INSTRUCTIONS)),
                            "initialize" | "ping" => Err(RpcError::new(
                                jsonrpc::METHOD_NOT_FOUND,
                                format!("protocol {} has no `{method}`: call server/discover, then tools/list and tools/call", stateless::VERSION),
                            )),
                            _ => {
                                handle(&s, &headers, who, stateless::Era::Stateless, &method, params)
                                    .await
                            }
                        };
                        let outcome = outcome.map(|r| stateless::complete(&method, r));
                        Json(response(id, outcome)).into_response()
                    }
                }
            }
        },
    }
}

/// JSON-RPC batches exist in protocol 2025-03-26 only (`initialize` never
/// in one); later versions removed them.
async fn post_batch(
    s: &AppState,
    headers: &HeaderMap,
    who: &Who,
    version: &str,
    batch: Vec<Value>,
) -> Response {
    if version != "2025-03-26" {
        return refused(
            StatusCode::BAD_REQUEST,
            RpcError::new(
                jsonrpc::INVALID_REQUEST,
                format!("protocol {version} has no JSON-RPC batches; send one message per POST"),
            ),
        );
    }
    if batch.is_empty() {
        return refused(
            StatusCode::BAD_REQUEST,
            RpcError::new(jsonrpc::INVALID_REQUEST, "an empty batch"),
        );
    }
    let answers = batch.into_iter().map(|m| async move {
        match classify(m) {
            Err((id, e)) => Some(response(id, Err(e))),
            Ok(Incoming::NoReply) => None,
            Ok(Incoming::Request { id, method, .. }) if method == "initialize" => Some(response(
                id,
                Err(RpcError::new(
                    jsonrpc::INVALID_REQUEST,
                    "initialize must not be part of a batch",
                )),
            )),
            Ok(Incoming::Request { id, method, params }) => Some(response(
                id,
                handle(s, headers, who, stateless::Era::Legacy, &method, params).await,
            )),
        }
    });
    let answers: Vec<Value> = futures::future::join_all(answers)
        .await
        .into_iter()
        .flatten()
        .collect();
    if answers.is_empty() {
        return StatusCode::ACCEPTED.into_response();
    }
    Json(Value::Array(answers)).into_response()
}

/// `GET /mcp` (and any other method): no server-initiated stream, no
/// session to delete.
pub async fn not_allowed() -> Response {
    let mut r = refused(
        StatusCode::METHOD_NOT_ALLOWED,
        RpcError::new(
            jsonrpc::INVALID_REQUEST,
            "this MCP endpoint is stateless: POST JSON-RPC messages; it opens no stream",
        ),
    );
    r.headers_mut()
        .insert(header::ALLOW, HeaderValue::from_static("POST"));
    r
}

/// `Accept` absent, or naming `application/json` or a wildcard over it.
fn accepts_json(headers: &HeaderMap) -> bool {
    let mut values = headers.get_all(header::ACCEPT).iter().peekable();
    if values.peek().is_none() {
        return true;
    }
    values
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .map(|t| {
            t.split(';')
                .next()
                .unwrap_or("")
                .trim()
                .to_ascii_lowercase()
        })
        .any(|t| matches!(t.as_str(), "application/json" | "application/*" | "*/*"))
}

/// Who calls `/mcp`, as far as its tools go.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Who {
    /// The owner token: every tool, answers to pending items.
    Owner,
    /// The MCP client token: the exposed tools, nothing answered.
    Client,
    /// A session token, with the session it names (`Bindery-Session-Id`)
    /// and that session's agent: its `ask_<agent>` tool, in that session.
    Session { id: String, agent: String },
}

/// The header a session token's holder names its session with.
const SESSION_HEADER: &str = "bindery-session-id";

/// The session a `Bindery-Session-Id` header names.
pub fn token_session_header(headers: &HeaderMap) -> Option<String> {
    headers
        .get(SESSION_HEADER)
        .and_then(|v| v.to_str().ok())
        .map(|id| id.trim().to_string())
}

/// `/mcp`'s door: who calls, from the request's headers alone (the body
/// is not read before this); refused with a JSON-RPC error and 401.
impl FromRequestParts<Arc<AppState>> for Who {
    type Rejection = Response;

    async fn from_request_parts(
        parts: &mut Parts,
        s: &Arc<AppState>,
    ) -> Result<Self, Self::Rejection> {
        who(s, parts)
            .await
            .map_err(|e| refused(StatusCode::UNAUTHORIZED, e.into()))
    }
}

async fn who(s: &AppState, parts: &Parts) -> Result<Who, ServiceError> {
    let headers = &parts.headers;
    let named = token_session_header(headers);
    let identity = match parts.extensions.get::<Identified>() {
        Some(found) if found.session == named => found.identity.clone(),
        _ => s.identify(headers, named.as_deref()).await,
    };
    if identity == Identity::Owner {
        return Ok(Who::Owner);
    }
    let bearer = super::auth::bearer(headers);
    if let (Some(token), Some(client)) = (bearer, &s.mcp_client) {
        if client.matches(token) {
            return Ok(Who::Client);
        }
    }
    if let Identity::Session(id) = identity {
        let agent = s.service.record(&id).await?.agent;
        return Ok(Who::Session { id, agent });
    }
    Err(super::auth::unauthorized(
        "send `Authorization: Bearer <token>`: the owner token, the MCP client token, or a session token with its session in a Bindery-Session-Id header",
    ))
}

/// The one session a POST's message is about, when it names one: a
/// `tools/call` whose `_meta` names it ("bindery.dev/session_id"), or
/// answers its pending items (the session of every
/// "bindery.dev/continuations" token, or of an elicitation retry's
/// `requestState`); failing those, the session a session token's
/// `Bindery-Session-Id` header names. A batch names none itself (see
/// [`sessions_named`]).
pub fn session_named(headers: &HeaderMap, message: &Value) -> Option<String> {
    if message["method"] != "tools/call" {
        return None;
    }
    let params = &message["params"];
    if let Some(id) = params.pointer(META_SESSION).and_then(Value::as_str) {
        return Some(id.to_string());
    }
    let answered: Option<Vec<&str>> = match params.pointer(META_CONTINUATIONS) {
        Some(Value::Array(replies)) => replies
            .iter()
            .map(|r| {
                r["token"]
                    .as_str()
                    .and_then(bindery_store::pending::token_session)
            })
            .collect(),
        _ => None,
    };
    if let Some(sessions) = answered {
        return match sessions.split_first() {
            Some((first, rest)) if rest.iter().all(|s| s == first) => Some(first.to_string()),
            _ => None,
        };
    }
    if let Some(id) = elicit::state_session(params) {
        return Some(id);
    }
    token_session_header(headers)
}

/// The names of the parameter values a POST's `tools/call` gives
/// (`Agents-Param-*` headers, `_meta` "agents-exe/params"): what a
/// forward of it would carry. Every header's name when they do not read.
pub fn values_named(headers: &HeaderMap, message: &Value) -> Vec<String> {
    once_each(members(message).flat_map(|m| values_named_in(headers, m)))
}

/// The sessions a POST's message names, each once: one message's (see
/// [`session_named`]), or each of a batch's members', in order.
pub fn sessions_named(headers: &HeaderMap, message: &Value) -> Vec<String> {
    once_each(members(message).filter_map(|m| session_named(headers, m)))
}

/// `names` in order, each once (a batch has a few members: no set needed).
fn once_each(names: impl Iterator<Item = String>) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    for name in names {
        if !out.contains(&name) {
            out.push(name);
        }
    }
    out
}

/// A batch's members, or the one message.
fn members(message: &Value) -> impl Iterator<Item = &Value> {
    match message {
        Value::Array(batch) => batch.iter(),
        one => std::slice::from_ref(one).iter(),
    }
}

fn values_named_in(headers: &HeaderMap, message: &Value) -> Vec<String> {
    let from_headers = || {
        headers
            .keys()
            .filter_map(|h| params::param_name(h.as_str()))
            .collect::<Vec<_>>()
    };
    let Ok(given) = params::from_headers(headers) else {
        return from_headers();
    };
    match params::merge(given, message["params"].get("_meta")) {
        Ok(values) => values
            .into_iter()
            .filter(|(_, v)| !v.is_null())
            .map(|(k, _)| k)
            .collect(),
        Err(_) => from_headers(),
    }
}

/// A POST's message refused before it was served (a forward it cannot
/// make): the JSON-RPC error a `tools/call` gets for `e`. A batch's
/// refusal answers each of its requests (each member with an id).
pub fn refusal(message: &Value, e: ServiceError) -> Response {
    let e = for_mcp(e);
    let Value::Array(batch) = message else {
        let id = message.get("id").cloned().unwrap_or(Value::Null);
        return Json(response(id, Err(e))).into_response();
    };
    let answers: Vec<Value> = batch
        .iter()
        .filter_map(|m| m.get("id").filter(|id| !id.is_null()))
        .map(|id| response(id.clone(), Err(e.clone())))
        .collect();
    if answers.is_empty() {
        return StatusCode::ACCEPTED.into_response();
    }
    Json(Value::Array(answers)).into_response()
}

/// A batch refused whole before it was served, as `post_batch` refuses
/// one: 400, one JSON-RPC error with no id.
pub fn batch_refused(why: String) -> Response {
    refused(
        StatusCode::BAD_REQUEST,
        RpcError::new(jsonrpc::INVALID_REQUEST, why),
    )
}

async fn handle(
    s: &AppState,
    headers: &HeaderMap,
    who: &Who,
    era: stateless::Era,
    method: &str,
    params: Value,
) -> Result<Value, RpcError> {
    match method {
        "initialize" => Ok(initialize(&params)),
        "ping" => Ok(json!({})),
        "tools/list" => Ok(json!({"tools": list(s, who)})),
        "tools/call" => call(s, headers, who, era, &params).await,
        other => Err(RpcError::new(
            jsonrpc::METHOD_NOT_FOUND,
            format!("no method `{other}` here: this server has initialize, ping, tools/list and tools/call"),
        )),
    }
}

/// The versions `initialize` agrees to, oldest first (later ones have no
/// handshake).
pub fn handshake_versions() -> impl Iterator<Item = &'static str> {
    PROTOCOL_VERSIONS.iter().copied().filter(|v| *v <= LATEST)
}

/// The version `initialize` answers with, among `served` (oldest first):
/// the client's when it is served, else the newest; the client decides
/// whether it can live with that.
pub fn negotiate(asked: &str, served: &[&'static str]) -> &'static str {
    served
        .iter()
        .find(|v| **v == asked)
        .or(served.last())
        .copied()
        .unwrap_or(LATEST)
}

fn initialize(params: &Value) -> Value {
    let asked = params["protocolVersion"].as_str().unwrap_or("");
    let served: Vec<&'static str> = handshake_versions().collect();
    let version = negotiate(asked, &served);
    json!({
        "protocolVersion": version,
        "capabilities": {"tools": {"listChanged": false}},
        "serverInfo": {"name": "bindery-sidecar", "version": env!("CARGO_PKG_VERSION")},
        "instructions": INSTRUCTIONS,
    })
}

const INSTRUCTIONS: &str = "Each ask_<agent> tool runs that agent once on the prompt. Parameters \
    come from Agents-Param-<name> request headers and from the call's \
    _meta \"agents-exe/params\" (which wins). A run that waits for a person or for \
    the client answers with _meta \"bindery.dev/pending\"; call the tool again with \
    _meta \"bindery.dev/continuations\" to answer each item and go on.";

/// `tools/list` for `who`.
fn list(s: &AppState, who: &Who) -> Vec<Value> {
    let tree = s.service.tree();
    match who {
        Who::Owner => {
            let mut all = tools::list(tree);
            all.extend(exposed::list(tree));
            all
        }
        Who::Client => exposed::list(tree),
        Who::Session { agent, .. } => tools::list(tree)
            .into_iter()
            .filter(|t| t["name"] == tools::tool_name(agent))
            .collect(),
    }
}

/// Where a client names the session a call goes to (`_meta`).
const META_SESSION: &str = "/_meta/bindery.dev~1session_id";
const META_CONTINUATIONS: &str = "/_meta/bindery.dev~1continuations";

/// `tools/call`: one run of an `ask_<agent>` tool's agent, or one call of
/// an exposed tool.
async fn call(
    s: &AppState,
    headers: &HeaderMap,
    who: &Who,
    era: stateless::Era,
    params: &Value,
) -> Result<Value, RpcError> {
    let invalid = |why: String| RpcError::new(jsonrpc::INVALID_PARAMS, why);
    let name = params["name"]
        .as_str()
        .ok_or_else(|| invalid("tools/call needs `name`, a tool from tools/list".into()))?;
    let values = params::from_headers(headers)
        .and_then(|h| params::merge(h, params.get("_meta")))
        .map_err(for_mcp)?;
    let session = params.pointer(META_SESSION).map(|v| {
        v.as_str().map(str::to_string).ok_or_else(|| {
            invalid("_meta \"bindery.dev/session_id\" is a session id, a string".into())
        })
    });
    let session = session.transpose()?;
    tracing::debug!(tool = name, caller = ?who, params = ?values.keys().collect::<Vec<_>>(), "MCP tools/call");
    let tree = s.service.tree();
    if let Some(agent) = tools::agent_of(tree, name) {
        return ask(s, who, name, &agent.name, params, values, session).await;
    }
    let Some(found) = exposed::find(tree, name).filter(|_| !matches!(who, Who::Session { .. }))
    else {
        return Err(invalid(format!(
            "unknown tool `{name}`; tools/list names them"
        )));
    };
    let answers = params.pointer(META_CONTINUATIONS).map(continuation_replies);
    let answers = match (
        answers,
        elicit::replies(params).map_err(|e| invalid(e.to_string()))?,
    ) {
        (Some(_), Some(_)) => {
            return Err(invalid(
                "give either _meta \"bindery.dev/continuations\" or inputResponses, not both"
                    .into(),
            ))
        }
        (Some(r), None) => Some(r.map_err(|e| invalid(e.to_string()))?),
        (None, r) => r,
    };
    if *who == Who::Client && (answers.is_some() || session.is_some()) {
        return Err(RpcError::from(ServiceError::forbidden(
            "an MCP client token calls the exposed tools in sessions of their own: it may not answer pending calls nor name a session; the owner answers them (POST /v1/continuations/:token)",
        )));
    }
    let answer = match answers {
        Some(replies) => bindery_session::ask::ask_continue(&s.service, &Caller::Owner, replies, values).await,
        None => {
            let arguments = match params.get("arguments") {
                None | Some(Value::Null) => json!({}),
                Some(a @ Value::Object(_)) => a.clone(),
                Some(_) => {
                    return Err(invalid(format!(
                        "the arguments of `{name}` are a JSON object"
                    )))
                }
            };
            let call = bindery_llm::ToolCall {
                id: format!("mcp-{}", uuid::Uuid::new_v4().simple()),
                name: found.tool.name().to_string(),
                arguments: arguments.to_string(),
            };
            tracing::info!(tool = %call.name, agent = %found.agent.name, caller = "mcp", "MCP client calls an exposed tool");
            bindery_session::ask::call_tool(
                &s.service,
                &Caller::Owner,
                &found.agent.name,
                call,
                values,
                session.as_deref(),
            )
            .await
        }
    }
    .map_err(for_mcp)?;
    if !answer.pending.is_empty()
        && *who == Who::Owner
        && era == stateless::Era::Stateless
        && elicit::supported(params)
    {
        return Ok(elicit::input_required(&answer.session_id, &answer.pending));
    }
    Ok(result(who, answer, true))
}

/// An `ask_<agent>` call: a new session's run, a message in a session the
/// owner names, or (a session token) a message in the token's session.
async fn ask(
    s: &AppState,
    who: &Who,
    name: &str,
    agent: &str,
    params: &Value,
    values: std::collections::BTreeMap<String, Value>,
    session: Option<String>,
) -> Result<Value, RpcError> {
    let invalid = |why: String| RpcError::new(jsonrpc::INVALID_PARAMS, why);
    let prompt = || {
        params["arguments"]["prompt"]
            .as_str()
            .map(str::to_string)
            .ok_or_else(|| invalid(format!("`{name}` needs the argument `prompt`, a string")))
    };
    let answer = match who {
        Who::Client => {
            return Err(invalid(format!(
                "unknown tool `{name}`; tools/list names them (an MCP client token calls the exposed tools only)"
            )))
        }
        Who::Session { id, agent: own } => {
            if own != agent || session.as_ref().is_some_and(|s| s != id) {
                return Err(invalid(format!("unknown tool `{name}`; tools/list names them")));
            }
            if params.pointer(META_CONTINUATIONS).is_some() {
                return Err(RpcError::from(ServiceError::forbidden(
                    "a session token may read pending calls, not answer them; the session's owner answers them",
                )));
            }
            bindery_session::ask::ask_in(
                &s.service,
                &Caller::SessionToken(id.clone()),
                id,
                prompt()?,
                values,
            )
            .await
        }
        Who::Owner => match (params.pointer(META_CONTINUATIONS), session) {
            (Some(replies), _) => {
                let replies = continuation_replies(replies).map_err(|e| invalid(e.to_string()))?;
                bindery_session::ask::ask_continue(&s.service, &Caller::Owner, replies, values).await
            }
            (None, Some(id)) => {
                let rec = s.service.record(&id).await.map_err(for_mcp)?;
                if rec.agent != agent {
                    return Err(invalid(format!(
                        "session {id} is a session of agent `{}`; call ask_{} for it",
                        rec.agent, rec.agent
                    )));
                }
                bindery_session::ask::ask_in(&s.service, &Caller::Owner, &id, prompt()?, values).await
            }
            (None, None) => {
                bindery_session::ask::ask(&s.service, &Caller::Owner, agent, prompt()?, values).await
            }
        },
    }
    .map_err(for_mcp)?;
    Ok(result(who, answer, false))
}

/// A run's answer as a `tools/call` result, the pending items of a run that
/// waits in its `_meta` (their continuation tokens to the owner only). An
/// exposed tool's call that waits did not run: its result is an error
/// whose structured content holds the items as the session API shows them.
fn result(who: &Who, answer: bindery_session::ask::Answer, tool: bool) -> Value {
    let mut meta = json!({"bindery.dev/session_id": answer.session_id});
    if answer.pending.is_empty() {
        return json!({
            "content": [{"type": "text", "text": answer.text}],
            "isError": answer.is_error,
            "_meta": meta,
        });
    }
    let mut pending = answer.pending;
    if !tool && *who == Who::Owner {
        meta["bindery.dev/pending"] = json!(pending);
        return json!({
            "content": [{"type": "text", "text": answer.text}],
            "isError": answer.is_error,
            "_meta": meta,
        });
    }
    let text = if *who == Who::Owner {
        answer.text
    } else {
        for item in &mut pending {
            item.continuation_token = None;
        }
        format!(
            "The call waits for a person: the session's owner answers it (POST /v1/continuations/:token, with the token from GET /v1/sessions/{}), and the result is then in that session.",
            answer.session_id
        )
    };
    meta["bindery.dev/pending"] = json!(pending);
    json!({
        "content": [{"type": "text", "text": text}],
        "isError": true,
        "structuredContent": {
            "status": "waiting_external",
            "session_id": answer.session_id,
            "pending": pending,
        },
        "_meta": meta,
    })
}

/// `_meta."bindery.dev/continuations"` is not a list of answers.
#[derive(Debug, thiserror::Error)]
#[error("_meta \"bindery.dev/continuations\" is a list of {{\"token\", \"approve\"}} or {{\"token\", \"result\"}}, one per pending item")]
struct BadContinuations;

/// `_meta."bindery.dev/continuations"`: `[{token, approve?, reason?, result?, choice?, input?}]`.
fn continuation_replies(v: &Value) -> Result<Vec<bindery_session::ask::Reply>, BadContinuations> {
    let bad = || BadContinuations;
    let list = v.as_array().filter(|l| !l.is_empty()).ok_or_else(bad)?;
    list.iter()
        .map(|r| {
            let token = r["token"].as_str().ok_or_else(bad)?.to_string();
            let approve = match r.get("approve") {
                None => None,
                Some(Value::Bool(b)) => Some(*b),
                Some(_) => return Err(bad()),
            };
            Ok((
                token,
                bindery_session::service::Answer {
                    result: r.get("result").cloned(),
                    approve,
                    choice: r["choice"].as_str().map(str::to_string),
                    input: r["input"].as_object().cloned(),
                    reason: r["reason"].as_str().map(str::to_string),
                    ..Default::default()
                },
            ))
        })
        .collect()
}

/// A session API error as MCP clients should read it: the same code, with
/// advice in MCP's terms where the REST advice would not fit.
fn for_mcp(mut e: ServiceError) -> RpcError {
    if e.code == Code::ParamsRequired {
        e.message = format!(
            "required parameters have no value: {}; send them as Agents-Param-<name> headers or in _meta \"agents-exe/params\"",
            e.params.join(", ")
        );
    }
    e.into()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn with_accept(v: &str) -> HeaderMap {
        let mut h = HeaderMap::new();
        h.insert(header::ACCEPT, HeaderValue::from_str(v).unwrap());
        h
    }

    #[test]
    fn accept_must_allow_json_when_given() {
        assert!(accepts_json(&HeaderMap::new()));
        assert!(accepts_json(&with_accept(
            "application/json, text/event-stream"
        )));
        assert!(accepts_json(&with_accept(
            "text/event-stream;q=1, */*;q=0.1"
        )));
        assert!(accepts_json(&with_accept("Application/JSON")));
        assert!(!accepts_json(&with_accept("text/event-stream")));
        assert!(!accepts_json(&with_accept("text/html")));
    }

    #[test]
    fn initialize_agrees_on_a_version() {
        for v in PROTOCOL_VERSIONS.iter().filter(|v| **v <= LATEST) {
            assert_eq!(
                initialize(&json!({"protocolVersion": v}))["protocolVersion"],
                *v
            );
        }
        // A version without the handshake gets the newest one that has it.
        let r = initialize(&json!({"protocolVersion": stateless::VERSION}));
        assert_eq!(r["protocolVersion"], LATEST);
        let r = initialize(&json!({"protocolVersion": "2024-11-05"}));
        assert_eq!(r["protocolVersion"], LATEST);
        assert_eq!(r["capabilities"], json!({"tools": {"listChanged": false}}));
        assert_eq!(r["serverInfo"]["name"], "bindery-sidecar");
    }

    fn call_in(session: Option<&str>, id: i64) -> Value {
        let mut params = json!({"name": "ask_invoices", "arguments": {"prompt": "hi"}});
        if let Some(s) = session {
            params["_meta"] =
                json!({"bindery.dev/session_id": s, "agents-exe/params": {"billing_token": "x"}});
        }
        json!({"jsonrpc": "2.0", "id": id, "method": "tools/call", "params": params})
    }

    /// A batch names each session its calls name, once, and the values
    /// its calls give; one message names what it always did.
    #[test]
    fn a_batch_names_the_sessions_and_values_of_its_calls() {
        let mut token = HeaderMap::new();
        token.insert(SESSION_HEADER, HeaderValue::from_static("s-own"));
        let list = json!({"jsonrpc": "2.0", "id": 9, "method": "tools/list"});
        let batch = json!([
            call_in(Some("s-1"), 1),
            list,
            call_in(Some("s-2"), 2),
            call_in(Some("s-1"), 3),
            call_in(None, 4)
        ]);
        assert_eq!(
            sessions_named(&HeaderMap::new(), &batch),
            ["s-1", "s-2"],
            "a call naming no session names none without the header"
        );
        assert_eq!(sessions_named(&token, &batch), ["s-1", "s-2", "s-own"]);
        assert_eq!(sessions_named(&token, &list), Vec::<String>::new());
        assert_eq!(
            sessions_named(&HeaderMap::new(), &call_in(Some("s-1"), 1)),
            ["s-1"]
        );
        assert_eq!(values_named(&HeaderMap::new(), &batch), ["billing_token"]);
        assert_eq!(
            values_named(&HeaderMap::new(), &call_in(None, 1)),
            Vec::<String>::new()
        );
    }

    /// A refused batch answers each of its requests, notifications not.
    #[tokio::test]
    async fn a_refused_batch_answers_each_request() {
        let e = crate::peers::tls_required(vec!["billing_token".into()]);
        let note = json!({"jsonrpc": "2.0", "method": "notifications/initialized"});
        let r = refusal(
            &json!([call_in(Some("s"), 1), note, call_in(Some("s"), 2)]),
            e.clone(),
        );
        assert_eq!(r.status(), StatusCode::OK);
        let body = axum::body::to_bytes(r.into_body(), 1 << 20).await.unwrap();
        let answers: Value = serde_json::from_slice(&body).unwrap();
        let ids: Vec<&Value> = answers
            .as_array()
            .unwrap()
            .iter()
            .map(|a| &a["id"])
            .collect();
        assert_eq!(ids, [&json!(1), &json!(2)], "{answers}");
        assert_eq!(
            answers[1]["error"]["data"]["error"], "peer_tls_required",
            "{answers}"
        );
        assert_eq!(refusal(&json!([note]), e).status(), StatusCode::ACCEPTED);
    }
}
