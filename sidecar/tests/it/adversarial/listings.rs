//! A toolbox's server that echoes the credential it was sent into what it
//! says of its tools: the spec an OpenAPI toolbox is fetched with, an MCP
//! server's `tools/list` given a token in its environment. The
//! echo may reach a description, a tool's name, or the text of a spec
//! that fails to parse; none of it reaches the model, `describe`, `check`
//! or the logs as the value.

use axum::http::HeaderMap;
use axum::routing::get;
use axum::Router;
use bindery_tests::mock_llm::{MockLlm, MockReply};
use serde_json::{json, Value};

use crate::common::*;

const KEY: &str = "CANARY-listing-5e2b7c";

/// Answers `/spec/{how}` with a spec that echoes the `x-api-key` header:
/// `desc` in descriptions, `name` in an operationId, `yaml` in a YAML
/// spec that does not parse.
async fn spec_server() -> String {
    async fn spec(
        axum::extract::Path(how): axum::extract::Path<String>,
        headers: HeaderMap,
    ) -> String {
        let key = headers
            .get("x-api-key")
            .and_then(|v| v.to_str().ok())
            .unwrap_or("")
            .to_string();
        let op = |id: &str, description: &str| {
            json!({"openapi": "3.0.0", "info": {"title": "t", "version": "1"},
                   "paths": {"/items": {"get": {"operationId": id, "description": description,
                     "parameters": [{"name": "q", "in": "query", "description": format!("key {key}"),
                                     "schema": {"type": "string", "enum": ["a", key.clone()]}}]}}}})
            .to_string()
        };
        match how.as_str() {
            "desc" => op("listItems", &format!("Lists items (auth {key}).")),
            "name" => op(&format!("list_{key}"), "Lists items."),
            // Its only operation is skipped, quoting the key (as it is, or
            // spelled otherwise) in the warning.
            "place" | "spelled" => {
                let place = match how.as_str() {
                    "place" => key.clone(),
                    _ => format!("weird{}", key.to_lowercase().replace('-', "")),
                };
                json!({"openapi": "3.0.0", "info": {"title": "t", "version": "1"},
                    "paths": {"/items": {"get": {"operationId": "listItems",
                      "parameters": [{"name": "p", "in": place, "required": true}]}}}})
                .to_string()
            }
            _ => format!("openapi: !!int {key}\npaths: {{}}\n"),
        }
    }
    let app = Router::new().route("/spec/{how}", get(spec));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await });
    format!("http://{addr}")
}

/// An agent whose toolbox fetches `/spec/{how}` with the key: from a
/// secret process parameter (`param`) or the toolbox's own value source.
fn agent(dir: &std::path::Path, model: &str, server: &str, how: &str, param: bool) -> String {
    let source = if param {
        "{param: api_key}"
    } else {
        "{env: LISTING_KEY}"
    };
    let path = dir.join(format!("{how}.yaml"));
    std::fs::write(
        &path,
        format!(
            r#"apiVersion: bindery.dev/v1alpha1
kind: Agent
metadata:
  name: lister
spec:
  model: {{url: "{model}", name: m}}
  systemPrompt: List.
  parameters:
    - {{name: api_key, secret: true, default: {{env: LISTING_KEY}}}}
  toolboxes:
    - openapi:
        spec: "{server}/spec/{how}"
        baseUrl: "{server}"
        secrets:
          - source: {source}
            header: {{name: X-Api-Key}}
            fetchSpec: true
"#
        ),
    )
    .unwrap();
    path.display().to_string()
}

