//! Scenario S2 end to end: a backend mints a credential and leads a chat.
//!
//! The backend (owner token) opens a sealed session on project 42 with a
//! minted `callback_token` and hands the browser a session token. The
//! browser chats; the agent's OpenAPI tool calls back into the backend
//! with project 42 and the minted token, whatever the model sends. The
//! browser can change nothing: not the parameters, not by forking, not
//! over `/mcp`. The backend rotates the token, then forks with a fresh
//! one (spec §5.1, §5.2), and each callback carries the current token.

use crate::common::callbacks::{agent_file, digest, start_api};
use crate::common::*;
use bindery_tests::mock_llm::{last_message, tool_schema, MockLlm, MockReply};
use bindery_tests::sidecar::Reply;
use serde_json::{json, Value};

const MINTED: &str = "minted-for-42-c0ffee";
const ROTATED: &str = "rotated-for-42-beef01";
const RENEWED: &str = "renewed-for-42-d00d02";

/// Each user message: `list_tasks` once, with a project id the model made
/// up (a prompt injection would do the same), then an answer quoting the
/// result.
fn model(req: &Value) -> MockReply {
    let last = last_message(req);
    if last["role"] == "tool" {
        return MockReply::text(format!("tasks: {}", last["content"].as_str().unwrap_or("")));
    }
    MockReply::tool_call("list_tasks", json!({"status": "open", "project_id": "43"}))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backend_mints_a_credential_and_leads_a_chat() {
    let (backend_addr, seen) = start_api().await;
    let mock = MockLlm::start(model).await;
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(dir.path().join("logs")).unwrap();
    let agent = agent_file(dir.path(), &mock.url(), backend_addr);
    let (sidecar, api) = serve(
        &agent,
        &sqlite_in(dir.path()),
        &[],
        &[("BINDERY_LOG", "debug")],
        dir.path(),
    );
    let mut responses = String::new();
    let mut keep = |r: Reply| {
        responses.push_str(&r.text);
        r
    };

    // The backend opens the session on project 42 and takes a session token.
    let r = keep(
        create(
            &api,
            json!({"agent": "callbacks", "seal": true, "session_token": true,
                   "params": {"project_id": "42", "callback_token": MINTED}}),
        )
        .await,
    );
    assert_eq!(r.status, 201, "{}", r.text);
    assert_eq!(r.json["sealed"], true);
    let id = r.json["session_id"].as_str().unwrap().to_string();
    let browser = r.json["session_token"].as_str().unwrap().to_string();
    let session = format!("/v1/sessions/{id}");

    // The browser chats with the session token only.
    let r = keep(
        api.call(
            "POST",
            &format!("{session}/messages?wait=true"),
            Some(&browser),
            Some(&json!({"prompt": "what is open?"})),
        )
        .await,
    );
    assert_eq!(r.status, 200, "{}", r.text);
    assert!(
        r.json["params"].as_object().unwrap().is_empty(),
        "{}",
        r.text
    );
    let answer = r.json["session"]["turns"]
        .as_array()
        .unwrap()
        .last()
        .unwrap()["content"]
        .as_str()
        .unwrap()
        .to_string();
    assert!(answer.contains("\"project\":\"42\""), "{answer}");

    // The callback reached the backend for project 42 (not the model's 43)
    // with the minted credential.
    assert_eq!(
        seen.lock().unwrap().clone(),
        [("42".to_string(), digest(&format!("Bearer {MINTED}")))]
    );

    // The browser can change nothing.
    let r = keep(
        api.call(
            "POST",
            &format!("{session}/messages"),
            Some(&browser),
            Some(&json!({"prompt": "switch", "params": {"project_id": "43"}})),
        )
        .await,
    );
    assert_eq!(
        error_of(&r),
        refusal(403, "forbidden_params", &["project_id"])
    );
    let r = keep(
        api.call(
            "PUT",
            &format!("{session}/params"),
            Some(&browser),
            Some(&json!({"params": {"callback_token": "stolen"}})),
        )
        .await,
    );
    assert_eq!(
        error_of(&r),
        refusal(403, "forbidden_params", &["callback_token"])
    );
    let r = keep(
        api.call(
            "POST",
            &format!("{session}/fork"),
            Some(&browser),
            Some(&json!({"params": {"project_id": "43"}})),
        )
        .await,
    );
    assert_eq!(
        (r.status, r.json["error"].clone()),
        (403, json!("forbidden")),
        "{}",
        r.text
    );
    for (method, path, body) in [
        (
            "POST",
            "/v1/sessions".to_string(),
            json!({"fork": id, "params": {"project_id": "43"}}),
        ),
        (
            "POST",
            "/v1/sessions".to_string(),
            json!({"agent": "callbacks", "params": {"project_id": "43"}}),
        ),
        ("GET", "/v1/sessions".to_string(), json!({})),
        ("GET", "/v1/agents".to_string(), json!({})),
        (
            "POST",
            "/mcp".to_string(),
            json!({"jsonrpc": "2.0", "id": 1, "method": "tools/call",
                   "params": {"name": "ask_callbacks", "arguments": {"prompt": "x"},
                              "_meta": {"agents-exe/params": {"project_id": "43"}}}}),
        ),
    ] {
        let r = keep(api.call(method, &path, Some(&browser), Some(&body)).await);
        assert_eq!(r.status, 401, "{method} {path}: {}", r.text);
    }
    let r = keep(
        api.call("DELETE", &format!("{session}/token"), Some(&browser), None)
            .await,
    );
    assert_eq!(r.status, 403, "{}", r.text);
    // Nor read the parameters.
    let r = keep(api.call("GET", &session, Some(&browser), None).await);
    assert_eq!(r.status, 200);
    assert_eq!(
        (r.json["params"].clone(), r.json["secret_params"].clone()),
        (json!({}), json!([]))
    );
    assert_eq!(
        seen.lock().unwrap().len(),
        1,
        "no refused request reached the backend"
    );

    // The backend rotates the credential; the browser's next message uses it.
    let r = keep(
        api.call(
            "PUT",
            &format!("{session}/params"),
            Some(OWNER),
            Some(&json!({"params": {"callback_token": ROTATED}})),
        )
        .await,
    );
    assert_eq!(r.status, 200, "{}", r.text);
    assert_eq!(r.json["params"], json!({"project_id": "42"}));
    assert_eq!(r.json["secret_params"], json!(["callback_token"]));
    let r = keep(
        api.call(
            "POST",
            &format!("{session}/messages?wait=true"),
            Some(&browser),
            Some(&json!({"prompt": "and now?"})),
        )
        .await,
    );
    assert_eq!(r.status, 200, "{}", r.text);

    // A fork with a renewed credential (§5.2): the history and project 42
    // carry over, the secret does not; a fresh session token for the browser.
    let r = keep(
        create(
            &api,
            json!({"fork": id, "seal": true, "session_token": true}),
        )
        .await,
    );
    assert_eq!(
        error_of(&r),
        refusal(422, "params_required", &["callback_token"])
    );
    let r = keep(
        api.call(
            "POST",
            "/v1/sessions?wait=true",
            Some(OWNER),
            Some(&json!({"fork": id, "seal": true, "session_token": true,
                         "params": {"callback_token": RENEWED},
                         "prompt": "The credential was renewed, please carry on."})),
        )
        .await,
    );
    assert_eq!(r.status, 201, "{}", r.text);
    assert_eq!(r.json["forked_from"], json!(id));
    assert_eq!(r.json["params"], json!({"project_id": "42"}));
    assert_eq!(r.json["sealed"], true);
    let fork = format!("/v1/sessions/{}", r.json["session_id"].as_str().unwrap());
    let fork_browser = r.json["session_token"].as_str().unwrap().to_string();
    assert_ne!(fork_browser, browser);
    let r = keep(api.call("GET", &fork, Some(&browser), None).await);
    assert_eq!(
        r.status, 401,
        "the old session token does not open the fork"
    );
    let r = keep(
        api.call(
            "POST",
            &format!("{fork}/messages?wait=true"),
            Some(&fork_browser),
            Some(&json!({"prompt": "anything else?"})),
        )
        .await,
    );
    assert_eq!(r.status, 200, "{}", r.text);

    let bearer = |t: &str| digest(&format!("Bearer {t}"));
    assert_eq!(
        seen.lock().unwrap().clone(),
        [
            ("42".to_string(), bearer(MINTED)),
            ("42".to_string(), bearer(ROTATED)),
            ("42".to_string(), bearer(RENEWED)),
            ("42".to_string(), bearer(RENEWED)),
        ]
    );

    // The model never saw a project id argument nor any credential; no
    // response, log line or byte of the store holds a credential.
    let requests = mock.requests();
    assert_eq!(requests.len(), 8, "four runs of two model turns");
    for req in &requests {
        let schema = tool_schema(req, "list_tasks").expect("list_tasks is offered");
        assert!(schema["properties"].get("project_id").is_none(), "{schema}");
    }
    let logs = sidecar.logs();
    let store = raw_files(dir.path(), "store.sqlite");
    for token in [MINTED, ROTATED, RENEWED] {
        for (headers, body) in mock.raw_requests() {
            assert!(!body.contains(token), "the model saw {token}");
            assert!(headers.iter().all(|(_, v)| !v.contains(token)));
        }
        assert!(!responses.contains(token), "a response holds {token}");
        assert!(!logs.contains(token), "the log holds {token}");
        assert!(!contains(&store, token), "the store holds {token}");
    }
}
