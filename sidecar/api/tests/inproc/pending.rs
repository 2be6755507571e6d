//! Runs that wait, in process: a call that needs a person's approval, a
//! deferred call the client runs, their continuations, and what a cancel,
//! a fork, a helper and another session's token do to them. Real bash
//! tools, the model's script; a confirmation's expiry on the paused clock.
//! What a restart does to them, and the CLI's prompts, are in the
//! sidecar's `tests/it/server_pending.rs`.

use std::path::PathBuf;
use std::time::Duration;

use crate::harness::*;
use bindery_tests::eventually::eventually;
use bindery_tests::fixtures::clerk::{self, waiting};
use bindery_tests::fixtures::session::{answer, create_waited, id_of, on_session, token_of};
use bindery_tests::mock_llm::tool_results;
use serde_json::{json, Value};

struct Clerk {
    dir: tempfile::TempDir,
    agent: PathBuf,
}

/// An agent `clerk` ([`clerk::agent`]) in a directory of its own.
/// `spec_extra` is added to the agent's spec (`confirmTtl: 1s`).
async fn clerk(spec_extra: &str) -> Clerk {
    let dir = tempfile::tempdir().unwrap();
    let agent = clerk::agent(dir.path(), MODEL_URL, spec_extra);
    Clerk { dir, agent }
}

impl Clerk {
    /// A server of the clerk, its store in the clerk's directory.
    async fn start(&self) -> Server {
        Server::start(
            std::slice::from_ref(&self.agent),
            self.dir.path(),
            clerk::script,
        )
        .await
    }

    /// How often the confirmed tool ran.
    fn runs(&self) -> usize {
        clerk::runs(self.dir.path())
    }
}

fn sha256(s: &str) -> String {
    use sha2::{Digest, Sha256};
    hex::encode(Sha256::digest(s.as_bytes()))
}

/// One JSON-RPC `tools/call` over `POST /mcp`, the secret as a header.
async fn mcp_call(api: &Api, params: Value) -> Value {
    let body = json!({"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": params});
    let r = api
        .call_with(
            "POST",
            "/mcp",
            Some(OWNER),
            &[
                ("accept", "application/json, text/event-stream"),
                ("Agents-Param-tenant", "acme"),
                ("Agents-Param-billing_token", CANARY),
            ],
            Some(&body),
        )
        .await
        .reply;
    assert_eq!(r.status, 200, "{}", r.text);
    assert!(r.json["error"].is_null(), "{}", r.text);
    r.json["result"].clone()
}

#[tokio::test]
async fn an_approved_call_runs_once_and_its_token_is_good_once() {
    let c = clerk("").await;
    let s = c.start().await;
    let api = &s.api;
    let r = waiting(api, "delete invoice 7").await;
    let item = &r.json["pending"][0];
    assert_eq!(item["disposition"], "confirm");
    assert_eq!(item["tool"], "bash_delete-invoice");
    assert_eq!(item["call"], json!({"id": "INV-7"}));
    assert!(item["tool_call_id"].is_string());
    assert!(
        r.json["status_detail"]
            .as_str()
            .unwrap()
            .contains("approval of bash_delete-invoice"),
        "{}",
        r.text
    );
    assert_eq!(c.runs(), 0, "the tool ran before approval");
    let token = token_of(&r);
    assert!(token.starts_with("ct_"), "{token}");

    let r = answer(api, &token, json!({"approve": true})).await;
    assert_eq!(r.status, 200, "{}", r.text);
    assert_eq!(r.json["status"], "idle", "{}", r.text);
    assert_eq!(r.json["pending"], json!([]));
    assert_eq!(c.runs(), 1);
    let out = last_tool_output(&r);
    assert!(out.contains("deleted INV-7"), "{out}");
    assert!(
        out.contains(&sha256(CANARY)),
        "the bound secret reached the tool: {out}"
    );

    let again = answer(api, &token, json!({"approve": true})).await;
    assert_eq!(error_of(&again), refusal(409, "continuation_used", &[]));
    assert_eq!(c.runs(), 1);
}

