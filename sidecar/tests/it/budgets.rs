//! Budgets through the binary, where only it shows them: what the model
//! is asked over HTTP, the event stream, and two replicas on one
//! PostgreSQL database. Budgets' logic is tested in process
//! (`sidecar/api/tests/inproc/budgets.rs`).

use crate::common::*;
use bindery_tests::fixtures::metered_agent;
use bindery_tests::fixtures::session::message;
#[cfg(feature = "postgres-tests")]
use bindery_tests::fixtures::session::session;
use bindery_tests::mock_llm::{MockLlm, MockReply};
use bindery_tests::scripts::count_then_answer;
#[cfg(feature = "postgres-tests")]
use bindery_tests::sidecar::Reply;
use bindery_tests::sidecar::{Api, Sidecar};
use serde_json::{json, Value};

/// A server of the metered agent on its own SQLite store, and its model.
struct Metered {
    mock: MockLlm,
    _dir: tempfile::TempDir,
    _sidecar: Sidecar,
    api: Api,
}

/// [`metered_agent`] with `model_extra` and `spec`, served, its model
/// answering by `script`.
async fn metered(
    script: impl Fn(&Value) -> MockReply + Send + Sync + 'static,
    model_extra: &str,
    spec: &str,
) -> Metered {
    let mock = MockLlm::start(script).await;
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(dir.path().join("logs")).unwrap();
    let agent = metered_agent(dir.path(), &mock.url(), model_extra, spec);
    let (sidecar, api) = serve(&agent, &sqlite_in(dir.path()), &[], &[], dir.path());
    Metered {
        mock,
        _dir: dir,
        _sidecar: sidecar,
        api,
    }
}

#[tokio::test]
async fn a_model_that_reports_no_usage_is_estimated_and_marked_so() {
    let m = metered(
        |_| MockReply::text("a reply of some length").without_usage(),
        "",
        "",
    )
    .await;
    let id = new_session(&m.api, json!({"agent": "metered"})).await;
    let r = message(&m.api, &id, "hello").await;
    let usage = &r.json["usage"];
    let total = usage["total_tokens"].as_u64().unwrap();
    assert!(total > 5, "{usage}");
    assert_eq!(usage["estimated_tokens"].as_u64(), Some(total), "{usage}");
    // The server asked for usage in its streamed request.
    assert_eq!(
        m.mock.requests()[0]["stream_options"],
        json!({"include_usage": true})
    );
}

/// Two replicas share one database and one budget whose last room is less
/// than one request: however the two runs race, one request reaches the
/// model and the other run is refused.
#[cfg(feature = "postgres-tests")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_replicas_on_postgres_share_one_budget_and_only_one_passes() {
    let gate = bindery_tests::mock_llm::Gate::new();
    let held = gate.clone();
    let mock =
        MockLlm::start(move |_| MockReply::text("ok").with_usage(400, 100).held(&held)).await;
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(dir.path().join("logs")).unwrap();
    let agent = metered_agent(
        dir.path(),
        &mock.url(),
        "",
        "  budgets:\n    - {name: daily-tokens, tokens: 5, per: 24h}\n",
    );
    let pg = bindery_tests::postgres::Postgres::start();
    pg.create_database("budgets");
    let store = pg.url("budgets");
    let (_a, api_a) = serve(&agent, &store, &[], &[], dir.path());
    let (_b, api_b) = serve(&agent, &store, &[], &[], dir.path());
    let sa = new_session(&api_a, json!({"agent": "metered"})).await;
    let sb = new_session(&api_b, json!({"agent": "metered"})).await;
    let post = |api: &Api, id: &str| {
        let (api, id) = (api.clone(), id.to_string());
        tokio::spawn(async move {
            api.call(
                "POST",
                &format!("/v1/sessions/{id}/messages"),
                Some(OWNER),
                Some(&json!({"prompt": "go"})),
            )
            .await
        })
    };
    let (ra, rb) = tokio::join!(post(&api_a, &sa), post(&api_b, &sb));
    let (ra, rb) = (ra.unwrap(), rb.unwrap());
    // Whichever claimed second: its run stops before the model, or (its
    // message came after the first claim) it is refused with a 429.
    let finished = |api: &Api, id: &str| {
        let (api, id) = (api.clone(), id.to_string());
        async move {
            eventually("the run ends", PATIENCE, || async {
                let v = session(&api, &id).await;
                (v.json["status"] != "running").then_some(v)
            })
            .await
        }
    };
    until("one request reaches the model", PATIENCE, || {
        mock.requests().len() == 1 || ra.status == 429 || rb.status == 429
    })
    .await;
    gate.open();
    let (va, vb) = tokio::join!(finished(&api_a, &sa), finished(&api_b, &sb));
    let outcome = |r: &Reply, v: &Reply| match (r.status, v.json["status"].as_str()) {
        (429, _) => "refused",
        (202, Some("failed"))
            if v.json["status_detail"]
                .as_str()
                .is_some_and(|d| d.starts_with("budget_exceeded: budget daily-tokens")) =>
        {
            "refused"
        }
        (202, Some("idle")) => "answered",
        _ => panic!("{} / {}", r.text, v.text),
    };
    let mut outcomes = [outcome(&ra, &va), outcome(&rb, &vb)];
    outcomes.sort_unstable();
    assert_eq!(outcomes, ["answered", "refused"]);
    assert_eq!(mock.requests().len(), 1);
}

