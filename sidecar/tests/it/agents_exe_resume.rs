//! agents-exe's sessions in `run` and `echo-prompt`, through the binary:
//! the `--session-xs|s|m|l|xl FILE` directives (a past session in the
//! prompt) and `run --session-file FILE` (a run that goes on from the
//! session in FILE and rewrites it, in agents-exe's format, each step).

use std::path::{Path, PathBuf};
use std::process::Command;

use crate::common::*;
use bindery_tests::mock_llm::{MockLlm, MockReply};
use serde_json::{json, Value};

const TENANT: &str = "tenant-SEKRIT-4242";

fn sessions() -> PathBuf {
    repo().join("sidecar/tests/fixtures/agents-exe/sessions")
}

fn fixture(name: &str) -> String {
    sessions().join(name).display().to_string()
}

/// The binary in `dir` with only `PATH`, `HOME` and `env`: (ok, stdout, stderr).
fn sx(dir: &Path, env: &[(&str, &str)], args: &[&str]) -> (bool, String, String) {
    let out = Command::new(bin())
        .current_dir(dir)
        .env_clear()
        .env("PATH", std::env::var("PATH").unwrap_or_default())
        .env("HOME", dir)
        .envs(env.iter().copied())
        .args(args)
        .output()
        .unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// Each `--session-*` renders its file at its verbosity, in command-line
/// order with the other directives (`--session-s` a long option, `-s` the
/// short separator); a file that cannot be read is agents-exe's inline
/// note and a warning; a file-mode alias reads `--session-file`.
#[test]
fn session_directives_render_their_files_in_command_line_order() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let (multi, partial) = (
        fixture("multi.session.json"),
        fixture("partial.session.json"),
    );
    let as_prompt = |size: &str, file: &str| {
        let (ok, out, err) = sx(d, &[], &["session-print", "--as-prompt", size, file]);
        assert!(ok, "{err}");
        assert!(out.starts_with("## "), "{out}");
        out
    };
    let (ok, out, err) = sx(
        d,
        &[],
        &[
            "echo-prompt",
            "--session-m",
            &multi,
            "-s",
            "=",
            "--session-s",
            &partial,
            "-p",
            "middle",
            "--session-xl",
            &multi,
            "--session-xs",
            &multi,
            "--session-l",
            &partial,
        ],
    );
    assert!(ok, "{err}");
    let want = [
        as_prompt("m", &multi),
        "====".to_string(),
        as_prompt("s", &partial),
        "middle".to_string(),
        as_prompt("xl", &multi),
        as_prompt("xs", &multi),
        as_prompt("l", &partial),
    ]
    .map(|p| p + "\n")
    .concat();
    assert_eq!(out, want);
    // Each size its own rendering.
    assert_ne!(as_prompt("xs", &multi), as_prompt("m", &multi));

    let (ok, out, err) = sx(
        d,
        &[],
        &["echo-prompt", "-p", "before", "--session-l", "missing.json"],
    );
    assert!(ok, "{err}");
    assert!(
        out.starts_with("before\n_(Error loading session: cannot read session file missing.json"),
        "{out}"
    );
    assert!(
        err.contains("Warning: could not load session file missing.json"),
        "{err}"
    );

    std::fs::write(d.join("lib.rs"), "fn answer() -> u8 { 42 }\n").unwrap();
    let (ok, out, err) = sx(
        d,
        &[],
        &[
            "echo-prompt",
            "--alias",
            "explain",
            "--session-file",
            "lib.rs",
        ],
    );
    assert!(ok, "{err}");
    assert!(
        out.contains("plain English:\n\n```rust\nfn answer() -> u8 { 42 }\n\n```\n"),
        "{out}"
    );
}

/// An agents-exe agent whose one tool (`leaky`, which prints its argv
/// and its token) has `token` bound to a secret parameter read from
/// `TENANT`.
fn prober(dir: &Path) {
    let probe = dir.join("leaky");
    executable(
        &probe,
        r#"#!/usr/bin/env bash
if [[ "${1:-}" == "describe" ]]; then
  cat <<'JSON'
{"slug": "leaky", "description": "Says its token.", "args": [
  {"name": "token", "description": "a token", "type": "string", "backing_type": "string", "arity": "single", "mode": "env"},
  {"name": "note", "description": "a note", "type": "string", "backing_type": "string", "arity": "single", "mode": "dashdashspace"}]}
JSON
  exit 0
fi
shift
echo "argv: $* token: ${TOKEN:-}"
"#,
    );
    std::fs::write(
        dir.join("prober.json"),
        json!({"tag": "OpenAIAgentDescription", "contents": {
            "slug": "prober", "modelUrl": "http://127.0.0.1:9/v1", "modelName": "m",
            "announce": "probes", "systemPrompt": ["You probe."], "apiKeyId": "k", "flavor": "OpenAIv1",
            "parameters": [{"name": "tenant", "secret": true, "scope": "process",
                            "default": {"tag": "EnvVar", "contents": "TENANT"}}],
            "bashToolboxes": [{"tag": "SingleTool", "contents": {"Path": probe,
                "Bindings": [{"arg": "token", "value": {"tag": "Param", "contents": "tenant"}}]}}]}})
        .to_string(),
    )
    .unwrap();
}

