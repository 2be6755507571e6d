//! Budgets in process: the router over a service whose agent caps
//! tokens, tool calls or cost, a model script that reports the usage the
//! test chooses, and what the client, the model, the store and the
//! metrics then see. A rolling window moves on the paused clock.

use std::time::Duration;

use crate::harness::*;
use bindery_tests::fixtures::session::{answer, message, session};
use bindery_tests::fixtures::{bash_tool, bash_tool_with_args, counted, metered_agent};
use bindery_tests::mock_llm::MockReply;
use bindery_tests::scripts::{count_then_answer, results};
use serde_json::{json, Value};

/// A server of the metered agent on its own SQLite store, and its model.
struct Metered {
    server: Server,
    api: Api,
    dir: tempfile::TempDir,
}

impl std::ops::Deref for Metered {
    type Target = Server;
    fn deref(&self) -> &Server {
        &self.server
    }
}

/// [`metered_agent`] with `model_extra` and `spec`, served, its model
/// answering by `script`.
async fn metered(
    script: impl Fn(&Value) -> MockReply + Send + Sync + 'static,
    model_extra: &str,
    spec: &str,
) -> Metered {
    let dir = tempfile::tempdir().unwrap();
    let agent = metered_agent(dir.path(), MODEL_URL, model_extra, spec);
    let server = Server::start(&[agent], dir.path(), script).await;
    Metered {
        api: server.api.clone(),
        server,
        dir,
    }
}

#[tokio::test]
async fn a_token_budget_stops_a_run_going_and_refuses_the_next_message() {
    let m = metered(
        count_then_answer(2),
        "",
        "  budgets:\n    - {name: daily-tokens, tokens: 100, per: 24h}\n",
    )
    .await;
    let id = new_session(&m.api, json!({"agent": "metered"})).await;

    // Two model turns use 120 tokens; the third does not start.
    let r = message(&m.api, &id, "count twice").await;
    assert_eq!(r.status, 200, "{}", r.text);
    assert_eq!(r.json["status"], "failed", "{}", r.text);
    let detail = r.json["status_detail"].as_str().unwrap();
    assert!(
        detail.starts_with(
            "budget_exceeded: budget daily-tokens is used up: 120 of 100 tokens per 24h; it frees up in"
        ),
        "{detail}"
    );
    assert_eq!(m.mock.requests().len(), 2);
    assert_eq!(counted(m.dir.path()), 2);
    let usage = &r.json["usage"];
    assert_eq!(usage["total_tokens"], 120, "{usage}");
    assert_eq!(usage["prompt_tokens"], 80, "{usage}");
    assert_eq!(usage["model_requests"], 2, "{usage}");
    assert_eq!(usage["tool_calls"], 2, "{usage}");
    assert_eq!(usage["estimated_tokens"], 0, "{usage}");

    // A message now is refused before anything starts, in any session of
    // the agent (the window is the agent's).
    let other = new_session(&m.api, json!({"agent": "metered"})).await;
    for sid in [&id, &other] {
        let refused = message(&m.api, sid, "again").await;
        assert_eq!(refused.status, 429, "{}", refused.text);
        let b = &refused.json;
        assert_eq!(b["error"], "budget_exceeded");
        assert_eq!(b["budget"], "daily-tokens");
        assert_eq!(b["meter"], "tokens");
        assert_eq!(b["limit"], 100.0);
        assert_eq!(b["used"], 120.0);
        assert_eq!(b["per"], "24h");
        let retry = b["retry_after"]
            .as_u64()
            .expect("a rolling budget says when");
        assert!((86_000..=86_400).contains(&retry), "{retry}");
    }
    // An MCP client's ask is refused the same way, with the same fields.
    let call = json!({"jsonrpc": "2.0", "id": 1, "method": "tools/call",
        "params": {"name": "ask_metered", "arguments": {"prompt": "again"}}});
    let mcp = m.api.call("POST", "/mcp", Some(OWNER), Some(&call)).await;
    let data = &mcp.json["error"]["data"];
    assert_eq!(data["error"], "budget_exceeded", "{}", mcp.text);
    assert_eq!(data["status"], 429, "{}", mcp.text);
    assert_eq!(data["budget"], "daily-tokens", "{}", mcp.text);
    assert_eq!(m.mock.requests().len(), 2, "nothing reached the model");
    // The agent says what caps it.
    let agent = m
        .api
        .call("GET", "/v1/agents/metered", Some(OWNER), None)
        .await;
    assert_eq!(
        agent.json["budgets"],
        json!([{"name": "daily-tokens", "meter": "tokens", "limit": 100.0, "per": "24h", "on_exceed": "refuse"}]),
        "{}",
        agent.text
    );

    let metrics = m.api.call("GET", "/metrics", None, None).await.text;
    for line in [
        r#"bindery_model_tokens_total{agent="metered",model="mock-model",kind="prompt"} 80"#,
        r#"bindery_model_tokens_total{agent="metered",model="mock-model",kind="completion"} 40"#,
        r#"bindery_budget_remaining{agent="metered",budget="daily-tokens"} 0"#,
    ] {
        assert!(metrics.contains(line), "{line} not in\n{metrics}");
    }
}

