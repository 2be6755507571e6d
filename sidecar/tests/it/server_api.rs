//! The session API's contract, through the real server over TCP: the
//! parameter validation table, sealed sessions and session tokens, run
//! lifecycle errors, the OpenAPI document, metrics and the event stream's
//! wire. Agent views and the missing-value hints are tested in process
//! (`sidecar/api/tests/inproc/promises.rs`).

use std::time::Duration;

use crate::common::*;
use bindery_tests::mock_llm::{last_message, MockLlm, MockReply};
use bindery_tests::sidecar::Reply;
use serde_json::{json, Value};

/// An id no session has.
const NO_SUCH_SESSION: &str = "00000000-0000-4000-8000-000000000000";

/// `tool_then_answer`, except that a user message mentioning "slow" is
/// answered only after two minutes: a run that stays in progress.
fn slow_when_asked(req: &Value) -> MockReply {
    let last = last_message(req);
    let slow =
        last["role"] == "user" && last["content"].as_str().is_some_and(|c| c.contains("slow"));
    if slow {
        MockReply::text("too late").delayed(Duration::from_secs(120))
    } else {
        tool_then_answer(req)
    }
}

/// A user message mentioning "slow" makes the model call `bash_slow-lookup`
/// (which sleeps); anything else is answered at once.
fn slow_tool_when_asked(req: &Value) -> MockReply {
    let last = last_message(req);
    match last["role"].as_str() {
        Some("user") if last["content"].as_str().is_some_and(|c| c.contains("slow")) => {
            MockReply::tool_call("bash_slow-lookup", json!({}))
        }
        Some("tool") => MockReply::text(format!(
            "the tool said: {}",
            last["content"].as_str().unwrap_or("")
        )),
        _ => MockReply::text("ok"),
    }
}

/// Wait (bounded) until the mock has received `n` requests.
async fn until_requests(mock: &MockLlm, n: usize) {
    let what = format!("the model gets {n} requests");
    until(&what, PATIENCE, || mock.request_count() >= n).await;
}

fn id_of(r: &Reply) -> String {
    r.json["session_id"]
        .as_str()
        .unwrap_or_else(|| panic!("no session id in {} {}", r.status, r.text))
        .to_string()
}

/// Every tool call of the history is answered by exactly one tool turn,
/// after it; and no tool turn answers a call that was not made.
fn assert_well_formed(turns: &[Value]) {
    let mut open: Vec<String> = Vec::new();
    let mut answered: Vec<String> = Vec::new();
    for t in turns {
        match t["role"].as_str() {
            Some("assistant") => {
                assert!(open.is_empty(), "calls {open:?} unanswered before {t}");
                for c in t["tool_calls"].as_array().into_iter().flatten() {
                    open.push(c["id"].as_str().unwrap().to_string());
                }
            }
            Some("tool") => {
                let id = t["tool_call_id"].as_str().unwrap().to_string();
                assert!(open.contains(&id), "a result for no open call: {t}");
                assert!(!answered.contains(&id), "answered twice: {t}");
                open.retain(|o| *o != id);
                answered.push(id);
            }
            Some("user") => assert!(open.is_empty(), "calls {open:?} unanswered before {t}"),
            other => panic!("unexpected role {other:?} in {t}"),
        }
    }
    assert!(open.is_empty(), "calls {open:?} never answered: {turns:?}");
}