#[tokio::test]
async fn a_rejected_call_reaches_the_model_as_a_tool_result() {
    let c = clerk("").await;
    let s = c.start().await;
    let api = &s.api;
    let r = waiting(api, "delete invoice 7").await;
    let token = token_of(&r);
    let wrong = answer(api, &token, json!({"result": "ok"})).await;
    assert_eq!(error_of(&wrong).0, 400, "{}", wrong.text);

    let r = answer(
        api,
        &token,
        json!({"approve": false, "reason": "not today"}),
    )
    .await;
    assert_eq!(r.status, 200, "{}", r.text);
    assert_eq!(r.json["status"], "idle");
    assert_eq!(c.runs(), 0);
    let last = s.mock.requests().last().cloned().unwrap();
    let results = tool_results(&last);
    assert!(
        results
            .iter()
            .any(|t| t.contains("did not approve") && t.contains("not today")),
        "{results:?}"
    );
}

#[tokio::test]
async fn a_token_of_another_session_is_unknown() {
    let c = clerk("").await;
    let s = c.start().await;
    let api = &s.api;
    let a = waiting(api, "delete invoice 7").await;
    let b = waiting(api, "delete invoice 7").await;
    let (ta, idb) = (token_of(&a), id_of(&b));
    let named = answer(api, &ta, json!({"approve": true, "session_id": idb})).await;
    assert_eq!(error_of(&named), refusal(404, "not_found", &[]));
    // The same secret part under the other session's name.
    let forged = ta.replace(&id_of(&a), &idb);
    let r = answer(api, &forged, json!({"approve": true})).await;
    assert_eq!(error_of(&r), refusal(404, "not_found", &[]));
    let r = answer(api, "ct_nothing", json!({"approve": true})).await;
    assert_eq!(error_of(&r), refusal(404, "not_found", &[]));
    assert_eq!(c.runs(), 0);
    // Its own session named: fine.
    let r = answer(api, &ta, json!({"approve": true, "session_id": id_of(&a)})).await;
    assert_eq!(r.status, 200, "{}", r.text);
    assert_eq!(c.runs(), 1);
}

/// On the paused clock: the sweep that closes it runs on the heartbeat.
#[tokio::test]
async fn an_unanswered_confirmation_expires_as_not_approved() {
    let c = clerk("  confirmTtl: 1s\n").await;
    let s = c.start().await;
    let api = &s.api;
    let r = waiting(api, "delete invoice 7").await;
    assert!(r.json["pending"][0]["expires_at"].is_string(), "{}", r.text);
    let (id, token) = (id_of(&r), token_of(&r));
    tokio::time::pause();
    // Not before its time.
    tokio::time::advance(Duration::from_millis(500)).await;
    let view = on_session(api, "GET", &id, "", None).await;
    assert_eq!(view.json["status"], "waiting_external", "{}", view.text);
    let view = eventually(
        "the confirmation expires",
        Duration::from_secs(60),
        || async {
            let view = on_session(api, "GET", &id, "", None).await;
            (view.json["status"] == "idle").then_some(view)
        },
    )
    .await;
    tokio::time::resume();
    assert!(
        last_tool_output(&view).contains("nobody approved this call in time"),
        "{}",
        view.text
    );
    assert_eq!(c.runs(), 0);
    let late = answer(api, &token, json!({"approve": true})).await;
    assert_eq!(error_of(&late), refusal(409, "continuation_expired", &[]));
    assert_eq!(c.runs(), 0);
}

#[tokio::test]
async fn a_deferred_call_waits_for_the_clients_result() {
    let c = clerk("").await;
    let s = c.start().await;
    let api = &s.api;
    let r = waiting(api, "where am I?").await;
    let item = &r.json["pending"][0];
    assert_eq!(item["disposition"], "deferred");
    assert_eq!(item["tool"], "get_location");
    assert_eq!(item["call"], json!({"precision": "city"}));
    let token = token_of(&r);
    let wrong = answer(api, &token, json!({"approve": true})).await;
    assert_eq!(error_of(&wrong).0, 400, "{}", wrong.text);
    let r = answer(api, &token, json!({"result": "Lyon"})).await;
    assert_eq!(r.status, 200, "{}", r.text);
    assert_eq!(r.json["status"], "idle");
    let turns = r.json["session"]["turns"].as_array().unwrap();
    assert_eq!(turns.last().unwrap()["content"], "done: Lyon", "{}", r.text);
}

