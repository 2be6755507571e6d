//! agents-exe's command line, spoken by `bindery-sidecar`: a tool script
//! written for the agents-exe binary (`exec agents-exe --agent-file
//! child.json "$@"`) works with `bindery-sidecar` in its place, so one
//! agent is a bash tool of another with no Bindery wrapper.

use std::path::Path;
use std::process::Command;

use crate::common::*;
use bindery_tests::mock_llm::{last_message, tool_names, tool_results, MockLlm, MockReply};
use serde_json::{json, Value};

const VAULT: &str = "vault-SEKRIT-77";

/// A child agent (agents-exe JSON) with a process secret read from
/// `CHILD_VAULT` and a session secret a caller may give, and a parent
/// (Bindery YAML) whose one bash tool is the child: the agents-exe tool
/// script with the binary swapped.
fn agents(dir: &Path, model: &str) -> std::path::PathBuf {
    std::fs::write(
        dir.join("child.json"),
        json!({"tag": "OpenAIAgentDescription", "contents": {
            "slug": "child", "modelUrl": model, "modelName": "mock-model",
            "announce": "answers arithmetic questions",
            "systemPrompt": ["You are the child."],
            "parameters": [
                {"name": "vault_key", "secret": true, "scope": "process",
                 "default": {"tag": "EnvVar", "contents": "CHILD_VAULT"}},
                {"name": "user_token", "secret": true, "scope": "session", "required": false}
            ]
        }})
        .to_string(),
    )
    .unwrap();
    executable(
        &dir.join("ask-child"),
        &format!(
            "#!/bin/sh\nexec {} --agent-file {} \"$@\"\n",
            bin(),
            dir.join("child.json").display()
        ),
    );
    let parent = dir.join("parent.yaml");
    std::fs::write(
        &parent,
        format!(
            r#"apiVersion: bindery.dev/v1alpha1
kind: Agent
metadata: {{name: parent}}
spec:
  model: {{url: "{model}", name: mock-model}}
  toolboxes:
    - bash: {{script: "{}"}}
"#,
            dir.join("ask-child").display()
        ),
    )
    .unwrap();
    parent
}

/// The parent calls its tool `bash_child`; the child (a request offering
/// no such tool) answers; the parent relays the tool's result.
fn script(req: &Value) -> MockReply {
    let last = last_message(req);
    if !tool_names(req).contains(&"bash_child".to_string()) {
        return MockReply::text(format!(
            "child says four (asked: {})",
            last["content"].as_str().unwrap_or("")
        ));
    }
    if last["role"] == "tool" {
        return MockReply::text(format!(
            "parent relays: {}",
            last["content"].as_str().unwrap_or("")
        ));
    }
    MockReply::tool_call("bash_child", json!({"prompt": "what is 2+2?"}))
}

