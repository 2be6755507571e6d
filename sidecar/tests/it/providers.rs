//! Providers spoken natively, against their own SDK's types: the server
//! (the real binary, over TCP) serves an agent whose `spec.model.provider`
//! is `anthropic`, and its model is `tests/providers/mock.py`, which
//! checks each request with the `anthropic` SDK's request types and
//! Anthropic's documented rules (ids, results after their calls, thinking
//! sent back with its signature) and answers with the SDK's response
//! models, whole or streamed in Anthropic's event order.

use bindery_tests::fixtures::{invoices_agent_file, INVOICES_PARAMETERS};
use bindery_tests::provider_mock::{IdentityMock, ProviderMock};
use serde_json::{json, Value};

use crate::common::*;
use bindery_tests::sidecar::{Api, Sidecar};

const KEY: &str = "sk-ant-canary-5e1f";
const TOOL: &str = "bash_query-invoices";

/// The invoices agent on `mock`, in Anthropic's API, thinking within
/// 2048 of 4096 tokens, priced with Anthropic's cache prices.
fn anthropic_agent(dir: &std::path::Path, mock: &ProviderMock) -> std::path::PathBuf {
    invoices_on(
        dir,
        mock,
        "    provider: anthropic
    name: claude-test
    apiKey: {env: ANTHROPIC_API_KEY}
    maxTokens: 4096
    thinking: {budgetTokens: 2048}
    pricing: {inputPerMillion: 3, outputPerMillion: 15, cacheReadPerMillion: 0.3, cacheWritePerMillion: 3.75}
",
    )
}

/// The invoices agent whose model is at `mock`, with `model`'s lines
/// (indented four spaces) besides its `url`.
fn invoices_on(dir: &std::path::Path, mock: &ProviderMock, model: &str) -> std::path::PathBuf {
    let path = invoices_agent_file(dir, &mock.url(), INVOICES_PARAMETERS, "");
    let written = std::fs::read_to_string(&path).unwrap();
    let line = format!("  model: {{url: \"{}\", name: mock-model}}\n", mock.url());
    assert!(written.contains(&line), "{written}");
    let text = written.replace(
        &line,
        &format!("  model:\n    url: \"{}\"\n{model}", mock.url()),
    );
    std::fs::write(&path, text).unwrap();
    path
}

/// A call of the invoices tool for overdue ones, thinking first, then the
/// answer reading the cache the first request wrote.
fn two_turns() -> Value {
    json!([
        {"status": 429, "retry_after": "1"},
        {"thinking": "The user wants overdue invoices; I should query them.",
         "text": "Let me look.",
         "calls": [{"id": "toolu_01", "name": TOOL, "input": {"status": "overdue"}},
                   {"id": "toolu_02", "name": TOOL, "input": {"status": "open"}}],
         "usage": {"input": 20, "output": 10, "cache_write": 1000}},
        {"text": "INV-1002 is overdue.",
         "usage": {"input": 30, "output": 8, "cache_read": 1000}}
    ])
}

/// A session of the invoices agent in `dir` asked which invoices are
/// overdue, its run followed to its end: the server, its API, the
/// session's id and the run's events.
async fn ask_overdue(
    agent: &std::path::Path,
    dir: &std::path::Path,
    extra: &[&str],
    env: &[(&str, &str)],
) -> (Sidecar, Api, String, Vec<bindery_tests::sidecar::SseEvent>) {
    let store = sqlite_in(dir);
    std::fs::create_dir_all(dir.join("logs")).unwrap();
    let (sidecar, api) = serve(agent, &store, extra, env, dir);
    let created = api
        .call(
            "POST",
            "/v1/sessions",
            Some(OWNER),
            Some(&json!({"agent": "invoices", "params": {"tenant": "acme-corp", "billing_token": CANARY}})),
        )
        .await;
    assert_eq!(created.status, 201, "{}", created.text);
    let id = created.json["session_id"].as_str().unwrap().to_string();
    let (_, events) = api
        .events(&format!("/v1/sessions/{id}/events"), Some(OWNER), None)
        .await;
    let mut events = events.unwrap();
    let r = api
        .call(
            "POST",
            &format!("/v1/sessions/{id}/messages"),
            Some(OWNER),
            Some(&json!({"prompt": "which invoices are overdue?"})),
        )
        .await;
    assert_eq!(r.status, 202, "{}", r.text);
    let seen = events
        .until("run_finished", std::time::Duration::from_secs(60))
        .await;
    (sidecar, api, id, seen)
}

