//! Session lifecycle through the real server, where only it shows it:
//! restart, a crash, many sessions at once, and a secret canary searched
//! for everywhere (logs included). Forks, message scope, concurrent
//! messages and values changed around runs are tested in process
//! (`sidecar/api/tests/inproc/sessions.rs`).

use std::time::Duration;

use crate::common::*;
use bindery_tests::mock_llm::MockReply;
use serde_json::json;

fn session_id(r: &bindery_tests::sidecar::Reply) -> String {
    r.json["session_id"]
        .as_str()
        .unwrap_or_else(|| panic!("{}", r.text))
        .to_string()
}

fn tool_output(r: &bindery_tests::sidecar::Reply) -> String {
    let turns = r.json["session"]["turns"].as_array().unwrap();
    turns
        .iter()
        .rev()
        .find(|t| t["role"] == "tool")
        .map(|t| t["content"].as_str().unwrap().to_string())
        .unwrap_or_default()
}

/// Secrets live in memory only: after a restart the non-secret values are
/// back, a message needing the secret gets 409, PUT params re-supplies it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restart_keeps_plain_values_and_forgets_secrets() {
    let w = World::new(tool_then_answer).await;
    let (mut sidecar, api) = w.start(&[], &[]);
    let r = api
        .call(
            "POST",
            "/v1/sessions?wait=true",
            Some(OWNER),
            Some(&json!({
            "agent": "invoices", "prompt": "overdue?",
            "params": {"tenant": "globex", "billing_token": CANARY}})),
        )
        .await;
    assert_eq!(r.status, 201, "{}", r.text);
    let id = session_id(&r);
    assert!(tool_output(&r).contains("INV-2002"), "{}", r.text);
    sidecar.kill();

    let (sidecar, api) = w.start(&[], &[]);
    let r = api
        .call("GET", &format!("/v1/sessions/{id}"), Some(OWNER), None)
        .await;
    assert_eq!(r.json["params"], json!({"tenant": "globex"}));
    assert_eq!(r.json["secret_params"], json!([]));
    assert_eq!(r.json["session"]["turns"].as_array().unwrap().len(), 4);

    let before = w.mock.request_count();
    let r = api
        .call(
            "POST",
            &format!("/v1/sessions/{id}/messages"),
            Some(OWNER),
            Some(&json!({"prompt": "again"})),
        )
        .await;
    assert_eq!(r.status, 409, "{}", r.text);
    assert_eq!(r.json["error"], "params_required");
    assert_eq!(r.json["params"], json!(["billing_token"]));
    assert_eq!(w.mock.request_count(), before, "no run started");

    let r = api
        .call(
            "PUT",
            &format!("/v1/sessions/{id}/params"),
            Some(OWNER),
            Some(&json!({"params": {"billing_token": "fresh"}})),
        )
        .await;
    assert_eq!(r.status, 200, "{}", r.text);
    assert_eq!(r.json["secret_params"], json!(["billing_token"]));
    let r = message_waited(&api, &id, "again").await;
    assert_eq!(r.json["status"], "idle");
    assert!(tool_output(&r).contains("INV-2002"));
    assert_eq!(r.json["session"]["turns"].as_array().unwrap().len(), 8);
    assert!(!contains(
        &raw_files(&w.dir.path().join("store"), "bindery.sqlite"),
        CANARY
    ));
    drop(sidecar);
}

/// A run cut by a crash is marked failed after the restart, not retried.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_cut_by_a_crash_is_failed_not_retried() {
    let w = World::new(|_| MockReply::text("late").delayed(Duration::from_secs(120))).await;
    let (mut sidecar, api) = w.start(&[], &[]);
    let r = api
        .call("POST", "/v1/sessions", Some(OWNER), Some(&json!({
            "agent": "invoices", "prompt": "slow", "params": {"tenant": "acme-corp", "billing_token": "t"}})))
        .await;
    let id = session_id(&r);
    assert_eq!(r.json["status"], "running");
    // Wait until the model has the request: the run is really in flight.
    until("the model gets the request", PATIENCE, || {
        w.mock.request_count() > 0
    })
    .await;
    assert_eq!(w.mock.request_count(), 1);
    sidecar.kill();
    let (_sidecar, api) = w.start(&[], &[]);
    let r = api
        .call("GET", &format!("/v1/sessions/{id}"), Some(OWNER), None)
        .await;
    assert_eq!(r.json["status"], "failed", "{}", r.text);
    assert_eq!(
        r.json["status_detail"],
        "interrupted by a restart of the server"
    );
    assert_eq!(w.mock.request_count(), 1, "nothing retried");
}