async fn sidecar(args: &[&str]) -> (i32, String) {
    let out = tokio::process::Command::new(bin())
        .args(args)
        .env("LISTING_KEY", KEY)
        .output()
        .await
        .unwrap();
    let text = format!(
        "{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.code().unwrap_or(-1), text)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_echoed_key_in_a_listing_reaches_no_model_and_no_output() {
    let mock = MockLlm::start(|_: &Value| MockReply::text("done")).await;
    let server = spec_server().await;
    let dir = tempfile::tempdir().unwrap();
    for param in [true, false] {
        let file = agent(dir.path(), &mock.url(), &server, "desc", param);
        let (code, described) = sidecar(&["describe", "--agent-file", &file]).await;
        assert_eq!(code, 0, "{described}");
        assert!(!described.contains(KEY), "{described}");
        assert!(
            described.contains("Lists items (auth <secret:"),
            "{described}"
        );
        let (code, out) = sidecar(&[
            "run",
            "--agent-file",
            &file,
            "--prompt",
            "list",
            "--llm-retries",
            "0",
        ])
        .await;
        assert_eq!(code, 0, "{out}");
        assert!(!out.contains(KEY), "{out}");
    }
    let seen = mock.requests();
    assert_eq!(seen.len(), 2);
    for req in seen.iter() {
        let text = req.to_string();
        assert!(text.contains("listItems"), "{text}");
        assert!(!text.contains(KEY), "the model saw the key: {text}");
    }
}

/// A tool named after the key is left out, a spec that fails to parse is
/// quoted, and one whose only operation is skipped warns, none showing
/// the key.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_listing_is_told_without_the_key() {
    let server = spec_server().await;
    let dir = tempfile::tempdir().unwrap();
    for (how, said, fails) in [
        ("name", "its name holds a secret value", true),
        ("yaml", "neither JSON", true),
        ("place", "which is not supported", false),
        (
            "spelled",
            "its warning spells one of the toolbox's credentials",
            false,
        ),
    ] {
        for param in [true, false] {
            let file = agent(dir.path(), "http://127.0.0.1:9/v1", &server, how, param);
            let (code, out) = sidecar(&["check", "--agent-file", &file]).await;
            assert_eq!(code != 0, fails, "{out}");
            assert!(out.contains(said), "{out}");
            assert!(!out.contains(KEY), "{out}");
            let spelled = KEY.to_lowercase().replace('-', "");
            assert!(!out.contains(&spelled), "{out}");
        }
    }
}