async fn converse(stream: bool) {
    let mock = ProviderMock::start("anthropic", KEY, &two_turns());
    let dir = tempfile::tempdir().unwrap();
    let agent = anthropic_agent(dir.path(), &mock);
    let (sidecar, api, id, seen) = ask_overdue(
        &agent,
        dir.path(),
        stream_flag(stream),
        &[("ANTHROPIC_API_KEY", KEY)],
    )
    .await;

    // Three requests (the 429 honoured with its retry-after), each one
    // the SDK's types and Anthropic's rules take, with the key in
    // x-api-key only.
    let requests = mock.valid_requests();
    assert_eq!(requests.len(), 3, "{requests:#?}");
    for r in &requests {
        assert_eq!(r["key_ok"], true);
        assert_eq!(r["stream"], stream);
        let body = r["body"].to_string();
        assert!(
            !body.contains(CANARY) && !body.contains("acme-corp"),
            "{body}"
        );
        // The bound arguments are not in the schema the model sees.
        let tool = r["body"]["tools"]
            .as_array()
            .unwrap()
            .iter()
            .find(|t| t["name"] == TOOL)
            .unwrap();
        assert!(
            tool["input_schema"]["properties"]
                .get("tenant_id")
                .is_none(),
            "{tool}"
        );
        assert!(
            tool["input_schema"]["properties"].get("token").is_none(),
            "{tool}"
        );
        assert_eq!(
            r["body"]["thinking"],
            json!({"type": "enabled", "budget_tokens": 2048})
        );
        assert_eq!(r["body"]["system"][0]["cache_control"]["type"], "ephemeral");
    }
    // The second turn: the thinking block first, as it came (the mock
    // checks its signature), the two calls, then one user turn with both
    // results.
    let messages = requests[2]["body"]["messages"].as_array().unwrap();
    let turn = messages[1]["content"].as_array().unwrap();
    assert_eq!(turn[0]["type"], "thinking");
    assert_eq!(
        turn[0]["thinking"],
        "The user wants overdue invoices; I should query them."
    );
    let kinds: Vec<&str> = turn.iter().map(|b| b["type"].as_str().unwrap()).collect();
    assert_eq!(kinds, ["thinking", "text", "tool_use", "tool_use"]);
    let results = messages[2]["content"].as_array().unwrap();
    assert_eq!(results[0]["tool_use_id"], "toolu_01");
    assert!(
        results[0]["content"].as_str().unwrap().contains("INV-1002"),
        "{results:?}"
    );
    assert_eq!(results[1]["tool_use_id"], "toolu_02");

    // What the user sees: the answer, never the thinking.
    let session = api
        .call("GET", &format!("/v1/sessions/{id}"), Some(OWNER), None)
        .await;
    let turns = session.json["session"]["turns"].as_array().unwrap();
    assert_eq!(turns.last().unwrap()["content"], "INV-1002 is overdue.");
    assert!(!session.text.contains("I should query"), "{}", session.text);
    let raw_events: String = seen.iter().map(|e| e.data.clone()).collect();
    assert!(!raw_events.contains("I should query"), "{raw_events}");
    if stream {
        assert!(seen.iter().any(|e| e.event == "delta"), "{seen:?}");
    }

    // Usage and cost count the cache: 20+1000 and 30+1000 prompt tokens,
    // the writes at 3.75, the reads at 0.3 per million.
    let usage = api.call("GET", "/v1/usage", Some(OWNER), None).await;
    let row = &usage.json["rows"][0];
    assert_eq!(row["prompt_tokens"], 2050, "{}", usage.text);
    assert_eq!(row["completion_tokens"], 18, "{}", usage.text);
    assert_eq!(row["cache_read_tokens"], 1000, "{}", usage.text);
    assert_eq!(row["cache_write_tokens"], 1000, "{}", usage.text);
    let cost = row["cost"].as_f64().unwrap();
    let expected = (50.0 * 3.0 + 1000.0 * 3.75 + 1000.0 * 0.3 + 18.0 * 15.0) / 1e6;
    assert!((cost - expected).abs() < 1e-9, "{cost} != {expected}");

    let logs = sidecar.logs();
    assert!(!logs.contains(KEY) && !logs.contains(CANARY), "{logs}");
    assert!(!std::fs::read(dir.path().join("store.sqlite"))
        .map(|b| contains(&b, KEY))
        .unwrap_or(false));
}

#[tokio::test]
async fn a_streamed_conversation_with_two_calls_and_thinking_is_what_the_sdk_takes() {
    converse(true).await;
}

#[tokio::test]
async fn a_whole_reply_conversation_with_two_calls_and_thinking_is_what_the_sdk_takes() {
    converse(false).await;
}

/// The invoices agent on `mock`, in chat completions (the default
/// provider), with a reply bound and the cache's read price.
fn openai_agent(dir: &std::path::Path, mock: &ProviderMock) -> std::path::PathBuf {
    invoices_on(
        dir,
        mock,
        "    name: gpt-test
    apiKey: {env: OPENAI_API_KEY}
    maxTokens: 4096
    pricing: {inputPerMillion: 2, outputPerMillion: 8, cacheReadPerMillion: 0.5}
",
    )
}

async fn converse_openai(stream: bool) {
    let script = json!([
        {"status": 429, "retry_after": "1"},
        {"text": "Let me look.",
         "calls": [{"id": "call_01", "name": TOOL, "input": {"status": "overdue"}},
                   {"id": "call_02", "name": TOOL, "input": {"status": "open"}}],
         "usage": {"input": 20, "output": 10}},
        {"text": "INV-1002 is overdue.",
         "usage": {"input": 30, "output": 8, "cache_read": 1000}}
    ]);
    let mock = ProviderMock::start("openai", KEY, &script);
    let dir = tempfile::tempdir().unwrap();
    let agent = openai_agent(dir.path(), &mock);
    let (sidecar, api, id, _) = ask_overdue(
        &agent,
        dir.path(),
        stream_flag(stream),
        &[("OPENAI_API_KEY", KEY)],
    )
    .await;

    let requests = mock.valid_requests();
    assert_eq!(requests.len(), 3, "{requests:#?}");
    for r in &requests {
        assert_eq!(r["key_ok"], true);
        assert_eq!(r["stream"], stream);
        assert_eq!(r["body"]["max_completion_tokens"], 4096);
        let body = r["body"].to_string();
        assert!(
            !body.contains(CANARY) && !body.contains("acme-corp"),
            "{body}"
        );
    }
    let messages = requests[2]["body"]["messages"].as_array().unwrap();
    let roles: Vec<&str> = messages
        .iter()
        .map(|m| m["role"].as_str().unwrap())
        .collect();
    assert_eq!(roles, ["system", "user", "assistant", "tool", "tool"]);

    let session = api
        .call("GET", &format!("/v1/sessions/{id}"), Some(OWNER), None)
        .await;
    let turns = session.json["session"]["turns"].as_array().unwrap();
    assert_eq!(turns.last().unwrap()["content"], "INV-1002 is overdue.");

    // OpenAI's prompt_tokens hold the cached ones: 20 and 1030.
    let usage = api.call("GET", "/v1/usage", Some(OWNER), None).await;
    let row = &usage.json["rows"][0];
    assert_eq!(row["prompt_tokens"], 1050, "{}", usage.text);
    let cost = row["cost"].as_f64().unwrap();
    let expected = (50.0 * 2.0 + 1000.0 * 0.5 + 18.0 * 8.0) / 1e6;
    assert!((cost - expected).abs() < 1e-9, "{cost} != {expected}");
    assert!(!sidecar.logs().contains(KEY));
}

#[tokio::test]
async fn chat_completions_streamed_are_what_the_openai_sdk_takes() {
    converse_openai(true).await;
}

#[tokio::test]
async fn chat_completions_whole_are_what_the_openai_sdk_takes() {
    converse_openai(false).await;
}

fn stream_flag(stream: bool) -> &'static [&'static str] {
    if stream {
        &[]
    } else {
        &["--no-stream"]
    }
}