#[tokio::test]
async fn cancelling_a_waiting_run_closes_its_calls() {
    let c = clerk("").await;
    let s = c.start().await;
    let api = &s.api;
    let r = waiting(api, "delete invoice 7").await;
    let (id, token) = (id_of(&r), token_of(&r));
    let r = on_session(api, "POST", &id, "/cancel", None).await;
    assert_eq!(r.status, 200, "{}", r.text);
    assert_eq!(r.json["status"], "idle");
    assert_eq!(r.json["status_detail"], "cancelled");
    assert_eq!(r.json["pending"], json!([]));
    assert_eq!(last_tool_output(&r), "error: the run was cancelled");
    let late = answer(api, &token, json!({"approve": true})).await;
    assert_eq!(error_of(&late), refusal(409, "continuation_used", &[]));
    assert_eq!(c.runs(), 0);
}

/// Found by the attacker's review: a client's call (MCP `tools/call` of
/// an exposed tool) that waits, cancelled, left the session marked as a
/// client's call, and the next message's run ended at once, failed.
#[tokio::test]
async fn a_cancelled_client_call_leaves_the_next_message_a_model_run() {
    let c = clerk("  mcp:\n    exposeTools: true\n").await;
    let s = c.start().await;
    let api = &s.api;
    let call = json!({"jsonrpc": "2.0", "id": 1, "method": "tools/call",
        "params": {"name": "bash_delete-invoice", "arguments": {"id": "INV-7"},
                   "_meta": {"agents-exe/params": {"tenant": "acme"}}}});
    let r = api.call("POST", "/mcp", Some(OWNER), Some(&call)).await;
    let waiting = &r.json["result"]["structuredContent"];
    assert_eq!(waiting["status"], "waiting_external", "{}", r.text);
    let id = waiting["session_id"].as_str().unwrap().to_string();
    let r = on_session(api, "POST", &id, "/cancel", None).await;
    assert_eq!(r.json["status_detail"], "cancelled", "{}", r.text);
    let r = api
        .call(
            "POST",
            &format!("/v1/sessions/{id}/messages?wait=true"),
            Some(OWNER),
            Some(&json!({"prompt": "count them"})),
        )
        .await;
    assert_eq!(r.json["status"], "idle", "{}", r.text);
    let turns = r.json["session"]["turns"].as_array().unwrap();
    assert_eq!(
        turns.last().unwrap()["content"],
        "done: 3 invoices\n",
        "{}",
        r.text
    );
    assert_eq!(c.runs(), 0);
}

/// `run: step` takes one model turn and runs its calls, then stops; a
/// resume goes on. A message to a waiting session is refused until its
/// calls are answered; a continuation takes `run` like any request that
/// starts a run.
#[tokio::test]
async fn run_step_takes_one_turn_and_a_waiting_session_takes_no_message() {
    let c = clerk("").await;
    let s = c.start().await;
    let api = &s.api;
    let r = create_waited(
        api,
        json!({"agent": "clerk", "prompt": "count them", "run": "step",
                "params": {"tenant": "acme"}}),
    )
    .await;
    assert_eq!(r.json["status"], "idle", "{}", r.text);
    assert!(
        r.json["status_detail"]
            .as_str()
            .unwrap()
            .contains("one step"),
        "{}",
        r.text
    );
    assert_eq!(last_tool_output(&r), "3 invoices\n");
    let before = s.mock.request_count();
    let r = on_session(api, "POST", &id_of(&r), "/resume?wait=true", None).await;
    assert_eq!(r.json["status"], "idle", "{}", r.text);
    assert_eq!(r.json["status_detail"], Value::Null, "{}", r.text);
    assert_eq!(s.mock.request_count(), before + 1);

    let r = waiting(api, "delete invoice 7").await;
    let id = id_of(&r);
    let msg = on_session(
        api,
        "POST",
        &id,
        "/messages",
        Some(json!({"prompt": "and invoice 8"})),
    )
    .await;
    assert_eq!(error_of(&msg), refusal(409, "waiting_external", &[]));
    let r = answer(api, &token_of(&r), json!({"approve": true, "run": "step"})).await;
    assert_eq!(r.status, 200, "{}", r.text);
    assert_eq!(c.runs(), 1);
    assert_eq!(r.json["status"], "idle", "{}", r.text);
}

