//! Runs through the real server over TCP, against the scripted mock LLM.

use crate::common::*;
use serde_json::json;

/// The issue's "done": a client creates a session on a server whose tenant
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

    let reply = message_waited(&api, &id, "which invoices are overdue?").await;
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

/// With streaming on (the default), the model's text reaches an open event
/// stream as `delta` events while the run is in progress.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn streamed_text_is_forwarded_as_delta_events() {
    let w = World::new(|_| {
        bindery_tests::mock_llm::MockReply::text("a fairly long answer, streamed in pieces")
    })
    .await;
    let (_sidecar, api) = w.start(&[], &[]);
    let created = api
        .call("POST", "/v1/sessions", Some(OWNER), Some(&json!({"agent": "invoices", "params": {"tenant": "acme-corp", "billing_token": "t"}})))
        .await;
    let id = created.json["session_id"].as_str().unwrap().to_string();
    let (_, stream) = api
        .events(&format!("/v1/sessions/{id}/events"), Some(OWNER), None)
        .await;
    let mut stream = stream.unwrap();
    let r = api
        .call(
            "POST",
            &format!("/v1/sessions/{id}/messages"),
            Some(OWNER),
            Some(&json!({"prompt": "hi"})),
        )
        .await;
    assert_eq!(r.status, 202, "{}", r.text);
    let events = stream
        .until("run_finished", std::time::Duration::from_secs(30))
        .await;
    let text: String = events
        .iter()
        .filter(|e| e.event == "delta")
        .map(|e| {
            serde_json::from_str::<serde_json::Value>(&e.data).unwrap()["content"]
                .as_str()
                .unwrap()
                .to_string()
        })
        .collect();
    assert_eq!(text, "a fairly long answer, streamed in pieces");
    assert!(
        events.iter().filter(|e| e.event == "delta").count() > 1,
        "{events:?}"
    );
    assert!(events
        .iter()
        .filter(|e| e.event == "delta")
        .all(|e| e.id.is_none()));
    assert!(w.mock.requests()[0]["stream"] == json!(true));
}

/// `bindery-sidecar run --prompt`: one run on the command line, the answer on stdout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn run_prints_the_answer() {
    let w = World::new(tool_then_answer).await;
    let out = tokio::process::Command::new(bin())
        .args(["run", "--agent-file"])
        .arg(&w.agent)
        .args(["--set", "tenant=globex", "--prompt", "overdue?"])
        .env("BINDERY_PARAM_BILLING_TOKEN", CANARY)
        .output()
        .await
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert_eq!(
        stdout,
        "answer: 2026-10-20\tINV-2002\t7400.00 EUR\toverdue\n"
    );
    assert!(!stdout.contains(CANARY) && !stderr.contains(CANARY));

    let out = tokio::process::Command::new(bin())
        .args(["run", "--agent-file"])
        .arg(&w.agent)
        .args(["--prompt", "overdue?"])
        .output()
        .await
        .unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("agent `invoices` needs a value for tenant, billing_token"),
        "{stderr}"
    );
}

/// A toolbox with `bash_session-dump`, which prints `AGENT_SESSION_JSON`
/// and takes the secret `billing_token` as an env-mode argument.
fn session_dump_toolbox(dir: &std::path::Path) -> String {
    use std::os::unix::fs::PermissionsExt;
    let tools = dir.join("dump-tools");
    std::fs::create_dir_all(&tools).unwrap();
    let script = tools.join("session-dump");
    std::fs::write(
        &script,
        r#"#!/usr/bin/env bash
if [[ "${1:-}" == "describe" ]]; then
  echo '{"slug": "session-dump", "description": "Prints the session.", "args": [{"name": "token", "description": "a token", "type": "string", "backing_type": "string", "arity": "single", "mode": "env"}]}'
  exit 0
fi
printf '%s' "${AGENT_SESSION_JSON:-none}"
"#,
    )
    .unwrap();
    std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).unwrap();
    format!(
        "    - bash:\n        directory: \"{}\"\n        bindings:\n          - {{arg: token, value: {{param: billing_token}}}}\n",
        tools.display()
    )
}