/// The model overloaded past its retries: its fallback, another provider
/// with its own key, answers; the switch is an event and a metric, and
/// the request is counted and priced as the fallback's.
#[tokio::test]
async fn an_overloaded_model_falls_back_to_another_provider() {
    const FALLBACK_KEY: &str = "sk-fallback-canary-2b7d";
    let primary = ProviderMock::start(
        "anthropic",
        KEY,
        &json!([{"status": 529}, {"status": 529}, {"status": 529}, {"status": 529}]),
    );
    let fallback = ProviderMock::start(
        "openai",
        FALLBACK_KEY,
        &json!([
            {"calls": [{"id": "call_01", "name": TOOL, "input": {"status": "overdue"}}],
             "usage": {"input": 100, "output": 10}},
            {"text": "INV-1002 is overdue.", "usage": {"input": 200, "output": 20}}
        ]),
    );
    let dir = tempfile::tempdir().unwrap();
    let agent = anthropic_agent(dir.path(), &primary);
    let text = std::fs::read_to_string(&agent).unwrap().replace(
        "    pricing: {inputPerMillion: 3,",
        &format!(
            "    fallbacks:
      - {{url: \"{}\", name: gpt-test, apiKey: {{env: OPENAI_API_KEY}},
         pricing: {{inputPerMillion: 1, outputPerMillion: 2}}}}
    pricing: {{inputPerMillion: 3,",
            fallback.url()
        ),
    );
    std::fs::write(&agent, text).unwrap();
    let (sidecar, api, id, seen) = ask_overdue(
        &agent,
        dir.path(),
        &["--llm-retries", "1"],
        &[("ANTHROPIC_API_KEY", KEY), ("OPENAI_API_KEY", FALLBACK_KEY)],
    )
    .await;

    // Each model request asked the primary (and its one retry), then the
    // fallback, with its own key.
    assert_eq!(primary.valid_requests().len(), 4);
    let asked = fallback.valid_requests();
    assert_eq!(asked.len(), 2);
    assert!(asked.iter().all(|r| r["key_ok"] == true));
    // The fallback is chat completions: no thinking, no Anthropic fields.
    assert!(asked[0]["body"].get("thinking").is_none());
    let switches: Vec<Value> = seen
        .iter()
        .filter(|e| e.event == "model_fallback")
        .map(|e| serde_json::from_str(&e.data).unwrap())
        .collect();
    assert_eq!(switches.len(), 2, "{seen:?}");
    assert_eq!(
        switches[0],
        json!({"from": "claude-test", "to": "gpt-test", "error": "HTTP 529 after 2 attempts"})
    );
    let session = api
        .call("GET", &format!("/v1/sessions/{id}"), Some(OWNER), None)
        .await;
    let turns = session.json["session"]["turns"].as_array().unwrap();
    assert_eq!(turns.last().unwrap()["content"], "INV-1002 is overdue.");

    // Counted as the fallback's, at its prices.
    let usage = api
        .call("GET", "/v1/usage?group_by=model", Some(OWNER), None)
        .await;
    assert_eq!(usage.status, 200, "{}", usage.text);
    let rows = usage.json["rows"].as_array().unwrap();
    let row = |model: &str| rows.iter().find(|r| r["key"] == model).cloned();
    let served = row("gpt-test").expect("a row of the fallback's");
    assert_eq!(served["model_requests"], 2, "{rows:?}");
    assert_eq!(served["prompt_tokens"], 300);
    // The primary answered nothing: no request of its is counted (its
    // row, if any, holds the run's tool call alone).
    if let Some(primary) = row("claude-test") {
        assert_eq!(primary["model_requests"], 0, "{rows:?}");
        assert_eq!(primary["prompt_tokens"], 0, "{rows:?}");
    }
    let cost = served["cost"].as_f64().unwrap();
    assert!(
        (cost - (300.0 * 1.0 + 30.0 * 2.0) / 1e6).abs() < 1e-12,
        "{cost}"
    );
    let metrics = api.call("GET", "/metrics", None, None).await.text;
    assert_eq!(
        sample(
            &metrics,
            "bindery_model_fallbacks_total{agent=\"invoices\",from=\"claude-test\",to=\"gpt-test\"}"
        ),
        Some(2.0),
        "{metrics}"
    );
    let logs = sidecar.logs();
    assert!(!logs.contains(KEY) && !logs.contains(FALLBACK_KEY));
}

/// The model's thinking goes back to Anthropic only: a tool reading the
/// session (`read-session`) sees the turns without it, and so does the
/// model the tool's result is sent to, the session view and the events.
#[tokio::test]
async fn thinking_never_reaches_a_tool_that_reads_the_session() {
    const THOUGHT: &str = "SECRET-THOUGHT-9c1e";
    let mock = ProviderMock::start(
        "anthropic",
        KEY,
        &json!([
            {"thinking": THOUGHT,
             "calls": [{"id": "toolu_01", "name": "io_session", "input": {"capability": "read-session"}}]},
            {"text": "read."}
        ]),
    );
    let dir = tempfile::tempdir().unwrap();
    let agent = anthropic_agent(dir.path(), &mock);
    let mut text = std::fs::read_to_string(&agent).unwrap();
    text.push_str("    - builtin: {name: session, capabilities: [read-session]}\n");
    std::fs::write(&agent, text).unwrap();
    let (_sidecar, api, id, seen) =
        ask_overdue(&agent, dir.path(), &[], &[("ANTHROPIC_API_KEY", KEY)]).await;
    let requests = mock.valid_requests();
    assert_eq!(requests.len(), 2, "{requests:#?}");
    let messages = requests[1]["body"]["messages"].as_array().unwrap();
    // Sent back as Anthropic requires, first in its turn...
    assert_eq!(messages[1]["content"][0]["thinking"], THOUGHT);
    // ...and nowhere in what the tool read.
    let result = messages[2]["content"][0]["content"].to_string();
    assert!(
        result.contains("read-session") || result.contains("turns"),
        "{result}"
    );
    assert!(
        !result.contains(THOUGHT) && !result.contains("signature"),
        "{result}"
    );
    let view = api
        .call("GET", &format!("/v1/sessions/{id}"), Some(OWNER), None)
        .await;
    assert!(!view.text.contains(THOUGHT), "{}", view.text);
    let events: String = seen.iter().map(|e| e.data.clone()).collect();
    assert!(!events.contains(THOUGHT), "{events}");
}

/// A cost budget past its `downgrade.at` sends the run's next requests
/// to the cheaper fallback it names, not to the model: an event says so,
/// and usage shows each request under the model that answered it.
#[tokio::test]
async fn a_budget_near_its_cap_switches_to_the_cheaper_model_it_names() {
    const CHEAP_KEY: &str = "sk-cheap-canary-71aa";
    let primary = ProviderMock::start(
        "anthropic",
        KEY,
        // 200 in, 10 out at 3 and 15 a million: 0.00075, 7.5% of 0.01.
        &json!([{"thinking": "look it up",
                 "calls": [{"id": "toolu_01", "name": TOOL, "input": {"status": "overdue"}}],
                 "usage": {"input": 200, "output": 10}}]),
    );
    let cheap = ProviderMock::start(
        "openai",
        CHEAP_KEY,
        &json!([{"text": "INV-1002 is overdue.", "usage": {"input": 300, "output": 20}}]),
    );
    let dir = tempfile::tempdir().unwrap();
    let agent = anthropic_agent(dir.path(), &primary);
    let text = std::fs::read_to_string(&agent).unwrap().replace(
        "    pricing: {inputPerMillion: 3,",
        &format!(
            "    fallbacks:
      - {{url: \"{}\", name: gpt-cheap, apiKey: {{env: OPENAI_API_KEY}},
         pricing: {{inputPerMillion: 0.1, outputPerMillion: 0.4}}}}
    pricing: {{inputPerMillion: 3,",
            cheap.url()
        ),
    ) + "  budgets:\n    - {name: daily, cost: 0.01, per: 24h, downgrade: {at: 5, to: gpt-cheap}}\n";
    std::fs::write(&agent, text).unwrap();
    let (_sidecar, api, id, seen) = ask_overdue(
        &agent,
        dir.path(),
        &[],
        &[("ANTHROPIC_API_KEY", KEY), ("OPENAI_API_KEY", CHEAP_KEY)],
    )
    .await;

    // The first request went to the model, the second to the fallback
    // alone: the model was not asked again.
    assert_eq!(primary.valid_requests().len(), 1);
    let asked = cheap.valid_requests();
    assert_eq!(asked.len(), 1);
    assert!(asked[0]["key_ok"] == true && asked[0]["body"].get("thinking").is_none());
    let switches: Vec<Value> = seen
        .iter()
        .filter(|e| e.event == "model_downgrade")
        .map(|e| serde_json::from_str(&e.data).unwrap())
        .collect();
    assert_eq!(switches.len(), 1, "{seen:?}");
    assert_eq!(switches[0]["from"], "claude-test");
    assert_eq!(switches[0]["to"], "gpt-cheap");
    assert_eq!(switches[0]["budget"], "daily");
    assert_eq!(switches[0]["at"], 5);
    assert!(seen.iter().all(|e| e.event != "model_fallback"), "{seen:?}");
    let session = api
        .call("GET", &format!("/v1/sessions/{id}"), Some(OWNER), None)
        .await;
    let turns = session.json["session"]["turns"].as_array().unwrap();
    assert_eq!(turns.last().unwrap()["content"], "INV-1002 is overdue.");
    let usage = api
        .call("GET", "/v1/usage?group_by=model", Some(OWNER), None)
        .await;
    let rows = usage.json["rows"].as_array().unwrap();
    let row = |model: &str| rows.iter().find(|r| r["key"] == model).cloned().unwrap();
    assert_eq!(row("claude-test")["model_requests"], 1, "{rows:?}");
    assert_eq!(row("gpt-cheap")["model_requests"], 1, "{rows:?}");
    let cheap_cost = row("gpt-cheap")["cost"].as_f64().unwrap();
    assert!(
        (cheap_cost - (300.0 * 0.1 + 20.0 * 0.4) / 1e6).abs() < 1e-12,
        "{cheap_cost}"
    );
}

/// A provider spoken natively, as a test drives it: its mock, the agent's
/// model lines, and the environment the server is given.
struct Native {
    mock: ProviderMock,
    model: String,
    env: Vec<(&'static str, String)>,
    /// Whether the reply's usage counts the thinking apart (Responses,
    /// Gemini): the mock adds it to the output.
    counts_reasoning: bool,
}

const AWS_KEY_ID: &str = "AKIDBINDERYTEST";
const AWS_SECRET: &str = "aws-secret-canary-83f0";
const PRICES: &str = "    pricing: {inputPerMillion: 2, outputPerMillion: 8, cacheReadPerMillion: 0.5, reasoningPerMillion: 20}\n";

/// The two turns of `two_turns`, reading the cache on the second, with
/// four reasoning tokens in the first reply (and its thinking kept only
/// where the provider has it).
fn native_script(thinking: bool) -> Value {
    let mut script = json!([
        {"status": 429, "retry_after": "1"},
        {"thinking": "The user wants overdue invoices; I should query them.",
         "text": "Let me look.",
         "calls": [{"id": "toolu_01", "name": TOOL, "input": {"status": "overdue"}},
                   {"id": "toolu_02", "name": TOOL, "input": {"status": "open"}}],
         "usage": {"input": 20, "output": 10, "reasoning": 4}},
        {"text": "INV-1002 is overdue.",
         "usage": {"input": 30, "output": 8, "cache_read": 1000}}
    ]);
    if !thinking {
        script[1].as_object_mut().unwrap().remove("thinking");
    }
    script
}

fn native(provider: &str) -> Native {
    match provider {
        "gemini" => {
            let mock = ProviderMock::start("gemini", KEY, &native_script(true));
            let model = format!(
                "    provider: gemini\n    url: \"{}/v1beta\"\n    name: gemini-test\n    apiKey: {{env: GEMINI_API_KEY}}\n    thinking: {{budgetTokens: 2048}}\n{PRICES}",
                mock.root()
            );
            Native {
                mock,
                model,
                env: vec![("GEMINI_API_KEY", KEY.into())],
                counts_reasoning: true,
            }
        }
        "responses" => {
            let mock = ProviderMock::start("responses", KEY, &native_script(true));
            let model = format!(
                "    provider: openai-responses\n    url: \"{}\"\n    name: gpt-test\n    apiKey: {{env: OPENAI_API_KEY}}\n    maxTokens: 4096\n{PRICES}",
                mock.url()
            );
            Native {
                mock,
                model,
                env: vec![("OPENAI_API_KEY", KEY.into())],
                counts_reasoning: true,
            }
        }
        "bedrock" => {
            let key = format!("{AWS_KEY_ID}:{AWS_SECRET}:eu-west-3");
            let mock = ProviderMock::start("bedrock", &key, &native_script(true));
            let model = format!(
                "    provider: bedrock\n    url: \"{}\"\n    name: \"anthropic.claude-test-v1:0\"\n    maxTokens: 4096\n    thinking: {{budgetTokens: 2048}}\n    bedrock: {{region: eu-west-3, accessKeyId: {{env: AWS_KEY_ID}}, secretAccessKey: {{env: AWS_SECRET}}}}\n{PRICES}",
                mock.root()
            );
            Native {
                mock,
                model,
                env: vec![
                    ("AWS_KEY_ID", AWS_KEY_ID.into()),
                    ("AWS_SECRET", AWS_SECRET.into()),
                ],
                counts_reasoning: false,
            }
        }
        "azure" => {
            let mock = ProviderMock::start(
                "azure",
                &format!("api-key:{KEY}@2025-04-01-preview"),
                &native_script(false),
            );
            let model = format!(
                "    provider: azure-openai\n    url: \"{}\"\n    name: gpt-4o-deployment\n    apiKey: {{env: AZURE_OPENAI_API_KEY}}\n    azure: {{apiVersion: 2025-04-01-preview}}\n{PRICES}",
                mock.root()
            );
            Native {
                mock,
                model,
                env: vec![("AZURE_OPENAI_API_KEY", KEY.into())],
                counts_reasoning: false,
            }
        }
        other => panic!("no provider {other}"),
    }
}

/// The invoices agent whose whole model is `model`'s lines.
fn invoices_with_model(dir: &std::path::Path, model: &str) -> std::path::PathBuf {
    let path = invoices_agent_file(dir, "http://unused.invalid/v1", INVOICES_PARAMETERS, "");
    let written = std::fs::read_to_string(&path).unwrap();
    let line = "  model: {url: \"http://unused.invalid/v1\", name: mock-model}\n";
    assert!(written.contains(line), "{written}");
    std::fs::write(&path, written.replace(line, &format!("  model:\n{model}"))).unwrap();
    path
}

/// What is sent back of the first reply's thinking, in the second
/// request, where the provider carries it.
fn reasoning_sent_back(provider: &str, body: &Value) -> bool {
    let text = body.to_string();
    match provider {
        "gemini" => text.contains("thoughtSignature") || text.contains("thought_signature"),
        "responses" => body["input"]
            .as_array()
            .is_some_and(|items| items.iter().any(|i| i["type"] == "reasoning")),
        "bedrock" => text.contains("reasoningContent"),
        _ => true,
    }
}

/// The invoices conversation in `provider`'s own API: a 429 honoured
/// with its retry-after, two parallel calls and their results, the
/// thinking carried to the next turn and never shown, the cache's reads
/// and the reasoning priced apart; every request one the provider's SDK
/// takes, with its credential in the provider's own header or signature.
async fn converse_natively(provider: &str, stream: bool) {
    let Native {
        mock,
        model,
        env,
        counts_reasoning,
    } = native(provider);
    let dir = tempfile::tempdir().unwrap();
    let agent = invoices_with_model(dir.path(), &model);
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let (sidecar, api, id, seen) = ask_overdue(&agent, dir.path(), stream_flag(stream), &env).await;

    let requests = mock.valid_requests();
    assert_eq!(requests.len(), 3, "{provider}: {requests:#?}");
    for r in &requests {
        assert_eq!(r["key_ok"], true, "{provider}: {r:#}");
        assert_eq!(r["stream"], stream, "{provider}");
        let body = r["body"].to_string();
        assert!(
            !body.contains(CANARY) && !body.contains("acme-corp"),
            "{provider}: {body}"
        );
        assert!(
            !body.contains(KEY) && !body.contains(AWS_SECRET),
            "{provider}: {body}"
        );
    }
    assert!(
        reasoning_sent_back(provider, &requests[2]["body"]),
        "{provider}: {:#}",
        requests[2]["body"]
    );

    let session = api
        .call("GET", &format!("/v1/sessions/{id}"), Some(OWNER), None)
        .await;
    let turns = session.json["session"]["turns"].as_array().unwrap();
    assert_eq!(
        turns.last().unwrap()["content"],
        "INV-1002 is overdue.",
        "{provider}: {}",
        session.text
    );
    assert!(
        !session.text.contains("I should query"),
        "{provider}: {}",
        session.text
    );
    let raw_events: String = seen.iter().map(|e| e.data.clone()).collect();
    assert!(
        !raw_events.contains("I should query"),
        "{provider}: {raw_events}"
    );
    if stream {
        assert!(
            seen.iter().any(|e| e.event == "delta"),
            "{provider}: {seen:?}"
        );
    }

    // 20 and 30+1000 prompt tokens (1000 read from the cache), 10+8
    // output tokens, and where the provider counts them apart 4 more
    // spent reasoning, at 20 a million.
    let usage = api.call("GET", "/v1/usage", Some(OWNER), None).await;
    let row = &usage.json["rows"][0];
    assert_eq!(row["prompt_tokens"], 1050, "{provider}: {}", usage.text);
    let reasoning = if counts_reasoning { 4.0 } else { 0.0 };
    assert_eq!(
        row["completion_tokens"].as_f64(),
        Some(18.0 + reasoning),
        "{provider}: {}",
        usage.text
    );
    assert_eq!(row["cache_read_tokens"], 1000, "{provider}: {}", usage.text);
    assert_eq!(
        row["reasoning_tokens"].as_f64(),
        Some(reasoning),
        "{provider}: {}",
        usage.text
    );
    let cost = row["cost"].as_f64().unwrap();
    let expected = (50.0 * 2.0 + 1000.0 * 0.5 + 18.0 * 8.0 + reasoning * 20.0) / 1e6;
    assert!(
        (cost - expected).abs() < 1e-9,
        "{provider}: {cost} != {expected}"
    );

    let logs = sidecar.logs();
    for secret in [KEY, AWS_SECRET, CANARY] {
        assert!(!logs.contains(secret), "{provider}: {secret} in {logs}");
    }
    assert!(!std::fs::read(dir.path().join("store.sqlite"))
        .map(|b| contains(&b, KEY) || contains(&b, AWS_SECRET))
        .unwrap_or(false));
}

#[tokio::test]
async fn gemini_streamed_is_what_google_genai_takes() {
    converse_natively("gemini", true).await;
}

#[tokio::test]
async fn gemini_whole_is_what_google_genai_takes() {
    converse_natively("gemini", false).await;
}

#[tokio::test]
async fn the_responses_api_streamed_is_what_the_openai_sdk_takes() {
    converse_natively("responses", true).await;
}

#[tokio::test]
async fn the_responses_api_whole_is_what_the_openai_sdk_takes() {
    converse_natively("responses", false).await;
}

#[tokio::test]
async fn bedrock_converse_stream_is_signed_and_what_botocore_takes() {
    converse_natively("bedrock", true).await;
}

#[tokio::test]
async fn bedrock_converse_is_signed_and_what_botocore_takes() {
    converse_natively("bedrock", false).await;
}

#[tokio::test]
async fn azure_openai_streamed_is_what_the_openai_sdk_takes_at_a_deployment() {
    converse_natively("azure", true).await;
}

#[tokio::test]
async fn azure_openai_whole_is_what_the_openai_sdk_takes_at_a_deployment() {
    converse_natively("azure", false).await;
}

/// What the pod's cloud identity gives, as the identity mock issues it.
const ISSUED_KEY_ID: &str = "ASIAIDENTITYMOCK";
const ISSUED_SECRET: &str = "issued-secret-canary-4c2d";
const ISSUED_TOKEN: &str = "issued-session-canary-9a0e";
const PROJECTED_TOKEN: &str = "eyJprojected.service-account.token-canary";

/// A Bedrock agent with no keys on `mock`: the pod's identity signs.
fn bedrock_by_identity(dir: &std::path::Path, mock: &ProviderMock) -> std::path::PathBuf {
    invoices_with_model(
        dir,
        &format!(
            "    provider: bedrock\n    url: \"{}\"\n    name: \"anthropic.claude-test-v1:0\"\n    bedrock: {{region: eu-west-3}}\n{PRICES}",
            mock.root()
        ),
    )
}

/// The whole conversation of `ask_overdue` through a model the pod's
/// identity signs for: the credentials are asked for once (cached across
/// the three requests and the retry), every request carries them, and
/// no credential reaches the logs, the store or the model.
async fn by_identity(
    mock: &ProviderMock,
    identity: &IdentityMock,
    agent: &std::path::Path,
    dir: &std::path::Path,
    env: &[(&str, &str)],
    secrets: &[&str],
) {
    let (sidecar, api, id, _) = ask_overdue(agent, dir, &[], env).await;
    let requests = mock.valid_requests();
    assert_eq!(requests.len(), 3, "{requests:#?}");
    assert!(
        requests.iter().all(|r| r["key_ok"] == true),
        "{requests:#?}"
    );
    let asked = identity.valid_requests();
    assert_eq!(asked.len(), 1, "{asked:#?}");
    assert_eq!(asked[0]["token_ok"], true, "{asked:#?}");
    let session = api
        .call("GET", &format!("/v1/sessions/{id}"), Some(OWNER), None)
        .await;
    let turns = session.json["session"]["turns"].as_array().unwrap();
    assert_eq!(turns.last().unwrap()["content"], "INV-1002 is overdue.");
    let logs = sidecar.logs();
    let store = std::fs::read(dir.join("store.sqlite")).unwrap_or_default();
    for secret in secrets {
        assert!(!logs.contains(secret), "{secret} in {logs}");
        assert!(!contains(&store, secret), "{secret} in the store");
        assert!(!requests
            .iter()
            .any(|r| r["body"].to_string().contains(secret)));
    }
}

/// IRSA: the pod's projected token exchanged at STS
/// (AssumeRoleWithWebIdentity, botocore's own shape), the temporary keys
/// signing each Bedrock request with their session token.
#[tokio::test]
async fn bedrock_signs_with_the_pods_web_identity() {
    let dir = tempfile::tempdir().unwrap();
    let token_file = dir.path().join("token");
    std::fs::write(&token_file, PROJECTED_TOKEN).unwrap();
    let role = "arn:aws:iam::123456789012:role/bindery-tenant";
    let identity = IdentityMock::start(&[
        "--web-identity-token-file",
        token_file.to_str().unwrap(),
        "--role-arn",
        role,
        "--access-key-id",
        ISSUED_KEY_ID,
        "--secret-access-key",
        ISSUED_SECRET,
        "--session-token",
        ISSUED_TOKEN,
    ]);
    let mock = ProviderMock::start(
        "bedrock",
        &format!("{ISSUED_KEY_ID}:{ISSUED_SECRET}:eu-west-3:{ISSUED_TOKEN}"),
        &native_script(false),
    );
    let agent = bedrock_by_identity(dir.path(), &mock);
    let sts = identity.url();
    by_identity(
        &mock,
        &identity,
        &agent,
        dir.path(),
        &[
            ("AWS_ROLE_ARN", role),
            ("AWS_WEB_IDENTITY_TOKEN_FILE", token_file.to_str().unwrap()),
            ("AWS_ENDPOINT_URL_STS", sts.as_str()),
        ],
        &[ISSUED_SECRET, ISSUED_TOKEN, PROJECTED_TOKEN],
    )
    .await;
}

/// EKS Pod Identity: the agent's credentials endpoint, asked with the
/// pod's token, gives the keys that sign.
#[tokio::test]
async fn bedrock_signs_with_eks_pod_identity() {
    let dir = tempfile::tempdir().unwrap();
    let token_file = dir.path().join("eks-pod-identity-token");
    std::fs::write(&token_file, PROJECTED_TOKEN).unwrap();
    let identity = IdentityMock::start(&[
        "--pod-token-file",
        token_file.to_str().unwrap(),
        "--access-key-id",
        ISSUED_KEY_ID,
        "--secret-access-key",
        ISSUED_SECRET,
        "--session-token",
        ISSUED_TOKEN,
    ]);
    let mock = ProviderMock::start(
        "bedrock",
        &format!("{ISSUED_KEY_ID}:{ISSUED_SECRET}:eu-west-3:{ISSUED_TOKEN}"),
        &native_script(false),
    );
    let agent = bedrock_by_identity(dir.path(), &mock);
    let uri = format!("{}/v1/credentials", identity.url());
    by_identity(
        &mock,
        &identity,
        &agent,
        dir.path(),
        &[
            ("AWS_CONTAINER_CREDENTIALS_FULL_URI", uri.as_str()),
            (
                "AWS_CONTAINER_AUTHORIZATION_TOKEN_FILE",
                token_file.to_str().unwrap(),
            ),
        ],
        &[ISSUED_SECRET, ISSUED_TOKEN, PROJECTED_TOKEN],
    )
    .await;
}

/// AKS workload identity: the federated token exchanged at Entra ID for
/// an access token, sent as the bearer of each Azure OpenAI request.
#[tokio::test]
async fn azure_openai_sends_the_pods_entra_id_token() {
    const ACCESS: &str = "entra-access-canary-61bd";
    let dir = tempfile::tempdir().unwrap();
    let token_file = dir.path().join("azure-identity-token");
    std::fs::write(&token_file, PROJECTED_TOKEN).unwrap();
    let tenant = "72f988bf-86f1-41af-91ab-2d7cd011db47";
    let client = "0b1c2d3e-aaaa-bbbb-cccc-123456789abc";
    let identity = IdentityMock::start(&[
        "--federated-token-file",
        token_file.to_str().unwrap(),
        "--tenant",
        tenant,
        "--client-id",
        client,
        "--access-token",
        ACCESS,
    ]);
    let mock = ProviderMock::start("azure", &format!("bearer:{ACCESS}"), &native_script(false));
    let agent = invoices_with_model(
        dir.path(),
        &format!(
            "    provider: azure-openai\n    url: \"{}\"\n    name: gpt-4o-deployment\n{PRICES}",
            mock.root()
        ),
    );
    let authority = format!("{}/", identity.url());
    by_identity(
        &mock,
        &identity,
        &agent,
        dir.path(),
        &[
            ("AZURE_CLIENT_ID", client),
            ("AZURE_TENANT_ID", tenant),
            ("AZURE_FEDERATED_TOKEN_FILE", token_file.to_str().unwrap()),
            ("AZURE_AUTHORITY_HOST", authority.as_str()),
        ],
        &[ACCESS, PROJECTED_TOKEN],
    )
    .await;
}

/// An agents-exe file of flavour `ClaudeV1` is spoken in Anthropic's own
/// API at its `modelUrl`, with the 10000 tokens of thinking agents-exe
/// asks for, and its key from the API-keys file in `x-api-key`: every
/// request one the `anthropic` SDK takes.
#[tokio::test]
async fn an_agents_exe_claude_v1_file_speaks_anthropics_own_api() {
    let mock = ProviderMock::start(
        "anthropic",
        KEY,
        &json!([{"thinking": "hmm", "text": "hello"}]),
    );
    let dir = tempfile::tempdir().unwrap();
    let doc = json!({"tag": "OpenAIAgentDescription", "contents": {
        "slug": "talker", "apiKeyId": "anthropic", "flavor": "ClaudeV1",
        "modelUrl": mock.url(), "modelName": "claude-test", "announce": "talks",
        "systemPrompt": ["You talk."]}});
    std::fs::write(dir.path().join("agent.json"), doc.to_string()).unwrap();
    let keys = dir.path().join("keys.json");
    std::fs::write(
        &keys,
        json!({"keys": [{"id": "anthropic", "value": KEY}]}).to_string(),
    )
    .unwrap();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_bindery-sidecar"))
        .current_dir(dir.path())
        .env_clear()
        .args(["run", "--agent-file", "agent.json", "--api-keys"])
        .arg(&keys)
        .args(["--prompt", "hi"])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stdout}{stderr}");
    assert!(
        stdout.contains("hello") && !stdout.contains("hmm"),
        "{stdout}"
    );
    let requests = mock.valid_requests();
    assert_eq!(requests.len(), 1, "{requests:#?}");
    assert_eq!(requests[0]["key_ok"], true);
    assert_eq!(requests[0]["path"], "/v1/messages");
    assert_eq!(
        requests[0]["body"]["thinking"],
        json!({"type": "enabled", "budget_tokens": 10000})
    );
    assert_eq!(requests[0]["body"]["max_tokens"], 16000);
    assert!(!stderr.contains(KEY), "{stderr}");
}

/// Review 69 (B1): a cloud provider's key that reads empty (a Secret
/// with an empty value) stops the server; it never signs with the pod's
/// identity instead, which is for agents that name no key.
#[tokio::test]
async fn an_empty_cloud_key_is_refused_never_the_pods_identity() {
    const ACCESS: &str = "entra-access-canary-0b0b";
    let dir = tempfile::tempdir().unwrap();
    let token_file = dir.path().join("azure-identity-token");
    std::fs::write(&token_file, PROJECTED_TOKEN).unwrap();
    let identity = IdentityMock::start(&[
        "--federated-token-file",
        token_file.to_str().unwrap(),
        "--tenant",
        "t1",
        "--client-id",
        "c1",
        "--access-token",
        ACCESS,
    ]);
    let mock = ProviderMock::start(
        "azure",
        &format!("bearer:{ACCESS}"),
        &json!([{"text": "hi"}]),
    );
    let authority = format!("{}/", identity.url());
    for (what, key_source, extra_env) in [
        (
            "an empty variable",
            "{env: AZURE_OPENAI_API_KEY}",
            ("AZURE_OPENAI_API_KEY", ""),
        ),
        ("a blank value", "{value: '  '}", ("UNUSED", "")),
    ] {
        let agent = invoices_with_model(
            dir.path(),
            &format!(
                "    provider: azure-openai\n    url: \"{}\"\n    name: dep\n    apiKey: {key_source}\n",
                mock.root()
            ),
        );
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_bindery-sidecar"))
            .current_dir(dir.path())
            .env_clear()
            .envs([
                ("AZURE_CLIENT_ID", "c1"),
                ("AZURE_TENANT_ID", "t1"),
                ("AZURE_FEDERATED_TOKEN_FILE", token_file.to_str().unwrap()),
                ("AZURE_AUTHORITY_HOST", authority.as_str()),
                extra_env,
                ("BINDERY_PARAM_BILLING_TOKEN", CANARY),
            ])
            .args(["run", "--agent-file"])
            .arg(&agent)
            .args(["--set", "tenant=acme-corp", "--prompt", "hi"])
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{what}: ran");
        assert!(
            stderr.contains("API key is empty") || stderr.contains("apiKey is empty"),
            "{what}: {stderr}"
        );
    }
    assert!(
        identity.valid_requests().is_empty(),
        "the pod's identity was asked"
    );
    assert!(mock.requests().is_empty(), "the model was asked");
}

/// An endpoint that answers every request 400 with, 265 characters in,
/// every header it was sent: where an excerpt's cut would fall on them.
async fn echoing_endpoint() -> (String, tokio::task::JoinHandle<()>) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let task = tokio::spawn(async move {
        loop {
            let Ok((mut conn, _)) = listener.accept().await else {
                return;
            };
            tokio::spawn(async move {
                let mut buf = vec![0u8; 65536];
                let mut got = Vec::new();
                while !got.windows(4).any(|w| w == b"\r\n\r\n") {
                    let Ok(n) = conn.read(&mut buf).await else {
                        return;
                    };
                    if n == 0 {
                        return;
                    }
                    got.extend_from_slice(&buf[..n]);
                }
                // The credentials' values first, where the cut falls.
                let text = String::from_utf8_lossy(&got).replace(['"', '\\'], "'");
                let head: Vec<&str> = text
                    .split("\r\n\r\n")
                    .next()
                    .unwrap_or("")
                    .split("\r\n")
                    .filter_map(|line| {
                        let (name, value) = line.split_once(": ")?;
                        matches!(
                            name.to_ascii_lowercase().as_str(),
                            "authorization"
                                | "api-key"
                                | "x-api-key"
                                | "x-goog-api-key"
                                | "x-amz-security-token"
                        )
                        .then_some(value)
                    })
                    .collect();
                let head = head.join(" | ");
                let body = format!(
                    "{{\"error\":{{\"message\":\"{}{head}\"}}}}",
                    "A".repeat(265)
                );
                let reply = format!(
                    "HTTP/1.1 400 Bad Request\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
                    body.len()
                );
                let _ = conn.write_all(reply.as_bytes()).await;
            });
        }
    });
    (url, task)
}

/// Review 69 (B2, B3, B4): an endpoint that echoes the request's headers
/// in its error gets none of the credentials sent back into any sink (the
/// session's status, its events, the logs, the store), not even their
/// first bytes where the error's excerpt is cut: the key, the pod's Entra
/// ID token, a Bedrock session token.
#[tokio::test]
async fn an_endpoint_echoing_the_credentials_it_was_sent_gets_none_into_any_sink() {
    const ACCESS: &str = "entra-access-canary-3e3e";
    const SESSION: &str = "aws-session-canary-4f4f";
    let (url, _server) = echoing_endpoint().await;
    let dir = tempfile::tempdir().unwrap();
    let token_file = dir.path().join("azure-identity-token");
    std::fs::write(&token_file, PROJECTED_TOKEN).unwrap();
    let identity = IdentityMock::start(&[
        "--federated-token-file",
        token_file.to_str().unwrap(),
        "--tenant",
        "t1",
        "--client-id",
        "c1",
        "--access-token",
        ACCESS,
    ]);
    let authority = format!("{}/", identity.url());
    // What, the model's lines, the server's environment, the credential.
    type Case<'a> = (&'a str, String, Vec<(&'a str, String)>, &'a str);
    let cases: Vec<Case<'_>> = vec![
        (
            "an Azure key",
            format!("    provider: azure-openai\n    url: \"{url}\"\n    name: dep\n    apiKey: {{env: AZURE_OPENAI_API_KEY}}\n"),
            vec![("AZURE_OPENAI_API_KEY", KEY.to_owned())],
            KEY,
        ),
        (
            "the pod's Entra ID token",
            format!("    provider: azure-openai\n    url: \"{url}\"\n    name: dep\n"),
            vec![
                ("AZURE_CLIENT_ID", "c1".to_owned()),
                ("AZURE_TENANT_ID", "t1".to_owned()),
                ("AZURE_FEDERATED_TOKEN_FILE", token_file.to_str().unwrap().to_owned()),
                ("AZURE_AUTHORITY_HOST", authority.clone()),
            ],
            ACCESS,
        ),
        (
            "a Bedrock session token",
            format!("    provider: bedrock\n    url: \"{url}\"\n    name: m\n    bedrock: {{region: eu-west-1, accessKeyId: {{value: AKIDSTATIC}}, secretAccessKey: {{env: AWS_SECRET}}, sessionToken: {{env: AWS_TOKEN}}}}\n"),
            vec![("AWS_SECRET", AWS_SECRET.to_owned()), ("AWS_TOKEN", SESSION.to_owned())],
            SESSION,
        ),
        (
            "a Gemini key",
            format!("    provider: gemini\n    url: \"{url}\"\n    name: g\n    apiKey: {{env: GEMINI_API_KEY}}\n"),
            vec![("GEMINI_API_KEY", KEY.to_owned())],
            KEY,
        ),
    ];
    for (what, model, env, secret) in cases {
        let case = tempfile::tempdir().unwrap();
        let agent = invoices_with_model(case.path(), &model);
        let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
        let (sidecar, api, id, seen) =
            ask_overdue(&agent, case.path(), &["--llm-retries", "0"], &env).await;
        let view = api
            .call("GET", &format!("/v1/sessions/{id}"), Some(OWNER), None)
            .await;
        let detail = view.json["status_detail"].as_str().unwrap_or_default();
        assert!(
            detail.starts_with("the model request failed (")
                && detail.contains(" model `")
                && detail.contains("HTTP 400"),
            "{what}: {detail}"
        );
        let events: String = seen.iter().map(|e| e.data.clone()).collect();
        let store = std::fs::read(case.path().join("store.sqlite")).unwrap_or_default();
        let logs = sidecar.logs();
        // Nothing of the credential: not whole, not its first 8 bytes.
        for piece in [secret, &secret[..8]] {
            assert!(
                !view.text.contains(piece),
                "{what}: {piece} in the view: {}",
                view.text
            );
            assert!(
                !events.contains(piece),
                "{what}: {piece} in the events: {events}"
            );
            assert!(!logs.contains(piece), "{what}: {piece} in the logs: {logs}");
            assert!(!contains(&store, piece), "{what}: {piece} in the store");
        }
        assert!(
            view.text.contains("<secret:"),
            "{what}: the echo is not marked: {}",
            view.text
        );
    }
}

/// Review 69 (B5): a turn's reasoning goes back to the endpoint that
/// reasoned it only. A fallback of the same provider at another origin
/// (another account, another region) gets the turn without it, and its
/// reply is the run's; the primary, asked again, gets it back.
#[tokio::test]
async fn reasoning_goes_back_to_the_endpoint_that_reasoned_it_only() {
    let primary = ProviderMock::start(
        "responses",
        KEY,
        &json!([
            {"thinking": "PRIMARY-REASONING-7d7d",
             "calls": [{"id": "call_01", "name": TOOL, "input": {"status": "overdue"}}]},
            {"status": 503}
        ]),
    );
    let fallback =
        ProviderMock::start("responses", KEY, &json!([{"text": "INV-1002 is overdue."}]));
    let dir = tempfile::tempdir().unwrap();
    let agent = invoices_with_model(
        dir.path(),
        &format!(
            "    provider: openai-responses\n    url: \"{}\"\n    name: gpt-a\n    apiKey: {{env: OPENAI_API_KEY}}\n    fallbacks:\n      - {{provider: openai-responses, url: \"{}\", name: gpt-b, apiKey: {{env: OPENAI_API_KEY}}}}\n",
            primary.url(),
            fallback.url()
        ),
    );
    let (_sidecar, api, id, _) = ask_overdue(
        &agent,
        dir.path(),
        &["--llm-retries", "0"],
        &[("OPENAI_API_KEY", KEY)],
    )
    .await;
    let asked = primary.valid_requests();
    assert_eq!(asked.len(), 2, "{asked:#?}");
    // The primary got its own reasoning back with the call's result.
    assert!(
        asked[1]["body"].to_string().contains("rs_"),
        "{:#}",
        asked[1]["body"]
    );
    let fell = fallback.valid_requests();
    assert_eq!(fell.len(), 1, "{fell:#?}");
    let body = fell[0]["body"].to_string();
    assert!(
        !body.contains("PRIMARY-REASONING") && !body.contains("\"reasoning\""),
        "{body}"
    );
    assert!(body.contains("function_call_output"), "{body}");
    let view = api
        .call("GET", &format!("/v1/sessions/{id}"), Some(OWNER), None)
        .await;
    let turns = view.json["session"]["turns"].as_array().unwrap();
    assert_eq!(turns.last().unwrap()["content"], "INV-1002 is overdue.");
}
