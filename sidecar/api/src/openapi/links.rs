//! OpenAPI links: which answer's field opens which operation.

use serde_json::Value;

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
/// is in the body). Only fields every such answer has: a link into a list
/// (the first session of `GET /v1/sessions`, a view's first pending
/// item) would break on an empty one, so none is declared.
const SESSION_ANSWERS: &[(&str, &str, &str, &str)] = &[
    ("/v1/sessions", "post", "201", "/session_id"),
    ("/v1/sessions/{id}", "get", "200", "/session_id"),
    ("/v1/sessions/{id}/messages", "post", "202", "/session_id"),
    ("/v1/sessions/{id}/fork", "post", "201", "/session_id"),
    ("/v1/sessions/{id}/params", "put", "200", "/session_id"),
    ("/v1/continuations/{token}", "post", "200", "/session_id"),
];

/// OpenAPI links: how one answer feeds the next request. A session's id
/// (from its view) opens its routes; an agent's slug (every server has at
/// least one agent) its view and a new session. A client (or a fuzzer's
/// stateful phase) can follow them.
pub(super) fn add_links(doc: &mut Value) {
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
    for (path, method, status, id) in SESSION_ANSWERS {
        for operation in SESSION_OPERATIONS {
            add(path, method, status, operation, link(operation, "id", id));
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
