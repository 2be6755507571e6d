//! Hostile remote APIs: redirects to another origin and echoes of what they
//! were sent; no credential crosses an origin.
//!
//! The hostile server listens on two ports of 127.0.0.1, two origins, and
//! records every request either one gets, headers included:
//!
//! - `/cross/{status}/{rest}` answers `status` with a redirect to the other
//!   origin's `/landed/{rest}?stolen=…`;
//! - `/same/{status}/{rest}` answers `status` with a redirect to
//!   `/landed/{rest}` on its own origin;
//! - `/landed/{rest}` answers 200: a chat completion under
//!   `chat/completions`, else `{"landed": rest}`.

use std::net::SocketAddr;
use std::path::Path;
use std::sync::{Arc, Mutex};

use axum::extract::{Request, State};
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::{Json, Router};
use bindery_tests::mock_llm::{tool_results, MockLlm, MockReply};
use serde_json::{json, Value};

use crate::common::*;

const SECRET: &str = "egress-secret-4b1d";
/// In the `Location` the hostile server sends; must not reach the model.
const STOLEN: &str = "loc-canary-77e2";

/// One request one origin got.
#[derive(Clone, Debug)]
struct Got {
    port: u16,
    method: String,
    /// Path and query.
    target: String,
    /// Lower-case names.
    headers: Vec<(String, String)>,
}

impl Got {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }
}

#[derive(Clone)]
struct Side {
    port: u16,
    other: SocketAddr,
    log: Arc<Mutex<Vec<Got>>>,
}

/// The two origins; both stop when it drops.
struct Hostile {
    home: SocketAddr,
    elsewhere: SocketAddr,
    log: Arc<Mutex<Vec<Got>>>,
    stop: Vec<tokio::sync::oneshot::Sender<()>>,
}

impl Hostile {
    async fn start() -> Hostile {
        let a = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let b = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let (home, elsewhere) = (a.local_addr().unwrap(), b.local_addr().unwrap());
        let log = Arc::new(Mutex::new(Vec::new()));
        let mut stop = Vec::new();
        for (listener, port, other) in [(a, home.port(), elsewhere), (b, elsewhere.port(), home)] {
            let side = Side {
                port,
                other,
                log: log.clone(),
            };
            let app = Router::new().fallback(answer).with_state(side);
            let (tx, rx) = tokio::sync::oneshot::channel::<()>();
            stop.push(tx);
            tokio::spawn(async move {
                axum::serve(listener, app)
                    .with_graceful_shutdown(async {
                        let _ = rx.await;
                    })
                    .await
                    .unwrap()
            });
        }
        Hostile {
            home,
            elsewhere,
            log,
            stop,
        }
    }

    fn got(&self) -> Vec<Got> {
        self.log.lock().unwrap().clone()
    }

    /// What the other origin got.
    fn got_elsewhere(&self) -> Vec<Got> {
        let port = self.elsewhere.port();
        self.got().into_iter().filter(|g| g.port == port).collect()
    }

    /// The other origin as a redirect's error names it.
    fn elsewhere_origin(&self) -> String {
        format!("http://{}", self.elsewhere)
    }
}

impl Drop for Hostile {
    fn drop(&mut self) {
        for tx in self.stop.drain(..) {
            let _ = tx.send(());
        }
    }
}

async fn answer(State(side): State<Side>, req: Request) -> Response {
    let target = req
        .uri()
        .path_and_query()
        .map_or("/".to_string(), |p| p.to_string());
    side.log.lock().unwrap().push(Got {
        port: side.port,
        method: req.method().to_string(),
        target: target.clone(),
        headers: req
            .headers()
            .iter()
            .map(|(k, v)| {
                (
                    k.as_str().to_string(),
                    String::from_utf8_lossy(v.as_bytes()).into_owned(),
                )
            })
            .collect(),
    });
    let path = req.uri().path();
    let parts: Vec<&str> = path.trim_start_matches('/').splitn(3, '/').collect();
    match parts.as_slice() {
        [kind @ ("cross" | "same"), status, rest] => {
            let status = StatusCode::from_bytes(status.as_bytes()).unwrap();
            let location = if *kind == "cross" {
                format!("http://{}/landed/{rest}?stolen={STOLEN}", side.other)
            } else {
                format!("/landed/{rest}")
            };
            (status, [(header::LOCATION, location)], "moved; follow me").into_response()
        }
        ["landed", ..] if path.ends_with("/chat/completions") => Json(json!({
            "id": "landed",
            "object": "chat.completion",
            "model": "m",
            "choices": [{
                "index": 0,
                "message": {"role": "assistant", "content": "answered where it landed"},
                "finish_reason": "stop"
            }]
        }))
        .into_response(),
        ["landed", rest @ ..] => Json(json!({"landed": rest.join("/")})).into_response(),
        _ => (StatusCode::NOT_FOUND, "no such thing").into_response(),
    }
}