/// 50 sessions driven at once: every message and tool result accounted for,
/// each with its own tenant.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fifty_sessions_at_once() {
    let w = World::new(tool_then_answer).await;
    let (_sidecar, api) = w.start(&["--no-stream"], &[]);
    let tenants = [
        ("acme-corp", "INV-1002"),
        ("globex", "INV-2002"),
        ("initech", "No invoices match."),
    ];
    let runs = (0..50).map(|i| {
        let api = api.clone();
        let (tenant, expect) = tenants[i % 3];
        async move {
            let r = api
                .call(
                    "POST",
                    "/v1/sessions?wait=true&timeout=120",
                    Some(OWNER),
                    Some(&json!({
                    "agent": "invoices", "prompt": format!("question {i}"),
                    "params": {"tenant": tenant, "billing_token": format!("token-{i}")}})),
                )
                .await;
            assert_eq!(r.status, 201, "{}", r.text);
            assert_eq!(r.json["status"], "idle", "{}", r.text);
            let turns = r.json["session"]["turns"].as_array().unwrap().clone();
            assert_eq!(turns.len(), 4, "{turns:?}");
            assert_eq!(turns[0]["content"], format!("question {i}"));
            assert!(
                turns[2]["content"].as_str().unwrap().contains(expect),
                "{i} {tenant}: {turns:?}"
            );
            assert!(turns[3]["content"].as_str().unwrap().contains(expect));
        }
    });
    futures::future::join_all(runs).await;
    assert_eq!(w.mock.request_count(), 100);
    let r = api.call("GET", "/v1/sessions", Some(OWNER), None).await;
    assert_eq!(r.json["sessions"].as_array().unwrap().len(), 50);
}

/// A secret canary given every way a client can give one appears in no
/// server log, no byte of the store, no HTTP response, no event stream, no
/// metric and no request the model received.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn secrecy_canary_everywhere() {
    const OTP: &str = "canary-otp-51e2";
    let w = World::new(tool_then_answer).await;
    let (sidecar, api) = w.start(&["--log-format", "json"], &[("BINDERY_LOG", "debug")]);
    let mut seen = String::new();
    let mut keep = |r: bindery_tests::sidecar::Reply| {
        seen.push_str(&r.text);
        r
    };
    let r = keep(
        api.call(
            "POST",
            "/v1/sessions?wait=true",
            Some(OWNER),
            Some(&json!({
            "agent": "invoices", "prompt": "overdue?", "session_token": true,
            "params": {"tenant": "acme-corp", "billing_token": CANARY, "otp": OTP}})),
        )
        .await,
    );
    let id = session_id(&r);
    let token = r.json["session_token"].as_str().unwrap().to_string();
    keep(
        api.call(
            "PUT",
            &format!("/v1/sessions/{id}/params"),
            Some(OWNER),
            Some(&json!({"params": {"billing_token": CANARY}})),
        )
        .await,
    );
    keep(
        api.call(
            "POST",
            &format!("/v1/sessions/{id}/messages?wait=true"),
            Some(OWNER),
            Some(&json!({"prompt": "more", "params": {"otp": OTP}})),
        )
        .await,
    );
    keep(
        api.call(
            "POST",
            &format!("/v1/sessions/{id}/messages?wait=true"),
            Some(&token),
            Some(&json!({"prompt": "as the browser"})),
        )
        .await,
    );
    let f = keep(
        api.call(
            "POST",
            &format!("/v1/sessions/{id}/fork?wait=true"),
            Some(OWNER),
            Some(&json!({"params": {"billing_token": CANARY}, "prompt": "forked"})),
        )
        .await,
    );
    keep(
        api.call("GET", &format!("/v1/sessions/{id}"), Some(OWNER), None)
            .await,
    );
    keep(
        api.call(
            "GET",
            &format!("/v1/sessions/{}", session_id(&f)),
            Some(OWNER),
            None,
        )
        .await,
    );
    keep(
        api.call("GET", &format!("/v1/sessions/{id}"), Some(&token), None)
            .await,
    );
    keep(api.call("GET", "/v1/sessions", Some(OWNER), None).await);
    keep(api.call("GET", "/v1/agents", Some(OWNER), None).await);
    keep(api.call("GET", "/metrics", None, None).await);
    keep(api.call("POST", "/v1/sessions", Some(OWNER), Some(&json!({"agent": "invoices", "params": {"tenant": "x", "billing_token": 7, "otp": OTP}}))).await);
    let (_, stream) = api
        .events(&format!("/v1/sessions/{id}/events"), Some(OWNER), None)
        .await;
    let mut stream = stream.unwrap();
    let mut finished = 0;
    while finished < 3 {
        match tokio::time::timeout(Duration::from_secs(30), stream.next()).await {
            Ok(Some(e)) if e.event == "run_finished" => finished += 1,
            Ok(Some(_)) => {}
            _ => panic!("the event stream ended early: {}", stream.raw),
        }
    }
    seen.push_str(&stream.raw);

    let logs = sidecar.logs();
    assert!(
        logs.contains("bash tool started"),
        "debug logs were captured"
    );
    let store = raw_files(&w.dir.path().join("store"), "bindery.sqlite");
    assert!(!store.is_empty());
    let model: String = w
        .mock
        .raw_requests()
        .into_iter()
        .map(|(h, b)| format!("{h:?}{b}"))
        .collect();
    for secret in [CANARY, OTP] {
        assert!(
            !seen.contains(secret),
            "an HTTP response or event holds {secret}"
        );
        assert!(!logs.contains(secret), "the server log holds {secret}");
        assert!(!contains(&store, secret), "the store holds {secret}");
        assert!(!model.contains(secret), "the model saw {secret}");
    }
}
