//! A session-token holder and a second session trying everything the owner
//! and the first session may do.
//!
//! A session token opens four doors of its own session (read it and its
//! events, post a message, cancel a run); every other door is the owner's.
//! A token of another session is as good as none (401); the holder of this
//! session's token at an owner's door is refused (403), and off any
//! session's route its token is as good as none (401). A revoked token
//! ends the streams it opened at once.

use std::time::Duration;

use crate::common::booking::*;
use crate::common::*;
use bindery_tests::sidecar::{Api, EventStream, Reply};
use serde_json::{json, Value};

/// How long a condition the test waits on may take at most.
const PATIENCE: Duration = Duration::from_secs(30);

/// A session created as the owner from `body` with a session token: its
/// id and token.
async fn session_with_token(api: &Api, mut body: Value) -> (String, String) {
    body["session_token"] = json!(true);
    let r = create(api, body).await;
    assert_eq!(r.status, 201, "{}", r.text);
    (
        r.json["session_id"].as_str().unwrap().to_string(),
        r.json["session_token"].as_str().unwrap().to_string(),
    )
}

async fn call(api: &Api, method: &str, path: &str, token: &str, body: Option<Value>) -> Reply {
    api.call(method, path, Some(token), body.as_ref()).await
}

/// `(status, error code)` of a refusal.
async fn refused(
    api: &Api,
    method: &str,
    path: &str,
    token: &str,
    body: Option<Value>,
) -> (u16, String) {
    let r = call(api, method, path, token, body).await;
    let (status, code, _) = error_of(&r);
    (status, code)
}

fn unauthorized() -> (u16, String) {
    (401, "unauthorized".into())
}