#[tokio::test]
async fn a_confirm_budget_waits_for_a_person_who_lets_the_run_finish_or_ends_it() {
    let m = metered(
        count_then_answer(2),
        "",
        "  budgets:\n    - {name: per-session, tokens: 100, per: session, onExceed: confirm}\n",
    )
    .await;
    let id = new_session(&m.api, json!({"agent": "metered"})).await;

    let r = message(&m.api, &id, "count twice").await;
    assert_eq!(r.json["status"], "waiting_external", "{}", r.text);
    assert_eq!(
        r.json["status_detail"],
        "waiting for a person to let the run go past budget per-session"
    );
    let item = &r.json["pending"][0];
    assert_eq!(item["disposition"], "budget", "{item}");
    assert_eq!(item["tool"], "");
    assert_eq!(
        item["budget"],
        json!({"budget": "per-session", "meter": "tokens", "limit": 100.0, "used": 120.0, "per": "session"})
    );
    assert_eq!(m.mock.requests().len(), 2);
    let token = item["continuation_token"].as_str().unwrap();
    // An answer that does not fit says what does.
    let wrong = m
        .api
        .call(
            "POST",
            &format!("/v1/continuations/{token}"),
            Some(OWNER),
            Some(&json!({"result": "x"})),
        )
        .await;
    assert_eq!(wrong.status, 400, "{}", wrong.text);
    assert!(
        wrong.text.contains("send `approve: true`"),
        "{}",
        wrong.text
    );

    let approved = answer(&m.api, token, json!({"approve": true})).await;
    assert_eq!(approved.status, 200, "{}", approved.text);
    let view = session(&m.api, &id).await;
    assert_eq!(view.json["status"], "idle", "{}", view.text);
    assert_eq!(m.mock.requests().len(), 3, "the run went on to its answer");
    assert_eq!(view.json["usage"]["total_tokens"], 180);

    // The approval was for that run: the next one asks again, and a
    // refusal ends it.
    let r = message(&m.api, &id, "once more").await;
    assert_eq!(r.json["status"], "waiting_external", "{}", r.text);
    let token = r.json["pending"][0]["continuation_token"].as_str().unwrap();
    let refused = answer(&m.api, token, json!({"approve": false})).await;
    assert_eq!(refused.status, 200, "{}", refused.text);
    let view = session(&m.api, &id).await;
    assert_eq!(view.json["status"], "failed", "{}", view.text);
    assert_eq!(
        view.json["status_detail"],
        "budget_exceeded: a person did not let the run go past budget per-session"
    );
    assert_eq!(
        m.mock.requests().len(),
        3,
        "no model request after the refusal"
    );
}

#[tokio::test]
async fn a_per_session_tool_call_budget_refuses_the_call_and_tells_the_model() {
    let m = metered(
        count_then_answer(3),
        "",
        "  budgets:\n    - {name: calls, toolCalls: 2, per: session}\n",
    )
    .await;
    let id = new_session(&m.api, json!({"agent": "metered"})).await;
    let r = message(&m.api, &id, "count thrice").await;
    assert_eq!(r.json["status"], "idle", "{}", r.text);
    assert_eq!(counted(m.dir.path()), 2, "the third call did not run");
    assert_eq!(
        last_tool_output(&r),
        "error: budget calls is used up: 2 of 2 tool calls per session, so this call did not run"
    );
    assert_eq!(r.json["usage"]["tool_calls"], 2);
    // Another session has budget of its own.
    let other = new_session(&m.api, json!({"agent": "metered"})).await;
    let r = message(&m.api, &other, "count thrice").await;
    assert_eq!(r.json["status"], "idle", "{}", r.text);
    assert_eq!(counted(m.dir.path()), 4);
}

