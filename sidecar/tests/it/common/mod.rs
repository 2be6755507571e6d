//! What the server tests share: agent files pointing at a mock LLM, a
//! model script that calls the tool once then answers, and a started sidecar.

#![allow(dead_code)]

pub mod booking;
pub mod callbacks;

use std::path::{Path, PathBuf};

// Benches include this file too, and wait on nothing.
#[allow(unused_imports)]
pub use bindery_tests::eventually::{eventually, eventually_or, until, PATIENCE};
use bindery_tests::mock_llm::{MockLlm, MockReply};
use bindery_tests::sidecar::{Api, Launch, Reply, Sidecar};
use serde_json::{json, Value};

// What both kinds of test share (bindery-tests' fixtures); the benches
// include this file too and use only some of it.
#[allow(unused_imports)]
pub use bindery_tests::fixtures::session::{
    create, error_of, last_tool_output, message_waited, new_session, refusal, CANARY, OWNER,
};
#[allow(unused_imports)]
pub use bindery_tests::fixtures::{example_agent_text, executable, invoices_agent_file, repo};
pub use bindery_tests::scripts::tool_then_answer;

pub fn bin() -> &'static str {
    env!("CARGO_BIN_EXE_bindery-sidecar")
}

/// An invoices agent like the example's, talking to `model_url`, with both
/// parameters session-scope (the token secret) plus a message-scope `otp`.
pub fn invoices_agent(dir: &Path, model_url: &str) -> PathBuf {
    invoices_agent_with(dir, model_url, "")
}

/// The invoices agent with `extra_toolboxes` (YAML list items, indented
/// four spaces) after its own toolbox.
pub fn invoices_agent_with(dir: &Path, model_url: &str, extra_toolboxes: &str) -> PathBuf {
    invoices_agent_file(
        dir,
        model_url,
        bindery_tests::fixtures::INVOICES_PARAMETERS,
        extra_toolboxes,
    )
}

/// A toolbox directory with one bash tool, `bash_slow-lookup`, whose run
/// sleeps (as the tool's own process, so cancelling the call kills it);
/// for runs that must still be in progress when the test acts.
pub fn slow_toolbox(dir: &Path) -> String {
    let tools = dir.join("slow-tools");
    std::fs::create_dir_all(&tools).unwrap();
    bindery_tests::fixtures::bash_tool(
        &tools,
        "slow-lookup",
        "Looks something up, slowly.",
        "exec sleep 120\n",
    );
    format!("    - bash: {{directory: \"{}\"}}\n", tools.display())
}

/// rmcp's client of protocol 2026-07-28 (no handshake: it discovers, then
/// every request describes itself) on `url`'s `/mcp`, with `token` and
/// the extra `headers`.
pub async fn stateless_mcp_client(
    url: &str,
    token: &str,
    headers: std::collections::HashMap<reqwest::header::HeaderName, reqwest::header::HeaderValue>,
) -> rmcp::service::RunningService<rmcp::RoleClient, rmcp::model::ClientConfig> {
    use rmcp::model::{ClientConfig, ProtocolVersion};
    use rmcp::service::{ClientLifecycleMode, ClientServiceExt};
    use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;
    use rmcp::transport::StreamableHttpClientTransport;
    let config = StreamableHttpClientTransportConfig::with_uri(format!("{url}/mcp"))
        .auth_header(token)
        .custom_headers(headers);
    let transport = StreamableHttpClientTransport::with_client(reqwest::Client::new(), config);
    ClientConfig::default()
        .serve_with_lifecycle(
            transport,
            ClientLifecycleMode::Discover {
                preferred_versions: vec![ProtocolVersion::V_2026_07_28],
            },
        )
        .await
        .expect("discovery against /mcp")
}

