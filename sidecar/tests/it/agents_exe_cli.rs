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
        // The child's prompt ends with a line break, as agents-exe's
        // directives each do.
        return MockReply::text(format!(
            "child says four (asked: {})",
            last["content"].as_str().unwrap_or("").trim_end()
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
/// parallel tool calls, `KimiV1` and `OpenAIv1` for nothing more (`ClaudeV1`
/// is Anthropic's own API: `providers::claude_v1_…`); a flavour Bindery
/// does not know refuses the file instead of being spoken as another.
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
    // agents-exe's result: one JSON line, the output in resultData.
    let line: Value = serde_json::from_str(said.lines().next().unwrap()).unwrap();
    assert_eq!(line["resultData"]["type"], "blob", "{line}");
    assert!(line["resultDuration"].as_f64().is_some(), "{line}");
    assert!(
        line["resultTraceId"].as_str().unwrap().ends_with(" UTC"),
        "{line}"
    );
    let said = line["resultData"]["data"].as_str().unwrap().to_string();
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
    // No such tool: agents-exe's answer says so (exit 0); the agent's tool
    // names go to stderr.
    let (ok, said) = with_stdin(
        &[
            "tool-call",
            "bash_nope",
            "--agent-file",
            invoices,
            "--set",
            "tenant=globex",
        ],
        "{}",
    );
    assert!(ok, "{said}");
    let line: Value = serde_json::from_str(said.lines().next().unwrap()).unwrap();
    assert_eq!(
        line["resultData"],
        json!({"error": "PortalToolNotFound \"bash_nope\"", "toolName": "bash_nope"})
    );
    assert!(said.contains("bash_query-invoices"), "{said}");

    let (ok, out, err) = run(
        dir.path(),
        &["check", "--agent-file", "agent.json", "--tools", "none"],
    );
    assert!(ok, "{out}{err}");
    assert!(!out.contains("**Tools:**"), "{out}");
    mock.shutdown().await;
}

/// The binary in `dir` with `stdin` fed: success, exit code, stdout, stderr.
fn run_fed(dir: &Path, args: &[&str], stdin: &str) -> (Option<i32>, String, String) {
    use std::io::Write;
    let mut child = Command::new(bin())
        .current_dir(dir)
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
        o.status.code(),
        String::from_utf8_lossy(&o.stdout).into_owned(),
        String::from_utf8_lossy(&o.stderr).into_owned(),
    )
}

fn prompt_fixtures() -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/agents-exe/prompt-script")
}

/// An agents-exe agent file in `dir` whose model is `model`.
fn talker(dir: &Path, slug: &str, announce: &str, model: &str) -> std::path::PathBuf {
    let file = dir.join(format!("{slug}.json"));
    let doc = json!({"tag": "OpenAIAgentDescription", "contents": {
        "slug": slug, "apiKeyId": "none", "flavor": "OpenAIv1",
        "modelUrl": model, "modelName": "m", "announce": announce,
        "systemPrompt": ["You talk."]}});
    std::fs::write(&file, doc.to_string()).unwrap();
    file
}

