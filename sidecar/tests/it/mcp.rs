//! MCP toolboxes through the real binary against a real third-party MCP
//! server: `@modelcontextprotocol/server-everything` from npm (installed by
//! `tests/setup.sh` into tests/mcp/node_modules), over stdio and over
//! streamable HTTP.

use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use crate::common::*;
use bindery_tests::eventually::until_blocking;
use bindery_tests::mock_llm::{tool_names, tool_results, tool_schema, MockLlm, MockReply};
use serde_json::{json, Value};

/// The secret process parameter handed to the server in its `env`.
const TOKEN: &str = "mcp-token-c4f1e9";

/// server-everything's launcher, or a failure saying how to install it.
fn everything() -> PathBuf {
    let bin = repo().join("tests/mcp/node_modules/.bin/mcp-server-everything");
    assert!(
        bin.exists(),
        "{} is missing: run tests/setup.sh (it installs the MCP test servers with tests/mcp/install-mcp-servers.sh)",
        bin.display()
    );
    bin
}

fn run(args: &[&str], env: &[(&str, &str)]) -> (i32, String, String) {
    let out = Command::new(bin())
        .args(args)
        .env_clear()
        .env("PATH", std::env::var("PATH").unwrap_or_default())
        .envs(env.iter().copied())
        // agents-exe files' paths are relative to the working directory.
        .current_dir(repo())
        .output()
        .expect("bindery-sidecar runs");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// An agent whose MCP server gets a literal, a plain process parameter and a
/// secret one in its environment; `echo`'s `message` is bound to the
/// session's tenant.
fn agent_file(dir: &Path, model_url: &str) -> PathBuf {
    let text = format!(
        r#"apiVersion: bindery.dev/v1alpha1
kind: Agent
metadata:
  name: everything
spec:
  model: {{url: "{model_url}", name: mock-model}}
  systemPrompt: You try every tool.
  parameters:
    - {{name: tenant, scope: session}}
    - {{name: region, default: {{value: eu-west-1}}}}
    - {{name: api_token, secret: true, default: {{env: EVERYTHING_TOKEN}}}}
  toolboxes:
    - mcp:
        name: everything
        command: ["{server}", stdio]
        env:
          GREETING: {{literal: hello}}
          REGION: {{param: region}}
          API_TOKEN: {{param: api_token}}
        bindings:
          - {{tool: echo, arg: message, value: {{param: tenant}}}}
"#,
        server = everything().display()
    );
    let path = dir.join("everything.yaml");
    std::fs::write(&path, text).unwrap();
    path
}

/// `echo` (sending the bound argument anyway), `get-env`, `get-sum`, then
/// an answer quoting every result.
fn script(req: &Value) -> MockReply {
    let results = tool_results(req);
    match results.len() {
        0 => MockReply::tool_call(
            "mcp_everything_echo",
            json!({"message": "the model's pick"}),
        ),
        1 => MockReply::tool_call("mcp_everything_get-env", json!({})),
        2 => MockReply::tool_call("mcp_everything_get-sum", json!({"a": 2, "b": 40})),
        _ => MockReply::text(format!("done: {}", results.join(" | "))),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stdio_server_tools_are_listed_called_bound_and_configured() {
    let mock = MockLlm::start(script).await;
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(dir.path().join("logs")).unwrap();
    let agent = agent_file(dir.path(), &mock.url());
    let agent_arg = agent.display().to_string();
    let env = [("EVERYTHING_TOKEN", TOKEN), ("BINDERY_LOG", "info")];

    // What the operator sees: the tools, `message` bound apart, no secret.
    let (code, described, err) = run(&["describe", "--agent-file", &agent_arg], &env);
    assert_eq!(code, 0, "{err}");
    let described_json: Value = serde_json::from_str(&described).unwrap();
    let text = described_json.to_string();
    for tool in [
        "mcp_everything_echo",
        "mcp_everything_get-env",
        "mcp_everything_get-sum",
    ] {
        assert!(text.contains(tool), "{tool} missing from {described}");
    }
    assert!(!described.contains(TOKEN) && !err.contains(TOKEN));
    let (code, checked, err) = run(&["check", "--agent-file", &agent_arg], &env);
    assert_eq!(code, 0, "{err}");
    assert!(
        checked.contains("mcp_everything_echo()") && checked.contains("message := param tenant"),
        "{checked}"
    );
    assert!(!checked.contains(TOKEN) && !err.contains(TOKEN));

    let (sidecar, api) = serve(&agent, &sqlite_in(dir.path()), &[], &env, dir.path());

    // Two sessions share the one server; each echo gets its own tenant.
    let mut replies = Vec::new();
    for tenant in ["acme", "globex"] {
        let created = create(
            &api,
            json!({"agent": "everything", "params": {"tenant": tenant}}),
        )
        .await;
        assert_eq!(created.status, 201, "{}", created.text);
        let id = created.json["session_id"].as_str().unwrap().to_string();
        let reply = message_waited(&api, &id, "try the tools").await;
        let turns = reply.json["session"]["turns"].as_array().unwrap().clone();
        let results: Vec<String> = turns
            .iter()
            .filter(|t| t["role"] == "tool")
            .filter_map(|t| t["content"].as_str().map(str::to_string))
            .collect();
        assert_eq!(results.len(), 3, "{turns:?}");
        // The bound value won over the model's.
        assert_eq!(results[0], format!("Echo: {tenant}"));
        // The environment reached the process: only what was declared (plus
        // PATH), the secret masked in what the model reads.
        let env_seen: Value = serde_json::from_str(&results[1]).unwrap();
        assert_eq!(env_seen["GREETING"], "hello");
        assert_eq!(env_seen["REGION"], "eu-west-1");
        assert_eq!(env_seen["API_TOKEN"], "<secret:api_token>");
        assert!(env_seen.get("EVERYTHING_TOKEN").is_none(), "{env_seen}");
        assert!(env_seen.get("BINDERY_OWNER_TOKEN").is_none(), "{env_seen}");
        assert!(env_seen.get("BINDERY_LOG").is_none(), "{env_seen}");
        assert_eq!(results[2], "The sum of 2 and 40 is 42.");
        replies.push(reply.text);
    }

    // The model saw the server's tools, `echo` without its bound argument.
    let requests = mock.requests();
    for req in &requests {
        let names = tool_names(req);
        for t in ["mcp_everything_echo", "mcp_everything_get-sum"] {
            assert!(names.iter().any(|n| n == t), "{names:?}");
        }
        let echo = tool_schema(req, "mcp_everything_echo").unwrap();
        assert_eq!(echo["properties"], json!({}), "{echo}");
        assert_eq!(echo["required"], json!([]));
        let sum = tool_schema(req, "mcp_everything_get-sum").unwrap();
        assert_eq!(sum["required"], json!(["a", "b"]), "{sum}");
    }

    // server-everything adds tools once the client is initialized and says
    // so; the sidecar re-lists them.
    until(
        "the tools/list_changed refresh in the log",
        PATIENCE,
        || sidecar.logs().contains("tools changed, now"),
    )
    .await;

    // The secret is nowhere: model requests, API replies, logs.
    let logs = sidecar.logs();
    assert!(logs.contains("MCP tool call"), "{logs}");
    assert!(!logs.contains(TOKEN), "the token is in the log:\n{logs}");
    for (headers, body) in mock.raw_requests() {
        assert!(!body.contains(TOKEN));
        assert!(headers.iter().all(|(_, v)| !v.contains(TOKEN)));
    }
    for r in &replies {
        assert!(!r.contains(TOKEN));
    }
    assert!(!contains(
        &raw_files(&dir.path().join("logs"), "sidecar"),
        TOKEN
    ));
}

#[test]
fn agents_exe_mcp_servers_load_unchanged() {
    everything();
    let file = repo().join("sidecar/tests/fixtures/mcp/everything-agents-exe.json");
    let file = file.display().to_string();
    let env = [("EVERYTHING_TOKEN", TOKEN)];
    let (code, out, err) = run(&["check", "--agent-file", &file], &env);
    assert_eq!(code, 0, "{out}\n{err}");
    assert!(
        out.contains("mcp_everything_get-sum(a)") && out.contains("b := literal 40"),
        "{out}"
    );
    // The agent-level binding supplies `b`; the environment reaches the server.
    let (code, out, err) = run(
        &[
            "tool-call",
            "--agent-file",
            &file,
            "--tool",
            "mcp_everything_get-sum",
            "--args",
            r#"{"a": 2}"#,
        ],
        &env,
    );
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("The sum of 2 and 40 is 42."), "{out}");
    let (code, out, err) = run(
        &[
            "tool-call",
            "--agent-file",
            &file,
            "--tool",
            "mcp_everything_get-env",
            "--args",
            "{}",
        ],
        &env,
    );
    assert_eq!(code, 0, "{err}");
    let seen: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(seen["REGION"], "eu-west-1");
    assert_eq!(seen["MODE"], "read-only");
    assert_eq!(seen["API_TOKEN"], "<secret:api_token>");
    assert!(!out.contains(TOKEN) && !err.contains(TOKEN));
}

/// The example of docs/agents.md (MCP toolboxes), as it says to try it.
#[test]
fn the_example_agent_lists_and_calls_its_server() {
    everything();
    let file = repo().join("examples/mcp/agent.yaml").display().to_string();
    let (code, out, err) = run(&["check", "--agent-file", &file], &[]);
    assert_eq!(code, 0, "{out}\n{err}");
    assert!(out.contains("mcp_everything_echo()"), "{out}");
    let (code, out, err) = run(
        &[
            "tool-call",
            "--agent-file",
            &file,
            "--set",
            "tenant=acme",
            "--tool",
            "mcp_everything_echo",
            "--args",
            "{}",
        ],
        &[],
    );
    assert_eq!(code, 0, "{err}");
    assert_eq!(out.trim(), "Echo: acme");
}

/// server-everything serving streamable HTTP on 127.0.0.1; killed on drop.
struct HttpServer {
    child: Child,
    port: u16,
}

impl HttpServer {
    fn start() -> HttpServer {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let child = Command::new(everything())
            .arg("streamableHttp")
            .env("PORT", port.to_string())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("server-everything starts");
        let mut server = HttpServer { child, port };
        // A constructor cannot await: the blocking wait, with the generous
        // bound it always had (node starting on a busy machine).
        until_blocking(
            "server-everything to listen",
            Duration::from_secs(60),
            || {
                if let Ok(Some(status)) = server.child.try_wait() {
                    panic!("server-everything exited: {status}");
                }
                TcpStream::connect(("127.0.0.1", port)).is_ok()
            },
        );
        server
    }
}

impl Drop for HttpServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[test]
fn a_remote_server_over_streamable_http() {
    let server = HttpServer::start();
    let dir = tempfile::tempdir().unwrap();
    let agent = dir.path().join("remote.yaml");
    std::fs::write(
        &agent,
        format!(
            r#"apiVersion: bindery.dev/v1alpha1
kind: Agent
metadata:
  name: remote
spec:
  model: {{url: "http://127.0.0.1:9/v1", name: m}}
  parameters:
    - {{name: api_token, secret: true, default: {{env: EVERYTHING_TOKEN}}}}
  toolboxes:
    - mcp:
        name: remote
        url: "http://127.0.0.1:{port}/mcp"
        headers:
          Authorization: {{param: api_token}}
        bindings:
          - {{tool: get-sum, arg: a, value: {{literal: 2}}}}
"#,
            port = server.port
        ),
    )
    .unwrap();
    let agent = agent.display().to_string();
    let env = [("EVERYTHING_TOKEN", TOKEN)];
    let (code, out, err) = run(&["check", "--agent-file", &agent], &env);
    assert_eq!(code, 0, "{out}\n{err}");
    assert!(out.contains("mcp_remote_get-sum(b)"), "{out}");
    let (code, out, err) = run(
        &[
            "tool-call",
            "--agent-file",
            &agent,
            "--tool",
            "mcp_remote_get-sum",
            "--args",
            r#"{"a": 100, "b": 40}"#,
        ],
        &env,
    );
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("The sum of 2 and 40 is 42."), "{out}");
    assert!(!out.contains(TOKEN) && !err.contains(TOKEN));
}

/// The prompt of the run in progress and the tool results since.
fn this_run(req: &Value) -> (String, Vec<String>) {
    let messages = req["messages"].as_array().unwrap();
    let last_user = messages.iter().rposition(|m| m["role"] == "user").unwrap();
    let prompt = messages[last_user]["content"]
        .as_str()
        .unwrap_or("")
        .to_string();
    let results = messages[last_user..]
        .iter()
        .filter(|m| m["role"] == "tool")
        .filter_map(|m| m["content"].as_str().map(str::to_string))
        .collect();
    (prompt, results)
}

/// A server whose tool list changes while the sidecar runs (a small
/// fixture server: server-everything's own change comes at start-up only).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_changed_tool_list_is_listed_again_and_bound_again() {
    let mock = MockLlm::start(|req| {
        let (prompt, results) = this_run(req);
        match (prompt.as_str(), results.len()) {
            ("grow", 0) => MockReply::tool_call("mcp_changing_grow", json!({})),
            ("lookup", 0) => MockReply::tool_call(
                "mcp_changing_lookup",
                json!({"id": "42", "tenant": "globex"}),
            ),
            _ => MockReply::text(format!("done: {}", results.join(" | "))),
        }
    })
    .await;
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(dir.path().join("logs")).unwrap();
    let server = repo().join("sidecar/tests/fixtures/mcp/changing-server.py");
    let agent = dir.path().join("changing.yaml");
    std::fs::write(
        &agent,
        format!(
            r#"apiVersion: bindery.dev/v1alpha1
kind: Agent
metadata:
  name: changing
spec:
  model: {{url: "{model}", name: mock-model}}
  parameters:
    - {{name: tenant, scope: session}}
  toolboxes:
    - mcp:
        name: changing
        command: [python3, "{server}"]
        bindings:
          - {{tool: lookup, arg: tenant, value: {{param: tenant}}}}
          - {{tool: archive, arg: tenant, value: {{param: tenant}}}}
  bindings:
    - {{tool: mcp_changing_archive, arg: tenant, value: {{param: tenant}}}}
"#,
            model = mock.url(),
            server = server.display()
        ),
    )
    .unwrap();
    let (sidecar, api) = serve(&agent, &sqlite_in(dir.path()), &[], &[], dir.path());
    let created = create(
        &api,
        json!({"agent": "changing", "params": {"tenant": "acme"}}),
    )
    .await;
    assert_eq!(created.status, 201, "{}", created.text);
    let id = created.json["session_id"].as_str().unwrap().to_string();
    let say = |prompt: &'static str| {
        let api = api.clone();
        let id = id.clone();
        async move { message_waited(&api, &id, prompt).await }
    };

    let first = say("grow").await;
    assert!(first.text.contains("done: grown"), "{}", first.text);
    until("the new tool list", PATIENCE, || {
        sidecar
            .logs()
            .contains("tools changed, now mcp_changing_grow, mcp_changing_die, mcp_changing_lookup")
    })
    .await;
    let second = say("lookup").await;
    // The new tool's bound argument: hidden from the model, merged at the call.
    assert!(
        second.text.contains("done: lookup tenant=acme id=42"),
        "{}",
        second.text
    );
    let requests = mock.requests();
    let before = &requests[0];
    assert_eq!(
        tool_names(before),
        ["mcp_changing_grow", "mcp_changing_die"]
    );
    let after = requests.last().unwrap();
    let lookup = tool_schema(after, "mcp_changing_lookup").expect("lookup is offered");
    assert_eq!(
        lookup["properties"]
            .as_object()
            .unwrap()
            .keys()
            .collect::<Vec<_>>(),
        ["id"],
        "{lookup}"
    );
    assert_eq!(lookup["required"], json!(["id"]));

    // A binding that matches nothing is a warning, at load and after the
    // change; `lookup`'s binding matches from the change on.
    let logs = sidecar.logs();
    let warned = |what: &str| logs.lines().any(|l| l.contains("WARN") && l.contains(what));
    assert!(
        warned(
            r#"binding 1 (tool "lookup", arg "tenant"): matches no tool (tools here: grow, die)"#
        ),
        "{logs}"
    );
    assert!(
        warned(
            r#"binding 2 (tool "archive", arg "tenant"): matches no tool (tools here: grow, die, lookup)"#
        ),
        "{logs}"
    );
    assert!(!warned(
        r#"binding 1 (tool "lookup", arg "tenant"): matches no tool (tools here: grow, die, lookup)"#
    ));
    // So is an agent-level one aimed at MCP tools (the server started).
    assert!(
        warned(
            r#"agent-level bindings, binding 1 (tool "mcp_changing_archive", arg "tenant"): matches no tool"#
        ),
        "{logs}"
    );
}

