//! The session API keeps what /openapi.json promises, in process: every
//! error, axum's own rejections included, has the `{"error", "message"}`
//! shape with the right status; `timeout` has a bound that is enforced; a
//! fork's `at_turn` copies the turns before it.

use crate::harness::*;
use serde_json::{json, Value};

/// An invoices session created with a prompt, its run waited for.
async fn invoices_run(api: &Api) -> Reply {
    let body = json!({"agent": "invoices", "prompt": "overdue?",
        "params": {"tenant": "acme", "billing_token": CANARY}});
    let r = api
        .call("POST", "/v1/sessions?wait=true", Some(OWNER), Some(&body))
        .await;
    assert_eq!(r.status, 201, "{}", r.text);
    r
}

#[tokio::test]
async fn rejections_are_json_errors_with_their_status() {
    let dir = tempfile::tempdir().unwrap();
    let agent = invoices_agent(dir.path());
    let api = &Server::start(&[agent], dir.path(), tool_then_answer)
        .await
        .api;
    for (method, path, status, code) in [
        ("POST", "/v1/sessions?wait=maybe", 400, "bad_request"),
        ("POST", "/v1/sessions?timeout=-1", 400, "bad_request"),
        (
            "POST",
            "/v1/sessions?wait=true&timeout=601",
            400,
            "bad_request",
        ),
        (
            "GET",
            "/v1/sessions/x/events?after=soon",
            400,
            "bad_request",
        ),
        ("DELETE", "/v1/agents", 405, "method_not_allowed"),
        ("GET", "/v1/nothing-here", 404, "not_found"),
    ] {
        let r = api
            .raw(method, path, Some(OWNER), "{}", Some("application/json"))
            .await;
        assert_eq!(
            (r.status, r.json["error"].as_str()),
            (status, Some(code)),
            "{method} {path}: {}",
            r.text
        );
        assert!(r.json["message"].is_string(), "{method} {path}: {}", r.text);
    }
    let r = api
        .raw(
            "POST",
            "/v1/sessions?wait=true&timeout=601",
            Some(OWNER),
            "{}",
            None,
        )
        .await;
    assert!(
        r.json["message"].as_str().unwrap().contains("at most 600"),
        "{}",
        r.text
    );
}

fn turns(r: &Value) -> usize {
    r["session"]["turns"].as_array().map_or(0, Vec::len)
}

#[tokio::test]
async fn a_fork_at_a_turn_copies_the_turns_before_it() {
    let dir = tempfile::tempdir().unwrap();
    let agent = invoices_agent(dir.path());
    let api = &Server::start(&[agent], dir.path(), tool_then_answer)
        .await
        .api;
    let r = invoices_run(api).await;
    assert_eq!(turns(&r.json), 4, "{}", r.text);
    let id = r.json["session_id"].as_str().unwrap().to_string();
    let fork = |mut body: Value| {
        let id = id.clone();
        body["params"] = json!({"billing_token": CANARY});
        async move {
            api.call(
                "POST",
                &format!("/v1/sessions/{id}/fork"),
                Some(OWNER),
                Some(&body),
            )
            .await
        }
    };
    let r = fork(json!({"at_turn": 1})).await;
    assert_eq!(r.status, 201, "{}", r.text);
    assert_eq!(
        r.json["session"]["turns"],
        json!([{"role": "user", "content": "overdue?"}])
    );
    let r = fork(json!({"at_turn": 4})).await;
    assert_eq!(turns(&r.json), 4, "{}", r.text);
    let r = fork(json!({})).await;
    assert_eq!(turns(&r.json), 4, "{}", r.text);
    // Cut between a tool call and its result: the call is closed as
    // unfinished, as in any fork.
    let r = fork(json!({"at_turn": 2})).await;
    assert_eq!(turns(&r.json), 3, "{}", r.text);
    assert_eq!(r.json["session"]["turns"][2]["role"], "tool", "{}", r.text);

    let r = fork(json!({"at_turn": 5})).await;
    assert_eq!(error_of(&r), refusal(400, "bad_request", &[]));
    assert!(
        r.json["message"].as_str().unwrap().contains("has 4 turns"),
        "{}",
        r.text
    );
    let r = create(api, json!({"agent": "invoices", "at_turn": 1})).await;
    assert_eq!(error_of(&r), refusal(400, "bad_request", &[]));
}
