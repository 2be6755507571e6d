//! The server's own credentials (its tokens, its model keys, the trace
//! exporter's headers, any credential the platform put in its
//! environment) against a tool that looks for them and a model endpoint
//! that repeats them: none reaches a tool's process, the model, the store,
//! a view or the logs.

use std::os::unix::fs::PermissionsExt;

use crate::common::*;
use bindery_tests::mock_llm::{last_message, MockLlm, MockReply};
use serde_json::{json, Value};

const MODEL_KEY: &str = "sk-modelkey-CANARY-5678";
const OTEL: &str = "authorization=Bearer otel-canary-9999";
const AWS: &str = "aws-canary-7777-secret";

/// Every sink of a served run: the model's requests, the reply, the view,
/// the store and the logs.
fn sinks(dir: &std::path::Path, mock: &MockLlm, texts: &[&str]) -> Vec<u8> {
    let mut all = serde_json::to_vec(&mock.requests()).unwrap();
    for t in texts {
        all.extend_from_slice(t.as_bytes());
    }
    all.extend(raw_files(dir, "store.sqlite"));
    all.extend(raw_files(&dir.join("logs"), ""));
    all
}

/// A tool that prints its whole environment: the platform's credentials
/// in the server's environment are not in it, and a copy of the model key
/// under an innocent name is not either.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tool_is_given_none_of_the_servers_credentials() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(dir.path().join("logs")).unwrap();
    let tools = dir.path().join("tools");
    std::fs::create_dir_all(&tools).unwrap();
    let script = tools.join("show");
    std::fs::write(
        &script,
        "#!/usr/bin/env bash\nif [[ \"${1:-}\" == describe ]]; then echo '{\"slug\": \"show\", \"description\": \"Shows.\", \"args\": []}'; exit 0; fi\nenv\necho \"copy=$INNOCENT\"\n",
    )
    .unwrap();
    std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).unwrap();
    let mock = MockLlm::start(|req: &Value| match last_message(req)["role"].as_str() {
        Some("tool") => MockReply::text("seen"),
        _ => MockReply::tool_call("bash_show", json!({})),
    })
    .await;
    let agent = dir.path().join("a.yaml");
    std::fs::write(
        &agent,
        format!(
            "apiVersion: bindery.dev/v1alpha1\nkind: Agent\nmetadata: {{name: a}}\nspec:\n  model: {{url: \"{}\", name: m, apiKey: {{env: LLMCRED}}}}\n  toolboxes:\n    - bash: {{directory: \"{}\"}}\n",
            mock.url(),
            tools.display()
        ),
    )
    .unwrap();
    let env = [
        ("LLMCRED", MODEL_KEY),
        ("INNOCENT", MODEL_KEY),
        ("OTEL_EXPORTER_OTLP_HEADERS", OTEL),
        ("AWS_SECRET_ACCESS_KEY", AWS),
        ("APP_REGION", "eu-west"),
    ];
    let (sidecar, api) = serve(&agent, &sqlite_in(dir.path()), &[], &env, dir.path());
    let id = new_session(&api, json!({"agent": "a"})).await;
    let r = message_waited(&api, &id, "show").await;
    let out = last_tool_output(&r);
    assert!(out.contains("APP_REGION=eu-west"), "{out}");
    for gone in [
        "LLMCRED=",
        "INNOCENT=",
        "OTEL_EXPORTER_OTLP_HEADERS=",
        "AWS_SECRET_ACCESS_KEY=",
    ] {
        assert!(!out.contains(gone), "{gone} reached the tool:\n{out}");
    }
    drop(sidecar);
    let all = sinks(dir.path(), &mock, &[&r.text]);
    for secret in [MODEL_KEY, "otel-canary-9999", AWS] {
        assert!(!contains(&all, secret), "{secret} reached a sink");
    }
    mock.shutdown().await;
}

/// A model endpoint that repeats the key it was sent in its error: the
/// run fails, and the failure's text (in the view, the store, the logs)
/// holds no key.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_model_error_that_quotes_the_key_keeps_none_of_it() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(dir.path().join("logs")).unwrap();
    let mock = MockLlm::start(|_: &Value| {
        MockReply::status(
            400,
            format!(
                r#"{{"error": {{"message": "Incorrect API key provided: Bearer {MODEL_KEY}"}}}}"#
            ),
        )
    })
    .await;
    let agent = dir.path().join("a.yaml");
    std::fs::write(
        &agent,
        format!(
            "apiVersion: bindery.dev/v1alpha1\nkind: Agent\nmetadata: {{name: a}}\nspec:\n  model: {{url: \"{}\", name: m, apiKey: {{env: LLMCRED}}}}\n",
            mock.url()
        ),
    )
    .unwrap();
    let (sidecar, api) = serve(
        &agent,
        &sqlite_in(dir.path()),
        &[],
        &[("LLMCRED", MODEL_KEY)],
        dir.path(),
    );
    let id = new_session(&api, json!({"agent": "a"})).await;
    let r = message_waited(&api, &id, "hi").await;
    assert_eq!(r.json["status"], "failed", "{}", r.text);
    assert!(r.text.contains("Incorrect API key"), "{}", r.text);
    let view = api
        .call("GET", &format!("/v1/sessions/{id}"), Some(OWNER), None)
        .await;
    drop(sidecar);
    let mut all = raw_files(dir.path(), "store.sqlite");
    all.extend(raw_files(&dir.path().join("logs"), ""));
    all.extend(r.text.as_bytes());
    all.extend(view.text.as_bytes());
    assert!(!contains(&all, MODEL_KEY), "the key reached a sink");
    mock.shutdown().await;
}

/// Found by the attack review on the real node: a parameter's value
/// command (an Agent's `default: {command: …}`) was started with the
/// server's whole environment, the tenant's values (`BINDERY_PARAM_*`),
/// the MCP client token and the model key among them. It gets what a
/// bash tool's call gets: none of them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_parameters_value_command_is_given_none_of_the_servers_credentials() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(dir.path().join("logs")).unwrap();
    let seen = dir.path().join("command-env");
    let agent = dir.path().join("a.yaml");
    std::fs::write(
        &agent,
        format!(
            "apiVersion: bindery.dev/v1alpha1\nkind: Agent\nmetadata: {{name: a}}\nspec:\n  model: {{url: \"http://127.0.0.1:9/v1\", name: m, apiKey: {{env: LLMCRED}}}}\n  parameters:\n    - {{name: billing_token, secret: true}}\n    - name: probe\n      required: false\n      default: {{command: [bash, -c, 'env > \"{}\"; echo probed']}}\n",
            seen.display()
        ),
    )
    .unwrap();
    let env = [
        ("LLMCRED", MODEL_KEY),
        ("BINDERY_PARAM_BILLING_TOKEN", "billing-canary-3a7f21"),
        ("BINDERY_MCP_CLIENT_TOKEN", "mcp-client-canary-66e0b4"),
        ("AWS_SECRET_ACCESS_KEY", AWS),
        ("INNOCENT", MODEL_KEY),
    ];
    let (_sidecar, _api) = serve(&agent, &sqlite_in(dir.path()), &[], &env, dir.path());
    until("the value command ran", PATIENCE, || seen.exists()).await;
    let got = std::fs::read_to_string(&seen).unwrap();
    assert!(got.contains("PATH="), "{got}");
    for value in [
        MODEL_KEY,
        "billing-canary-3a7f21",
        "mcp-client-canary-66e0b4",
        AWS,
    ] {
        assert!(
            !got.contains(value),
            "{value} in the command's environment:\n{got}"
        );
    }
}
