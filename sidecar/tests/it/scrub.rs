//! Tool output is scrubbed of secrets through the real server, one test per
//! toolbox kind: a bash tool, an OpenAPI operation (a 200 body and an error
//! body), an MCP tool and a helper each print a secret in every encoding
//! `fixtures/leaky/leak_forms.py` knows. None of those forms may reach the
//! model, an API reply, the event stream, the store or the logs; the model
//! sees `<secret:NAME>` in their place.

use std::path::{Path, PathBuf};
use std::process::Stdio;

use crate::common::*;
use axum::http::{HeaderMap, StatusCode};
use axum::routing::get;
use axum::{Json, Router};
use bindery_tests::mock_llm::{last_message, tool_results, MockLlm, MockReply};
use serde_json::{json, Value};
use tokio::io::AsyncWriteExt;

/// The session's secret: its base64 differs between the alphabets, and
/// URL- and JSON-encoding change it.
const TOKEN: &str = "canary-SEKRIT \"q\" /+&=?\\ ~~~???";
/// The helper's own process-scope secret, which its caller never holds.
const VAULT: &str = "vault-SEKRIT 'k' /+&=?~~~ 456";
/// The OpenAPI toolbox's credential, read from the environment at load.
const API_KEY: &str = "apikey-SEKRIT/+?~~~ 789";

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/leaky")
}

/// `form: text` lines for `value`, as the leaky tools print them.
async fn leak_lines(value: &str) -> String {
    let mut child = tokio::process::Command::new("python3")
        .arg(fixtures().join("leak_forms.py"))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("python3 runs");
    let mut stdin = child.stdin.take().unwrap();
    stdin.write_all(value.as_bytes()).await.unwrap();
    drop(stdin);
    let out = child.wait_with_output().await.unwrap();
    String::from_utf8(out.stdout).unwrap()
}

/// Every encoded form of `value` (the text after `form: `).
async fn forms(value: &str) -> Vec<String> {
    let lines = leak_lines(value).await;
    let forms: Vec<String> = lines
        .lines()
        .map(|l| l.split_once(": ").unwrap().1.to_string())
        .collect();
    assert!(forms.len() >= 10, "{lines}");
    forms
}

/// An API whose `leak` operation prints the bearer token and its API key
/// in every form, and whose `reject` operation fails quoting them.
async fn start_api() -> std::net::SocketAddr {
    async fn leaked(headers: &HeaderMap) -> String {
        let header = |name: &str| {
            headers
                .get(name)
                .and_then(|v| v.to_str().ok())
                .unwrap_or("")
                .to_string()
        };
        let bearer = header("authorization");
        let token = bearer.trim_start_matches("Bearer ");
        format!(
            "authorization: {bearer}\n{}{}",
            leak_lines(token).await,
            leak_lines(&header("x-api-key")).await
        )
    }
    let doc = json!({
        "openapi": "3.0.3",
        "info": {"title": "leaky", "version": "1"},
        "paths": {
            "/leak": {"get": {"operationId": "leak_http", "summary": "Prints the credentials",
                "responses": {"200": {"description": "ok"}}}},
            "/reject": {"get": {"operationId": "reject_http", "summary": "Refuses the credentials",
                "responses": {"401": {"description": "no"}}}}
        }
    });
    let app = Router::new()
        .route("/openapi.json", get(move || async move { Json(doc) }))
        .route("/leak", get(|h: HeaderMap| async move { leaked(&h).await }))
        .route(
            "/reject",
            get(|h: HeaderMap| async move {
                (
                    StatusCode::UNAUTHORIZED,
                    format!("bad credentials:\n{}", leaked(&h).await),
                )
            }),
        );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    addr
}

/// The leaky agent (all four kinds of toolbox) and its helper `vault`.
fn agent_files(dir: &Path, model_url: &str, api: std::net::SocketAddr) -> PathBuf {
    let f = fixtures();
    let tools = f.join("tools");
    std::fs::write(
        dir.join("vault.yaml"),
        format!(
            r#"apiVersion: bindery.dev/v1alpha1
kind: Agent
metadata:
  name: vault
spec:
  model: {{url: "{model_url}", name: mock-model}}
  systemPrompt: You are VAULT.
  parameters:
    - {{name: vault_key, secret: true, default: {{env: VAULT_KEY}}}}
  toolboxes:
    - bash:
        directory: "{tools}"
        bindings:
          - {{arg: token, value: {{param: vault_key}}}}
"#,
            tools = tools.display()
        ),
    )
    .unwrap();
    let path = dir.join("leaky.yaml");
    std::fs::write(
        &path,
        format!(
            r#"apiVersion: bindery.dev/v1alpha1
kind: Agent
metadata:
  name: leaky
spec:
  model: {{url: "{model_url}", name: mock-model}}
  systemPrompt: You are LEAKY.
  parameters:
    - {{name: token, secret: true, scope: session}}
  toolboxes:
    - bash:
        directory: "{tools}"
        bindings:
          - {{arg: token, value: {{param: token}}}}
    - openapi:
        spec: "http://{api}/openapi.json"
        baseUrl: "http://{api}"
        secrets:
          - source: {{param: token}}
            header: {{name: Authorization, template: "Bearer {{{{secret}}}}"}}
          - source: {{env: LEAKY_API_KEY}}
            header: {{name: X-Api-Key}}
    - mcp:
        name: leaky
        command: [python3, "{mcp}"]
        bindings:
          - {{tool: leak, arg: token, value: {{param: token}}}}
  helpers:
    - path: vault.yaml
"#,
            tools = tools.display(),
            mcp = f.join("leak-mcp.py").display()
        ),
    )
    .unwrap();
    path
}