/// Bash tools get the conversation so far as `AGENT_SESSION_JSON`, as in
/// agents-exe: the session's id, agent and turns as the model made them,
/// never a bound or secret value.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bash_tools_get_the_session_as_json_without_secrets() {
    let script = |req: &serde_json::Value| {
        let last = bindery_tests::mock_llm::last_message(req);
        match last["role"].as_str() {
            Some("tool") => bindery_tests::mock_llm::MockReply::text("done"),
            _ => bindery_tests::mock_llm::MockReply::tool_call("bash_session-dump", json!({})),
        }
    };
    let w = World::with_toolboxes(script, session_dump_toolbox).await;
    let (_sidecar, api) = w.start(&[], &[]);
    let created = api
        .call(
            "POST",
            "/v1/sessions?wait=true",
            Some(OWNER),
            Some(&json!({"agent": "invoices", "params": valid_params(), "prompt": "dump the session"})),
        )
        .await;
    assert_eq!(created.status, 201, "{}", created.text);
    let id = created.json["session_id"].as_str().unwrap().to_string();
    let turns = created.json["session"]["turns"].as_array().unwrap();
    let dumped = turns[2]["content"].as_str().unwrap();
    assert!(!dumped.contains(CANARY), "{dumped}");
    let session: serde_json::Value = serde_json::from_str(dumped).expect(dumped);
    assert_eq!(session["session_id"], id.as_str());
    assert_eq!(session["agent"], "invoices");
    // The question and the model's call, as the history holds them.
    assert_eq!(session["turns"][0]["content"], "dump the session");
    assert_eq!(
        session["turns"][1]["tool_calls"][0]["function"]["name"],
        "bash_session-dump"
    );
    assert_eq!(session["turns"].as_array().unwrap().len(), 2);
}

/// A toolbox directory holding one tool that works (`bash_session-dump`)
/// and the two broken fixtures: one exits non-zero on `describe`, one
/// prints something that is not a description.
fn half_broken_toolbox(dir: &std::path::Path) -> String {
    let tools = dir.join("dump-tools");
    session_dump_toolbox(dir);
    let broken =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/broken-tools");
    for name in ["fails", "bad-json"] {
        std::os::unix::fs::symlink(broken.join(name), tools.join(name)).unwrap();
    }
    format!("    - bash: {{directory: \"{}\"}}\n", tools.display())
}

/// A script that cannot describe itself: `serve` leaves its tool out with
/// a warning naming the file (agents-exe's behaviour) and serves the rest;
/// `check` fails on it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serve_skips_a_broken_script_and_check_refuses_it() {
    let w = World::with_toolboxes(tool_then_answer, half_broken_toolbox).await;
    let (sidecar, api) = w.start(&[], &[]);
    let r = api
        .call("GET", "/v1/agents/invoices", Some(OWNER), None)
        .await;
    assert_eq!(r.status, 200, "{}", r.text);
    assert_eq!(
        r.json["tools"],
        json!(["bash_query-invoices", "bash_session-dump"]),
        "{}",
        r.text
    );
    let logs = sidecar.logs();
    for name in ["fails", "bad-json"] {
        let line = logs
            .lines()
            .find(|l| l.contains(&format!("dump-tools/{name}")))
            .unwrap_or_else(|| panic!("no warning names {name}:\n{logs}"));
        assert!(line.contains("WARN"), "{line}");
        assert!(line.contains("left out"), "{line}");
    }
    // The session API works with the tools that loaded.
    let created = api
        .call(
            "POST",
            "/v1/sessions?wait=true",
            Some(OWNER),
            Some(&json!({"agent": "invoices", "params": valid_params(), "prompt": "overdue?"})),
        )
        .await;
    assert_eq!(created.status, 201, "{}", created.text);
    assert_eq!(created.json["status"], "idle", "{}", created.text);

    let out = std::process::Command::new(bin())
        .args(["check", "--agent-file"])
        .arg(&w.agent)
        .args(["--set", "tenant=acme"])
        .env_clear()
        .env("PATH", std::env::var("PATH").unwrap_or_default())
        .output()
        .unwrap();
    let text =
        String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{text}");
    assert!(text.contains("dump-tools/fails"), "{text}");
    assert!(text.contains("dump-tools/bad-json"), "{text}");
}

