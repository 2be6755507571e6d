//! `serve --tool-cache-ttl`: two agents with a tool of the same name do not
//! share cache entries (the key holds the agent and its place in the tree).

use std::os::unix::fs::PermissionsExt;
use std::path::Path;

use crate::common::*;
use bindery_tests::mock_llm::{last_message, MockLlm, MockReply};
use serde_json::json;

/// Agent `name` whose bash tool `bash_whoami` prints `name`.
fn agent(dir: &Path, model_url: &str, name: &str) {
    let tools = dir.join(format!("{name}-tools"));
    std::fs::create_dir_all(&tools).unwrap();
    let script = tools.join("whoami");
    std::fs::write(
        &script,
        format!(
            r#"#!/usr/bin/env bash
if [[ "${{1:-}}" == "describe" ]]; then
  echo '{{"slug": "whoami", "description": "Says which agent owns it.", "args": []}}'
  exit 0
fi
echo "tool of {name}"
"#
        ),
    )
    .unwrap();
    std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).unwrap();
    std::fs::write(
        dir.join(format!("{name}.yaml")),
        format!(
            r#"apiVersion: bindery.dev/v1alpha1
kind: Agent
metadata:
  name: {name}
spec:
  model: {{url: "{model_url}", name: mock-model}}
  toolboxes:
    - bash: {{directory: "{tools}", cache: shared}}
"#,
            tools = tools.display()
        ),
    )
    .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn agents_do_not_share_cached_results() {
    let mock = MockLlm::start(|req| {
        let last = last_message(req);
        match last["role"].as_str() {
            Some("tool") => MockReply::text(last["content"].as_str().unwrap_or("").to_string()),
            _ => MockReply::tool_call("bash_whoami", json!({})),
        }
    })
    .await;
    let dir = tempfile::tempdir().unwrap();
    let agents = dir.path().join("agents");
    std::fs::create_dir_all(&agents).unwrap();
    std::fs::create_dir_all(dir.path().join("logs")).unwrap();
    for name in ["alpha", "beta"] {
        agent(&agents, &mock.url(), name);
    }
    let mut sidecar = bindery_tests::sidecar::Sidecar::start(bindery_tests::sidecar::Launch {
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
    let api = bindery_tests::sidecar::Api::new(&sidecar.url);
    for _ in 0..2 {
        for name in ["alpha", "beta"] {
            let r = api
                .call(
                    "POST",
                    "/v1/sessions?wait=true",
                    Some(OWNER),
                    Some(&json!({"agent": name, "prompt": "who are you?"})),
                )
                .await;
            assert_eq!(r.status, 201, "{}", r.text);
            let turns = r.json["session"]["turns"].as_array().unwrap();
            assert_eq!(
                turns[2]["content"],
                format!("tool of {name}\n"),
                "{name} got another agent's cached result"
            );
        }
    }
    // The second round was served from the cache.
    let logs = sidecar.logs();
    sidecar.stop();
    assert_eq!(
        logs.matches("bash tool started").count(),
        2,
        "each agent's tool ran once:\n{logs}"
    );
}