/// agents-exe's prompt directives: `-p`, `-f`, `--shell`, `-s`, `-S` in
/// command-line order across flags, each ending a line; `--alias` first
/// wherever it is written (built-in, or the working directory's
/// agents-exe.cfg.json `promptAliases`, whose content is stdin);
/// `echo-prompt` prints what `run` sends, and agents-exe's own
/// invocations (`--agent-file F run|echo-prompt …`) do the same.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prompt_directives_compose_in_command_line_order() {
    let mock = MockLlm::start(|req| {
        MockReply::text(format!(
            "heard: {}",
            last_message(req)["content"].as_str().unwrap_or("")
        ))
    })
    .await;
    let tmp = tempfile::tempdir().unwrap();
    let agent = talker(tmp.path(), "talker", "talks", &mock.url());
    let agent = agent.to_str().unwrap();
    let here = prompt_fixtures();
    let directives = [
        "-S",
        "=",
        "-f",
        "notes.txt",
        "--prompt",
        "What ships?",
        "--alias",
        "shout",
        "--shell",
        "printf 'from the shell'",
        "-s",
        "-",
    ];
    let expected = format!(
        "Repeat this, louder: quiet words\n{}\nMeeting notes: ship on Friday.\n\nWhat ships?\nfrom the shell\n----\n",
        "=".repeat(40)
    );
    let (code, out, err) = run_fed(
        &here,
        &[&["echo-prompt"][..], &directives[..]].concat(),
        "quiet words",
    );
    assert_eq!(code, Some(0), "{err}");
    assert_eq!(out, expected);
    // agents-exe's way, the agent options first: the same prompt.
    let (code, out, err) = run_fed(
        &here,
        &[&["--agent-file", agent, "echo-prompt"][..], &directives[..]].concat(),
        "quiet words",
    );
    assert_eq!((code, out.as_str()), (Some(0), expected.as_str()), "{err}");

    // `run` sends exactly that, both ways.
    for args in [
        [&["run", "--agent-file", agent][..], &directives[..]].concat(),
        [&["--agent-file", agent, "run"][..], &directives[..]].concat(),
    ] {
        let before = mock.requests().len();
        let (code, out, err) = run_fed(&here, &args, "quiet words");
        assert_eq!(code, Some(0), "{args:?}: {out}{err}");
        assert!(out.starts_with("heard: Repeat this, louder"), "{out}");
        let sent = &mock.requests()[before];
        assert_eq!(last_message(sent)["content"], expected.as_str(), "{args:?}");
    }

    // The configuration's alias wins over agents-exe's of the same name;
    // elsewhere the built-in one holds.
    let (_, out, _) = run_fed(&here, &["echo-prompt", "--alias", "summarize"], "a b c");
    assert_eq!(out, "One line, please:\na b c\n");
    let (_, out, _) = run_fed(
        tmp.path(),
        &["echo-prompt", "--alias", "summarize"],
        "a b c",
    );
    assert_eq!(
        out,
        "Please provide a concise summary of the following:\n\na b c\n"
    );
    // What goes in is not expanded again.
    let (_, out, _) = run_fed(
        tmp.path(),
        &["echo-prompt", "--alias", "summarize"],
        "keep {{content}} {{filename}} {{language}}",
    );
    assert_eq!(
        out,
        "Please provide a concise summary of the following:\n\nkeep {{content}} {{filename}} {{language}}\n"
    );
    // No directive: stdin as it is.
    let (_, out, _) = run_fed(tmp.path(), &["echo-prompt"], "as typed");
    assert_eq!(out, "as typed");

    // What cannot be composed is an error naming it.
    for (args, code, says) in [
        (
            vec!["echo-prompt", "-p", "a", "--shell", "echo partial; exit 3"],
            1,
            "--shell `echo partial; exit 3` failed",
        ),
        (
            vec!["echo-prompt", "-f", "missing.txt"],
            1,
            "--file missing.txt",
        ),
        (
            vec!["echo-prompt", "--alias", "poem"],
            1,
            "unknown alias 'poem'",
        ),
        // One alias per prompt (a usage error, as clap reports them).
        (
            vec!["echo-prompt", "--alias", "shout", "--alias", "poem"],
            2,
            "--alias",
        ),
        (
            vec!["run", "--agent-file", agent, "--shell", "false"],
            1,
            "--shell `false` failed",
        ),
    ] {
        let (got, out, err) = run_fed(&here, &args, "");
        assert_eq!(got, Some(code), "{args:?}: {out}{err}");
        assert!(err.contains(says), "{args:?}: {err}");
        assert!(out.is_empty(), "{args:?}: {out}");
    }
    let (_, _, err) = run_fed(&here, &["echo-prompt", "--alias", "poem"], "");
    assert!(
        err.contains("  - shout: Say it louder") && err.contains("  - translate: "),
        "{err}"
    );
    mock.shutdown().await;
}