fn turns_of(r: &Reply) -> Vec<Value> {
    r.json["session"]["turns"]
        .as_array()
        .unwrap_or_else(|| panic!("no turns in {}", r.text))
        .clone()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_code_of_the_validation_table() {
    let w = World::new(tool_then_answer).await;
    let (sidecar, api) = w.start(&[], &[]);

    // Refused creations: (params, status, code, names, a value never echoed).
    let rows = [
        // A typo, named back.
        (
            json!({"tenant": "acme", "billing_token": CANARY, "tennant": "acme"}),
            refusal(422, "unknown_params", &["tennant"]),
            None,
        ),
        // A process-scope name.
        (
            json!({"tenant": "acme", "billing_token": CANARY, "region": "us"}),
            refusal(403, "forbidden_params", &["region"]),
            None,
        ),
        // A secret given as a number.
        (
            json!({"tenant": "acme", "billing_token": 4242}),
            refusal(422, "invalid_params", &["billing_token"]),
            Some("4242"),
        ),
    ];
    for (params, expected, hidden) in rows {
        let r = create(
            &api,
            json!({"agent": "invoices", "prompt": "hi", "params": params}),
        )
        .await;
        assert_eq!(error_of(&r), expected, "{params}: {}", r.text);
        if let Some(value) = hidden {
            assert!(!r.text.contains(value), "the value is echoed: {}", r.text);
        }
    }

    // 422 params_required on creation, with a prompt and without.
    for body in [
        json!({"agent": "invoices", "prompt": "hi", "params": {"tenant": "acme"}}),
        json!({"agent": "invoices", "params": {"tenant": "acme"}}),
    ] {
        let r = create(&api, body.clone()).await;
        assert_eq!(
            error_of(&r),
            refusal(422, "params_required", &["billing_token"]),
            "{body}: {}",
            r.text
        );
    }
    // Refused creations created nothing.
    let list = api.call("GET", "/v1/sessions", Some(OWNER), None).await;
    assert_eq!(list.json["sessions"], json!([]), "{}", list.text);

    // An existing session: 422 invalid_params for a message-scope name on PUT params.
    let r = create(
        &api,
        json!({"agent": "invoices", "params": valid_params(), "session_token": true}),
    )
    .await;
    assert_eq!(r.status, 201, "{}", r.text);
    let id = id_of(&r);
    let token = r.json["session_token"].as_str().unwrap().to_string();
    let params = format!("/v1/sessions/{id}/params");
    let messages = format!("/v1/sessions/{id}/messages");
    let r = api
        .call(
            "PUT",
            &params,
            Some(OWNER),
            Some(&json!({"params": {"otp": "123456"}})),
        )
        .await;
    assert_eq!(
        error_of(&r),
        refusal(422, "invalid_params", &["otp"]),
        "{}",
        r.text
    );
    assert!(!r.text.contains("123456"));

    // 403 forbidden_params: a session-token holder sending params with a message.
    let r = api
        .call(
            "POST",
            &messages,
            Some(&token),
            Some(&json!({"prompt": "hi", "params": {"otp": "123456"}})),
        )
        .await;
    assert_eq!(
        error_of(&r),
        refusal(403, "forbidden_params", &["otp"]),
        "{}",
        r.text
    );

    // 409 params_required: the owner removed a required value, then a message.
    let r = api
        .call(
            "PUT",
            &params,
            Some(OWNER),
            Some(&json!({"params": {"billing_token": null}})),
        )
        .await;
    assert_eq!(r.status, 200, "{}", r.text);
    assert_eq!(r.json["secret_params"], json!([]), "{}", r.text);
    for who in [OWNER, token.as_str()] {
        let r = api
            .call("POST", &messages, Some(who), Some(&json!({"prompt": "hi"})))
            .await;
        assert_eq!(
            error_of(&r),
            refusal(409, "params_required", &["billing_token"]),
            "{}",
            r.text
        );
    }
    // Resume checks the same.
    let r = api
        .call(
            "POST",
            &format!("/v1/sessions/{id}/resume"),
            Some(OWNER),
            None,
        )
        .await;
    assert_eq!(
        error_of(&r),
        refusal(409, "params_required", &["billing_token"]),
        "{}",
        r.text
    );

    // 403 forbidden_params: a non-owner on a sealed session.
    let r = create(
        &api,
        json!({"agent": "invoices", "params": valid_params(), "seal": true, "session_token": true}),
    )
    .await;
    assert_eq!(r.status, 201, "{}", r.text);
    let sealed = id_of(&r);
    let sealed_token = r.json["session_token"].as_str().unwrap().to_string();
    let r = api
        .call(
            "POST",
            &format!("/v1/sessions/{sealed}/messages"),
            Some(&sealed_token),
            Some(&json!({"prompt": "hi", "params": {"tenant": "globex"}})),
        )
        .await;
    assert_eq!(
        error_of(&r),
        refusal(403, "forbidden_params", &["tenant"]),
        "{}",
        r.text
    );
    let r = api
        .call("GET", &format!("/v1/sessions/{sealed}"), Some(OWNER), None)
        .await;
    assert_eq!(r.json["params"], json!({"tenant": "acme"}), "{}", r.text);

    // No refused request started a run.
    assert_eq!(w.mock.request_count(), 0, "{:?}", w.mock.requests());
    for s in [&id, &sealed] {
        let r = api
            .call("GET", &format!("/v1/sessions/{s}"), Some(OWNER), None)
            .await;
        assert_eq!(r.json["status"], "idle", "{}", r.text);
        assert_eq!(r.json["session"]["turns"], json!([]), "{}", r.text);
    }

    // The control: once the value is back, a message runs (two model turns).
    let r = api
        .call(
            "PUT",
            &params,
            Some(OWNER),
            Some(&json!({"params": {"billing_token": CANARY}})),
        )
        .await;
    assert_eq!(r.status, 200, "{}", r.text);
    let r = message_waited(&api, &id, "which invoices are overdue?").await;
    assert_eq!(r.json["status"], "idle", "{}", r.text);
    assert_eq!(w.mock.request_count(), 2);
    assert!(!sidecar.logs().contains(CANARY));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pinned_name_is_forbidden_to_every_client() {
    let w = World::new(tool_then_answer).await;
    let (_sidecar, api) = w.start(&["--pin", "tenant=acme-corp"], &[]);
    let r = create(
        &api,
        json!({"agent": "invoices", "prompt": "hi",
               "params": {"tenant": "globex", "billing_token": CANARY}}),
    )
    .await;
    assert_eq!(
        error_of(&r),
        refusal(403, "forbidden_params", &["tenant"]),
        "{}",
        r.text
    );
    assert!(!r.text.contains("acme-corp"), "{}", r.text);

    // Not on an existing session either, not even by its owner.
    let r = create(
        &api,
        json!({"agent": "invoices", "params": {"billing_token": CANARY}}),
    )
    .await;
    assert_eq!(r.status, 201, "{}", r.text);
    assert_eq!(r.json["params"], json!({}), "{}", r.text);
    let id = id_of(&r);
    for (method, path, body) in [
        (
            "PUT",
            format!("/v1/sessions/{id}/params"),
            json!({"params": {"tenant": "globex"}}),
        ),
        (
            "POST",
            format!("/v1/sessions/{id}/messages"),
            json!({"prompt": "hi", "params": {"tenant": "globex"}}),
        ),
    ] {
        let r = api.call(method, &path, Some(OWNER), Some(&body)).await;
        assert_eq!(
            error_of(&r),
            refusal(403, "forbidden_params", &["tenant"]),
            "{method} {path}: {}",
            r.text
        );
    }
    assert_eq!(w.mock.request_count(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_token_opens_four_doors_of_its_own_session() {
    let w = World::new(slow_when_asked).await;
    let (sidecar, api) = w.start(&[], &[]);
    let r = create(
        &api,
        json!({"agent": "invoices", "params": valid_params(), "seal": true, "session_token": true}),
    )
    .await;
    assert_eq!(r.status, 201, "{}", r.text);
    assert_eq!(r.json["sealed"], true);
    let id = id_of(&r);
    let token = r.json["session_token"].as_str().unwrap().to_string();
    assert!(token.starts_with("st_"), "{token}");
    assert!(token.len() > 40, "{token}");
    let other = id_of(&create(&api, json!({"agent": "invoices", "params": valid_params()})).await);

    let session = format!("/v1/sessions/{id}");
    let messages = format!("{session}/messages");
    let events = format!("{session}/events");
    let cancel = format!("{session}/cancel");

    // Returned once: a later GET (even the owner's) does not carry it.
    let r = api.call("GET", &session, Some(OWNER), None).await;
    assert_eq!(r.status, 200, "{}", r.text);
    assert!(r.json.get("session_token").is_none(), "{}", r.text);
    assert!(!r.text.contains(&token));
    assert_eq!(r.json["params"], json!({"tenant": "acme"}));
    assert_eq!(r.json["secret_params"], json!(["billing_token"]));

    // It can read the session, without its parameters.
    let r = api.call("GET", &session, Some(&token), None).await;
    assert_eq!(r.status, 200, "{}", r.text);
    assert_eq!(r.json["params"], json!({}), "{}", r.text);
    assert_eq!(r.json["secret_params"], json!([]), "{}", r.text);
    assert!(r.json.get("session_token").is_none(), "{}", r.text);

    // It can post a message, and wait for the run.
    let r = api
        .call(
            "POST",
            &format!("{messages}?wait=true"),
            Some(&token),
            Some(&json!({"prompt": "which invoices are overdue?"})),
        )
        .await;
    assert_eq!(r.status, 200, "{}", r.text);
    assert_eq!(r.json["status"], "idle", "{}", r.text);
    assert_eq!(turns_of(&r).len(), 4, "{}", r.text);
    assert_eq!(r.json["params"], json!({}), "{}", r.text);
    assert!(turns_of(&r)[3]["content"]
        .as_str()
        .unwrap()
        .starts_with("answer: "));

    // It can read the events.
    let (status, stream) = api.events(&events, Some(&token), None).await;
    assert_eq!(status, 200);
    let mut stream = stream.unwrap();
    let seen = stream.until("run_finished", PATIENCE).await;
    assert_eq!(
        seen.last().map(|e| e.event.as_str()),
        Some("run_finished"),
        "{seen:?}"
    );
    assert!(!stream.raw.contains(CANARY));

    // It cannot set parameters, fork, resume or revoke: 403 on its own session.
    let r = api
        .call(
            "PUT",
            &format!("{session}/params"),
            Some(&token),
            Some(&json!({"params": {"tenant": "globex"}})),
        )
        .await;
    assert_eq!(
        error_of(&r),
        refusal(403, "forbidden_params", &["tenant"]),
        "{}",
        r.text
    );
    for (method, path) in [
        ("POST", format!("{session}/fork")),
        ("POST", format!("{session}/resume")),
        ("DELETE", format!("{session}/token")),
    ] {
        let r = api.call(method, &path, Some(&token), None).await;
        assert_eq!(r.status, 403, "{method} {path}: {}", r.text);
        assert_eq!(r.json["error"], "forbidden", "{method} {path}: {}", r.text);
    }
    // Nor send parameters with a message.
    let r = api
        .call(
            "POST",
            &messages,
            Some(&token),
            Some(&json!({"prompt": "hi", "params": {"otp": "123456"}})),
        )
        .await;
    assert_eq!(
        error_of(&r),
        refusal(403, "forbidden_params", &["otp"]),
        "{}",
        r.text
    );

    // Off its session it is no token at all: 401.
    let other_session = format!("/v1/sessions/{other}");
    for (method, path) in [
        ("GET", "/v1/sessions".to_string()),
        ("POST", "/v1/sessions".to_string()),
        ("GET", "/v1/agents".to_string()),
        ("GET", "/v1/agents/invoices".to_string()),
        ("POST", "/v1/continuations/anything".to_string()),
        ("GET", other_session.clone()),
        ("POST", format!("{other_session}/messages")),
        ("GET", format!("{other_session}/events")),
        ("POST", format!("{other_session}/cancel")),
        ("PUT", format!("{other_session}/params")),
        ("POST", format!("{other_session}/fork")),
        ("DELETE", format!("{other_session}/token")),
    ] {
        let body = json!({"agent": "invoices", "prompt": "hi", "params": {}});
        let r = api.call(method, &path, Some(&token), Some(&body)).await;
        assert_eq!(r.status, 401, "{method} {path}: {}", r.text);
        assert_eq!(
            r.json["error"], "unauthorized",
            "{method} {path}: {}",
            r.text
        );
    }

    // The owner can still change parameters of the sealed session.
    let r = api
        .call(
            "PUT",
            &format!("{session}/params"),
            Some(OWNER),
            Some(&json!({"params": {"tenant": "globex"}})),
        )
        .await;
    assert_eq!(r.status, 200, "{}", r.text);
    assert_eq!(r.json["params"], json!({"tenant": "globex"}), "{}", r.text);
    assert_eq!(
        r.json["secret_params"],
        json!(["billing_token"]),
        "{}",
        r.text
    );

    // It can cancel a run in progress.
    let before = w.mock.request_count();
    let r = api
        .call(
            "POST",
            &messages,
            Some(&token),
            Some(&json!({"prompt": "a slow question"})),
        )
        .await;
    assert_eq!(r.status, 202, "{}", r.text);
    assert_eq!(r.json["status"], "running", "{}", r.text);
    until_requests(&w.mock, before + 1).await;
    let r = api.call("POST", &cancel, Some(&token), None).await;
    assert_eq!(r.status, 200, "{}", r.text);
    assert_eq!(r.json["status"], "idle", "{}", r.text);
    assert_eq!(r.json["status_detail"], "cancelled", "{}", r.text);
    assert_eq!(r.json["params"], json!({}), "{}", r.text);

    // Revoked: 401 everywhere, on the doors it had.
    let r = api
        .call("DELETE", &format!("{session}/token"), Some(OWNER), None)
        .await;
    assert_eq!(r.status, 204, "{}", r.text);
    for (method, path) in [
        ("GET", session.clone()),
        ("POST", messages.clone()),
        ("GET", events.clone()),
        ("POST", cancel.clone()),
        ("PUT", format!("{session}/params")),
        ("POST", format!("{session}/fork")),
    ] {
        let r = api
            .call(method, &path, Some(&token), Some(&json!({"prompt": "hi"})))
            .await;
        assert_eq!(r.status, 401, "{method} {path}: {}", r.text);
    }
    let (status, _) = api.events(&events, Some(&token), None).await;
    assert_eq!(status, 401);

    // A made-up session token is nothing.
    let fake = format!("st_{}", "ab".repeat(32));
    for path in [session.clone(), other_session.clone()] {
        let r = api.call("GET", &path, Some(&fake), None).await;
        assert_eq!(r.status, 401, "{path}: {}", r.text);
    }
    // Nothing the token holder did reached the model with a secret.
    for req in w.mock.requests() {
        assert!(!req.to_string().contains(CANARY));
    }
    assert!(!sidecar.logs().contains(CANARY));
    assert!(!sidecar.logs().contains(&token));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn run_lifecycle_errors() {
    let w = World::with_toolboxes(slow_tool_when_asked, slow_toolbox).await;
    let (_sidecar, api) = w.start(&[], &[]);
    let r = create(&api, json!({"agent": "invoices", "params": valid_params()})).await;
    assert_eq!(r.status, 201, "{}", r.text);
    let id = id_of(&r);
    let session = format!("/v1/sessions/{id}");
    let messages = format!("{session}/messages");
    let cancel = format!("{session}/cancel");

    // 409 not_running: nothing to cancel yet.
    let r = api.call("POST", &cancel, Some(OWNER), None).await;
    assert_eq!(error_of(&r).0, 409, "{}", r.text);
    assert_eq!(error_of(&r).1, "not_running", "{}", r.text);

    // A run whose tool call is still running.
    let (status, stream) = api
        .events(&format!("{session}/events"), Some(OWNER), None)
        .await;
    assert_eq!(status, 200);
    let mut stream = stream.unwrap();
    let r = api
        .call(
            "POST",
            &messages,
            Some(OWNER),
            Some(&json!({"prompt": "a slow lookup"})),
        )
        .await;
    assert_eq!(r.status, 202, "{}", r.text);
    let seen = stream.until("tool_call", PATIENCE).await;
    assert_eq!(
        seen.last().map(|e| e.event.as_str()),
        Some("tool_call"),
        "{seen:?}"
    );

    // 409 run_in_progress for a second message, and for a resume.
    for path in [messages.clone(), format!("{session}/resume")] {
        let r = api
            .call(
                "POST",
                &path,
                Some(OWNER),
                Some(&json!({"prompt": "and now?"})),
            )
            .await;
        assert_eq!(error_of(&r).0, 409, "{path}: {}", r.text);
        assert_eq!(error_of(&r).1, "run_in_progress", "{path}: {}", r.text);
    }

    // Cancel: 200, idle, "cancelled", the pending call answered.
    let r = api.call("POST", &cancel, Some(OWNER), None).await;
    assert_eq!(r.status, 200, "{}", r.text);
    assert_eq!(r.json["status"], "idle", "{}", r.text);
    assert_eq!(r.json["status_detail"], "cancelled", "{}", r.text);
    let turns = turns_of(&r);
    assert_well_formed(&turns);
    assert_eq!(turns.len(), 3, "{turns:?}");
    assert_eq!(
        turns[1]["tool_calls"][0]["function"]["name"],
        "bash_slow-lookup"
    );
    assert_eq!(turns[2]["content"], "error: the run was cancelled");
    let seen = stream.until("run_finished", PATIENCE).await;
    let finished = seen.last().expect("a run_finished event");
    assert_eq!(finished.event, "run_finished", "{seen:?}");
    let data: Value = serde_json::from_str(&finished.data).unwrap();
    assert_eq!(data["status"], "cancelled", "{data}");
    // A GET says the same, and a second cancel finds nothing to cancel.
    let r = api.call("GET", &session, Some(OWNER), None).await;
    assert_eq!(r.json["status"], "idle", "{}", r.text);
    assert_eq!(r.json["status_detail"], "cancelled", "{}", r.text);
    assert_eq!(turns_of(&r), turns);
    let r = api.call("POST", &cancel, Some(OWNER), None).await;
    assert_eq!(error_of(&r).1, "not_running", "{}", r.text);

    // The session goes on: the model is sent a well-formed history.
    let r = message_waited(&api, &id, "hello again").await;
    assert_eq!(r.json["status"], "idle", "{}", r.text);
    assert_eq!(r.json["status_detail"], Value::Null, "{}", r.text);
    assert_well_formed(&turns_of(&r));
    let last = w.mock.requests().pop().unwrap();
    let sent: Vec<Value> = last["messages"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|m| m["role"] != "system")
        .cloned()
        .collect();
    assert_well_formed(&sent);

    // 404 for an unknown session, on every route that names one.
    let unknown = format!("/v1/sessions/{NO_SUCH_SESSION}");
    for (method, path) in [
        ("GET", unknown.clone()),
        ("POST", format!("{unknown}/messages")),
        ("POST", format!("{unknown}/resume")),
        ("POST", format!("{unknown}/cancel")),
        ("POST", format!("{unknown}/fork")),
        ("PUT", format!("{unknown}/params")),
        ("DELETE", format!("{unknown}/token")),
        ("GET", format!("{unknown}/events")),
    ] {
        let r = api
            .call(method, &path, Some(OWNER), Some(&json!({"prompt": "hi"})))
            .await;
        assert_eq!(r.status, 404, "{method} {path}: {}", r.text);
        assert_eq!(r.json["error"], "not_found", "{method} {path}: {}", r.text);
    }
    // 404 not_found on a continuation whose token names no pending call.
    let r = api
        .call(
            "POST",
            "/v1/continuations/anything",
            Some(OWNER),
            Some(&json!({})),
        )
        .await;
    assert_eq!(r.status, 404, "{}", r.text);
    assert_eq!(r.json["error"], "not_found", "{}", r.text);
    assert!(!r.text.contains("no such route"), "{}", r.text);

    // 401 without a token, or with a wrong one.
    for token in [None, Some("not-the-owner-token")] {
        for (method, path) in [
            ("GET", "/v1/sessions".to_string()),
            ("POST", "/v1/sessions".to_string()),
            ("GET", session.clone()),
            ("POST", messages.clone()),
            ("GET", "/v1/agents".to_string()),
        ] {
            let r = api
                .call(method, &path, token, Some(&json!({"prompt": "hi"})))
                .await;
            assert_eq!(r.status, 401, "{method} {path} {token:?}: {}", r.text);
            assert_eq!(r.json["error"], "unauthorized", "{}", r.text);
        }
    }

    // 400 bad_request for a malformed body.
    for (path, body) in [
        ("/v1/sessions", r#"{"agent": "invoices", "params": "#),
        (messages.as_str(), "prompt=hi"),
        (messages.as_str(), r#"{"prompt": 42}"#),
    ] {
        let r = raw(
            &api,
            "POST",
            path,
            Some(OWNER),
            body,
            Some("application/json"),
        )
        .await;
        assert_eq!(r.status, 400, "{path} {body}: {}", r.text);
        assert_eq!(r.json["error"], "bad_request", "{}", r.text);
    }
    let r = raw(
        &api,
        "PUT",
        &format!("{session}/params"),
        Some(OWNER),
        "{",
        None,
    )
    .await;
    assert_eq!(error_of(&r).1, "bad_request", "{}", r.text);

    // A body without Content-Type (or with another one) is read as JSON.
    let body = json!({"agent": "invoices", "params": valid_params()}).to_string();
    let r = raw(&api, "POST", "/v1/sessions", Some(OWNER), &body, None).await;
    assert_eq!(r.status, 201, "{}", r.text);
    let plain = id_of(&r);
    let r = raw(
        &api,
        "POST",
        &format!("/v1/sessions/{plain}/messages?wait=true"),
        Some(OWNER),
        r#"{"prompt": "hello"}"#,
        Some("text/plain"),
    )
    .await;
    assert_eq!(r.status, 200, "{}", r.text);
    assert_eq!(turns_of(&r).len(), 2, "{}", r.text);
}

/// `{id}`, `{slug}` and `{token}` filled in with things that exist or not.
fn fill(path: &str, id: &str) -> String {
    path.replace("{id}", id)
        .replace("{slug}", "invoices")
        .replace("{token}", "anything")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_documented_route_is_served() {
    let w = World::new(tool_then_answer).await;
    let (_sidecar, api) = w.start(&[], &[]);

    // The document, without a token.
    let doc = api.call("GET", "/openapi.json", None, None).await;
    assert_eq!(doc.status, 200, "{}", doc.text);
    assert_eq!(doc.json["openapi"], "3.1.0");
    for (method, path) in [
        ("put", "/v1/sessions/{id}/params"),
        ("delete", "/v1/sessions/{id}/token"),
        ("post", "/v1/sessions/{id}/fork"),
    ] {
        assert!(
            doc.json["paths"][path][method].is_object(),
            "{method} {path} is not in the document"
        );
    }

    // A route that does not exist gets the fallback: the check below can tell.
    let r = api.call("GET", "/v1/nothing-here", Some(OWNER), None).await;
    assert_eq!(r.status, 404);
    assert!(r.text.contains("no such route"), "{}", r.text);

    // Every documented route reaches its handler (an unknown session's id
    // makes them answer without starting anything).
    let mut routes = Vec::new();
    for (path, item) in doc.json["paths"].as_object().expect("paths") {
        for (op, operation) in item.as_object().expect("path item") {
            assert!(operation.is_object(), "{op} {path} is not an operation");
            routes.push((op.to_ascii_uppercase(), path.clone(), op.clone()));
        }
    }
    assert_eq!(routes.len(), 30, "{routes:?}");
    for (method, path, op) in &routes {
        let method = method.as_str();
        let url = fill(path, NO_SUCH_SESSION);
        let r = api.call(method, &url, Some(OWNER), Some(&json!({}))).await;
        assert!(
            !r.text.contains("no such route"),
            "{method} {url} fell through to the fallback: {} {}",
            r.status,
            r.text
        );
        assert_ne!(r.status, 405, "{method} {url}: no such method");
        assert!(r.status < 500, "{method} {url}: {} {}", r.status, r.text);
        // Without a token: 401 exactly where the document asks for one.
        let public = doc.json["paths"][path.as_str()][op.as_str()]["security"] == json!([]);
        let r = api.call(method, &url, None, Some(&json!({}))).await;
        assert_eq!(
            r.status == 401,
            !public,
            "{method} {url} without a token: {} {}",
            r.status,
            r.text
        );
    }
    assert_eq!(w.mock.request_count(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_after_one_run() {
    let w = World::new(tool_then_answer).await;
    let (_sidecar, api) = w.start(&[], &[]);
    let r = api
        .call(
            "POST",
            "/v1/sessions?wait=true",
            Some(OWNER),
            Some(&json!({"agent": "invoices", "params": valid_params(),
                         "prompt": "which invoices are overdue?"})),
        )
        .await;
    assert_eq!(r.status, 201, "{}", r.text);
    assert_eq!(r.json["status"], "idle", "{}", r.text);
    assert_eq!(turns_of(&r).len(), 4, "{}", r.text);
    // Requests about sessions that do not exist are no live sessions.
    for (method, path) in [
        ("POST", format!("/v1/sessions/{NO_SUCH_SESSION}/messages")),
        ("PUT", format!("/v1/sessions/{NO_SUCH_SESSION}/params")),
        ("POST", format!("/v1/sessions/{NO_SUCH_SESSION}/resume")),
        ("DELETE", format!("/v1/sessions/{NO_SUCH_SESSION}/token")),
        ("GET", format!("/v1/sessions/{NO_SUCH_SESSION}")),
    ] {
        let r = api
            .call(method, &path, Some(OWNER), Some(&json!({"prompt": "hi"})))
            .await;
        assert_eq!(r.status, 404, "{method} {path}: {}", r.text);
    }

    let m = api.call("GET", "/metrics", None, None).await;
    assert_eq!(m.status, 200, "{}", m.text);
    let text = &m.text;
    assert!(
        text.lines()
            .any(|l| l == r#"bindery_runs_total{outcome="completed"} 1"#),
        "{text}"
    );
    assert_eq!(
        sample(text, "bindery_runs_started_total"),
        Some(1.0),
        "{text}"
    );
    assert!(
        text.lines()
            .any(|l| l.starts_with("bindery_tool_calls_total{")
                && l.contains(r#"tool="bash_query-invoices""#)
                && l.contains(r#"outcome="ok""#)
                && l.ends_with(" 1")),
        "{text}"
    );
    assert_eq!(
        sample(text, "bindery_llm_request_duration_seconds_count"),
        Some(2.0),
        "{text}"
    );
    // The one tool run, timed: a bash script takes more than nothing.
    assert_eq!(
        sample(text, "bindery_tool_call_duration_seconds_count"),
        Some(1.0),
        "{text}"
    );
    let tool_seconds = sample(text, "bindery_tool_call_duration_seconds_sum").unwrap();
    assert!(tool_seconds > 0.0 && tool_seconds < 60.0, "{text}");
    assert_eq!(sample(text, "bindery_sessions_live"), Some(1.0), "{text}");
    assert!(!text.contains(CANARY));
    assert!(!text.contains("acme"), "a value in the metrics: {text}");
}

/// The event stream's wire format, byte for byte as agents-server clients
/// read it, and a keep-alive comment on a stream with nothing to say
/// (`--events-keep-alive`), which stays open.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_event_stream_is_server_sent_events_kept_alive_while_idle() {
    let w = World::new(tool_then_answer).await;
    let (_sidecar, api) = w.start(&["--events-keep-alive", "100ms"], &[]);
    let r = create(&api, json!({"agent": "invoices", "params": valid_params()})).await;
    assert_eq!(r.status, 201, "{}", r.text);
    let id = id_of(&r);
    message_waited(&api, &id, "which invoices are overdue?").await;

    let events = format!("/v1/sessions/{id}/events");
    let resp = api
        .http
        .get(format!("{}{events}", api.base))
        .bearer_auth(OWNER)
        .send()
        .await
        .expect("the stream opens");
    let header = |name: &str| resp.headers().get(name).and_then(|v| v.to_str().ok());
    assert_eq!(header("content-type"), Some("text/event-stream"));
    assert_eq!(header("cache-control"), Some("no-cache"));
    drop(resp);

    // The stored events, replayed: `id`, `event`, one `data` line of JSON.
    let (status, stream) = api.events(&events, Some(OWNER), None).await;
    assert_eq!(status, 200);
    let mut stream = stream.expect("a stream");
    let seen = stream.until("run_finished", PATIENCE).await;
    assert_eq!(
        seen.last().map(|e| e.event.as_str()),
        Some("run_finished"),
        "{seen:?}"
    );
    let first = &seen[0];
    let data: Value = serde_json::from_str(&first.data).expect("JSON data");
    let block = format!("id: 1\nevent: {}\ndata: {data}\n\n", first.event);
    assert!(stream.raw.starts_with(&block), "{:?}", stream.raw);
    for (i, e) in seen.iter().enumerate() {
        assert_eq!(
            e.id.as_deref(),
            Some((i + 1).to_string().as_str()),
            "{seen:?}"
        );
    }

    // Then nothing happens: keep-alive comments, and the stream stays open
    // for the next run's events.
    let deadline = tokio::time::Instant::now() + PATIENCE;
    while stream.raw.matches("\n:\n\n").count() < 2 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "no keep-alive: {:?}",
            stream.raw
        );
        let _ = tokio::time::timeout(Duration::from_millis(50), stream.next()).await;
    }
    let r = api
        .call(
            "POST",
            &format!("/v1/sessions/{id}/messages"),
            Some(OWNER),
            Some(&json!({"prompt": "and now?"})),
        )
        .await;
    assert_eq!(r.status, 202, "{}", r.text);
    let seen = stream.until("run_finished", PATIENCE).await;
    assert_eq!(
        seen.last().map(|e| e.event.as_str()),
        Some("run_finished"),
        "{seen:?}"
    );
}

/// The document's `security` of each route is what the route lets in:
/// each of the owner token, a session token (on its own session, named in
/// `Bindery-Session-Id` too), a write share of that session, the approver
/// token and the MCP client token
/// is refused (401, or 403 `forbidden`/`forbidden_params`) exactly where
/// the route's security does not list its scheme.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_route_lets_in_the_tokens_its_security_lists() {
    let w = World::new(|_| MockReply::text("done")).await;
    let tokens = w.dir.path().join("tokens");
    std::fs::create_dir_all(&tokens).unwrap();
    std::fs::write(tokens.join("approver"), "approver-token-for-tests\n").unwrap();
    std::fs::write(tokens.join("mcp"), "mcp-client-token-for-tests\n").unwrap();
    let (approver, mcp) = (tokens.join("approver"), tokens.join("mcp"));
    let (_sidecar, api) = w.start(
        &[
            "--approver-token-file",
            approver.to_str().unwrap(),
            "--mcp-client-token-file",
            mcp.to_str().unwrap(),
        ],
        &[],
    );
    let doc = api.call("GET", "/openapi.json", None, None).await;
    let mut checked = 0;
    for (path, item) in doc.json["paths"].as_object().unwrap() {
        for (op, operation) in item.as_object().unwrap() {
            let schemes: Vec<&str> = operation["security"]
                .as_array()
                .unwrap()
                .iter()
                .flat_map(|r| r.as_object().unwrap().keys().map(String::as_str))
                .collect();
            if schemes.is_empty() {
                continue;
            }
            // A session of its own (a route may revoke its token), with a
            // session token.
            let r = create(
                &api,
                json!({"agent": "invoices", "params": valid_params(), "session_token": true}),
            )
            .await;
            let id = id_of(&r);
            let session_token = r.json["session_token"].as_str().unwrap().to_string();
            // And a write share of it (`shareToken` names both kinds: a
            // read share is let in where it reads only).
            let r = api
                .call(
                    "POST",
                    &format!("/v1/sessions/{id}/shares"),
                    Some(OWNER),
                    Some(&json!({"mode": "write"})),
                )
                .await;
            assert_eq!(r.status, 201, "{}", r.text);
            let share_token = r.json["token"].as_str().unwrap().to_string();
            let url = path
                .replace("{id}", &id)
                .replace("{slug}", "invoices")
                .replace("{token}", &format!("ct_{id}_{}", "0".repeat(64)));
            for (scheme, token) in [
                ("ownerToken", OWNER),
                ("sessionToken", session_token.as_str()),
                ("shareToken", share_token.as_str()),
                ("approverToken", "approver-token-for-tests"),
                ("mcpClientToken", "mcp-client-token-for-tests"),
            ] {
                let method =
                    reqwest::Method::from_bytes(op.to_ascii_uppercase().as_bytes()).unwrap();
                let resp = api
                    .http
                    .request(method, format!("{}{url}", api.base))
                    .bearer_auth(token)
                    .header("bindery-session-id", &id)
                    .header("accept", "application/json")
                    .json(&json!({}))
                    .send()
                    .await
                    .unwrap();
                let status = resp.status().as_u16();
                // An event stream stays open: its answer is its status.
                let stream = resp
                    .headers()
                    .get("content-type")
                    .is_some_and(|t| t.as_bytes().starts_with(b"text/event-stream"));
                let body: Value = match stream {
                    true => Value::Null,
                    false => resp.json().await.unwrap_or(Value::Null),
                };
                let refused = status == 401
                    || (status == 403
                        && ["forbidden", "forbidden_params"]
                            .contains(&body["error"].as_str().unwrap_or("")));
                assert_eq!(
                    refused,
                    !schemes.contains(&scheme),
                    "{op} {path} with the {scheme}: {status} {body}"
                );
                checked += 1;
            }
        }
    }
    assert_eq!(checked, 22 * 5, "every route with a security requirement");
}