/// Read `stream` until it ends; the events it gave meanwhile. Panics when
/// it is still open after [`PATIENCE`].
async fn until_ended(stream: &mut EventStream) -> Vec<String> {
    let mut seen = Vec::new();
    let read = async {
        while let Some(e) = stream.next().await {
            seen.push(e.event);
        }
    };
    let ended = tokio::time::timeout(PATIENCE, read).await.is_ok();
    assert!(ended, "the stream is still open; it gave {seen:?}");
    seen
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn another_sessions_token_opens_no_door_and_a_holder_only_its_four() {
    let w = World::new(tool_then_answer).await;
    let (_sidecar, api) = w.start(&[], &[]);
    let (a, token_a) =
        session_with_token(&api, json!({"agent": "invoices", "params": valid_params()})).await;
    let (_b, token_b) =
        session_with_token(&api, json!({"agent": "invoices", "params": valid_params()})).await;
    message_waited(&api, &a, "overdue?").await;
    let params = json!({"params": {"tenant": "globex"}});
    let on_a = |route: &str| format!("/v1/sessions/{a}{route}");

    // B's token on every route of A, and every owner's route: as good as none.
    let everything: Vec<(&str, String, Option<Value>)> = vec![
        ("GET", on_a(""), None),
        ("GET", on_a("/events"), None),
        (
            "POST",
            on_a("/messages"),
            Some(json!({"prompt": "tell me"})),
        ),
        ("POST", on_a("/resume"), None),
        ("POST", on_a("/cancel"), None),
        ("POST", on_a("/fork"), Some(json!({"session_token": true}))),
        ("PUT", on_a("/params"), Some(params.clone())),
        (
            "PUT",
            on_a("/params"),
            Some(json!({"params": {"tenant": null}})),
        ),
        ("DELETE", on_a("/token"), None),
        ("GET", "/v1/sessions".into(), None),
        (
            "POST",
            "/v1/sessions".into(),
            Some(json!({"agent": "invoices"})),
        ),
        ("GET", "/v1/agents".into(), None),
        ("GET", "/v1/agents/invoices".into(), None),
    ];
    for (method, path, body) in &everything {
        assert_eq!(
            refused(&api, method, path, &token_b, body.clone()).await,
            unauthorized(),
            "{method} {path} with another session's token"
        );
    }
    let (status, _) = api.events(&on_a("/events"), Some(&token_b), None).await;
    assert_eq!(status, 401, "another session's token opened A's events");

    // A's own token: its four doors open, the owner's stay shut.
    let view = call(&api, "GET", &on_a(""), &token_a, None).await;
    assert_eq!(view.status, 200, "{}", view.text);
    assert!(
        view.json["session"]["turns"]
            .as_array()
            .is_some_and(|t| !t.is_empty()),
        "{}",
        view.text
    );
    assert_eq!(
        view.json["params"],
        json!({}),
        "a holder reads no values: {}",
        view.text
    );
    let forbidden = (403, "forbidden".to_string());
    for (method, path, body) in [
        ("POST", on_a("/resume"), None),
        ("POST", on_a("/fork"), Some(json!({"session_token": true}))),
        ("DELETE", on_a("/token"), None),
    ] {
        assert_eq!(
            refused(&api, method, &path, &token_a, body).await,
            forbidden,
            "{method} {path} with the session's token"
        );
    }
    for body in [params.clone(), json!({"params": {"tenant": null}})] {
        assert_eq!(
            refused(&api, "PUT", &on_a("/params"), &token_a, Some(body)).await,
            (403, "forbidden_params".to_string())
        );
    }
    for (method, path) in [
        ("GET", "/v1/sessions"),
        ("POST", "/v1/sessions"),
        ("GET", "/v1/agents"),
        ("GET", "/v1/agents/invoices"),
    ] {
        assert_eq!(
            refused(
                &api,
                method,
                path,
                &token_a,
                Some(json!({"agent": "invoices"}))
            )
            .await,
            unauthorized(),
            "{method} {path} with a session token"
        );
    }
    // Nothing of the above changed A.
    let after = api.call("GET", &on_a(""), Some(OWNER), None).await;
    assert_eq!(after.json["params"]["tenant"], "acme", "{}", after.text);
    assert_eq!(
        after.json["session"]["turns"], view.json["session"]["turns"],
        "{}",
        after.text
    );
    let list = api.call("GET", "/v1/sessions", Some(OWNER), None).await;
    assert_eq!(
        list.json["sessions"].as_array().map(Vec::len),
        Some(2),
        "{}",
        list.text
    );
    // The holder's doors do open: a message, and a cancel with nothing to cancel.
    let r = call(
        &api,
        "POST",
        &format!("{}?wait=true", on_a("/messages")),
        &token_a,
        Some(json!({"prompt": "again"})),
    )
    .await;
    assert_eq!(r.status, 200, "{}", r.text);
    assert_eq!(
        refused(&api, "POST", &on_a("/cancel"), &token_a, None).await,
        (409, "not_running".to_string())
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn revoking_the_tokens_ends_their_open_streams_at_once() {
    let w = World::new(tool_then_answer).await;
    let (_sidecar, api) = w.start(&[], &[]);
    let (id, token) =
        session_with_token(&api, json!({"agent": "invoices", "params": valid_params()})).await;
    let events = format!("/v1/sessions/{id}/events");
    let (status, by_token) = api.events(&events, Some(&token), None).await;
    assert_eq!(status, 200);
    let mut by_token = by_token.unwrap();
    let (status, by_owner) = api.events(&events, Some(OWNER), None).await;
    assert_eq!(status, 200);
    let mut by_owner = by_owner.unwrap();
    // Both streams see a first run.
    message_waited(&api, &id, "first").await;
    let seen = by_token.until("run_finished", PATIENCE).await;
    assert!(seen.iter().any(|e| e.event == "run_finished"), "{seen:?}");
    by_owner.until("run_finished", PATIENCE).await;

    let r = api
        .call(
            "DELETE",
            &format!("/v1/sessions/{id}/token"),
            Some(OWNER),
            None,
        )
        .await;
    assert_eq!(r.status, 204, "{}", r.text);
    // The token's stream ends without anything more happening.
    let after = until_ended(&mut by_token).await;
    assert!(after.is_empty(), "events after the revocation: {after:?}");

    // The owner's next message reaches the owner's stream only.
    let answer = message_waited(&api, &id, "second").await;
    let seen = by_owner.until("run_finished", PATIENCE).await;
    assert!(seen.iter().any(|e| e.event == "run_finished"), "{seen:?}");
    assert!(!by_token.raw.contains("second"), "{}", by_token.raw);
    assert!(by_owner.raw.contains("second"), "{}", by_owner.raw);
    // The revoked token opens nothing again; a token of a fork (a new one)
    // is not this session's.
    let (status, _) = api.events(&events, Some(&token), None).await;
    assert_eq!(status, 401);
    let fork = api
        .call(
            "POST",
            &format!("/v1/sessions/{id}/fork"),
            Some(OWNER),
            Some(&json!({"session_token": true, "params": {"billing_token": CANARY}})),
        )
        .await;
    assert_eq!(fork.status, 201, "{}", fork.text);
    let fresh = fork.json["session_token"].as_str().unwrap();
    let (status, _) = api.events(&events, Some(fresh), None).await;
    assert_eq!(status, 401, "a fork's token opened its source's events");
    assert_eq!(answer.json["status"], "idle", "{}", answer.text);
}

/// A booking session that waits for a choice of service, created with a
/// session token: its view (as the owner sees it) and the token.
async fn waiting_for_a_choice(api: &Api) -> (Reply, String) {
    let r = api
        .call(
            "POST",
            "/v1/sessions?wait=true",
            Some(OWNER),
            Some(
                &json!({"agent": "booking", "prompt": format!("book {}", json!({"date": DAY})),
                         "session_token": true}),
            ),
        )
        .await;
    assert_eq!(r.status, 201, "{}", r.text);
    assert_eq!(r.json["status"], "waiting_external", "{}", r.text);
    assert_eq!(
        r.json["pending"][0]["disposition"], "needs_selection",
        "{}",
        r.text
    );
    let token = r.json["session_token"].as_str().unwrap().to_string();
    (r, token)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_the_owner_answers_a_pending_item_whatever_the_path() {
    let b = booking(two_slots(), |t| t).await;
    let (_sidecar, api) = b.start();
    let (owners, token) = waiting_for_a_choice(&api).await;
    let id = owners.json["session_id"].as_str().unwrap().to_string();
    let item = &owners.json["pending"][0];
    let continuation = item["continuation_token"].as_str().unwrap().to_string();
    let choice = item["options"][1]["id"].clone();
    let lookups = b.lookups();

    // The holder's view shows the item without its token.
    let view = call(&api, "GET", &format!("/v1/sessions/{id}"), &token, None).await;
    assert_eq!(view.status, 200, "{}", view.text);
    assert!(
        view.json["pending"][0]["continuation_token"].is_null(),
        "{}",
        view.text
    );
    assert!(!view.text.contains(&continuation), "{}", view.text);

    // A chat message that names an option.
    let messages = format!("/v1/sessions/{id}/messages?wait=true");
    for text in ["2", "Colour"] {
        assert_eq!(
            refused(
                &api,
                "POST",
                &messages,
                &token,
                Some(json!({"prompt": text}))
            )
            .await,
            (403, "forbidden".to_string()),
            "the chat message {text:?}"
        );
    }
    // The continuation route, with the owner's continuation token (leaked).
    let route = format!("/v1/continuations/{continuation}?wait=true");
    assert_eq!(
        refused(
            &api,
            "POST",
            &route,
            &token,
            Some(json!({"choice": choice}))
        )
        .await,
        (403, "forbidden".to_string())
    );
    // `/mcp`, where a session token is no token.
    let mcp = api
        .http
        .post(format!("{}/mcp", api.base))
        .bearer_auth(&token)
        .header("accept", "application/json, text/event-stream")
        .json(
            &json!({"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {
            "name": "ask_booking", "arguments": {},
            "_meta": {"bindery.dev/continuations": [{"token": continuation, "choice": choice}]}}}),
        )
        .send()
        .await
        .unwrap();
    assert_eq!(mcp.status().as_u16(), 401);

    // Nothing was answered: the same item waits, with the same token.
    let now = api
        .call("GET", &format!("/v1/sessions/{id}"), Some(OWNER), None)
        .await;
    assert_eq!(now.json["status"], "waiting_external", "{}", now.text);
    assert_eq!(now.json["pending"], owners.json["pending"], "{}", now.text);
    assert_eq!(b.lookups(), lookups, "a lookup ran for an answer");
    assert!(b.bookings().is_empty());

    // The owner's chat message does answer it.
    let r = api
        .call(
            "POST",
            &messages,
            Some(OWNER),
            Some(&json!({"prompt": "2"})),
        )
        .await;
    assert_eq!(r.status, 200, "{}", r.text);
    assert_eq!(
        r.json["pending"][0]["disposition"], "needs_confirmation",
        "{}",
        r.text
    );
}
