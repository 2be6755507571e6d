//! Runs through the real server over TCP, against the scripted mock LLM.

mod common;

use common::*;
use serde_json::json;

/// The "done": a client creates a session on a server whose tenant
/// is pinned, sends a message, watches events, and the tool is called with
/// the tenant the model never chose.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pinned_tenant_reaches_the_tool_and_never_the_model() {
    let w = World::new(tool_then_answer).await;
    let (sidecar, api) = w.start(&["--pin", "tenant=acme-corp"], &[]);
    let created = api
        .call(
            "POST",
            "/v1/sessions",
            Some(OWNER),
            Some(&json!({"agent": "invoices", "params": {"billing_token": CANARY}})),
        )
        .await;
    assert_eq!(created.status, 201, "{}", created.text);
    let id = created.json["session_id"].as_str().unwrap().to_string();
    assert_eq!(created.json["secret_params"], json!(["billing_token"]));
    assert!(!created.text.contains(CANARY));

    let reply = api
        .call(
            "POST",
            &format!("/v1/sessions/{id}/messages?wait=true"),
            Some(OWNER),
            Some(&json!({"prompt": "which invoices are overdue?"})),
        )
        .await;
    assert_eq!(reply.status, 200, "{}", reply.text);
    assert_eq!(reply.json["status"], "idle");
    let turns = reply.json["session"]["turns"].as_array().unwrap();
    assert_eq!(turns.len(), 4, "{turns:?}");
    // The call as the model made it, and the tool's answer for the pinned tenant.
    assert_eq!(
        turns[1]["tool_calls"][0]["function"]["arguments"],
        json!({"status": "overdue", "tenant_id": "globex"}).to_string()
    );
    assert_eq!(
        turns[2]["content"],
        "2026-10-01\tINV-1002\t850.50 EUR\toverdue\n"
    );
    assert!(turns[3]["content"]
        .as_str()
        .unwrap()
        .starts_with("answer: 2026-10-01\tINV-1002"));

    // What the model was shown: no tenant_id, no token, no canary.
    for req in w.mock.requests() {
        let schema = bindery_tests::mock_llm::tool_schema(&req, "bash_query-invoices").unwrap();
        assert!(schema["properties"].get("tenant_id").is_none(), "{schema}");
        assert!(schema["properties"].get("token").is_none(), "{schema}");
        assert!(!req.to_string().contains(CANARY));
        assert!(!req.to_string().contains("acme-corp"));
    }

    // The events, replayed from the start, end with the run's end.
    let (status, stream) = api
        .events(&format!("/v1/sessions/{id}/events"), Some(OWNER), None)
        .await;
    assert_eq!(status, 200);
    let mut stream = stream.unwrap();
    let events = stream
        .until("run_finished", std::time::Duration::from_secs(30))
        .await;
    let kinds: Vec<&str> = events.iter().map(|e| e.event.as_str()).collect();
    assert_eq!(
        kinds,
        [
            "run_started",
            "tool_call",
            "tool_result",
            "message",
            "run_finished"
        ],
        "{events:?}"
    );
    assert!(events.iter().all(|e| e.id.is_some()));
    assert!(!stream.raw.contains(CANARY));
    // Replay from an id: only what came after it.
    let (_, stream) = api
        .events(&format!("/v1/sessions/{id}/events"), Some(OWNER), Some("3"))
        .await;
    let events = stream
        .unwrap()
        .until("run_finished", std::time::Duration::from_secs(30))
        .await;
    let kinds: Vec<&str> = events.iter().map(|e| e.event.as_str()).collect();
    assert_eq!(kinds, ["message", "run_finished"]);
    assert!(!sidecar.logs().contains(CANARY));
}