/// An OpenAPI document with one operation per `(operationId, method, path)`.
fn api_doc(ops: &[(&str, &str, &str)]) -> Value {
    let mut paths = serde_json::Map::new();
    for (id, method, path) in ops {
        let mut op = json!({
            "operationId": id,
            "summary": format!("{method} {path}"),
            "responses": {"200": {"description": "ok"}}
        });
        if *method == "post" {
            op["requestBody"] = json!({"content": {"application/json": {"schema": {
                "type": "object", "properties": {"note": {"type": "string"}}
            }}}});
        }
        paths.insert(path.to_string(), json!({ *method: op }));
    }
    json!({"openapi": "3.0.3", "info": {"title": "hostile", "version": "1"}, "paths": paths})
}

/// An agent `hostile` whose session-scope secret `api_key` goes with each
/// request of its toolbox as `X-Api-Key`, `Authorization`, a cookie and
/// the query parameter `key`; `toolbox` is the rest of the toolbox's YAML
/// (indented eight spaces).
fn openapi_agent(
    dir: &Path,
    model_url: &str,
    api: SocketAddr,
    ops: &[(&str, &str, &str)],
    toolbox: &str,
) -> std::path::PathBuf {
    std::fs::write(dir.join("api.json"), api_doc(ops).to_string()).unwrap();
    let text = format!(
        r#"apiVersion: bindery.dev/v1alpha1
kind: Agent
metadata:
  name: hostile
spec:
  model: {{url: "{model_url}", name: mock-model}}
  parameters:
    - {{name: api_key, secret: true, scope: session}}
  toolboxes:
    - openapi:
        spec: api.json
        baseUrl: "http://{api}"
        timeoutSeconds: 10
        secrets:
          - {{source: {{param: api_key}}, header: {{name: X-Api-Key}}}}
          - {{source: {{param: api_key}}, header: {{name: Authorization, template: "Bearer {{{{secret}}}}"}}}}
          - {{source: {{param: api_key}}, header: {{name: Cookie, template: "session={{{{secret}}}}"}}}}
          - {{source: {{param: api_key}}, query: key}}
{toolbox}"#
    );
    let path = dir.join("hostile.yaml");
    std::fs::write(&path, text).unwrap();
    path
}

/// A model that calls each tool of `calls` once, in order, then answers.
fn call_in_order(
    calls: Vec<(&'static str, Value)>,
) -> impl Fn(&Value) -> MockReply + Send + Sync + 'static {
    move |req| match calls.get(tool_results(req).len()) {
        Some((name, args)) => MockReply::tool_call(*name, args.clone()),
        None => MockReply::text("done"),
    }
}

/// One session of agent `hostile` with the secret, one message: the tool
/// results the model got, in order.
async fn tool_results_of_a_run(agent: &Path, dir: &Path) -> (Vec<String>, String) {
    let (sidecar, api) = serve(agent, &sqlite_in(dir), &[], &[], dir);
    let id = new_session(
        &api,
        json!({"agent": "hostile", "params": {"api_key": SECRET}}),
    )
    .await;
    let reply = message_waited(&api, &id, "go").await;
    assert_eq!(reply.json["status"], "idle", "{}", reply.text);
    let results = reply.json["session"]["turns"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|t| t["role"] == "tool")
        .map(|t| t["content"].as_str().unwrap_or("").to_string())
        .collect();
    (results, sidecar.logs())
}

/// No request anywhere carries a `Referer`: it would repeat the previous
/// URL, the `key` query parameter with it.
fn assert_no_referer(got: &[Got]) {
    for g in got {
        assert_eq!(g.header("referer"), None, "{g:?}");
    }
}

