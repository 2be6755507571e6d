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
