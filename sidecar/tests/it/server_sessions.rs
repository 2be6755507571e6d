//! Session lifecycle through the real server: restart, fork, message scope,
//! many sessions at once, and a secret canary searched for everywhere.

use std::time::Duration;

use crate::common::*;
use bindery_tests::mock_llm::{last_message, MockReply};
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

/// A fork copies the turns, takes fresh values, inherits no secret, no
/// seal, no token; and `fork` on creation does the same.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fork_starts_from_the_history_with_fresh_values() {
    let w = World::new(tool_then_answer).await;
    let (_sidecar, api) = w.start(&[], &[]);
    let r = api
        .call(
            "POST",
            "/v1/sessions?wait=true",
            Some(OWNER),
            Some(&json!({
            "agent": "invoices", "prompt": "overdue?", "seal": true, "session_token": true,
            "params": {"tenant": "acme-corp", "billing_token": CANARY}})),
        )
        .await;
    let source = session_id(&r);
    assert!(tool_output(&r).contains("INV-1002"));

    // Secrets are never inherited.
    let r = api
        .call(
            "POST",
            &format!("/v1/sessions/{source}/fork"),
            Some(OWNER),
            Some(&json!({})),
        )
        .await;
    assert_eq!(
        (r.status, r.json["error"].clone()),
        (422, json!("params_required")),
        "{}",
        r.text
    );
    assert_eq!(r.json["params"], json!(["billing_token"]));

    for (how, req) in [
        (
            "route",
            (
                "POST",
                format!("/v1/sessions/{source}/fork?wait=true"),
                json!({"params": {"tenant": "globex", "billing_token": "fresh"}, "prompt": "and now?"}),
            ),
        ),
        (
            "create",
            (
                "POST",
                "/v1/sessions?wait=true".to_string(),
                json!({"fork": source, "params": {"tenant": "globex", "billing_token": "fresh"}, "prompt": "and now?"}),
            ),
        ),
    ] {
        let r = api.call(req.0, &req.1, Some(OWNER), Some(&req.2)).await;
        assert_eq!(r.status, 201, "{how}: {}", r.text);
        let fork = session_id(&r);
        assert_ne!(fork, source);
        assert_eq!(r.json["forked_from"], json!(source));
        assert_eq!(r.json["parent_session_id"], json!(source));
        assert_eq!(r.json["owner"], "owner", "created through the session API");
        assert_eq!(r.json["sealed"], false, "{how}: the seal is not inherited");
        assert!(r.json.get("session_token").is_none(), "{how}");
        assert_eq!(r.json["params"], json!({"tenant": "globex"}));
        let turns = r.json["session"]["turns"].as_array().unwrap();
        assert_eq!(turns.len(), 8, "{how}: 4 copied turns and a new run");
        assert!(
            turns[2]["content"].as_str().unwrap().contains("INV-1002"),
            "{how}: the history is the source's"
        );
        assert!(
            tool_output(&r).contains("INV-2002"),
            "{how}: the new run uses the fresh tenant"
        );
    }
    // The source is untouched.
    let r = api
        .call("GET", &format!("/v1/sessions/{source}"), Some(OWNER), None)
        .await;
    assert_eq!(r.json["session"]["turns"].as_array().unwrap().len(), 4);
    assert_eq!(r.json["params"], json!({"tenant": "acme-corp"}));
    assert_eq!(r.json["secret_params"], json!(["billing_token"]));
}

/// A message-scope value lasts one run.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_message_scope_value_lasts_one_run() {
    let w = World::new(|req| match last_message(req)["role"].as_str() {
        Some("tool") => MockReply::text("ok"),
        _ => MockReply::tool_call("bash_probe", json!({})),
    })
    .await;
    let agent = probe_agent(w.dir.path(), &w.mock.url());
    let (_sidecar, api) = w.start(&["--agent-file", &agent.display().to_string()], &[]);
    let r = api
        .call(
            "POST",
            "/v1/sessions?wait=true",
            Some(OWNER),
            Some(&json!({
            "agent": "prober", "prompt": "go", "params": {"tenant": "r1", "otp": CANARY}})),
        )
        .await;
    assert_eq!(r.status, 201, "{}", r.text);
    let id = session_id(&r);
    let digest = hex::encode(<sha2::Sha256 as sha2::Digest>::digest(CANARY.as_bytes()));
    let out = tool_output(&r);
    assert!(out.contains(&format!("token-sha256: {digest}")), "{out}");
    assert!(out.contains("argv: [--repo] [r1]"), "{out}");
    assert_eq!(
        r.json["secret_params"],
        json!([]),
        "message values are not session values"
    );

    let r = message_waited(&api, &id, "again").await;
    assert_eq!(
        tool_output(&r),
        "error: tool unavailable",
        "the next run has no otp"
    );
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