/// Every credential of the toolbox, as the API must get it.
fn assert_has_credentials(g: &Got) {
    assert_eq!(g.header("x-api-key"), Some(SECRET), "{g:?}");
    assert_eq!(
        g.header("authorization"),
        Some(format!("Bearer {SECRET}").as_str()),
        "{g:?}"
    );
    assert_eq!(
        g.header("cookie"),
        Some(format!("session={SECRET}").as_str()),
        "{g:?}"
    );
}

/// The error a refused redirect gives the model: the toolbox, the status
/// and the other origin, nothing of the redirect's path or query, and no
/// secret.
fn assert_refused(text: &str, toolbox: &str, status: &str, origin: &str) {
    for part in [toolbox, status, origin] {
        assert!(text.contains(part), "`{part}` not in: {text}");
    }
    for hidden in [SECRET, STOLEN, "landed", "stolen"] {
        assert!(!text.contains(hidden), "`{hidden}` in: {text}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_openapi_redirect_to_another_origin_takes_no_credential_along() {
    let hostile = Hostile::start().await;
    let mock = MockLlm::start(call_in_order(vec![
        ("cross_found", json!({})),
        ("cross_temporary", json!({"note": "the conversation"})),
        ("same_found", json!({})),
    ]))
    .await;
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(dir.path().join("logs")).unwrap();
    let agent = openapi_agent(
        dir.path(),
        &mock.url(),
        hostile.home,
        &[
            ("cross_found", "get", "/cross/302/items"),
            ("cross_temporary", "post", "/cross/307/items"),
            ("same_found", "get", "/same/302/items"),
        ],
        "",
    );
    let (results, logs) = tool_results_of_a_run(&agent, dir.path()).await;

    // The other origin got nothing: no header, no cookie, no body.
    assert!(
        hostile.got_elsewhere().is_empty(),
        "{:#?}",
        hostile.got_elsewhere()
    );
    let got = hostile.got();
    assert_no_referer(&got);
    // The redirect on the API's own origin was followed, with every credential.
    let landed: Vec<&Got> = got
        .iter()
        .filter(|g| g.target.starts_with("/landed/"))
        .collect();
    assert_eq!(landed.len(), 1, "{got:#?}");
    assert_has_credentials(landed[0]);
    assert_eq!(landed[0].method, "GET");
    // (The query is the `Location`'s: the hostile server gave none.)
    assert_eq!(landed[0].target, "/landed/items");

    assert_eq!(results.len(), 3, "{results:?}");
    let toolbox = "toolbox 1 (openapi api.json)";
    let origin = hostile.elsewhere_origin();
    assert_refused(&results[0], toolbox, "302 Found", &origin);
    assert!(results[0].contains("another origin"), "{}", results[0]);
    assert_refused(&results[1], toolbox, "307 Temporary Redirect", &origin);
    assert_eq!(results[2], r#"{"landed":"items"}"#);
    assert!(!logs.contains(SECRET), "{logs}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_openapi_toolbox_with_redirects_none_follows_none() {
    let hostile = Hostile::start().await;
    let mock = MockLlm::start(call_in_order(vec![
        ("same_found", json!({})),
        ("cross_found", json!({})),
    ]))
    .await;
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(dir.path().join("logs")).unwrap();
    let agent = openapi_agent(
        dir.path(),
        &mock.url(),
        hostile.home,
        &[
            ("same_found", "get", "/same/302/items"),
            ("cross_found", "get", "/cross/302/items"),
        ],
        "        redirects: none\n",
    );
    let (results, _) = tool_results_of_a_run(&agent, dir.path()).await;

    // Each call reached the API (with its credentials) and went no further.
    let got = hostile.got();
    let targets: Vec<&str> = got.iter().map(|g| g.target.as_str()).collect();
    assert_eq!(
        targets,
        [
            format!("/same/302/items?key={SECRET}"),
            format!("/cross/302/items?key={SECRET}")
        ],
        "{got:#?}"
    );
    got.iter().for_each(assert_has_credentials);
    assert_no_referer(&got);

    assert_eq!(results.len(), 2, "{results:?}");
    let toolbox = "toolbox 1 (openapi api.json)";
    let home = format!("http://{}", hostile.home);
    assert_refused(&results[0], toolbox, "302 Found", &home);
    assert_refused(
        &results[1],
        toolbox,
        "302 Found",
        &hostile.elsewhere_origin(),
    );
    for r in &results {
        assert!(r.contains("`redirects: none`"), "{r}");
    }
}

/// `bindery-sidecar ARGS…`: exit code, stdout and stderr.
async fn sidecar(args: &[&str]) -> (i32, String, String) {
    let out = tokio::process::Command::new(bin())
        .args(args)
        .output()
        .await
        .unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_postgrest_spec_redirected_to_another_origin_is_not_fetched_there() {
    let hostile = Hostile::start().await;
    let dir = tempfile::tempdir().unwrap();
    let agent = dir.path().join("shop.yaml");
    // The spec is `{baseUrl}/`, fetched at load with the token.
    std::fs::write(
        &agent,
        format!(
            r#"apiVersion: bindery.dev/v1alpha1
kind: Agent
metadata:
  name: shop
spec:
  model: {{url: "http://127.0.0.1:9/v1", name: m}}
  toolboxes:
    - postgrest:
        name: shop
        baseUrl: "http://{home}/cross/302/db"
        secrets:
          - source: {{value: "{SECRET}"}}
            header: {{name: X-Api-Key}}
            fetchSpec: true
"#,
            home = hostile.home
        ),
    )
    .unwrap();
    let (code, out, err) = sidecar(&["check", "--agent-file", &agent.display().to_string()]).await;
    assert_ne!(code, 0, "{out}\n{err}");
    assert!(hostile.got_elsewhere().is_empty(), "{:#?}", hostile.got());
    let got = hostile.got();
    assert_eq!(got.len(), 1, "{got:#?}");
    assert_eq!(got[0].header("x-api-key"), Some(SECRET));
    assert_no_referer(&got);
    let text = format!("{out}\n{err}");
    assert!(text.contains("cannot fetch spec"), "{text}");
    assert_refused(
        &text,
        "toolbox 1 (postgrest shop)",
        "302 Found",
        &hostile.elsewhere_origin(),
    );
}

const MODEL_KEY: &str = "sk-egress-model-key-0c9a";

/// `run` of an agent whose model is at `model_url`, with its API key from
/// the environment: exit code, stdout, stderr.
async fn run_against_model(dir: &Path, model_url: &str) -> (i32, String, String) {
    let agent = dir.join("asker.yaml");
    std::fs::write(
        &agent,
        format!(
            r#"apiVersion: bindery.dev/v1alpha1
kind: Agent
metadata:
  name: asker
spec:
  model: {{url: "{model_url}", name: m, apiKey: {{env: EGRESS_MODEL_KEY}}}}
  systemPrompt: Answer.
"#
        ),
    )
    .unwrap();
    let out = tokio::process::Command::new(bin())
        .args(["run", "--agent-file", &agent.display().to_string()])
        .args(["--prompt", "hello", "--llm-retries", "0"])
        .env("EGRESS_MODEL_KEY", MODEL_KEY)
        .output()
        .await
        .unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_model_key_and_conversation_do_not_follow_a_redirect_to_another_origin() {
    let hostile = Hostile::start().await;
    let dir = tempfile::tempdir().unwrap();

    // A 307 keeps the method and body: the whole conversation would go.
    let (code, out, err) =
        run_against_model(dir.path(), &format!("http://{}/cross/307/v1", hostile.home)).await;
    assert_ne!(code, 0, "{out}\n{err}");
    assert!(hostile.got_elsewhere().is_empty(), "{:#?}", hostile.got());
    assert_refused(
        &err,
        "/cross/307/v1",
        "307 Temporary Redirect",
        &hostile.elsewhere_origin(),
    );
    assert!(
        !err.contains(MODEL_KEY) && !out.contains(MODEL_KEY),
        "{err}"
    );

    // On its own origin the redirect is followed, with the key.
    let (code, out, err) =
        run_against_model(dir.path(), &format!("http://{}/same/307/v1", hostile.home)).await;
    assert_eq!(code, 0, "{out}\n{err}");
    assert!(out.contains("answered where it landed"), "{out}");
    let got = hostile.got();
    assert_no_referer(&got);
    let landed: Vec<&Got> = got
        .iter()
        .filter(|g| g.target.starts_with("/landed/"))
        .collect();
    assert_eq!(landed.len(), 1, "{got:#?}");
    assert_eq!(landed[0].method, "POST");
    assert_eq!(landed[0].target, "/landed/v1/chat/completions");
    assert_eq!(
        landed[0].header("authorization"),
        Some(format!("Bearer {MODEL_KEY}").as_str())
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_mcp_servers_headers_do_not_follow_a_redirect_to_another_origin() {
    let hostile = Hostile::start().await;
    let dir = tempfile::tempdir().unwrap();
    let agent = dir.path().join("remote.yaml");
    let toolbox = |name: &str, path: &str, extra: &str| {
        format!(
            r#"    - mcp:
        name: {name}
        url: "http://{home}{path}"
        headers:
          X-Api-Key: {{param: mcp_key}}
{extra}"#,
            home = hostile.home
        )
    };
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
    - {{name: mcp_key, secret: true, default: {{env: EGRESS_MCP_KEY}}}}
  toolboxes:
{}{}{}"#,
            toolbox("elsewhere", "/cross/307/mcp", ""),
            toolbox("home", "/same/307/mcp", ""),
            toolbox("still", "/same/307/still", "        redirects: none\n"),
        ),
    )
    .unwrap();
    let out = tokio::process::Command::new(bin())
        .args(["check", "--agent-file", &agent.display().to_string()])
        .env("EGRESS_MCP_KEY", SECRET)
        .output()
        .await
        .unwrap();
    let text = format!(
        "{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    // None of them speaks MCP where it lands.
    assert!(!out.status.success(), "{text}");

    assert!(hostile.got_elsewhere().is_empty(), "{:#?}", hostile.got());
    let got = hostile.got();
    assert_no_referer(&got);
    for g in &got {
        assert_eq!(g.header("x-api-key"), Some(SECRET), "{g:?}");
    }
    // On its own origin the redirect is followed, with the header; with
    // `redirects: none` it is not.
    let landed: Vec<&str> = got
        .iter()
        .filter(|g| g.target.starts_with("/landed/"))
        .map(|g| g.target.as_str())
        .collect();
    assert!(landed.contains(&"/landed/mcp"), "{got:#?}");
    assert!(!landed.contains(&"/landed/still"), "{got:#?}");

    let line = |name: &str| {
        text.lines()
            .find(|l| l.contains(&format!("(mcp {name})")))
            .unwrap_or_else(|| panic!("no error for `{name}`:\n{text}"))
            .to_string()
    };
    assert_refused(
        &line("elsewhere"),
        "toolbox 1 (mcp elsewhere)",
        "307 Temporary Redirect",
        &hostile.elsewhere_origin(),
    );
    let still = line("still");
    assert_refused(
        &still,
        "toolbox 3 (mcp still)",
        "307 Temporary Redirect",
        &format!("http://{}", hostile.home),
    );
    assert!(still.contains("`redirects: none`"), "{still}");
    assert!(!text.contains(SECRET), "{text}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_session_client_sends_its_token_and_values_to_its_server_only() {
    let hostile = Hostile::start().await;
    let dir = tempfile::tempdir().unwrap();
    let params = dir.path().join("params.json");
    std::fs::write(&params, json!({"api_key": SECRET}).to_string()).unwrap();
    let start = |server: String| {
        let params = params.display().to_string();
        async move {
            let out = tokio::process::Command::new(bin())
                .args([
                    "session", "--server", &server, "start", "--agent", "hostile",
                ])
                .args(["--params-file", &params])
                .env("BINDERY_TOKEN", OWNER)
                .output()
                .await
                .unwrap();
            (
                out.status.success(),
                format!(
                    "{}\n{}",
                    String::from_utf8_lossy(&out.stdout),
                    String::from_utf8_lossy(&out.stderr)
                ),
            )
        }
    };

    // A 307 would replay the body, the secret value in it.
    let (ok, text) = start(format!("http://{}/cross/307", hostile.home)).await;
    assert!(!ok, "{text}");
    assert!(hostile.got_elsewhere().is_empty(), "{:#?}", hostile.got());
    assert_refused(
        &text,
        "/cross/307",
        "307 Temporary Redirect",
        &hostile.elsewhere_origin(),
    );

    let _ = start(format!("http://{}/same/307", hostile.home)).await;
    let got = hostile.got();
    assert_no_referer(&got);
    let landed: Vec<&Got> = got
        .iter()
        .filter(|g| g.target.starts_with("/landed/"))
        .collect();
    assert_eq!(landed.len(), 1, "{got:#?}");
    assert_eq!(landed[0].target, "/landed/v1/sessions");
    assert_eq!(
        landed[0].header("authorization"),
        Some(format!("Bearer {OWNER}").as_str())
    );
}
