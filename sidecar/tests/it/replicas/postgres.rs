//! The replicas on one PostgreSQL database (`postgres-tests`): the view,
//! `/mcp` calls and batches, the event stream and a cancel, each reaching
//! the replica that holds the session.

use bindery_tests::postgres::Postgres;
use bindery_tests::sidecar::Api;
use serde_json::{json, Value};

use super::{held_on, mcp_call, mcp_post};
use crate::common::*;

const DB: &str = "tenant_replicas";

/// A PostgreSQL server with `DB` and a world whose servers keep their
/// sessions there; the model calls the invoices tool, then answers.
async fn on_postgres() -> (Postgres, World) {
    let pg = Postgres::start();
    pg.create_database(DB);
    let mut w = World::new(tool_then_answer).await;
    w.store = pg.url(DB);
    (pg, w)
}

/// How many turns session `id` has, as `api` shows it to the owner.
async fn turns_of(api: &Api, id: &str) -> usize {
    let r = api
        .call("GET", &format!("/v1/sessions/{id}"), Some(OWNER), None)
        .await;
    assert_eq!(r.status, 200, "{}", r.text);
    r.json["session"]["turns"].as_array().unwrap().len()
}

/// A view asked of the replica that does not hold the session's secret
/// values shows the names the holder holds, never a value; to a session
/// token, no names, as the holder shows it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_view_asked_of_another_replica_shows_the_holders_secret_names() {
    let (_pg, w) = on_postgres().await;
    let (b, api_b) = w.start(&[], &[]);
    let (a, api_a) = w.start(&[], &[]);
    let (id, token) = held_on(&api_b).await;
    let path = format!("/v1/sessions/{id}");
    let before = served(&api_b, "/v1/sessions/{id}").await;

    let r = api_a.call("GET", &path, Some(OWNER), None).await;
    assert_eq!(r.status, 200, "{}", r.text);
    assert_eq!(
        r.json["secret_params"],
        json!(["billing_token"]),
        "{}",
        r.text
    );
    assert_eq!(r.json["params"], json!({"tenant": "acme"}), "{}", r.text);
    assert!(!r.text.contains(CANARY), "{}", r.text);
    let r = api_a.call("GET", &path, Some(&token), None).await;
    assert_eq!(r.status, 200, "{}", r.text);
    assert_eq!(r.json["secret_params"], json!([]), "{}", r.text);
    assert_eq!(r.json["params"], json!({}), "{}", r.text);
    assert_eq!(
        served(&api_b, "/v1/sessions/{id}").await - before,
        2.0,
        "B answered both"
    );

    // A value rotated through A is held by B, and shown by both.
    let r = api_a
        .call(
            "PUT",
            &format!("{path}/params"),
            Some(OWNER),
            Some(&json!({"params": {"billing_token": null}})),
        )
        .await;
    assert_eq!(r.status, 200, "{}", r.text);
    assert_eq!(r.json["secret_params"], json!([]), "{}", r.text);
    for api in [&api_a, &api_b] {
        let r = api.call("GET", &path, Some(OWNER), None).await;
        assert_eq!(r.json["secret_params"], json!([]), "{}", r.text);
    }
    // A token of another session is refused at A, not sent on.
    let (other, other_token) = held_on(&api_b).await;
    let before = served(&api_b, "/v1/sessions/{id}").await;
    let r = api_a.call("GET", &path, Some(&other_token), None).await;
    assert_eq!(
        error_of(&r),
        refusal(401, "unauthorized", &[]),
        "{}",
        r.text
    );
    assert_eq!(served(&api_b, "/v1/sessions/{id}").await, before);
    let r = api_a
        .call(
            "GET",
            &format!("/v1/sessions/{other}"),
            Some(&other_token),
            None,
        )
        .await;
    assert_eq!(r.status, 200, "{}", r.text);
    for s in [&a, &b] {
        assert!(!s.logs().contains(CANARY), "{}", s.logs());
    }
}