/// LEAKY calls `tool` (with `args`) once, then answers with the result;
/// VAULT calls its bash tool once, then answers with the result.
fn script(tool: &'static str, args: Value) -> impl Fn(&Value) -> MockReply {
    move |req: &Value| {
        let system = req["messages"][0]["content"].as_str().unwrap_or("");
        let results = tool_results(req);
        match (system, results.len()) {
            ("You are VAULT.", 0) => MockReply::tool_call("bash_leak", json!({})),
            (_, 0) => MockReply::tool_call(tool, args.clone()),
            _ => MockReply::text(format!(
                "the tool said: {}",
                last_message(req)["content"].as_str().unwrap_or("")
            )),
        }
    }
}

/// Run one message calling `tool`, then check that no form of any secret
/// went anywhere and that the model saw `<secret:NAME>` for each in `named`.
async fn leak_through(tool: &'static str, args: Value, named: &[(&str, &str)]) {
    let api_addr = start_api().await;
    let mock = MockLlm::start(script(tool, args)).await;
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(dir.path().join("logs")).unwrap();
    std::fs::create_dir_all(dir.path().join("store")).unwrap();
    let agent = agent_files(dir.path(), &mock.url(), api_addr);
    let store = sqlite_in(&dir.path().join("store"));
    let (mut sidecar, api) = serve(
        &agent,
        &store,
        &[],
        &[
            ("BINDERY_LOG", "debug"),
            ("VAULT_KEY", VAULT),
            ("LEAKY_API_KEY", API_KEY),
        ],
        dir.path(),
    );
    let id = new_session(&api, json!({"agent": "leaky", "params": {"token": TOKEN}})).await;
    let reply = message_waited(&api, &id, "print your token").await;
    assert_eq!(reply.json["status"], "idle", "{}", reply.text);
    let (status, events) = api
        .events(&format!("/v1/sessions/{id}/events"), Some(OWNER), None)
        .await;
    assert_eq!(status, 200);
    let mut events = events.unwrap();
    let seen = events
        .until("run_finished", std::time::Duration::from_secs(30))
        .await;
    assert!(seen.iter().any(|e| e.event == "run_finished"), "{seen:?}");
    assert!(seen.iter().any(|e| e.event == "tool_result"), "{seen:?}");
    // An open stream would hold the server's graceful shutdown.
    let stream = std::mem::take(&mut events.raw);
    drop(events);
    let view = api
        .call("GET", &format!("/v1/sessions/{id}"), Some(OWNER), None)
        .await;
    sidecar.stop();

    // The model saw the tool's output, every secret replaced by its name.
    let requests = mock.requests();
    let result = requests
        .iter()
        .filter(|r| r["messages"][0]["content"] == "You are LEAKY.")
        .flat_map(|r| tool_results(r).into_iter().map(str::to_string))
        .next_back()
        .expect("the tool's result reached the model");
    for (name, _) in named {
        let marker = format!("<secret:{name}>");
        for form in ["raw", "base64", "base64url", "urlencoded", "form"] {
            let prefix = if form == "form" { "form: t=" } else { "" };
            let line = if prefix.is_empty() {
                format!("{form}: {marker}")
            } else {
                format!("{prefix}{marker}")
            };
            assert!(result.contains(&line), "no `{line}` in:\n{result}");
        }
        assert!(result.contains(&format!("json: \"{marker}\"")), "{result}");
        for form in [
            "basic-auth",
            "base64-shift0",
            "base64-shift1",
            "base64-shift2",
        ] {
            let line = result
                .lines()
                .filter(|l| l.starts_with(&format!("{form}: ")))
                .find(|l| l.contains(&marker));
            assert!(
                line.is_some(),
                "{form} is not scrubbed to {marker}:\n{result}"
            );
        }
    }

    // No form of any secret anywhere.
    let mut places: Vec<(String, String)> = vec![
        ("the reply".into(), reply.text.clone()),
        ("the session".into(), view.text.clone()),
        ("the event stream".into(), stream),
        ("the logs".into(), sidecar.logs()),
        (
            "the log files".into(),
            String::from_utf8_lossy(&raw_files(&dir.path().join("logs"), "")).into_owned(),
        ),
        (
            "the store".into(),
            String::from_utf8_lossy(&raw_files(&dir.path().join("store"), "")).into_owned(),
        ),
    ];
    for (headers, body) in mock.raw_requests() {
        places.push(("a model request".into(), body));
        places.push(("a model request's headers".into(), format!("{headers:?}")));
    }
    for secret in [TOKEN, VAULT, API_KEY] {
        for form in forms(secret).await {
            let escaped = serde_json::to_string(&form).unwrap();
            let escaped = &escaped[1..escaped.len() - 1];
            for (place, text) in &places {
                assert!(
                    !text.contains(&form) && !text.contains(escaped),
                    "{form:?} (a form of a secret) is in {place}:\n{text}"
                );
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bash_output_is_scrubbed() {
    leak_through("bash_leak", json!({}), &[("token", TOKEN)]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn openapi_bodies_and_errors_are_scrubbed() {
    leak_through(
        "leak_http",
        json!({}),
        &[("token", TOKEN), ("x-api-key", API_KEY)],
    )
    .await;
    leak_through(
        "reject_http",
        json!({}),
        &[("token", TOKEN), ("x-api-key", API_KEY)],
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mcp_results_are_scrubbed() {
    leak_through("mcp_leaky_leak", json!({}), &[("token", TOKEN)]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_helpers_own_secrets_are_scrubbed() {
    leak_through(
        "prompt_agent_vault",
        json!({"what": "print your key"}),
        &[("vault_key", VAULT)],
    )
    .await;
}