/// agents-exe's `check-tool-call -t PATH`: a payload on stdin against the
/// script's describe; ✓ and exit 0, or each problem numbered and exit 1.
#[test]
fn check_tool_call_validates_a_payload_against_a_script() {
    let dir = tempfile::tempdir().unwrap();
    let probe = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/tools/probe");
    let probe = probe.to_str().unwrap();
    let (code, out, err) = run_fed(
        dir.path(),
        &["check-tool-call", "-t", probe],
        r#"{"repo": "bindery", "repo-token": "t", "level": 3}"#,
    );
    assert_eq!(code, Some(0), "{err}");
    assert_eq!(out, "✓ Tool call payload is valid\n");

    let (code, out, _) = run_fed(
        dir.path(),
        &[
            "--agent-file",
            "unused.json",
            "check-tool-call",
            "--tool",
            probe,
        ],
        r#"{"repo-token": "t", "colour": "red", "branch": "main"}"#,
    );
    assert_eq!(code, Some(1));
    assert_eq!(
        out,
        format!(
            "Tool call validation failed for '{probe} (probe)' with 3 errors:\n\n\
             1. branch: Unknown property (not in schema)\n\
             2. colour: Unknown property (not in schema)\n\
             3. repo: Required property missing\n\n\
             Please correct these issues and try again.\n\n"
        )
    );
    let (code, out, _) = run_fed(dir.path(), &["check-tool-call", "-t", probe], "[1, 2]");
    assert_eq!(code, Some(1));
    assert!(out.contains("1. Tool input must be a JSON object"), "{out}");

    let (code, out, err) = run_fed(dir.path(), &["check-tool-call", "-t", probe], "{\"repo\":");
    assert_eq!(code, Some(1));
    assert!(
        out.is_empty() && err.contains("Error: Invalid JSON input from stdin"),
        "{err}"
    );
    let broken = dir.path().join("broken");
    executable(&broken, "#!/bin/sh\necho not-json\n");
    let (code, _, err) = run_fed(
        dir.path(),
        &["check-tool-call", "-t", broken.to_str().unwrap()],
        "{}",
    );
    assert_eq!(code, Some(1));
    assert!(err.contains("Failed to load tool:"), "{err}");
}

