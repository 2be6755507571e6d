//! Stored agents through the real server, on both stores: the owner puts
//! an agent (Bindery's form or agents-exe's), it is checked as a file
//! is, listed with its source, started as a session, kept across a
//! restart, and deleted. Who may not: a session-token holder, anyone
//! without a token, a definition that would run code on the server or
//! read its values, a slug of the server's files, and any server not
//! started with `--stored-agents`.

use std::process::Command;

use crate::common::*;
use bindery_tests::mock_llm::{last_message, MockReply};
use bindery_tests::sidecar::Api;
use serde_json::{json, Value};

/// Requests from the stored agent (its system prompt says so) get a
/// plain answer; the file agent's are the usual invoices script.
fn script(req: &Value) -> MockReply {
    let system = req["messages"][0]["content"].as_str().unwrap_or("");
    if system.contains("stored helpdesk") {
        let last = last_message(req);
        return MockReply::text(format!(
            "helpdesk: {}",
            last["content"].as_str().unwrap_or("")
        ));
    }
    tool_then_answer(req)
}

fn helpdesk(model: &str) -> String {
    format!(
        r#"apiVersion: bindery.dev/v1alpha1
kind: Agent
metadata: {{name: helpdesk}}
spec:
  announce: answers support questions
  model: {{url: "{model}", name: mock-model}}
  systemPrompt: You are the stored helpdesk.
  parameters:
    - {{name: customer, scope: session}}
  toolboxes:
    - builtin: {{name: clock, capabilities: [date]}}
    - deferred:
        tools: [{{name: open_ticket, description: Opens a ticket}}]
"#
    )
}

/// The last turn's text of a session view.
fn answer(session: &Value) -> &str {
    session["session"]["turns"]
        .as_array()
        .and_then(|t| t.last())
        .and_then(|t| t["content"].as_str())
        .unwrap_or("")
}

async fn put(
    api: &Api,
    slug: &str,
    token: Option<&str>,
    body: &str,
) -> bindery_tests::sidecar::Reply {
    raw(
        api,
        "PUT",
        &format!("/v1/agents/{slug}"),
        token,
        body,
        Some("application/yaml"),
    )
    .await
}

/// The definitions a stored agent may not have, and words of each refusal.
fn refused(model: &str) -> Vec<(String, &'static str)> {
    let doc = |spec: &str| {
        format!(
            "apiVersion: bindery.dev/v1alpha1\nkind: Agent\nmetadata: {{name: bad}}\nspec:\n  model: {{url: \"{model}\", name: m}}\n{spec}"
        )
    };
    vec![
        (
            doc("  toolboxes:\n    - bash: {script: /bin/true}\n"),
            "a bash toolbox runs executables on the server",
        ),
        (
            doc("  toolboxes:\n    - mcp: {name: m, command: [/bin/sh]}\n"),
            "an MCP server started as a program runs on the server",
        ),
        (
            doc("  toolboxes:\n    - mcp: {name: m, url: \"http://127.0.0.1:9/mcp\", headers: {Authorization: {literal: Bearer x}}}\n"),
            "`headers` would be kept in clear in the store",
        ),
        (
            doc("  toolboxes:\n    - sqlite: {name: s, path: /etc/passwd}\n"),
            "an SQLite toolbox reads a file on the server",
        ),
        (
            doc("  toolboxes:\n    - openapi: {spec: /etc/api.json, baseUrl: \"http://127.0.0.1:9\"}\n"),
            "`spec` must be an http(s) URL",
        ),
        (
            doc("  toolboxes:\n    - builtin: {name: e, capabilities: [env-vars], envVars: [HOME]}\n"),
            "capability `env-vars` would show the server's environment",
        ),
        (
            doc("  toolboxes:\n    - builtin: {name: f, capabilities: [attach-file], fileSandbox: {predicate: alwaysAllow}}\n"),
            "capability `attach-file` would read the server's files",
        ),
        (
            doc("  parameters:\n    - {name: token, secret: true, scope: session, default: {env: BINDERY_OWNER_TOKEN}}\n"),
            "its default is read from the server (env BINDERY_OWNER_TOKEN)",
        ),
        (
            doc("  parameters:\n    - {name: billing_token, scope: process}\n"),
            "process scope would read the server's own values",
        ),
        (
            doc("  parameters:\n    - {name: key, secret: true, scope: session, default: {value: abc}}\n"),
            "a secret's value may not be written into a stored agent",
        ),
        (
            doc("  helpers:\n    - {path: ../invoices.yaml}\n"),
            "a stored agent has none",
        ),
    ]
}