#[tokio::test]
async fn a_cost_budget_counts_by_the_price_and_the_report_adds_it_up() {
    // 1 EUR a prompt token, 2 a completion token: 50 a request.
    let m = metered(
        |_| MockReply::text("ok").with_usage(30, 10),
        ", pricing: {inputPerMillion: 1000000, outputPerMillion: 2000000, currency: EUR}",
        "  budgets:\n    - {name: monthly-spend, cost: 100, per: 30d}\n",
    )
    .await;
    let a = new_session(&m.api, json!({"agent": "metered"})).await;
    let b = new_session(&m.api, json!({"agent": "metered"})).await;
    assert_eq!(message(&m.api, &a, "one").await.json["usage"]["cost"], 50.0);
    let r = message(&m.api, &b, "two").await;
    assert_eq!(r.json["usage"]["cost"], 50.0);
    assert_eq!(r.json["usage"]["currency"], "EUR");
    let refused = message(&m.api, &a, "three").await;
    assert_eq!(refused.status, 429, "{}", refused.text);
    assert_eq!(refused.json["meter"], "cost");
    assert_eq!(refused.json["used"], 100.0);

    let report = m
        .api
        .call("GET", "/v1/usage?group_by=session", Some(OWNER), None)
        .await;
    assert_eq!(report.status, 200, "{}", report.text);
    assert_eq!(report.json["currency"], "EUR");
    let rows = report.json["rows"].as_array().unwrap();
    assert_eq!(rows.len(), 2, "{}", report.text);
    for row in rows {
        assert_eq!(row["cost"], 50.0, "{row}");
        assert_eq!(row["total_tokens"], 40, "{row}");
        assert_eq!(row["model_requests"], 1, "{row}");
    }
    let by_model = m
        .api
        .call("GET", "/v1/usage?group_by=model", Some(OWNER), None)
        .await;
    assert_eq!(by_model.json["rows"][0]["key"], "mock-model");
    assert_eq!(by_model.json["rows"][0]["cost"], 100.0);
    let csv = m
        .api
        .call_with(
            "GET",
            "/v1/usage?group_by=agent",
            Some(OWNER),
            &[("accept", "text/csv")],
            None,
        )
        .await;
    assert!(
        csv.content_type.starts_with("text/csv"),
        "{}",
        csv.content_type
    );
    assert_eq!(
        csv.reply.text,
        "agent,prompt_tokens,completion_tokens,total_tokens,estimated_tokens,model_requests,tool_calls,cost,currency,cache_read_tokens,cache_write_tokens,reasoning_tokens\n\
         metered,60,20,80,0,2,0,100,EUR,0,0,0\n"
    );
    // A range that holds nothing, and one that does not read.
    let empty = m
        .api
        .call(
            "GET",
            "/v1/usage?from=2020-01-01T00:00:00Z&to=2020-02-01T00:00:00Z",
            Some(OWNER),
            None,
        )
        .await;
    assert_eq!(empty.json["rows"], json!([]), "{}", empty.text);
    let bad = m
        .api
        .call("GET", "/v1/usage?from=yesterday", Some(OWNER), None)
        .await;
    assert_eq!(bad.status, 400, "{}", bad.text);
    assert!(
        bad.text.contains("`from` is an RFC 3339 time"),
        "{}",
        bad.text
    );
    // The owner's only.
    assert_eq!(m.api.call("GET", "/v1/usage", None, None).await.status, 401);
}