fn tags(doc: &Value) -> Vec<&str> {
    doc["turns"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["tag"].as_str().unwrap())
        .collect()
}

fn roles(req: &Value) -> Vec<&str> {
    req["messages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["role"].as_str().unwrap())
        .collect()
}

/// A run with `--session-file` writes its session as agents-exe does (one
/// line, turns newest first), which Bindery's own session commands read;
/// a second run goes on from it (the model is sent the first run's
/// messages) and adds its turns on top. The bound secret never reaches
/// the file; a file that holds no session is refused, not overwritten.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn run_session_file_writes_agents_exes_session_and_resumes_from_it() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    prober(d);
    let mock = MockLlm::start_sequence(vec![
        MockReply::tool_call("bash_leaky", json!({"note": "n1"})),
        MockReply::text("first answer"),
        MockReply::text("second answer"),
    ])
    .await;
    let url = mock.url();
    let env = [("BINDERY_MODEL_URL", url.as_str()), ("TENANT", TENANT)];
    let run = |prompt: &str| {
        tokio::task::block_in_place(|| {
            sx(
                d,
                &env,
                &[
                    "run",
                    "--agent-file",
                    "prober.json",
                    "--session-file",
                    "s.session.json",
                    "-p",
                    prompt,
                ],
            )
        })
    };
    let (ok, out, err) = run("probe it");
    assert!(ok, "{out}{err}");
    assert_eq!(out, "first answer\n");
    let text = std::fs::read_to_string(d.join("s.session.json")).unwrap();
    assert!(!text.contains(TENANT), "{text}");
    assert_eq!(text.lines().count(), 1, "{text}");
    assert!(text.ends_with("}\n"));
    let doc: Value = serde_json::from_str(&text).unwrap();
    assert_eq!(tags(&doc), ["LlmTurn", "UserTurn", "LlmTurn", "UserTurn"]);
    let session_id = doc["sessionId"].as_str().unwrap().to_string();
    assert!(doc["turnId"].is_string(), "{doc}");
    assert_eq!(doc["forkedFromSessionId"], Value::Null);
    let first = &doc["turns"][3]["contents"];
    assert_eq!(first["userQuery"], "probe it\n");
    assert_eq!(first["userPrompt"], "You probe.");
    let tool = &first["userTools"][0]["contents"];
    assert_eq!(tool["llmName"], "bash_leaky");
    // The bound argument is not offered.
    assert_eq!(tool["properties"][0]["propertyKey"], "note");
    assert_eq!(tool["properties"].as_array().unwrap().len(), 1);
    assert_eq!(tool["raw"]["function"]["name"], "bash_leaky");
    let call = &doc["turns"][2]["contents"]["llmToolCalls"][0];
    assert_eq!(call["function"]["name"], "bash_leaky");
    assert_eq!(
        doc["turns"][2]["contents"]["llmResponse"]["rawResponse"]["choices"][0]["message"]
            ["tool_calls"][0],
        *call
    );
    let answered = &doc["turns"][1]["contents"]["userToolResponses"][0];
    assert_eq!(answered[0], *call);
    let result = answered[1]["content"].as_str().unwrap();
    // The tool printed the secret; its result, scrubbed, does not.
    assert!(result.starts_with("argv: --note n1 token: "), "{result}");
    assert!(result.ends_with("token: <secret:tenant>\n"), "{result}");
    assert_eq!(
        doc["turns"][0]["contents"]["llmResponse"]["responseText"],
        "first answer"
    );

    // Bindery's own commands read it: each call once, in agents-exe's numbering.
    let listed = |d: &Path| {
        let (ok, out, err) = sx(d, &[], &["list-tool-calls", "s.session.json", "-f", "json"]);
        assert!(ok, "{err}");
        let calls: Value = serde_json::from_str(&out).unwrap();
        calls
            .as_array()
            .unwrap()
            .iter()
            .map(|c| {
                (
                    c["turn"].as_u64().unwrap(),
                    c["index"].as_u64().unwrap(),
                    c["name"].as_str().unwrap().to_string(),
                )
            })
            .collect::<Vec<_>>()
    };
    assert_eq!(listed(d), [(3, 0, "bash_leaky".to_string())]);
    let (ok, out, err) = sx(d, &[], &["session-print", "s.session.json"]);
    assert!(ok, "{err}");
    assert!(
        out.contains("probe it") && out.contains("first answer"),
        "{out}"
    );
    let (ok, out, err) = sx(
        d,
        &[("TENANT", TENANT)],
        &[
            "replay-tool-call",
            "--agent-file",
            "prober.json",
            "-s",
            "s.session.json",
            "-i",
            "0",
        ],
    );
    assert!(ok, "{out}{err}");
    assert!(out.contains("argv: --note n1 token: "), "{out}");

    // The second run goes on from the file.
    let (ok, out, err) = run("and now?");
    assert!(ok, "{out}{err}");
    assert_eq!(out, "second answer\n");
    let requests = mock.requests();
    assert_eq!(roles(&requests[0]), ["system", "user"]);
    let resumed = &requests[2];
    assert_eq!(
        roles(resumed),
        ["system", "user", "assistant", "tool", "assistant", "user"]
    );
    let m = &resumed["messages"];
    assert_eq!(m[1]["content"], "probe it\n");
    assert_eq!(m[2]["tool_calls"][0]["id"], call["id"]);
    assert_eq!(m[3]["tool_call_id"], call["id"]);
    assert_eq!(m[3]["content"], result);
    assert_eq!(m[4]["content"], "first answer");
    assert_eq!(m[5]["content"], "and now?\n");

    let text = std::fs::read_to_string(d.join("s.session.json")).unwrap();
    assert!(!text.contains(TENANT), "{text}");
    let doc: Value = serde_json::from_str(&text).unwrap();
    assert_eq!(doc["sessionId"], session_id.as_str());
    assert_eq!(
        tags(&doc),
        ["LlmTurn", "UserTurn", "LlmTurn", "UserTurn", "LlmTurn", "UserTurn"]
    );
    assert_eq!(doc["turns"][1]["contents"]["userQuery"], "and now?\n");
    assert_eq!(listed(d), [(5, 0, "bash_leaky".to_string())]);
    assert_eq!(mock.request_count(), 3);

    // Anything but a session is refused before the model is asked.
    std::fs::write(d.join("notes.txt"), "my notes\n").unwrap();
    let (ok, out, err) = tokio::task::block_in_place(|| {
        sx(
            d,
            &env,
            &[
                "run",
                "--agent-file",
                "prober.json",
                "--session-file",
                "notes.txt",
                "-p",
                "x",
            ],
        )
    });
    assert!(!ok, "{out}");
    assert!(
        err.contains("--session-file notes.txt holds no agents-exe session"),
        "{err}"
    );
    assert_eq!(
        std::fs::read_to_string(d.join("notes.txt")).unwrap(),
        "my notes\n"
    );
    assert_eq!(mock.request_count(), 3);
    mock.shutdown().await;
}