/// A fork copies no pending call: its last turn is closed as a cancel
/// closes it, and the source still waits.
#[tokio::test]
async fn a_fork_copies_no_pending_call() {
    let c = clerk("").await;
    let s = c.start().await;
    let api = &s.api;
    let r = waiting(api, "delete invoice 7").await;
    let id = id_of(&r);
    let f = on_session(api, "POST", &id, "/fork", Some(json!({}))).await;
    assert_eq!(f.status, 201, "{}", f.text);
    assert_eq!(f.json["status"], "idle");
    assert_eq!(f.json["pending"], json!([]));
    assert_eq!(last_tool_output(&f), "error: the run was cancelled");
    let src = on_session(api, "GET", &id, "", None).await;
    assert_eq!(src.json["status"], "waiting_external");
    assert_eq!(token_of(&src), token_of(&r));
}

/// Over MCP a blocked run answers with its pending items; the next call
/// carries the decision (and the values again) and runs on to the answer.
#[tokio::test]
async fn an_mcp_call_that_blocks_is_continued_by_the_next_call() {
    let c = clerk("").await;
    let s = c.start().await;
    let api = &s.api;
    let r = mcp_call(
        api,
        json!({"name": "ask_clerk", "arguments": {"prompt": "delete invoice 7"}}),
    )
    .await;
    assert_eq!(r["isError"], false, "{r}");
    let text = r["content"][0]["text"].as_str().unwrap();
    assert!(text.contains("approval of bash_delete-invoice"), "{text}");
    let pending = &r["_meta"]["bindery.dev/pending"][0];
    assert_eq!(pending["disposition"], "confirm");
    assert_eq!(c.runs(), 0);
    let token = pending["continuation_token"].as_str().unwrap();

    let r = mcp_call(
        api,
        json!({"name": "ask_clerk", "arguments": {},
               "_meta": {"bindery.dev/continuations": [{"token": token, "approve": true}]}}),
    )
    .await;
    assert_eq!(r["isError"], false, "{r}");
    let text = r["content"][0]["text"].as_str().unwrap();
    assert!(text.starts_with("done: deleted INV-7"), "{text}");
    assert!(text.contains(&sha256(CANARY)), "{text}");
    assert!(r["_meta"].get("bindery.dev/pending").is_none(), "{r}");
    assert_eq!(c.runs(), 1);
}