/// The window is measured by the server's clock against the times the
/// store holds: a use written an hour ago less a moment fills the window
/// until that moment passes (on the paused clock, moved on by the test).
#[tokio::test]
async fn a_rolling_window_frees_up_as_its_oldest_use_leaves_it() {
    let m = metered(
        |_| MockReply::text("ok").with_usage(1, 1),
        "",
        "  budgets:\n    - {name: hourly, tokens: 100, per: 1h}\n",
    )
    .await;
    let id = new_session(&m.api, json!({"agent": "metered"})).await;
    // Paused once the agents are loaded: their tools' `describe` runs are
    // processes, whose timeouts a paused clock would run out at once.
    tokio::time::pause();
    let now = m.now_ms();
    let db = rusqlite::Connection::open(m.dir.path().join("store.sqlite")).unwrap();
    db.busy_timeout(Duration::from_secs(5)).unwrap();
    db.execute(
        "INSERT INTO usage (at, agent, session, run, model, tool, prompt_tokens,
             completion_tokens, estimated, tool_calls, cost)
         VALUES (?1, 'metered', 'earlier', 'earlier', 'mock-model', NULL, 100, 0, 0, 0, 0)",
        [now - 3_600_000 + 2_000],
    )
    .unwrap();
    let refused = message(&m.api, &id, "now?").await;
    assert_eq!(refused.status, 429, "{}", refused.text);
    let retry = refused.json["retry_after"].as_u64().unwrap();
    assert!((1..=2).contains(&retry), "{}", refused.text);
    assert!(m.mock.requests().is_empty());
    // A moment before the use leaves the window, it still counts.
    tokio::time::advance(Duration::from_millis(1_900)).await;
    let still = message(&m.api, &id, "now?").await;
    assert_eq!(still.status, 429, "{}", still.text);
    tokio::time::advance(Duration::from_millis(200)).await;
    let r = message(&m.api, &id, "now?").await;
    assert_eq!(r.status, 200, "{}", r.text);
    assert_eq!(r.json["status"], "idle", "{}", r.text);
    assert_eq!(m.mock.requests().len(), 1);
}

/// What an attacker could try: a model asking for many calls at once in
/// one turn gets as many as the budget has room for (the claims take
/// turns in the store); a session-token holder (a browser given one
/// session) sees the budget's pending item without the token that
/// answers it, and cannot read the tenant's usage.
#[tokio::test]
async fn parallel_calls_do_not_slip_past_a_budget_and_a_session_token_lets_nothing_go_on() {
    let m = metered(
        |req| match results(req) {
            0 => MockReply::ToolCalls(vec![("bash_count".to_string(), json!({})); 5])
                .with_usage(40, 20),
            _ => MockReply::text("done").with_usage(40, 20),
        },
        "",
        "  budgets:\n    - {name: calls, toolCalls: 2, per: run}\n    - {name: tokens, tokens: 100, per: session, onExceed: confirm}\n",
    )
    .await;
    let created = create(&m.api, json!({"agent": "metered", "session_token": true})).await;
    assert_eq!(created.status, 201, "{}", created.text);
    let id = created.json["session_id"].as_str().unwrap().to_string();
    let token = created.json["session_token"].as_str().unwrap().to_string();

    let r = message(&m.api, &id, "count five at once").await;
    assert_eq!(r.json["status"], "idle", "{}", r.text);
    assert_eq!(counted(m.dir.path()), 2, "five calls at once, room for two");
    let refusals = r.json["session"]["turns"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|t| {
            t["role"] == "tool"
                && t["content"]
                    .as_str()
                    .is_some_and(|c| c.contains("budget calls is used up"))
        })
        .count();
    assert_eq!(refusals, 3);

    // 120 tokens now: the session token's next message waits at the
    // confirm budget, and its holder cannot let it go on.
    let held = m
        .api
        .call(
            "POST",
            &format!("/v1/sessions/{id}/messages?wait=true"),
            Some(&token),
            Some(&json!({"prompt": "more"})),
        )
        .await;
    assert_eq!(held.status, 200, "{}", held.text);
    assert_eq!(held.json["status"], "waiting_external", "{}", held.text);
    let item = &held.json["pending"][0];
    assert_eq!(item["disposition"], "budget", "{item}");
    assert!(item.get("continuation_token").is_none(), "{item}");
    let usage = m.api.call("GET", "/v1/usage", Some(&token), None).await;
    assert_eq!(usage.status, 401, "{}", usage.text);
    let resume = m
        .api
        .call(
            "POST",
            &format!("/v1/sessions/{id}/resume"),
            Some(&token),
            None,
        )
        .await;
    assert_ne!(resume.status / 100, 2, "{}", resume.text);
    assert_eq!(
        session(&m.api, &id).await.json["status"],
        "waiting_external"
    );
    assert_eq!(m.mock.requests().len(), 2, "nothing went past the budget");
}

