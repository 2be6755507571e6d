//! A second session on the same cached tool: what one session's tool was
//! given must never answer another's call.
//!
//! A bash tool is handed its session's context (`AGENT_SESSION_ID`,
//! `AGENT_SESSION_JSON`, …), so its output may carry the conversation. The
//! cache key covers that context; a toolbox declared `cache: shared` is run
//! without it, and only then does one result serve every session.

use std::os::unix::fs::PermissionsExt;
use std::path::Path;

use crate::common::*;
use bindery_tests::mock_llm::{last_message, MockLlm, MockReply};
use bindery_tests::sidecar::{Api, Launch, Sidecar};
use serde_json::json;

/// An agent whose tool `bash_echo-session` prints the session id and the
/// first user message it was given; its toolbox carries `toolbox_extra`.
fn agent(dir: &Path, model_url: &str, toolbox_extra: &str) {
    let tools = dir.join("tools");
    std::fs::create_dir_all(&tools).unwrap();
    let script = tools.join("echo-session");
    std::fs::write(
        &script,
        r#"#!/usr/bin/env bash
if [[ "${1:-}" == "describe" ]]; then
  echo '{"slug": "echo-session", "description": "Says what it was told of the session.", "args": []}'
  exit 0
fi
first=$(printf '%s' "${AGENT_SESSION_JSON:-}" | python3 -c 'import json,sys
t=sys.stdin.read()
print(next((m["content"] for m in json.loads(t)["turns"] if m.get("role")=="user"), "none") if t else "none")')
echo "session=${AGENT_SESSION_ID:-unknown} first=${first}"
"#,
    )
    .unwrap();
    std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).unwrap();
    std::fs::write(
        dir.join("echo.yaml"),
        format!(
            r#"apiVersion: bindery.dev/v1alpha1
kind: Agent
metadata:
  name: echo
spec:
  model: {{url: "{model_url}", name: mock-model}}
  toolboxes:
    - bash: {{directory: "{tools}"{toolbox_extra}}}
"#,
            tools = tools.display()
        ),
    )
    .unwrap();
}

async fn start(toolbox_extra: &str) -> (MockLlm, tempfile::TempDir, Sidecar) {
    let mock = MockLlm::start(|req| {
        let last = last_message(req);
        match last["role"].as_str() {
            Some("tool") => MockReply::text(last["content"].as_str().unwrap_or("").to_string()),
            _ => MockReply::tool_call("bash_echo-session", json!({})),
        }
    })
    .await;
    let dir = tempfile::tempdir().unwrap();
    let agents = dir.path().join("agents");
    std::fs::create_dir_all(&agents).unwrap();
    std::fs::create_dir_all(dir.path().join("logs")).unwrap();
    agent(&agents, &mock.url(), toolbox_extra);
    let sidecar = Sidecar::start(Launch {
        bin: bin(),
        args: vec![
            "--agents-dir".into(),
            agents.display().to_string(),
            "--store".into(),
            sqlite_in(dir.path()),
            "--tool-cache-ttl".into(),
            "600".into(),
        ],
        env: Vec::new(),
        log_dir: &dir.path().join("logs"),
        owner_token: OWNER,
    });
    (mock, dir, sidecar)
}

/// The tool's result in a new session that starts with `prompt`.
async fn tool_result(api: &Api, prompt: &str) -> (String, String) {
    let r = api
        .call(
            "POST",
            "/v1/sessions?wait=true",
            Some(OWNER),
            Some(&json!({"agent": "echo", "prompt": prompt})),
        )
        .await;
    assert_eq!(r.status, 201, "{}", r.text);
    let id = r.json["session_id"].as_str().unwrap().to_string();
    let turns = r.json["session"]["turns"].as_array().unwrap();
    let result = turns
        .iter()
        .find(|t| t["role"] == "tool")
        .and_then(|t| t["content"].as_str())
        .unwrap_or_default()
        .to_string();
    (id, result)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cached_result_never_carries_another_sessions_conversation() {
    let (_mock, _dir, mut sidecar) = start("").await;
    let api = Api::new(&sidecar.url);
    let (a, of_a) = tool_result(&api, "alpha's private plan").await;
    assert_eq!(of_a, format!("session={a} first=alpha's private plan\n"));
    // Same agent, tool and (empty) arguments, same non-secret values: only
    // the session differs.
    let (b, of_b) = tool_result(&api, "beta asks").await;
    assert!(
        !of_b.contains("alpha") && !of_b.contains(&a),
        "session {b} got session {a}'s cached result: {of_b}"
    );
    assert_eq!(of_b, format!("session={b} first=beta asks\n"));
    sidecar.stop();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shared_toolbox_gets_no_session_context_and_serves_every_session() {
    let (_mock, _dir, mut sidecar) = start(", cache: shared").await;
    let api = Api::new(&sidecar.url);
    let (_, of_a) = tool_result(&api, "alpha's private plan").await;
    assert_eq!(of_a, "session=unknown first=none\n");
    let (_, of_b) = tool_result(&api, "beta asks").await;
    assert_eq!(of_b, of_a);
    let logs = sidecar.logs();
    sidecar.stop();
    assert_eq!(
        logs.matches("bash tool started").count(),
        1,
        "the second session was served from the cache:\n{logs}"
    );
}