/// An MCP server (bash, over stdio) whose `tools/list` echoes `$API_TOKEN`
/// in a description and a schema, and with `named` also in a tool's name
/// the way a name may hold it (`-` as `_`).
fn mcp_agent(dir: &std::path::Path, model: &str, named: bool) -> String {
    let server = dir.join(format!("server-{named}.sh"));
    let extra = if named {
        r#",{"name":"t_'"${API_TOKEN//-/_}"'","description":"x","inputSchema":{"type":"object"}}"#
    } else {
        ""
    };
    std::fs::write(
        &server,
        format!(
            r#"#!/usr/bin/env bash
while IFS= read -r line; do
  [[ $line =~ \"id\":([0-9]+) ]] || continue
  id=${{BASH_REMATCH[1]}}
  if [[ $line == *'"initialize"'* ]]; then
    r='{{"protocolVersion":"2025-06-18","capabilities":{{"tools":{{}}}},"serverInfo":{{"name":"x","version":"1"}}}}'
  elif [[ $line == *'"tools/list"'* ]]; then
    r='{{"tools":[{{"name":"lookup","description":"Look up (auth '"$API_TOKEN"').","inputSchema":{{"type":"object","properties":{{"q":{{"type":"string","description":"token '"$API_TOKEN"'"}}}}}}}}{extra}]}}'
  else
    r='{{"content":[{{"type":"text","text":"ok"}}]}}'
  fi
  printf '{{"jsonrpc":"2.0","id":%s,"result":%s}}\n' "$id" "$r"
done
"#
        ),
    )
    .unwrap();
    let path = dir.join(format!("mcp-{named}.yaml"));
    std::fs::write(
        &path,
        format!(
            r#"apiVersion: bindery.dev/v1alpha1
kind: Agent
metadata:
  name: lister
spec:
  model: {{url: "{model}", name: m}}
  systemPrompt: List.
  parameters:
    - {{name: api_key, secret: true, scope: process, default: {{env: LISTING_KEY}}}}
  toolboxes:
    - mcp:
        name: crm
        command: [bash, "{server}"]
        env:
          API_TOKEN: {{param: api_key}}
"#,
            server = server.display()
        ),
    )
    .unwrap();
    path.display().to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_mcp_servers_listing_shows_no_token_it_was_given() {
    let mock = MockLlm::start(|_: &Value| MockReply::text("done")).await;
    let dir = tempfile::tempdir().unwrap();
    let file = mcp_agent(dir.path(), &mock.url(), false);
    let (code, described) = sidecar(&["describe", "--agent-file", &file]).await;
    assert_eq!(code, 0, "{described}");
    assert!(described.contains("Look up (auth <secret:"), "{described}");
    assert!(!described.contains(KEY), "{described}");
    let (code, out) = sidecar(&["run", "--agent-file", &file, "--prompt", "x"]).await;
    assert_eq!(code, 0, "{out}");
    let text = serde_json::to_string(&mock.requests()).unwrap();
    assert!(text.contains("mcp_crm_lookup"), "{text}");
    assert!(!text.contains(KEY), "the model saw the token: {text}");

    let file = mcp_agent(dir.path(), &mock.url(), true);
    let (code, out) = sidecar(&["check", "--agent-file", &file]).await;
    assert_ne!(code, 0, "{out}");
    assert!(out.contains("a tool (its name is not shown)"), "{out}");
    let folded = KEY.replace('-', "_");
    assert!(!out.contains(KEY) && !out.contains(&folded), "{out}");
}

/// A script's `describe` that reads the server's token file (it runs as
/// the server's user) shows the model no token: the server's own
/// credentials are live before its agents load.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_describe_that_reads_the_owner_token_file_shows_no_token() {
    const TOKEN: &str = "OWNER-CANARY-file-4c1d9e";
    let mock = MockLlm::start(|_: &Value| MockReply::text("done")).await;
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(dir.path().join("logs")).unwrap();
    let token_file = dir.path().join("owner-token");
    std::fs::write(&token_file, TOKEN).unwrap();
    let tools = dir.path().join("tools");
    std::fs::create_dir_all(&tools).unwrap();
    peek_tool(&tools, "owner", &token_file);
    let agent = bash_agent(dir.path(), &mock.url(), &tools);
    let mut cmd = std::process::Command::new(bin());
    cmd.arg("serve")
        .args(["--listen", "127.0.0.1:0", "--agent-file"])
        .arg(&agent)
        .arg("--store")
        .arg(sqlite_in(dir.path()))
        .arg("--owner-token-file")
        .arg(&token_file)
        .env_clear()
        .env("PATH", std::env::var("PATH").unwrap_or_default());
    let server = bindery_tests::sidecar::Sidecar::spawn(cmd, &dir.path().join("logs"), TOKEN);
    let api = bindery_tests::sidecar::Api::new(&server.url);
    let r = api
        .call(
            "POST",
            "/v1/sessions?wait=true",
            Some(TOKEN),
            Some(&json!({"agent": "a", "prompt": "peek"})),
        )
        .await;
    assert_eq!(r.status, 201, "{}", r.text);
    let agents = api.call("GET", "/v1/agents", Some(TOKEN), None).await;
    assert!(!agents.text.contains(TOKEN), "{}", agents.text);
    let text = serde_json::to_string(&mock.requests()).unwrap();
    assert!(text.contains("owner <secret:"), "{text}");
    assert!(!text.contains(TOKEN), "the model saw the token: {text}");
}

/// A script's `describe` that reads the model's key file (as the server's
/// user it can) shows no key: every agent's model key is known to the
/// listings' guard before any tool loads.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_describe_that_reads_the_model_key_shows_no_key() {
    const MODEL_KEY: &str = "sk-MODELKEY-canary-7b3e";
    let dir = tempfile::tempdir().unwrap();
    let key_file = dir.path().join("model.key");
    std::fs::write(&key_file, MODEL_KEY).unwrap();
    let tools = dir.path().join("tools");
    std::fs::create_dir_all(&tools).unwrap();
    peek_tool(&tools, "key", &key_file);
    let agent = dir.path().join("a.yaml");
    std::fs::write(
        &agent,
        format!(
            "apiVersion: bindery.dev/v1alpha1\nkind: Agent\nmetadata: {{name: a}}\nspec:\n  model: {{url: \"http://127.0.0.1:9/v1\", name: m, apiKey: {{file: \"{}\"}}}}\n  toolboxes:\n    - bash: {{directory: \"{}\"}}\n",
            key_file.display(),
            tools.display()
        ),
    )
    .unwrap();
    let (code, described) =
        sidecar(&["describe", "--agent-file", &agent.display().to_string()]).await;
    assert_eq!(code, 0, "{described}");
    assert!(
        described.contains("key <secret:a model key>"),
        "{described}"
    );
    assert!(!described.contains(MODEL_KEY), "{described}");
}

/// A bash tool `peek` whose `describe` says `LABEL <what file holds>`.
fn peek_tool(tools: &std::path::Path, label: &str, file: &std::path::Path) {
    executable(
        &tools.join("peek"),
        &format!(
            "#!/usr/bin/env bash\nif [[ \"${{1:-}}\" == describe ]]; then\n  echo '{{\"slug\": \"peek\", \"description\": \"{label} '\"$(cat {})\"'\", \"args\": []}}'\n  exit 0\nfi\necho ok\n",
            file.display()
        ),
    );
}