/// A tool name the agent does not have is the model's free text (or a
/// prompt injection's): it counts against a tool-call budget, but is kept
/// in the store and the report under one name, as the metrics keep it.
#[tokio::test]
async fn a_made_up_tool_name_counts_but_is_not_kept() {
    const MADE_UP: &str = "bash_exfiltrate-canary-3c1f";
    // Conversation data as a tool name: not a tool's, so an error, not
    // "unavailable".
    const CARD: &str = "card 4111 1111 1111 1111";
    let m = metered(
        |req| match results(req) {
            0 => MockReply::tool_call(MADE_UP, json!({})),
            1 => MockReply::tool_call(CARD, json!({})),
            _ => MockReply::text("done"),
        },
        "",
        "  budgets:\n    - {name: calls, toolCalls: 5, per: session}\n",
    )
    .await;
    let id = new_session(&m.api, json!({"agent": "metered"})).await;
    let r = message(&m.api, &id, "call something").await;
    assert_eq!(r.json["status"], "idle", "{}", r.text);
    assert_eq!(r.json["usage"]["tool_calls"], 2, "{}", r.text);
    let metrics = m.api.call("GET", "/metrics", None, None).await;
    for name in [MADE_UP, CARD, "4111"] {
        assert!(
            !metrics.text.contains(name),
            "{name} labels a series:\n{}",
            metrics.text
        );
    }
    assert!(
        metrics.text.contains("tool=\"<unknown>\""),
        "{}",
        metrics.text
    );
    let report = m
        .api
        .call("GET", "/v1/usage?group_by=tool", Some(OWNER), None)
        .await;
    assert!(!report.text.contains(MADE_UP), "{}", report.text);
    assert!(report.text.contains("<unknown>"), "{}", report.text);
    let db = rusqlite::Connection::open(m.dir.path().join("store.sqlite")).unwrap();
    let tools: Vec<Option<String>> = db
        .prepare("SELECT tool FROM usage")
        .unwrap()
        .query_map([], |r| r.get(0))
        .unwrap()
        .map(Result::unwrap)
        .collect();
    assert!(tools.contains(&Some("<unknown>".into())), "{tools:?}");
}

/// A tool's lookups (`depends_on`) are tool calls too: each one that runs
/// claims its room in a tool-call budget, and one past it does not run.
#[tokio::test]
async fn a_lookup_counts_against_a_tool_call_budget() {
    let script = |req: &Value| match results(req) {
        0 => MockReply::tool_call("bash_use", json!({})),
        _ => MockReply::text("done"),
    };
    let dir = tempfile::tempdir().unwrap();
    let tools = dir.path().join("tools");
    std::fs::create_dir_all(&tools).unwrap();
    let looked = dir.path().join("looked");
    bash_tool(
        &tools,
        "lookup",
        "Finds n.",
        &format!(
            "echo x >> '{looked}'\necho '{{\"n\": \"7\"}}'\n",
            looked = looked.display()
        ),
    );
    bash_tool_with_args(
        &tools,
        "use",
        "Uses n.",
        r#"[{"name": "n", "description": "n", "type": "string", "backing_type": "string", "arity": "single", "mode": "dashdashspace"}]"#,
        "echo \"used $3\"\n",
    );
    let agent = dir.path().join("a.yaml");
    std::fs::write(
        &agent,
        format!(
            r#"apiVersion: bindery.dev/v1alpha1
kind: Agent
metadata: {{name: metered}}
spec:
  model: {{url: "{}", name: mock-model}}
  budgets:
    - {{name: calls, toolCalls: 1, per: session}}
  toolboxes:
    - bash:
        directory: "{}"
        tools:
          - {{tool: lookup, readOnly: true}}
          - tool: use
            readOnly: true
            depends_on:
              - tool: lookup
                when: always
                map: {{$.n: $.n}}
"#,
            MODEL_URL,
            tools.display()
        ),
    )
    .unwrap();
    let api = Server::start(&[agent], dir.path(), script).await.api;
    let id = new_session(&api, json!({"agent": "metered"})).await;
    let r = message(&api, &id, "use it").await;
    assert_eq!(r.json["status"], "idle", "{}", r.text);
    assert_eq!(
        last_tool_output(&r),
        "error: budget calls is used up: 1 of 1 tool calls per session, so the lookup `bash_lookup` did not run"
    );
    assert!(!looked.exists(), "the lookup ran past the budget");
    assert_eq!(r.json["usage"]["tool_calls"], 1, "{}", r.text);
}