fn run(dir: &Path, args: &[&str]) -> (bool, String, String) {
    let out = Command::new(bin())
        .current_dir(dir)
        .env("CHILD_VAULT", VAULT)
        .env_remove("BINDERY_MODEL_URL")
        .args(args)
        .output()
        .unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

// The binary runs blocking on this thread while the mock answers on another.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_child_agent_is_a_bash_tool_of_its_parent_through_agents_exe_invocations() {
    let dir = tempfile::tempdir().unwrap();
    let mock = MockLlm::start(script).await;
    let parent = agents(dir.path(), &mock.url());
    let child = dir.path().join("child.json");
    let child = child.to_str().unwrap();

    // agents-exe's describe, as its tool loader calls it.
    let (ok, out, err) = run(dir.path(), &["--agent-file", child, "describe"]);
    assert!(ok, "{out}{err}");
    let d: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(d["slug"], "child");
    assert_eq!(d["description"], "answers arithmetic questions");
    let args: Vec<(&str, &str)> = d["args"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| (a["name"].as_str().unwrap(), a["mode"].as_str().unwrap()))
        .collect();
    assert_eq!(args, [("prompt", "dashdashspace"), ("user_token", "env")]);
    let (ok, out, _) = run(
        dir.path(),
        &[
            "--agent-file",
            child,
            "describe",
            "--self-describe-slug",
            "kid",
        ],
    );
    assert!(ok && out.contains("\"slug\":\"kid\""), "{out}");

    // Bindery's describe (options after the command): the parent's tools.
    let (ok, out, err) = run(
        dir.path(),
        &["describe", "--agent-file", parent.to_str().unwrap()],
    );
    assert!(ok, "{out}{err}");
    assert!(out.contains("\"bash_child\""), "{out}");
    assert!(!out.contains(VAULT) && !out.contains("vault_key"), "{out}");
    assert!(!err.contains(VAULT), "{err}");

    // One run of the parent: the child runs as its tool, and its answer
    // is the tool's result.
    let (ok, out, err) = run(
        dir.path(),
        &[
            "run",
            "--agent-file",
            parent.to_str().unwrap(),
            "--prompt",
            "ask the child",
        ],
    );
    assert!(ok, "{out}{err}");
    assert!(
        out.contains("parent relays: child says four (asked: what is 2+2?)"),
        "{out}"
    );
    let results: Vec<String> = mock
        .requests()
        .iter()
        .flat_map(|r| {
            tool_results(r)
                .into_iter()
                .map(str::to_string)
                .collect::<Vec<_>>()
        })
        .collect();
    assert!(
        results
            .iter()
            .any(|r| r.trim() == "child says four (asked: what is 2+2?)"),
        "{results:?}"
    );
    let everything = serde_json::to_string(&mock.requests()).unwrap();
    assert!(!everything.contains(VAULT));
    mock.shutdown().await;
}

#[test]
fn describe_tool_checks_a_script_like_agents_exe_and_other_commands_are_named() {
    let dir = tempfile::tempdir().unwrap();
    let tools = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/tools/probe");
    let (ok, out, err) = run(dir.path(), &["describe-tool", tools.to_str().unwrap()]);
    assert!(ok, "{out}{err}");
    let d: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(d["slug"], "probe", "{out}");
    let (ok, out, _) = run(
        dir.path(),
        &["describe-tool", tools.to_str().unwrap(), "--check-only"],
    );
    assert!(ok && out.contains("valid tool `probe`"), "{out}");
    let broken = dir.path().join("broken");
    executable(&broken, "#!/bin/sh\necho not-json\n");
    let (ok, _, err) = run(dir.path(), &["describe-tool", broken.to_str().unwrap()]);
    assert!(
        !ok && err.contains("did not print a valid tool description"),
        "{err}"
    );

    let (ok, _, err) = run(dir.path(), &["--agent-file", "x.json", "tui"]);
    assert!(
        !ok && err.contains("`tui` is an agents-exe command"),
        "{err}"
    );
}

/// agents-exe's flavours on the wire: `MistralV1` asks for automatic,
/// parallel tool calls, `ClaudeV1` for extended thinking, `KimiV1` and
/// `OpenAIv1` for nothing more; a flavour Bindery does not know refuses
/// the file instead of being spoken as another.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_agents_exe_flavour_sends_what_agents_exe_sends() {
    let mock = MockLlm::start(|_| MockReply::text("hello")).await;
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("agent.json");
    let write = |flavor: &str| {
        let doc = json!({"tag": "OpenAIAgentDescription", "contents": {
            "slug": "talker", "apiKeyId": "none", "flavor": flavor,
            "modelUrl": mock.url(), "modelName": "m", "announce": "talks",
            "systemPrompt": ["You talk."]}});
        std::fs::write(&file, doc.to_string()).unwrap();
    };
    let added = |flavor: &str| -> Value {
        write(flavor);
        let before = mock.requests().len();
        let (ok, out, err) = run(
            dir.path(),
            &["run", "--agent-file", "agent.json", "--prompt", "hi"],
        );
        assert!(ok, "{flavor}: {out}{err}");
        let req = mock.requests()[before].clone();
        let mut extra = serde_json::Map::new();
        for k in ["tool_choice", "parallel_tool_calls", "thinking"] {
            if let Some(v) = req.get(k) {
                extra.insert(k.to_string(), v.clone());
            }
        }
        Value::Object(extra)
    };
    assert_eq!(
        added("MistralV1"),
        json!({"tool_choice": "auto", "parallel_tool_calls": true})
    );
    assert_eq!(
        added("ClaudeV1"),
        json!({"thinking": {"type": "enabled", "budget_tokens": 10000}})
    );
    assert_eq!(added("KimiV1"), json!({}));
    assert_eq!(added("OpenAIv1"), json!({}));

    write("Bogus");
    let (ok, out, err) = run(dir.path(), &["check", "--agent-file", "agent.json"]);
    assert!(!ok, "{out}{err}");
    assert!(
        (out.clone() + &err).contains("model flavor `Bogus` is not one Bindery speaks"),
        "{out}{err}"
    );
    mock.shutdown().await;
}