/// The data of the first `kind` event session `id` has stored (the owner
/// follows its stream from the start), within ten seconds; and the
/// stream's raw text up to it.
pub async fn first_event(api: &Api, id: &str, kind: &str) -> (Value, String) {
    let (status, stream) = api
        .events(&format!("/v1/sessions/{id}/events"), Some(OWNER), None)
        .await;
    assert_eq!(status, 200, "the events of session {id}");
    let mut stream = stream.expect("an event stream");
    let read = async {
        while let Some(e) = stream.next().await {
            if e.event == kind {
                return serde_json::from_str::<Value>(&e.data).unwrap_or_default();
            }
        }
        Value::Null
    };
    let data = tokio::time::timeout(std::time::Duration::from_secs(10), read)
        .await
        .unwrap_or_else(|_| panic!("no {kind} event in session {id}"));
    (data, stream.raw.clone())
}

/// An invoices session created with a prompt, its run waited for.
pub async fn invoices_run(api: &Api) -> Reply {
    let r = api
        .call(
            "POST",
            "/v1/sessions?wait=true",
            Some(OWNER),
            Some(&json!({"agent": "invoices", "prompt": "overdue?", "params": valid_params()})),
        )
        .await;
    assert_eq!(r.status, 201, "{}", r.text);
    r
}

/// A valid creation body for the invoices agent (no prompt).
pub fn valid_params() -> Value {
    json!({"tenant": "acme", "billing_token": CANARY})
}

/// A request with a raw body and an optional `Content-Type` (none at all
/// when `None`).
pub async fn raw(
    api: &Api,
    method: &str,
    path: &str,
    token: Option<&str>,
    body: &str,
    content_type: Option<&str>,
) -> Reply {
    let method = reqwest::Method::from_bytes(method.as_bytes()).unwrap();
    let mut req = api
        .http
        .request(method, format!("{}{path}", api.base))
        .body(body.to_string());
    if let Some(t) = token {
        req = req.bearer_auth(t);
    }
    if let Some(ct) = content_type {
        req = req.header("content-type", ct);
    }
    let resp = req.send().await.expect("request reaches the sidecar");
    let status = resp.status().as_u16();
    let text = resp.text().await.unwrap_or_default();
    let json = serde_json::from_str(&text).unwrap_or(Value::Null);
    Reply { status, json, text }
}

pub struct World {
    pub dir: tempfile::TempDir,
    pub mock: MockLlm,
    pub agent: PathBuf,
    pub store: String,
}

impl World {
    pub async fn new(script: impl Fn(&Value) -> MockReply + Send + Sync + 'static) -> World {
        World::with_toolboxes(script, |_| String::new()).await
    }

    /// A world whose invoices agent also has the toolboxes `extra` writes
    /// into the world's directory (see [`slow_toolbox`]).
    pub async fn with_toolboxes(
        script: impl Fn(&Value) -> MockReply + Send + Sync + 'static,
        extra: impl FnOnce(&Path) -> String,
    ) -> World {
        let dir = tempfile::tempdir().unwrap();
        let mock = MockLlm::start(script).await;
        let toolboxes = extra(dir.path());
        let agent = invoices_agent_with(dir.path(), &mock.url(), &toolboxes);
        let store = format!(
            "sqlite://{}",
            dir.path().join("store/bindery.sqlite").display()
        );
        std::fs::create_dir_all(dir.path().join("logs")).unwrap();
        World {
            dir,
            mock,
            agent,
            store,
        }
    }

    pub fn start(&self, extra: &[&str], env: &[(&str, &str)]) -> (Sidecar, Api) {
        serve(&self.agent, &self.store, extra, env, self.dir.path())
    }
}

/// An agent `a` of one bash toolbox, the executables in `tools`, its
/// model at `model_url`: `dir/a.yaml`.
pub fn bash_agent(dir: &Path, model_url: &str, tools: &Path) -> PathBuf {
    let agent = dir.join("a.yaml");
    std::fs::write(
        &agent,
        format!(
            "apiVersion: bindery.dev/v1alpha1\nkind: Agent\nmetadata: {{name: a}}\nspec:\n  model: {{url: \"{model_url}\", name: m}}\n  toolboxes:\n    - bash: {{directory: \"{}\"}}\n",
            tools.display()
        ),
    )
    .unwrap();
    agent
}

