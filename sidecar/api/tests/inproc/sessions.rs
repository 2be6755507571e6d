//! A session's lifecycle in process: a fork's history and fresh values,
//! message-scope values, concurrent messages, and values changed during
//! and between runs. Restarts, a crash, many sessions on a real server and
//! the canary searched for in logs stay in the sidecar's
//! `tests/it/server_sessions.rs`.

use std::time::Duration;

use crate::harness::*;
use bindery_tests::eventually::{eventually, until, PATIENCE};
use bindery_tests::fixtures::probe_agent;
use bindery_tests::mock_llm::{last_message, tool_results, Gate, MockReply};
use serde_json::{json, Value};

/// An invoices server, its model answering by `script`.
struct Invoices {
    server: Server,
    api: Api,
    _dir: tempfile::TempDir,
}

async fn invoices(script: impl Fn(&Value) -> MockReply + Send + Sync + 'static) -> Invoices {
    let dir = tempfile::tempdir().unwrap();
    let agent = invoices_agent(dir.path());
    let server = Server::start(&[agent], dir.path(), script).await;
    Invoices {
        api: server.api.clone(),
        server,
        _dir: dir,
    }
}

/// A session with the tenant `acme` and the secret `billing_token`.
fn valid_params() -> Value {
    json!({"tenant": "acme", "billing_token": CANARY})
}

fn session_id(r: &Reply) -> String {
    r.json["session_id"]
        .as_str()
        .unwrap_or_else(|| panic!("{}", r.text))
        .to_string()
}

fn tool_output(r: &Reply) -> String {
    last_tool_output(r)
}