/// agents-exe's habits on the command line: `run -p A -p B` (joined line
/// by line) and `run` with the prompt on stdin; `tool-call NAME` with the
/// arguments' JSON on stdin; `check --tools none`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn agents_exe_command_line_habits() {
    use std::io::Write;
    let mock = MockLlm::start(|req| {
        MockReply::text(format!(
            "heard: {}",
            last_message(req)["content"].as_str().unwrap_or("")
        ))
    })
    .await;
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("agent.json");
    let doc = json!({"tag": "OpenAIAgentDescription", "contents": {
        "slug": "talker", "apiKeyId": "none", "flavor": "OpenAIv1",
        "modelUrl": mock.url(), "modelName": "m", "announce": "talks",
        "systemPrompt": ["You talk."]}});
    std::fs::write(&file, doc.to_string()).unwrap();

    let (ok, out, err) = run(
        dir.path(),
        &[
            "run",
            "--agent-file",
            "agent.json",
            "-p",
            "first line",
            "-p",
            "second line",
        ],
    );
    assert!(ok, "{out}{err}");
    assert!(out.contains("heard: first line\nsecond line"), "{out}");

    let with_stdin = |args: &[&str], stdin: &str| {
        let mut child = Command::new(bin())
            .current_dir(dir.path())
            .env_remove("BINDERY_MODEL_URL")
            .args(args)
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        child
            .stdin
            .take()
            .unwrap()
            .write_all(stdin.as_bytes())
            .unwrap();
        let o = child.wait_with_output().unwrap();
        (
            o.status.success(),
            String::from_utf8_lossy(&o.stdout).to_string() + &String::from_utf8_lossy(&o.stderr),
        )
    };
    let (ok, said) = with_stdin(&["run", "--agent-file", "agent.json"], "from stdin\n");
    assert!(ok, "{said}");
    assert!(said.contains("heard: from stdin"), "{said}");

    // tool-call NAME, the arguments on stdin, as agents-exe's.
    let invoices = repo().join("examples/invoices/agent.yaml");
    let invoices = invoices.to_str().unwrap();
    let (ok, said) = with_stdin(
        &[
            "tool-call",
            "bash_query-invoices",
            "--agent-file",
            invoices,
            "--set",
            "tenant=globex",
        ],
        r#"{"status": "overdue"}"#,
    );
    assert!(ok, "{said}");
    let (ok2, said2) = with_stdin(
        &[
            "tool-call",
            "--tool",
            "bash_query-invoices",
            "--args",
            r#"{"status": "overdue"}"#,
            "--agent-file",
            invoices,
            "--set",
            "tenant=globex",
        ],
        "",
    );
    assert!(ok2, "{said2}");
    // The same answer (stderr holds the log lines, which differ in time).
    assert!(
        said.starts_with("2026-10-20\tINV-2002\t7400.00 EUR\toverdue\n"),
        "{said}"
    );
    assert_eq!(said.lines().next(), said2.lines().next());

    let (ok, out, err) = run(
        dir.path(),
        &["check", "--agent-file", "agent.json", "--tools", "none"],
    );
    assert!(ok, "{out}{err}");
    assert!(!out.contains("**Tools:**"), "{out}");
    mock.shutdown().await;
}