/// Two messages at once: one runs, the other gets 409 and changes nothing
/// (its values are validated, stored and its run reserved atomically).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_concurrent_message_changes_nothing() {
    let w = World::new(|_| MockReply::text("slow").delayed(Duration::from_millis(500))).await;
    let (_sidecar, api) = w.start(&[], &[]);
    for round in 0..5 {
        let r = api
            .call(
                "POST",
                "/v1/sessions",
                Some(OWNER),
                Some(&json!({
                "agent": "invoices", "params": {"tenant": "start", "billing_token": "t"}})),
            )
            .await;
        let id = session_id(&r);
        let send = |tenant: &'static str| {
            let api = api.clone();
            let id = id.clone();
            async move {
                let r = api
                    .call(
                        "POST",
                        &format!("/v1/sessions/{id}/messages"),
                        Some(OWNER),
                        Some(&json!({"prompt": tenant, "params": {"tenant": tenant}})),
                    )
                    .await;
                (tenant, r.status)
            }
        };
        let (a, b) = tokio::join!(send("a"), send("b"));
        let mut statuses = [a.1, b.1];
        statuses.sort();
        assert_eq!(statuses, [202, 409], "round {round}");
        let winner = if a.1 == 202 { a.0 } else { b.0 };
        let r = api
            .call("GET", &format!("/v1/sessions/{id}"), Some(OWNER), None)
            .await;
        assert_eq!(
            r.json["params"]["tenant"], winner,
            "round {round}: {}",
            r.text
        );
        let users: Vec<_> = r.json["session"]["turns"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|t| t["role"] == "user")
            .collect();
        assert_eq!(users.len(), 1);
        assert_eq!(users[0]["content"], winner);
        api.call(
            "POST",
            &format!("/v1/sessions/{id}/cancel"),
            Some(OWNER),
            None,
        )
        .await;
    }
}

/// A run keeps the record it last wrote rather than read it back before
/// each write; a value changed while it runs (PUT params, between the tool
/// call and the answer) must make its next write start from the stored
/// record, not overwrite the change.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_value_changed_during_a_run_survives_the_runs_writes() {
    use bindery_tests::mock_llm::{tool_results, Gate};
    let gate = Gate::new();
    let held = gate.clone();
    let w = World::new(move |req| {
        let reply = tool_then_answer(req);
        if tool_results(req).is_empty() {
            reply
        } else {
            reply.held(&held)
        }
    })
    .await;
    let (sidecar, api) = w.start(&[], &[]);
    let id = new_session(&api, json!({"agent": "invoices", "params": valid_params()})).await;
    let r = api
        .call(
            "POST",
            &format!("/v1/sessions/{id}/messages"),
            Some(OWNER),
            Some(&json!({"prompt": "which invoices are overdue?"})),
        )
        .await;
    assert_eq!(r.status, 202, "{}", r.text);
    // The second model request holds the tool call and its result: both
    // are written by now.
    until("the model's second request", PATIENCE, || {
        w.mock.request_count() >= 2
    })
    .await;
    move_to_globex(&api, &id).await;
    gate.open();
    let done = eventually_or("the run ends", PATIENCE, || async {
        let r = api
            .call("GET", &format!("/v1/sessions/{id}"), Some(OWNER), None)
            .await;
        match r.json["status"] != "running" {
            true => Ok(r),
            false => Err(sidecar.logs()),
        }
    })
    .await;
    assert_eq!(done.json["status"], "idle", "{}", done.text);
    assert_eq!(done.json["params"]["tenant"], "globex", "{}", done.text);
    let turns = done.json["session"]["turns"].as_array().expect("turns");
    let roles: Vec<_> = turns.iter().map(|t| t["role"].as_str()).collect();
    assert_eq!(
        roles,
        [
            Some("user"),
            Some("assistant"),
            Some("tool"),
            Some("assistant")
        ],
        "{}",
        done.text
    );
}

/// A run's start reads only what changed since the end of the last run
/// here: a value changed between two runs (PUT params) reaches the next
/// one, which goes on from the whole conversation.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_value_changed_between_runs_reaches_the_next_one() {
    let w = World::new(tool_then_answer).await;
    let (_sidecar, api) = w.start(&[], &[]);
    let params = json!({"tenant": "acme-corp", "billing_token": CANARY});
    let id = new_session(&api, json!({"agent": "invoices", "params": params})).await;
    let first = message_waited(&api, &id, "which invoices are overdue?").await;
    assert!(tool_output(&first).contains("INV-1002"), "{}", first.text);
    move_to_globex(&api, &id).await;
    let second = message_waited(&api, &id, "and now?").await;
    assert_eq!(second.json["status"], "idle", "{}", second.text);
    assert_eq!(second.json["params"]["tenant"], "globex", "{}", second.text);
    assert!(tool_output(&second).contains("INV-2002"), "{}", second.text);
    let turns = second.json["session"]["turns"].as_array().expect("turns");
    assert_eq!(turns.len(), 8, "{}", second.text);
    assert_eq!(turns[0]["content"], "which invoices are overdue?");
    // As stored: a read of the session says the same.
    let stored = api
        .call("GET", &format!("/v1/sessions/{id}"), Some(OWNER), None)
        .await;
    assert_eq!(stored.json["session"], second.json["session"]);
    assert_eq!(stored.json["version"], second.json["version"]);
}

/// `PUT /v1/sessions/{id}/params` with the tenant `globex`, taken.
async fn move_to_globex(api: &bindery_tests::sidecar::Api, id: &str) {
    let r = api
        .call(
            "PUT",
            &format!("/v1/sessions/{id}/params"),
            Some(OWNER),
            Some(&json!({"params": {"tenant": "globex"}})),
        )
        .await;
    assert!(
        r.status == 200 || r.status == 204,
        "{} {}",
        r.status,
        r.text
    );
}