/// A call that waits inside a helper shows in the top-level session's
/// `pending` (`via` the helper); its answer resumes the helper, whose
/// answer goes back to the caller, which answers.
#[tokio::test]
async fn a_helpers_pending_call_surfaces_and_resumes_the_helper_then_its_caller() {
    let c = clerk("").await;
    let boss = c.dir.path().join("boss.yaml");
    std::fs::write(
        &boss,
        format!(
            r#"{head}
  helpers:
    - path: ./clerk.yaml
      with: {{tenant: {{param: tenant}}, billing_token: {{param: billing_token}}}}
"#,
            head = clerk::agent_head("boss", MODEL_URL)
        ),
    )
    .unwrap();
    let s = Server::start(&[boss], c.dir.path(), clerk::script).await;
    let api = &s.api;
    let r = create_waited(
        api,
        json!({"agent": "boss", "prompt": "ask the clerk to delete invoice 7",
                "params": {"tenant": "acme", "billing_token": CANARY}}),
    )
    .await;
    assert_eq!(r.status, 201, "{}", r.text);
    assert_eq!(r.json["status"], "waiting_external", "{}", r.text);
    let item = &r.json["pending"][0];
    assert_eq!(item["tool"], "bash_delete-invoice");
    assert_eq!(item["via"], json!(["prompt_agent_clerk"]));
    assert_eq!(item["call"], json!({"id": "INV-7"}));
    assert!(r.json["status_detail"]
        .as_str()
        .unwrap()
        .contains("(in prompt_agent_clerk)"));
    assert_eq!(c.runs(), 0);

    let r = answer(api, &token_of(&r), json!({"approve": true})).await;
    assert_eq!(r.status, 200, "{}", r.text);
    assert_eq!(r.json["status"], "idle", "{}", r.text);
    assert_eq!(c.runs(), 1);
    let turns = r.json["session"]["turns"].as_array().unwrap();
    // The boss got the clerk's answer as its tool result, then answered.
    let helper_result = last_tool_output(&r);
    assert!(
        helper_result.starts_with("done: deleted INV-7"),
        "{}",
        r.text
    );
    assert!(helper_result.contains(&sha256(CANARY)), "{}", r.text);
    assert!(
        turns.last().unwrap()["content"]
            .as_str()
            .unwrap()
            .starts_with("done: done: deleted INV-7"),
        "{}",
        r.text
    );
}

/// A message-scope value lasts one run: the request that resumes a waiting
/// run must bring it again, or it is 409 params_required.
#[tokio::test]
async fn message_scope_values_come_with_the_answer_that_resumes() {
    let c = clerk("").await;
    let text = std::fs::read_to_string(&c.agent).unwrap();
    let with_otp = text.replace(
        "  toolboxes:",
        "    - {name: otp, scope: message, secret: true}\n  toolboxes:",
    );
    std::fs::write(&c.agent, with_otp).unwrap();
    let s = c.start().await;
    let api = &s.api;
    let r = create_waited(
        api,
        json!({"agent": "clerk", "prompt": "delete invoice 7",
                "params": {"tenant": "acme", "billing_token": CANARY, "otp": "123456"}}),
    )
    .await;
    assert_eq!(r.json["status"], "waiting_external", "{}", r.text);
    let token = token_of(&r);
    let r = answer(api, &token, json!({"approve": true})).await;
    assert_eq!(error_of(&r), refusal(409, "params_required", &["otp"]));
    assert_eq!(c.runs(), 0);
    let r = answer(
        api,
        &token,
        json!({"approve": true, "params": {"otp": "654321"}}),
    )
    .await;
    assert_eq!(r.status, 200, "{}", r.text);
    assert_eq!(c.runs(), 1);
}

/// A session-token holder sees what the session waits for, never a token,
/// and cannot answer.
#[tokio::test]
async fn a_session_token_sees_pending_calls_without_their_tokens() {
    let c = clerk("").await;
    let s = c.start().await;
    let api = &s.api;
    let r = create_waited(
        api,
        json!({"agent": "clerk", "prompt": "delete invoice 7", "session_token": true,
                "params": {"tenant": "acme"}}),
    )
    .await;
    assert_eq!(r.json["status"], "waiting_external", "{}", r.text);
    let (id, st, token) = (
        id_of(&r),
        r.json["session_token"].as_str().unwrap().to_string(),
        token_of(&r),
    );
    let seen = api
        .call("GET", &format!("/v1/sessions/{id}"), Some(&st), None)
        .await;
    assert_eq!(seen.json["pending"][0]["tool"], "bash_delete-invoice");
    assert!(seen.json["pending"][0].get("continuation_token").is_none());
    assert!(!seen.text.contains(&token));
    let r = api
        .call(
            "POST",
            &format!("/v1/continuations/{token}"),
            Some(&st),
            Some(&json!({"approve": true})),
        )
        .await;
    // Known, and refused: only the owner answers.
    assert_eq!(error_of(&r), refusal(403, "forbidden", &[]));
    assert_eq!(c.runs(), 0);
}
