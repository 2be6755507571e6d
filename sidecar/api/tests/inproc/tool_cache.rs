//! `serve --tool-cache-ttl`, in process: two agents with a tool of the
//! same name do not share cache entries (the key holds the agent and its
//! place in the tree).

use std::path::Path;
use std::time::Duration;

use crate::harness::*;
use bindery_tests::fixtures::bash_tool;
use bindery_tests::mock_llm::{last_message, MockReply};
use serde_json::json;

/// Agent `name` whose bash tool `bash_whoami` prints `name` (and notes
/// each run in `runs`).
fn agent(dir: &Path, runs: &Path, name: &str) -> std::path::PathBuf {
    let tools = dir.join(format!("{name}-tools"));
    std::fs::create_dir_all(&tools).unwrap();
    bash_tool(
        &tools,
        "whoami",
        "Says which agent owns it.",
        &format!(
            "echo {name} >> '{runs}'\necho \"tool of {name}\"\n",
            runs = runs.display()
        ),
    );
    let path = dir.join(format!("{name}.yaml"));
    std::fs::write(
        &path,
        format!(
            r#"apiVersion: bindery.dev/v1alpha1
kind: Agent
metadata:
  name: {name}
spec:
  model: {{url: "{MODEL_URL}", name: mock-model}}
  toolboxes:
    - bash: {{directory: "{tools}", cache: shared}}
"#,
            tools = tools.display()
        ),
    )
    .unwrap();
    path
}

#[tokio::test]
async fn agents_do_not_share_cached_results() {
    let script = |req: &serde_json::Value| {
        let last = last_message(req);
        match last["role"].as_str() {
            Some("tool") => MockReply::text(last["content"].as_str().unwrap_or("").to_string()),
            _ => MockReply::tool_call("bash_whoami", json!({})),
        }
    };
    let dir = tempfile::tempdir().unwrap();
    let runs = dir.path().join("runs");
    let agents: Vec<_> = ["alpha", "beta"]
        .iter()
        .map(|name| agent(dir.path(), &runs, name))
        .collect();
    let server = Server::configured(&agents, dir.path(), script, Default::default(), |c| {
        c.tool_cache_ttl = Some(Duration::from_secs(600));
    })
    .await;
    let api = &server.api;
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
    let ran = std::fs::read_to_string(&runs).unwrap();
    assert_eq!(ran, "alpha\nbeta\n", "each agent's tool ran once");
}