/// The binary as a bash tool (`as-tool`): a parent agent's tools directory
/// holds a wrapper that serves the invoices agent through the describe/run
/// protocol; the parent binds the child's tenant and secret token, which
/// reaches the child in env mode only, and the child's answer is the tool's
/// result.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_binary_serves_an_agent_as_a_bash_tool() {
    use std::os::unix::fs::PermissionsExt;
    let w = World::new(tool_then_answer).await;
    let tools = w.dir.path().join("parent-tools");
    std::fs::create_dir_all(&tools).unwrap();
    let wrapper = tools.join("invoices");
    std::fs::write(
        &wrapper,
        format!(
            "#!/bin/sh\nexec '{}' as-tool --agent-file '{}' \"$@\"\n",
            bin(),
            w.agent.display()
        ),
    )
    .unwrap();
    std::fs::set_permissions(&wrapper, std::fs::Permissions::from_mode(0o755)).unwrap();

    // The protocol's describe, as any runtime calls it.
    let out = std::process::Command::new(&wrapper)
        .arg("describe")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let d: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(d["slug"], "invoices");
    assert_eq!(
        d["description"],
        "answers questions about one tenant's invoices"
    );
    let args: Vec<(String, String, String)> = d["args"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| {
            let s = |k: &str| a[k].as_str().unwrap().to_string();
            (s("name"), s("mode"), s("arity"))
        })
        .collect();
    let arg = |n: &str, m: &str, a: &str| (n.to_string(), m.to_string(), a.to_string());
    assert_eq!(
        args,
        [
            arg("prompt", "dashdashspace", "single"),
            arg("tenant", "dashdashspace", "single"),
            arg("billing_token", "env", "single"),
            arg("otp", "env", "optional"),
        ]
    );

    let parent = w.dir.path().join("parent.yaml");
    std::fs::write(
        &parent,
        format!(
            r#"apiVersion: bindery.dev/v1alpha1
kind: Agent
metadata: {{name: desk}}
spec:
  model: {{url: "http://127.0.0.1:9/v1", name: unused}}
  parameters:
    - {{name: customer, scope: session}}
    - {{name: billing, secret: true}}
  toolboxes:
    - bash:
        directory: "{}"
        bindings:
          - {{arg: tenant, value: {{param: customer}}}}
          - {{arg: billing_token, value: {{param: billing}}}}
"#,
            tools.display()
        ),
    )
    .unwrap();
    let parent_arg = parent.display().to_string();
    let out = tokio::task::spawn_blocking(move || {
        std::process::Command::new(bin())
            .args([
                "tool-call",
                "--agent-file",
                &parent_arg,
                "--set",
                "customer=acme-corp",
            ])
            .args([
                "--tool",
                "bash_invoices",
                "--args",
                r#"{"prompt": "which are overdue?"}"#,
            ])
            .env_clear()
            .env("PATH", std::env::var("PATH").unwrap_or_default())
            .env("BINDERY_PARAM_BILLING", CANARY)
            .output()
            .unwrap()
    })
    .await
    .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stdout}\n{stderr}");
    assert!(
        stdout.starts_with("answer: 2026-10-01\tINV-1002\t850.50 EUR\toverdue"),
        "the child agent's answer for the bound tenant: {stdout}"
    );
    assert!(
        !stdout.contains(CANARY) && !stderr.contains(CANARY),
        "{stderr}"
    );
    // The child's model saw the question, and neither the tenant nor the token.
    let reqs = w.mock.requests();
    assert_eq!(reqs.len(), 2, "one tool call, one answer");
    for r in reqs {
        let text = r.to_string();
        assert!(text.contains("which are overdue?"));
        assert!(!text.contains(CANARY) && !text.contains("acme-corp"));
    }
}

/// `--worker-threads 1`: everything the server does shares one thread, and
/// sessions still run side by side, each to its answer (nothing waits on
/// work that needs a second thread).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_on_one_worker_thread_runs_sessions_side_by_side() {
    let w = World::new(tool_then_answer).await;
    let (_sidecar, api) = w.start(&["--worker-threads", "1"], &[]);
    let runs = futures::future::join_all((0..4).map(|_| invoices_run(&api))).await;
    for r in runs {
        assert_eq!(r.json["status"], "idle", "{}", r.text);
        let turns = r.json["session"]["turns"].as_array().unwrap();
        assert_eq!(turns.len(), 4, "{turns:?}");
    }
}