/// An `/mcp` call that names a session (the owner's `_meta`, a session
/// token's `Bindery-Session-Id`), sent to the replica without its secret
/// value, is run by the holder; one that names none runs where it lands.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_mcp_call_naming_a_session_is_served_by_the_holder() {
    let (_pg, w) = on_postgres().await;
    let (b, api_b) = w.start(&[], &[]);
    let (a, api_a) = w.start(&[], &[]);
    let (id, token) = held_on(&api_b).await;
    let before = served(&api_b, "/mcp").await;

    let v = mcp_call(
        &api_a,
        OWNER,
        &[],
        json!({"name": "ask_invoices", "arguments": {"prompt": "overdue?"},
               "_meta": {"bindery.dev/session_id": id}}),
    )
    .await;
    assert!(v["error"].is_null(), "{v}");
    assert_eq!(v["id"], 7, "{v}");
    let result = &v["result"];
    assert_eq!(result["isError"], false, "{v}");
    assert!(
        result["content"][0]["text"]
            .as_str()
            .unwrap()
            .starts_with("answer: "),
        "{v}"
    );
    assert_eq!(
        result["_meta"]["bindery.dev/session_id"],
        id.as_str(),
        "{v}"
    );

    let v = mcp_call(
        &api_a,
        &token,
        &[("Bindery-Session-Id", &id)],
        json!({"name": "ask_invoices", "arguments": {"prompt": "and now?"}}),
    )
    .await;
    assert!(v["error"].is_null(), "{v}");
    assert_eq!(v["result"]["isError"], false, "{v}");
    assert_eq!(
        served(&api_b, "/mcp").await - before,
        2.0,
        "B ran both calls"
    );
    assert_eq!(
        turns_of(&api_b, &id).await,
        8,
        "two runs of four turns in the session"
    );

    // A new session's call names none: it runs at A, with the values it gives.
    let before = served(&api_b, "/mcp").await;
    let v = mcp_call(
        &api_a,
        OWNER,
        &[
            ("Agents-Param-tenant", "acme"),
            ("Agents-Param-billing_token", CANARY),
        ],
        json!({"name": "ask_invoices", "arguments": {"prompt": "overdue?"}}),
    )
    .await;
    assert_eq!(v["result"]["isError"], false, "{v}");
    assert_eq!(served(&api_b, "/mcp").await, before);

    // Its secret value given again through A, which has no peer TLS: not
    // sent in clear, refused as the session API refuses it.
    let v = mcp_call(
        &api_a,
        OWNER,
        &[("Agents-Param-billing_token", "rotated-9d2c")],
        json!({"name": "ask_invoices", "arguments": {"prompt": "hi"},
               "_meta": {"bindery.dev/session_id": id}}),
    )
    .await;
    assert_eq!(v["id"], 7, "{v}");
    assert_eq!(v["error"]["data"]["error"], "peer_tls_required", "{v}");
    assert_eq!(v["error"]["data"]["status"], 409, "{v}");
    assert_eq!(
        v["error"]["data"]["params"],
        json!(["billing_token"]),
        "{v}"
    );
    for s in [&a, &b] {
        let logs = s.logs();
        assert!(
            !logs.contains(CANARY) && !logs.contains("rotated-9d2c"),
            "{logs}"
        );
    }
    for req in w.mock.requests() {
        assert!(!req.to_string().contains(CANARY));
    }
}

/// A batch's `tools/call` of `ask_invoices`, in `session` if given.
fn ask_in(id: i64, session: Option<&str>) -> Value {
    let mut params = json!({"name": "ask_invoices", "arguments": {"prompt": "overdue?"}});
    if let Some(s) = session {
        params["_meta"] = json!({"bindery.dev/session_id": s});
    }
    json!({"jsonrpc": "2.0", "id": id, "method": "tools/call", "params": params})
}

/// The answer with JSON-RPC id `id` in a batch's answers.
fn answer_to(answers: &Value, id: i64) -> &Value {
    let all = answers.as_array().unwrap_or_else(|| panic!("{answers}"));
    all.iter()
        .find(|a| a["id"] == id)
        .unwrap_or_else(|| panic!("no answer to {id}: {answers}"))
}