/// The SQLite store `store.sqlite` in `dir`, as `--store` takes it.
pub fn sqlite_in(dir: &Path) -> String {
    format!("sqlite://{}", dir.join("store.sqlite").display())
}

/// `serve --agent-file AGENT --store STORE EXTRA…` with `env`, its logs in
/// `dir/logs`, and a client for it.
pub fn serve(
    agent: &Path,
    store: &str,
    extra: &[&str],
    env: &[(&str, &str)],
    dir: &Path,
) -> (Sidecar, Api) {
    let mut args = vec![
        "--agent-file".to_string(),
        agent.display().to_string(),
        "--store".to_string(),
        store.to_string(),
    ];
    args.extend(extra.iter().map(|s| s.to_string()));
    let sidecar = Sidecar::start(Launch {
        bin: bin(),
        args,
        env: env
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
        log_dir: &dir.join("logs"),
        owner_token: OWNER,
    });
    let api = Api::new(&sidecar.url);
    (sidecar, api)
}

/// Every byte of every file under `dir` whose name starts with `prefix`.
pub fn raw_files(dir: &Path, prefix: &str) -> Vec<u8> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).unwrap().flatten() {
        if e.file_name().to_string_lossy().starts_with(prefix) {
            out.extend(std::fs::read(e.path()).unwrap_or_default());
        }
    }
    out
}

pub fn contains(hay: &[u8], needle: &str) -> bool {
    hay.windows(needle.len()).any(|w| w == needle.as_bytes())
}

/// The value of the sample line that starts with `series` (name and labels).
pub fn sample(metrics: &str, series: &str) -> Option<f64> {
    metrics
        .lines()
        .find(|l| l.starts_with(series) && l[series.len()..].starts_with(' '))
        .and_then(|l| l[series.len()..].trim().parse().ok())
}

/// How many requests `api` answered on `route` (its `/metrics`, every
/// status together).
pub async fn served(api: &Api, route: &str) -> f64 {
    let m = api.call("GET", "/metrics", None, None).await;
    m.text
        .lines()
        .filter(|l| {
            l.starts_with("bindery_http_requests_total{")
                && l.contains(&format!("route=\"{route}\""))
        })
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// What the binary printed, run on a terminal.
pub struct OnATerminal {
    pub code: i32,
    pub stdout: String,
    pub stderr: String,
}

/// The binary given `args` with a terminal as its stdin (util-linux
/// `script`'s pseudo-terminal), `typed` typed at it, `env` added to the
/// environment (after clearing it but for PATH, with `clear_env`); its
/// stdout and stderr are kept apart (in files), as a person's terminal
/// would show them. A person's answers (an approval, a choice) are
/// taken only from a terminal, never from piped stdin.
pub fn on_a_terminal(
    args: &[&str],
    env: &[(&str, &str)],
    clear_env: bool,
    typed: &str,
) -> OnATerminal {
    use std::io::Write;
    let dir = tempfile::tempdir().unwrap();
    let (out, err) = (dir.path().join("stdout"), dir.path().join("stderr"));
    let quote = |s: &str| {
        shlex::try_quote(s)
            .expect("no NUL in a test's argument")
            .into_owned()
    };
    let line = format!(
        "{} >{} 2>{}",
        shlex::try_join(std::iter::once(bin()).chain(args.iter().copied()))
            .expect("no NUL in a test's argument"),
        quote(&out.display().to_string()),
        quote(&err.display().to_string()),
    );
    let mut cmd = std::process::Command::new("script");
    if clear_env {
        cmd.env_clear()
            .env("PATH", std::env::var("PATH").unwrap_or_default());
    }
    let mut child = cmd
        .args(["-qec", &line, "/dev/null"])
        .envs(env.iter().copied())
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let mut input = child.stdin.take().unwrap();
    let _ = input.write_all(typed.as_bytes());
    drop(input);
    let status = child.wait().unwrap();
    let read =
        |p: &Path| String::from_utf8_lossy(&std::fs::read(p).unwrap_or_default()).into_owned();
    OnATerminal {
        code: status.code().unwrap_or(-1),
        stdout: read(&out),
        stderr: read(&err),
    }
}