/// The session's stream says when a budget passes 80% of its limit and
/// when it reaches it, once each.
#[tokio::test]
async fn the_stream_tells_when_a_budget_nears_and_reaches_its_limit() {
    // 60 tokens a turn: 120 passes 80% of 125, 180 reaches it.
    let m = metered(
        count_then_answer(2),
        "",
        "  budgets:\n    - {name: daily-tokens, tokens: 125, per: 24h}\n",
    )
    .await;
    let id = new_session(&m.api, json!({"agent": "metered"})).await;
    let r = message(&m.api, &id, "count twice").await;
    assert_eq!(r.json["status"], "idle", "{}", r.text);
    let (status, stream) = m
        .api
        .events(&format!("/v1/sessions/{id}/events"), Some(OWNER), None)
        .await;
    assert_eq!(status, 200);
    let seen = stream.unwrap().until("run_finished", PATIENCE).await;
    let budget: Vec<Value> = seen
        .iter()
        .filter(|e| e.event == "budget")
        .map(|e| serde_json::from_str(&e.data).unwrap())
        .collect();
    assert_eq!(
        budget,
        vec![
            json!({"budget": "daily-tokens", "state": "nearly_used", "used": 120.0, "limit": 125.0, "meter": "tokens", "per": "24h"}),
            json!({"budget": "daily-tokens", "state": "used_up", "used": 180.0, "limit": 125.0, "meter": "tokens", "per": "24h"}),
        ]
    );
    let finished: Value = serde_json::from_str(&seen.last().unwrap().data).unwrap();
    assert_eq!(finished["usage"]["total_tokens"], 180, "{finished}");
}

/// Found by the attacker's review: a streamed answer read and then cut
/// short (a cancel, a broken stream) counted only its prompt. What was
/// streamed counts too, at its estimate.
#[tokio::test]
async fn a_streamed_answer_cut_short_counts_what_was_written() {
    let chunk = |text: &str| {
        format!(
            "data: {}\n\n",
            json!({"choices": [{"index": 0, "delta": {"content": text}}]})
        )
    };
    // 8000 characters of answer, then the stream ends without [DONE].
    let cut = format!("{}{}", chunk("ok "), chunk(&"word ".repeat(1600)));
    let m = metered(move |_| MockReply::Raw(cut.clone()), "", "").await;
    let id = new_session(&m.api, json!({"agent": "metered"})).await;
    let r = message(&m.api, &id, "hello").await;
    assert_eq!(r.json["status"], "failed", "{}", r.text);
    let usage = &r.json["usage"];
    let completion = usage["completion_tokens"].as_u64().unwrap();
    assert!(
        completion >= 1900,
        "the streamed answer counted {completion}: {usage}"
    );
    assert_eq!(usage["estimated_tokens"], usage["total_tokens"], "{usage}");
}