/// A fork copies the turns, takes fresh values, inherits no secret, no
/// seal, no token; and `fork` on creation does the same.
#[tokio::test]
async fn a_fork_starts_from_the_history_with_fresh_values() {
    let w = invoices(tool_then_answer).await;
    let api = &w.api;
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
#[tokio::test]
async fn a_message_scope_value_lasts_one_run() {
    let dir = tempfile::tempdir().unwrap();
    let agent = probe_agent(dir.path(), MODEL_URL);
    let script = |req: &Value| match last_message(req)["role"].as_str() {
        Some("tool") => MockReply::text("ok"),
        _ => MockReply::tool_call("bash_probe", json!({})),
    };
    let api = &Server::start(&[agent], dir.path(), script).await.api;
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

    let r = message_waited(api, &id, "again").await;
    assert_eq!(
        tool_output(&r),
        "error: tool unavailable",
        "the next run has no otp"
    );
}

/// Two messages at once: one runs, the other gets 409 and changes nothing
/// (its values are validated, stored and its run reserved atomically).
#[tokio::test]
async fn a_refused_concurrent_message_changes_nothing() {
    let w = invoices(|_| MockReply::text("slow").delayed(Duration::from_millis(500))).await;
    let api = &w.api;
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
#[tokio::test]
async fn a_value_changed_during_a_run_survives_the_runs_writes() {
    let gate = Gate::new();
    let held = gate.clone();
    let w = invoices(move |req| {
        let reply = tool_then_answer(req);
        if tool_results(req).is_empty() {
            reply
        } else {
            reply.held(&held)
        }
    })
    .await;
    let api = &w.api;
    let id = new_session(api, json!({"agent": "invoices", "params": valid_params()})).await;
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
        w.server.mock.request_count() >= 2
    })
    .await;
    move_to_globex(api, &id).await;
    gate.open();
    let done = eventually("the run ends", PATIENCE, || async {
        let r = api
            .call("GET", &format!("/v1/sessions/{id}"), Some(OWNER), None)
            .await;
        (r.json["status"] != "running").then_some(r)
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
#[tokio::test]
async fn a_value_changed_between_runs_reaches_the_next_one() {
    let w = invoices(tool_then_answer).await;
    let api = &w.api;
    let params = json!({"tenant": "acme-corp", "billing_token": CANARY});
    let id = new_session(api, json!({"agent": "invoices", "params": params})).await;
    let first = message_waited(api, &id, "which invoices are overdue?").await;
    assert!(tool_output(&first).contains("INV-1002"), "{}", first.text);
    move_to_globex(api, &id).await;
    let second = message_waited(api, &id, "and now?").await;
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
async fn move_to_globex(api: &Api, id: &str) {
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

/// A resume goes on only from a run stopped short. After a run that
/// answered it is a 409 `nothing_to_resume` that asks the model nothing:
/// a client retrying a resume whose answer it missed gets no second run.
/// After a run that failed it runs once, and its retry is the 409.
#[tokio::test]
async fn a_resume_runs_once_and_only_after_a_run_stopped_short() {
    // The first request fails (the model's 500), every later one answers.
    let failed = std::sync::atomic::AtomicBool::new(false);
    let w = invoices(move |_req: &Value| {
        if !failed.swap(true, std::sync::atomic::Ordering::SeqCst) {
            return MockReply::status(500, "overloaded");
        }
        MockReply::text("the answer")
    })
    .await;
    let api = &w.api;
    let r = api
        .call(
            "POST",
            "/v1/sessions?wait=true",
            Some(OWNER),
            Some(&json!({"agent": "invoices", "prompt": "overdue?", "params": valid_params()})),
        )
        .await;
    assert_eq!(r.status, 201, "{}", r.text);
    assert_eq!(r.json["status"], "failed", "{}", r.text);
    let id = session_id(&r);
    let resume = format!("/v1/sessions/{id}/resume?wait=true");
    let r = api
        .call("POST", &resume, Some(OWNER), Some(&json!({})))
        .await;
    assert_eq!(
        (r.status, r.json["status"].as_str()),
        (200, Some("idle")),
        "{}",
        r.text
    );
    let asked = w.server.mock.request_count();
    for _ in 0..2 {
        let r = api
            .call("POST", &resume, Some(OWNER), Some(&json!({})))
            .await;
        assert_eq!(
            (r.status, r.json["error"].as_str()),
            (409, Some("nothing_to_resume")),
            "{}",
            r.text
        );
    }
    assert_eq!(
        w.server.mock.request_count(),
        asked,
        "the model was asked again"
    );
    // A message goes on as ever.
    let r = api
        .call(
            "POST",
            &format!("/v1/sessions/{id}/messages?wait=true"),
            Some(OWNER),
            Some(&json!({"prompt": "and now?"})),
        )
        .await;
    assert_eq!(r.status, 200, "{}", r.text);
}

/// A cancel keeps the result of a call of the turn that already ended:
/// its side effect happened, and the model is told what it said, not that
/// it was cancelled; the call still running is answered as cancelled.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancel_keeps_the_results_of_the_calls_that_ended() {
    let dir = tempfile::tempdir().unwrap();
    let tools = dir.path().join("tools");
    std::fs::create_dir_all(&tools).unwrap();
    let gate = dir.path().join("gate");
    bindery_tests::fixtures::bash_tool(&tools, "fast", "Done at once.", "echo fast did it\n");
    bindery_tests::fixtures::bash_tool(
        &tools,
        "slow",
        "Waits for its gate.",
        &format!("while [ ! -e {} ]; do sleep 0.05; done\n", gate.display()),
    );
    let agent = dir.path().join("a.yaml");
    std::fs::write(
        &agent,
        format!(
            "apiVersion: bindery.dev/v1alpha1\nkind: Agent\nmetadata: {{name: a}}\nspec:\n  model: {{url: \"{MODEL_URL}\", name: m}}\n  toolboxes:\n    - bash: {{directory: \"{}\"}}\n",
            tools.display()
        ),
    )
    .unwrap();
    let server = Server::start(&[agent], dir.path(), |req: &Value| {
        if tool_results(req).is_empty() {
            MockReply::ToolCalls(vec![
                ("bash_fast".into(), json!({})),
                ("bash_slow".into(), json!({})),
            ])
        } else {
            MockReply::text("done")
        }
    })
    .await;
    let api = &server.api;
    let r = api
        .call(
            "POST",
            "/v1/sessions",
            Some(OWNER),
            Some(&json!({"agent": "a", "prompt": "go"})),
        )
        .await;
    assert_eq!(r.status, 201, "{}", r.text);
    let id = session_id(&r);
    // The fast call has ended (its count is in /metrics) while the slow
    // one waits.
    eventually("the fast call ends", PATIENCE, async || {
        let m = api.call("GET", "/metrics", None, None).await;
        m.text
            .lines()
            .any(|l| l.starts_with("bindery_tool_calls_total{tool=\"bash_fast\",outcome=\"ok\""))
            .then_some(())
    })
    .await;
    let r = api
        .call(
            "POST",
            &format!("/v1/sessions/{id}/cancel"),
            Some(OWNER),
            None,
        )
        .await;
    assert_eq!(r.status, 200, "{}", r.text);
    std::fs::write(&gate, "").unwrap();
    let turns = eventually("the run ends", PATIENCE, async || {
        let r = api
            .call("GET", &format!("/v1/sessions/{id}"), Some(OWNER), None)
            .await;
        (r.json["status"] != "running").then(|| r.json["session"]["turns"].to_string())
    })
    .await;
    assert!(turns.contains("fast did it"), "{turns}");
    assert_eq!(turns.matches("the run was cancelled").count(), 1, "{turns}");
}