/// A batch whose calls name one session held by another replica is run
/// there whole (a session token's: its own session); an owner's batch
/// naming several, one held elsewhere, is refused with what to do instead
/// of being run without the holder's values.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_mcp_batch_naming_a_held_session_is_served_by_the_holder() {
    let (_pg, w) = on_postgres().await;
    let (b, api_b) = w.start(&[], &[]);
    let (a, api_a) = w.start(&[], &[]);
    let (id, token) = held_on(&api_b).await;
    let (other, _) = held_on(&api_b).await;
    let (here, _) = held_on(&api_a).await;
    let list = json!({"jsonrpc": "2.0", "id": 2, "method": "tools/list"});
    let before = served(&api_b, "/mcp").await;

    // A session token's batch: its calls are in its session, held by B.
    let (status, answers) = mcp_post(
        &api_a,
        &token,
        &[("Bindery-Session-Id", &id)],
        json!([ask_in(1, None), list]),
    )
    .await;
    assert_eq!(status, 200, "{answers}");
    let result = &answer_to(&answers, 1)["result"];
    assert_eq!(result["isError"], false, "{answers}");
    assert_eq!(
        result["_meta"]["bindery.dev/session_id"],
        id.as_str(),
        "{answers}"
    );
    assert!(
        answer_to(&answers, 2)["result"]["tools"].is_array(),
        "{answers}"
    );
    // The owner's: a call in that session (`_meta`) and one that names
    // none. (Two calls in one session would race: a session runs one run
    // at a time, and a batch's calls run at once.)
    let list = json!({"jsonrpc": "2.0", "id": 4, "method": "tools/list"});
    let (status, answers) = mcp_post(&api_a, OWNER, &[], json!([ask_in(3, Some(&id)), list])).await;
    assert_eq!(status, 200, "{answers}");
    assert_eq!(
        answer_to(&answers, 3)["result"]["isError"],
        false,
        "{answers}"
    );
    assert!(
        answer_to(&answers, 4)["result"]["tools"].is_array(),
        "{answers}"
    );
    assert_eq!(
        served(&api_b, "/mcp").await - before,
        2.0,
        "B ran both batches"
    );
    assert_eq!(
        turns_of(&api_b, &id).await,
        8,
        "two runs of four turns in the session"
    );

    // Calls in sessions held by B and by A, or by B twice: no one replica
    // can answer for them from one POST, and nothing of them runs.
    let before = served(&api_b, "/mcp").await;
    for (batch, named) in [
        (
            json!([ask_in(5, Some(&id)), ask_in(6, Some(&here))]),
            vec![&id],
        ),
        (
            json!([ask_in(7, Some(&id)), ask_in(8, Some(&other))]),
            vec![&id, &other],
        ),
    ] {
        let (status, answer) = mcp_post(&api_a, OWNER, &[], batch).await;
        assert_eq!(status, 400, "{answer}");
        assert_eq!(answer["error"]["code"], -32600, "{answer}");
        let message = answer["error"]["message"].as_str().unwrap();
        for id in named {
            assert!(message.contains(id.as_str()), "{message}");
        }
        assert!(message.contains("in a POST of their own"), "{message}");
    }
    assert_eq!(served(&api_b, "/mcp").await, before);
    assert_eq!(turns_of(&api_a, &id).await, 8, "nothing more ran");
    assert_eq!(turns_of(&api_a, &here).await, 0, "nothing ran");
    for s in [&a, &b] {
        assert!(!s.logs().contains(CANARY), "{}", s.logs());
    }
}

/// A run on B, held by the model: A's subscriber gets B's events as they
/// come (the forwarded stream is passed through, not buffered: the run's
/// start shows while it is still running), and a cancel sent to A ends
/// B's run at once, as B's own cancel would.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_event_stream_and_a_cancel_through_another_replica_reach_the_runner() {
    use bindery_tests::mock_llm::{last_message, Gate, MockReply};
    let gate = Gate::new();
    let held = gate.clone();
    let pg = Postgres::start();
    pg.create_database(DB);
    let mut w = World::new(move |req| match last_message(req)["content"].as_str() {
        Some("hold") => MockReply::text("released").held(&held),
        _ => MockReply::text("fresh"),
    })
    .await;
    w.store = pg.url(DB);
    let (_b, api_b) = w.start(&[], &[]);
    let (_a, api_a) = w.start(&[], &[]);
    let (id, token) = held_on(&api_b).await;
    let (status, stream) = api_a
        .events(&format!("/v1/sessions/{id}/events"), Some(&token), None)
        .await;
    assert_eq!(status, 200);
    let mut stream = stream.unwrap();
    let r = api_b
        .call(
            "POST",
            &format!("/v1/sessions/{id}/messages"),
            Some(OWNER),
            Some(&json!({"prompt": "hold"})),
        )
        .await;
    assert_eq!(r.status, 202, "{}", r.text);
    until("the model gets the request", PATIENCE, || {
        w.mock.request_count() > 0
    })
    .await;
    let started = stream.until("run_started", PATIENCE).await;
    assert_eq!(
        started.last().map(|e| e.event.as_str()),
        Some("run_started"),
        "{started:?}"
    );

    let r = api_a
        .call(
            "POST",
            &format!("/v1/sessions/{id}/cancel"),
            Some(&token),
            None,
        )
        .await;
    assert_eq!(r.status, 200, "{}", r.text);
    assert_eq!(r.json["status"], "idle", "{}", r.text);
    assert_eq!(r.json["status_detail"], "cancelled", "{}", r.text);
    let ended = stream.until("run_finished", PATIENCE).await;
    let end = ended.last().filter(|e| e.event == "run_finished");
    let data: Value = serde_json::from_str(&end.expect("run_finished").data).unwrap();
    assert_eq!(data["status"], "cancelled", "{data}");
    gate.open();
}