/// Everything a stored agent goes through on the store at `store`.
async fn stored_agents_on(store: String) {
    let mut w = World::new(script).await;
    w.store = store;
    let model = w.mock.url();
    let (sidecar, api) = w.start(&["--stored-agents"], &[]);

    // Who may not: no token, a session-token holder.
    let r = put(&api, "helpdesk", None, &helpdesk(&model)).await;
    assert_eq!(r.status, 401, "{}", r.text);
    let created = create(
        &api,
        json!({"agent": "invoices", "params": valid_params(), "session_token": true}),
    )
    .await;
    assert_eq!(created.status, 201, "{}", created.text);
    let session_token = created.json["session_token"].as_str().unwrap().to_string();
    let r = put(&api, "helpdesk", Some(&session_token), &helpdesk(&model)).await;
    assert!(matches!(r.status, 401 | 403), "{} {}", r.status, r.text);
    let r = api
        .call("DELETE", "/v1/agents/helpdesk", Some(&session_token), None)
        .await;
    assert!(matches!(r.status, 401 | 403), "{} {}", r.status, r.text);

    // A definition nested 40,000 levels deep is refused before any parser
    // sees it, and a session's request is answered meanwhile.
    for deep in ["[".repeat(40_000), "- ".repeat(40_000) + "x"] {
        let (r, view) = tokio::join!(
            put(&api, "deep", Some(OWNER), &deep),
            api.call("GET", "/healthz", None, None)
        );
        assert_eq!(r.status, 400, "{}", r.text);
        assert!(
            r.text.contains("nests deeper than 128 levels"),
            "{}",
            r.text
        );
        assert_eq!(view.status, 200);
    }

    // Kept, then replaced.
    let r = put(&api, "helpdesk", Some(OWNER), &helpdesk(&model)).await;
    assert_eq!(r.status, 201, "{}", r.text);
    assert_eq!(r.json["agent"]["source"], "store");
    assert_eq!(r.json["agent"]["tools"], json!(["io_clock", "open_ticket"]));
    let r = put(&api, "helpdesk", Some(OWNER), &helpdesk(&model)).await;
    assert_eq!(r.status, 200, "{}", r.text);

    // agents-exe's form too.
    let exe = json!({"tag": "OpenAIAgentDescription", "contents": {
        "slug": "faq", "modelUrl": model, "modelName": "m",
        "systemPrompt": ["You answer FAQs."],
        "builtinToolboxes": [{"tag": "SystemToolbox", "contents": {"name": "system", "capabilities": ["date"], "envVarFilter": null}}]}});
    let r = raw(
        &api,
        "PUT",
        "/v1/agents/faq",
        Some(OWNER),
        &exe.to_string(),
        Some("application/json"),
    )
    .await;
    assert_eq!(r.status, 201, "{}", r.text);

    // A file agent's slug is not shadowed.
    let r = put(
        &api,
        "invoices",
        Some(OWNER),
        &helpdesk(&model).replace("helpdesk}", "invoices}"),
    )
    .await;
    assert_eq!(
        error_of(&r),
        refusal(409, "agent_exists", &[]),
        "{}",
        r.text
    );
    let r = api
        .call("DELETE", "/v1/agents/invoices", Some(OWNER), None)
        .await;
    assert_eq!(error_of(&r).0, 409, "{}", r.text);

    // What would run code or read the server's values is refused, naming why.
    for (doc, says) in refused(&model) {
        let r = put(&api, "bad", Some(OWNER), &doc).await;
        assert_eq!(
            error_of(&r),
            refusal(422, "invalid_agent", &[]),
            "{doc}\n{}",
            r.text
        );
        assert!(
            r.json["message"].as_str().unwrap().contains(says),
            "{says}\nnot in {}",
            r.text
        );
    }
    // A fallback's key neither (review 68: its `command` ran as the PUT
    // loaded the agent, and the server's env key went to the client's URL).
    let pwned = w.dir.path().join("pwned");
    let doc = format!(
        "apiVersion: bindery.dev/v1alpha1\nkind: Agent\nmetadata: {{name: bad}}\nspec:\n  model:\n    url: \"{model}\"\n    name: m\n    fallbacks:\n      - {{url: \"{model}\", name: f, apiKey: {{command: [sh, -c, \"touch {}; echo k\"]}}}}\n      - {{url: \"{model}\", name: g, apiKey: {{env: BINDERY_OWNER_TOKEN}}}}\n",
        pwned.display()
    );
    let r = put(&api, "bad", Some(OWNER), &doc).await;
    assert_eq!(
        error_of(&r),
        refusal(422, "invalid_agent", &[]),
        "{}",
        r.text
    );
    let said = r.json["message"].as_str().unwrap();
    assert!(
        said.contains("model fallback 1 `apiKey`") && said.contains("model fallback 2 `apiKey`"),
        "{said}"
    );
    assert!(!pwned.exists(), "the fallback's key command ran");
    // A definition a file could not have either: the same words as `check`.
    let typo = helpdesk(&model)
        .replace("helpdesk}", "bad}")
        .replace("announce:", "anounce:");
    let r = put(&api, "bad", Some(OWNER), &typo).await;
    assert_eq!(error_of(&r).0, 422, "{}", r.text);
    let file = w.dir.path().join("bad.yaml");
    std::fs::write(&file, &typo).unwrap();
    let out = Command::new(bin())
        .args(["check", "--agent-file"])
        .arg(&file)
        .output()
        .unwrap();
    let check = String::from_utf8_lossy(&out.stderr);
    let said = check
        .lines()
        .find_map(|l| {
            l.split_once(&format!("{}: ", file.display()))
                .map(|(_, m)| m.to_string())
        })
        .unwrap_or_else(|| panic!("{check}"));
    assert!(
        r.json["message"].as_str().unwrap().contains(&said),
        "{said}\nnot in {}",
        r.text
    );
    let r = put(&api, "other", Some(OWNER), &helpdesk(&model)).await;
    assert!(
        r.json["message"]
            .as_str()
            .unwrap_or("")
            .contains("its name must be the slug"),
        "{}",
        r.text
    );
    assert_eq!(
        api.call("GET", "/v1/agents/bad", Some(OWNER), None)
            .await
            .status,
        404
    );

    // Listed with its source; started as a session.
    let list = api.call("GET", "/v1/agents", Some(OWNER), None).await;
    let sources: Vec<(String, String)> = list.json["agents"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| {
            (
                a["slug"].as_str().unwrap().into(),
                a["source"].as_str().unwrap().into(),
            )
        })
        .collect();
    let want = |s: &str, src: &str| (s.to_string(), src.to_string());
    assert_eq!(
        sources,
        [
            want("invoices", "file"),
            want("faq", "store"),
            want("helpdesk", "store")
        ]
    );
    let r = api
        .call(
            "POST",
            "/v1/sessions?wait=true",
            Some(OWNER),
            Some(
                &json!({"agent": "helpdesk", "prompt": "my printer", "params": {"customer": "c1"}}),
            ),
        )
        .await;
    assert_eq!(r.status, 201, "{}", r.text);
    let id = r.json["session_id"].as_str().unwrap().to_string();
    assert_eq!(answer(&r.json), "helpdesk: my printer", "{}", r.text);

    // Kept across a restart: listed, and its session goes on.
    drop(sidecar);
    let (sidecar, api) = w.start(&["--stored-agents"], &[]);
    let r = api
        .call("GET", "/v1/agents/helpdesk", Some(OWNER), None)
        .await;
    assert_eq!(
        (r.status, r.json["source"].clone()),
        (200, json!("store")),
        "{}",
        r.text
    );
    let r = message_waited(&api, &id, "still broken").await;
    assert_eq!(answer(&r.json), "helpdesk: still broken", "{}", r.text);

    // Deleted: gone, its session can no longer run.
    let r = api
        .call("DELETE", "/v1/agents/helpdesk", Some(OWNER), None)
        .await;
    assert_eq!(r.status, 204, "{}", r.text);
    assert_eq!(
        api.call("GET", "/v1/agents/helpdesk", Some(OWNER), None)
            .await
            .status,
        404
    );
    let r = api
        .call("DELETE", "/v1/agents/helpdesk", Some(OWNER), None)
        .await;
    assert_eq!(r.status, 404, "{}", r.text);
    let r = create(&api, json!({"agent": "helpdesk"})).await;
    assert_eq!(r.status, 404, "{}", r.text);
    drop(sidecar);

    // Without the flag, nothing is kept over the API.
    let (_sidecar, api) = w.start(&[], &[]);
    let r = put(&api, "helpdesk", Some(OWNER), &helpdesk(&model)).await;
    assert_eq!(
        error_of(&r),
        refusal(403, "stored_agents_disabled", &[]),
        "{}",
        r.text
    );
    let list = api.call("GET", "/v1/agents", Some(OWNER), None).await;
    assert_eq!(
        list.json["agents"].as_array().unwrap().len(),
        1,
        "{}",
        list.text
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stored_agents_on_sqlite() {
    let dir = tempfile::tempdir().unwrap();
    stored_agents_on(sqlite_in(dir.path())).await;
}

#[cfg(feature = "postgres-tests")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stored_agents_on_postgres() {
    let pg = bindery_tests::postgres::Postgres::start();
    pg.create_database("stored");
    stored_agents_on(pg.url("stored")).await;
    let rows = pg.sql("stored", "SELECT slug FROM bindery_agents ORDER BY slug");
    assert!(rows.contains("faq") && !rows.contains("helpdesk"), "{rows}");
}
