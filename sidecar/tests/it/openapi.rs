//! An OpenAPI toolbox through the real server: a small HTTP API on
//! 127.0.0.1 serves its own OpenAPI document; the agent binds the
//! `project_id` path parameter to a session parameter and sends a
//! session-scope secret as `Authorization: Bearer …`.

use crate::common::callbacks::{agent_file, digest, start_api};
use crate::common::*;
use bindery_tests::mock_llm::{tool_results, tool_schema, MockLlm, MockReply};
use serde_json::{json, Value};

const TOKEN_A: &str = "cb-token-alpha-5d1e";
const TOKEN_B: &str = "cb-token-beta-93c0";

/// First `list_tasks`, then `get_missing`, then an answer quoting both results.
fn script(req: &Value) -> MockReply {
    let results = tool_results(req);
    match results.len() {
        0 => MockReply::tool_call("list_tasks", json!({"status": "open"})),
        1 => MockReply::tool_call("get_missing", json!({})),
        _ => MockReply::text(format!("done: {}", results.join(" | "))),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bound_path_parameter_and_session_secret_reach_the_api_per_session() {
    let (addr, seen) = start_api().await;
    let mock = MockLlm::start(script).await;
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(dir.path().join("logs")).unwrap();
    let agent = agent_file(dir.path(), &mock.url(), addr);
    let (sidecar, api) = serve(
        &agent,
        &sqlite_in(dir.path()),
        &[],
        &[("BINDERY_LOG", "debug")],
        dir.path(),
    );

    let mut replies = Vec::new();
    let mut turns_of = Vec::new();
    for (project, token) in [("alpha-1", TOKEN_A), ("beta 2", TOKEN_B)] {
        let created = create(
            &api,
            json!({"agent": "callbacks", "params": {"project_id": project, "callback_token": token}}),
        )
        .await;
        assert_eq!(created.status, 201, "{}", created.text);
        let id = created.json["session_id"].as_str().unwrap().to_string();
        let reply = message_waited(&api, &id, "what is open?").await;
        assert_eq!(reply.json["status"], "idle", "{}", reply.text);
        turns_of.push((project, token, reply.json["session"]["turns"].clone()));
        let view = api
            .call("GET", &format!("/v1/sessions/{id}"), Some(OWNER), None)
            .await;
        replies.extend([created.text, reply.text, view.text]);
    }

    // Each session's call reached the API with its own project and token.
    let seen = seen.lock().unwrap().clone();
    assert_eq!(
        seen,
        [
            ("alpha-1".to_string(), digest(&format!("Bearer {TOKEN_A}"))),
            ("beta 2".to_string(), digest(&format!("Bearer {TOKEN_B}"))),
        ]
    );

    for (project, token, turns) in &turns_of {
        let turns = turns.as_array().unwrap();
        let tool_results: Vec<&str> = turns
            .iter()
            .filter(|t| t["role"] == "tool")
            .filter_map(|t| t["content"].as_str())
            .collect();
        assert_eq!(tool_results.len(), 2, "{turns:?}");
        let listed: Value = serde_json::from_str(tool_results[0]).unwrap();
        assert_eq!(listed["project"], *project);
        assert_eq!(listed["status"], "open");
        assert_eq!(listed["auth_sha256"], digest(&format!("Bearer {token}")));
        // The 404 reaches the model as a tool error with the status.
        assert!(
            tool_results[1].contains("HTTP 404 Not Found: no such thing here"),
            "{}",
            tool_results[1]
        );
    }

    // The model never sees project_id, nor the hidden credential argument.
    let requests = mock.requests();
    assert!(!requests.is_empty());
    for req in &requests {
        let schema = tool_schema(req, "list_tasks").expect("list_tasks is offered");
        let props = schema["properties"].as_object().unwrap();
        assert_eq!(props.keys().collect::<Vec<_>>(), ["status"], "{schema}");
        assert_eq!(schema["required"], json!([]));
        let missing = tool_schema(req, "get_missing").unwrap();
        assert_eq!(missing["properties"], json!({}), "{missing}");
    }

    // No token anywhere: model requests, API responses, server logs.
    let logs = sidecar.logs();
    assert!(
        logs.contains("HTTP request"),
        "requests are logged:\n{logs}"
    );
    for token in [TOKEN_A, TOKEN_B] {
        for (headers, body) in mock.raw_requests() {
            assert!(!body.contains(token));
            assert!(headers.iter().all(|(_, v)| !v.contains(token)));
        }
        for text in &replies {
            assert!(!text.contains(token), "{text}");
        }
        assert!(!logs.contains(token), "the token is in the log:\n{logs}");
        assert!(!contains(
            &raw_files(&dir.path().join("logs"), "sidecar"),
            token
        ));
    }
}