/// `bindery-sidecar mcp-server`, agents-exe's MCP server on stdio: JSON
/// lines in and out, each agent file the tool `ask_<slug>_NNN`, a call
/// one run of that agent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mcp_server_serves_each_agent_file_as_an_ask_tool_on_stdio() {
    let mock = MockLlm::start(|req| {
        MockReply::text(format!(
            "heard: {}",
            last_message(req)["content"].as_str().unwrap_or("")
        ))
    })
    .await;
    let tmp = tempfile::tempdir().unwrap();
    let first = talker(tmp.path(), "talker", "talks back", &mock.url());
    let second = talker(tmp.path(), "echoer", "echoes", &mock.url());
    let mut server = StdioServer::start(
        tmp.path(),
        &[
            "--agent-file",
            first.to_str().unwrap(),
            "--agent-file",
            second.to_str().unwrap(),
            "mcp-server",
        ],
    );
    server.send(
        r#"{"jsonrpc":"2.0","id":0,"method":"initialize","params":{"protocolVersion":"2024-11-05","capabilities":{},"clientInfo":{"name":"test","version":"1"}}}"#,
    );
    let init = server.next();
    assert_eq!(init["id"], 0);
    assert_eq!(init["result"]["protocolVersion"], "2024-11-05");
    assert!(
        init["result"]["capabilities"]["tools"].is_object(),
        "{init}"
    );
    server.send(r#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#);
    server.send(r#"{"jsonrpc":"2.0","id":1,"method":"tools/list"}"#);
    let listed = server.next();
    let tools: Vec<(String, String)> = listed["result"]["tools"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| {
            (
                t["name"].as_str().unwrap().to_string(),
                t["description"].as_str().unwrap().to_string(),
            )
        })
        .collect();
    assert_eq!(
        tools,
        [
            ("ask_talker_000".to_string(), "talks back".to_string()),
            ("ask_echoer_001".to_string(), "echoes".to_string())
        ]
    );
    server.send(
        r#"{"jsonrpc":"2.0","id":"call-1","method":"tools/call","params":{"name":"ask_echoer_001","arguments":{"prompt":"is anyone there?"}}}"#,
    );
    let called = server.next();
    assert_eq!(called["id"], "call-1");
    assert_eq!(called["result"]["isError"], false, "{called}");
    assert_eq!(
        called["result"]["content"][0]["text"],
        "heard: is anyone there?"
    );
    // The run was the echoer's: its system prompt and model.
    let sent = mock.requests().last().cloned().unwrap();
    assert_eq!(sent["messages"][1]["content"], "is anyone there?");

    server.send(r#"{"jsonrpc":"2.0","id":2,"method":"ping"}"#);
    assert_eq!(
        server.next(),
        json!({"jsonrpc": "2.0", "id": 2, "result": {}})
    );
    server.send(r#"{"jsonrpc":"2.0","id":3,"method":"resources/list"}"#);
    assert_eq!(server.next()["error"]["code"], -32601);
    server.send(
        r#"{"jsonrpc":"2.0","id":4,"method":"tools/call","params":{"name":"ask_nobody_009","arguments":{"prompt":"x"}}}"#,
    );
    assert_eq!(server.next()["error"]["code"], -32602);
    server.send("{\"jsonrpc\": \"2.0\", \"id\": 5, \"meth");
    let garbage = server.next();
    assert_eq!(
        (garbage["error"]["code"].clone(), garbage["id"].clone()),
        (json!(-32700), Value::Null)
    );
    server.send(r#"[{"jsonrpc":"2.0","id":6,"method":"ping"}]"#);
    assert_eq!(
        server.next()["error"]["code"],
        -32600,
        "no batches in 2024-11-05"
    );
    // Still serving after all that.
    server.send(r#"{"jsonrpc":"2.0","id":7,"method":"ping"}"#);
    assert_eq!(server.next()["id"], 7);

    // stdin closed: the server ends, having written nothing but JSON.
    let err = server.finish();
    assert!(err.contains("MCP server on stdio"), "{err}");
    mock.shutdown().await;
}

/// Runs go side by side with the rest: a `ping` and a quick call are
/// answered while a slow run waits on its model; a run the client cancels
/// (`notifications/cancelled`) answers nothing, and the server goes on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mcp_server_answers_while_a_run_goes_on_and_a_cancelled_run_answers_nothing() {
    use bindery_tests::mock_llm::Gate;
    let gate = Gate::new();
    let held = gate.clone();
    let mock = MockLlm::start(move |req| {
        let said = last_message(req)["content"]
            .as_str()
            .unwrap_or("")
            .to_string();
        let reply = MockReply::text(format!("heard: {said}"));
        if said == "slow" {
            reply.held(&held)
        } else {
            reply
        }
    })
    .await;
    let tmp = tempfile::tempdir().unwrap();
    let agent = talker(tmp.path(), "talker", "talks back", &mock.url());
    let mut server = StdioServer::start(
        tmp.path(),
        &["mcp-server", "--agent-file", agent.to_str().unwrap()],
    );
    server.send(r#"{"jsonrpc":"2.0","id":0,"method":"initialize","params":{"protocolVersion":"2025-06-18"}}"#);
    assert_eq!(server.next()["result"]["protocolVersion"], "2025-06-18");
    let call = |id: &str, prompt: &str| {
        format!(
            r#"{{"jsonrpc":"2.0","id":"{id}","method":"tools/call","params":{{"name":"ask_talker_000","arguments":{{"prompt":"{prompt}"}}}}}}"#
        )
    };
    server.send(&call("slow-1", "slow"));
    server.send(r#"{"jsonrpc":"2.0","id":1,"method":"ping"}"#);
    assert_eq!(server.next()["id"], 1);
    // An id already in flight is refused (JSON-RPC's ids are unique).
    server.send(&call("slow-1", "quick"));
    let dup = server.next();
    assert_eq!(dup["id"], "slow-1", "{dup}");
    assert_eq!(dup["error"]["code"], -32600, "{dup}");
    server.send(&call("quick", "quick"));
    let quick = server.next();
    assert_eq!(quick["id"], "quick", "{quick}");
    assert_eq!(quick["result"]["content"][0]["text"], "heard: quick");

    server.send(r#"{"jsonrpc":"2.0","method":"notifications/cancelled","params":{"requestId":"slow-1","reason":"changed my mind"}}"#);
    server.send(r#"{"jsonrpc":"2.0","id":2,"method":"ping"}"#);
    assert_eq!(server.next()["id"], 2);
    // The model may answer now: the run is gone, and its request too.
    gate.open();
    server.send(&call("slow-2", "slow"));
    let slow = server.next();
    assert_eq!(slow["id"], "slow-2", "{slow}");
    assert_eq!(slow["result"]["content"][0]["text"], "heard: slow");
    let err = server.finish();
    assert!(err.contains("run cancelled by the client"), "{err}");
    mock.shutdown().await;
}

/// `tool-call NAME` on a helper agent's tool: one run of the helper,
/// printed as agents-exe prints an `io` tool's result.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tool_call_on_a_helper_prints_agents_exe_blob_result() {
    let mock = MockLlm::start(|req| {
        MockReply::text(format!(
            "heard: {}",
            last_message(req)["content"].as_str().unwrap_or("")
        ))
    })
    .await;
    let tmp = tempfile::tempdir().unwrap();
    talker(tmp.path(), "child", "knows", &mock.url());
    let parent = tmp.path().join("parent.json");
    let doc = json!({"tag": "OpenAIAgentDescription", "contents": {
        "slug": "parent", "apiKeyId": "none", "flavor": "OpenAIv1",
        "modelUrl": mock.url(), "modelName": "m", "announce": "asks",
        "systemPrompt": ["You ask."],
        "extraAgents": [{"slug": "child", "path": "child.json"}]}});
    std::fs::write(&parent, doc.to_string()).unwrap();
    let parent = parent.to_str().unwrap();
    let (code, out, err) = run_fed(
        tmp.path(),
        &[
            "--agent-file",
            parent,
            "tool-call",
            "io_prompt_agent_child",
            "-l",
            "trace.log",
        ],
        r#"{"what": "who are you?"}"#,
    );
    assert_eq!(code, Some(0), "{out}{err}");
    let line: Value = serde_json::from_str(out.trim_end()).unwrap();
    assert_eq!(
        line["resultData"],
        json!({"type": "blob", "data": "heard: who are you?"})
    );
    assert!(!tmp.path().join("trace.log").exists());
    mock.shutdown().await;
}

/// agents-exe's way of making one agent a tool of another over MCP: the
/// parent's `mcpServers` starts `mcp-server` with the child's file. The
/// MCP client here is the parent's (the SDK Bindery's MCP toolbox uses),
/// so the handshake, listing and call are a real client's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_file_served_by_mcp_server_is_an_mcp_tool_of_another() {
    let mock = MockLlm::start(|req| {
        let last = last_message(req);
        if !tool_names(req).contains(&"mcp_kid_ask_child_000".to_string()) {
            return MockReply::text(format!(
                "child says: {}",
                last["content"].as_str().unwrap_or("")
            ));
        }
        if last["role"] == "tool" {
            return MockReply::text(format!(
                "parent relays: {}",
                last["content"].as_str().unwrap_or("")
            ));
        }
        MockReply::tool_call(
            "mcp_kid_ask_child_000",
            json!({"prompt": "how far is the moon?"}),
        )
    })
    .await;
    let tmp = tempfile::tempdir().unwrap();
    let child = talker(tmp.path(), "child", "knows distances", &mock.url());
    let parent = tmp.path().join("parent.json");
    let doc = json!({"tag": "OpenAIAgentDescription", "contents": {
        "slug": "parent", "apiKeyId": "none", "flavor": "OpenAIv1",
        "modelUrl": mock.url(), "modelName": "m", "announce": "asks",
        "systemPrompt": ["You ask."],
        "mcpServers": [{"tag": "McpSimpleBinary", "contents": {
            "name": "kid", "executable": bin(),
            "args": ["--agent-file", child.to_str().unwrap(), "mcp-server"]}}]}});
    std::fs::write(&parent, doc.to_string()).unwrap();
    let parent = parent.to_str().unwrap();

    let (code, out, err) = run_fed(
        tmp.path(),
        &["check", "--agent-file", parent, "--tools", "list"],
        "",
    );
    assert_eq!(code, Some(0), "{out}{err}");
    assert!(out.contains("mcp_kid_ask_child_000"), "{out}");
    let (code, out, err) = run_fed(
        tmp.path(),
        &["run", "--agent-file", parent, "-p", "ask the kid"],
        "",
    );
    assert_eq!(code, Some(0), "{out}{err}");
    assert!(
        out.contains("parent relays: child says: how far is the moon?"),
        "{out}"
    );
    mock.shutdown().await;
}

/// `bindery-sidecar mcp-server …` with piped stdio: JSON lines in and out.
struct StdioServer {
    child: std::process::Child,
    stdin: Option<std::process::ChildStdin>,
    lines: std::sync::mpsc::Receiver<String>,
    // Read as it comes, so a full pipe never stops the server.
    stderr: std::thread::JoinHandle<String>,
}

impl StdioServer {
    fn start(dir: &Path, args: &[&str]) -> StdioServer {
        use std::io::BufRead;
        let mut child = Command::new(bin())
            .current_dir(dir)
            .env_remove("BINDERY_MODEL_URL")
            .args(args)
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let (tx, lines) = std::sync::mpsc::channel();
        let stdout = child.stdout.take().unwrap();
        std::thread::spawn(move || {
            for line in std::io::BufReader::new(stdout).lines() {
                if tx.send(line.unwrap()).is_err() {
                    break;
                }
            }
        });
        let mut stderr = child.stderr.take().unwrap();
        let stderr = std::thread::spawn(move || {
            let mut err = String::new();
            let _ = std::io::Read::read_to_string(&mut stderr, &mut err);
            err
        });
        StdioServer {
            stdin: child.stdin.take(),
            child,
            lines,
            stderr,
        }
    }

    fn send(&mut self, line: &str) {
        use std::io::Write;
        let stdin = self.stdin.as_mut().unwrap();
        stdin.write_all(line.as_bytes()).unwrap();
        stdin.write_all(b"\n").unwrap();
        stdin.flush().unwrap();
    }

    /// The next message on stdout: every line must be JSON.
    fn next(&self) -> Value {
        let line = self
            .lines
            .recv_timeout(PATIENCE)
            .expect("an answer on stdout");
        serde_json::from_str(&line).unwrap_or_else(|e| panic!("{e}: {line}"))
    }

    /// Close stdin: the server must end, successfully, with nothing more
    /// on stdout. Its stderr.
    fn finish(mut self) -> String {
        drop(self.stdin.take());
        let status = self.child.wait().unwrap();
        assert!(status.success(), "{status}");
        let mut more = Vec::new();
        while let Ok(line) = self.lines.recv_timeout(PATIENCE) {
            more.push(line);
        }
        assert!(more.is_empty(), "{more:?}");
        self.stderr.join().unwrap()
    }
}

/// An agent with an open parameter called `prompt` is refused as a tool,
/// saying why, rather than offering `prompt` twice and failing each run.
#[test]
fn as_tool_refuses_a_parameter_called_prompt() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("asker.yaml"),
        "apiVersion: bindery.dev/v1alpha1\nkind: Agent\nmetadata:\n  name: asker\nspec:\n  model: {url: http://127.0.0.1:9/v1, name: m}\n  parameters:\n    - {name: prompt, scope: session}\n",
    )
    .unwrap();
    for args in [
        &["as-tool", "--agent-file", "asker.yaml", "describe"][..],
        &["--agent-file", "asker.yaml", "describe"],
        &["--agent-file", "asker.yaml", "run", "--prompt", "hi"],
    ] {
        let (ok, out, err) = run(dir.path(), args);
        assert!(!ok, "{args:?}: {out}");
        assert!(
            err.contains("agent `asker` has a parameter called `prompt`"),
            "{args:?}: {err}"
        );
    }
}