#[tokio::test]
async fn a_cancelled_model_request_counts_its_prompt_so_cancelling_spends_no_less() {
    // The model holds every reply: each request is cancelled while out.
    let gate = bindery_tests::mock_llm::Gate::new();
    let held = gate.clone();
    let m = metered(
        move |_| MockReply::text("late").with_usage(1, 1).held(&held),
        "",
        "  budgets:\n    - {name: daily-tokens, tokens: 1000, per: 24h}\n",
    )
    .await;
    let id = new_session(&m.api, json!({"agent": "metered"})).await;
    // About 2500 tokens of prompt (four characters a token).
    let prompt = "x".repeat(10_000);
    let sent = m
        .api
        .call(
            "POST",
            &format!("/v1/sessions/{id}/messages"),
            Some(OWNER),
            Some(&json!({ "prompt": prompt })),
        )
        .await;
    assert_eq!(sent.status, 202, "{}", sent.text);
    bindery_tests::eventually::eventually(
        "the request at the model",
        Duration::from_secs(30),
        async || (m.mock.requests().len() == 1).then_some(()),
    )
    .await;
    let cancelled = m
        .api
        .call(
            "POST",
            &format!("/v1/sessions/{id}/cancel"),
            Some(OWNER),
            None,
        )
        .await;
    assert!(cancelled.status < 300, "{}", cancelled.text);
    let usage = session(&m.api, &id).await.json["usage"].clone();
    assert_eq!(usage["model_requests"], 1, "{usage}");
    let counted = usage["total_tokens"].as_u64().unwrap();
    assert!(
        counted >= 2_400,
        "the cancelled prompt counted {counted}: {usage}"
    );
    assert_eq!(usage["estimated_tokens"], counted, "{usage}");

    // The budget saw it: the next message is refused before the model.
    let refused = message(&m.api, &id, "again").await;
    assert_eq!(refused.status, 429, "{}", refused.text);
    assert_eq!(refused.json["budget"], "daily-tokens", "{}", refused.text);
    assert_eq!(m.mock.requests().len(), 1, "nothing more reached the model");
    gate.open();
}

#[tokio::test]
async fn a_model_that_refuses_a_request_counts_nothing() {
    let m = metered(
        |_| MockReply::status(401, "{\"error\": {\"message\": \"bad key\"}}"),
        "",
        "  budgets:\n    - {name: daily-tokens, tokens: 1000, per: 24h}\n",
    )
    .await;
    let id = new_session(&m.api, json!({"agent": "metered"})).await;
    let r = message(&m.api, &id, &"x".repeat(10_000)).await;
    assert_eq!(r.json["status"], "failed", "{}", r.text);
    assert_eq!(r.json["usage"]["total_tokens"], 0, "{}", r.text);
}

/// Review 69 (second): a reply that reports a usage of nothing (no prompt
/// token, when a prompt always has one) counts at the estimate, like one
/// that reports none: a model endpoint cannot make work free.
#[tokio::test]
async fn a_reply_reporting_zero_tokens_counts_at_the_estimate() {
    let m = metered(
        |_| MockReply::text("a long enough answer to be counted").with_usage(0, 0),
        "",
        "",
    )
    .await;
    let id = new_session(&m.api, json!({"agent": "metered"})).await;
    let r = message(&m.api, &id, "hello there").await;
    assert_eq!(r.status, 200, "{}", r.text);
    let usage = &r.json["usage"];
    assert!(usage["prompt_tokens"].as_u64().unwrap() > 0, "{usage}");
    assert_eq!(usage["estimated_tokens"], usage["total_tokens"], "{usage}");
}