/// A session agents-exe wrote is resumed: the model is sent its
/// conversation (each call answered), and the file keeps its turns as
/// they were stored, the run's on top.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn run_session_file_resumes_a_session_agents_exe_wrote() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    prober(d);
    let original = std::fs::read_to_string(sessions().join("multi.session.json")).unwrap();
    std::fs::write(d.join("multi.json"), &original).unwrap();
    let mock = MockLlm::start_sequence(vec![MockReply::text("resumed")]).await;
    let url = mock.url();
    let (ok, out, err) = tokio::task::block_in_place(|| {
        sx(
            d,
            &[("BINDERY_MODEL_URL", url.as_str()), ("TENANT", TENANT)],
            &[
                "run",
                "--agent-file",
                "prober.json",
                "--session-file",
                "multi.json",
                "-p",
                "anything else?",
            ],
        )
    });
    assert!(ok, "{out}{err}");
    assert_eq!(out, "resumed\n");
    let old: Value = serde_json::from_str(&original).unwrap();
    let old_turns = old["turns"].as_array().unwrap();
    let sent = &mock.requests()[0];
    let roles = roles(sent);
    assert_eq!(roles.first(), Some(&"system"));
    assert_eq!(roles.last(), Some(&"user"));
    // Each LlmTurn an assistant message, each call one result.
    let llm_turns = old_turns.iter().filter(|t| t["tag"] == "LlmTurn").count();
    let calls: usize = old_turns
        .iter()
        .filter_map(|t| t["contents"]["llmToolCalls"].as_array())
        .map(Vec::len)
        .sum();
    assert_eq!(
        roles.iter().filter(|r| **r == "assistant").count(),
        llm_turns
    );
    assert_eq!(roles.iter().filter(|r| **r == "tool").count(), calls);
    let doc: Value =
        serde_json::from_str(&std::fs::read_to_string(d.join("multi.json")).unwrap()).unwrap();
    let turns = doc["turns"].as_array().unwrap();
    assert_eq!(turns.len(), old_turns.len() + 2);
    assert_eq!(&turns[2..], old_turns.as_slice());
    assert_eq!(doc["sessionId"], old["sessionId"]);
    assert_eq!(turns[1]["contents"]["userQuery"], "anything else?\n");
    assert_eq!(
        turns[0]["contents"]["llmResponse"]["responseText"],
        "resumed"
    );
    mock.shutdown().await;
}