/// A server whose program exits: its tools fail, naming it and the status.
#[test]
fn a_server_that_exits_fails_its_calls_with_its_exit_status() {
    let dir = tempfile::tempdir().unwrap();
    let agent = dir.path().join("dying.yaml");
    std::fs::write(
        &agent,
        format!(
            r#"apiVersion: bindery.dev/v1alpha1
kind: Agent
metadata:
  name: dying
spec:
  model: {{url: "http://127.0.0.1:9/v1", name: m}}
  toolboxes:
    - mcp:
        name: changing
        command: [python3, "{server}"]
"#,
            server = repo()
                .join("sidecar/tests/fixtures/mcp/changing-server.py")
                .display()
        ),
    )
    .unwrap();
    let (code, out, err) = run(
        &[
            "tool-call",
            "--agent-file",
            &agent.display().to_string(),
            "--tool",
            "mcp_changing_die",
            "--args",
            "{}",
        ],
        &[],
    );
    assert_eq!(code, 1, "{out}");
    assert!(
        err.contains("MCP server `changing` exited (exit status: 7)"),
        "{err}"
    );
}

/// An MCP tool's image content (server-everything's `get-tiny-image`)
/// reaches the model as an image: the tool message has the text and a
/// note, and the image follows in a user message.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_mcp_tools_image_reaches_the_model_as_an_image() {
    let mock = MockLlm::start(|req: &Value| {
        let messages = req["messages"].as_array().unwrap();
        if messages.iter().any(|m| m["role"] == "tool") {
            return MockReply::text("seen");
        }
        MockReply::tool_call("mcp_everything_get-tiny-image", json!({}))
    })
    .await;
    let dir = tempfile::tempdir().unwrap();
    let agent = agent_file(dir.path(), &mock.url());
    let agent = agent.display().to_string();
    let (code, out, err) = tokio::task::block_in_place(|| {
        run(
            &[
                "run",
                "--agent-file",
                &agent,
                "--set",
                "tenant=acme",
                "-p",
                "show me",
            ],
            &[("EVERYTHING_TOKEN", "tok-12345")],
        )
    });
    assert_eq!(code, 0, "{out}{err}");
    let requests = mock.requests();
    assert_eq!(requests.len(), 2, "{requests:#?}");
    let messages = requests[1]["messages"].as_array().unwrap();
    let tool = &messages[messages.len() - 2];
    assert_eq!(tool["role"], "tool", "{messages:#?}");
    let text = tool["content"].as_str().unwrap();
    assert!(
        text.ends_with("[image/png attached in the next user message]"),
        "{text}"
    );
    let media = &messages[messages.len() - 1];
    assert_eq!(media["role"], "user");
    assert_eq!(media["content"][1]["type"], "image_url", "{media:#}");
    let url = media["content"][1]["image_url"]["url"].as_str().unwrap();
    assert!(
        url.starts_with("data:image/png;base64,iVBORw0KGgo"),
        "{url}"
    );
    mock.shutdown().await;
}
